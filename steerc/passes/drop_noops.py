"""Pass `drop-noops`: remove kernels that cannot change anything.

``scale 1``, an ``add`` of a zero vector, a rotation ``by 0``, an ablation
of no direction (at every value of its per-request params: a bound kernel
stays). Each dropped kernel is recorded for ``steerc explain``;
an intervention all of whose kernels are dropped is reported ``no-effect``.
"""

from __future__ import annotations

from steerc.core.record import evolve
from steerc.ir.plan import Affine, Change, Plan, Project, Rotate, SitePlan

name = "drop-noops"


def is_noop(op) -> bool:
    if isinstance(op, Affine):
        scale_one = (op.scale == 1.0) if isinstance(op.scale, float) else bool((op.scale.array == 1.0).all())
        return scale_one and (op.bias is None or not op.bias.array.any())
    if isinstance(op, Project):
        return not op.basis
    if isinstance(op, Rotate):
        return op.mode == "by" and op.angle == 0.0
    return False


def run(plan: Plan) -> Plan:
    sites, changes = [], list(plan.changes)
    for sp in plan.sites:
        kept = []
        for k in sp.kernels:
            if is_noop(k.op) and not k.bound:  # a bound kernel is a no-op at one value only
                changes.append(Change(name, sp.site, "dropped a kernel that changes nothing", k.names))
            else:
                kept.append(k)
        if kept:
            sites.append(SitePlan(sp.site, tuple(kept)))
    return evolve(plan, sites=tuple(sites), changes=tuple(changes))
