"""``steerc.serve/1``: a plan as JSON data plus content-addressed tensors.

The JSON is the site plan (:mod:`steerc.ir.plan`) written out as data —
sites, kernels, scopes, gates, probes — with every tensor replaced by the
sha256 of its artifact: a safetensors file holding one float32 tensor named
``value`` (no metadata, so the same tensor always has the same bytes and
the same name). Nothing in it is executable. Canonical JSON: sorted keys,
compact separators, floats written so they round-trip.

``to_serve`` and ``from_serve`` are inverses: plan → JSON → plan gives the
same plan, and the JSON of that plan is byte-identical.

>>> from steerc.ir.plan import Affine, Kernel, Plan, Site, SitePlan
>>> from steerc.ir import nodes as ir
>>> from steerc.ir.values import Vec
>>> plan = Plan("a.steer", "0" * 64, "f" * 64, "llama",
...             (SitePlan(Site("resid_post", 1), (Kernel(Affine(1.0, Vec([1.0, 2.0])), (ir.ScopeAll(),)),)),))
>>> doc, artifacts = to_serve(plan, facts={"family": "llama"})
>>> again = from_serve(doc, artifacts.__getitem__)
>>> again == plan and dumps(to_serve(again, facts={"family": "llama"})[0]) == dumps(doc)
True
"""

from __future__ import annotations

import hashlib
import math

from steerc import __version__
from steerc.core.jsonio import canonical
from steerc.core.source import Span
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.kernels import KINDS, kind_of
from steerc.ir.plan import Binding, Kernel, Param, Plan, ProbePlan, Provenance, Site, SitePlan
from steerc.ir.values import Vec
from steerc.targets.constraints import constraint_from_json, constraint_json, request_fields
from steerc.targets.signing import mac

FORMAT = "steerc.serve/1"
TENSOR_NAME = "value"


# ---------------------------------------------------------------- artifacts


def artifact_bytes(array) -> bytes:
    """The canonical safetensors encoding of one float32 tensor."""
    import numpy as np
    from safetensors.numpy import save

    return save({TENSOR_NAME: np.ascontiguousarray(array, dtype="<f4")})


def artifact_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_artifact(data: bytes, expected_id: str | None = None):
    """The tensor of an artifact; refuses bytes that do not hash to ``expected_id``."""
    import numpy as np
    from safetensors.numpy import load

    if expected_id is not None and artifact_id(data) != expected_id:
        raise ValueError(f"artifact {expected_id[:16]}... does not hash to its name (tampered or corrupt)")
    tensors = load(data)
    if set(tensors) != {TENSOR_NAME}:
        raise ValueError(f"an artifact holds exactly one tensor named {TENSOR_NAME!r}")
    value = tensors[TENSOR_NAME]
    if value.dtype != np.float32 or not np.isfinite(value).all():
        raise ValueError("an artifact holds finite float32 values")
    return value


class _Artifacts:
    def __init__(self):
        self.blobs: dict[str, bytes] = {}

    def put(self, array) -> dict:
        data = artifact_bytes(array)
        key = artifact_id(data)
        self.blobs[key] = data
        return {"artifact": key}


# ------------------------------------------------------------------- to JSON


def _scope(s) -> dict:
    if isinstance(s, ir.ScopeAll):
        return {"kind": "all"}
    if isinstance(s, (ir.ScopePrompt, ir.ScopeGenerated)):
        kind = "prompt" if isinstance(s, ir.ScopePrompt) else "generated"
        if s.sel is None:
            return {"kind": kind}
        if isinstance(s.sel, ir.PosIndex):
            return {"kind": kind, "index": s.sel.index}
        return {"kind": kind, "start": s.sel.start, "stop": s.sel.stop}
    if isinstance(s, ir.ScopePositions):
        return {"kind": "positions", "positions": list(s.positions)}
    return {"kind": "after", "text": s.text.value}


def _gate(g) -> dict:
    if isinstance(g, ck.GateCompare):
        bound = {"param": g.param, "coefficient": g.coefficient} if g.param is not None else {}
        return {"probe": g.probe, "op": g.op, "threshold": g.threshold, **bound}
    if isinstance(g, ck.GateNegate):
        return {"not": _gate(g.operand)}
    key = "all" if isinstance(g, ck.GateAll) else "any"
    return {key: [_gate(p) for p in g.parts]}


def _op(op, arts: _Artifacts) -> dict:
    return kind_of(op).to_serve(op, arts.put)


def _site(site: Site) -> dict:
    return {"kind": site.kind, "layer": site.layer, "head": site.head}


def _binding(b: Binding, arts: _Artifacts) -> dict:
    c = b.coefficient
    return {"role": b.role, "param": b.param,
            "coefficient": {"value": c} if isinstance(c, float) else arts.put(c.array)}


def _kernel(k: Kernel, arts: _Artifacts) -> dict:
    bindings = {"bindings": [_binding(b, arts) for b in k.bindings]} if k.bindings else {}
    return {
        **bindings,
        "op": _op(k.op, arts),
        "scope": [_scope(s) for s in k.scope],
        "gate": _gate(k.gate) if k.gate is not None else None,
        "preserve_norm": k.preserve_norm,
        "provenance": [{"intervention": p.intervention, "line": p.span.line if p.span else None, "source": p.note}
                       for p in k.provenance],
    }


def _probe(p: ProbePlan, arts: _Artifacts) -> dict:
    import numpy as np

    vectors = None
    if p.vectors:
        vectors = arts.put(np.stack([v.array for v in p.vectors]))
    out = {"name": p.name, "site": _site(p.site), "readout": p.kind, "vectors": vectors, "bias": p.bias,
           "pool": p.pool}
    if p.kind == "sae_feature":
        out["threshold"] = p.threshold
    return out


def to_serve(plan: Plan, facts: dict, key: bytes | None = None) -> tuple[dict, dict[str, bytes]]:
    """(plan JSON object, {artifact id: bytes}); with ``key``, the plan carries its HMAC."""
    arts = _Artifacts()
    doc = {
        "format": FORMAT,
        "steerc_version": __version__,
        "source": {"name": plan.source_name.rsplit("/", 1)[-1], "sha256": plan.source_sha256},
        "model": {"family": plan.family, "fingerprint": plan.facts_fingerprint,
                  "facts": {k: v for k, v in facts.items() if k != "fingerprint"}},
        "sites": [{"site": _site(sp.site), "kernels": [_kernel(k, arts) for k in sp.kernels]} for sp in plan.sites],
        "probes": [_probe(p, arts) for p in plan.probes],
        "constraint": constraint_json(plan.constraint),
        "request": request_fields(plan.constraint) if plan.constraint is not None else {},
    }
    if plan.params:
        doc["params"] = [{"name": p.name, "default": p.default, "min": p.low, "max": p.high} for p in plan.params]
    doc["artifacts"] = sorted(arts.blobs)
    doc["cache_salt"] = cache_salt(doc)
    _check_floats(doc)
    if key is not None:
        doc["hmac"] = mac(key, signed_bytes(doc))
    return doc, arts.blobs


def signed_bytes(doc: dict) -> bytes:
    """What a serve plan's ``hmac`` covers: the canonical JSON of everything but the hmac (the artifacts
    are covered through their sha256 names)."""
    return dumps({k: v for k, v in doc.items() if k != "hmac"}).encode("utf-8")


def cache_salt(doc: dict) -> str:
    """The prefix-cache salt of a steered request: a hash of the plan and its artifacts."""
    body = {k: v for k, v in doc.items() if k not in ("cache_salt", "request", "hmac")}
    return "steerc-" + hashlib.sha256(dumps(body).encode("utf-8")).hexdigest()[:32]


def dumps(doc: dict) -> str:
    """The document's text: steerc's one canonical JSON (:func:`steerc.core.jsonio.canonical`)."""
    return canonical(doc)


def _check_floats(obj) -> None:
    if isinstance(obj, float):
        if not math.isfinite(obj) or float(repr(obj)) != obj:
            raise ValueError(f"{obj!r} does not round-trip through JSON")
    elif isinstance(obj, dict):
        for v in obj.values():
            _check_floats(v)
    elif isinstance(obj, list):
        for v in obj:
            _check_floats(v)


# ----------------------------------------------------------------- from JSON


def _scope_from(d: dict):
    kind = d["kind"]
    if kind == "all":
        return ir.ScopeAll()
    if kind in ("prompt", "generated"):
        cls = ir.ScopePrompt if kind == "prompt" else ir.ScopeGenerated
        if "index" in d:
            return cls(ir.PosIndex(d["index"]))
        if "start" in d or "stop" in d:
            return cls(ir.PosSlice(d.get("start"), d.get("stop")))
        return cls()
    if kind == "positions":
        return ir.ScopePositions(tuple(d["positions"]))
    return ir.ScopeAfter(ir.Str(d["text"]))


def _gate_from(d: dict):
    if "probe" in d:
        if "param" in d:
            return ck.GateCompare(d["probe"], d["op"], float(d["threshold"]), param=d["param"],
                                  coefficient=float(d["coefficient"]))
        return ck.GateCompare(d["probe"], d["op"], float(d["threshold"]))
    if "not" in d:
        return ck.GateNegate(_gate_from(d["not"]))
    if "all" in d:
        return ck.GateAll(tuple(_gate_from(g) for g in d["all"]))
    return ck.GateAny(tuple(_gate_from(g) for g in d["any"]))


def _vec(ref: dict, load) -> "object":
    return Vec(read_artifact(load(ref["artifact"]), ref["artifact"]))


def _op_from(d: dict, load):
    return KINDS[d["kind"]].from_serve(d, lambda ref: read_artifact(load(ref["artifact"]), ref["artifact"]))


def from_serve(doc: dict, load) -> Plan:
    """The plan of a serve document; ``load(artifact id) -> bytes`` (hashes are verified)."""
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} plan")
    sites = []
    for entry in doc["sites"]:
        s = entry["site"]
        kernels = tuple(
            Kernel(
                _op_from(k["op"], load),
                tuple(_scope_from(x) for x in k["scope"]),
                _gate_from(k["gate"]) if k["gate"] is not None else None,
                bool(k["preserve_norm"]),
                tuple(Provenance(p["intervention"], _line_span(doc, p["line"]), p["source"])
                      for p in k["provenance"]),
                tuple(_binding_from(b, load) for b in k.get("bindings") or ()),
            )
            for k in entry["kernels"]
        )
        sites.append(SitePlan(Site(s["kind"], s["layer"], s["head"]), kernels))
    probes = []
    for p in doc["probes"]:
        vectors = ()
        if p["vectors"] is not None:
            rows = read_artifact(load(p["vectors"]["artifact"]), p["vectors"]["artifact"])
            vectors = tuple(Vec(r) for r in rows)
        s = p["site"]
        probes.append(ProbePlan(p["name"], Site(s["kind"], s["layer"], s["head"]), p["readout"], vectors,
                                float(p["bias"]), p["pool"], float(p.get("threshold", 0.0))))
    return Plan(
        source_name=doc["source"]["name"],
        source_sha256=doc["source"]["sha256"],
        facts_fingerprint=doc["model"]["fingerprint"],
        family=doc["model"]["family"],
        sites=tuple(sites),
        probes=tuple(probes),
        constraint=constraint_from_json(doc.get("constraint")),
        params=tuple(Param(p["name"], float(p["default"]), _opt_float(p["min"]), _opt_float(p["max"]))
                     for p in doc.get("params") or ()),
    )


def _opt_float(x):
    return None if x is None else float(x)


def _binding_from(d: dict, load) -> Binding:
    c = d["coefficient"]
    return Binding(d["role"], d["param"], float(c["value"]) if "value" in c else _vec(c, load))


def _line_span(doc: dict, line):
    return Span(doc["source"]["name"], line, 1, line, 1) if line is not None else None
