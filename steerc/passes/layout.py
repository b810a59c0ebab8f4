"""Pass `layout`: the program fits the model (runs when facts are given).

Checks ``model { ... }`` assertions (``model-mismatch``), expands every
selector against the model's layers and heads (``layer-out-of-range``,
``head-out-of-range``; an empty selection is a ``no-effect`` warning),
checks each vector (and each ``loreft``'s matrices) against the width of
every site it reaches (``hidden``, or ``head_dim`` for ``head[l, h]``), checks that per-layer banks have a row
for every layer they are used at, and finishes the causality checks that
needed concrete layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerc.core.limits import MAX_EXPANDED_SITES, MAX_VALUES
from steerc.diagnostics import Note
from steerc.diagnostics.codes import (
    HEAD_OUT_OF_RANGE,
    LAYER_OUT_OF_RANGE,
    LIMIT_EXCEEDED,
    MODEL_MISMATCH,
    NO_EFFECT,
    SHAPE_MISMATCH,
    SLICE_CLIPPED,
)
from steerc.ir import checked as ck
from steerc.ir.values import PerLayer
from steerc.passes import causality
from steerc.passes.context import CheckContext
from steerc.passes.fold import report_missing_row
from steerc.passes.layers import expand

if TYPE_CHECKING:  # annotations only: a check without a model never imports steerc.facts
    from steerc.facts import ModelFacts

name = "layout"


def run(ctx: CheckContext) -> None:
    facts: ModelFacts = ctx.facts
    program = ctx.checked
    if program is None:
        return
    _assertions(ctx, program, facts)
    for probe in program.probes.values():
        layers = site_layers(ctx, probe.site, facts)
        if probe.readout.kind == "sae_feature":
            _sae_fits(ctx, probe.readout.sae, probe.readout.spans[0], probe.site, layers, facts)
            continue
        _fits(ctx, probe.readout.vectors, probe.readout.spans, probe.site, layers, facts,
              probe.read_span or probe.span)
    expanded = values = 0
    for iv in program.interventions:
        layers = site_layers(ctx, iv.site, facts)
        if iv.op.kind == "clamp_feature":
            _sae_fits(ctx, iv.op.sae, iv.op.operand_spans[0] if iv.op.operand_spans else iv.op.span, iv.site,
                      layers, facts)
        else:
            _fits(ctx, iv.op.vectors, iv.op.operand_spans, iv.site, layers, facts, iv.op.span)
        _matrix_fits(ctx, iv.op, iv.site, layers, facts)
        heads = len(expand(iv.site.heads, facts.heads).indices) if iv.site.heads is not None else 1
        sites = len(layers) * heads
        expanded += sites
        values += sites * (sum(_width(v) or 0 for v in iv.op.vectors) + sum(int(t.size) for t in iv.op.tensors))
        if values > MAX_VALUES:
            ctx.error(
                LIMIT_EXCEEDED,
                f"with this intervention the plan holds more than {MAX_VALUES:,} vector entries (each site "
                "it reaches takes a copy of its vectors), the most steerc compiles",
                iv.site.span,
                help="narrow the selectors, or split the program",
            )
            return
        if expanded > MAX_EXPANDED_SITES:
            ctx.error(
                LIMIT_EXCEEDED,
                f"with this intervention the program steers more than {MAX_EXPANDED_SITES:,} sites of the model "
                f"(each layer and head a selector reaches counts), the most steerc compiles",
                iv.site.span,
                help="narrow the selectors (`head[*, *]` on this model alone is "
                f"{facts.layers * facts.heads:,} sites), or split the program",
            )
            return
    # Pairs of sites named outright were checked without a model; check the rest now.
    causality.checked(ctx, lambda p: expand(p.layers, facts.layers).indices, only_dynamic=True)


def site_layers(ctx: CheckContext, site: ck.SitePattern, facts: ModelFacts) -> tuple[int, ...]:
    """Concrete layers of a site, reporting selectors that reach past the model."""
    exp = expand(site.layers, facts.layers)
    for atom in exp.out_of_range:
        ctx.error(
            LAYER_OUT_OF_RANGE,
            f"layer {atom.index} does not exist: the model has {facts.layers} layers (0 to {facts.layers - 1})",
            atom.span,
            help="use -1 for the last layer, or a percentage such as 50% to stay portable",
        )
    for sl in exp.empty:
        ctx.warning(NO_EFFECT, f"this slice selects no layer of a {facts.layers}-layer model", sl.span)
    _clipped(ctx, exp, facts.layers, "layer")
    if site.heads is not None:
        heads = expand(site.heads, facts.heads)
        for atom in heads.out_of_range:
            ctx.error(
                HEAD_OUT_OF_RANGE,
                f"head {atom.index} does not exist: layers have {facts.heads} attention heads (0 to {facts.heads - 1})",
                atom.span,
            )
        _clipped(ctx, heads, facts.heads, "head")
    return exp.indices


def _clipped(ctx: CheckContext, exp, n: int, what: str) -> None:
    """A slice whose end was written past the model steers only what exists: said, so that a user who thought
    the model larger hears it (spec/language.md: ends are clipped, as in Python)."""
    for sl in exp.clipped:
        picked = expand((sl,), n).indices
        ctx.warning(
            SLICE_CLIPPED,
            f"this slice reaches past the model, which has {n} {what}s (0 to {n - 1}): it steers only {what}s "
            f"{_ranges(picked)}",
            sl.span,
            help=f"end the slice at {n} (or leave its end open, or use a percentage) to say so",
        )


def _ranges(indices) -> str:
    """``28-29`` for a run, ``0-3, 7`` for several."""
    runs, start = [], None
    for i, v in enumerate(indices):
        start = v if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != v + 1:
            runs.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(runs)


def _width(vec) -> int | None:
    return vec.width if isinstance(vec, PerLayer) else int(vec.shape[0])


def _fits(ctx: CheckContext, vectors, spans, site: ck.SitePattern, layers, facts: ModelFacts, line_span) -> None:
    """Each vector has the width of the site; one error per width that does not fit, naming the vectors."""
    want = facts.width(site.kind)
    spans = tuple(spans) + (None,) * (len(vectors) - len(spans))
    wrong: dict[int, list] = {}
    for vec, span in zip(vectors, spans):
        width = _width(vec)
        if width is not None and width != want:
            wrong.setdefault(width, []).append(span)
            continue
        if isinstance(vec, PerLayer):
            for layer in layers:
                if layer not in vec.rows:
                    report_missing_row(ctx, vec, layer, line_span)
                    break
    what = "head_dim" if site.kind == "head" else "hidden size"
    where = _text(ctx, site.span) or f"{site.kind}[...]"
    for width, where_spans in wrong.items():
        names = [_text(ctx, sp) for sp in where_spans]
        if all(names) and len(names) == 1:
            subject, verb = f"`{names[0]}`", "has"
        elif all(names):
            subject, verb = " and ".join(f"`{n}`" for n in names), "have"
        else:
            subject, verb = "a vector", "has"
        span = where_spans[0] if len(where_spans) == 1 and where_spans[0] is not None else line_span
        ctx.error(
            SHAPE_MISMATCH,
            f"{subject} {verb} length {width}, but `{where}` is {want} wide (the model's {what})",
            span,
            notes=(Note(f"acts on {_layers_text(layers)}", site.span),) if site.span is not None else (),
            help=f"steering vectors must be made for this model: {site.kind} takes {want} numbers",
        )


def _matrix_fits(ctx: CheckContext, op: ck.Operation, site: ck.SitePattern, layers, facts: ModelFacts) -> None:
    """A ``loreft``'s R (and so W) is [r, d] with d the width of the site it edits."""
    if op.kind != "loreft":
        return
    r = op.tensors[0]
    want = facts.width(site.kind)
    if r.shape[1] == want:
        return
    span = op.tensor_spans[0] if op.tensor_spans and op.tensor_spans[0] is not None else op.span
    name = _text(ctx, span) or "R"
    _wrong_width(ctx, site, layers, want, span,
                 f"`{name}` has shape {list(r.shape)}, but {{site}}: LoReFT's R and W are [r, {want}] here",
                 "a LoReFT is trained for one model and site: use the one made for this model")


def _sae_fits(ctx: CheckContext, sae, span, site: ck.SitePattern, layers, facts: ModelFacts) -> None:
    """An SAE whose feature a ``clamp feature`` edits, or a ``read s[i]`` reads, at ``site`` takes activations as
    wide as the site (its ``d_in``); ``span`` is the feature as written."""
    want = facts.width(site.kind)
    if sae.d_in == want:
        return
    name = _text(ctx, span) or "this feature"
    _wrong_width(ctx, site, layers, want, span,
                 f"the SAE of `{name}` reads activations of d_in = {sae.d_in:,}, but {{site}}",
                 f"an SAE is trained on one model's activations: use one made for this model ({sae.hook_name} "
                 f"of {sae.model_name or 'its model'} here)")


def _wrong_width(ctx: CheckContext, site: ck.SitePattern, layers, want: int, span, message: str, help: str) -> None:
    """``shape-mismatch`` at ``span``: ``message`` with ``{site}`` as "`SITE` is WANT wide (the model's hidden
    size)", and a note on the layers the site acts on."""
    where = _text(ctx, site.span) or f"{site.kind}[...]"
    what = "head_dim" if site.kind == "head" else "hidden size"
    ctx.error(SHAPE_MISMATCH, message.replace("{site}", f"`{where}` is {want} wide (the model's {what})"), span,
              notes=(Note(f"acts on {_layers_text(layers)}", site.span),) if site.span is not None else (),
              help=help)


def _text(ctx: CheckContext, span) -> str | None:
    """The source text of ``span`` on one line, shortened; None when it is not in the program's text."""
    if span is None or span.start < 0 or span.file != ctx.source.name:
        return None
    text = " ".join(ctx.source.text[span.start:span.end].split())
    return text if len(text) <= 40 else text[:39] + "…"


def _layers_text(layers) -> str:
    if not layers:
        return "no layer of this model"
    if len(layers) == 1:
        return f"layer {layers[0]}"
    contiguous = list(layers) == list(range(layers[0], layers[-1] + 1))
    return f"layers {layers[0]} to {layers[-1]}" if contiguous else "layers " + ", ".join(map(str, layers))


def _assertions(ctx: CheckContext, program: ck.CheckedProgram, facts: ModelFacts) -> None:
    for a in program.assertions:
        actual = getattr(facts, a.key)  # assertion keys are fact names
        expected = a.value
        if a.key == "family" and isinstance(expected, str):
            ok = expected == actual or expected == facts.model_type
        else:
            ok = expected == actual
        if not ok:
            ctx.error(
                MODEL_MISMATCH,
                f"this program expects {a.key} = {_show(expected)}, but the model has {a.key} = {_show(actual)}",
                a.span,
                notes=(Note(f"facts read from {facts.origin}", None),) if facts.origin else (),
                help="use the model the program was written for, or update the `model { ... }` block",
            )


def _show(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
