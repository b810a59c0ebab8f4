"""EasySteer steering specs into Steer programs: ``steerc import spec.json -o x.steer --from easysteer``.

EasySteer's v2 API (``vllm/steer_vectors/api.py`` of ZJU-REAL/EasySteer-vllm-v1 at
``6267ca0cfc9c6e93b1427d36b1d655821d6d6f9b``, its docs at ZJU-REAL/EasySteer
``312c6d87166221ef54e372cf0c31d545d6b2a176``): a ``SteeringSpec`` is ``{"vectors": [VectorSpec, ...],
"conflict": "priority" | "sequential" | "error"}``; a ``VectorSpec`` is ``{"source", "data", "algorithm", "scale",
"layers", "normalize", "apply", "params", "name"}`` (pydantic, unknown keys forbidden); ``apply`` is an
``ApplySpec`` of per-phase selectors. The ``direct`` algorithm adds ``scale × direction.L`` to the complete hidden
state leaving decoder layer L (``hidden + residual``: steerc's ``resid_post[L]``), its ``source`` an EasySteer GGUF
export (``direction.<L>`` tensors, the 0-based layer whose output it steers, as llama.cpp's control vectors);
``normalize`` rescales every steered row back to its input norm (``_renormalize``: steerc's ``preserve norm``).

=====================================  ===============================================
EasySteer                              steerc
=====================================  ===============================================
``direct``, ``source`` x.gguf           ``add scale * v`` at ``resid_post[L]`` for each
                                       ``direction.L`` (``layers``: those only)
``normalize: true``                    ``preserve norm``
``prompt: "all"`` / ``generation``     ``tokens prompt`` / ``tokens generated``
``prompt_positions`` [i, ...]          ``prompt[i], ...``
``prompt_window`` [a, b]               ``prompt[a:b]`` (``b`` null: ``prompt[a:]``)
``generation_positions`` [j, ...]      ``generated[j], ...``
``generation_window`` [a, b]           ``generated[a:b]``
several include selectors              their union, ``tokens x, y``
``conflict: "sequential"``             the adds in order (several vectors at one layer)
=====================================  ===============================================

Refused with the reason (``unsupported-by-target``): algorithms other than ``direct``; ``data`` (an in-memory
payload); token-id selectors and every ``exclude_*`` selector (steerc's scopes select positions, and union only);
``conflict`` ``priority`` or ``error`` when two vectors share a layer (first-wins needs per-position overlap);
a ``.pt`` source (a pickle: never loaded) and any source that is not ``.gguf`` (EasySteer itself refuses it for
``direct``). A source path is resolved beside the spec and must stay in that folder.
"""

from __future__ import annotations

import json
import math
import os

from steerc.diagnostics.codes import INVALID_FOREIGN_FILE, UNSUPPORTED_BY_TARGET
from steerc.formats import ForeignFileError, Imported
from steerc.formats.text import comment

MAX_FILE_BYTES = 1024 * 1024
MAX_VECTORS = 256
APPLY_KEYS = ("prompt", "generation", "prompt_tokens", "prompt_positions", "prompt_window", "generation_tokens",
              "generation_positions", "generation_window", "exclude_prompt_tokens", "exclude_prompt_positions",
              "exclude_prompt_window", "exclude_generation_tokens", "exclude_generation_positions",
              "exclude_generation_window")
VECTOR_KEYS = ("source", "data", "algorithm", "scale", "layers", "normalize", "apply", "params", "name")


def convert(path: str, stem: str) -> Imported:
    from steerc.formats.vllm_hook import read_spec

    spec, source, doc = read_spec(path)
    return _Importer(path, spec, source, doc, stem).program()


class _Importer:
    def __init__(self, path, spec, source, doc, stem):
        self.path, self.spec, self.source, (self.doc, _), self.stem = path, spec, source, doc, stem
        self.folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        self.tensors: dict[str, object] = {}

    def fail(self, ptr: str, message: str, help: str | None = None, code: str = INVALID_FOREIGN_FILE):
        from steerc.formats.vllm_hook import span_of

        at = self.doc.values.get(ptr) or self.doc.keys.get(ptr)
        return ForeignFileError(code, message, help, self.source, span_of(self.source, at))

    def refuse(self, ptr: str, what: str, why: str, help: str | None = None):
        return self.fail(ptr, f"steerc cannot express {what}: {why}", help, UNSUPPORTED_BY_TARGET)

    def obj(self, value, ptr: str, allowed: tuple, required: tuple = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(ptr, f"`{ptr or '/'}` must be an object")
        for k in value:
            if k not in allowed:
                raise self.fail(f"{ptr}/{k}", f"unknown field `{str(k)[:40]}` in `{ptr or '/'}` (EasySteer forbids "
                                "extra fields)")
        for k in required:
            if k not in value:
                raise self.fail(ptr, f"`{ptr or '/'}` has no `{k}`")
        return value

    def ints(self, value, ptr: str, low: int | None = None) -> list[int]:
        if not isinstance(value, list) or not value or not all(
                isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**31 for x in value):
            raise self.fail(ptr, f"`{ptr}` must be a non-empty list of integers, or null")
        if low is not None and any(x < low for x in value):
            raise self.fail(ptr, f"`{ptr}` must hold integers of at least {low}")
        return value

    def program(self) -> Imported:
        spec = self.obj(self.spec, "", ("vectors", "conflict"), ("vectors",))
        conflict = spec.get("conflict", "priority")
        if conflict not in ("priority", "sequential", "error"):
            raise self.fail("/conflict", '`conflict` must be "priority", "sequential" or "error"')
        vectors = spec["vectors"]
        if not isinstance(vectors, list) or not vectors or len(vectors) > MAX_VECTORS:
            raise self.fail("/vectors", f"`vectors` must be a non-empty list (at most {MAX_VECTORS})")
        blocks, seen = [], {}
        for i, v in enumerate(vectors):
            for layer, block in self.vector(v, f"/vectors/{i}"):
                if layer in seen and conflict != "sequential":
                    raise self.refuse(f"/vectors/{i}", f"vectors {seen[layer]} and {i} at layer {layer} under "
                                      f'conflict "{conflict}"',
                                      "EasySteer resolves them per position (first wins, or an error); steerc adds "
                                      "every intervention", 'use conflict "sequential", or disjoint layers')
                seen.setdefault(layer, i)
                blocks.append(block)
        decls = [f'vector {k} = load("{self.stem}.safetensors", key="{k}")' for k in self.tensors]
        header = (f"# Imported by `steerc import` from {os.path.basename(self.path)} (EasySteer SteeringSpec, "
                  f"{len(vectors)} vector{'s' if len(vectors) != 1 else ''}, conflict {conflict}).")
        files = {}
        if self.tensors:
            from steerc.io.brainpatch import safetensors_bytes

            files[f"{self.stem}.safetensors"] = safetensors_bytes(
                {k: ("F32", a) for k, a in self.tensors.items()},
                {"steerc.imported_from": f"easysteer {os.path.basename(self.path)}"})
        return Imported("\n\n".join([header, "steer 1", *decls, *blocks]) + "\n", files)

    def vector(self, v, ptr: str) -> list[tuple[int, str]]:
        v = self.obj(v, ptr, VECTOR_KEYS, ("apply",))
        algorithm = v.get("algorithm", "direct")
        if algorithm != "direct":
            raise self.refuse(f"{ptr}/algorithm", f"the algorithm {json.dumps(algorithm)[:40]}",
                              "steerc imports EasySteer's `direct` vectors (an add); its other algorithms "
                              "(linear, loreft, lm_steer, erase, replace, concept_replace, moe_router) load payloads "
                              "steerc does not read from a spec")
        if v.get("data") is not None:
            raise self.refuse(f"{ptr}/data", "an in-memory `data` payload",
                              "steerc reads vectors from files; write the vectors to an EasySteer GGUF export")
        if v.get("params") not in (None, {}):
            raise self.fail(f"{ptr}/params", "`direct` takes no params (EasySteer rejects unknown params)")
        scale = v.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise self.fail(f"{ptr}/scale", "`scale` must be a finite number")
        normalize = v.get("normalize", False)
        if not isinstance(normalize, bool):
            raise self.fail(f"{ptr}/normalize", "`normalize` must be true or false")
        layers = v.get("layers")
        if layers is not None:
            layers = self.ints(layers, f"{ptr}/layers", 0)
        scope = self.scope(v["apply"], f"{ptr}/apply")
        rows = self.rows(v.get("source"), f"{ptr}/source")
        wanted = layers if layers is not None else sorted(rows)
        out = []
        index = ptr.rsplit("/", 1)[1]
        name = v.get("name")
        label = f" ({comment(name, 80)})" if isinstance(name, str) and name else ""
        for layer in wanted:
            if layer not in rows:
                raise self.fail(f"{ptr}/layers", f"layer {layer}: the source has no `direction.{layer}`")
            key = f"v{index}_layer{layer}"
            self.tensors[key] = rows[layer]
            operand = key if float(scale) == 1.0 else f"{float(scale)!r} * {key}"
            lines = [f"at resid_post[{layer}]", f"add {operand}"] + ([f"tokens {scope}"] if scope else []) + \
                    (["preserve norm"] if normalize else [])
            body = "\n".join(f"  {x}" for x in lines)
            out.append((layer, f"# EasySteer vector {index}{label}, direction.{layer}\n"
                               f"intervention steer{index}_layer{layer} {{\n{body}\n}}"))
        return out

    def rows(self, src, ptr: str) -> dict:
        if not isinstance(src, str) or not src:
            raise self.fail(ptr, "`direct` needs a `source` (a .gguf path)")
        ext = os.path.splitext(src)[1].lower()
        if ext in (".pt", ".pth"):
            raise self.refuse(ptr, "a .pt source", "a .pt file is a pickle, which can run code when loaded; steerc "
                              "never loads one from a foreign file", "export the vector as EasySteer's GGUF")
        if ext != ".gguf":
            raise self.fail(ptr, f"EasySteer's `direct` accepts only .gguf sources (its export format), not "
                            f"{json.dumps(src)[:60]}")
        full = os.path.realpath(os.path.join(self.folder, src))
        if not full.startswith(self.folder + os.sep):
            raise self.fail(ptr, "the source is outside the spec's folder; steerc reads only files beside the spec")
        from steerc.io.controlvector import open_control_vector
        from steerc.io.vectorfile import VectorFileError

        try:
            f = open_control_vector(full)
            return {layer: f.read(name) for layer, name in f.rows("direction").items()}
        except VectorFileError as exc:
            raise self.fail(ptr, f"the source {os.path.basename(src)}: {exc.message}", exc.help) from None
        except OSError as exc:
            raise self.fail(ptr, f"cannot read the source ({exc.strerror or exc})") from None

    def scope(self, apply, ptr: str) -> str | None:
        apply = self.obj(apply, ptr, APPLY_KEYS)
        for k in APPLY_KEYS:
            if apply.get(k) is not None and (k.endswith("_tokens") or k.startswith("exclude_")):
                raise self.refuse(f"{ptr}/{k}", f"the selector `{k}`",
                                  "steerc's scopes select positions and combine by union; they do not select by "
                                  "token id or subtract", "select positions or windows instead")
        items = []
        for phase, word in (("prompt", "prompt"), ("generation", "generated")):
            whole = apply.get(phase)
            if whole not in (None, "all"):
                raise self.fail(f"{ptr}/{phase}", f'`{phase}` must be "all" or null')
            if whole == "all":
                items.append(word)
                continue
            if apply.get(f"{phase}_positions") is not None:
                low = 0 if phase == "generation" else None
                items += [f"{word}[{i}]" for i in self.ints(apply[f"{phase}_positions"], f"{ptr}/{phase}_positions",
                                                            low)]
            window = apply.get(f"{phase}_window")
            if window is not None:
                wp = f"{ptr}/{phase}_window"
                if not (isinstance(window, list) and len(window) == 2 and isinstance(window[0], int)
                        and not isinstance(window[0], bool) and (window[1] is None or (
                            isinstance(window[1], int) and not isinstance(window[1], bool)))):
                    raise self.fail(wp, f"`{phase}_window` must be [start, stop] (stop an integer or null)")
                a, b = window
                if phase == "generation" and (a < 0 or (b is not None and b <= a)):
                    raise self.fail(wp, "`generation_window` must have 0 <= start < stop")
                items.append(f"{word}[{a}:{'' if b is None else b}]")
        if not items:
            raise self.fail(ptr, "the clause selects nothing (EasySteer rejects it)")
        if items == ["prompt", "generated"]:
            return None
        return ", ".join(dict.fromkeys(items))



__all__ = ["convert"]
