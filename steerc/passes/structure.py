"""Pass `structure`: the shape of the program, before any name means anything.

Reports: ``unsupported-version`` (and stops the pipeline), ``missing-field``,
``multiple-constraints``, ``unknown-field``/``duplicate-field``/``type-error``
in ``model { ... }``, ``unknown-site`` and malformed selectors, percent
selectors over 100% (``layer-out-of-range``), unknown pools, impossible
scopes (``invalid-value``) and lines that cannot do anything (``no-effect``).
"""

from __future__ import annotations

from steerc.core.limits import MAX_HEADS, MAX_LAYERS, MAX_POSITION
from steerc.diagnostics import Note
from steerc.diagnostics.codes import (
    DUPLICATE_FIELD,
    HEAD_OUT_OF_RANGE,
    INVALID_VALUE,
    LAYER_OUT_OF_RANGE,
    MISSING_FIELD,
    MULTIPLE_CONSTRAINTS,
    NO_EFFECT,
    TYPE_ERROR,
    UNDEFINED_NAME,
    UNKNOWN_FIELD,
    UNKNOWN_SITE,
    UNSUPPORTED_VERSION,
)
from steerc.diagnostics.suggest import did_you_mean, one_of
from steerc.frontend.fmt import selector_source
from steerc.ir import nodes as ir
from steerc.ir.checked import SITE_KINDS
from steerc.passes.context import CheckContext

name = "structure"

SUPPORTED_VERSIONS = (1,)

# The facts a `model { ... }` block may assert, and the type of each value.
MODEL_FIELDS: dict[str, type] = {
    "family": str,
    "layers": int,
    "hidden": int,
    "heads": int,
    "kv_heads": int,
    "head_dim": int,
    "intermediate": int,
    "vocab": int,
    "tied_embeddings": bool,
    "parallel_residual": bool,
}

POOLS = ("prompt.mean", "prompt.last", "token")


def run(ctx: CheckContext) -> None:
    program = ctx.program
    if program.version not in SUPPORTED_VERSIONS:
        ctx.error(
            UNSUPPORTED_VERSION,
            f"this program is written for Steer version {program.version}; steerc implements version 1",
            program.version_span,
            help="write `steer 1` as the first line, or upgrade steerc",
        )
        ctx.stop = True
        return
    first_model = first_constraint = None
    for stmt in program.statements:
        if isinstance(stmt, ir.ModelBlock):
            if first_model is not None:
                ctx.error(
                    DUPLICATE_FIELD,
                    "a program has at most one `model { ... }` block",
                    stmt.span,
                    notes=(Note("the first one is here", first_model.span),),
                    help="merge the two blocks",
                )
            else:
                first_model = stmt
                _model_block(ctx, stmt)
        elif isinstance(stmt, (ir.ConstrainText, ir.ConstrainChoice)):
            if first_constraint is not None:
                ctx.error(
                    MULTIPLE_CONSTRAINTS,
                    "a program has at most one output constraint",
                    stmt.span,
                    notes=(Note("the constraint already in force", first_constraint.span),),
                    help="combine them into one (a regex or grammar can express both), or drop one",
                )
            else:
                first_constraint = stmt
        elif isinstance(stmt, ir.ProbeDecl):
            _probe(ctx, stmt)
        elif isinstance(stmt, ir.InterventionDecl):
            _intervention(ctx, stmt)


def _model_block(ctx: CheckContext, block: ir.ModelBlock) -> None:
    seen: dict[str, ir.ModelField] = {}
    for f in block.fields:
        if f.key not in MODEL_FIELDS:
            ctx.error(
                UNKNOWN_FIELD,
                f"`{f.key}` is not a model fact steerc knows",
                f.span,
                help=did_you_mean(f.key, MODEL_FIELDS) or f"known facts: {one_of(MODEL_FIELDS)}",
            )
            continue
        if f.key in seen:
            ctx.error(DUPLICATE_FIELD, f"`{f.key}` is asserted twice", f.span,
                      notes=(Note("first asserted here", seen[f.key].span),))
            continue
        seen[f.key] = f
        if not model_value_ok(f.key, f.value):
            kind = {str: "a string", bool: "`true` or `false`", int: "a positive whole number"}[MODEL_FIELDS[f.key]]
            ctx.error(TYPE_ERROR, f"`{f.key}` must be {kind}", f.value.span or f.span)


def model_value_ok(key: str, value) -> bool:
    want = MODEL_FIELDS[key]
    return (
        (want is str and isinstance(value, ir.Str))
        or (want is bool and isinstance(value, ir.Bool))
        or (want is int and isinstance(value, ir.Number) and isinstance(value.value, int) and value.value > 0)
    )


def _missing(ctx, decl, what: str, example: str) -> None:
    kind = "probe" if isinstance(decl, ir.ProbeDecl) else "intervention"
    ctx.error(
        MISSING_FIELD,
        f"{kind} `{decl.name}` has no {what}",
        decl.name_span,
        help=f"add a line such as `{example}`",
    )
    ctx.poisoned.add(decl.name)


def _probe(ctx: CheckContext, probe: ir.ProbeDecl) -> None:
    if probe.site is None:
        _missing(ctx, probe, "`at` line", "at resid_pre[1]")
    elif not check_site(ctx, probe.site) or not _single_site(ctx, probe.site):
        ctx.poisoned.add(probe.name)
    if probe.readout is None:
        _missing(ctx, probe, "`read` line", "read cosine(v)")
    if probe.pool is None:
        _missing(ctx, probe, "`pool` line", "pool prompt.mean")
    elif probe.pool.kind not in POOLS:
        ctx.error(
            UNDEFINED_NAME,
            f"unknown pool `{probe.pool.kind}`",
            probe.pool.span,
            help=did_you_mean(probe.pool.kind, POOLS) or f"pools are {one_of(POOLS)}",
        )
        ctx.poisoned.add(probe.name)


def _intervention(ctx: CheckContext, iv: ir.InterventionDecl) -> None:
    if iv.site is None:
        _missing(ctx, iv, "`at` line", "at resid_post[2]")
    elif not check_site(ctx, iv.site):
        ctx.poisoned.add(iv.name)
    if iv.op is None:
        _missing(ctx, iv, "operation", "add 4.0 * joy")
    for scope in iv.scopes or ():
        _scope(ctx, scope)
    if iv.preserve is not None and isinstance(iv.op, (ir.Rotate, ir.Suppress)):
        why = "a rotation already keeps the norm" if isinstance(iv.op, ir.Rotate) else "a zero vector cannot be rescaled"
        ctx.warning(NO_EFFECT, f"`preserve norm` does nothing here: {why}", iv.preserve.span,
                    help="remove the line")


def _scope(ctx: CheckContext, scope) -> None:
    if not _positions_in_range(ctx, scope):
        return
    if isinstance(scope, ir.ScopePositions):
        for p in scope.positions:
            if p < 0:
                ctx.error(
                    INVALID_VALUE,
                    f"absolute position {p} is negative",
                    scope.span,
                    help="absolute positions count from each sequence's first token; "
                    "use `prompt[-3:]` to count from the end of the prompt",
                )
                return
    elif isinstance(scope, ir.ScopeAfter) and not scope.text.value:
        ctx.error(INVALID_VALUE, "`after` needs a non-empty text", scope.span)
    elif isinstance(scope, ir.ScopeGenerated) and scope.sel is not None:
        sel = scope.sel
        bounds = (sel.index,) if isinstance(sel, ir.PosIndex) else (sel.start, sel.stop)
        if any(b is not None and b < 0 for b in bounds):
            ctx.error(
                INVALID_VALUE,
                "generated positions count from the first generated token; a negative index has no meaning "
                "while the sequence is still growing",
                scope.span,
                help="use `generated[a:b]` with a, b >= 0, or `prompt[-k:]` for the end of the prompt",
            )


def _positions_in_range(ctx: CheckContext, scope) -> bool:
    if isinstance(scope, ir.ScopePositions):
        values = scope.positions
    elif isinstance(scope, (ir.ScopePrompt, ir.ScopeGenerated)) and scope.sel is not None:
        sel = scope.sel
        values = (sel.index,) if isinstance(sel, ir.PosIndex) else (sel.start, sel.stop)
    else:
        return True
    for p in values:
        if p is not None and abs(p) > MAX_POSITION:
            ctx.error(
                INVALID_VALUE,
                f"position {p} is beyond any sequence: positions run up to {MAX_POSITION:,}",
                scope.span,
            )
            return False
    return True


# --------------------------------------------------------------------- sites


def check_site(ctx: CheckContext, site: ir.SiteRef) -> bool:
    """Validate a site's name and selector shape; False if it is unusable."""
    if site.name not in SITE_KINDS:
        ctx.error(
            UNKNOWN_SITE,
            f"unknown site `{site.name}`",
            site.name_span,
            help=did_you_mean(site.name, SITE_KINDS) or f"sites are {one_of(SITE_KINDS)}",
        )
        return False
    ok = True
    if site.name == "head":
        if len(site.items) != 2:
            ctx.error(
                TYPE_ERROR,
                f"`head[...]` takes a layer axis and a head axis, got {len(site.items)} item(s)",
                site.span,
                help="write `head[layer, head]`; put a list on one axis in parentheses: `head[(1, 3), 0:2]`",
            )
            return False
        for code, axis in zip((LAYER_OUT_OF_RANGE, HEAD_OUT_OF_RANGE), site.items):
            atoms = axis.items if isinstance(axis, ir.SelGroup) else (axis,)
            ok &= all(_percent_ok(ctx, a, code) for a in atoms)
        return ok
    for item in site.items:
        if isinstance(item, ir.SelGroup):
            ctx.error(
                TYPE_ERROR,
                "parentheses group an axis of `head[...]` only",
                item.span,
                help=f"list the layers directly: `{site.name}[{', '.join(_sel_text(a) for a in item.items)}]`",
            )
            ok = False
        else:
            ok &= _percent_ok(ctx, item)
    return ok


def _sel_text(atom) -> str:
    return selector_source(atom)


def _percent_ok(ctx: CheckContext, atom, code: str = LAYER_OUT_OF_RANGE) -> bool:
    """Percentages up to 100%, indices within what any model steerc reads can have."""
    bounds = (atom.start, atom.stop) if isinstance(atom, ir.SelSlice) else (atom,)
    layers = code == LAYER_OUT_OF_RANGE
    noun, most, plural = ("layer", MAX_LAYERS, "layers") if layers else ("head", MAX_HEADS, "attention heads")
    for b in bounds:
        if isinstance(b, ir.SelPercent) and b.percent > 100:
            ctx.error(code, f"{b.text} is more than 100%", b.span)
            return False
        if isinstance(b, ir.SelIndex) and abs(b.index) > most:
            ctx.error(code, f"{noun} {b.index} does not exist in any model steerc reads (at most {most:,} {plural})",
                      b.span,
                      help="use -1 for the last one, or a percentage such as 50% to stay portable")
            return False
    return True


def _single_site(ctx: CheckContext, site: ir.SiteRef) -> bool:
    axes = site.items if site.name == "head" else (site.items,)
    for axis in axes:
        atoms = axis if isinstance(axis, tuple) else (axis.items if isinstance(axis, ir.SelGroup) else (axis,))
        if len(atoms) != 1 or not isinstance(atoms[0], (ir.SelIndex, ir.SelPercent)):
            ctx.error(
                TYPE_ERROR,
                "a probe reads exactly one site",
                site.span,
                help="pick one layer (and one head), e.g. `at resid_pre[1]`",
            )
            return False
    return True
