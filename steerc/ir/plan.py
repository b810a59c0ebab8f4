"""The site plan: what every target lowers from.

A :class:`Plan` lists, per concrete canonical site in forward order, the
primitive kernels to apply there in order, and the probes to read:

* :class:`Affine` — ``h -> s * h + b`` (``add``, ``scale``, ``set``,
  ``suppress``; ``s`` a scalar or a vector, ``b`` a vector or absent);
* :class:`Project` — ``h -> h - Q (Q^T h) + Q t`` with ``Q`` orthonormal rows
  (``ablate``: ``t = 0``; ``clamp u to c``: ``Q = [u/|u|]``, ``t = [c]``);
* :class:`Rotate` — angular steering in the plane ``(e1, e2)``.

Each :class:`Kernel` carries its token scope, its gate, whether it
preserves the norm of its input, and where it came from (provenance is not
part of equality, so fusion compares meaning).

Canonical sites: ``resid_post[l]`` stands for ``resid_pre[l+1]`` too; the
only ``resid_pre`` site in a plan is ``resid_pre[0]``.
"""

from __future__ import annotations

from typing import Union

from attrs import field, frozen

from steerc.ir import nodes as ir
from steerc.ir.checked import Constraint, Gate
from steerc.ir.values import Vec
from steerc.source import Span

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


@frozen
class Affine:
    scale: float | Vec  # a scalar, or one factor per component
    bias: Vec | None = None
    # Factors of the generation step that multiply the bias, sorted (empty: constant).
    # ("ramp", n, 0), ("decay", r, 0), ("window", a, b); see schedule_factor in interpret.
    schedule: tuple[tuple[str, float, float], ...] = ()

    @property
    def kills(self) -> bool:
        """True when the output does not depend on the input (``set``, ``suppress``)."""
        if isinstance(self.scale, Vec):
            return not self.scale.array.any()
        return self.scale == 0.0


@frozen
class Project:
    basis: tuple[Vec, ...]  # orthonormal rows
    target: tuple[float, ...] | None = None  # None: ablate (all zeros)


@frozen
class Rotate:
    e1: Vec
    e2: Vec  # unit, orthogonal to e1
    angle: float  # radians
    mode: str  # "to" | "by"


Op = Union[Affine, Project, Rotate]


@frozen
class Provenance:
    intervention: str
    span: Span | None = field(default=None, eq=False)
    note: str = ""


@frozen
class Kernel:
    op: Op
    scope: tuple[ir.Scope, ...]
    gate: Gate | None = None
    preserve_norm: bool = False
    provenance: tuple[Provenance, ...] = field(default=(), eq=False)

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
    kind: str  # cosine | projected_cosine | dot | norm
    vectors: tuple[Vec, ...] = ()  # cosine: (v,); projected_cosine: orthonormal basis; dot: (w,)
    bias: float = 0.0
    pool: str = "token"


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

    def site(self, site: Site) -> SitePlan | None:
        return next((s for s in self.sites if s.site == site), None)

    @property
    def kernel_count(self) -> int:
        return sum(len(s.kernels) for s in self.sites)

    def probe(self, name: str) -> ProbePlan:
        return next(p for p in self.probes if p.name == name)
