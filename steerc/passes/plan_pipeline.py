"""The plan pipeline: lowering, then the optimisation passes in one visible order.

``PLAN_PASSES`` is the order; each pass takes a plan and returns a new one
(plans are frozen). :func:`verify` states what every plan satisfies; the
tests run it between passes.
"""

from __future__ import annotations

import math

import numpy as np

from steerc.diagnostics import Diagnostics, Note
from steerc.ir.plan import Affine, Plan, Project, Rotate
from steerc.passes import drop_dead, drop_noops, fuse_affine, fuse_projections, lower_plan

# Dead kernels go first so that fusion never hides them in a merged kernel.
PLAN_PASSES = (drop_noops, drop_dead, fuse_affine, fuse_projections)
# Passes that only make the plan faster to run: they report nothing, so a check that wants only the
# diagnostics may leave them out (`fuse=False`).
FUSIONS = (fuse_affine, fuse_projections)


class PlanError(AssertionError):
    """A plan broke an invariant: a compiler bug, never a user error."""


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
            "dead-intervention",
            f"intervention `{n}` has no effect at {sites}: "
            f"{', '.join(f'`{k}`' for k in killers) or 'a later intervention'} overwrites it first",
            spans.get(n),
            notes=tuple(Note(f"`{k}` is here", spans.get(k)) for k in killers),
            help="remove it, or give the overwriting intervention a narrower scope",
        )
    for n, chs in noop.items():
        sites = ", ".join(ch.site.text for ch in chs)
        diagnostics.warning("no-effect", f"intervention `{n}` changes nothing at {sites} (e.g. `scale 1`, a zero `add`)",
                            spans.get(n), help="remove it, or check the values it uses there")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise PlanError(message)


def verify(plan: Plan, facts) -> None:
    orders = [sp.site.order for sp in plan.sites]
    _check(orders == sorted(orders) and len(set(orders)) == len(orders), "sites out of order or repeated")
    for sp in plan.sites:
        s = sp.site
        _check(0 <= s.layer < facts.layers, f"{s.text}: layer out of range")
        _check(s.kind != "resid_pre" or s.layer == 0, f"{s.text}: not canonical")
        _check((s.kind == "head") == (s.head is not None), f"{s.text}: head index mismatch")
        _check(s.head is None or 0 <= s.head < facts.heads, f"{s.text}: head out of range")
        width = facts.width(s.kind)
        _check(len(sp.kernels) > 0, f"{s.text}: empty site")
        for k in sp.kernels:
            _check(len(k.scope) > 0, f"{s.text}: kernel without scope")
            _verify_op(k.op, width, s.text)


def _unit_rows(vectors, width: int, where: str) -> None:
    if not vectors:
        return
    q = np.stack([v.array.astype(np.float64) for v in vectors])
    _check(q.shape[1] == width, f"{where}: width {q.shape[1]} != {width}")
    _check(np.allclose(q @ q.T, np.eye(len(vectors)), atol=1e-5), f"{where}: basis not orthonormal")


def _verify_op(op, width: int, where: str) -> None:
    if isinstance(op, Affine):
        _check(not op.schedule or op.bias is not None, f"{where}: a schedule without a bias")
        for kind, a, b in op.schedule:
            _check(kind in ("ramp", "decay", "window") and math.isfinite(a) and math.isfinite(b),
                   f"{where}: bad schedule {kind}")
        for v in (op.scale, op.bias):
            if v is None:
                continue
            if isinstance(v, float):
                _check(math.isfinite(v), f"{where}: non-finite scale")
            else:
                _check(v.width == width and bool(np.isfinite(v.array).all()), f"{where}: bad affine vector")
    elif isinstance(op, Project):
        _check(len(op.basis) <= width, f"{where}: basis larger than the width")
        _unit_rows(op.basis, width, where)
        _check(op.target is None or len(op.target) == len(op.basis), f"{where}: targets do not match basis")
    elif isinstance(op, Rotate):
        _unit_rows((op.e1, op.e2), width, where)
        _check(math.isfinite(op.angle) and op.mode in ("to", "by"), f"{where}: bad rotation")
    else:
        raise PlanError(f"{where}: unknown kernel {op!r}")
