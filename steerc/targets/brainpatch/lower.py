"""``--target brainpatch``: a site plan as a BrainPatch archive (format 1.0), the inverse of ``steerc import``.

BrainPatch adds, at the output of decoder block L, each intervention's vector times ``clamp(strength) ×
schedule(i) × coefficient``, on the prompt, the tokens fed back, or both. So a plan lowers when every kernel is
an ``add`` at ``resid_post[L]`` with no gate, no ``preserve norm`` and no steerc schedule, on one of:

====================================  ===============================================================
steerc scope                          BrainPatch
====================================  ===============================================================
``all`` (no ``tokens`` line)          ``site: all``
``prompt``                            ``site: prompt``
``generated``                         ``site: continuation``
``generated[a:b]``, ``prompt,         steps of the patch's schedule (BrainPatch's index ``i`` is
generated[0:b]``                      steerc's ``generated[i]``; index 0 also covers the prompt)
====================================  ===============================================================

and at most one per-request param multiplies every add (``add strength * v``): it becomes the live strength,
its default ``default_strength``, its range ``[-m, m]`` ``max_abs_strength`` (a range that is not symmetric
cannot be said; no range is BrainPatch's ceiling, 1024). Without a param the adds are fixed: strength 1 of 8.

Each kernel is one intervention whose vector is the kernel's (its coefficient vector, when the strength binds
it), coefficient 1. With segments, the kernels of one layer and site are one intervention and the schedule's
multipliers are their ratios: each segment's vector must be the float32 product of one vector and a float32
multiplier, the same multipliers for every intervention (else ``unsupported-by-target``, saying which). Vectors
are stored in the narrowest of F16, BF16 and F32 that holds every one exactly; the archive is written as
BrainPatch's ``save_patch`` writes it (:func:`steerc.io.brainpatch.archive_bytes`), so the same content gives
the same bytes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import nodes as ir
from steerc.ir.kernels import kind_of
from steerc.ir.plan import Plan
from steerc.targets.refusals import Refused, check_by_lowering
from steerc.targets.seat import only

TARGET = "brainpatch"
ADDS = only("affine")  # the one kernel kind it lowers (its seat's `kernels`); of it, adds with scale 1
CEILING = 1024.0  # BrainPatch's ABSOLUTE_MAX_STRENGTH
# The Hugging Face ids of the models steerc ships a config for (steerc/facts/configs).
HUB_IDS = {"smollm2-135m-instruct.json": "HuggingFaceTB/SmolLM2-135M-Instruct"}
_INSTEAD = "use the hf or vllm target, or steer what BrainPatch can say (spec/formats.md)"




@dataclass
class Part:
    layer: int
    prompt: bool
    gen: tuple[int, int | None] | None  # generated [a, b), b None: to the end
    vector: np.ndarray  # float32
    name: str  # the first intervention it comes from
    span: object


def _refuse(message: str, span, help: str = _INSTEAD) -> Refused:
    return Refused([Diagnostic.error(UNSUPPORTED_BY_TARGET, f"the {TARGET} target cannot express {message}", span,
                                     help=help)])


def _span(kernel):
    return next((p.span for p in kernel.provenance if p.span is not None), None)


def _scope(kernel) -> tuple[bool, tuple[int, int | None] | None]:
    prompt, gen = False, []
    for s in kernel.scope:
        if isinstance(s, ir.ScopeAll):
            prompt, gen = True, gen + [(0, None)]
        elif isinstance(s, ir.ScopePrompt) and s.sel is None:
            prompt = True
        elif isinstance(s, ir.ScopeGenerated) and s.sel is None:
            gen.append((0, None))
        elif isinstance(s, ir.ScopeGenerated) and isinstance(s.sel, ir.PosIndex) and s.sel.index >= 0:
            gen.append((s.sel.index, s.sel.index + 1))
        elif isinstance(s, ir.ScopeGenerated) and isinstance(s.sel, ir.PosSlice) \
                and (s.sel.start or 0) >= 0 and (s.sel.stop is None or s.sel.stop > (s.sel.start or 0)):
            gen.append((s.sel.start or 0, s.sel.stop))
        else:
            raise _refuse(f"the scope of `{kernel.names[0]}`: BrainPatch steers the prompt, the generated tokens or "
                          "both, and through its schedule generated[a:b] from a >= 0", s.span or _span(kernel),
                          help="write tokens prompt, generated, generated[a:b] or prompt, generated[0:b]")
    if len(gen) > 1:
        raise _refuse(f"the scope of `{kernel.names[0]}`: two generated segments in one intervention", _span(kernel),
                      help="write one intervention a segment")
    if prompt and gen and gen[0][0] != 0:
        raise _refuse(f"the scope of `{kernel.names[0]}`: the prompt with generated tokens from {gen[0][0]}; BrainPatch's "
                      "index 0 covers the prompt and generated[0] together", _span(kernel))
    return prompt, gen[0] if gen else None


def parts_of(plan: Plan) -> tuple[list[Part], object]:
    """Every kernel as a Part, and the strength param (a plan Param, or None)."""
    params = {p.name: p for p in plan.params}
    bound, unbound, out = set(), None, []
    for sp in plan.sites:
        if sp.site.kind != "resid_post":
            k = sp.kernels[0]
            raise _refuse(f"{sp.site.text} (in `{k.names[0]}`): BrainPatch adds to decoder-block outputs only",
                          _span(k), help="steer resid_post[l]")
        for k in sp.kernels:
            op, span = k.op, _span(k)
            kind = kind_of(op)
            if kind is None or not ADDS(kind) or not (isinstance(op.scale, float) and op.scale == 1.0
                                                      and op.bias is not None):
                raise _refuse(f"`{k.names[0]}`: BrainPatch adds vectors, and this kernel does more", span,
                              help="steer with add")
            if op.schedule:
                raise _refuse(f"the schedule of `{k.names[0]}`: BrainPatch's schedule is one step function of the "
                              "generation index for the whole patch", span,
                              help="write generated[a:b] segments, one intervention each")
            if k.gate is not None or k.preserve_norm:
                raise _refuse(f"`{k.names[0]}`'s {'gate' if k.gate is not None else 'preserve norm'}: BrainPatch "
                              "adds unconditionally and never rescales", span)
            vector = op.bias.array
            if k.bindings:
                b = k.bindings[0]
                if len(k.bindings) > 1 or b.role != "bias":
                    raise _refuse(f"`{k.names[0]}`'s params: the strength multiplies the whole vector", span)
                bound.add(b.param)
                vector = b.coefficient.array
            elif unbound is None:
                unbound = k
            prompt, gen = _scope(k)
            out.append(Part(sp.site.layer, prompt, gen, np.asarray(vector, np.float32), k.names[0], span))
    if len(bound) > 1:
        raise _refuse(f"two per-request params ({', '.join(sorted(bound))}): BrainPatch has one live strength",
                      None)
    if bound and unbound is not None:
        raise _refuse(f"`{unbound.names[0]}` without the strength `{next(iter(bound))}`: BrainPatch's strength "
                      "multiplies every intervention", _span(unbound), help="bind every add to the one param, or none")
    param = params.get(next(iter(bound))) if bound else None
    if param is not None and (param.low is not None or param.high is not None) and param.low != -param.high:
        raise _refuse(f"the range [{param.low!r}, {param.high!r}] of `{param.name}`: BrainPatch's strength is clamped "
                      "to [-m, m]", None, help=f"declare `{param.name}` in [-m, m]")
    return out, param


@dataclass
class Track:
    layer: int
    site: str  # all | prompt | continuation
    segments: list  # (a, b, vector) over the generated index; a prompt track's one segment is (0, 1, vector)
    name: str
    span: object


def _tracks(parts: list[Part]) -> list[Track]:
    tracks: dict[tuple[int, str], Track] = {}
    for p in parts:  # the tracks that hold the prompt first: a layer's generated segments then join its `all`
        if p.prompt:
            site = "all" if p.gen is not None else "prompt"
            segment = (p.gen[0], p.gen[1], p.vector) if p.gen is not None else (0, 1, p.vector)
            if (p.layer, site) in tracks:
                raise _refuse(f"`{p.name}` beside another intervention at layer {p.layer} on the prompt", p.span,
                              help="one intervention a layer and scope")
            tracks[(p.layer, site)] = Track(p.layer, site, [segment], p.name, p.span)
    for p in parts:
        if not p.prompt:
            key = (p.layer, "all") if (p.layer, "all") in tracks else (p.layer, "continuation")
            tracks.setdefault(key, Track(p.layer, key[1], [], p.name, p.span)).segments.append((*p.gen, p.vector))
    for t in tracks.values():
        t.segments.sort(key=lambda s: s[0])
        for (a1, b1, _), (a2, _, _) in zip(t.segments, t.segments[1:]):
            if b1 is None or b1 > a2:
                raise _refuse(f"overlapping generated segments at layer {t.layer} (`{t.name}`)", t.span)
    return list(tracks.values())


def _ratio(vector: np.ndarray, base: np.ndarray) -> float | None:
    """The float32 m with fl32(m × base) == vector exactly, or None."""
    i = int(np.argmax(np.abs(base)))
    if base[i] == 0:
        return None
    m = float(np.float32(float(vector[i]) / float(base[i])))
    return m if np.array_equal((base * np.float32(m)).astype(np.float32), vector) else None


def schedule_of(tracks: list[Track]) -> tuple[dict[str, float] | None, list[np.ndarray]]:
    """The patch's schedule and each track's vector (the track's first segment's, divided by its multiplier)."""
    points = sorted({0, *(x for t in tracks for a, b, _ in t.segments if t.site != "prompt"
                          for x in (a, b) if x is not None)})
    if all(t.site == "prompt" or [(a, b) for a, b, _ in t.segments] == [(0, None)] for t in tracks):
        return None, [t.segments[0][2] for t in tracks]
    first = next(t for t in tracks if t.site != "prompt")
    covering = [next((v for a, b, v in first.segments if a <= x and (b is None or x < b)), None) for x in points]
    base = next(v for v in covering if v is not None)
    multipliers = []
    for v in covering:
        m = 0.0 if v is None else _ratio(v, base)
        if m is None:
            raise _refuse(f"the segments of `{first.name}`: BrainPatch's schedule multiplies one vector, and these are "
                          "not one vector times a number", first.span)
        multipliers.append(m)
    vectors = []
    for t in tracks:
        if t.site == "prompt":
            vectors.append(_divided(t, t.segments[0][2], multipliers[0]))
            continue
        mine = [next((v for a, b, v in t.segments if a <= x and (b is None or x < b)), None) for x in points]
        j = next(i for i, v in enumerate(mine) if v is not None)
        own = _divided(t, mine[j], multipliers[j])
        for v, m in zip(mine, multipliers):
            if (v is None) != (m == 0.0) or (v is not None and not np.array_equal(
                    (own * np.float32(m)).astype(np.float32), v)):
                raise _refuse(f"the segments of `{t.name}`: they do not follow the schedule of `{first.name}` "
                              "(BrainPatch has one schedule for the whole patch)", t.span)
        vectors.append(own)
    schedule, last = {}, None
    for x, m in zip(points, multipliers):
        if m != last:
            schedule[str(x)] = m
            last = m
    return schedule, vectors


def _divided(t: Track, vector: np.ndarray, m: float) -> np.ndarray:
    if m == 0.0:
        raise _refuse(f"`{t.name}`: it steers where the schedule is 0", t.span)
    own = (vector / np.float32(m)).astype(np.float32)
    if not np.array_equal((own * np.float32(m)).astype(np.float32), vector):
        raise _refuse(f"`{t.name}`: its vector is not a float32 vector times the schedule's {m!r}", t.span)
    return own


def dtype_of(vectors) -> str:
    """The narrowest of F16, BF16, F32 that holds every vector exactly."""
    from steerc.io.brainpatch import encode

    for dtype, fmt in (("F16", "<f2"), ("BF16", None)):
        with np.errstate(over="ignore"):
            if all(np.array_equal(_decoded(encode(v, dtype), dtype), v) for v in vectors):
                return dtype
    return "F32"


def _decoded(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, "<f2").astype(np.float32)


def patch_name(source_name: str) -> str:
    """BrainPatch's name (``[a-z0-9][a-z0-9._-]{0,63}``) from the program's file name."""
    stem = os.path.splitext(os.path.basename(source_name.replace("\\", "/")))[0].lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", stem).lstrip("._-")[:64]
    return name or "steerc-patch"


def base_model(facts) -> dict:
    """The model binding: the config steerc read (its ``_name_or_path``, the Hugging Face id of a model steerc
    ships, or its folder's name), its architecture and dtype, and the facts' sizes."""
    from steerc.core.jsonio import JSONError, read_file

    config = {}
    origin = getattr(facts, "origin", "") or ""
    if origin.endswith(".json") and os.path.isfile(origin):
        try:
            _, config = read_file(origin)
        except (OSError, JSONError):
            config = {}
    config = config if isinstance(config, dict) else {}
    named = config.get("_name_or_path")
    if isinstance(named, str) and named:
        model_id = named
    elif os.path.basename(origin) in HUB_IDS:
        model_id = HUB_IDS[os.path.basename(origin)]
    elif os.path.isfile(origin):  # a model folder's config.json: the folder's name
        model_id = os.path.basename(os.path.dirname(os.path.abspath(origin)))
    else:  # facts of a live model, or a facts JSON that names no model
        model_id = facts.family
    archs = config.get("architectures")
    dtype = config.get("torch_dtype", config.get("dtype"))
    return {"model_id": model_id or facts.family, "revision": None,
            "architecture": archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "",
            "hidden_size": facts.hidden, "num_layers": facts.layers,
            "torch_dtype": dtype if isinstance(dtype, str) else None}


def lower(plan: Plan, facts, command: str = "") -> tuple[dict, dict]:
    """(the manifest as BrainPatch's to_dict writes it, {key: (dtype, vector)}); :class:`Refused` otherwise."""
    from steerc.io.brainpatch import full_manifest

    parts, param = parts_of(plan)
    if not parts:
        raise _refuse("a program that steers nothing: a BrainPatch declares at least one intervention", None,
                      help="add an intervention")
    tracks = _tracks(parts)
    schedule, vectors = schedule_of(tracks)
    keys: dict[bytes, str] = {}
    stored: dict[str, np.ndarray] = {}
    interventions = []
    for t, v in zip(tracks, vectors):
        key = keys.get(v.tobytes())
        if key is None:
            key, n = t.name, 2
            while key in stored:
                key, n = f"{t.name}_{n}", n + 1
            keys[v.tobytes()], stored[key] = key, v
        interventions.append({"layer": t.layer, "vector": key, "coefficient": 1.0, "site": t.site})
    dtype = dtype_of(stored.values())
    strength = (param.default if param is not None else 1.0,
                max(abs(param.low), abs(param.high)) if param is not None and param.low is not None else
                (CEILING if param is not None else 8.0))
    if not 0 < strength[1] <= CEILING or abs(strength[0]) > strength[1]:
        raise _refuse(f"the strength's range [-{strength[1]!r}, {strength[1]!r}]: BrainPatch's is at most ±1024 and "
                      "holds the default", None)
    manifest = full_manifest({
        "name": patch_name(plan.source_name),
        "description": f"Compiled by steerc from {os.path.basename(plan.source_name)}.",
        "base_model": base_model(facts), "interventions": interventions, "schedule": schedule,
        "provenance": {"steerc_source_sha256": plan.source_sha256},
        "default_strength": float(strength[0]), "max_abs_strength": float(strength[1]),
    })
    return manifest, {k: (dtype, v) for k, v in stored.items()}


def check_brainpatch(result) -> None:
    """Add ``unsupported-by-target`` for what the capability table lets through but BrainPatch cannot say."""
    check_by_lowering(result, lambda r: lower(r.plan, r.facts))


__all__ = ["Refused", "TARGET", "base_model", "check_brainpatch", "dtype_of", "lower", "patch_name", "schedule_of"]
