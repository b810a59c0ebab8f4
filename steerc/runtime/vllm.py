"""steerc on vLLM: the vllm target's runtime (one plan for every request, compiled graphs kept).

Use::

    from steerc.runtime.vllm import load, swap
    llm = load("path/to/model", "out/plan.msgpack")   # a steered vllm.LLM
    llm.generate(prompts, params)
    swap(llm, "out2/plan.msgpack")   # same structure, new values: written in place

How it stays exact and keeps compiled graphs (see :mod:`steerc.runtime.vllm_engine`):
:func:`load` starts the engine with ``load_format="steerc"``, whose model
loader installs the plan's hooks right after the weights load — before
torch.compile traces the model and before any CUDA graph is captured —
and a forward pre-hook that writes each step's per-token metadata
(position, prompt length, request slot) into fixed buffers outside the
graph. :class:`SteercWorkerExtension` (``worker_extension_cls``) adds the
``steerc_*`` methods, called by name with ``LLM.collective_rpc`` and
msgpack-safe arguments (plan bytes): never pickle.

No silent no-op: every installed hook counts its runs inside the graph;
after the first real step the worker checks that each one ran, and
:func:`load` checks it again after warm-up.

Tensor parallel: ``head[l, h]`` is applied on the rank holding head ``h``
(query heads are split in contiguous blocks); residual, attention-output and
MLP-output kernels run on every rank on identical, already-reduced tensors.
Where a family's layer reduces later (Cohere's attention and MLP, summed
before one all-reduce) those sites are refused under tensor parallelism.
Pipeline parallel: each rank hooks only the layers it owns, and the driver
checks that every hook of the plan landed on some rank.
"""

from __future__ import annotations

import os

import numpy as np

from steerc.runtime.vllm_engine import CONFIG_KEY, LOAD_FORMAT, EngineError, register_loader
from steerc.targets.vllm.wire import PlanError, boot_sha256, unpack, validate_plan

EXTENSION = "steerc.runtime.vllm.SteercWorkerExtension"


def _vllm():
    try:
        import vllm
    except ImportError:
        raise ImportError("steerc's vLLM runtime needs vLLM: pip install 'steerc[vllm]' (a CUDA machine)") from None
    return vllm


# --------------------------------------------------------------------- worker


def _parallel() -> tuple[int, int]:
    """(tensor-parallel rank, size) of this worker process."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def _owns(model, module_path: str) -> bool:
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return False
    return type(module).__name__ != "PPMissingLayer"


def _layer_path(module_path: str) -> str:
    parts = module_path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return module_path


def _localise(hook: dict, heads: int, tp_rank: int, tp_size: int, head_dim: int, family: str) -> dict | None:
    """This rank's share of a hook: head sites keep the heads it holds, with local columns."""
    from steerc.facts.sites import site_table

    table = site_table(family, "vllm")
    local = heads // tp_size
    sites = []
    for site in hook["sites"]:
        refusal = table.tensor_parallel_refusal(site["site"].split("[", 1)[0], tp_size)
        if refusal is not None:
            raise PlanError("plan.boot.hooks", f"{site['site']}: {refusal}")
        if site["head"] is None:
            sites.append(dict(site, local_columns=None))
            continue
        h = site["head"]
        # Checked on every rank alike, so that a refused plan is refused everywhere.
        if site["probes"] and tp_size > 1:
            raise PlanError("plan.boot.hooks", f"probe at {site['site']}: a head probe cannot be shared across "
                                              "tensor-parallel ranks; read it at a residual site instead")
        if h // local != tp_rank:
            continue
        j = h % local
        sites.append(dict(site, local_columns=[j * head_dim, (j + 1) * head_dim]))
    return dict(hook, sites=sites) if sites else None


class InstalledPlan:
    """The hooks, buffers and structure installed on one worker's model."""

    def __init__(self, model, obj: dict, tensors: dict, *, tp_rank: int, tp_size: int, max_tokens: int,
                 max_slots: int):
        from steerc.runtime import _support as S
        from steerc.runtime.vllm_steer import SteerState, register, site_function

        facts = obj["header"]["facts"]
        param = next(model.parameters())
        self.obj, self.tensors = obj, tensors
        self.boot = obj["boot"]
        self.header = obj["header"]
        self.state = SteerState(self.boot, tensors, max_tokens=max_tokens, max_slots=max_slots,
                                width=max(facts["hidden"], facts["head_dim"]),
                                dtype=S.compute_dtype(param.dtype), device=param.device)
        if hasattr(model, "steerc"):
            raise PlanError("plan", "this model already has steerc installed")
        model.add_module("steerc", self.state)
        self.handles = []
        self.installed: list[str] = []
        self.registered: dict[str, tuple[int, str]] = {}  # hook name -> (fired index, module)
        self.skipped: list[str] = []
        probe_layers = {p["name"]: p["layer"] for p in self.boot["probes"]}
        try:
            for index, hook in enumerate(self.boot["hooks"]):
                if not _owns(model, _layer_path(hook["module"])):
                    self.skipped.append(hook["name"])
                    continue
                local = _localise(hook, facts["heads"], tp_rank, tp_size, facts["head_dim"], facts["family"])
                if local is None:
                    self.installed.append(hook["name"])  # no head of this rank: nothing to do here
                    continue
                self._check_probes_here(model, local, probe_layers)
                module = model.get_submodule(hook["module"])
                self.handles.append(register(module, hook, site_function(self.state, local["sites"], index)))
                self.installed.append(hook["name"])
                self.registered[hook["name"]] = (index, hook["module"])
        except Exception:
            self.remove(model)
            raise

    def _check_probes_here(self, model, hook: dict, probe_layers: dict) -> None:
        """A gate's probes must run on this pipeline stage (their values do not cross stages)."""
        gates = self.boot["gates"]
        for site in hook["sites"]:
            for k in site["kernels"]:
                if k["gate"] is None:
                    continue
                root = _layer_path(hook["module"]).rsplit(".", 1)[0]
                for name in _gate_probes(gates[k["gate"]]):
                    if not _owns(model, f"{root}.{probe_layers[name]}"):
                        raise PlanError("plan.boot.gates", f"probe `{name}` sits on another pipeline stage than "
                                                           f"the kernel it gates at {site['site']}")

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


def _gate_probes(gate) -> list[str]:
    if gate[0] == "cmp":
        return [gate[1]]
    if gate[0] == "not":
        return _gate_probes(gate[1])
    return [n for g in gate[1] for n in _gate_probes(g)]


class PlanFeeder:
    """Before each forward: the step's token metadata into the plan's buffers; after the first real one:
    the check that every hook ran."""

    def __init__(self, installed: InstalledPlan, view, family: str):
        from steerc.runtime.vllm_engine import Slots

        self.installed = installed
        self.view = view
        self.family = family
        self.slots = Slots(installed.state.max_slots)
        self.forwards = 0
        self.real_steps = 0
        self._pending: dict | None = None
        self.verified = False

    def before(self, positions) -> None:
        from steerc.runtime.vllm_engine import token_metadata

        state = self.installed.state
        self.forwards += 1
        layout = self.view.layout()
        if layout is None:  # a dummy run (profiling, warm-up, capture): nothing is steered
            state.write_metadata(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                 np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
            return
        pos, plen, row = token_metadata(layout, positions, "vllm target")
        slots, fresh = self.slots.assign(layout.req_ids, self.view.live())
        restarted = [int(slots[i]) for i in range(len(layout.req_ids)) if layout.first[i] == 0]
        state.reset_slots(sorted(set(fresh) | set(restarted)))
        state.write_metadata(pos, plen, slots[row], np.ones(len(pos), dtype=bool))
        self.real_steps += 1
        if not self.verified:
            self._pending = self.installed.fired()

    def after(self) -> None:
        if self._pending is None:
            return
        before, self._pending = self._pending, None
        silent = self.installed.silent(before)
        self.verified = True
        if silent:
            raise EngineError(hooks_never_ran(silent, self.family))


def hooks_never_ran(silent: list[str], family: str) -> str:
    from steerc.runtime.vllm_engine import vllm_version

    return (f"steerc: {len(silent)} planned hook(s) never ran on vLLM {vllm_version()} for family {family!r}: "
            f"{', '.join(silent[:6])}; the model's forward does not go through these modules, so the plan "
            "would silently not apply")


def fingerprint_of(vllm_config) -> str:
    from steerc.facts import facts_from_config

    hf_config = vllm_config.model_config.hf_config
    config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    return facts_from_config(config).fingerprint


def attach_plan(model, runner, view, vllm_config, cfg: dict) -> InstalledPlan:
    """Install the plan named by ``cfg`` on a freshly loaded model (called by steerc's model loader)."""
    from steerc.runtime.vllm_engine import engine_key

    with open(cfg["plan"], "rb") as fh:
        obj = unpack(fh.read())
    tensors = validate_plan(obj, fingerprint=fingerprint_of(vllm_config), key=engine_key(vllm_config))
    return _install(model, view, vllm_config, obj, tensors)


def _install(model, view, vllm_config, obj, tensors) -> InstalledPlan:
    from steerc.runtime.vllm_engine import attach_step_hooks

    if getattr(vllm_config.cache_config, "enable_prefix_caching", False) and not prefix_cache_safe(obj["boot"]):
        raise PlanError("enable_prefix_caching", "this engine caches prefixes, and this plan steers a prefix "
                                                 "differently depending on the prompt's length or on "
                                                 "prompt-pooled probes (start the engine with prefix caching off)")
    tp_rank, tp_size = _parallel()
    sched = vllm_config.scheduler_config
    installed = InstalledPlan(model, obj, tensors, tp_rank=tp_rank, tp_size=tp_size,
                              max_tokens=int(sched.max_num_batched_tokens), max_slots=int(sched.max_num_seqs))
    installed.feeder = PlanFeeder(installed, view, obj["header"]["family"])
    installed.handles += attach_step_hooks(model, installed.feeder.before, installed.feeder.after)
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
    import functools

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
    def steerc_install(self, payload: bytes) -> dict:
        cfg = self.vllm_config.compilation_config
        if not self.vllm_config.model_config.enforce_eager and int(getattr(cfg, "mode", 0) or 0) != 0:
            raise PlanError("plan", "this engine compiled its graph with the installed plan's structure; a new "
                                    "structure needs a new engine (or enforce_eager=True); for new values of "
                                    "the same structure use steerc_update")
        from steerc.runtime.vllm_engine import engine_key

        old = self._steerc_installed()
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=fingerprint_of(self.vllm_config), key=engine_key(self.vllm_config))
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
        from steerc.runtime.vllm_engine import engine_key

        installed = self._steerc_installed()
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=fingerprint_of(self.vllm_config), boot=installed.boot,
                                key=engine_key(self.vllm_config))
        installed.state.write_state(tensors)
        installed.header = obj["header"]
        installed.obj, installed.tensors = obj, tensors
        return self.steerc_status()

    @_rpc
    def steerc_set_params(self, values) -> dict:
        """Per-request params of the installed plan at ``values`` (a map; the others at their defaults),
        written into its buffers in place."""
        from steerc.targets.vllm.wire import param_tensors

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
        from steerc.runtime.vllm_engine import vllm_version

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
            forwards=feeder.forwards,
            real_steps=feeder.real_steps,
        )


# --------------------------------------------------------------------- driver


def read_plan(plan) -> bytes:
    """Plan bytes from a path, a compile output folder, or bytes."""
    if isinstance(plan, (bytes, bytearray)):
        return bytes(plan)
    path = os.path.join(plan, "plan.msgpack") if os.path.isdir(plan) else plan
    with open(path, "rb") as fh:
        return fh.read()


def check_coverage(statuses: list[dict], boot: dict) -> None:
    """Every hook of the plan landed on some rank (pipeline stages split the layers), and — where the
    engine already ran a forward (compile warm-up) — every registered hook ran in it."""
    landed = {name for s in statuses for name in s.get("hooks", [])}
    missing = [h["name"] for h in boot["hooks"] if h["name"] not in landed]
    if missing:
        raise PlanError("plan.boot.hooks", f"hooks not installed on any rank: {', '.join(missing[:8])}")
    modules = {h["name"]: h["module"] for h in boot["hooks"]}
    silent = [f"{name} ({modules[name]})" for s in statuses if s.get("forwards")
              for name, count in (s.get("fired") or {}).items() if count == 0]
    if silent:
        raise EngineError(hooks_never_ran(sorted(set(silent)), statuses[0].get("family", "?")))


def prefix_cache_safe(boot: dict) -> bool:
    """Whether a token's steering depends only on its own position and prefix (so cached KV stays right).

    Scopes relative to the prompt length, and prompt-pooled probes, make the
    same prefix steer differently in different requests: such plans run with
    prefix caching off.
    """
    pooled = any(p["pool"] != "token" for p in boot["probes"])
    relative = any(item[0] not in ("all", "positions") for scope in boot["scopes"] for item in scope)
    return not (pooled or relative)


def plan_file(data: bytes) -> str:
    """A content-addressed copy of the plan for the workers (same plan, same path: vLLM's compile cache
    is keyed on it)."""
    import hashlib
    import tempfile

    from steerc.core.paths import temp_folder

    explicit = os.environ.get("STEERC_CACHE")
    folder = os.path.join(explicit, "plans") if explicit else temp_folder("plans")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(data).hexdigest() + ".msgpack")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".incoming-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return path


def load(model: str, plan, *, hmac_key_file: str | None = None, **engine_kwargs):
    """A ``vllm.LLM`` for ``model`` with ``plan`` installed on every worker before compilation.

    ``engine_kwargs`` go to ``vllm.LLM``; a ``load_format`` is the one steerc's
    loader delegates to. With ``hmac_key_file``, the workers accept only plans
    signed with that key (this one, and every later ``swap``). Prefix caching is on only for plans it cannot
    change (see :func:`prefix_cache_safe`); FULL CUDA graphs become
    PIECEWISE (full graphs replay without the step metadata steerc writes);
    JSON-schema constraints come out compact (``structured_outputs_config``
    ``disable_any_whitespace``, which vLLM's xgrammar backend reads per engine).
    """
    vllm = _vllm()
    register_loader()
    data = read_plan(plan)
    obj = unpack(data)
    validate_plan(obj)
    safe = prefix_cache_safe(obj["boot"])
    if engine_kwargs.get("enable_prefix_caching") and not safe:
        raise PlanError("enable_prefix_caching", "this plan steers a prefix differently depending on the "
                                                 "prompt's length or on prompt-pooled probes; cached KV from "
                                                 "another request would be wrong (leave prefix caching off)")
    engine_kwargs.setdefault("enable_prefix_caching", safe)
    if not engine_kwargs.get("enforce_eager") and "compilation_config" not in engine_kwargs and _has_cuda():
        engine_kwargs["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    # JSON comes out compact on every backend; vLLM's xgrammar backend reads this per engine, not per request.
    engine_kwargs.setdefault("structured_outputs_config", {"backend": "xgrammar", "disable_any_whitespace": True})
    extra = dict(engine_kwargs.pop("additional_config", None) or {})
    extra[CONFIG_KEY] = {"mode": "plan", "plan": plan_file(data), "boot_sha256": boot_sha256(obj["boot"]),
                         "load_format": engine_kwargs.pop("load_format", "auto")}
    if hmac_key_file:
        extra[CONFIG_KEY]["hmac_key_file"] = os.path.abspath(hmac_key_file)
    llm = vllm.LLM(model=model, load_format=LOAD_FORMAT, worker_extension_cls=EXTENSION, additional_config=extra,
                   **engine_kwargs)
    try:
        statuses = call(llm, "steerc_status")
        for s in statuses:
            s.setdefault("family", obj["header"]["family"])
        check_coverage(statuses, obj["boot"])
    except Exception:
        llm.llm_engine.engine_core.shutdown()  # a plan that would not apply: no engine is left running
        raise
    return llm


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def sampling_params(plan, **kwargs):
    """``vllm.SamplingParams`` carrying the plan's output constraint (compact JSON for schemas).

    Uses ``StructuredOutputsParams`` (vLLM >= 0.11), or the older
    ``GuidedDecodingParams`` where that is what the installed vLLM has.
    """
    import dataclasses

    from steerc.targets.constraints import constraint_from_json, structured_outputs

    vllm = _vllm()
    constraint = unpack(read_plan(plan))["header"].get("constraint")
    if constraint is None:
        return vllm.SamplingParams(**kwargs)
    fields = structured_outputs(constraint_from_json(constraint))
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return vllm.SamplingParams(structured_outputs=StructuredOutputsParams(**fields), **kwargs)
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        known = {f.name for f in dataclasses.fields(GuidedDecodingParams)}
        return vllm.SamplingParams(guided_decoding=GuidedDecodingParams(
            **{k: v for k, v in fields.items() if k in known}), **kwargs)


def call(llm, method: str, *args) -> list[dict]:
    """Call a ``steerc_*`` RPC on every rank: their statuses, or PlanError if any rank refused."""
    statuses = llm.collective_rpc(method, args=args)
    for rank, s in enumerate(statuses):
        if not s.get("ok", False):
            err = s.get("error") or {}
            raise PlanError(err.get("field", "plan"), f"rank {rank}: {err.get('message', 'refused')}")
    return statuses


def _changed(llm, statuses: list[dict]) -> list[dict]:
    """After the steering changed: cached prefixes were computed under the old steering, so they go."""
    reset = getattr(llm, "reset_prefix_cache", None)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    caching = getattr(getattr(config, "cache_config", None), "enable_prefix_caching", True)
    if reset is not None and caching:
        reset()
    return statuses


def swap(llm, plan) -> list[dict]:
    """Write a new plan's values into a running engine (same structure), in place (and drop cached
    prefixes, which hold KV steered by the old values)."""
    return _changed(llm, call(llm, "steerc_update", read_plan(plan)))


def install(llm, plan) -> list[dict]:
    """Replace the installed plan's structure (eager engines only; a refused plan changes nothing)."""
    return _changed(llm, call(llm, "steerc_install", read_plan(plan)))


def set_params(llm, values: dict) -> list[dict]:
    """Give the installed plan's per-request params these values (the others: their defaults), in place.

    The same kernels as a plan compiled with ``--set`` to those values; no
    recompilation. A name the plan does not declare, or a value outside its
    range, is refused by every rank (PlanError naming ``params.<name>``) and
    changes nothing.
    """
    return _changed(llm, call(llm, "steerc_set_params", dict(values)))


def enable(llm, flag: bool) -> list[dict]:
    """Turn steering on or off for every request (the buffers and graph stay as they are)."""
    return _changed(llm, call(llm, "steerc_enable", flag))


def status(llm) -> list[dict]:
    return call(llm, "steerc_status")
