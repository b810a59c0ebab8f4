"""Pass `fuse-projections`: merge projections only where the result is the same.

For ``P_i(h) = h - Q_i Q_i^T h + Q_i t_i`` applied one after the other with
the same scope and gate (no ``preserve norm``, no per-request params):

* if the two bases are mutually orthogonal, ``P_2 P_1 = P`` with
  ``Q = [Q_1; Q_2]``, ``t = [t_1; t_2]`` — one projection;
* if ``span(Q_1)`` lies inside ``span(Q_2)``, ``P_2 P_1 = P_2`` — the first
  is dropped.

Anything else is left alone. "Orthogonal" and "inside" are decided in
float64 with a tolerance of 1e-6 on unit vectors.
"""

from __future__ import annotations

import numpy as np

from steerc.core.record import evolve
from steerc.ir.plan import Change, Kernel, Plan, Project, SitePlan

name = "fuse-projections"
TOL = 1e-6


def _q(op: Project) -> np.ndarray:
    return np.stack([b.array.astype(np.float64) for b in op.basis])


def _targets(op: Project) -> tuple[float, ...]:
    return op.target if op.target is not None else (0.0,) * len(op.basis)


def orthogonal(a: Project, b: Project) -> bool:
    return float(np.abs(_q(a) @ _q(b).T).max()) <= TOL


def contained(inner: Project, outer: Project) -> bool:
    qi, qo = _q(inner), _q(outer)
    residual = qi - (qi @ qo.T) @ qo
    return float(np.abs(residual).max()) <= TOL


def _same_context(a: Kernel, b: Kernel) -> bool:
    return (
        isinstance(a.op, Project)
        and isinstance(b.op, Project)
        and a.scope == b.scope
        and a.gate == b.gate
        and not a.preserve_norm
        and not b.preserve_norm
        and not a.bound  # a per-request clamp target stays in its own kernel
        and not b.bound
    )


def merge(a: Project, b: Project) -> Project:
    targets = _targets(a) + _targets(b)
    return Project(a.basis + b.basis, None if not any(targets) else targets)


def _names(provenance) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.intervention for p in provenance))


def run(plan: Plan) -> Plan:
    sites, changes = [], list(plan.changes)
    for sp in plan.sites:
        out: list[Kernel] = []
        provenance: list = []  # of out[-1], gathered in a list so merging stays linear
        for k in sp.kernels:
            prev = out[-1] if out else None
            if prev is not None and _same_context(prev, k):
                if contained(prev.op, k.op):
                    out[-1] = k
                    provenance.extend(k.provenance)
                    changes.append(Change(name, sp.site, "dropped a projection the next one subsumes",
                                          _names(prev.provenance + k.provenance)))
                    continue
                if orthogonal(prev.op, k.op):
                    out[-1] = evolve(prev, op=merge(prev.op, k.op))
                    provenance.extend(k.provenance)
                    changes.append(Change(name, sp.site, "fused two orthogonal projections into one",
                                          _names(prev.provenance + k.provenance)))
                    continue
            if out:
                out[-1] = evolve(out[-1], provenance=tuple(provenance))
            out.append(k)
            provenance = list(k.provenance)
        if out:
            out[-1] = evolve(out[-1], provenance=tuple(provenance))
        sites.append(SitePlan(sp.site, tuple(out)))
    return evolve(plan, sites=tuple(sites), changes=tuple(changes))
