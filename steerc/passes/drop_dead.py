"""Pass `drop-dead`: remove kernels whose result is overwritten before it is read.

A kernel is dead when a later kernel at the same site replaces the hidden
state outright (``set`` or ``suppress``, no ``preserve norm``) on every
position the first one touches and whenever the first one is active: the
later kernel's scope is ``all`` or equal to the first's, and its gate is
absent or the same. Probes at a site read it before any kernel there, so
nothing observes a dead kernel. Reported as ``dead-intervention``.
"""

from __future__ import annotations

from attrs import evolve

from steerc.ir import nodes as ir
from steerc.ir.plan import Affine, Change, Kernel, Plan, SitePlan

name = "drop-dead"


def _kills(later: Kernel, earlier: Kernel) -> bool:
    if later.preserve_norm or not isinstance(later.op, Affine) or not later.op.kills:
        return False
    scope_covers = later.scope == (ir.ScopeAll(),) or later.scope == earlier.scope
    gate_covers = later.gate is None or later.gate == earlier.gate
    return scope_covers and gate_covers


def run(plan: Plan) -> Plan:
    sites, changes = [], list(plan.changes)
    for sp in plan.sites:
        ks = sp.kernels
        kept = []
        for i, k in enumerate(ks):
            killer = next((later for later in ks[i + 1 :] if _kills(later, k)), None)
            if killer is None:
                kept.append(k)
            else:
                what = f"dropped: overwritten by {', '.join(killer.names)} before anything reads it"
                changes.append(Change(name, sp.site, what, k.names + killer.names))
        sites.append(SitePlan(sp.site, tuple(kept)))
    return evolve(plan, sites=tuple(sites), changes=tuple(changes))
