"""The vllm target's mode: one plan for every request of an engine, its buffers traced into the graph.

steerc's loader (:mod:`.loader`) calls :func:`attach` right after the weights load, before torch.compile
traces the model and before any CUDA graph is captured: :class:`InstalledPlan` registers the plan's
hooks (:mod:`.steer`) on the modules this worker holds (:mod:`.parallel`), and :class:`PlanFeeder`, a
forward pre-hook on the top-level model, writes each step's per-token metadata (position, prompt length,
request slot) into fixed buffers outside the graph. :class:`SteercWorkerExtension`
(``worker_extension_cls``) adds the ``steerc_*`` methods the driver (:mod:`.api`) calls by name with
``LLM.collective_rpc`` and msgpack-safe arguments (plan bytes): never pickle.

No silent no-op: every installed hook counts its runs inside the graph; after the first real step the
worker checks that each one ran.
"""

from __future__ import annotations

import functools

import numpy as np

from steerc.runtime.kernels import compute_dtype
from steerc.runtime.vllm.engine import (
    EngineError,
    Slots,
    attach_step_calls,
    engine_key,
    facts_of,
    forced_prompt_len,
    hooks_never_ran,
    is_compiled,
    token_metadata,
    vllm_version,
)
from steerc.runtime.vllm.parallel import check_gates_on_stage, layer_path, localise, owns, tensor_parallel
from steerc.runtime.vllm.steer import SteerState, register, site_function
from steerc.targets.vllm.program import prefix_cache_safe
from steerc.targets.vllm.wire import PlanError, param_tensors, unpack, validate_plan


class InstalledPlan:
    """The hooks, buffers and structure installed on one worker's model."""

    def __init__(self, model, obj: dict, tensors: dict, *, tp_rank: int, tp_size: int, max_tokens: int,
                 max_slots: int):
        facts = obj["header"]["facts"]
        param = next(model.parameters())
        self.obj, self.tensors = obj, tensors
        self.boot = obj["boot"]
        self.header = obj["header"]
        self.state = SteerState(self.boot, tensors, max_tokens=max_tokens, max_slots=max_slots,
                                width=max(facts["hidden"], facts["head_dim"]),
                                dtype=compute_dtype(param.dtype), device=param.device)
        if hasattr(model, "steerc"):
            raise PlanError("plan", "this model already has steerc installed")
        model.add_module("steerc", self.state)
        self.handles = []
        self.installed: list[str] = []
        self.registered: dict[str, tuple[int, str]] = {}  # hook name -> (fired index, module)
        self.skipped: list[str] = []
        try:
            for index, hook in enumerate(self.boot["hooks"]):
                if not owns(model, layer_path(hook["module"])):
                    self.skipped.append(hook["name"])
                    continue
                local = localise(hook, facts["heads"], tp_rank, tp_size, facts["head_dim"], facts["family"])
                if local is None:
                    self.installed.append(hook["name"])  # no head of this rank: nothing to do here
                    continue
                check_gates_on_stage(model, self.boot, local)
                module = model.get_submodule(hook["module"])
                self.handles.append(register(module, hook, site_function(self.state, local["sites"], index)))
                self.installed.append(hook["name"])
                self.registered[hook["name"]] = (index, hook["module"])
        except Exception:
            self.remove(model)
            raise

    def fired(self) -> dict[str, int]:
        counts = self.state.fired.tolist()
        return {name: int(counts[i]) for name, (i, _) in self.registered.items()}

    def silent(self, before: dict[str, int]) -> list[str]:
        """Registered hooks that did not run since ``before`` (as 'name (module)')."""
        now = self.fired()
        return [f"{name} ({self.registered[name][1]})" for name in self.registered if now[name] <= before[name]]

    def remove(self, model) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        if getattr(model, "steerc", None) is self.state:
            del model._modules["steerc"]


class PlanFeeder:
    """Before each forward: the step's token metadata into the plan's buffers; after the first real one:
    the check that every hook ran."""

    def __init__(self, installed: InstalledPlan, view, family: str):
        self.installed = installed
        self.view = view
        self.family = family
        self.slots = Slots(installed.state.max_slots)
        self.forwards = 0
        self.real_steps = 0
        self._pending: dict | None = None
        self.verified = False
        self._forced: dict[str, int] = {}  # request id -> the prompt length steering sees
        self.capture = None  # a capture in progress (steerc.runtime.vllm.capture), fed each step's layout

    def before(self, positions) -> None:
        state = self.installed.state
        layout = self.view.layout()
        if layout is None:  # a dummy run (profiling, warm-up, capture): nothing is steered
            self.idle()
            return
        self.forwards += 1
        live = self.view.live()
        self._prompt_lens(layout, live)
        pos, plen, row = token_metadata(layout, positions, "vllm target")
        if self.capture is not None:
            self.capture.before(layout, self.view, pos, row)
        slots, fresh = self.slots.assign(layout.req_ids, live)
        restarted = [int(slots[i]) for i in range(len(layout.req_ids)) if layout.first[i] == 0]
        state.reset_slots(sorted(set(fresh) | set(restarted)))
        state.write_metadata(pos, plen, slots[row], np.ones(len(pos), dtype=bool))
        self.real_steps += 1
        if not self.verified:
            self._pending = self.installed.fired()

    def idle(self) -> None:
        """Ahead of a dummy run (profiling, warm-up, graph capture): no row is real, nothing is steered."""
        self.forwards += 1
        if self.capture is not None:
            self.capture.idle()
        self.installed.state.write_metadata(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                            np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))

    def _prompt_lens(self, layout, live) -> None:
        """Each row's prompt length as its request asked steering to see it (:func:`forced_prompt_len`,
        read once per request)."""
        plen = layout.plen.copy()  # the layout's arrays may be views of the runner's own
        for i, req in enumerate(layout.req_ids):
            forced = self._forced.get(req)
            if forced is None:
                forced = self._forced[req] = forced_prompt_len(self.view.sampling_params(req), int(plen[i]))
            plen[i] = forced
        layout.plen = plen
        if len(self._forced) > 4 * max(len(live), 64):
            self._forced = {k: v for k, v in self._forced.items() if k in live}

    def after(self) -> None:
        if self.capture is not None:
            self.capture.after()
        if self._pending is None:
            return
        before, self._pending = self._pending, None
        silent = self.installed.silent(before)
        self.verified = True
        if silent:
            raise EngineError(hooks_never_ran(silent, self.family))


def attach(model, runner, view, vllm_config, cfg: dict) -> InstalledPlan:
    """Install the plan named by ``cfg`` on a freshly loaded model (called by steerc's model loader)."""
    with open(cfg["plan"], "rb") as fh:
        obj = unpack(fh.read())
    tensors = validate_plan(obj, fingerprint=facts_of(vllm_config).fingerprint, key=engine_key(vllm_config))
    installed = _install(model, view, vllm_config, obj, tensors)
    if cfg.get("capture") is not None:
        attach_taps(model, vllm_config, installed.header["facts"], cfg["capture"])
    return installed


def attach_taps(model, vllm_config, facts: dict, sites) -> None:
    """The capture taps the engine was started with (``load(..., capture=...)``), after the plan's hooks and
    before torch.compile traces the model (:class:`~steerc.runtime.vllm.activations.Taps`)."""
    from steerc.runtime.vllm.activations import CaptureError, Taps

    tp_rank, tp_size = tensor_parallel()
    param = next(model.parameters())
    try:
        taps = Taps(model, sites, tp_rank=tp_rank, tp_size=tp_size, heads=int(facts["heads"]),
                    head_dim=int(facts["head_dim"]), max_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
                    dtype=compute_dtype(param.dtype), device=param.device)
    except (CaptureError, AttributeError, KeyError, TypeError) as exc:
        raise EngineError(f"additional_config.steerc.capture: {exc}") from None
    model.add_module("steerc_taps", taps)


def _install(model, view, vllm_config, obj, tensors) -> InstalledPlan:
    if getattr(vllm_config.cache_config, "enable_prefix_caching", False) and not prefix_cache_safe(obj["boot"]):
        raise PlanError("enable_prefix_caching", "this engine caches prefixes, and this plan steers a prefix "
                                                 "differently depending on the prompt's length or on "
                                                 "prompt-pooled probes (start the engine with prefix caching off)")
    tp_rank, tp_size = tensor_parallel()
    sched = vllm_config.scheduler_config
    installed = InstalledPlan(model, obj, tensors, tp_rank=tp_rank, tp_size=tp_size,
                              max_tokens=int(sched.max_num_batched_tokens), max_slots=int(sched.max_num_seqs))
    installed.feeder = PlanFeeder(installed, view, obj["header"]["family"])
    handles, installed.outside_forward = attach_step_calls(getattr(view, "runner", None), model,
                                                           installed.feeder.before, installed.feeder.after,
                                                           installed.feeder.idle)
    installed.handles += handles
    installed.view = view
    object.__setattr__(model, "_steerc_plan", installed)
    return installed


def _compile_counts() -> dict:
    """How much this worker has compiled: Dynamo frames traced and vLLM's compilation counters."""
    out = {}
    try:
        from torch._dynamo.utils import counters

        out["dynamo_frames"] = int(counters["frames"]["ok"])
        out["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
    except ImportError:
        pass
    try:
        from vllm.compilation.counter import compilation_counter as c

        out.update({k: v for k, v in vars(c).items() if isinstance(v, int) and not isinstance(v, bool)})
    except ImportError:
        pass
    return out


def _rpc(method):
    """A worker RPC that reports a refusal as data instead of raising.

    vLLM's ``collective_rpc`` raises the first rank's error and leaves the
    other ranks' replies queued for the next call; a refused payload must
    leave the engine as it was, so every rank answers, and the driver
    (:func:`call`) raises once it has all the answers.
    """
    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return dict(method(self, *args), ok=True)
        except (PlanError, EngineError) as exc:
            return {"ok": False, "error": {"field": getattr(exc, "field", "engine"), "message": str(exc)}}
        except Exception as exc:  # noqa: BLE001 - whatever else, the engine keeps serving and says why
            return {"ok": False, "error": {"field": "payload", "message": f"{type(exc).__name__}: {exc}"}}

    return wrapper


class SteercWorkerExtension:
    """Mixed into vLLM's Worker (``worker_extension_cls``); methods are reached by name.

    RPCs (``llm.collective_rpc("steerc_...", args=(...))``, msgpack-safe arguments; each rank
    answers a status map, ``{"ok": false, "error": {"field", "message"}}`` when it refuses —
    :func:`call` turns that into a :class:`PlanError`): ``steerc_update(plan_bytes)`` (new values
    for the installed structure, in place), ``steerc_set_params(values)`` (per-request params,
    in place), ``steerc_enable(flag)``, ``steerc_status()``, and
    ``steerc_install(plan_bytes)``, which replaces the structure on an eager engine (compiled
    graphs would keep the old one).
    """

    def _steerc_model(self):
        return self.model_runner.get_model()

    def _steerc_installed(self) -> InstalledPlan:
        installed = getattr(self._steerc_model(), "_steerc_plan", None)
        if installed is None:
            raise PlanError("plan", "no plan is installed on this worker (start the engine with "
                                    "steerc.runtime.vllm.load)")
        return installed

    @_rpc
    def steerc_capture_begin(self, spec: dict) -> dict:
        """Start reading activations (:mod:`.activations`): hooks on the spec's sites, after the plan's."""
        from steerc.runtime.vllm.activations import Capture, CaptureError

        feeder = self._steerc_installed().feeder
        if feeder.capture is not None:
            raise EngineError("a capture is already in progress on this engine")
        facts = self._steerc_installed().header["facts"]
        tp_rank, tp_size = tensor_parallel()
        try:
            model = self._steerc_model()
            feeder.capture = Capture(model, spec, tp_rank=tp_rank, tp_size=tp_size, heads=int(facts["heads"]),
                                     head_dim=int(facts["head_dim"]), taps=getattr(model, "steerc_taps", None),
                                     compiled=is_compiled(self.vllm_config), state=self._steerc_installed().state)
        except (CaptureError, KeyError, TypeError, AttributeError) as exc:
            raise PlanError("capture", str(exc)) from None
        return {}

    @_rpc
    def steerc_capture_end(self) -> dict:
        """The capture's means per row and site (this rank's share), and its hooks removed."""
        feeder = self._steerc_installed().feeder
        capture, feeder.capture = feeder.capture, None
        if capture is None:
            raise EngineError("no capture is in progress on this engine")
        capture.remove()
        if capture.failed is not None:
            raise PlanError("capture", capture.failed)
        return capture.result()

    @_rpc
    def steerc_install(self, payload: bytes) -> dict:
        if is_compiled(self.vllm_config):
            raise PlanError("plan", "this engine compiled its graph with the installed plan's structure; a new "
                                    "structure needs a new engine (or enforce_eager=True); for new values of "
                                    "the same structure use steerc_update")
        old = self._steerc_installed()
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=facts_of(self.vllm_config).fingerprint, key=engine_key(self.vllm_config))
        model = self._steerc_model()
        old.remove(model)
        try:
            _install(model, old.view, self.vllm_config, obj, tensors)
        except Exception:
            _install(model, old.view, self.vllm_config, old.obj, old.tensors)  # a refused plan changes nothing
            raise
        return self.steerc_status()

    @_rpc
    def steerc_update(self, payload: bytes) -> dict:
        installed = self._steerc_installed()
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=facts_of(self.vllm_config).fingerprint, boot=installed.boot,
                                key=engine_key(self.vllm_config))
        installed.state.write_state(tensors)
        installed.header = obj["header"]
        installed.obj, installed.tensors = obj, tensors
        return self.steerc_status()

    @_rpc
    def steerc_set_params(self, values) -> dict:
        """Per-request params of the installed plan at ``values`` (a map; the others at their defaults),
        written into its buffers in place."""
        installed = self._steerc_installed()
        if not installed.header.get("params"):
            raise PlanError("params", "the installed plan declares no per-request params")
        installed.state.write_state(param_tensors(installed.header, installed.boot, installed.tensors, values))
        return self.steerc_status()

    @_rpc
    def steerc_enable(self, flag: bool) -> dict:
        if not isinstance(flag, bool):
            raise PlanError("flag", f"expected true or false, got {type(flag).__name__}")
        self._steerc_installed().state.enabled.fill_(flag)
        return self.steerc_status()

    @_rpc
    def steerc_status(self) -> dict:
        installed = getattr(self._steerc_model(), "_steerc_plan", None)
        base = {"vllm": vllm_version(), "compile": _compile_counts()}
        if installed is None:
            return dict(base, installed=False, hooks=[], skipped=[])
        feeder = installed.feeder
        return dict(
            base,
            installed=True,
            source_sha256=installed.header["source_sha256"],
            boot_sha256=installed.header["boot_sha256"],
            hooks=list(installed.installed),
            skipped=list(installed.skipped),
            fired=installed.fired(),
            enabled=bool(installed.state.enabled.item()),
            runner=installed.view.runner_kind,
            # where each step's metadata is written: around the runner's model call (a full CUDA graph replays
            # with it), or in hooks on the model's own forward
            metadata="outside the forward" if installed.outside_forward else "in the forward's hooks",
            forwards=feeder.forwards,
            real_steps=feeder.real_steps,
        )
