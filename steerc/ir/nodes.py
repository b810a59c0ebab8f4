"""The program IR: one frozen, slotted class per construct of the language.

The frontend builds these straight from the parse tree; they say what the
user wrote, with names unresolved and vectors not yet loaded. Every node has
a ``span`` excluded from equality and hashing, so two programs that mean the
same thing compare equal wherever and however they were laid out.

>>> a = Add(Name("joy"))
>>> b = Add(Name("joy", span=None))
>>> a == b and hash(a) == hash(b)
True
"""

from __future__ import annotations

from typing import Union

from steerc.core.record import field, frozen
from steerc.core.source import Span


def _span():
    return field(default=None, eq=False, repr=False, kw_only=True)


def _text():
    # The text as written (numbers, strings): kept for `steerc fmt`, not meaning.
    return field(default="", eq=False, repr=False, kw_only=True)


# ----------------------------------------------------------------- literals


@frozen
class Number:
    value: float
    text: str = _text()
    span: Span | None = _span()


@frozen
class Degrees:
    """``30deg``: ``value`` is in degrees as written."""

    value: float
    text: str = _text()
    span: Span | None = _span()


@frozen
class Str:
    value: str
    long: bool = field(default=False, eq=False, repr=False, kw_only=True)
    span: Span | None = _span()


@frozen
class Bool:
    value: bool
    span: Span | None = _span()


# -------------------------------------------------------------- expressions


@frozen
class Name:
    id: str
    span: Span | None = _span()


@frozen
class Neg:
    operand: Expr
    span: Span | None = _span()


@frozen
class BinOp:
    op: str  # one of + - * /
    left: Expr
    right: Expr
    span: Span | None = _span()


@frozen
class Keyword:
    name: str
    value: Arg
    span: Span | None = _span()


@frozen
class Call:
    func: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[Keyword, ...] = ()
    span: Span | None = _span()
    func_span: Span | None = _span()


@frozen
class VectorLit:
    items: tuple[Expr, ...]
    span: Span | None = _span()


@frozen
class Index:
    """``s[i]``: feature ``i`` of the SAE ``s`` (as a vector, its decoder row ``W_dec[i]``)."""

    base: Name
    index: Expr
    span: Span | None = _span()


Expr = Union[Number, Degrees, Name, Neg, BinOp, Call, VectorLit, Index]
Arg = Union[Expr, Str, Bool]


# ----------------------------------------------------------------- sites


@frozen
class SelIndex:
    index: int
    span: Span | None = _span()


@frozen
class SelPercent:
    percent: float
    text: str = _text()
    span: Span | None = _span()


Bound = Union[SelIndex, SelPercent]


@frozen
class SelSlice:
    start: Bound | None
    stop: Bound | None
    span: Span | None = _span()


@frozen
class SelAll:
    span: Span | None = _span()


@frozen
class SelGroup:
    """A parenthesised list on one axis of ``head[...]``."""

    items: tuple[SelAtom, ...]
    span: Span | None = _span()


SelAtom = Union[SelIndex, SelPercent, SelSlice, SelAll]


@frozen
class SiteRef:
    """``name[items]`` as written; the checker gives the items their axes."""

    name: str
    items: tuple[SelAtom | SelGroup, ...]
    span: Span | None = _span()
    name_span: Span | None = _span()


# ----------------------------------------------------------------- scopes


@frozen
class PosSlice:
    start: int | None
    stop: int | None
    span: Span | None = _span()


@frozen
class PosIndex:
    index: int
    span: Span | None = _span()


@frozen
class ScopeAll:
    span: Span | None = _span()


@frozen
class ScopePrompt:
    sel: PosSlice | PosIndex | None = None
    span: Span | None = _span()


@frozen
class ScopeGenerated:
    sel: PosSlice | PosIndex | None = None
    span: Span | None = _span()


@frozen
class ScopePositions:
    positions: tuple[int, ...]
    span: Span | None = _span()


@frozen
class ScopeAfter:
    text: Str
    span: Span | None = _span()


Scope = Union[ScopeAll, ScopePrompt, ScopeGenerated, ScopePositions, ScopeAfter]


# ------------------------------------------------------------------ gates


@frozen
class Compare:
    left: Expr
    op: str  # one of < <= > >=
    right: Expr
    span: Span | None = _span()


@frozen
class GateAnd:
    left: Gate
    right: Gate
    span: Span | None = _span()


@frozen
class GateOr:
    left: Gate
    right: Gate
    span: Span | None = _span()


@frozen
class GateNot:
    operand: Gate
    span: Span | None = _span()


Gate = Union[Compare, GateAnd, GateOr, GateNot]


# -------------------------------------------------------------- readouts


@frozen
class Cosine:
    vector: Expr
    span: Span | None = _span()


@frozen
class ProjectedCosine:
    """CAST's condition: ``cos(h, tanh(P h))``, ``P`` the projector onto the vectors' span."""

    vectors: tuple[Expr, ...]
    span: Span | None = _span()


@frozen
class SubspaceCosine:
    """``cos(h, P h)``: the cosine of the angle between ``h`` and the vectors' span."""

    vectors: tuple[Expr, ...]
    span: Span | None = _span()


@frozen
class Offset:
    sign: str  # "+" or "-"
    value: Expr
    span: Span | None = _span()


@frozen
class Dot:
    """``dot(w) + b``: offsets kept term by term as written."""

    vector: Expr
    offsets: tuple[Offset, ...] = ()
    span: Span | None = _span()


@frozen
class Norm:
    span: Span | None = _span()


@frozen
class FeatureReadout:
    """``read s[i]``: SAE feature ``i``'s activation ``f_i(h)``, by the SAE's own encoder."""

    feature: Index
    span: Span | None = _span()


Readout = Union[Cosine, ProjectedCosine, SubspaceCosine, Dot, Norm, FeatureReadout]


@frozen
class Pool:
    kind: str  # "prompt.mean" | "prompt.last" | "token" once checked
    span: Span | None = _span()


# ----------------------------------------------------------------- ops


@frozen
class Add:
    vector: Expr
    span: Span | None = _span()


@frozen
class Scale:
    factor: Expr
    span: Span | None = _span()


@frozen
class Set:
    vector: Expr
    span: Span | None = _span()


@frozen
class Suppress:
    span: Span | None = _span()


@frozen
class Ablate:
    directions: tuple[Expr, ...]
    span: Span | None = _span()


@frozen
class Clamp:
    direction: Expr
    value: Expr
    span: Span | None = _span()


@frozen
class Rotate:
    first: Expr
    second: Expr
    mode: str  # "to" | "by"
    angle: Expr
    span: Span | None = _span()


@frozen
class LoReFT:
    """``loreft R, W, b``: pyreft's LoReFT, ``h + Rᵀ (W h + b − R h)`` (``R``, ``W`` matrices, ``b`` a vector)."""

    rotation: Expr
    weight: Expr
    bias: Expr
    span: Span | None = _span()


@frozen
class ClampFeature:
    """``clamp feature s[i] to c``: SAE feature ``i``'s activation set to ``c``,
    ``h + (c − f_i(h)) · W_dec[i]`` (never the projection clamp)."""

    feature: Expr
    value: Expr
    span: Span | None = _span()


Op = Union[Add, Scale, Set, Suppress, Ablate, Clamp, Rotate, LoReFT, ClampFeature]


# ---------------------------------------------------------- statements


@frozen
class ModelField:
    key: str
    value: Str | Number | Bool
    span: Span | None = _span()


@frozen
class ModelBlock:
    fields: tuple[ModelField, ...]
    span: Span | None = _span()


@frozen
class ParamDecl:
    name: str
    value: Expr
    span: Span | None = _span()
    name_span: Span | None = _span()
    # `in [lo, hi]`: the values --set (and a request) may give; `per request`: a serve request may set it
    range: tuple[Expr, Expr] | None = None
    per_request: bool = False
    range_span: Span | None = _span()


@frozen
class VectorDecl:
    name: str
    value: Expr
    span: Span | None = _span()
    name_span: Span | None = _span()


@frozen
class MatrixDecl:
    """``matrix NAME = load(...)``: a 2-D tensor (``[rows, columns]``), for ``loreft``."""

    name: str
    value: Expr
    span: Span | None = _span()
    name_span: Span | None = _span()


@frozen
class SaeDecl:
    """``sae NAME = sae("folder")``: a SAELens SAE folder (``cfg.json`` and ``sae_weights.safetensors``)."""

    name: str
    value: Expr
    span: Span | None = _span()
    name_span: Span | None = _span()


@frozen
class ProbeDecl:
    name: str
    site: SiteRef | None
    readout: Readout | None
    pool: Pool | None
    span: Span | None = _span()
    name_span: Span | None = _span()


@frozen
class Preserve:
    """The ``preserve norm`` line."""

    span: Span | None = _span()


@frozen
class InterventionDecl:
    name: str
    site: SiteRef | None
    op: Op | None
    scopes: tuple[Scope, ...] | None = None  # None: no `tokens` line (= all)
    gate: Gate | None = None
    preserve: Preserve | None = None
    span: Span | None = _span()
    name_span: Span | None = _span()


@frozen
class ConstrainText:
    """``constrain json_schema|regex|grammar`` with inline text or ``from`` a file."""

    kind: str
    value: Str
    from_file: bool
    span: Span | None = _span()


@frozen
class ConstrainChoice:
    options: tuple[Str, ...]
    span: Span | None = _span()


Constraint = Union[ConstrainText, ConstrainChoice]
Statement = Union[ModelBlock, ParamDecl, VectorDecl, MatrixDecl, SaeDecl, ProbeDecl, InterventionDecl, Constraint]


@frozen
class Comment:
    line: int
    column: int
    text: str  # including the leading '#'
    own_line: bool  # nothing but whitespace before it on its line


@frozen
class Program:
    version: int
    statements: tuple[Statement, ...]
    span: Span | None = _span()
    version_span: Span | None = _span()
    comments: tuple[Comment, ...] = field(default=(), eq=False, repr=False, kw_only=True)

    def of_type(self, cls) -> list:
        return [s for s in self.statements if isinstance(s, cls)]


NODE_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Number, Degrees, Str, Bool, Name, Neg, BinOp, Keyword, Call, VectorLit, Index,
        SelIndex, SelPercent, SelSlice, SelAll, SelGroup, SiteRef,
        PosSlice, PosIndex, ScopeAll, ScopePrompt, ScopeGenerated, ScopePositions, ScopeAfter,
        Compare, GateAnd, GateOr, GateNot,
        Cosine, ProjectedCosine, SubspaceCosine, Offset, Dot, Norm, FeatureReadout, Pool,
        Add, Scale, Set, Suppress, Ablate, Clamp, Rotate, LoReFT, ClampFeature,
        ModelField, ModelBlock, ParamDecl, VectorDecl, MatrixDecl, SaeDecl, ProbeDecl, Preserve, InterventionDecl,
        ConstrainText, ConstrainChoice, Comment, Program,
    )
}
