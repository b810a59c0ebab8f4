"""Pass `drop-dead`: remove kernels whose result is overwritten before it is read.

A kernel is dead when a later kernel at the same site replaces the hidden
state outright (``set`` or ``suppress``, no ``preserve norm``) on every
position the first one touches and whenever the first one is active: the
later kernel's scope is ``all`` or equal to the first's, and its gate is
absent or the same. Probes at a site read it before any kernel there, so
nothing observes a dead kernel. Reported as ``dead-intervention``.
"""

from __future__ import annotations

from steerc.core.record import evolve
from steerc.ir import nodes as ir
from steerc.ir.plan import Affine, Change, Kernel, Plan, SitePlan

name = "drop-dead"


_ALL = (ir.ScopeAll(),)


def _is_killer(k: Kernel) -> bool:
    # a per-request scale kills at 0 only; a bound `set` kills at every value
    return (not k.preserve_norm and isinstance(k.op, Affine) and k.op.kills
            and not any(b.role == "scale" for b in k.bindings))


def _dead(kernels) -> dict[int, Kernel]:
    """Index of each dead kernel -> a later kernel that overwrites it.

    One pass from the end, remembering the nearest killer per (scope, gate)
    it covers (``None`` scope: all positions; ``None`` gate: always), so the
    pass is linear in the number of kernels at the site.
    """
    by_key: dict[tuple, Kernel] = {}
    dead: dict[int, Kernel] = {}
    for i in range(len(kernels) - 1, -1, -1):
        k = kernels[i]
        scope = None if k.scope == _ALL else k.scope
        for key in ((None, None), (scope, None), (None, k.gate), (scope, k.gate)):
            if key in by_key:
                dead[i] = by_key[key]
                break
        if _is_killer(k):
            by_key[(scope, k.gate)] = k
    return dead


def run(plan: Plan) -> Plan:
    sites, changes = [], list(plan.changes)
    for sp in plan.sites:
        dead = _dead(sp.kernels)
        kept = []
        for i, k in enumerate(sp.kernels):
            killer = dead.get(i)
            if killer is None:
                kept.append(k)
            else:
                what = f"dropped: overwritten by {', '.join(killer.names)} before anything reads it"
                changes.append(Change(name, sp.site, what, k.names + killer.names))
        sites.append(SitePlan(sp.site, tuple(kept)))
    return evolve(plan, sites=tuple(sites), changes=tuple(changes))
