"""The checked program: what the checker hands to layout and lowering.

Names are resolved, params evaluated (with ``--set`` overrides), vectors
loaded and folded (a folded operand is a numpy float64 array, or a
:class:`~steerc.ir.values.PerLayer` bank whose row is chosen per layer),
gates normalised so each comparison reads ``probe OP threshold``. Sites
keep their selectors: turning ``resid_post[25%:75%]`` into layers needs a
model, which is the layout pass's business.
"""

from __future__ import annotations

from typing import Union

from steerc.core.record import field, frozen
from steerc.core.source import Span
from steerc.ir import nodes as ir
from steerc.ir.values import PerLayer

Operand = Union["numpy.ndarray", PerLayer]  # noqa: F821 - numpy is imported where operands are made

SITE_KINDS = ("resid_pre", "resid_post", "attn_out", "mlp_out", "head")


def _span():
    return field(default=None, eq=False, repr=False, kw_only=True)


@frozen
class SitePattern:
    kind: str
    layers: tuple[ir.SelAtom, ...]
    heads: tuple[ir.SelAtom, ...] | None = None
    span: Span | None = _span()


# ------------------------------------------------------------------- gates


@frozen
class GateCompare:
    probe: str
    op: str  # < <= > >=
    threshold: float
    span: Span | None = _span()
    # a threshold that is `coefficient * <per-request param>` (the threshold above is at the param's default)
    param: str | None = None
    coefficient: float | None = None


@frozen
class GateAll:
    parts: tuple[Gate, ...]


@frozen
class GateAny:
    parts: tuple[Gate, ...]


@frozen
class GateNegate:
    operand: Gate


Gate = Union[GateCompare, GateAll, GateAny, GateNegate]


def gate_text(g: Gate, fmt=None) -> str:
    """A gate as written, thresholds through ``fmt`` (default: 4 significant digits).

    >>> gate_text(GateAll((GateCompare("p", ">", 0.5), GateNegate(GateCompare("q", "<=", 0.125)))))
    '(p > 0.5 and not (q <= 0.125))'
    """
    fmt = fmt or (lambda x: f"{x:.4g}")
    if isinstance(g, GateCompare):
        if g.param is not None:
            return f"{g.probe} {g.op} {fmt(g.threshold)} (= {fmt(g.coefficient)} * {g.param})"
        return f"{g.probe} {g.op} {fmt(g.threshold)}"
    if isinstance(g, GateNegate):
        return f"not ({gate_text(g.operand, fmt)})"
    joiner = " and " if isinstance(g, GateAll) else " or "
    return "(" + joiner.join(gate_text(p, fmt) for p in g.parts) + ")"


def gate_probes(g) -> list[str]:
    """Probe names a gate reads, in order of first use: a checked gate, or the same gate as data (tuples or
    lists: ``("cmp", probe, op, x)``, ``("and"|"or", parts)``, ``("not", g)``, as
    ``steerc.targets.hooks.gate_data`` and a vLLM plan's boot section write it).

    >>> gate_probes(["or", [["cmp", "p", ">", 0], ["not", ["cmp", "q", "<", 1]], ["cmp", "p", "<", 2]]])
    ['p', 'q']
    """
    if isinstance(g, (tuple, list)):
        if g[0] == "cmp":
            return [g[1]]
        parts = [g[1]] if g[0] == "not" else g[1]
    elif isinstance(g, GateCompare):
        return [g.probe]
    else:
        parts = [g.operand] if isinstance(g, GateNegate) else g.parts
    seen: list[str] = []
    for part in parts:
        for name in gate_probes(part):
            if name not in seen:
                seen.append(name)
    return seen


def gate_leaves(g) -> list:
    """A gate's comparisons as data (``("cmp", probe, op, x)``), each occurrence once, depth first.

    >>> gate_leaves(["or", [["cmp", "p", ">", 0], ["not", ["cmp", "q", "<", 1]], ["cmp", "p", "<", 2]]])
    [['cmp', 'p', '>', 0], ['cmp', 'q', '<', 1], ['cmp', 'p', '<', 2]]
    """
    if g[0] == "cmp":
        return [g]
    return [leaf for part in ([g[1]] if g[0] == "not" else g[1]) for leaf in gate_leaves(part)]


def gate_truth(g, bits: int) -> bool:
    """A data gate's value when its i-th comparison (:func:`gate_leaves` order) holds where bit i of ``bits`` is
    set: a gate as a truth table over its comparisons.

    >>> [gate_truth(["and", [["cmp", "p", ">", 0], ["not", ["cmp", "q", "<", 1]]]], b) for b in range(4)]
    [False, True, False, False]
    """
    def walk(node, i: int) -> tuple[bool, int]:
        if node[0] == "cmp":
            return bool(bits >> i & 1), i + 1
        if node[0] == "not":
            value, i = walk(node[1], i)
            return not value, i
        values = []
        for part in node[1]:
            value, i = walk(part, i)
            values.append(value)
        return (all(values) if node[0] == "and" else any(values)), i

    return walk(g, 0)[0]


# ----------------------------------------------------------------- readouts


@frozen(eq=False)
class Readout:
    kind: str  # cosine | projected_cosine | subspace_cosine | dot | norm | sae_feature
    vectors: tuple[Operand, ...] = ()  # sae_feature: (W_enc[:, i], b_dec as subtracted from the input)
    bias: float = 0.0  # dot: b; sae_feature: b_enc[i]
    threshold: float = 0.0  # sae_feature: the JumpReLU threshold[i] (0 for a standard SAE)
    spans: tuple[Span | None, ...] = field(default=(), eq=False, repr=False, kw_only=True)  # of `vectors`
    sae: object = field(default=None, eq=False, repr=False, kw_only=True)  # sae_feature's SAE (steerc.io.sae)
    feature: int | None = field(default=None, kw_only=True)  # sae_feature's index


@frozen(eq=False)
class Probe:
    name: str
    site: SitePattern
    readout: Readout
    pool: str  # prompt.mean | prompt.last | token
    span: Span | None = _span()
    pool_span: Span | None = _span()
    read_span: Span | None = _span()

    @property
    def per_token(self) -> bool:
        return self.pool == "token"


# --------------------------------------------------------------------- ops


@frozen(eq=False)
class Operation:
    """One op with folded operands.

    kind: add (vector), scale (factor: float or vector), set (vector),
    suppress, ablate (directions), clamp (direction, value), rotate
    (directions = (b1, b2), angle in radians, mode "to" | "by"), loreft
    (tensors = (R, W, b): float64 arrays [r, d], [r, d] and [r]; no vectors,
    since none of them is one vector of the site's width), clamp_feature
    (vectors = (W_dec[i],), scalar = the target c, mode = the SAE's
    architecture, "standard" | "jumprelu"; tensors = (W_enc[:, i], the b_dec
    subtracted from the input (zeros without apply_b_dec_to_input),
    [b_enc[i], threshold[i]] (0 for a standard SAE)); sae and feature).
    """

    kind: str
    vectors: tuple[Operand, ...] = ()
    scalar: float | None = None
    mode: str | None = None
    # add only: factors of the generation step that multiply the vector, sorted:
    # ("ramp", n, 0.0), ("decay", r, 0.0), ("window", a, b) (see spec/language.md, schedules)
    schedule: tuple[tuple[str, float, float], ...] = ()
    text: str = ""  # the operation as written (canonical layout), for explain
    span: Span | None = _span()
    operand_spans: tuple[Span | None, ...] = field(default=(), eq=False, repr=False, kw_only=True)  # of `vectors`
    tensors: tuple = field(default=(), kw_only=True)  # loreft's (R, W, b); clamp_feature's (enc, b_dec, [b_enc, θ])
    tensor_spans: tuple[Span | None, ...] = field(default=(), eq=False, repr=False, kw_only=True)  # of `tensors`
    sae: object = field(default=None, eq=False, repr=False, kw_only=True)  # clamp_feature's SAE (steerc.io.sae)
    feature: int | None = field(default=None, kw_only=True)  # clamp_feature's feature index


@frozen(eq=False)
class Intervention:
    name: str
    index: int  # position among the program's interventions (source order)
    site: SitePattern
    op: Operation
    scopes: tuple[ir.Scope, ...]
    gate: Gate | None
    preserve_norm: bool
    span: Span | None = _span()
    gate_span: Span | None = _span()
    # (role, per-request param, coefficient): the operand of `role` is `coefficient * param` (the op holds
    # it at the param's default). Roles: bias (add, set), scale, target (clamp), angle (rotate).
    bindings: tuple[tuple[str, str, object], ...] = field(default=(), eq=False)


# -------------------------------------------------------------- constraint


@frozen(eq=False)
class Constraint:
    """kind: json_schema (value: dict), regex / grammar (value: str), choice (value: tuple)."""

    kind: str
    value: object
    text: str | None = None  # the schema/grammar/regex text as written
    origin: str | None = None  # the file it came from, for `from "..."`
    span: Span | None = _span()


@frozen(eq=False)
class ModelAssertion:
    key: str
    value: object
    span: Span | None = _span()


@frozen(eq=False)
class CheckedProgram:
    source_name: str
    source_sha256: str
    params: dict[str, float]
    assertions: tuple[ModelAssertion, ...]
    probes: dict[str, Probe]
    interventions: tuple[Intervention, ...]
    constraint: Constraint | None
    # per-request params: name -> (default, lowest, highest); bounds are None when not declared
    request_params: dict[str, tuple[float, float | None, float | None, Span | None]] = field(factory=dict)
