"""Pass `fuse-affine`: merge adjacent affine kernels with the same scope and gate.

``s2 * (s1 * h + b1) + b2 = (s2 s1) * h + (s2 b1 + b2)``: one kernel instead
of two, identical up to float rounding (property-tested at tight
tolerance). A scheduled bias (``f(n) b``) fuses only with biases of the same
schedule, or with none: ``s2 f b1 + f b2 = f (s2 b1 + b2)``. Kernels that preserve the norm are not fused: their rescaling
depends on their own input. Nor are kernels whose fused scale or bias would
not fit float32 (two `scale 1e30` make 1e60): each one alone fits, as the
checker made sure, and the plan never holds an infinite value. Nor kernels
a per-request param sets: each value must find its own operand.
"""

from __future__ import annotations

import numpy as np

from steerc.core.limits import FLOAT32_MAX
from steerc.core.record import evolve
from steerc.ir.plan import Affine, Change, Kernel, Plan, SitePlan
from steerc.ir.values import Vec

name = "fuse-affine"


def _as_array(x):
    return x.array.astype(np.float64) if isinstance(x, Vec) else x


def compose(first: Affine, second: Affine) -> Affine | None:
    """``second`` after ``first`` as one affine map; None when its values would not fit float32."""
    s1, s2 = _as_array(first.scale), _as_array(second.scale)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = s2 * s1
        b1 = _as_array(first.bias) if first.bias is not None else None
        b2 = _as_array(second.bias) if second.bias is not None else None
        bias = None
        if b1 is not None:
            bias = s2 * b1
        if b2 is not None:
            bias = b2 if bias is None else bias + b2
    if not _fits(scale) or (bias is not None and not _fits(bias)):
        return None
    new_scale = Vec(scale) if isinstance(scale, np.ndarray) else float(scale)
    return Affine(new_scale, Vec(bias) if bias is not None else None, _bias_schedule(first) or _bias_schedule(second))


def _bias_schedule(op: Affine):
    return op.schedule if op.bias is not None else ()


def _schedules_agree(a: Affine, b: Affine) -> bool:
    return a.bias is None or b.bias is None or a.schedule == b.schedule


def _fits(x) -> bool:
    return bool(np.all(np.abs(x) <= FLOAT32_MAX))  # False for inf and NaN too


def fusable(a: Kernel, b: Kernel) -> bool:
    return (
        isinstance(a.op, Affine)
        and isinstance(b.op, Affine)
        and a.scope == b.scope
        and a.gate == b.gate
        and _schedules_agree(a.op, b.op)
        and not a.preserve_norm
        and not b.preserve_norm
        and not a.bound
        and not b.bound
    )


def _names(kernels) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.intervention for k in kernels for p in k.provenance))


def run(plan: Plan) -> Plan:
    sites, changes = [], list(plan.changes)
    for sp in plan.sites:
        out: list[Kernel] = []
        run_: list[Kernel] = []  # a maximal run of fusable kernels, fused once (linear time)

        def fused(group: list[Kernel], op: Affine) -> None:
            if len(group) == 1:
                out.append(group[0])
                return
            provenance = tuple(p for k in group for p in k.provenance)
            out.append(evolve(group[0], op=op, provenance=provenance))
            changes.append(Change(name, sp.site, f"fused {len(group)} affine kernels into one", _names(group)))

        def flush():
            if run_:
                group, op = [run_[0]], run_[0].op
                for k in run_[1:]:
                    both = compose(op, k.op)
                    if both is None:  # would overflow float32: keep the kernels apart
                        fused(group, op)
                        group, op = [k], k.op
                    else:
                        group.append(k)
                        op = both
                fused(group, op)
            run_.clear()

        for k in sp.kernels:
            if run_ and not fusable(run_[-1], k):
                flush()
            run_.append(k)
        flush()
        sites.append(SitePlan(sp.site, tuple(out)))
    return evolve(plan, sites=tuple(sites), changes=tuple(changes))
