"""vLLM-Hook intervention specs into Steer programs: ``steerc import intervention_spec.json -o x.steer``.

The inverse of ``steerc compile --target serve --dialect vllm-hook`` (:mod:`steerc.targets.vllm_hook.lower`,
whose table is read at vLLM-Hook's commits :data:`~steerc.targets.vllm_hook.format.SOURCE_COMMITS`). The spec
``{"ops": [...]}`` is read from a JSON file (a ``request.json`` that holds it under ``extra_args`` is read too);
each artifact ``sha256:<hex>`` is the file ``<hex>.safetensors`` in ``artifacts/`` beside the spec, or beside it
— nowhere else: the name is the hash, checked (64 lowercase hex digits) before any path is made, and the file's
sha256 must be that hash. Every op becomes one intervention, in the spec's order (vLLM-Hook applies a layer's ops
in that order, and so does steerc's plan the interventions at one site):

=======================================  =======================================================
vLLM-Hook                                steerc
=======================================  =======================================================
``layers: [l, ...]``                     ``at resid_post[l], ...`` (the output of layer l)
``additive`` (strength s, ``vector``)    ``add v`` (``add s * v`` when s is not 1)
``projection`` (``vector`` v)            ``ablate v``; consecutive projections of one layer list,
                                         scope and gate whose vectors are orthonormal are one
                                         ``ablate q1, q2, ...`` (the same map in any order)
``rotation`` (angle, mode, ``basis``)    ``rotate in (b1, b2) to θ`` (target) / ``by θ`` (offset)
``head_additive`` (``vector``)           ``add`` at ``head[l, h]`` for each non-zero row h of a
                                         ``[heads, head_dim]`` vector (every head for ``[head_dim]``)
scope ``all`` / ``after_prompt``         ``tokens all`` / ``tokens generated``
scope ``last_k`` k                       ``tokens prompt[-k:], generated``
gate at condition layer c                a probe at ``resid_post[c-1]`` (``resid_pre[0]`` for c = 0)
pooling ``mean`` / ``last``              ``pool prompt.mean`` / ``prompt.last``
readout ``affine`` / ``cosine`` /        ``read dot(w)`` / ``cosine(d)`` / ``projected_cosine(d)``
``projected_cosine``
rule ``per_key_threshold`` ge / le       ``when p >= t`` / ``when p <= t``; over several condition
                                         layers, one probe each, joined by ``or`` (aggregate any) or
                                         ``and`` (all)
=======================================  =======================================================

Refused, with the reason (``unsupported-by-target``: steerc has no construct that means it): ``modifiers``
(``norm_preserving`` rescales only rows whose norm grew, ``alignment_adaptive`` scales by an alignment steerc
does not compute), scope ``from_position`` p > 0 (an absolute position that may fall inside the generation),
the rule ``sum_threshold`` (a sum over condition layers), a rotation whose basis rows are colinear. Malformed
input (not JSON, a field of the wrong type, an unknown key, a missing or tampered artifact, an artifact's tensor
of the wrong name or shape) is ``invalid-foreign-file``, under a caret at the field in the spec.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re

from steerc.diagnostics.codes import INVALID_FOREIGN_FILE, UNSUPPORTED_BY_TARGET
from steerc.formats import ForeignFileError, Imported
from steerc.targets.vllm_hook.lower import compact_sites

MAX_FILE_BYTES = 1024 * 1024  # the spec file (vLLM-Hook's canonical limit is 64 KiB; whitespace is allowed)
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024  # one artifact: [2, hidden] float32 is far below
MAX_TOTAL_BYTES = 1024 * 1024 * 1024  # every artifact together
MAX_OPS = 4096
_AID = re.compile(r"sha256:([0-9a-f]{64})")
_SCOPES = {"all", "after_prompt", "last_k", "from_position"}
_TRANSFORMS = {"additive": ("strength", "artifact"), "projection": ("artifact",),
               "rotation": ("angle", "mode", "artifact"), "head_additive": ("strength", "artifact")}
_TENSOR = {"additive": "vector", "projection": "vector", "rotation": "basis", "head_additive": "vector",
           "affine": "weights", "cosine": "directions", "projected_cosine": "directions"}
_READ = {"affine": "dot", "cosine": "cosine", "projected_cosine": "projected_cosine"}


def sniff(head: bytes) -> bool:
    """A JSON object whose first key is ``ops`` (what the exporter writes), or a request holding one."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith((b'{"ops"', b'{"cache_salt"', b'{\n  "cache_salt"', b'{"extra_args"'))


def convert(path: str, stem: str) -> Imported:
    """``path`` read and checked, as a program whose vectors are ``<stem>.safetensors`` beside it."""
    spec, source, doc = read_spec(path)
    return _Importer(path, spec, source, doc, stem).program()


# ------------------------------------------------------------------ reading


def read_spec(path: str):
    from steerc.constraints.jsonpos import parse_json
    from steerc.core.source import Source

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"cannot read the spec ({exc.strerror or exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"the spec is over {MAX_FILE_BYTES} bytes",
                               help="vLLM-Hook refuses a canonical spec over 65536 bytes (E_SPEC_TOO_LARGE)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ForeignFileError(INVALID_FOREIGN_FILE, "the spec is not UTF-8 text") from None
    source = Source(path, text)
    doc, problems = parse_json(text)
    if doc is None:
        p = problems[-1] if problems else None
        at = (p.offset, p.end if p.end is not None else p.offset + 1) if p is not None and p.offset is not None \
            else None
        span = span_of(source, at)
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"the spec is not JSON: {getattr(p, 'message', 'syntax')}",
                               source=source, span=span)
    value, root = doc.value, ""
    if isinstance(value, dict) and "ops" not in value and isinstance(value.get("extra_args"), dict):
        value, root = value["extra_args"].get("intervention_spec"), "/extra_args/intervention_spec"
    return value, source, (doc, root)


def span_of(source, at):
    if isinstance(at, tuple) and len(at) == 2:
        return source.span(*at)
    return source.span(0, min(1, len(source.text)))


class _Importer:
    def __init__(self, path, spec, source, doc, stem):
        self.path, self.spec, self.source, (self.doc, self.root), self.stem = path, spec, source, doc, stem
        self.folder = os.path.dirname(os.path.abspath(path))
        self.tensors: dict[str, object] = {}  # key in <stem>.safetensors -> float32 array
        self.vectors: dict[bytes, str] = {}  # array bytes -> its vector name (one declaration per value)
        self.decls: list[str] = []
        self.blocks: list[str] = []
        self.read_bytes = 0
        self.cache: dict[str, dict] = {}
        self.probes = 0

    # -- errors at a field

    def fail(self, pointer: str, message: str, help: str | None = None, code: str = INVALID_FOREIGN_FILE,
             key: bool = False):
        ptr = self.root + pointer
        at = (self.doc.keys if key else self.doc.values).get(ptr) or self.doc.values.get(ptr)
        return ForeignFileError(code, message, help, self.source, span_of(self.source, at))

    def refuse(self, pointer: str, what: str, why: str, help: str | None = None):
        return self.fail(pointer, f"steerc cannot express {what}: {why}", help, UNSUPPORTED_BY_TARGET)

    def obj(self, value, pointer: str, required: tuple, optional: tuple = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(pointer, f"`{pointer or '/'}` must be an object")
        for k in value:
            if k not in required and k not in optional:
                raise self.fail(f"{pointer}/{k}", f"unknown field `{k}` in `{pointer or '/'}` (vLLM-Hook: "
                                f"E_UNKNOWN_FIELD)", key=True)
        for k in required:
            if k not in value:
                raise self.fail(pointer, f"`{pointer or '/'}` has no `{k}`")
        return value

    def number(self, value, pointer: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise self.fail(pointer, f"`{pointer}` must be a finite number")
        return float(value)

    def integer(self, value, pointer: str, low: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or value >= 2**31:
            raise self.fail(pointer, f"`{pointer}` must be an integer of at least {low} (vLLM-Hook: E_BAD_PARAM)")
        return value

    def layers(self, value, pointer: str) -> list[int]:
        if not isinstance(value, list) or not value:
            raise self.fail(pointer, f"`{pointer}` must be a non-empty list of layers")
        out = [self.integer(x, f"{pointer}/{i}") for i, x in enumerate(value)]
        if len(set(out)) != len(out):
            raise self.fail(pointer, f"`{pointer}` names a layer twice")
        return out

    # -- artifacts

    def artifact(self, aid, pointer: str, kind: str):
        """The float32 array of the artifact's one tensor (named as vLLM-Hook's ARTIFACT_TENSORS says)."""
        import numpy as np

        if not isinstance(aid, str) or not _AID.fullmatch(aid):
            raise self.fail(pointer, f"`{pointer}` must be `sha256:` and 64 lowercase hex digits")
        if aid not in self.cache:
            self.cache[aid] = self._load(aid, pointer)
        tensors, name = self.cache[aid], _TENSOR[kind]
        if set(tensors) != {name}:
            raise self.fail(pointer, f"artifact {aid[7:23]}... holds {sorted(tensors)}; a `{kind}` needs exactly "
                            f"one tensor `{name}`")
        array = tensors[name]
        if not np.all(np.isfinite(array)):
            raise self.fail(pointer, f"artifact {aid[7:23]}... has values that are not finite")
        return array

    def _load(self, aid: str, pointer: str) -> dict:
        import numpy as np

        hexdigest = aid[7:]
        found = None
        for where in (os.path.join(self.folder, "artifacts"), self.folder):
            candidate = os.path.join(where, hexdigest + ".safetensors")
            if os.path.isfile(candidate) and not os.path.islink(candidate):
                found = candidate
                break
        if found is None:
            raise self.fail(pointer, f"artifact {hexdigest}.safetensors is not in artifacts/ beside the spec, nor "
                            "beside it (vLLM-Hook: E_ARTIFACT_MISSING)",
                            help="copy the artifacts the spec names into artifacts/ beside it")
        size = os.path.getsize(found)
        if size > MAX_ARTIFACT_BYTES or self.read_bytes + size > MAX_TOTAL_BYTES:
            raise self.fail(pointer, f"artifact {hexdigest[:16]}... is {size} bytes, over the bound of "
                            f"{MAX_ARTIFACT_BYTES} (or the artifacts together over {MAX_TOTAL_BYTES})")
        with open(found, "rb") as fh:
            data = fh.read(MAX_ARTIFACT_BYTES + 1)
        self.read_bytes += len(data)
        if hashlib.sha256(data).hexdigest() != hexdigest:
            raise self.fail(pointer, f"artifact {hexdigest[:16]}...'s bytes do not have that sha256 (vLLM-Hook: "
                            "E_ARTIFACT_HASH)", help="the file was changed after the spec named it")
        try:
            from safetensors.numpy import load

            tensors = load(data)
        except Exception as exc:  # a hostile file: safetensors says why in its own words
            raise self.fail(pointer, f"artifact {hexdigest[:16]}... is not a safetensors file ({exc})") from None
        out = {}
        for name, array in tensors.items():
            if array.dtype.kind != "f":
                raise self.fail(pointer, f"artifact {hexdigest[:16]}...'s `{name}` is {array.dtype}, not float")
            out[name] = np.ascontiguousarray(array, dtype=np.float32)
        return out

    def vector(self, array, hint: str) -> str:
        """The name of a declared vector of ``array`` (float32), declaring it on first use."""
        import numpy as np

        array = np.ascontiguousarray(array, dtype=np.float32)
        key = array.tobytes()
        if key not in self.vectors:
            name = f"{hint}_{len(self.vectors)}"
            self.vectors[key] = name
            self.tensors[name] = array
            self.decls.append(f'vector {name} = load("{self.stem}.safetensors", key="{name}")')
        return self.vectors[key]

    # -- the program

    def program(self) -> Imported:
        spec = self.obj(self.spec, "", ("ops",))
        ops = spec["ops"]
        if not isinstance(ops, list):
            raise self.fail("/ops", "`/ops` must be a list")
        if len(ops) > MAX_OPS:
            raise self.fail("/ops", f"the spec has {len(ops)} ops, over the bound of {MAX_OPS}")
        parsed = [self.op(op, f"/ops/{i}") for i, op in enumerate(ops)]
        for group in _groups(parsed):
            self.blocks.append(self.block(group))
        if not self.blocks:
            notes = ("the spec has no ops: the program steers nothing",)
        else:
            notes = ()
        header = (f"# Imported by `steerc import` from {os.path.basename(self.path)} (vLLM-Hook intervention_spec G3, "
                  f"{len(ops)} op{'s' if len(ops) != 1 else ''}).\n"
                  "# Each intervention is one op of the spec, in its order; a gate's probe reads its condition "
                  "layer's input.")
        parts = [header, "steer 1", *self.decls, *self.blocks]
        files = {}
        if self.tensors:
            from steerc.io.brainpatch import safetensors_bytes

            files[f"{self.stem}.safetensors"] = safetensors_bytes(
                {k: ("F32", v) for k, v in self.tensors.items()},
                {"steerc.imported_from": f"vllm-hook {os.path.basename(self.path)}"})
        return Imported("\n\n".join(parts) + "\n", files, notes)

    def op(self, op, ptr: str) -> dict:
        op = self.obj(op, ptr, ("layers", "transform", "scope"), ("gate",))
        layers = self.layers(op["layers"], f"{ptr}/layers")
        transform = self.obj(op["transform"], f"{ptr}/transform", ("kind",),
                             ("strength", "artifact", "angle", "mode", "modifiers"))
        kind = transform["kind"]
        if kind not in _TRANSFORMS:
            raise self.fail(f"{ptr}/transform/kind", f"unknown transform kind {json.dumps(kind)[:40]} (vLLM-Hook: "
                            f"E_UNKNOWN_KIND; its transforms are {', '.join(_TRANSFORMS)})")
        self.obj(transform, f"{ptr}/transform", ("kind", *_TRANSFORMS[kind]), ("modifiers",))
        mods = transform.get("modifiers", [])
        if not isinstance(mods, list):
            raise self.fail(f"{ptr}/transform/modifiers", "`modifiers` must be a list")
        if mods:
            first = mods[0].get("kind") if isinstance(mods[0], dict) else None
            raise self.refuse(f"{ptr}/transform/modifiers/0", f"the modifier {json.dumps(first)[:40]}",
                              "vLLM-Hook's norm_preserving scales back only the rows whose norm grew and "
                              "alignment_adaptive scales by an alignment with a direction; steerc's `preserve norm` "
                              "rescales every steered row, and no steerc kernel scales by an alignment",
                              "drop the modifier, or keep this spec on vLLM-Hook")
        array = self.artifact(transform["artifact"], f"{ptr}/transform/artifact", kind)
        t = {"kind": kind, "array": array, "ptr": ptr}
        if kind in ("additive", "head_additive"):
            t["strength"] = self.number(transform["strength"], f"{ptr}/transform/strength")
        if kind == "rotation":
            t["angle"] = self.number(transform["angle"], f"{ptr}/transform/angle")
            if transform["mode"] not in ("target", "offset"):
                raise self.fail(f"{ptr}/transform/mode", "`mode` must be \"target\" or \"offset\"")
            t["mode"] = transform["mode"]
        self.shape(t, f"{ptr}/transform/artifact")
        return {"layers": layers, "transform": t, "scope": self.scope(op["scope"], f"{ptr}/scope"),
                "gate": self.gate(op.get("gate"), f"{ptr}/gate"), "ptr": ptr,
                "raw_gate": json.dumps(op.get("gate"), sort_keys=True)}

    def shape(self, t: dict, ptr: str) -> None:
        import numpy as np

        a, kind = t["array"], t["kind"]
        ok = {"additive": a.ndim == 1, "projection": a.ndim == 1, "rotation": a.ndim == 2 and a.shape[0] == 2,
              "head_additive": a.ndim in (1, 2)}[kind]
        if not ok or a.size == 0:
            raise self.fail(ptr, f"a `{kind}`'s `{_TENSOR[kind]}` has shape {list(a.shape)} (vLLM-Hook: additive and "
                            "projection [hidden], rotation [2, hidden], head_additive [heads, head_dim] or [head_dim])")
        if kind == "projection" and not np.linalg.norm(a.astype(np.float64)) > 0:
            raise self.fail(ptr, "a `projection`'s vector is zero")
        if kind == "rotation":
            b = a.astype(np.float64)
            n0, n1 = np.linalg.norm(b[0]), np.linalg.norm(b[1])
            if not (n0 > 0 and n1 > 0) or np.linalg.norm(b[1] - (b[1] @ b[0]) / n0 ** 2 * b[0]) <= 1e-6 * n1:
                raise self.refuse(ptr, "this rotation", "its basis rows are zero or colinear, so they span no plane")

    def scope(self, scope, ptr: str) -> tuple[str | None, str]:
        scope = self.obj(scope, ptr, ("kind",), ("k", "position"))
        kind = scope["kind"]
        if kind not in _SCOPES:
            raise self.fail(f"{ptr}/kind", f"unknown scope kind {json.dumps(kind)[:40]} (vLLM-Hook: E_UNKNOWN_KIND)")
        if kind in ("all", "after_prompt"):
            self.obj(scope, ptr, ("kind",))
            return (None if kind == "all" else "generated"), kind
        if kind == "last_k":
            self.obj(scope, ptr, ("kind", "k"))
            k = self.integer(scope["k"], f"{ptr}/k", 1)
            return f"prompt[-{k}:], generated", f"last_k {k}"
        self.obj(scope, ptr, ("kind", "position"))
        p = self.integer(scope["position"], f"{ptr}/position")
        if p == 0:
            return None, "from_position 0"
        raise self.refuse(ptr, f"the scope from_position {p}",
                          "it selects absolute positions from p on, which lie in the prompt or in the generation "
                          "depending on the prompt's length; steerc's scopes are prompt- or generation-relative "
                          "(`prompt[p:], generated` misses generated positions below p on a short prompt)",
                          "use last_k or after_prompt, or keep this spec on vLLM-Hook")

    def gate(self, gate, ptr: str):
        import numpy as np

        if gate is None:
            return None
        gate = self.obj(gate, ptr, ("layers", "pooling", "readout", "rule"))
        layers = self.layers(gate["layers"], f"{ptr}/layers")
        if gate["pooling"] not in ("mean", "last"):
            raise self.fail(f"{ptr}/pooling", "`pooling` must be \"mean\" or \"last\"")
        readout = self.obj(gate["readout"], f"{ptr}/readout", ("kind", "artifact"))
        if readout["kind"] not in _READ:
            raise self.fail(f"{ptr}/readout/kind", "unknown readout kind (vLLM-Hook's are affine, cosine, "
                            "projected_cosine)")
        rule = self.obj(gate["rule"], f"{ptr}/rule", ("kind",), ("threshold", "comparator", "aggregate", "bias"))
        if rule["kind"] == "sum_threshold":
            self.obj(rule, f"{ptr}/rule", ("kind", "bias"))
            self.number(rule["bias"], f"{ptr}/rule/bias")
            raise self.refuse(f"{ptr}/rule", "the rule sum_threshold",
                              "it opens the gate on the sum of readouts over its condition layers; a steerc probe "
                              "reads one site and a gate compares probes one at a time",
                              "use per_key_threshold, or keep this spec on vLLM-Hook")
        if rule["kind"] != "per_key_threshold":
            raise self.fail(f"{ptr}/rule/kind", "unknown rule kind (vLLM-Hook's are per_key_threshold, "
                            "sum_threshold)")
        self.obj(rule, f"{ptr}/rule", ("kind", "threshold", "comparator", "aggregate"))
        threshold = self.number(rule["threshold"], f"{ptr}/rule/threshold")
        if rule["comparator"] not in ("ge", "le"):
            raise self.fail(f"{ptr}/rule/comparator", "`comparator` must be \"ge\" or \"le\"")
        if rule["aggregate"] not in ("any", "all"):
            raise self.fail(f"{ptr}/rule/aggregate", "`aggregate` must be \"any\" or \"all\"")
        rows = self.artifact(readout["artifact"], f"{ptr}/readout/artifact", readout["kind"])
        if rows.ndim != 2 or rows.shape[0] != len(layers) or rows.shape[1] == 0:
            raise self.fail(f"{ptr}/readout/artifact", f"the readout's tensor has shape {list(rows.shape)}; it needs "
                            f"one row per condition layer ([{len(layers)}, hidden])")
        if readout["kind"] != "affine" and not np.all(np.linalg.norm(rows.astype(np.float64), axis=1) > 0):
            raise self.fail(f"{ptr}/readout/artifact", "a cosine readout's direction is zero")
        return {"layers": layers, "pool": "prompt." + gate["pooling"], "read": _READ[readout["kind"]],
                "rows": rows, "threshold": threshold, "op": ">=" if rule["comparator"] == "ge" else "<=",
                "join": " or " if rule["aggregate"] == "any" else " and ", "text": rule["aggregate"]}

    # -- one intervention

    def block(self, group: list[dict]) -> str:
        first = group[0]
        t, name = first["transform"], f"op{first['ptr'].rsplit('/', 1)[1]}"
        probes, when = self.when(first["gate"], name)
        kind = t["kind"]
        sites = compact_sites([f"resid_post[{layer}]" for layer in first["layers"]])
        if kind == "additive":
            v = self.vector(t["array"], "vector")
            line = f"add {v}" if t["strength"] == 1.0 else f"add {_num(t['strength'])} * {v}"
        elif kind == "projection":
            line = "ablate " + ", ".join(self.vector(g["transform"]["array"], "direction") for g in group)
        elif kind == "rotation":
            b1, b2 = (self.vector(t["array"][i], "basis") for i in (0, 1))
            line = f"rotate in ({b1}, {b2}) {'to' if t['mode'] == 'target' else 'by'} {_num(t['angle'])}"
        else:
            sites, line = self.heads(first)
        scope, scope_text = first["scope"]
        end = first.get("last", group[-1]["ptr"])
        what = f"ops {first['ptr'][5:]} to {end[5:]}" if end != first["ptr"] else f"op {first['ptr'][5:]}"
        comment = f"# vLLM-Hook {what}: {kind}, scope {scope_text}" + \
                  (f", gated ({first['gate']['text']})" if first["gate"] else "")
        blocks = []
        for i, site in enumerate(sites):  # `at` takes one site (a slice of layers or heads): one block each
            lines = [f"at {site}", line] + ([f"tokens {scope}"] if scope else []) + ([f"when {when}"] if when else [])
            body = "\n".join(f"  {x}" for x in lines)
            label = name if i == 0 else f"{name}_{i + 1}"
            blocks.append(f"{comment if i == 0 else '# the same, at ' + site}\nintervention {label} {{\n{body}\n}}")
        return "\n\n".join([*probes, *blocks])

    def heads(self, op: dict) -> tuple[list[str], str]:
        """``head_additive``: one site per layer and head its vector reaches; every head must add the same row."""
        import numpy as np

        t = op["transform"]
        a = t["array"]
        if a.ndim == 1:
            return [f"head[{layer}, :]" for layer in op["layers"]], self._head_add(t, a)  # every head
        rows = [h for h in range(a.shape[0]) if np.any(a[h] != 0)]
        if not rows:
            rows = [0]
        distinct = {a[h].tobytes() for h in rows}
        if len(distinct) > 1:
            raise self.refuse(f"{op['ptr']}/transform/artifact", "a head_additive with different rows per head in "
                              "one op", "a steerc intervention adds one vector at each of its sites",
                              "split it into one op per head")
        sites = compact_sites([f"head[{layer}, {h}]" for layer in op["layers"] for h in rows])
        return sites, self._head_add(t, a[rows[0]])

    def _head_add(self, t: dict, row) -> str:
        v = self.vector(row, "head_vector")
        return f"add {v}" if t["strength"] == 1.0 else f"add {_num(t['strength'])} * {v}"

    def when(self, gate, name: str) -> tuple[list[str], str | None]:
        if gate is None:
            return [], None
        probes, tests = [], []
        for i, layer in enumerate(gate["layers"]):
            pname = f"{name}_gate" + (f"_{i}" if len(gate["layers"]) > 1 else "")
            site = "resid_pre[0]" if layer == 0 else f"resid_post[{layer - 1}]"
            v = self.vector(gate["rows"][i], "readout")
            probes.append(f"# reads the input of layer {layer}, where vLLM-Hook's gate reads it\n"
                          f"probe {pname} {{\n  at {site}\n  read {gate['read']}({v})\n  pool {gate['pool']}\n}}")
            tests.append(f"{pname} {gate['op']} {_num(gate['threshold'])}")
        return probes, gate["join"].join(tests)


def _groups(ops: list[dict]) -> list[list[dict]]:
    """Ops as interventions: consecutive projections of one layer list, scope and gate with orthonormal vectors
    are one ``ablate`` (the composition of rank-one projections onto orthonormal vectors is the projection onto
    their span, in any order); every other op is its own."""
    import numpy as np

    out: list[list[dict]] = []
    for op in ops:
        last = out[-1] if out else None
        if (last is not None and op["transform"]["kind"] == "projection"
                and last[0]["transform"]["kind"] == "projection"
                and (op["layers"], op["scope"], op["raw_gate"]) == (last[0]["layers"], last[0]["scope"],
                                                                  last[0]["raw_gate"])):
            rows = [g["transform"]["array"].astype(np.float64) for g in last] + \
                   [op["transform"]["array"].astype(np.float64)]
            gram = np.stack(rows) @ np.stack(rows).T
            if np.allclose(gram, np.eye(len(rows)), atol=1e-5):
                last.append(op)
                continue
        if last is not None and len(last) == 1 and _same_but_layers(last[0], op):
            last[0] = {**last[0], "layers": last[0]["layers"] + op["layers"], "last": op["ptr"]}
            continue
        out.append([op])
    return out


def _same_but_layers(a: dict, b: dict) -> bool:
    """Whether consecutive ops differ only in their layers (none shared): one intervention at all their sites
    keeps every site's order, as nothing comes between them."""
    ta, tb = a["transform"], b["transform"]
    keys = ("kind", "strength", "angle", "mode")
    return (ta["kind"] != "projection" and all(ta.get(k) == tb.get(k) for k in keys)
            and ta["array"].shape == tb["array"].shape and ta["array"].tobytes() == tb["array"].tobytes()
            and (a["scope"], a["raw_gate"]) == (b["scope"], b["raw_gate"]) and a["gate"] is None
            and not set(a["layers"]) & set(b["layers"]))


def _num(x: float) -> str:
    """A Steer number that reads back as the same float64 (``repr``; exponents as Steer writes them)."""
    return repr(float(x))


__all__ = ["convert", "read_spec", "sniff", "span_of"]
