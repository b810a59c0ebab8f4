"""The plan pipeline: lowering, then the optimisation passes in one visible order.

``PLAN_PASSES`` is the order; each pass takes a plan and returns a new one
(plans are frozen). :func:`verify` states what every plan satisfies; the
tests run it between passes.
"""

from __future__ import annotations

import math

import numpy as np

from steerc.core.errors import FieldError
from steerc.core.limits import FLOAT32_MAX
from steerc.diagnostics import Diagnostics, Note
from steerc.diagnostics.codes import DEAD_INTERVENTION, NO_EFFECT
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.plan import (
    SUB_ORDER,
    ParamError,
    Plan,
    check_params,
    declared_problem,
    kind_of,
    rebind,
)
from steerc.passes import drop_dead, drop_noops, fuse_affine, fuse_projections, lower_plan
from steerc.passes.fold import step_scope

# Dead kernels go first so that fusion never hides them in a merged kernel.
PLAN_PASSES = (drop_noops, drop_dead, fuse_affine, fuse_projections)
# Passes that only make the plan faster to run: they report nothing, so a check that wants only the
# diagnostics may leave them out (`fuse=False`).
FUSIONS = (fuse_affine, fuse_projections)


class InvalidPlan(FieldError):
    """A plan broke an invariant: a compiler bug (or, for a plan that arrives as data, a tampered plan);
    ``field`` says where (``sites[0].kernels[1].op.basis``), empty when it is the plan as a whole."""


def build_plan(checked, facts, *, optimize: bool = True, diagnostics: Diagnostics | None = None,
               verify_each: bool = False, fuse: bool = True) -> Plan:
    plan = lower_plan.lower(checked, facts)
    if verify_each:
        verify(plan, facts)
    if not optimize:
        return plan
    for p in PLAN_PASSES if fuse else tuple(p for p in PLAN_PASSES if p not in FUSIONS):
        plan = p.run(plan)
        if verify_each:
            verify(plan, facts)
    if diagnostics is not None:
        report_changes(plan, checked, diagnostics)
    return plan


def report_changes(plan: Plan, checked, diagnostics: Diagnostics) -> None:
    """Warnings for interventions that lost kernels to drop-dead or drop-noops."""
    spans = {iv.name: iv.span for iv in checked.interventions}
    dead: dict[str, list] = {}
    noop: dict[str, list] = {}
    for ch in plan.changes:
        if ch.pass_name == drop_dead.name:
            dead.setdefault(ch.interventions[0], []).append(ch)
        elif ch.pass_name == drop_noops.name:
            for n in ch.interventions:
                noop.setdefault(n, []).append(ch)
    for n, chs in dead.items():
        killers = sorted({k for ch in chs for k in ch.interventions[1:]} - {n})
        sites = ", ".join(ch.site.text for ch in chs)
        diagnostics.warning(
            DEAD_INTERVENTION,
            f"intervention `{n}` has no effect at {sites}: "
            f"{', '.join(f'`{k}`' for k in killers) or 'a later intervention'} overwrites it first",
            spans.get(n),
            notes=tuple(Note(f"`{k}` is here", spans.get(k)) for k in killers),
            help="remove it, or give the overwriting intervention a narrower scope",
        )
    for n, chs in noop.items():
        sites = ", ".join(ch.site.text for ch in chs)
        diagnostics.warning(NO_EFFECT, f"intervention `{n}` changes nothing at {sites} (e.g. `scale 1`, a zero `add`)",
                            spans.get(n), help="remove it, or check the values it uses there")


def _check(cond: bool, message: str, field: str = "") -> None:
    if not cond:
        raise InvalidPlan(field, message)


def _f32(x) -> bool:
    """A finite number that float32 holds (a larger one becomes inf in a float32 buffer)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= FLOAT32_MAX


def verify(plan: Plan, facts) -> None:
    """Every invariant a plan satisfies (spec/targets.md, LANGUAGE.md sections 5, 11 and 12).

    The compiler runs it between its plan passes (in the tests) and the serve
    plugin's admission runs it on every decoded request plan: a
    :class:`InvalidPlan` names the fault and, in ``field``, where it is
    (``sites[0].kernels[1].op.basis``, ``probes[0].bias``, ``params[0]``,
    the serve format's field names).

    * sites: canonical (``resid_pre`` only at layer 0), in forward order, each
      once, inside the model, each with kernels;
    * kernels: a scope; finite operands that float32 holds; bases with
      orthonormal rows (to 1e-5), a clamp target per row; a rotation's plane
      orthonormal; schedules only with a bias, steering from the prompt's last
      position on, with meaningful numbers;
    * probes: declared once, at a canonical site, a readout and a pool steerc
      knows, the vectors its readout takes (orthonormal rows where it
      projects), a float32 bias;
    * gates: comparisons of declared probes with float32 thresholds, and
      causality: a gate reading a prompt-pooled probe steers ``generated``
      positions only; a per-token probe gates kernels at its site or later;
    * per-request params: declared once with ranges that hold their defaults;
      bindings name declared params and fit their kernel's op; the plan's
      values are the coefficients times the defaults, none past float32.
    """
    orders = [sp.site.order for sp in plan.sites]
    for i in range(1, len(orders)):
        _check(orders[i - 1] < orders[i], f"{plan.sites[i].site.text}: sites out of order or repeated",
               f"sites[{i}].site")
    params = _verify_params(plan)
    probes = {}
    for i, p in enumerate(plan.probes):
        where = f"probes[{i}]"
        _check(p.name not in probes, f"probe {p.name[:40]!r} is declared twice", f"{where}.name")
        probes[p.name] = p
        width = _verify_site(p.site, facts, f"{where}.site")
        _check(p.kind in PROBE_ROWS, f"{p.name}: unknown readout {p.kind!r}", f"{where}.readout")
        _check(p.pool in POOLS, f"{p.name}: unknown pool {p.pool!r}", f"{where}.pool")
        lo, hi = PROBE_ROWS[p.kind]
        _check(lo <= len(p.vectors) and (hi is None or len(p.vectors) <= hi),
               f"{p.name}: a {p.kind} readout takes {lo if lo == hi else f'{lo} or more'} vectors",
               f"{where}.vectors")
        for v in p.vectors:
            _check(v.width == width and bool(np.isfinite(v.array).all()), f"{p.name}: bad probe vector",
                   f"{where}.vectors")
        if p.kind in BASIS_READOUTS:
            _unit_rows(p.vectors, width, p.name, f"{where}.vectors")
        _check(_f32(p.bias), f"{p.name}: the bias is not a finite float32 number", f"{where}.bias")
        _check(_f32(p.threshold) and (p.threshold == 0.0 or p.kind == "sae_feature"),
               f"{p.name}: the threshold is not a finite float32 number of an sae_feature readout",
               f"{where}.threshold")
    for i, sp in enumerate(plan.sites):
        s = sp.site
        width = _verify_site(s, facts, f"sites[{i}].site")
        _check(len(sp.kernels) > 0, f"{s.text}: empty site", f"sites[{i}].kernels")
        for j, k in enumerate(sp.kernels):
            where = f"sites[{i}].kernels[{j}]"
            _check(len(k.scope) > 0, f"{s.text}: kernel without scope", f"{where}.scope")
            _verify_op(k.op, width, s.text, f"{where}.op")
            if getattr(k.op, "schedule", ()):
                for n, item in enumerate(k.scope):
                    _check(step_scope(item), f"{s.text}: a scheduled kernel steers only from the prompt's last "
                                             "position on (generated, generated[a:b], prompt[-1:])",
                           f"{where}.scope[{n}]")
            if k.gate is not None:
                _verify_gate(k.gate, probes, params, s.text, f"{where}.gate")
                _verify_causality(k, s, probes, where)
            _verify_bindings(k, params, width, s.text, where)
    if plan.params:
        try:
            check_params(plan, None)
        except ParamError as exc:
            index = next((n for n, p in enumerate(plan.params) if p.name == exc.field), 0)
            raise InvalidPlan(f"params[{index}].default", f"param {exc.field}: {exc.message}") from None
        _check(rebind(plan) == plan, "the plan's values are not its coefficients times the params' defaults",
               "params")


# Vectors a readout takes: (fewest, most or None).
PROBE_ROWS = {"dot": (1, 1), "cosine": (1, 1), "projected_cosine": (1, None), "subspace_cosine": (1, None),
              "norm": (0, 0), "sae_feature": (2, 2)}  # sae_feature: (W_enc[:, i], b_dec)
BASIS_READOUTS = ("projected_cosine", "subspace_cosine")
POOLS = ("token", "prompt.mean", "prompt.last")
GATE_OPS = ("<", "<=", ">", ">=")


def _verify_site(s, facts, field: str) -> int:
    _check(isinstance(s.layer, int) and 0 <= s.layer < facts.layers,
           f"{s.text}: layer out of range (the model has {facts.layers} layers)", f"{field}.layer")
    _check(s.kind in SUB_ORDER, f"{s.text}: unknown site kind", f"{field}.kind")
    _check(s.kind != "resid_pre" or s.layer == 0,
           f"{s.text}: not canonical (resid_pre[l] for l > 0 is resid_post[l-1])", f"{field}.kind")
    _check((s.kind == "head") == (s.head is not None), f"{s.text}: head index mismatch", f"{field}.head")
    _check(s.head is None or (isinstance(s.head, int) and 0 <= s.head < facts.heads),
           f"{s.text}: head out of range (the model has {facts.heads} heads)", f"{field}.head")
    return facts.width(s.kind)


def _verify_gate(g, probes: dict, params: set, where: str, field: str) -> None:
    if isinstance(g, ck.GateCompare):
        _check(g.probe in probes, f"no probe named {g.probe[:40]!r} in the plan", f"{field}.probe")
        _check(g.op in GATE_OPS, f"{where}: unknown comparison {g.op!r}", f"{field}.op")
        _check(_f32(g.threshold), f"{where}: the threshold is not a finite float32 number", f"{field}.threshold")
        _check((g.param is None) == (g.coefficient is None),
               f"{where}: a per-request threshold has both a param and a coefficient", f"{field}.param")
        if g.param is not None:
            _check(g.param in params, f"no per-request param named {g.param[:40]!r} in the plan", f"{field}.param")
            _check(_f32(g.coefficient), f"{where}: the coefficient is not a finite float32 number",
                   f"{field}.coefficient")
    elif isinstance(g, ck.GateNegate):
        _verify_gate(g.operand, probes, params, where, f"{field}.not")
    else:
        key = "all" if isinstance(g, ck.GateAll) else "any"
        _check(len(g.parts) > 0, f"{where}: an empty `{key}` gate", f"{field}.{key}")
        for n, part in enumerate(g.parts):
            _verify_gate(part, probes, params, where, f"{field}.{key}[{n}]")


def _verify_causality(k, site, probes: dict, where: str) -> None:
    """LANGUAGE.md section 12, on the plan: the gate is decided before the positions it steers pass."""

    for name in ck.gate_probes(k.gate):
        probe = probes[name]
        if probe.pool != "token":
            for n, item in enumerate(k.scope):
                _check(isinstance(item, ir.ScopeGenerated),
                       f"{site.text}: probe {name!r} pools over the prompt ({probe.pool}), so its gate steers "
                       "generated positions only (causality)", f"{where}.scope[{n}]")
        else:
            _check(site.order[:2] >= probe.site.order[:2],
                   f"{site.text}: per-token probe {name!r} reads {probe.site.text}, which the forward pass "
                   "reaches after this site (causality)", f"{where}.gate")


def _verify_params(plan: Plan) -> set:
    rows = [{"name": p.name, "default": p.default, "min": p.low, "max": p.high} for p in plan.params]
    problem = declared_problem(rows)
    if problem is not None:
        raise InvalidPlan(f"params[{problem[0]}].{problem[1]}", problem[2])
    for n, p in enumerate(plan.params):
        for key, value in (("default", p.default), ("min", p.low), ("max", p.high)):
            _check(value is None and key != "default" or (value is not None and math.isfinite(value)),
                   f"param {p.name}: {key} is not a finite number", f"params[{n}].{key}")
    return {p.name for p in plan.params}


def _verify_bindings(k, params: set, width: int, where: str, field: str) -> None:
    roles = set()
    for n, b in enumerate(k.bindings):
        at = f"{field}.bindings[{n}]"
        _check(b.param in params, f"no per-request param named {b.param[:40]!r} in the plan", f"{at}.param")
        kind = kind_of(k.op)
        _check(kind is not None and b.role in kind.bindable and b.role not in roles,
               f"{where}: a {b.role} binding on a {type(k.op).__name__.lower()} kernel"
               + (" (twice)" if b.role in roles else ""), f"{at}.role")
        roles.add(b.role)
        value = dict(kind.operands_of(k.op)).get(b.role)
        _check(value is not None, f"{where}: a {b.role} binding on a kernel without a {b.role}", f"{at}.role")
        vector = not isinstance(value, float) and kind.operand(b.role).shape != "k"
        _check(vector or isinstance(value, float) or len(value) == 1,
               f"{where}: a {b.role} binding needs one {b.role} (a clamp: one direction, one target)", f"{at}.role")
        if vector:
            _check(not isinstance(b.coefficient, (int, float)) and b.coefficient.width == width
                   and bool(np.isfinite(b.coefficient.array).all()),
                   f"{where}: a vector coefficient of width {width} is needed here", f"{at}.coefficient")
        else:
            _check(_f32(b.coefficient), f"{where}: the coefficient is not a finite float32 number",
                   f"{at}.coefficient")


def _unit_rows(vectors, width: int, where: str, field: str = "") -> None:
    if not vectors:
        return
    q = np.stack([v.array.astype(np.float64) for v in vectors])
    _check(q.shape[1] == width, f"{where}: width {q.shape[1]} != {width}", field)
    _check(bool(np.isfinite(q).all()) and np.allclose(q @ q.T, np.eye(len(vectors)), atol=1e-5),
           f"{where}: basis not orthonormal", field)


class _Verifier:
    """What a kind's ``verify`` checks with (steerc.ir.kernels.base)."""

    check = staticmethod(_check)
    f32 = staticmethod(_f32)
    unit_rows = staticmethod(_unit_rows)

    @staticmethod
    def finite_vector(v, width: int) -> bool:
        return v.width == width and bool(np.isfinite(v.array).all())


def _verify_op(op, width: int, where: str, field: str = "") -> None:
    kind = kind_of(op)
    if kind is None:
        raise InvalidPlan(field, f"{where}: unknown kernel {op!r}")
    kind.verify(op, width, where, field, _Verifier)
