"""The steerc serve plugin for vLLM: a plan per request, applied to that request's rows only.

Pieces:

* :class:`ArtifactStore` — content-addressed tensors on disk: atomic writes,
  sha256 verified on every write and on first read, a size cap with
  least-recently-used eviction.
* :func:`admit` — what the front end runs on each request's
  ``extra_args`` before it is queued: the plan JSON is parsed and checked
  (format, model fingerprint, sizes), inline artifacts are verified against
  their names and staged, and referenced artifacts must be present. A bad
  request gets a clear :class:`RequestError` naming the field; the engine is
  not involved.
* :class:`SteercServeExtension` — the worker side (``worker_extension_cls``):
  it reads new requests' plans from the scheduler output, builds each
  request's steering from the vLLM target's buffer machinery
  (:mod:`steerc.runtime.vllm_steer`: the same kernels, probes and gates), and
  hooks the modules those plans touch. Each step, a hook applies every
  steered request's kernels to that request's token rows and leaves all
  other rows bit-identical; pooled probes keep per-request state across
  chunked-prefill steps.
* :func:`register` — the ``vllm.general_plugins`` entry point.

Per-request plans can differ in structure, so their hooks dispatch in
Python each step: the serve plugin runs with ``enforce_eager=True`` (the
plugin sets it). For one plan shared by every request with CUDA graphs on,
use the vllm target.

Prefix caching: a steered request carries ``cache_salt = plan["cache_salt"]``
(the client helpers set it), so KV computed under one plan is never reused by
a request with another plan or none.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile

from steerc.serve_client import ARTIFACTS_KEY, PLAN_KEY
from steerc.targets.serve.format import FORMAT, artifact_id, from_serve, read_artifact

MAX_PLAN_BYTES = 4 * 1024 * 1024
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
def default_store() -> str:
    return os.environ.get("STEERC_ARTIFACTS") or os.path.join(tempfile.gettempdir(), "steerc-artifacts")


def default_cap() -> int:
    return int(os.environ.get("STEERC_ARTIFACTS_CAP_MB", "1024")) * 1024 * 1024


class RequestError(ValueError):
    """A request whose steering is refused; ``field`` names the fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"steerc: {field}: {message}")
        self.field = field


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


# ----------------------------------------------------------------- admission


def _decode_json(field: str, value, limit: int):
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        if len(value) > limit:
            raise RequestError(field, f"{len(value)} characters is over the {limit}-character cap")
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise RequestError(field, f"not JSON ({exc})") from None
    return value


def admit(extra_args: dict | None, store: ArtifactStore, fingerprint: str | None = None):
    """Check a request's steering and stage its artifacts; returns its Plan, or None if unsteered."""
    if not extra_args or PLAN_KEY not in extra_args:
        return None
    doc = _decode_json(PLAN_KEY, extra_args[PLAN_KEY], MAX_PLAN_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RequestError(f"{PLAN_KEY}.format", f"expected a {FORMAT} plan")
    if fingerprint is not None and doc.get("model", {}).get("fingerprint") != fingerprint:
        raise RequestError(f"{PLAN_KEY}.model.fingerprint", "compiled for another model than this server's")
    inline = _decode_json(ARTIFACTS_KEY, extra_args.get(ARTIFACTS_KEY) or {}, 64 * MAX_ARTIFACT_BYTES)
    if not isinstance(inline, dict):
        raise RequestError(ARTIFACTS_KEY, "expected a map of artifact id to base64 bytes")
    for key, blob in inline.items():
        try:
            data = base64.b64decode(blob, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise RequestError(f"{ARTIFACTS_KEY}.{str(key)[:16]}", "not base64") from None
        store.put(data, expected=key)
    try:
        return from_serve(doc, store.get)
    except RequestError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RequestError(PLAN_KEY, f"malformed plan ({type(exc).__name__}: {exc})") from None


# -------------------------------------------------------------------- worker


class _RequestSteer:
    """One request's steering: its buffers (vLLM buffer form) and per-module functions."""

    def __init__(self, plan, facts, *, max_tokens: int, dtype, device, tp_rank: int, tp_size: int):
        from steerc.runtime.vllm import _localise
        from steerc.runtime.vllm_steer import SteerState, site_function
        from steerc.targets.vllm.program import build

        boot, tensors = build(plan, facts)
        self.state = SteerState(boot, tensors, max_tokens=max_tokens, max_slots=1,
                                width=max(facts.hidden, facts.head_dim), dtype=dtype, device=device)
        self.fns = {}
        self.hooks = {}
        for hook in boot["hooks"]:
            local = _localise(hook, facts.heads, tp_rank, tp_size, facts.head_dim)
            if local is not None:
                key = (hook["module"], hook["kind"], hook["tensor"])
                self.fns[key] = site_function(self.state, local["sites"])
                self.hooks[key] = hook

    def feed(self, pos, plen) -> None:
        import numpy as np

        n = len(pos)
        self.state.write_metadata(pos, plen, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))


def _dispatch(hook_key, rows_of):
    """A hook body applying each steered request's function to its own rows."""
    kind, tensor = hook_key[1], hook_key[2]

    def steer(x):
        flat = x.reshape(-1, x.shape[-1])
        out = None
        for req, a, b in rows_of(hook_key):
            if out is None:
                out = flat.clone()
            out[a:b] = req.fns[hook_key](flat[a:b])
        return None if out is None else out.reshape(x.shape)

    if kind == "pre":
        index = 1 if tensor == "input1" else 0

        def pre(mod, args, kwargs):
            value = args[index] if len(args) > index else kwargs["hidden_states"]
            new = steer(value)
            if new is None:
                return None
            if len(args) > index:
                return args[:index] + (new,) + args[index + 1:], kwargs
            return args, dict(kwargs, hidden_states=new)

        return pre, True

    def post(mod, args, output):
        if tensor == "fused_pair":
            hidden, residual = output[0], output[1]
            active = list(rows_of(hook_key))
            if not active:
                return None
            hidden, residual = hidden.clone(), residual.clone()
            for req, a, b in active:
                fn = req.fns[hook_key]
                total = hidden[a:b].to(fn.dtype) + residual[a:b].to(fn.dtype)
                hidden[a:b] = fn(total).to(hidden.dtype)
                residual[a:b] = 0  # the next fused add-norm sums the pair: rows stay exact
            return hidden, residual
        value = output[0] if isinstance(output, tuple) else output
        new = steer(value)
        if new is None:
            return None
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    return post, False


class SteercServeExtension:
    """Worker extension: per-request plans from ``SamplingParams.extra_args``."""

    def init_worker_extension(self) -> None:
        self._serve_requests: dict[str, _RequestSteer] = {}
        self._serve_rows: dict[tuple, list] = {}
        self._serve_hooks: dict[tuple, object] = {}
        self._serve_store = ArtifactStore()
        runner = self.model_runner
        original_prepare = runner.prepare_inputs

        def prepare_inputs_then_route(scheduler_output, *args, **kwargs):
            self._serve_admit(scheduler_output)
            batch = original_prepare(scheduler_output, *args, **kwargs)
            self._serve_route(batch)
            return batch

        runner.prepare_inputs = prepare_inputs_then_route

    # requests -------------------------------------------------------------
    def _serve_facts(self):
        facts = getattr(self, "_serve_facts_cache", None)
        if facts is None:
            from steerc.facts import facts_from_config

            cfg = self.vllm_config.model_config.hf_config
            facts = facts_from_config(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))
            self._serve_facts_cache = facts
        return facts

    def _serve_admit(self, scheduler_output) -> None:
        from steerc.runtime.vllm import _parallel

        for rid in list(getattr(scheduler_output, "finished_req_ids", ()) or ()):
            self._serve_requests.pop(rid, None)
        facts = self._serve_facts()
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            extra = getattr(new.sampling_params, "extra_args", None)
            try:
                plan = admit(extra, self._serve_store, facts.fingerprint)
            except RequestError as exc:
                # Admission already ran in the front end (see register); a request that
                # fails here (e.g. an artifact evicted meanwhile) runs unsteered, loudly.
                import logging

                logging.getLogger("steerc").error("request %s runs unsteered: %s", new.req_id, exc)
                continue
            if plan is None:
                continue
            model = self.model_runner.get_model()
            param = next(model.parameters())
            from steerc.runtime import _support as S

            tp_rank, tp_size = _parallel(self)
            steer = _RequestSteer(plan, facts, max_tokens=int(self.vllm_config.scheduler_config.max_num_batched_tokens),
                                  dtype=S.compute_dtype(param.dtype), device=param.device,
                                  tp_rank=tp_rank, tp_size=tp_size)
            self._serve_requests[new.req_id] = steer
            self._serve_hook(model, steer)

    def _serve_hook(self, model, steer: _RequestSteer) -> None:
        for key in steer.fns:
            if key in self._serve_hooks:
                continue
            module_path = key[0]
            from steerc.runtime.vllm import _layer_path, _owns

            if not _owns(model, _layer_path(module_path)):
                continue
            fn, is_pre = _dispatch(key, lambda k: self._serve_rows.get(k, ()))
            module = model.get_submodule(module_path)
            handle = (module.register_forward_pre_hook(fn, with_kwargs=True, prepend=True) if is_pre
                      else module.register_forward_hook(fn, prepend=True))
            self._serve_hooks[key] = handle

    def _serve_route(self, batch) -> None:
        """This step's rows of every steered request, per hooked module; metadata into each request."""
        import numpy as np

        from steerc.runtime.vllm import batch_metadata

        self._serve_rows = {}
        if not self._serve_requests:
            return
        pos, plen, _, _, _ = batch_metadata(self.model_runner, batch)
        qsl = batch.query_start_loc_np
        for i, rid in enumerate(batch.req_ids[: batch.num_reqs]):
            steer = self._serve_requests.get(rid)
            if steer is None:
                continue
            a, b = int(qsl[i]), int(qsl[i + 1])
            steer.feed(np.asarray(pos[a:b]), np.asarray(plen[a:b]))
            for key in steer.fns:
                self._serve_rows.setdefault(key, []).append((steer, a, b))

    # RPCs -------------------------------------------------------------------
    def steerc_stage(self, data: bytes, key: str | None = None) -> str:
        """Stage one artifact (msgpack bytes) in this worker's store."""
        return self._serve_store.put(bytes(data), expected=key)

    def steerc_requests(self) -> dict:
        return {"steered": sorted(self._serve_requests), "hooks": len(self._serve_hooks)}


# -------------------------------------------------------------------- plugin


EXTENSION = "steerc.runtime.serve.SteercServeExtension"


def register() -> None:
    """``vllm.general_plugins`` entry point (vLLM runs it in every process it starts).

    It registers ``load_format="steerc"``, the model loader through which
    both the vllm target and the serve plugin install their hooks. It
    changes nothing else: an engine is steered only when it is started
    with that load format (``steerc.runtime.vllm.load``, ``steerc serve``).
    """
    from steerc.runtime.vllm_engine import register_loader

    register_loader()


def validate_request(sampling_params, store: ArtifactStore | None = None, fingerprint: str | None = None):
    """Front-end admission for one request (raises RequestError with the field at fault)."""
    return admit(getattr(sampling_params, "extra_args", None), store or ArtifactStore(), fingerprint)
