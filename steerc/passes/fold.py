"""Pass `fold`: evaluate params, load and fold vectors, build the checked program.

Params take their ``--set`` override when given. Vectors are loaded under the
path policy (``path-escape``, ``file-not-found``, ``missing-key``,
``invalid-vector-file``) and their algebra is folded to numbers; lengths are
checked wherever two vectors meet (``shape-mismatch``) and values that have
no meaning are refused (``invalid-value``: normalizing or ablating a zero
vector, a rotation plane spanned by parallel vectors, a division by zero).
Per-layer banks keep one row per layer until layout picks the rows.
"""

from __future__ import annotations

import hashlib
import math

from steerc.core.limits import FLOAT32_MAX, MAX_LOREFT_RANK
from steerc.core.limits import MAX_SCHEDULE_STEP as MAX_POSITION
from steerc.core.record import evolve
from steerc.diagnostics import Note
from steerc.diagnostics.codes import (
    INVALID_VALUE,
    INVALID_VECTOR_FILE,
    LIMIT_EXCEEDED,
    MISSING_KEY,
    PARAM_OUT_OF_RANGE,
    SCHEDULE_OUTSIDE_GENERATION,
    SHAPE_MISMATCH,
    UNDEFINED_NAME,
)
from steerc.diagnostics.suggest import did_you_mean
from steerc.frontend.fmt import op as fmt_op
from steerc.io.vectorfile import VectorFileError
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.values import PerLayer
from steerc.ir.walk import walk
from steerc.passes import types as ty
from steerc.passes.context import CheckContext, Fault
from steerc.passes.foldvec import VectorFolder
from steerc.passes.layers import static_layers
from steerc.passes.loading import load_matrix, load_sae, sae_row
from steerc.passes.structure import MODEL_FIELDS, model_value_ok

name = "fold"

_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}


def run(ctx: CheckContext) -> None:
    env: dict[str, object] = {}
    params: dict[str, float] = {}
    request_params: dict[str, tuple] = {}
    probes: dict[str, ck.Probe] = {}
    interventions: list[ck.Intervention] = []
    assertions: list[ck.ModelAssertion] = []
    _check_overrides(ctx)
    ev = Evaluator(ctx, env)
    for stmt in ctx.program.statements:
        if isinstance(stmt, ir.ModelBlock):
            assertions.extend(_assertions(stmt, assertions))
            continue
        if not hasattr(stmt, "name") or stmt.name in ctx.poisoned:
            continue
        try:
            if isinstance(stmt, ir.ParamDecl):
                value = ctx.options.given(stmt.name)
                params[stmt.name] = env[stmt.name] = ev.scalar(stmt.value) if value is None else float(value)
                if stmt.range is not None or stmt.per_request:
                    bounds = _param_bounds(ev, stmt, env[stmt.name], value is not None)
                    if stmt.per_request:
                        request_params[stmt.name] = (env[stmt.name],) + bounds + (stmt.span,)
            elif isinstance(stmt, ir.VectorDecl):
                env[stmt.name] = ev.vector(stmt.value)
                ev.features_of[stmt.name] = [i for n in walk(stmt.value) for i in _features_in(ev, n)]
            elif isinstance(stmt, ir.MatrixDecl):
                env[stmt.name] = ev.matrix(stmt.value)
            elif isinstance(stmt, ir.SaeDecl):
                env[stmt.name] = ev.sae(stmt.value)
            elif isinstance(stmt, ir.ProbeDecl):
                probes[stmt.name] = _probe(ev, stmt)
                sae_sites(ev, stmt.readout, probes[stmt.name].site, stmt.name)
            elif isinstance(stmt, ir.InterventionDecl):
                interventions.append(_intervention(ev, stmt, len(interventions)))
                sae_sites(ev, stmt.op, interventions[-1].site, stmt.name)
        except Fault:
            ctx.poisoned.add(stmt.name)
    ctx.values = env
    ctx.checked = ck.CheckedProgram(
        source_name=ctx.source.name,
        source_sha256=hashlib.sha256(ctx.source.text.encode("utf-8")).hexdigest(),
        params=params,
        assertions=tuple(assertions),
        probes=probes,
        interventions=tuple(interventions),
        constraint=None,
        request_params=request_params,
    )


def _param_bounds(ev: Evaluator, stmt: ir.ParamDecl, value: float, overridden: bool) -> tuple:
    """(lowest, highest) of a param with `in [lo, hi]` (each None without one), its value checked."""
    if stmt.range is None:
        return None, None
    lo, hi = (ev.operand(b) for b in stmt.range)
    if lo > hi:
        ev.fail(INVALID_VALUE, f"the range [{lo:g}, {hi:g}] is empty", stmt.range_span)
    if not lo <= value <= hi:
        if overridden:
            options = ev.ctx.options
            origin = options.origins.get(stmt.name)
            if stmt.name in options.overrides:
                given = f"`--set {stmt.name}={value:g}`"
            else:
                given = f"`{stmt.name} = {value:g}` in {origin.file if origin else 'steer.toml'}"
            notes = (Note("the value is given here", origin),) if origin is not None else ()
            ev.fail(PARAM_OUT_OF_RANGE, f"{given} is outside the range [{lo:g}, {hi:g}] that `{stmt.name}` "
                    "declares", stmt.range_span, notes=notes,
                    help=f"give a value from {lo:g} to {hi:g}, or widen the range")
        ev.fail(PARAM_OUT_OF_RANGE, f"the default {value:g} of `{stmt.name}` is outside its range "
                f"[{lo:g}, {hi:g}]", stmt.value.span)
    return lo, hi


def _assertions(block: ir.ModelBlock, already: list) -> list[ck.ModelAssertion]:
    """The block's well-formed facts (the structure pass reported the others)."""

    if already:  # a second block was reported as a duplicate
        return []
    seen, out = set(), []
    for f in block.fields:
        if f.key in MODEL_FIELDS and f.key not in seen and model_value_ok(f.key, f.value):
            out.append(ck.ModelAssertion(f.key, f.value.value, span=f.span))
        seen.add(f.key)
    return out


def _check_overrides(ctx: CheckContext) -> None:
    params = [s.name for s in ctx.program.statements if isinstance(s, ir.ParamDecl)]
    for key in ctx.options.overrides:
        if key not in params:
            ctx.error(
                UNDEFINED_NAME,
                f"`--set {key}=...` names no param of this program",
                ctx.options.origins.get(key),
                help=did_you_mean(key, params) or (f"its params are {', '.join(params)}" if params else "it declares no params"),
            )


# ------------------------------------------------------------------ building


def site_pattern(site: ir.SiteRef) -> ck.SitePattern:
    def atoms(item):
        return item.items if isinstance(item, ir.SelGroup) else (item,)

    if site.name == "head":
        return ck.SitePattern("head", atoms(site.items[0]), atoms(site.items[1]), span=site.span)
    return ck.SitePattern(site.name, site.items, None, span=site.span)


def _probe(ev: Evaluator, p: ir.ProbeDecl) -> ck.Probe:
    r = p.readout
    if isinstance(r, ir.Cosine):
        readout = ck.Readout("cosine", (ev.direction(r.vector),))
    elif isinstance(r, (ir.ProjectedCosine, ir.SubspaceCosine)):
        kind = "projected_cosine" if isinstance(r, ir.ProjectedCosine) else "subspace_cosine"
        vectors = tuple(ev.direction(v) for v in r.vectors)
        ev.same_width(vectors, r.span, f"the directions of `{kind}`")
        readout = ck.Readout(kind, vectors)
    elif isinstance(r, ir.Dot):
        bias = 0.0
        for off in r.offsets:
            value = ev.operand(off.value)
            bias += value if off.sign == "+" else -value
        ev.fits_float32(bias, r.span, "the bias of this readout")
        readout = ck.Readout("dot", (ev.vector(r.vector),), bias)
    elif isinstance(r, ir.FeatureReadout):
        readout = _feature_readout(ev, r)
    else:
        readout = ck.Readout("norm")
    site = site_pattern(p.site)
    readout = evolve(readout, spans=tuple(expr.span for expr in _readout_exprs(r)))
    for v, expr in zip(readout.vectors, _readout_exprs(r)):
        ev.rows_available(v, site, expr.span)
    return ck.Probe(p.name, site, readout, p.pool.kind, span=p.span, pool_span=p.pool.span, read_span=r.span)


def _readout_exprs(r):
    if isinstance(r, (ir.ProjectedCosine, ir.SubspaceCosine)):
        return r.vectors
    if isinstance(r, (ir.Cosine, ir.Dot)):
        return (r.vector,)
    if isinstance(r, ir.FeatureReadout):
        return (r.feature, r.feature)  # the encoder column and b_dec both come from `s[i]`
    return ()


def _feature_readout(ev: Evaluator, r: ir.FeatureReadout) -> ck.Readout:
    """``read s[i]``: ``f_i(h) = act((h - b_dec) . W_enc[:, i] + b_enc[i])``, as ``clamp feature`` computes it."""
    sae, index, column, b_dec, threshold = _encoder(ev, r.feature, "`read s[i]`",
                                                    "read the feature's direction instead: `read dot(s[i])`")
    return ck.Readout("sae_feature", (column.w, b_dec), float(column.bias), threshold, sae=sae, feature=index)


def _encoder(ev: Evaluator, feature: ir.Index, what: str, instead: str):
    """``(sae, i, column, b_dec, threshold)`` of feature ``s[i]``, for an operation that computes its activation
    (``what``): ``column`` its encoder column and bias, ``b_dec`` float64 (zeros where the SAE does not subtract
    it from its input), ``threshold`` JumpReLU's (0 for a standard SAE). Only that column, two numbers and
    ``b_dec`` are read. A topk or gated SAE is ``invalid-value``, with ``instead`` as the help."""
    import numpy as np

    sae, index = ev.feature(feature)
    if sae.architecture not in _CLAMPABLE:
        ev.fail(INVALID_VALUE, f"{what} takes standard and jumprelu SAEs; `{feature.base.id}` is "
                f"{sae.architecture}: {_NOT_CLAMPABLE.get(sae.architecture, 'steerc does not encode it')}",
                feature.span, help=instead)
    try:
        column = sae.encoder_column(index)
        b_dec = sae.tensor("b_dec") if sae.config.apply_b_dec_to_input else np.zeros(sae.d_in, np.float32)
    except VectorFileError as exc:
        ev.fail(exc.code, exc.message, feature.span, help=exc.help)
    except OSError as exc:  # the file went away or became unreadable since its header was read
        ev.fail(INVALID_VECTOR_FILE, f"cannot read feature {index} of the SAE ({exc.strerror})", feature.span)
    ev.ctx.spend(2 * sae.d_in, feature.span)
    threshold = float(column.threshold) if column.threshold is not None else 0.0
    return sae, index, column, np.asarray(b_dec, np.float64), threshold


def _intervention(ev: Evaluator, iv: ir.InterventionDecl, index: int) -> ck.Intervention:
    site = site_pattern(iv.site)
    op = _operation(ev, iv.op)
    for v in op.vectors:
        ev.rows_available(v, site, iv.op.span)
    if op.schedule:
        _schedule_scopes(ev, iv)
    gate = _gate(ev, iv.gate) if iv.gate is not None else None
    return ck.Intervention(
        name=iv.name,
        index=index,
        site=site,
        op=op,
        scopes=iv.scopes or (ir.ScopeAll(),),
        gate=gate,
        preserve_norm=iv.preserve is not None,
        span=iv.span,
        gate_span=iv.gate.span if iv.gate is not None else None,
    )


def step_scope(s) -> bool:
    """Whether a scope item selects only positions at generation step 0 or later (position P-1 on)."""
    if isinstance(s, ir.ScopeGenerated):
        sel = s.sel
        return sel is None or (isinstance(sel, ir.PosIndex) and sel.index >= 0) or \
            (isinstance(sel, ir.PosSlice) and (sel.start is None or sel.start >= 0))
    if isinstance(s, ir.ScopePrompt):
        sel = s.sel
        return (isinstance(sel, ir.PosIndex) and sel.index == -1) or \
            (isinstance(sel, ir.PosSlice) and sel.start == -1 and sel.stop is None)
    return False


def _schedule_scopes(ev: Evaluator, iv: ir.InterventionDecl) -> None:
    scopes = iv.scopes or (ir.ScopeAll(),)
    bad = next((s for s in scopes if not step_scope(s)), None)
    if bad is not None:
        ev.ctx.error(
            SCHEDULE_OUTSIDE_GENERATION,
            "a schedule counts generation steps, but this intervention also steers positions before the "
            "prompt's last token" + ("" if iv.scopes else " (it has no `tokens` line, so it steers all of them)"),
            bad.span if iv.scopes and bad.span is not None else iv.op.span,
            help="steer `tokens generated` (steps 1 on), or `tokens prompt[-1:], generated` to include step 0, "
                 "the last prompt position, which predicts the first generated token",
        )
        raise Fault


def _operation(ev: Evaluator, op) -> ck.Operation:
    built = _build_operation(ev, op)
    return evolve(built, text=" ".join(t for t in fmt_op(op) if t))


def _build_operation(ev: Evaluator, op) -> ck.Operation:
    span = op.span
    if isinstance(op, ir.Add):
        if ev.ctx.types.get(id(op.vector)) == ty.SCHEDULED:
            vector, schedule = ev.scheduled(op.vector)
            return ck.Operation("add", (vector,), schedule=schedule, span=span, operand_spans=(op.vector.span,))
        return ck.Operation("add", (ev.vector(op.vector),), span=span, operand_spans=(op.vector.span,))
    if isinstance(op, ir.Set):
        return ck.Operation("set", (ev.vector(op.vector),), span=span, operand_spans=(op.vector.span,))
    if isinstance(op, ir.Suppress):
        return ck.Operation("suppress", span=span)
    if isinstance(op, ir.Scale):
        if ev.ctx.types.get(id(op.factor)) == ty.VECTOR:
            return ck.Operation("scale", (ev.vector(op.factor),), span=span, operand_spans=(op.factor.span,))
        return ck.Operation("scale", scalar=ev.operand(op.factor), span=span)
    if isinstance(op, ir.Ablate):
        dirs = tuple(ev.direction(d) for d in op.directions)
        ev.same_width(dirs, span, "the directions to ablate")
        return ck.Operation("ablate", dirs, span=span, operand_spans=tuple(d.span for d in op.directions))
    if isinstance(op, ir.Clamp):
        u = ev.direction(op.direction)
        return ck.Operation("clamp", (u,), scalar=ev.operand(op.value), span=span,
                            operand_spans=(op.direction.span,))
    if isinstance(op, ir.Rotate):
        b1, b2 = ev.direction(op.first), ev.vector(op.second)
        ev.same_width((b1, b2), span, "the two vectors of a rotation plane")
        ev.plane(b1, b2, op.second.span)
        return ck.Operation("rotate", (b1, b2), scalar=ev.operand(op.angle), mode=op.mode, span=span,
                            operand_spans=(op.first.span, op.second.span))
    if isinstance(op, ir.ClampFeature):
        return _clamp_feature(ev, op)
    if isinstance(op, ir.LoReFT):
        exprs = (op.rotation, op.weight, op.bias)
        tensors = loreft_operands(ev, ev.matrix(op.rotation), ev.matrix(op.weight), ev.vector(op.bias), exprs)
        return ck.Operation("loreft", span=span, tensors=tensors, tensor_spans=tuple(e.span for e in exprs))
    raise TypeError(op)


def loreft_operands(ev: Evaluator, r, w, b, exprs) -> tuple:
    """``(R, W, b)`` of ``loreft R, W, b`` once their shapes fit each other (``R`` and ``W`` ``[r, d]``,
    ``b`` ``[r]``, ``1 <= r <= d``) and ``R``'s rows are orthonormal (the site's width ``d`` is checked
    with the model, by the layout pass)."""
    import numpy as np

    from steerc.ir.kernels.loreft import ORTHONORMAL_TOLERANCE, orthonormal_error

    names = [_expr_text(ev.ctx, e) for e in exprs]
    if isinstance(b, PerLayer):
        ev.fail(SHAPE_MISMATCH, f"{names[2]} is a per-layer bank; the bias of `loreft` is one vector [r]",
                exprs[2].span, help="load one vector (without `per_layer=true`)")
    b = np.asarray(b, dtype=np.float64)
    rows, width = r.shape
    if w.shape != r.shape:
        ev.fail(SHAPE_MISMATCH, f"{names[1]} has shape {list(w.shape)} and {names[0]} {list(r.shape)}: "
                "LoReFT's R and W are both [r, d]", exprs[1].span,
                help="R projects onto the r-dimensional subspace it edits, W writes the values there: the two "
                     "come from one trained intervention")
    if b.shape != (rows,):
        ev.fail(SHAPE_MISMATCH, f"{names[2]} has length {b.shape[0]}, but {names[0]} has {rows} rows: "
                "LoReFT's b is [r], one number per row of R", exprs[2].span)
    if rows > width:
        ev.fail(SHAPE_MISMATCH, f"{names[0]} has {rows} rows of {width} numbers: at most {width} rows of "
                f"{width} numbers can be orthonormal", exprs[0].span,
                help="R is [r, d] with r <= d; a tensor stored as [d, r] (pyreft's `rotate_layer`) is Rᵀ: "
                     "save its transpose")
    if rows > MAX_LOREFT_RANK:
        ev.fail(LIMIT_EXCEEDED, f"{names[0]} has {rows:,} rows: steerc takes LoReFTs of rank up to "
                f"{MAX_LOREFT_RANK:,}", exprs[0].span,
                help="checking R's orthonormal rows costs r * r * d operations; pyreft's LoReFTs have ranks 1 to 32")
    error = orthonormal_error(r)
    if not error <= ORTHONORMAL_TOLERANCE:
        ev.fail(INVALID_VALUE, f"the rows of {names[0]} are not orthonormal: R Rᵀ differs from the identity by "
                f"up to {error:.3g} (steerc allows {ORTHONORMAL_TOLERANCE:g})", exprs[0].span,
                help="LoReFT edits h inside the subspace R's orthonormal rows span (pyreft keeps them "
                     "orthonormal with torch's orthogonal parametrization); save the trained R, or "
                     "orthonormalize it (the Q of a QR decomposition of Rᵀ, transposed)")
    return r, w, b


# What `clamp feature` computes per architecture, and why the others are refused.
_CLAMPABLE = ("standard", "jumprelu")
_NOT_CLAMPABLE = {
    "topk": "a topk SAE keeps the k largest of all its features' pre-activations, so one feature's activation "
            "needs the whole encoder at every token",
    "gated": "a gated SAE's activation has a gate path and a magnitude path of its own, which `clamp feature` "
             "does not compute yet",
}


def _clamp_feature(ev: Evaluator, op: ir.ClampFeature) -> ck.Operation:
    """``clamp feature s[i] to c``: the feature's decoder row (``vectors``), its encoder column, ``b_dec`` as
    subtracted from the input, and its bias and threshold (``tensors``), for ``h + (c - f_i(h)) W_dec[i]``."""
    import numpy as np

    sae, index, column, b_dec, threshold = _encoder(ev, op.feature, "`clamp feature`",
                                                    "steer along the feature's direction instead: `add c * s[i]`")
    value = ev.operand(op.value)
    dec = ev.vector(op.feature)
    tensors = (np.asarray(column.w, np.float64), b_dec, np.array([float(column.bias), threshold]))
    return ck.Operation("clamp_feature", (dec,), scalar=value, mode=sae.architecture, span=op.span,
                        operand_spans=(op.feature.span,), tensors=tensors,
                        tensor_spans=(op.feature.span,) * 3, sae=sae, feature=index)


def sae_sites(ev: Evaluator, node, site: ck.SitePattern, user: str) -> None:
    """Warn (``vector-site-mismatch``) where an intervention or probe uses an SAE's feature at another site
    than the one the SAE was trained on (its hook; ``resid_pre[l+1]`` is ``resid_post[l]``). Layers a
    selector gives only with a model (``*``, percentages) are not judged."""
    from steerc.diagnostics.codes import VECTOR_SITE_MISMATCH

    warned: set[str] = set()
    for n in walk(node):
        for index in _features_in(ev, n):
            base = index.base.id
            sae = ev.env.get(base)
            if base in warned or not isinstance(sae, _sae_class()):
                continue
            trained = sae.site
            why = f"so steerc cannot tell where it belongs: {sae.site_reason}" if trained is None else \
                _site_difference(trained, site, user)
            if why is None:
                continue
            warned.add(base)
            shown = f"{trained[0]}[{trained[1]}]" if trained is not None else None
            hook = f"an SAE of `{sae.hook_name}`" if sae.hook_name else "an SAE that names no hook"
            through = f" (`{n.id}` is made from `{base}[...]`)" if isinstance(n, ir.Name) else ""
            ev.ctx.warning(VECTOR_SITE_MISMATCH, f"`{base}` is {hook}" + (f" ({shown})" if shown else "")
                           + f", {why}{through}", n.span,
                           notes=(Note("used here", site.span),) if site.span is not None else (),
                           help=f"use its features at {shown}, where the SAE was trained" if shown else
                           "use it at the site its hook names")


def _features_in(ev: Evaluator, n) -> list:
    """The ``s[i]`` a node stands for: itself, or those a vector's declaration was made from (recorded in
    ``Evaluator.features_of`` as the declarations are folded)."""
    if isinstance(n, ir.Index):
        return [n]
    if isinstance(n, ir.Name):
        return ev.features_of.get(n.id, [])
    return []


def _canonical(kind: str, layer: int) -> tuple[str, int]:
    return ("resid_post", layer - 1) if kind == "resid_pre" and layer > 0 else (kind, layer)


def _site_difference(trained: tuple[str, int], site: ck.SitePattern, user: str) -> str | None:
    """Why ``site`` is not the SAE's ``trained`` site, or None where it is (or cannot be told without a model)."""
    kind, layer = trained
    if site.kind == "head":
        return f"and `{user}` uses its feature at head outputs"
    layers = static_layers(site.layers)
    if layers is None:
        if (kind in ("resid_pre", "resid_post")) == (site.kind in ("resid_pre", "resid_post")) and \
                (site.kind == kind or kind in ("resid_pre", "resid_post")):
            return None
        return f"and `{user}` uses its feature at {site.kind}"
    want = _canonical(kind, layer)
    used = sorted({_canonical(site.kind, lay) for lay in layers})
    if used == [want]:
        return None
    shown = ", ".join(f"{k}[{lay}]" for k, lay in sorted((_as_written(site.kind, u) for u in used),
                                                          key=lambda s: s[1]))
    return f"and `{user}` uses its feature at {shown}"


def _as_written(kind: str, canonical: tuple[str, int]) -> tuple[str, int]:
    """A canonical site as the program's kind writes it (``resid_pre[l+1]`` for ``resid_post[l]``)."""
    k, layer = canonical
    return ("resid_pre", layer + 1) if kind == "resid_pre" and k == "resid_post" else canonical


def _sae_class():
    from steerc.io.sae import SAE

    return SAE


def _expr_text(ctx: CheckContext, e) -> str:
    """An operand as written, for a message: ```R``` for a name, else ``this operand``."""
    return f"`{e.id}`" if isinstance(e, ir.Name) else "this operand"


def _gate(ev: Evaluator, g) -> ck.Gate:
    if isinstance(g, ir.Compare):
        if isinstance(g.left, ir.Name) and ev.ctx.symbols[g.left.id].kind == "probe":
            return ck.GateCompare(g.left.id, g.op, ev.operand(g.right), span=g.span)
        return ck.GateCompare(g.right.id, _FLIP[g.op], ev.operand(g.left), span=g.span)
    if isinstance(g, ir.GateNot):
        return ck.GateNegate(_gate(ev, g.operand))
    cls, ir_cls = (ck.GateAll, ir.GateAnd) if isinstance(g, ir.GateAnd) else (ck.GateAny, ir.GateOr)
    parts: list = []
    for side in (g.left, g.right):
        built = _gate(ev, side)
        parts.extend(built.parts if isinstance(side, ir_cls) else (built,))
    return cls(tuple(parts))


# ---------------------------------------------------------------- evaluation


class Evaluator:
    def __init__(self, ctx: CheckContext, env: dict):
        self.ctx = ctx
        self.env = env
        self._folder = None
        self.features_of: dict[str, list] = {}  # vector name -> the SAE features `s[i]` it is made from

    def fail(self, code: str, message: str, span, **kw):
        self.ctx.error(code, message, span, **kw)
        raise Fault

    def _lookup(self, e: ir.Name):
        value = self.env.get(e.id)
        if value is None:  # its declaration failed and was reported there
            raise Fault
        return value

    # ------------------------------------------------------------ scalars

    def scalar(self, e) -> float:
        """A scalar, computed in float64: it must be finite."""
        value = self._scalar(e)
        if not math.isfinite(value):
            self.fail(INVALID_VALUE, "this number is not finite", e.span)
        return value

    def operand(self, e) -> float:
        """A scalar that reaches the model (a factor, a target, an angle, a threshold): it must fit float32."""
        value = self.scalar(e)
        self.fits_float32(value, e.span, "this number")
        return value

    def fits_float32(self, value: float, span, what: str) -> None:
        if abs(value) > FLOAT32_MAX:
            self.fail(
                INVALID_VALUE,
                f"{what}, {value:.6g}, does not fit float32 (largest {FLOAT32_MAX:.6g})",
                span,
                help="steering values are float32 on every target, as the model's activations are",
            )

    def _scalar(self, e) -> float:
        if isinstance(e, ir.Number):
            return float(e.value)
        if isinstance(e, ir.Degrees):
            return math.radians(float(e.value))
        if isinstance(e, ir.Name):
            return self._lookup(e)
        if isinstance(e, ir.Neg):
            return -self._scalar(e.operand)
        a, b = self._scalar(e.left), self._scalar(e.right)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if b == 0:
            self.fail(INVALID_VALUE, "division by zero", e.right.span)
        return a / b

    # ------------------------------------------------------------ schedules

    def schedule(self, e) -> tuple[float, tuple]:
        """(coefficient, factors) of a schedule: scalars, ramp, decay and window multiplied together."""
        t = self.ctx.types.get(id(e))
        if t == ty.SCALAR:
            return self.operand(e), ()
        if isinstance(e, ir.Call):
            return 1.0, (self._factor(e),)
        if isinstance(e, ir.Neg):
            c, f = self.schedule(e.operand)
            return -c, f
        c, f = self.schedule(e.left)
        if e.op == "/":
            d = self.scalar(e.right)
            if d == 0:
                self.fail(INVALID_VALUE, "division by zero", e.right.span)
            return c / d, f
        c2, f2 = self.schedule(e.right)
        return c * c2, f + f2

    def scheduled(self, e) -> tuple:
        """(vector, sorted factors) of a scheduled vector: the coefficients fold into the vector."""
        types = self.ctx.types
        if types.get(id(e)) == ty.VECTOR:
            return self.vector(e), ()
        if isinstance(e, ir.Neg):
            v, f = self.scheduled(e.operand)
            return self._vectors().scaled(v, -1.0, e.span), f
        if e.op == "/":
            v, f = self.scheduled(e.left)
            d = self.scalar(e.right)
            if d == 0:
                self.fail(INVALID_VALUE, "division by zero", e.right.span)
            return self._vectors().scaled(v, 1.0 / d, e.span), f
        left_timed = types.get(id(e.left)) in (ty.SCALAR, ty.SCHEDULE)
        factor, vec = (e.left, e.right) if left_timed else (e.right, e.left)
        c, f1 = self.schedule(factor)
        v, f2 = self.scheduled(vec)
        out = self._vectors().scaled(v, c, e.span) if c != 1.0 else v
        return out, tuple(sorted(f1 + f2))

    def _factor(self, e: ir.Call) -> tuple[str, float, float]:
        args = [self.operand(a) for a in e.args]
        if e.func == "decay":
            (r,) = args
            if not 0.0 < r <= 1.0:
                self.fail(INVALID_VALUE, f"a decay rate is in (0, 1], got {r:g}", e.args[0].span,
                          help="decay(r) multiplies by r at each step: r <= 0 flips or zeroes the vector at "
                               "once, r > 1 grows it without bound")
            return ("decay", r, 0.0)
        for a, value in zip(e.args, args):
            if value != int(value) or not 0 <= value <= MAX_POSITION:
                self.fail(INVALID_VALUE, f"`{e.func}` counts steps: a whole number from 0 to {MAX_POSITION:,}, "
                          f"got {value:g}", a.span)
        if e.func == "ramp":
            if args[0] < 1:
                self.fail(INVALID_VALUE, "ramp(n) needs n >= 1 steps", e.args[0].span)
            return ("ramp", args[0], 0.0)
        a, b = args
        if a >= b:
            self.fail(INVALID_VALUE, f"window({a:g}, {b:g}) is empty: it needs a < b", e.span)
        return ("window", a, b)

    # ------------------------------------------------------------ vectors
    # Vector folding is steerc.passes.foldvec's, made on the first vector: it imports numpy only when
    # it folds with numpy (see there), so checking a program stays quick to start.

    def _vectors(self):
        if self._folder is None:
            self._folder = VectorFolder(self)
        return self._folder

    def vector(self, e):
        """A folded vector: a float64 array, or a PerLayer bank."""
        return self._vectors().vector(e)

    def direction(self, e):
        """A vector used as a direction: it must not be zero."""
        return self._vectors().direction(e)

    def sae(self, e):
        """An SAE (:class:`~steerc.io.sae.SAE`): a ``sae("folder")``, or an SAE's name."""
        if isinstance(e, ir.Name):
            return self._lookup(e)
        return load_sae(self.ctx, e)

    def feature(self, e: ir.Index):
        """``(sae, i)`` of ``s[i]``: ``i`` a whole number below the SAE's d_sae (``invalid-value`` otherwise)."""
        sae = self._lookup(e.base)
        value = self.scalar(e.index)
        if value != int(value) or not 0 <= value < sae.d_sae:
            whole = value == int(value)
            self.fail(INVALID_VALUE, (f"feature {value:g} is out of range: `{e.base.id}` has d_sae = {sae.d_sae:,} "
                      f"features (0 .. {sae.d_sae - 1:,})") if whole else
                      f"a feature index is a whole number, got {value:g} (`{e.base.id}` has d_sae = {sae.d_sae:,})",
                      e.index.span, help=f"features are numbered from 0; `{e.base.id}[{sae.d_sae - 1}]` is the last")
        return sae, int(value)

    def feature_row(self, e: ir.Index):
        """``s[i]`` as a vector: the decoder row ``W_dec[i]``, float64 (only that row is read)."""
        sae, index = self.feature(e)
        return sae_row(self.ctx, sae, index, e.span)

    def matrix(self, e):
        """A folded matrix: a 2-D float64 array (a ``load(...)``, or a matrix's name)."""
        if isinstance(e, ir.Name):
            return self._lookup(e)
        return load_matrix(self.ctx, e)

    def plane(self, b1, b2, span) -> None:
        self._vectors().plane(b1, b2, span)

    def same_width(self, values, span, what: str) -> None:
        self._vectors().same_width(values, span, what)

    def rows_available(self, value, site: ck.SitePattern, span) -> None:
        """Check a bank has the rows of layers known without a model."""
        if not isinstance(value, PerLayer):
            return
        layers = static_layers(site.layers)
        if layers is None:
            return
        for layer in layers:
            if layer not in value.rows:
                report_missing_row(self.ctx, value, layer, span)
                raise Fault


def report_missing_row(ctx: CheckContext, bank: PerLayer, layer: int, span) -> None:
    if bank.n_rows is not None:
        ctx.error(
            SHAPE_MISMATCH,
            f"`{bank.label}` has {bank.n_rows} rows but is used at layer {layer}",
            span,
            help="a per-layer bank needs one row for each layer it is used at",
        )
    else:
        from steerc.io.controlvector import PREFIX

        have = ", ".join(str(i) for i in sorted(bank.rows))
        # A llama.cpp control vector has no row 0: llama.cpp never steers layer 0's output.
        llamacpp = "; llama.cpp control vectors start at layer 1: steer resid_post[1:]" \
            if bank.label == PREFIX and layer == 0 else ""
        ctx.error(
            MISSING_KEY,
            f"`{bank.label}` has no row for layer {layer} (no key `{bank.label}.{layer}`)",
            span,
            help=f"the file has rows for layers {have}{llamacpp}",
        )


def with_constraint(ctx: CheckContext, constraint) -> None:
    ctx.checked = evolve(ctx.checked, constraint=constraint)
