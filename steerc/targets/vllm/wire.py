"""``plan.msgpack``: the vLLM target's wire format, and its validation.

One msgpack map (keys sorted at every level, so the same plan is the same
bytes)::

    {"format": "steerc.vllm/1",
     "header": {steerc_version, source_name, source_sha256, facts, facts_fingerprint,
                family, vllm: {read_from, band}, boot_sha256, constraint},
     "boot":   {hooks: [...], scopes: [...], gates: [...], probes: [...],
                buffers: {name: {shape, dtype}},
                bindings: [...]},                  # only with per-request params (header: params)
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

Per-request params (``param ... per request``) are listed in
``header.params`` (names, defaults, ranges: values, which a ``swap`` may
change); each of ``boot.bindings`` (structure) says that a buffer (or one
element of it) is a coefficient buffer times a param's value, and
:func:`param_tensors` gives the buffers' new values for a set of values
(what ``set_params`` writes in place).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os

from steerc.core.errors import FieldError
from steerc.core.format_schema import SchemaError, check
from steerc.core.limits import MAX_SCHEDULE_STEP
from steerc.facts import ModelFacts
from steerc.facts.sites import site_table
from steerc.ir.kernels import KINDS
from steerc.ir.plan import Param, ParamError, check_values, declared_problem
from steerc.passes.lower_plan import STACKED_READOUTS
from steerc.targets.constraints import constraint_from_json
from steerc.targets.signing import mac, verify

FORMAT = "steerc.vllm/1"
MAX_BYTES = 256 * 1024 * 1024


class PlanError(FieldError):
    """A plan payload that a worker refuses; ``field`` is the path of the fault."""


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


SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan.schema.json")
SIGNED = ("content_sha256", "hmac")


def schema() -> dict:
    """The plan's JSON Schema: ``plan.schema.json`` with the kernel kinds' parts from the kernel seat (a kind
    registered at run time included)."""
    return _schema(tuple(KINDS))


@functools.lru_cache(maxsize=4)
def _schema(names: tuple) -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return with_kinds(json.load(fh))


def with_kinds(doc: dict) -> dict:
    """``doc`` with its kernel's ``kind``, ``tensors`` and ``mode`` written from :data:`KINDS`: the published
    schema (``plan.schema.json``, ``spec/vllm_plan.schema.json``) is this of itself (:func:`published`)."""
    kernel = doc["$defs"]["kernel"]["properties"]
    kernel["kind"] = {"enum": list(KINDS)}
    roles = [o.role for kind in KINDS.values() for o in kind.operands]
    name = {"type": "string", "minLength": 1, "maxLength": 256}
    kernel["tensors"]["properties"] = {role: dict(name) for role in dict.fromkeys([*roles, "schedule"])}
    modes = list(dict.fromkeys(m for kind in KINDS.values() for m in kind.modes))
    kernel["mode"] = {"oneOf": [{"type": "null"}, {"enum": modes}]}
    return doc


def published() -> str:
    """The text of ``plan.schema.json`` as the built-in kinds make it."""
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        doc = json.load(fh)
    return json.dumps(with_kinds(doc), indent=2) + "\n"


def content_bytes(obj: dict) -> bytes:
    """What ``content_sha256`` and ``hmac`` cover: the whole plan but those two fields."""
    header = {k: v for k, v in obj["header"].items() if k not in SIGNED}
    return pack({"format": obj["format"], "header": header, "boot": obj["boot"], "state": obj["state"]})


def seal(obj: dict, key: bytes | None = None) -> dict:
    """``obj`` with its ``content_sha256`` (and, given a key, its ``hmac``) written into the header."""
    payload = content_bytes(obj)
    obj["header"]["content_sha256"] = hashlib.sha256(payload).hexdigest()
    if key is not None:
        obj["header"]["hmac"] = mac(key, payload)
    return obj


def validate_plan(obj, *, fingerprint: str | None = None, boot: dict | None = None,
                  key: bytes | None = None) -> dict:
    """Check a decoded plan against everything a worker will read; returns {tensor name: float32 array}.

    Raises PlanError naming the field. ``fingerprint``: the engine's model;
    ``boot``: the installed structure an update must keep; ``key``: the
    HMAC key every plan must be signed with (:mod:`steerc.targets.signing`).
    """
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise PlanError("plan.format", f"this worker reads {FORMAT}, got {_short(got)}")
    try:
        check(obj, schema(), "plan")
    except SchemaError as exc:
        raise PlanError(exc.field, exc.message) from None
    header, plan_boot = obj["header"], obj["boot"]
    _check_seal(obj, key)
    facts = _header_facts(header)
    if fingerprint is not None and header["facts_fingerprint"] != fingerprint:
        raise PlanError("plan.header.facts_fingerprint",
                        "compiled for another model (its layout facts differ from this engine's model)")
    if boot_sha256(plan_boot) != header["boot_sha256"]:
        raise PlanError("plan.header.boot_sha256", "does not match the boot section")
    if boot is not None and boot_sha256(boot) != header["boot_sha256"]:
        raise PlanError("plan.boot", "differs from the installed plan's structure: updating in place needs the "
                        "same sites, kernels and buffer shapes (restart the engine to change structure)")
    buffers = plan_boot["buffers"]
    if sum(math.prod(b["shape"]) for b in buffers.values()) * 4 > MAX_BYTES:
        raise PlanError("plan.boot.buffers", f"more than {MAX_BYTES} bytes of buffers")
    _check_boot(plan_boot, facts, header.get("params"))
    tensors = obj["state"]["tensors"]
    extra = sorted(set(tensors) - set(buffers))
    if extra:
        raise PlanError(f"plan.state.tensors.{_short(extra[0])}", "no such buffer in the boot section")
    out = {}
    for name, spec in buffers.items():
        if name not in tensors:
            raise PlanError(f"plan.state.tensors.{name}", "missing")
        out[name] = tensor_from_wire(f"plan.state.tensors.{name}", tensors[name], spec["shape"])
    _check_schedules(plan_boot, out)
    return out


def _check_schedules(boot: dict, tensors: dict) -> None:
    """Schedule numbers that mean something: a decay rate in (0, 1], whole step counts, a window a < b."""
    for hook in boot["hooks"]:
        for site in hook["sites"]:
            for kernel in site["kernels"]:
                for i, kind in enumerate(kernel.get("schedule") or ()):
                    name = kernel["tensors"]["schedule"]
                    a, b = (float(x) for x in tensors[name][i])
                    field = f"plan.state.tensors.{name}"
                    steps = (a,) if kind == "ramp" else (a, b) if kind == "window" else ()
                    if kind == "decay" and not 0.0 < a <= 1.0:
                        raise PlanError(field, f"row {i}: a decay rate is in (0, 1], got {a:g}")
                    if any(x != int(x) or not 0 <= x <= MAX_SCHEDULE_STEP for x in steps):
                        raise PlanError(field, f"row {i}: {kind} counts whole steps up to {MAX_SCHEDULE_STEP}")
                    if (kind == "ramp" and a < 1) or (kind == "window" and a >= b):
                        raise PlanError(field, f"row {i}: an empty {kind}")


def _short(value) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _check_seal(obj: dict, key: bytes | None) -> None:
    header = obj["header"]
    if "content_sha256" in header or key is not None:
        payload = content_bytes(obj)
        if "content_sha256" in header and hashlib.sha256(payload).hexdigest() != header["content_sha256"]:
            raise PlanError("plan.header.content_sha256", "does not match the plan (truncated, edited or corrupt)")
        if key is not None and not verify(key, payload, header.get("hmac")):
            raise PlanError("plan.header.hmac", "missing or wrong: this engine accepts only plans signed with its "
                                                "key (steerc compile --hmac-key-file)")


def _header_facts(header: dict):
    facts = ModelFacts(**header["facts"])
    if facts.fingerprint != header["facts_fingerprint"]:
        raise PlanError("plan.header.facts", "do not hash to facts_fingerprint")
    if header["family"] != facts.family:
        raise PlanError("plan.header.family", f"{_short(header['family'])} is not the facts' family {facts.family!r}")
    if facts.heads * facts.head_dim > 16 * facts.hidden or facts.layers > 65536:
        raise PlanError("plan.header.facts", "sizes that no model has")
    try:
        constraint_from_json(header["constraint"])
    except Exception as exc:  # noqa: BLE001 - any constraint the compiler would not write
        raise PlanError("plan.header.constraint", f"not a constraint steerc reads ({exc})") from None
    return facts


def _check_boot(boot: dict, facts, params=None) -> None:
    """The structure: hooks on the modules the site table names, shapes, and every index in range."""
    try:
        table = site_table(facts.family, "vllm")
    except ValueError as exc:
        raise PlanError("plan.header.family", str(exc)) from None
    shapes = {name: tuple(spec["shape"]) for name, spec in boot["buffers"].items()}
    used = {"gates.thresholds"}
    probe_names = {}
    for i, p in enumerate(boot["probes"]):
        if p["layer"] >= facts.layers:
            raise PlanError(f"plan.boot.probes[{i}].layer", f"layer {p['layer']}, the model has {facts.layers}")
        probe_names.setdefault(p["name"], p["pool"])

    def buffer(field: str, name: str, want: tuple) -> tuple:
        if name not in shapes:
            raise PlanError(field, f"names no buffer of the boot section ({_short(name)})")
        used.add(name)
        got = shapes[name]
        ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))
        if not ok:
            shown = "[" + ", ".join("k" if w is None else str(w) for w in want) + "]"
            raise PlanError(field, f"buffer {_short(name)} has shape {list(got)}, {shown} is needed here")
        return got

    for i, hook in enumerate(boot["hooks"]):
        field = f"plan.boot.hooks[{i}]"
        layer = hook["layer"]
        if layer >= facts.layers:
            raise PlanError(f"{field}.layer", f"layer {layer}, but the model has {facts.layers} layers")
        allowed = {table.hook(k, layer) for k in ("resid_post", "attn_out", "mlp_out", "head")}
        if layer == 0:
            allowed.add(table.resid_pre0)
        if not any((h.module, h.kind, h.tensor) == (hook["module"], hook["kind"], hook["tensor"]) for h in allowed):
            raise PlanError(f"{field}.module", f"{_short(hook['module'])} ({hook['kind']} hook, {hook['tensor']}) is "
                                               f"no site of a {facts.family} layer {layer} in vLLM")
        for j, site in enumerate(hook["sites"]):
            sfield = f"{field}.sites[{j}]"
            if site["layer"] != layer:
                raise PlanError(f"{sfield}.layer", "differs from its hook's layer")
            heads = hook["tensor"] == "heads"
            if heads != (site["head"] is not None):
                raise PlanError(f"{sfield}.head", "a head is given exactly at a head hook")
            if heads:
                h = site["head"]
                if h >= facts.heads:
                    raise PlanError(f"{sfield}.head", f"head {h}, but the model has {facts.heads} heads")
                if site["columns"] != [h * facts.head_dim, (h + 1) * facts.head_dim]:
                    raise PlanError(f"{sfield}.columns", f"are not head {h}'s columns")
            elif site["columns"] is not None:
                raise PlanError(f"{sfield}.columns", "only head sites have columns")
            width = facts.head_dim if heads else facts.hidden
            for r, row in enumerate(site["probes"]):
                rfield = f"{sfield}.probes[{r}]"
                if probe_names.get(row["name"]) != row["pool"]:
                    raise PlanError(f"{rfield}.name", "is no probe of the boot section with this pool")
                buffer(f"{rfield}.bias", row["bias"], (1,))
                if ("threshold" in row) != (row["kind"] == "sae_feature"):
                    raise PlanError(f"{rfield}.threshold", "an sae_feature readout has a threshold, no other does")
                if "threshold" in row:
                    buffer(f"{rfield}.threshold", row["threshold"], (1,))
                if row["kind"] == "norm":
                    if row["tensor"] is not None:
                        raise PlanError(f"{rfield}.tensor", "a norm readout takes no vector")
                elif row["tensor"] is None:
                    raise PlanError(f"{rfield}.tensor", f"a {row['kind']} readout needs its vector")
                else:
                    stacked = row["kind"] in STACKED_READOUTS
                    rows = buffer(f"{rfield}.tensor", row["tensor"], (None, width) if stacked else (width,))
                    if row["kind"] == "sae_feature" and rows[0] != 2:
                        raise PlanError(f"{rfield}.tensor", "an sae_feature readout takes two rows: W_enc[:, i], b_dec")
                    if stacked and rows[0] > width:
                        raise PlanError(f"{rfield}.tensor", "more directions than the site is wide")
            for k, kernel in enumerate(site["kernels"]):
                _check_kernel(f"{sfield}.kernels[{k}]", kernel, width, boot, buffer)
    thresholds = shapes.get("gates.thresholds")
    if thresholds is None or len(thresholds) != 1:
        raise PlanError("plan.boot.buffers.gates.thresholds", "a [n] buffer of gate thresholds is required")
    for g, gate in enumerate(boot["gates"]):
        _check_gate(f"plan.boot.gates[{g}]", gate, probe_names, thresholds[0])
    _check_bindings(boot, params, shapes, used)
    unused = sorted(set(shapes) - used)
    if unused:
        raise PlanError(f"plan.boot.buffers.{_short(unused[0])}", "is used by no hook")


def _check_kernel(field: str, k: dict, width: int, boot: dict, buffer) -> None:
    kind = KINDS[k["kind"]]  # the schema admits only registered kinds
    required = {o.role for o in kind.operands if not o.optional}
    optional = {o.role for o in kind.operands if o.optional} | ({"schedule"} if kind.schedulable else set())
    roles = set(k["tensors"])
    if not required <= roles or roles - required - optional:
        raise PlanError(f"{field}.tensors", f"a {k['kind']} kernel takes {', '.join(sorted(required))}"
                        + (f" (and {', '.join(sorted(optional))})" if optional else ""))
    t = k["tensors"]
    rows = None  # the k of a "k,d" operand, which a "k" operand matches
    for o in kind.operands:
        if o.role not in t:
            continue
        at = f"{field}.tensors.{o.role}"
        if o.shape == "1|d":
            one = t[o.role] in boot["buffers"] and tuple(boot["buffers"][t[o.role]]["shape"]) == (1,)
            buffer(at, t[o.role], (1,) if one else (width,))
        elif o.shape == "k,d":  # the first fixes k, and every other "k,d" or "k" operand has it
            rows = buffer(at, t[o.role], (rows, width))[0]
            if rows > width:
                raise PlanError(at, "more directions than the site is wide")
        else:
            buffer(at, t[o.role], {"d": (width,), "1": (1,), "k": (rows,)}[o.shape])
    schedule = k.get("schedule")
    if schedule or "schedule" in t:
        if not schedule or "schedule" not in t or "bias" not in t:
            raise PlanError(f"{field}.schedule", "a schedule needs its kinds, its [m, 2] numbers and a bias to scale")
        buffer(f"{field}.tensors.schedule", t["schedule"], (len(schedule), 2))
    if not (k["mode"] in kind.modes if kind.modes else k["mode"] is None):
        raise PlanError(f"{field}.mode", f"a {k['kind']} kernel has a mode ({' or '.join(kind.modes)})" if kind.modes
                        else f"a {k['kind']} kernel has no mode")
    if k["scope"] >= len(boot["scopes"]):
        raise PlanError(f"{field}.scope", f"scope {k['scope']}, the boot section has {len(boot['scopes'])}")
    if k["gate"] is not None and k["gate"] >= len(boot["gates"]):
        raise PlanError(f"{field}.gate", f"gate {k['gate']}, the boot section has {len(boot['gates'])}")




def _check_bindings(boot: dict, params, shapes: dict, used: set) -> None:
    """Params declared once with sane ranges; each binding writes a kernel's scalar or vector operand (or
    one gate threshold) from a coefficient buffer of the same shape."""
    problem = declared_problem(params)
    if problem is not None:
        raise PlanError(f"plan.header.params[{problem[0]}].{problem[1]}", problem[2])
    names = {p["name"] for p in params or ()}
    if ("bindings" in boot) != (params is not None):
        raise PlanError("plan.boot.bindings", "a plan has bindings exactly when its header declares params")
    bindable = {"gates.thresholds"}
    for hook in boot["hooks"]:
        for site in hook["sites"]:
            for k in site["kernels"]:
                bindable.update(k["tensors"][r] for r in KINDS[k["kind"]].bindable if r in k["tensors"])
    bound = set()
    for i, b in enumerate(boot.get("bindings") or ()):
        field = f"plan.boot.bindings[{i}]"
        if b["param"] not in names:
            raise PlanError(f"{field}.param", f"no param named {_short(b['param'])}")
        target = (b["buffer"], b["index"])
        if b["buffer"] not in bindable or target in bound:
            raise PlanError(f"{field}.buffer", f"{_short(b['buffer'])} is no kernel operand or threshold"
                            + (" that is not bound already" if target in bound else ""))
        bound.add(target)
        shape = shapes[b["buffer"]]
        if (b["buffer"] == "gates.thresholds") != (b["index"] is not None) or (
                b["index"] is not None and b["index"] >= shape[0]):
            raise PlanError(f"{field}.index", "a threshold binding has the index of its threshold; others none")
        if shapes.get(b["coefficient"]) != shape:
            raise PlanError(f"{field}.coefficient", f"names no buffer of shape {list(shape)}")
        used.add(b["coefficient"])


def param_tensors(header: dict, boot: dict, tensors: dict, values) -> dict:
    """{buffer: new float32 value} for per-request ``values`` (checked; others at their defaults).

    Each bound value is the float64 product of its float32 coefficient and the
    value, rounded once to float32: what :func:`steerc.ir.plan.rebind` computes.
    """
    import numpy as np


    declared = [Param(p["name"], float(p["default"]), p["min"], p["max"]) for p in header.get("params") or ()]
    bindings = boot.get("bindings") or ()
    largest = [(b["param"], float(np.abs(tensors[b["coefficient"]] if b["index"] is None
                                         else tensors[b["coefficient"]][b["index"]]).max(initial=0.0)))
               for b in bindings]
    try:
        full = check_values(declared, values, largest)
    except ParamError as exc:
        raise PlanError(f"params.{exc.field}", exc.message) from None
    out: dict = {}
    for b in bindings:
        coefficient = tensors[b["coefficient"]].astype(np.float64)
        if b["index"] is None:
            out[b["buffer"]] = (coefficient * full[b["param"]]).astype(np.float32)
        else:
            row = out.setdefault(b["buffer"], np.array(tensors[b["buffer"]], dtype=np.float32))
            row[b["index"]] = np.float32(coefficient[b["index"]] * full[b["param"]])
    return out


def _check_gate(field: str, gate: list, probes: dict, thresholds: int) -> None:
    kind = gate[0]
    if kind == "cmp":
        if gate[1] not in probes:
            raise PlanError(f"{field}[1]", f"no probe named {_short(gate[1])}")
        if gate[3] >= thresholds:
            raise PlanError(f"{field}[3]", f"threshold {gate[3]}, the plan has {thresholds}")
    elif kind == "not":
        _check_gate(f"{field}[1]", gate[1], probes, thresholds)
    else:
        for i, part in enumerate(gate[1]):
            _check_gate(f"{field}[1][{i}]", part, probes, thresholds)
