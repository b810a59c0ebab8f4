"""Pass `layout`: the program fits the model (runs when facts are given).

Checks ``model { ... }`` assertions (``model-mismatch``), expands every
selector against the model's layers and heads (``layer-out-of-range``,
``head-out-of-range``; an empty selection is a ``no-effect`` warning),
checks each vector against the width of every site it reaches (``hidden``,
or ``head_dim`` for ``head[l, h]``), checks that per-layer banks have a row
for every layer they are used at, and finishes the causality checks that
needed concrete layers.
"""

from __future__ import annotations

from steerc.diagnostics import Note
from steerc.facts import ModelFacts
from steerc.ir import checked as ck
from steerc.ir.values import PerLayer
from steerc.limits import MAX_EXPANDED_SITES, MAX_VALUES
from steerc.passes import causality
from steerc.passes.context import CheckContext
from steerc.passes.fold import report_missing_row
from steerc.passes.layers import expand

name = "layout"


def run(ctx: CheckContext) -> None:
    facts: ModelFacts = ctx.facts
    program = ctx.checked
    if program is None:
        return
    _assertions(ctx, program, facts)
    for probe in program.probes.values():
        layers = site_layers(ctx, probe.site, facts)
        for vec in probe.readout.vectors:
            _fits(ctx, vec, probe.site, layers, facts, probe.read_span or probe.span)
    expanded = values = 0
    for iv in program.interventions:
        layers = site_layers(ctx, iv.site, facts)
        for vec in iv.op.vectors:
            _fits(ctx, vec, iv.site, layers, facts, iv.op.span)
        heads = len(expand(iv.site.heads, facts.heads).indices) if iv.site.heads is not None else 1
        sites = len(layers) * heads
        expanded += sites
        values += sites * sum(_width(v) or 0 for v in iv.op.vectors)
        if values > MAX_VALUES:
            ctx.error(
                "limit-exceeded",
                f"with this intervention the plan holds more than {MAX_VALUES:,} vector entries (each site "
                "it reaches takes a copy of its vectors), the most steerc compiles",
                iv.site.span,
                help="narrow the selectors, or split the program",
            )
            return
        if expanded > MAX_EXPANDED_SITES:
            ctx.error(
                "limit-exceeded",
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
            "layer-out-of-range",
            f"layer {atom.index} does not exist: the model has {facts.layers} layers (0 to {facts.layers - 1})",
            atom.span,
            help="use -1 for the last layer, or a percentage such as 50% to stay portable",
        )
    for sl in exp.empty:
        ctx.warning("no-effect", f"this slice selects no layer of a {facts.layers}-layer model", sl.span)
    if site.heads is not None:
        heads = expand(site.heads, facts.heads)
        for atom in heads.out_of_range:
            ctx.error(
                "head-out-of-range",
                f"head {atom.index} does not exist: layers have {facts.heads} attention heads (0 to {facts.heads - 1})",
                atom.span,
            )
    return exp.indices


def _width(vec) -> int | None:
    return vec.width if isinstance(vec, PerLayer) else int(vec.shape[0])


def _fits(ctx: CheckContext, vec, site: ck.SitePattern, layers, facts: ModelFacts, span) -> None:
    want = facts.width(site.kind)
    width = _width(vec)
    if width is not None and width != want:
        what = "head_dim" if site.kind == "head" else "hidden size"
        ctx.error(
            "shape-mismatch",
            f"a vector of length {width} does not fit {site.kind}[...]: the model's {what} is {want}",
            span,
            help="steering vectors must be made for this model (same width as the site they act on)",
        )
        return
    if isinstance(vec, PerLayer):
        for layer in layers:
            if layer not in vec.rows:
                report_missing_row(ctx, vec, layer, span)
                return


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
                "model-mismatch",
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
