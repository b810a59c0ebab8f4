"""The site plan: what every target lowers from.

A :class:`Plan` lists, per concrete canonical site in forward order, the
primitive kernels to apply there in order, and the probes to read:

* :class:`Affine` — ``h -> s * h + b`` (``add``, ``scale``, ``set``,
  ``suppress``; ``s`` a scalar or a vector, ``b`` a vector or absent);
* :class:`Project` — ``h -> h - Q (Q^T h) + Q t`` with ``Q`` orthonormal rows
  (``ablate``: ``t = 0``; ``clamp u to c``: ``Q = [u/|u|]``, ``t = [c]``);
* :class:`Rotate` — angular steering in the plane ``(e1, e2)``;
* :class:`~steerc.ir.kernels.loreft.LoReFT` — pyreft's ``h + Rᵀ (W h + b − R h)``;
* :class:`~steerc.ir.kernels.sae_clamp.SaeClamp` — an SAE feature set to ``c``, ``h + (c − f_i(h)) W_dec[i]``.

Each kind of kernel is one module of :mod:`steerc.ir.kernels` (its op class, operands, encodings,
verifier, explanation and torch maths); engines and formats dispatch through its table.

Each :class:`Kernel` carries its token scope, its gate, whether it
preserves the norm of its input, and where it came from (provenance is not
part of equality, so fusion compares meaning).

A plan may declare per-request params (:class:`Param`): a kernel operand or
a gate threshold that is ``coefficient * value`` records a :class:`Binding`,
and :func:`rebind` gives the plan for other values — what serve workers,
``hf.install(..., params=...)`` and the vllm target's ``set_params`` run.
Bound kernels are never fused or dropped, so every value finds its kernel.

Canonical sites: ``resid_post[l]`` stands for ``resid_pre[l+1]`` too; the
only ``resid_pre`` site in a plan is ``resid_pre[0]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

from steerc.core.record import evolve, field, frozen
from steerc.core.source import Span
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.checked import Constraint, Gate
from steerc.ir.kernels import Affine, Project, Rotate, kind_of  # noqa: F401 (re-exported)
from steerc.ir.kernels.loreft import LoReFT
from steerc.ir.kernels.sae_clamp import SaeClamp
from steerc.ir.param_values import ParamError, check_values  # noqa: F401 (re-exported)
from steerc.ir.values import Vec

SUB_ORDER = {"resid_pre": 0, "head": 1, "attn_out": 2, "mlp_out": 3, "resid_post": 4}


@frozen(order=False)
class Site:
    kind: str  # resid_pre (layer 0 only) | resid_post | attn_out | mlp_out | head
    layer: int
    head: int | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.layer, SUB_ORDER[self.kind], -1 if self.head is None else self.head)

    @property
    def text(self) -> str:
        return f"head[{self.layer}, {self.head}]" if self.kind == "head" else f"{self.kind}[{self.layer}]"


# The op of a kernel: an instance of a kernel kind's op class (steerc.ir.kernels, one module per kind).
Op = Union[Affine, Project, Rotate, LoReFT, SaeClamp]  # the built-in kinds; a registered kind's op is an Op too


@frozen
class Provenance:
    intervention: str
    span: Span | None = field(default=None, eq=False)
    note: str = ""


@frozen
class Binding:
    """The operand of ``role`` is ``coefficient * <param>``.

    Roles: ``bias`` (an add's or set's vector, a Vec), ``scale`` (a float or
    a Vec), ``target`` (a clamp's value), ``angle`` (a rotation, radians).
    """

    role: str
    param: str
    coefficient: float | Vec


@frozen
class Param:
    """A per-request param: its default (the compiled value) and its declared range, if any."""

    name: str
    default: float
    low: float | None = None
    high: float | None = None


@frozen
class Kernel:
    op: Op
    scope: tuple[ir.Scope, ...]
    gate: Gate | None = None
    preserve_norm: bool = False
    provenance: tuple[Provenance, ...] = field(default=(), eq=False)
    bindings: tuple[Binding, ...] = ()

    @property
    def bound(self) -> bool:
        """Whether a per-request param sets part of this kernel (its operand or a gate threshold)."""
        return bool(self.bindings) or _gate_bound(self.gate)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.intervention for p in self.provenance))


@frozen
class SitePlan:
    site: Site
    kernels: tuple[Kernel, ...]


@frozen
class ProbePlan:
    name: str
    site: Site
    kind: str  # cosine | projected_cosine | subspace_cosine | dot | norm | sae_feature
    # cosine: (v,); projected_cosine, subspace_cosine: an orthonormal basis; dot: (w,); sae_feature: (enc, b_dec)
    vectors: tuple[Vec, ...] = ()
    bias: float = 0.0  # dot: b; sae_feature: b_enc[i]
    pool: str = "token"
    threshold: float = 0.0  # sae_feature: JumpReLU's threshold[i] (0: ReLU, a standard SAE)
    about: str = field(default="", eq=False)  # sae_feature: the SAE and feature, for explain (no format carries it)


@frozen
class Change:
    """Something an optimisation did, for ``steerc explain``."""

    pass_name: str
    site: Site
    what: str
    interventions: tuple[str, ...] = ()


@frozen
class Plan:
    source_name: str = field(eq=False)  # where it came from, not what it means
    source_sha256: str = field()
    facts_fingerprint: str
    family: str
    sites: tuple[SitePlan, ...]
    probes: tuple[ProbePlan, ...] = ()
    constraint: Constraint | None = field(default=None, eq=False)
    changes: tuple[Change, ...] = field(default=(), eq=False)
    params: tuple[Param, ...] = ()

    def site(self, site: Site) -> SitePlan | None:
        return next((s for s in self.sites if s.site == site), None)

    @property
    def kernel_count(self) -> int:
        return sum(len(s.kernels) for s in self.sites)

    def probe(self, name: str) -> ProbePlan:
        return next(p for p in self.probes if p.name == name)


# ------------------------------------------------------------ per-request params


def _gate_bound(g) -> bool:
    if g is None:
        return False
    if isinstance(g, ck.GateCompare):
        return g.param is not None
    if isinstance(g, ck.GateNegate):
        return _gate_bound(g.operand)
    return any(_gate_bound(p) for p in g.parts)


def coefficient_bounds(plan: Plan):
    """(param, |coefficient| max) for every binding and bound threshold of the plan: what
    :func:`check_values` needs to refuse a value that would overflow float32."""

    def gate(g):
        if isinstance(g, ck.GateCompare):
            if g.param is not None:
                yield g.param, abs(g.coefficient)
        elif isinstance(g, ck.GateNegate):
            yield from gate(g.operand)
        elif g is not None:
            for p in g.parts:
                yield from gate(p)

    for sp in plan.sites:
        for k in sp.kernels:
            for b in k.bindings:
                c = b.coefficient
                yield b.param, float(abs(c)) if isinstance(c, float) else float(abs(c.array).max(initial=0.0))
            yield from gate(k.gate)


def declared_problem(rows) -> tuple[int, str, str] | None:
    """The first fault of params written as data (``{"name", "default", "min", "max"}`` rows, as the vllm
    and serve formats hold them): (row, key, message), or None. Names are unique; a range has both
    ends or neither and holds its default."""
    names = set()
    for i, p in enumerate(rows or ()):
        if p["name"] in names:
            return i, "name", f"param {str(p['name'])[:40]!r} is declared twice"
        names.add(p["name"])
        if (p["min"] is None) != (p["max"] is None):
            return i, "min", "a range has both ends (or neither)"
        if p["min"] is not None and not p["min"] <= p["default"] <= p["max"]:
            return i, "default", f"{p['default']!r} is outside [{p['min']!r}, {p['max']!r}]"
    return None


def check_params(plan: Plan, values: Mapping | None) -> dict[str, float]:
    """Every per-request param's value: ``values`` checked (names, types, ranges), defaults for the rest.

    Raises :class:`ParamError` naming the param: one the plan does not
    declare, a value that is not a finite number (booleans are not numbers
    here), one outside the declared range, or one that would push a steered
    value past float32.
    """
    return check_values(plan.params, values, coefficient_bounds(plan))


def _times(coefficient, value: float):
    import numpy as np

    if isinstance(coefficient, Vec):
        return Vec(coefficient.array.astype(np.float64) * value)
    return float(coefficient) * value


def _rebind_op(op: Op, bindings, values) -> Op:
    kind = kind_of(op)
    for b in bindings:
        op = kind.bind(op, b.role, _times(b.coefficient, values[b.param]))
    return op


def _rebind_gate(g, values):
    if g is None:
        return None
    if isinstance(g, ck.GateCompare):
        return g if g.param is None else evolve(g, threshold=g.coefficient * values[g.param])
    if isinstance(g, ck.GateNegate):
        return evolve(g, operand=_rebind_gate(g.operand, values))
    return evolve(g, parts=tuple(_rebind_gate(p, values) for p in g.parts))


def rebind(plan: Plan, values: Mapping | None = None) -> Plan:
    """The plan with its per-request params at ``values`` (checked by :func:`check_params`).

    A bound operand becomes ``coefficient * value`` (one float64 product,
    then float32, as ``--set`` folds ``value * vector``); params not given
    keep their defaults. Bindings stay, so a rebound plan rebinds again.
    """
    if not plan.params:
        if values:
            check_params(plan, values)  # names the unknown param
        return plan
    full = check_params(plan, values)
    sites = []
    for sp in plan.sites:
        kernels = tuple(
            evolve(k, op=_rebind_op(k.op, k.bindings, full), gate=_rebind_gate(k.gate, full)) if k.bound else k
            for k in sp.kernels)
        sites.append(SitePlan(sp.site, kernels))
    return evolve(plan, sites=tuple(sites))
