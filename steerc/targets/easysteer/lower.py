"""``--target easysteer``: a site plan as an EasySteer ``SteeringSpec``, the inverse of ``steerc import --from easysteer``.

EasySteer's ``direct`` algorithm (ZJU-REAL/EasySteer-vllm-v1 ``vllm/steer_vectors/api.py`` and
``algorithms/direct.py`` at ``6267ca0c``, the version the importer reads) adds ``scale × direction.L`` of a GGUF
file to the hidden state leaving decoder layer L, on the tokens its ``apply`` clause selects, and with
``normalize`` rescales each steered row back to its input norm. So a plan lowers when every kernel is an
``add`` at ``resid_post[L]`` (L >= 1) with no gate, no schedule and no per-request param:

=====================================  ===============================================================
steerc                                 EasySteer
=====================================  ===============================================================
``add v`` at ``resid_post[L]``          ``direction.L`` of the vector's GGUF (``scale`` 1: ``v`` is the
                                       plan's float32 vector, every factor folded in), ``layers`` [L, ...]
``preserve norm``                      ``normalize: true``
``tokens all`` (no line)               ``prompt: "all"``, ``generation: "all"``
``prompt`` / ``generated``             ``prompt: "all"`` / ``generation: "all"``
``prompt[i]`` / ``prompt[a:b]``        ``prompt_positions`` [i] / ``prompt_window`` [a, b] (b null: to the end)
``generated[j]`` / ``generated[a:b]``  ``generation_positions`` [j] / ``generation_window`` [a, b]
``tokens x, y``                        both selectors in one clause (EasySteer unites them)
several adds at one layer              vectors in the plan's order, ``conflict: "sequential"``
=====================================  ===============================================================

The kernels of one intervention with the same scope and ``preserve norm`` are one ``VectorSpec`` (its layers one
GGUF, ``<intervention>.gguf``), in the order of the program. The GGUF is a llama.cpp control vector
(:func:`steerc.io.controlvector.control_vector_bytes`), as EasySteer's export writes it and its
``read_gguf_directions`` reads it. Refused with the reason (``unsupported-by-target``), before anything is written:
any other kernel, a gate, a steerc schedule, a per-request param, a site other than ``resid_post``,
``resid_post[0]`` (a control vector has no ``direction.0``: llama.cpp and steerc's reader refuse it), absolute
positions and ``after``, two windows of one phase in one intervention, a prompt window EasySteer rejects. The same
plan and model give the same bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import nodes as ir
from steerc.ir.kernels import kind_of
from steerc.ir.plan import Plan
from steerc.targets.refusals import Refused, check_by_lowering
from steerc.targets.seat import only

TARGET = "easysteer"
SPEC_NAME = "spec.json"
ADDS = only("affine")  # the one kernel kind it lowers (its seat's `kernels`); of it, adds with scale 1
_INSTEAD = "use the hf or vllm target, or steer what EasySteer's `direct` can say (spec/formats.md)"




def _refuse(message: str, span, help: str = _INSTEAD) -> Refused:
    return Refused([Diagnostic.error(UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express {message}", span,
                                     help=help)])


def _span(kernel):
    return next((p.span for p in kernel.provenance if p.span is not None), None)


# ------------------------------------------------------------------------------------------ the apply clause


def apply_of(kernel) -> dict:
    """The kernel's scope as EasySteer's ``apply`` (the keys it sets, in its ``APPLY_SPEC_KEYS`` order)."""
    name = kernel.names[0] if kernel.names else "an intervention"
    whole = {"prompt": False, "generation": False}
    positions: dict[str, list[int]] = {"prompt": [], "generation": []}
    windows: dict[str, list | None] = {"prompt": None, "generation": None}

    def window(phase: str, sel: ir.PosSlice, s) -> None:
        if windows[phase] is not None:
            raise _refuse(f"two {phase} windows in `{name}`: EasySteer's clause holds one `{phase}_window`",
                          s.span or _span(kernel), help="write one intervention a window")
        windows[phase] = [sel.start or 0, sel.stop]

    for s in kernel.scope:
        sel = getattr(s, "sel", None)
        if isinstance(s, ir.ScopeAll):
            whole["prompt"] = whole["generation"] = True
        elif isinstance(s, (ir.ScopePrompt, ir.ScopeGenerated)) and sel is None:
            whole["prompt" if isinstance(s, ir.ScopePrompt) else "generation"] = True
        elif isinstance(s, ir.ScopePrompt) and isinstance(sel, ir.PosIndex):
            positions["prompt"].append(sel.index)
        elif isinstance(s, ir.ScopePrompt) and isinstance(sel, ir.PosSlice) and _prompt_window_ok(sel):
            window("prompt", sel, s)
        elif isinstance(s, ir.ScopeGenerated) and isinstance(sel, ir.PosIndex) and sel.index >= 0:
            positions["generation"].append(sel.index)
        elif isinstance(s, ir.ScopeGenerated) and isinstance(sel, ir.PosSlice) and (sel.start or 0) >= 0 \
                and (sel.stop is None or sel.stop > (sel.start or 0)):
            window("generation", sel, s)
        else:
            raise _refuse(f"the scope of `{name}`: {_why_not(s)}", s.span or _span(kernel),
                          help="write tokens prompt[i], prompt[a:b], generated[j] or generated[a:b] (j, a >= 0)")
    out = {}
    for phase in ("prompt", "generation"):
        if whole[phase]:
            out[phase] = "all"
    for phase in ("prompt", "generation"):
        if not whole[phase] and positions[phase]:
            out[f"{phase}_positions"] = list(dict.fromkeys(positions[phase]))
        if not whole[phase] and windows[phase] is not None:
            out[f"{phase}_window"] = windows[phase]
    return {k: out[k] for k in ("prompt", "generation", "prompt_positions", "prompt_window",
                                "generation_positions", "generation_window") if k in out}


def _prompt_window_ok(sel: ir.PosSlice) -> bool:
    """Whether EasySteer accepts ``prompt_window`` [a, b]: it rejects a stop at or before a start of its sign."""
    start, stop = sel.start or 0, sel.stop
    return stop is None or (start < 0) != (stop < 0) or stop > start


def _why_not(s) -> str:
    if isinstance(s, ir.ScopePositions):
        return "absolute positions; EasySteer's selectors are prompt- or generation-relative"
    if isinstance(s, ir.ScopeAfter):
        return "`after`: EasySteer selects positions and token ids, not what follows a text"
    if isinstance(s, ir.ScopeGenerated):
        return "generated positions before the first; EasySteer counts decode steps from 0"
    return "a prompt window EasySteer rejects (its stop is not after its start)"


# ------------------------------------------------------------------------------------------ the vectors


@dataclass
class Group:
    """One ``VectorSpec``: the kernels of one intervention with one scope and ``preserve norm``."""

    names: tuple[str, ...]
    apply: dict
    normalize: bool
    order: tuple  # where the program says it: its groups follow this
    span: object
    directions: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> float32 vector


def _vector(kernel, site) -> np.ndarray:
    """The kernel's added vector, or :class:`Refused` with what more it does."""
    op, span, name = kernel.op, _span(kernel), kernel.names[0] if kernel.names else "an intervention"
    kind = kind_of(op)
    if kind is None or not ADDS(kind) or not (isinstance(op.scale, float) and op.scale == 1.0
                                              and op.bias is not None):
        raise _refuse(f"`{name}`: EasySteer's `direct` adds a vector, and this kernel does more", span,
                      help="steer with add, or use the hf or vllm target")
    if op.schedule:
        raise _refuse(f"the schedule of `{name}`: EasySteer's `scale` is one number", span,
                      help="write generated[a:b] windows, one intervention each")
    if kernel.gate is not None:
        raise _refuse(f"`{name}`'s gate: EasySteer's `direct` adds unconditionally", span,
                      help="drop the `when` line, or use the hf or vllm target")
    if kernel.bindings:
        raise _refuse(f"`{name}`'s per-request param `{kernel.bindings[0].param}`: an EasySteer spec's scale is a "
                      "number fixed when it is written", span, help="drop `per request` (the default is exported)")
    if site.kind != "resid_post":
        raise _refuse(f"{site.text} (in `{name}`): EasySteer's `direct` adds to decoder-layer outputs "
                      "(resid_post[l]) only", span, help="steer resid_post[l]")
    if site.layer == 0:
        raise _refuse(f"resid_post[0] (in `{name}`): its vectors are a llama.cpp control vector, which has no "
                      "`direction.0` (llama.cpp and `steerc import` refuse one)", span, help="steer resid_post[1:]")
    vector = np.asarray(op.bias.array, np.float32)
    if not np.all(np.isfinite(vector)):
        raise _refuse(f"`{name}`'s vector: it does not fit float32", span)
    return vector


def _groups(plan: Plan) -> list[Group]:
    """The plan's kernels as vectors, in program order; :class:`Refused` for the first that EasySteer cannot say."""
    groups: list[Group] = []
    by_key: dict[tuple, int] = {}
    placed: dict[int, list[int]] = {}  # layer -> the groups of its kernels, in the plan's order
    for sp in plan.sites:
        for k in sp.kernels:
            vector = _vector(k, sp.site)
            apply, span = apply_of(k), _span(k)
            key = (k.names, json.dumps(apply), k.preserve_norm)
            i = by_key.get(key)
            if i is None or sp.site.layer in groups[i].directions:
                order = (0, span.line, span.column) if span is not None else (1, 0, 0)
                groups.append(Group(k.names, apply, k.preserve_norm, order, span))
                i = by_key[key] = len(groups) - 1
            groups[i].directions[sp.site.layer] = vector
            placed.setdefault(sp.site.layer, []).append(i)
    ranked = sorted(range(len(groups)), key=lambda i: (groups[i].order, i))
    rank = {g: r for r, g in enumerate(ranked)}
    for layer, members in placed.items():  # EasySteer stacks a layer's vectors in the spec's order
        if [rank[i] for i in members] != sorted(rank[i] for i in members):
            g = groups[members[0]]
            raise _refuse(f"the order of the adds at resid_post[{layer}] (`{g.names[0]}` first): EasySteer stacks "
                          "a layer's vectors in the order of the spec, and this plan's orders differ between "
                          "layers", g.span, help="write one intervention a layer")
    return [groups[i] for i in ranked]


def _file_names(groups: list[Group]) -> list[str]:
    """``<intervention>.gguf`` for each group, unique without regard to case (``_2``, ``_3`` ...)."""
    names, taken = [], set()
    for g in groups:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", "+".join(g.names)).strip("._") or "vector"
        name, n = stem, 2
        while name.lower() in taken:
            name, n = f"{stem}_{n}", n + 1
        taken.add(name.lower())
        names.append(f"{name}.gguf")
    return names


def lower(plan: Plan, facts) -> tuple[dict, dict[str, dict[int, np.ndarray]]]:
    """(the ``SteeringSpec`` as JSON data, {GGUF file name: {layer: float32 vector}}); :class:`Refused` otherwise."""
    groups = _groups(plan)
    if not groups:
        raise _refuse("a program that steers nothing: an EasySteer spec holds at least one vector", None,
                      help="add an intervention")
    files, vectors = {}, []
    for g, name in zip(groups, _file_names(groups)):
        files[name] = dict(sorted(g.directions.items()))
        vectors.append({"source": name, "algorithm": "direct", "scale": 1.0, "layers": sorted(g.directions),
                        "normalize": g.normalize, "apply": g.apply, "name": name[:-len(".gguf")]})
    return {"vectors": vectors, "conflict": "sequential"}, files


def spec_bytes(spec: dict) -> bytes:
    """The spec's file: two-space JSON in EasySteer's field order, ASCII, one final newline."""
    return (json.dumps(spec, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def blobs(plan: Plan, facts) -> dict[str, bytes]:
    """{file name: bytes}: each vector's GGUF, then ``spec.json``; the same plan and model give the same bytes."""
    from steerc.io.controlvector import control_vector_bytes, llamacpp_arch

    spec, files = lower(plan, facts)
    provenance = [("steerc.source_sha256", plan.source_sha256)]
    out = {name: control_vector_bytes(directions, llamacpp_arch(facts.family), provenance)
           for name, directions in files.items()}
    out[SPEC_NAME] = spec_bytes(spec)
    return out


def check_easysteer(result) -> None:
    """Add ``unsupported-by-target`` for what the capability table lets through but EasySteer cannot say."""
    check_by_lowering(result, lambda r: lower(r.plan, r.facts))


__all__ = ["Refused", "SPEC_NAME", "TARGET", "apply_of", "blobs", "check_easysteer", "lower", "spec_bytes"]
