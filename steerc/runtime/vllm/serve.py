"""The steerc serve plugin for vLLM: a plan per request, applied to that request's rows only.

Start a server with ``steerc serve MODEL [vLLM options]``: it runs vLLM's
OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``)
with the pieces below switched on through vLLM's own mechanisms — no patch
of vLLM:

* ``--middleware steerc.runtime.serve_http.SteercAdmission`` — the HTTP
  front end admits each request before vLLM parses it
  (:func:`steerc.targets.serve.admission.admit`: the plan, its artifacts,
  the model, the cache salt); a bad one gets HTTP 400 naming the field.
  Artifacts a request names but does not carry are inlined from the
  server's store, so the workers never depend on it.
* ``--logits-processors steerc.runtime.serve:SteercGuard`` — its
  ``validate_params`` admits requests of the offline API (``vllm.LLM``)
  the same way; in the worker it ends any request whose steering could not
  be built (it never runs unsteered).
* ``--load-format steerc`` with ``--additional-config
  '{"steerc": {"mode": "serve"}}'`` — steerc's model loader installs
  :class:`ServeRouter` on the loaded model (see
  :mod:`steerc.runtime.vllm.loader`); ``--enforce-eager``, because
  per-request plans differ in structure and dispatch in Python each step.

In the worker, :class:`ServeRouter` reads each new request's plan from its
``SamplingParams.extra_args``, admits it again (the same function, on the
same inline bytes), builds its buffers with the vllm target's machinery
(:mod:`steerc.runtime.vllm.steer`: the same kernels, probes and gates), and
hooks the modules its plan touches. Each step a hook applies every steered
request's kernels to that request's token rows only; rows of other
requests stay bit-identical. Pooled probes keep per-request state across
chunked-prefill steps.

Prefix caching: a steered request carries ``cache_salt`` = the plan's salt
(checked at admission), so KV computed under one plan is never reused by a
request with another plan or none. A plan whose steering depends on tokens a
cache hit skips (:func:`steerc.targets.vllm.program.prefix_cache_safe`: prompt-pooled
probes, scopes relative to the prompt) gets a salt of its own per request
from the HTTP front end; a request of such a plan whose first step still
starts past token 0 (a cache hit) is failed closed here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

import numpy as np

from steerc.core.paths import temp_folder
from steerc.facts import ModelFacts
from steerc.runtime.kernels import compute_dtype
from steerc.runtime.vllm import points
from steerc.runtime.vllm.engine import (
    attach_step_hooks,
    engine_key,
    facts_of,
    hooks_never_ran,
    is_compiled,
    pipeline_stages,
    served_sites,
    token_metadata,
)
from steerc.runtime.vllm.parallel import check_gates_on_stage, layer_path, localise, owns, tensor_parallel
from steerc.runtime.vllm.receipt import Receipt
from steerc.runtime.vllm.slots import SlotTables, host_mask, slottable
from steerc.runtime.vllm.steer import SteerState, site_function
from steerc.targets.serve.admission import MAX_ARTIFACT_BYTES, MAX_PLAN_CHARS, RequestError, admit, decode_json
from steerc.targets.serve.capacity import point_hooks
from steerc.targets.serve.format import artifact_id, read_artifact
from steerc.targets.serve.request import PLAN_KEY, RECEIPT_KEY
from steerc.targets.signing import env_key
from steerc.targets.vllm.program import build, prefix_cache_safe

log = logging.getLogger("steerc")
FAILED_KEY = "steerc_failed"


def default_store() -> str:
    return os.environ.get("STEERC_ARTIFACTS") or temp_folder("artifacts")


def default_cap() -> int:
    return int(os.environ.get("STEERC_ARTIFACTS_CAP_MB", "1024")) * 1024 * 1024


# --------------------------------------------------------------------- store


class ArtifactStore:
    """Tensors by sha256 in a folder: ``<root>/<id>.safetensors``."""

    def __init__(self, root: str | None = None, cap_bytes: int | None = None):
        self.root = root or default_store()
        self.cap_bytes = cap_bytes if cap_bytes is not None else default_cap()
        self._verified: set[str] = set()
        os.makedirs(self.root, exist_ok=True)

    def path(self, key: str) -> str:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise RequestError("artifact", f"{key!r} is not a sha256 hex digest")
        return os.path.join(self.root, f"{key}.safetensors")

    def has(self, key: str) -> bool:
        return os.path.isfile(self.path(key))

    def put(self, data: bytes, expected: str | None = None) -> str:
        """Store ``data`` under its sha256 (refused if it is not ``expected``); atomic."""
        if len(data) > MAX_ARTIFACT_BYTES:
            raise RequestError("artifact", f"{len(data)} bytes is over the {MAX_ARTIFACT_BYTES}-byte cap")
        key = artifact_id(data)
        if expected is not None and key != expected:
            raise RequestError(f"artifacts.{expected[:16]}", "content does not hash to its name (tampered?)")
        try:
            read_artifact(data, key)
        except Exception as exc:  # noqa: BLE001 - any malformed artifact is refused the same way
            raise RequestError(f"artifacts.{key[:16]}", str(exc)) from None
        path = self.path(key)
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        self._verified.add(key)
        os.utime(path)
        self.evict(keep={key})
        return key

    def get(self, key: str) -> bytes:
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise RequestError(f"artifacts.{key[:16]}", "not staged on this server (send it inline)") from None
        if key not in self._verified:
            if artifact_id(data) != key:
                raise RequestError(f"artifacts.{key[:16]}", "stored content does not hash to its name (tampered?)")
            self._verified.add(key)
        os.utime(path)
        return data

    def lookup(self, key: str) -> bytes | None:
        """The verified bytes of a staged artifact, or None if it is not here (tampered: refused)."""
        return self.get(key) if self.has(key) else None

    def evict(self, keep: set[str] = frozenset()) -> list[str]:
        """Remove least-recently-used artifacts until the store fits its cap."""
        entries = []
        for name in os.listdir(self.root):
            if name.endswith(".safetensors"):
                p = os.path.join(self.root, name)
                st = os.stat(p)
                entries.append((st.st_mtime, st.st_size, name[: -len(".safetensors")], p))
        total = sum(e[1] for e in entries)
        removed = []
        for _, size, key, p in sorted(entries):
            if total <= self.cap_bytes:
                break
            if key in keep:
                continue
            os.remove(p)
            self._verified.discard(key)
            total -= size
            removed.append(key)
        return removed


# -------------------------------------------------------------------- worker


class RequestSteer:
    """One request's steering: its buffers (vLLM buffer form) and per-module functions."""

    def __init__(self, plan, facts, *, max_tokens: int, dtype, device, tp_rank: int, tp_size: int,
                 slot_id: str = "", receipt: bool = False, model=None):
        boot, tensors = build(plan, facts)
        self.cacheable = prefix_cache_safe(boot)  # may it reuse KV that other requests computed?
        # Pipeline stages: this worker's hooks only (model None: every hook, as in the tests without an engine).
        here = (lambda path: True) if model is None else (lambda path: owns(model, layer_path(path)))
        hooks = {}
        for hook in boot["hooks"]:
            local = localise(hook, facts.heads, tp_rank, tp_size, facts.head_dim, facts.family)
            if local is not None and here(hook["module"]):
                if model is not None:
                    check_gates_on_stage(model, boot, local)
                hooks[(hook["module"], hook["kind"], hook["tensor"])] = local
        # Which stage answers for the receipt: the one holding the plan's probes (gate values stay on their
        # stage), else the first; probes on two stages leave no stage able to.
        root = layer_path(boot["hooks"][0]["module"]).rsplit(".", 1)[0] if boot["hooks"] else "model.layers"
        probes = [here(f"{root}.{p['layer']}") for p in boot["probes"]]
        self.receipt_here = probes[0] if probes else here(f"{root}.0")
        self.receipt_split = not all(probes)
        receipt = receipt and self.receipt_here
        kernels = {key: slottable(local, lambda name: np.size(tensors[name]), facts.hidden)
                   for key, local in hooks.items()}
        # Only slotted kernels and no receipt: nothing reads this request's own step metadata.
        self.needs_metadata = receipt or any(k is None for k in kernels.values())
        self.state = SteerState(boot, tensors, max_tokens=max_tokens if self.needs_metadata else 1, max_slots=1,
                                width=max(facts.hidden, facts.head_dim), dtype=dtype, device=device)
        self.fns = {key: site_function(self.state, local["sites"]) for key, local in hooks.items()}
        self.slotted: dict[tuple, tuple] = {}  # point key -> (scale, bias, scope): lowered into a plan slot
        for key, kernel in kernels.items():
            if kernel is not None:
                scale, bias, scope = kernel
                self.slotted[key] = (self.state.buffer(scale), None if bias is None else self.state.buffer(bias),
                                     boot["scopes"][scope])
        self.slot_id, self.slot = slot_id, 0
        self.started = False
        self.receipt: Receipt | None = None

    def masks(self, pos, plen) -> dict:
        """Each slotted point's scope mask over this step's rows of the request (one per distinct scope)."""
        by_scope, out = {}, {}
        for key, (_, _, scope) in self.slotted.items():
            tag = id(scope)
            if tag not in by_scope:
                by_scope[tag] = host_mask(scope, pos, plen)
            out[key] = by_scope[tag]
        return out

    def feed(self, pos, plen, restart: bool) -> None:
        if restart and self.started:  # recomputed from its first token (after preemption): pool afresh
            self.state.reset_slots([0])
            if self.receipt is not None:
                self.receipt.restart()
        self.started = True
        n = len(pos)
        self.state.write_metadata(pos, plen, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))


_FAILED = object()


def slot_id(admitted) -> str:
    """Requests share a plan slot when they run the same plan with the same param values."""
    params = json.dumps(admitted.params, sort_keys=True, default=repr)
    return hashlib.sha256(f"{admitted.plan_id}\n{params}".encode()).hexdigest()


def _body(key, router):
    """A steer point's body: each steered request's function on its own rows (others untouched), or None
    when no request steers here this step."""
    if key[2] == "fused_pair":
        def pair(hidden, residual):
            router.ran.add(key)
            active = router.rows.get(key, ())
            if key in router.slots.step:
                hidden, residual = router.slots.apply_pair(key, hidden, residual)
            elif not active:
                return None
            else:
                hidden, residual = hidden.clone(), residual.clone()
            for req, a, b in active:
                fn = req.fns[key]
                total = hidden[a:b].to(fn.dtype) + residual[a:b].to(fn.dtype)
                hidden[a:b] = fn(total).to(hidden.dtype)
                residual[a:b] = 0  # the next fused add-norm sums the pair: rows stay exact
            return hidden, residual

        return pair

    def one(x):
        router.ran.add(key)
        flat = x.reshape(-1, x.shape[-1])
        out = router.slots.apply(key, flat) if key in router.slots.step else None
        for req, a, b in router.rows.get(key, ()):
            if out is None:
                out = flat.clone()
            out[a:b] = req.fns[key](flat[a:b])
        return None if out is None else out.reshape(x.shape)

    return one


class ServeRouter:
    """The worker side of the serve plugin, installed on the model by steerc's loader (mode "serve")."""

    def __init__(self, model, view, vllm_config):
        self.model, self.view = model, view
        self.facts = facts_of(vllm_config)
        self.key = engine_key(vllm_config)
        self.sites = served_sites(vllm_config)
        self.stages = pipeline_stages(vllm_config)
        self.compiled = is_compiled(vllm_config)
        self.max_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        param = next(model.parameters())
        self.dtype, self.device = compute_dtype(param.dtype), param.device
        self.tp_rank, self.tp_size = tensor_parallel()
        self.requests: dict[str, object] = {}   # req id -> RequestSteer, None (unsteered) or _FAILED
        self.rows: dict[tuple, list] = {}
        self.hooks: dict[tuple, object] = {}
        self.slots = SlotTables(self.facts.hidden, self.dtype, self.device)
        self.ran: set = set()
        self.fresh: list = []
        self.receipts: list = []
        self.failures = 0
        self.handles = attach_step_hooks(model, self.before, self.after)
        if self.compiled:
            # Traced once, at the first forward: every provisioned site has its steer point from now on.
            if self.device.type == "cuda":
                comp = vllm_config.compilation_config
                comp.splitting_ops = list(comp.splitting_ops or []) + [
                    op for op in points.SPLITTING_OPS if op not in (comp.splitting_ops or [])]
            for key in point_hooks(self.facts, self.sites):
                if owns(model, layer_path(key[0])):
                    self._point(key)

    # -- per step ---------------------------------------------------------
    def before(self, positions) -> None:
        self.rows, self.ran, self.fresh, self.receipts = {}, set(), [], []
        live = self.view.live()
        for gone in [r for r in self.requests if r not in live]:
            steer = self.requests.pop(gone)
            if isinstance(steer, RequestSteer) and steer.slotted:
                self.slots.release(steer.slot_id)
        slotted: dict[tuple, list] = {}
        layout = self.view.layout()
        if layout is None:
            self.slots.write_step(slotted, 0)
            return
        pos, plen, _ = token_metadata(layout, positions, "serve")
        for i, rid in enumerate(layout.req_ids):
            if rid not in self.requests:
                self.requests[rid] = self._admit(rid)
                steer = self.requests[rid]
                if isinstance(steer, RequestSteer) and not steer.cacheable and int(layout.first[i]) > 0:
                    # Its first step starts past token 0: vLLM served the rest from the prefix cache, computed
                    # without this request's pooled probes or prompt-relative scopes. Never steer half a prompt.
                    self._fail(rid, f"its first {int(layout.first[i])} tokens came from the prefix cache, and its "
                                    "plan depends on every prompt token (a prompt-pooled probe or a scope relative "
                                    "to the prompt): send it with a cache_salt of its own (steerc serve does)")
                elif isinstance(steer, RequestSteer):
                    self.fresh.append(rid)
            steer = self.requests[rid]
            if not isinstance(steer, RequestSteer):
                continue
            a, b = int(layout.starts[i]), int(layout.starts[i + 1])
            if steer.needs_metadata:
                steer.feed(pos[a:b], plen[a:b], restart=bool(layout.first[i] == 0))
            if steer.receipt is not None:
                self.receipts.append((steer, pos[a:b], plen[a:b]))
            masks = steer.masks(pos[a:b], plen[a:b]) if steer.slotted else {}
            for key in steer.fns:
                if key in masks:
                    slotted.setdefault(key, []).append((steer.slot, a, b, masks[key]))
                else:
                    self.rows.setdefault(key, []).append((steer, a, b))
        self.slots.write_step(slotted, len(pos))

    def after(self) -> None:
        """A request's first step must have run every hook its plan needs on this rank."""
        for rid in self.fresh:
            steer = self.requests.get(rid)
            missing = [k[0] for k in steer.fns if k not in self.ran and owns(self.model, layer_path(k[0]))]
            if missing:
                self._fail(rid, hooks_never_ran(missing, self.facts.family))
        for steer, pos, plen in self.receipts:  # after the pass: what its kernels did, before vLLM sees it
            steer.receipt.record(steer.state, pos, plen)

    # -- requests -----------------------------------------------------------
    def _admit(self, rid: str):
        params = self.view.sampling_params(rid)
        extra = getattr(params, "extra_args", None)
        try:
            admitted = admit(extra, self.facts, tp_size=self.tp_size, key=self.key, sites=self.sites,
                             stages=self.stages)
            if admitted is None:
                return None
            receipt = extra.get(RECEIPT_KEY) is not None and self.tp_rank == 0
            steer = RequestSteer(admitted.plan, self.facts, max_tokens=self.max_tokens, dtype=self.dtype,
                                  device=self.device, tp_rank=self.tp_rank, tp_size=self.tp_size,
                                  slot_id=slot_id(admitted), receipt=receipt, model=self.model)
            self._hook(steer)
            if receipt and steer.receipt_here:  # one worker writes it: the first rank of the probes' stage
                steer.receipt = Receipt(extra[RECEIPT_KEY], admitted)
                if steer.receipt_split:
                    steer.receipt.fail("its probes lie on two pipeline stages, and no one stage holds every "
                                       "gate's values; its steering is unaffected")
            if steer.slotted:  # last: a request that holds a slot is in self.requests
                steer.slot = self.slots.acquire(steer.slot_id, {k: v[:2] for k, v in steer.slotted.items()})
            return steer
        except Exception as exc:  # noqa: BLE001 - this request fails; the engine and the others go on
            self._fail(rid, str(exc), params)
            return _FAILED

    def _fail(self, rid: str, message: str, params=None) -> None:
        """Fail one request closed: it is never steered, and SteercGuard ends it at its next token."""
        self.failures += 1
        held = self.requests.get(rid)
        if isinstance(held, RequestSteer) and held.slotted:
            self.slots.release(held.slot_id)
        self.requests[rid] = _FAILED
        params = params if params is not None else self.view.sampling_params(rid)
        extra = getattr(params, "extra_args", None)
        if isinstance(extra, dict):
            extra[FAILED_KEY] = message[:500]
        log.error("steerc: request %s refused in the worker and ended: %s", rid, message)

    def _hook(self, steer: RequestSteer) -> None:
        """Eager: a steer point at each module a plan needs, the first time one does. Compiled: they are all
        there since boot (admission refused sites without one)."""
        for key in steer.fns:
            if key in self.hooks or not owns(self.model, layer_path(key[0])):
                continue
            if self.compiled:
                raise RequestError("steerc_plan", f"no steer point at {key[0]} on this compiled server")
            self._point(key)

    def _point(self, key) -> None:
        self.hooks[key] = points.install(self.model.get_submodule(key[0]), key[1], key[2], _body(key, self))

    def status(self) -> dict:
        steered = sorted(r for r, s in self.requests.items() if isinstance(s, RequestSteer))
        return {"steered": steered, "hooks": len(self.hooks), "failures": self.failures,
                "plan_slots": len(self.slots.plans), "slot_capacity": self.slots.capacity,
                "runner": self.view.runner_kind, "compiled": self.compiled, "sites": list(self.sites)}


def attach(model, runner, view, vllm_config, cfg: dict) -> ServeRouter:
    """Install the serve plugin's router on a freshly loaded model (called by steerc's model loader)."""
    router = ServeRouter(model, view, vllm_config)
    object.__setattr__(model, "_steerc_router", router)
    return router


class SteercServeExtension:
    """Worker extension (``--worker-extension-cls``) for introspection and staging over RPC."""

    def steerc_requests(self) -> dict:
        router = getattr(self.model_runner.get_model(), "_steerc_router", None)
        return router.status() if router is not None else {"steered": [], "hooks": 0, "failures": 0}

    def steerc_stage(self, data: bytes, key: str | None = None) -> str:
        """Stage one artifact in this worker's store."""
        return ArtifactStore().put(bytes(data), expected=key)


# ----------------------------------------------------------------- guard


def _guard_base():
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError:  # outside vLLM: the class still documents and tests its admission
        return object
    return LogitsProcessor


class SteercGuard(_guard_base()):
    """vLLM logits processor (``--logits-processors steerc.runtime.serve:SteercGuard``).

    * ``validate_params`` (front end, before a request is queued): the
      offline API's admission — the plan, its artifacts and the model are
      checked, and a bad request is refused with its field named (vLLM turns
      the ``ValueError`` into HTTP 400 on a server).
    * In the worker: a request whose steering failed to build there is
      ended at its next token (only its end-of-sequence token stays
      possible), so it never runs unsteered.
    """

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        extra = getattr(sampling_params, "extra_args", None)
        if not extra or not any(isinstance(k, str) and k.startswith("steerc_") for k in extra):
            return
        try:
            _admit_without_model(extra)
        except RequestError as exc:
            raise ValueError(str(exc)) from None

    def __init__(self, vllm_config, device, is_pin_memory):
        eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.rows: dict[int, object] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, *_ in batch_update.added:
            self.rows[index] = params
        for a, b, direction in batch_update.moved:
            pa, pb = self.rows.pop(a, None), self.rows.pop(b, None)
            if pa is not None:
                self.rows[b] = pa
            if pb is not None and getattr(direction, "name", "") == "SWAP":
                self.rows[a] = pb

    def apply(self, logits):
        for index, params in self.rows.items():
            extra = getattr(params, "extra_args", None)
            if isinstance(extra, dict) and FAILED_KEY in extra and index < logits.shape[0]:
                keep = logits[index, self.eos].clone() * 0 if self.eos else None
                logits[index] = float("-inf")
                if keep is not None:
                    logits[index, self.eos] = keep
        return logits


def _admit_without_model(extra: dict) -> None:
    """Admission where the model is not at hand (the offline API's front end): everything but the
    model is checked, against the facts the plan was compiled for; the worker checks the model."""
    doc = decode_json(PLAN_KEY, extra.get(PLAN_KEY), MAX_PLAN_CHARS)
    try:
        facts = ModelFacts(**doc["model"]["facts"])
    except Exception:  # noqa: BLE001 - malformed: admit() names the field
        facts = ModelFacts("?", 1, 1, 1, 1, 1, 1, 1, False, False)
    admit(extra, facts, store=ArtifactStore(), key=env_key())
