"""BrainPatch archives into Steer programs: ``steerc import x.brainpatch -o x.steer``.

The meaning is that of BrainPatch's reference backend, its transformers one (``brainpatch/runtime/base.py``
and ``backends/transformers_backend.py`` of brainpatch 1.2.0; its vLLM, MLX and llama.cpp backends ignore
``site`` and the schedule):

* an intervention at ``layer`` L adds to the output of decoder block L: ``resid_post[L]``;
* its ``site`` picks the positions: ``all``, ``prompt`` (the prompt pass), ``continuation`` (every token
  fed back): ``tokens all`` / ``tokens prompt`` / ``tokens generated``;
* the vector is multiplied by ``clamp(strength, ±max_abs_strength) × schedule(i) × coefficient``, that
  product rounded to float32 (torch multiplies a float32 tensor by a Python float in float32); the live
  strength becomes ``param strength = default_strength in [-max_abs_strength, max_abs_strength] per request``
  (steerc refuses a value outside the range where BrainPatch clamps it);
* the schedule is a step-hold over an index ``i`` that is 0 for the whole prompt pass and ``p - P`` for the
  generated position ``p`` (``P`` the prompt's length): index 0 covers the prompt *and* the first token fed
  back; the multiplier is 1 before the first key. So its steps become ``generated[a:b]`` segments (steerc's
  ``generated[i]`` is the position ``P + i``, BrainPatch's index ``i``), and the prompt takes the multiplier
  of index 0;
* at one layer, every applicable vector times its coefficient is summed in float32, in the manifest's order,
  and the sum added once. A cell of positions that one intervention reaches is ``add strength * K * v`` with
  ``K`` that float32 coefficient (``K × v`` folds to the same float32 products); a cell that several reach
  adds their float32 sum, written beside the program as one vector (its terms in a comment), so the steered
  activations are BrainPatch's bit for bit at strength 1 — and at any power of two, where scaling is exact.

The archive's metadata (name, description, the model binding, evidence level, license, authors) becomes the
program's leading comments; its ``hidden_size`` and ``num_layers`` the ``model {}`` block.

>>> import numpy as np
>>> from steerc.io.brainpatch import archive_bytes, full_manifest, read_archive_bytes
>>> m = {"name": "joy", "base_model": {"model_id": "org/m", "hidden_size": 2, "num_layers": 4},
...      "interventions": [{"layer": 1, "vector": "joy", "coefficient": 2.0, "site": "continuation"}],
...      "schedule": {"3": 0.5}}
>>> patch = read_archive_bytes(archive_bytes(full_manifest(m), {"joy": ("F16", np.ones(2, np.float32))}),
...                            "joy.brainpatch")
>>> print(program(patch, "joy").text.split("steer 1", 1)[1])
<BLANKLINE>
<BLANKLINE>
model {
  layers = 4
  hidden = 2
}
<BLANKLINE>
param strength = 1.0 in [-8.0, 8.0] per request
<BLANKLINE>
vector joy = load("joy.safetensors", key="joy")
<BLANKLINE>
# BrainPatch intervention 0 (coefficient 2.0, site continuation); the schedule's multiplier 1.0
intervention layer1_generated_0_3 {
  at resid_post[1]
  add strength * 2.0 * joy
  tokens generated[0:3]
}
<BLANKLINE>
# BrainPatch intervention 0 (coefficient 2.0, site continuation); the schedule's multiplier 0.5
intervention layer1_generated_from_3 {
  at resid_post[1]
  add strength * joy
  tokens generated[3:]
}
<BLANKLINE>
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from steerc.diagnostics.codes import INVALID_FOREIGN_FILE
from steerc.formats import ForeignFileError, Imported
from steerc.formats.text import comment, literal
from steerc.io.brainpatch import ArchiveError, Patch, read_archive, safetensors_bytes

EPSILON = 1e-12  # BrainPatch's STRENGTH_EPSILON: a coefficient below it adds nothing
PARAM = "strength"
_WORDS = re.compile(r"[^A-Za-z0-9_]+")


def convert(path: str, stem: str) -> Imported:
    """``path`` read and checked (:func:`steerc.io.brainpatch.read_archive`), as a program whose vectors are
    ``<stem>.safetensors`` beside it."""
    try:
        patch = read_archive(path)
    except ArchiveError as exc:
        raise _foreign(exc, path) from None
    except OSError as exc:
        raise ForeignFileError(INVALID_FOREIGN_FILE, f"cannot read the archive ({exc.strerror or exc})") from None
    return program(patch, stem)


def _foreign(exc: ArchiveError, path: str) -> ForeignFileError:
    """The archive's error, with the manifest's field under a caret when it names one."""
    where = f"{exc.member}: " if exc.member and not exc.message.startswith(("`", exc.member)) else ""
    if exc.pointer is None or exc.text is None:
        return ForeignFileError(exc.code, where + exc.message, exc.help)
    from steerc.constraints.jsonpos import parse_json
    from steerc.core.source import Source

    source = Source(f"{path}:manifest.json", exc.text)
    doc, _ = parse_json(exc.text)
    at = None
    if doc is not None:
        keyed = "does not define" in exc.message
        at = (doc.keys if keyed else doc.values).get(exc.pointer) or doc.values.get(exc.pointer)
    span = source.span(*at) if at else source.span(0, min(1, len(exc.text)))
    return ForeignFileError(exc.code, exc.message, exc.help, source, span)


# ------------------------------------------------------------------ cells of positions


@dataclass(frozen=True)
class Term:
    vector: str  # the archive's key
    k: float  # the float32 coefficient at strength 1: fl32(schedule × coefficient)
    index: int  # the intervention's place in the manifest


@dataclass(frozen=True)
class Cell:
    """The positions of one layer that one list of terms steers: the prompt, generated [start, end), or both."""

    layer: int
    prompt: bool
    start: int | None  # None: no generated position
    end: int | None  # None: to the end of generation
    terms: tuple[Term, ...]
    multiplier: float


def segments(schedule) -> list[tuple[int, int | None, float]]:
    """BrainPatch's step-hold schedule as (start, end, multiplier) over the generated index, from 0.

    >>> segments(None), segments(((0, 1.0), (5, 0.5)))
    ([(0, None, 1.0)], [(0, 5, 1.0), (5, None, 0.5)])
    >>> segments(((3, 0.0),))
    [(0, 3, 1.0), (3, None, 0.0)]
    """
    if not schedule:
        return [(0, None, 1.0)]
    points = ([] if schedule[0][0] == 0 else [(0, 1.0)]) + list(schedule)
    return [(a, points[j + 1][0] if j + 1 < len(points) else None, m) for j, (a, m) in enumerate(points)]


def _f32(x: float) -> float:
    import numpy as np

    return float(np.float32(x))


def _terms(patch: Patch, layer: int, sites: tuple[str, ...], multiplier: float) -> tuple[Term, ...]:
    if abs(multiplier) < EPSILON:
        return ()
    out = []
    for iv in patch.interventions:
        product = multiplier * iv.coefficient
        if iv.layer == layer and iv.site in sites and abs(product) >= EPSILON and _f32(product) != 0.0:
            out.append(Term(iv.vector, _f32(product), iv.index))
    return tuple(out)


def cells(patch: Patch) -> list[Cell]:
    """Every layer's cells, in the order of the layers' first intervention, adjacent equal ones merged."""
    segs = segments(patch.schedule)
    first = segs[0][2]  # the prompt pass is index 0
    out = []
    for layer in dict.fromkeys(iv.layer for iv in patch.interventions):
        row = [Cell(layer, True, None, None, _terms(patch, layer, ("all", "prompt"), first), first)]
        for a, b, m in segs:
            terms = _terms(patch, layer, ("all", "continuation"), m)
            last = row[-1]
            if last.start is not None and last.terms == terms and last.end == a:
                row[-1] = Cell(layer, last.prompt, last.start, b, terms, last.multiplier)
            elif last.start is None and a == 0 and last.terms == terms:
                row[-1] = Cell(layer, True, 0, b, terms, m)
            else:
                row.append(Cell(layer, False, a, b, terms, m))
        out.extend(c for c in row if c.terms)
    return out


def tokens(cell: Cell) -> str | None:
    """The ``tokens`` line's scope (None: all)."""
    gen = None
    if cell.start is not None:
        gen = "generated" if (cell.start, cell.end) == (0, None) else \
            f"generated[{cell.start}:{'' if cell.end is None else cell.end}]"
    if cell.prompt and gen == "generated":
        return None
    return ", ".join(p for p in ("prompt" if cell.prompt else None, gen) if p)


# ------------------------------------------------------------------ the program


def program(patch: Patch, stem: str) -> Imported:
    """The program (text, not yet formatted) and ``<stem>.safetensors`` with the vectors it loads."""
    import numpy as np

    vectors_file = f"{stem}.safetensors"
    found = cells(patch)
    names = _Names()
    declared: dict[str, str] = {}  # archive key -> vector name
    tensors: dict[str, tuple[str, object]] = {}
    decls, blocks, notes = [], [], []
    for cell in found:
        name = names.new(_cell_name(cell))
        ivs = " and ".join(_describe(patch, t.index) for t in cell.terms)
        times = "" if patch.schedule is None else f"; the schedule's multiplier {cell.multiplier!r}"
        heading = f"# BrainPatch intervention{'s' if len(cell.terms) > 1 else ''} {ivs}{times}"
        if len(cell.terms) == 1:
            term = cell.terms[0]
            if term.vector not in declared:
                declared[term.vector] = names.new(_identifier(term.vector))
                stored = patch.vectors[term.vector]
                dtype = stored.dtype if stored.dtype != "F64" else "F32"  # BrainPatch adds F64 vectors as float32
                tensors[term.vector] = (dtype, stored.values)
                decls.append(f"vector {declared[term.vector]} = load({literal(vectors_file)}, "
                             f"key={literal(term.vector)})")
            factor = "" if term.k == 1.0 else f"{_number(term.k)} * "
            operand = f"{PARAM} * {factor}{declared[term.vector]}"
        else:
            key = f"{name}.sum"
            total = None
            for t in cell.terms:  # BrainPatch's delta: float32 products, summed in float32 in order
                part = (patch.vectors[t.vector].values * np.float32(t.k)).astype(np.float32)
                total = part if total is None else (total + part).astype(np.float32)
            if not np.all(np.isfinite(total)):
                raise ForeignFileError(INVALID_FOREIGN_FILE, f"the vectors at layer {cell.layer} sum past float32")
            tensors[key] = ("F32", total)
            vname = names.new(f"{name}_sum")
            terms = " + ".join(f"{_number(t.k)} * {json.dumps(t.vector, ensure_ascii=False)}" for t in cell.terms)
            decls.append(f"# {comment(terms, 300)}, summed in float32 in BrainPatch's order\n"
                         f"vector {vname} = load({literal(vectors_file)}, key={literal(key)})")
            operand = f"{PARAM} * {vname}"
            notes.append(f"layer {cell.layer}: {len(cell.terms)} vectors reach the same positions; their float32 sum "
                         f"is `{key}` in {vectors_file}")
        scope = tokens(cell)
        blocks.append(f"{heading}\nintervention {name} {{\n  at resid_post[{cell.layer}]\n  add {operand}\n"
                      + (f"  tokens {scope}\n" if scope else "") + "}")
    if not found:
        notes.append("every intervention's coefficient is 0 at the default strength and schedule: the program "
                     "steers nothing")
    param = (f"param {PARAM} = {_number(patch.default_strength)} in [{_number(-patch.max_abs_strength)}, "
             f"{_number(patch.max_abs_strength)}] per request")
    base = patch.base_model
    parts = [_header(patch), "steer 1",
             f"model {{\n  layers = {base['num_layers']}\n  hidden = {base['hidden_size']}\n}}", param,
             *decls, *blocks]
    files = {vectors_file: safetensors_bytes(tensors, {"steerc.imported_from": f"brainpatch {patch.name}",
                                                       "steerc.archive_sha256": patch.sha256})} if tensors else {}
    return Imported("\n\n".join(parts) + "\n", files, tuple(notes))


def _describe(patch: Patch, index: int) -> str:
    iv = patch.interventions[index]
    ident = f"id {comment(iv.id, 40)}, " if iv.id else ""
    return f"{index} ({ident}coefficient {iv.coefficient!r}, site {iv.site})"


def _cell_name(cell: Cell) -> str:
    parts = [f"layer{cell.layer}"]
    if cell.prompt and cell.start is None:
        parts.append("prompt")
    elif not cell.prompt and (cell.start, cell.end) == (0, None):
        parts.append("generated")
    elif cell.start is not None and (cell.start, cell.end) != (0, None):
        parts.append(("prompt_" if cell.prompt else "") + "generated_" +
                     (f"from_{cell.start}" if cell.end is None else f"{cell.start}_{cell.end}"))
    return "_".join(parts)


def _header(patch: Patch) -> str:
    """The leading comments: the archive and everything its manifest says that is not steering."""
    base, meta = patch.base_model, patch.metadata
    model = f"{base['model_id']}" + (f" at revision {base['revision']}" if base.get("revision") else "")
    facts = [base.get("architecture") or None, f"{base['num_layers']} layers", f"hidden size {base['hidden_size']}",
             f"torch_dtype {base['torch_dtype']}" if base.get("torch_dtype") else None]
    lines = [
        f"Imported by `steerc import` from {patch.path.replace(chr(92), '/').rsplit('/', 1)[-1]} (BrainPatch format "
        f"1.0, sha256 {patch.sha256[:16]}...).",
        f"name: {patch.name}",
        f"base model: {model} ({', '.join(f for f in facts if f)})",
        f"evidence level: {meta['evidence_level']}; license: {meta['license']}"
        + (f"; authors: {', '.join(meta['authors'])}" if meta["authors"] else ""),
    ]
    if patch.description:
        lines.append(f"description: {patch.description}")
    if patch.schedule:
        lines.append("schedule: " + json.dumps({str(k): v for k, v in patch.schedule}) +
                     " (index 0 is the prompt and the first token fed back; generated[i] is index i)")
    for key in ("evaluation", "provenance", "compatibility"):
        if meta[key]:
            lines.append(f"{key}: {json.dumps(meta[key], sort_keys=True, ensure_ascii=False)}")
    if patch.readme:
        lines.append("The archive's README.md is not copied.")
    lines.append(f"BrainPatch clamps a strength past ±{patch.max_abs_strength!r}; steerc refuses it (param-out-of-range).")
    return "\n".join("# " + comment(line, 300) for line in lines)


def _number(x: float) -> str:
    """A float exactly as float64 reads it back (BrainPatch's float32 coefficients are exact in float64)."""
    return repr(float(x))



def _identifier(key: str) -> str:
    """A Steer name for an archive key: ASCII letters, digits and ``_``, at most 48 characters."""
    name = _WORDS.sub("_", key).strip("_")[:48] or "vector"
    return name if not name[0].isdigit() else f"v_{name}"


class _Names:
    """Unique names that are no keyword and not the strength param."""

    def __init__(self):
        from steerc.highlight.words import KEYWORDS

        self.taken = set(KEYWORDS) | {PARAM, "load", "normalize"}

    def new(self, want: str) -> str:
        name, n = want, 2
        while name in self.taken:
            name, n = f"{want}_{n}", n + 1
        self.taken.add(name)
        return name


__all__ = ["Cell", "Term", "cells", "convert", "program", "segments", "tokens"]
