"""``plan.msgpack``: the vLLM target's wire format, and its validation.

One msgpack map (keys sorted at every level, so the same plan is the same
bytes)::

    {"format": "steerc.vllm/1",
     "header": {steerc_version, source_name, source_sha256, facts, facts_fingerprint,
                family, vllm: {read_from, band}, boot_sha256, constraint},
     "boot":   {hooks: [...], scopes: [...], gates: [...], probes: [...],
                buffers: {name: {shape, dtype}}},
     "state":  {tensors: {name: {dtype: "float32", shape: [...], data: <raw little-endian bytes>}}}}

``boot`` fixes everything that shapes the computation traced into vLLM's
compiled graph (which modules are hooked, kernel kinds, buffer shapes);
``state`` holds the values. A new ``state`` for the same ``boot`` is written
into the installed buffers in place: no recompilation, no new CUDA-graph
capture. Scalars (a scale, a rotation angle, clamp targets) are buffers too,
so they can change in place. Tensors travel as float32 whatever the model's
dtype (bf16 included) and are cast on the device.

:func:`validate_plan` is what workers run on every payload: unknown keys,
wrong shapes or dtypes, non-finite values, oversize payloads and version
mismatches are refused with an error that names the field.
"""

from __future__ import annotations

import hashlib
import math

FORMAT = "steerc.vllm/1"
MAX_BYTES = 256 * 1024 * 1024
MAX_HOOKS = 100_000
TOP_KEYS = {"format", "header", "boot", "state"}
HEADER_KEYS = {"steerc_version", "source_name", "source_sha256", "facts", "facts_fingerprint", "family",
               "vllm", "boot_sha256", "constraint"}
BOOT_KEYS = {"hooks", "scopes", "gates", "probes", "buffers"}


class PlanError(ValueError):
    """A plan payload that a worker refuses; ``field`` is the path of the fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def canonical(obj):
    """Dicts with sorted keys, tuples as lists, all the way down."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def pack(obj) -> bytes:
    import msgpack

    return msgpack.packb(canonical(obj), use_bin_type=True)


def unpack(data: bytes):
    import msgpack

    if not isinstance(data, (bytes, bytearray)):
        raise PlanError("payload", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_BYTES:
        raise PlanError("payload", f"{len(data)} bytes is over the {MAX_BYTES}-byte cap")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the payload's fault
        raise PlanError("payload", f"not msgpack ({type(exc).__name__}: {exc})") from None


def _structure(obj):
    """The boot section without its human-readable labels (source lines may move freely)."""
    if isinstance(obj, dict):
        return {k: _structure(v) for k, v in obj.items() if k != "label"}
    if isinstance(obj, list):
        return [_structure(v) for v in obj]
    return obj


def boot_sha256(boot: dict) -> str:
    """Hash of the structure a plan traces into the graph (labels excluded)."""
    return hashlib.sha256(pack(_structure(boot))).hexdigest()


def tensor_wire(array) -> dict:
    import numpy as np

    arr = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "float32", "shape": list(arr.shape), "data": arr.tobytes()}


def tensor_from_wire(field: str, obj, shape: list[int]):
    """A float32 numpy array from its wire form, checked against ``shape``."""
    import numpy as np

    _keys(field, obj, {"dtype", "shape", "data"})
    if obj["dtype"] != "float32":
        raise PlanError(f"{field}.dtype", f"expected float32, got {obj['dtype']!r}")
    if list(obj["shape"]) != list(shape):
        raise PlanError(f"{field}.shape", f"expected {list(shape)}, got {list(obj['shape'])}")
    data = obj["data"]
    if not isinstance(data, (bytes, bytearray)) or len(data) != 4 * math.prod(shape):
        raise PlanError(f"{field}.data", f"expected {4 * math.prod(shape)} bytes of float32")
    arr = np.frombuffer(bytes(data), dtype="<f4").reshape(shape)
    if not np.isfinite(arr).all():
        raise PlanError(f"{field}.data", "holds NaN or infinite values")
    return arr


def _keys(field: str, obj, allowed: set[str], required: set[str] | None = None) -> None:
    if not isinstance(obj, dict):
        raise PlanError(field, f"expected a map, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise PlanError(f"{field}.{unknown[0]}", "unknown key")
    missing = sorted((required if required is not None else allowed) - set(obj))
    if missing:
        raise PlanError(f"{field}.{missing[0]}", "missing")


def validate_plan(obj, *, fingerprint: str | None = None, boot: dict | None = None) -> dict:
    """Check a decoded plan; returns {tensor name: float32 array}. Raises PlanError."""
    _keys("plan", obj, TOP_KEYS)
    if obj["format"] != FORMAT:
        raise PlanError("plan.format", f"this worker reads {FORMAT}, got {obj['format']!r}")
    header = obj["header"]
    _keys("plan.header", header, HEADER_KEYS)
    if fingerprint is not None and header["facts_fingerprint"] != fingerprint:
        raise PlanError("plan.header.facts_fingerprint",
                        "compiled for another model (its layout facts differ from this engine's model)")
    plan_boot = obj["boot"]
    _keys("plan.boot", plan_boot, BOOT_KEYS)
    if boot_sha256(plan_boot) != header["boot_sha256"]:
        raise PlanError("plan.header.boot_sha256", "does not match the boot section")
    if boot is not None and boot_sha256(boot) != header["boot_sha256"]:
        raise PlanError("plan.boot", "differs from the installed plan's structure: updating in place needs the "
                        "same sites, kernels and buffer shapes (restart the engine to change structure)")
    if len(plan_boot["hooks"]) > MAX_HOOKS:
        raise PlanError("plan.boot.hooks", f"more than {MAX_HOOKS} hooks")
    buffers = plan_boot["buffers"]
    if not isinstance(buffers, dict):
        raise PlanError("plan.boot.buffers", "expected a map")
    state = obj["state"]
    _keys("plan.state", state, {"tensors"})
    tensors = state["tensors"]
    if not isinstance(tensors, dict):
        raise PlanError("plan.state.tensors", "expected a map")
    extra = sorted(set(tensors) - set(buffers))
    if extra:
        raise PlanError(f"plan.state.tensors.{extra[0]}", "no such buffer in the boot section")
    out = {}
    for name, spec in buffers.items():
        if name not in tensors:
            raise PlanError(f"plan.state.tensors.{name}", "missing")
        out[name] = tensor_from_wire(f"plan.state.tensors.{name}", tensors[name], spec["shape"])
    return out
