"""Hypothesis strategies for Steer programs.

:func:`programs` builds random, well-formed programs directly as IR
(:mod:`steerc.ir.nodes`), the way the parser would build them: every name is
unique and declared before it is used, expressions are well typed (params
are scalars, vectors are width-4 literals, names and their algebra), probes
read one site, every operation, site form, scope form, gate shape and
constraint form of the language appears. No spans are set (they are not part
of equality).

:func:`commented` adds random ``#`` comments (own-line and trailing) to the
formatted text of a program; :func:`mutated` makes arbitrary, mostly invalid
text edits of a source (for fuzzing the frontend and the checker).

>>> from hypothesis import given, settings
>>> @settings(max_examples=5, deadline=None)
... @given(programs())
... def check(p):
...     assert p.version == 1
>>> check()
"""

from __future__ import annotations

import re

from hypothesis import strategies as st

from steerc.core import record
from steerc.ir import nodes as ir

KEYWORDS = frozenset(
    """steer model param vector matrix sae probe intervention constrain at read pool tokens when preserve norm
    add scale set suppress ablate clamp feature rotate loreft in to by all prompt generated after and or not true false
    cosine projected_cosine subspace_cosine dot json_schema regex grammar choice from deg load normalize""".split()
)
SITES = ("resid_pre", "resid_post", "attn_out", "mlp_out")
WIDTH = 4  # the width of every vector these programs build

# ---------------------------------------------------------------- atoms

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
identifiers = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(_LETTERS + "_"),
    st.text(_LETTERS + "0123456789_", max_size=7),
).filter(lambda s: s not in KEYWORDS)

# Spellings of numbers a user may write; drawing from a fixed pool keeps programs small.
NUMBER_SPELLINGS = ("0", "1", "2", "7", "10", "250", "0.0", "0.5", "2.50", "1.", ".5", ".125", "4.0", "2e-3",
                    "1.5E+2", "3e0", "1e1", "12.375", "0.001")


def _number_value(text: str):
    return int(text) if text.isdigit() else float(text)


_NUMBER_POOL = tuple(ir.Number(_number_value(t), text=t) for t in NUMBER_SPELLINGS) + tuple(
    ir.Number(_number_value(t)) for t in NUMBER_SPELLINGS  # no spelling: the formatter picks one
)


def numbers(nonzero: bool = False) -> st.SearchStrategy:
    """A non-negative number literal (a minus sign is a ``Neg``), with or without its spelling."""
    pool = [n for n in _NUMBER_POOL if n.value != 0] if nonzero else list(_NUMBER_POOL)
    return st.sampled_from(pool)


def degrees() -> st.SearchStrategy:
    return st.sampled_from(_NUMBER_POOL).map(lambda n: ir.Degrees(n.value, text=n.text))


_STRING_CHARS = st.characters(blacklist_categories=("Cs",))
_LONG_CHARS = st.characters(
    blacklist_categories=("Cs", "Cc"), blacklist_characters='"'
) | st.sampled_from(["\n", "\t", '"'])


@st.composite
def strings(draw, min_size: int = 0, max_size: int = 12, allow_long: bool = True) -> ir.Str:
    """A string: any text (escapes needed), or a ``\"\"\"...\"\"\"`` one (raw)."""
    if allow_long and draw(st.integers(0, 3)) == 0:
        value = draw(st.text(_LONG_CHARS, min_size=min_size, max_size=max_size))
        # A long string cannot hold `\"\"\"` nor end in a quote (its end would be ambiguous).
        value = value.replace('"""', '""x')
        if value.endswith('"'):
            value += "x"
        return ir.Str(value, long=True)
    return ir.Str(draw(st.text(_STRING_CHARS, min_size=min_size, max_size=max_size)))


def comments_text() -> st.SearchStrategy[str]:
    """The text of a comment, from ``#`` to the end of its line (no trailing blanks)."""
    body = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20)
    return body.map(lambda b: ("#" + b).rstrip())


# ----------------------------------------------------------- expressions
#
# Expression strategies are built once, with placeholder names (``$param``,
# ``$vector``, ``$probe``); :func:`_resolve` replaces each placeholder by a
# name declared so far (or by a literal when there is none). Building the
# strategies once keeps drawing fast.

_PARAM, _VECTOR, _PROBE = ir.Name("$param"), ir.Name("$vector"), ir.Name("$probe")
_MATRIX = ir.Name("$matrix")  # a declared matrix (programs() declares one before a loreft that needs it)
_SAE = ir.Name("$sae")  # a declared SAE (programs() declares one before a clamp feature that needs it)


class Scope:
    """What is declared so far while a program is being drawn."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.params: list[str] = []
        self.vectors: list[str] = []
        self.matrices: list[str] = []
        self.saes: list[str] = []
        self.probes: list[str] = []

    def fresh(self, draw) -> str:
        name = draw(identifiers.filter(lambda n: n not in self.names))
        self.names.add(name)
        return name


def _resolve(node, draw, scope: Scope):
    """``node`` with its placeholder names replaced by declared names."""
    if node is _PARAM:
        return ir.Name(draw(st.sampled_from(scope.params))) if scope.params else draw(numbers())
    if node is _VECTOR:
        if scope.vectors:
            return ir.Name(draw(st.sampled_from(scope.vectors)))
        return _resolve(draw(vector_literals), draw, scope)
    if node is _PROBE:
        return ir.Name(draw(st.sampled_from(scope.probes)))
    if node is _MATRIX:
        return ir.Name(draw(st.sampled_from(scope.matrices)))
    if node is _SAE:
        return ir.Name(draw(st.sampled_from(scope.saes)))
    if isinstance(node, tuple):
        return tuple(_resolve(n, draw, scope) for n in node)
    if not record.has(type(node)):
        return node
    changes = {}
    for f in record.fields(type(node)):
        if f.name.endswith("span") or f.name in ("text", "comments", "long"):
            continue
        value = getattr(node, f.name)
        new = _resolve(value, draw, scope)
        if new is not value:
            changes[f.name] = new
    return record.evolve(node, **changes) if changes else node


def _scalars(depth: int) -> st.SearchStrategy:
    leaf = st.one_of(numbers(), st.just(_PARAM))
    if depth <= 0:
        return leaf
    sub = _scalars(depth - 1)
    return st.one_of(
        leaf,
        leaf,
        sub.map(ir.Neg),
        st.builds(ir.BinOp, st.sampled_from("+-*"), sub, sub),
        st.builds(ir.BinOp, st.just("/"), sub, numbers(nonzero=True)),
    )


SCALAR = {d: _scalars(d) for d in range(3)}
"""Scalar expressions (numbers, params, unary minus, + - * /, never by a literal zero), by depth."""

vector_literals = st.lists(
    st.one_of(numbers(), numbers().map(ir.Neg), st.just(_PARAM)), min_size=WIDTH, max_size=WIDTH
).map(lambda xs: ir.VectorLit(tuple(xs)))


def _vectors(depth: int) -> st.SearchStrategy:
    leaf = st.one_of(vector_literals, st.just(_VECTOR), st.just(_VECTOR))
    if depth <= 0:
        return leaf
    sub = _vectors(depth - 1)
    scalar = SCALAR[1]
    return st.one_of(
        leaf,
        leaf,
        sub.map(ir.Neg),
        st.builds(ir.BinOp, st.sampled_from("+-"), sub, sub),
        st.builds(ir.BinOp, st.just("*"), scalar, sub),
        st.builds(ir.BinOp, st.just("*"), sub, scalar),
        st.builds(ir.BinOp, st.just("/"), sub, numbers(nonzero=True)),
        sub.map(lambda v: ir.Call("normalize", (v,))),
    )


VECTOR = {d: _vectors(d) for d in range(3)}
"""Vector expressions of width 4 (literals, names, algebra, ``normalize``), by depth."""


@st.composite
def loads(draw) -> ir.Call:
    """``load("...", key=..., per_layer=...)`` (parses; the file need not exist)."""
    kwargs = []
    if draw(st.booleans()):
        kwargs.append(ir.Keyword("key", draw(strings(min_size=1, allow_long=False))))
    if draw(st.booleans()):
        kwargs.append(ir.Keyword("per_layer", ir.Bool(draw(st.booleans()))))
    path = draw(strings(min_size=1, allow_long=False))
    return ir.Call("load", (path,), tuple(draw(st.permutations(kwargs))))


# ----------------------------------------------------------------- sites

_INDEX = st.integers(-6, 9).map(ir.SelIndex)


@st.composite
def percents(draw) -> ir.SelPercent:
    whole = draw(st.integers(0, 100))
    frac = draw(st.sampled_from(["", "", ".5", ".25"])) if whole < 100 else ""
    text = f"{whole}{frac}%"
    return ir.SelPercent(float(text[:-1]), text=text if draw(st.booleans()) else "")


def _bounds() -> st.SearchStrategy:
    return st.none() | _INDEX | percents()


sel_atoms = st.one_of(
    _INDEX,
    percents(),
    st.builds(ir.SelAll),
    st.builds(ir.SelSlice, _bounds(), _bounds()),
)

_head_axis = st.one_of(sel_atoms, st.lists(sel_atoms, min_size=1, max_size=3).map(lambda xs: ir.SelGroup(tuple(xs))))

sites = st.one_of(
    st.builds(lambda a, b: ir.SiteRef("head", (a, b)), _head_axis, _head_axis),
    *[
        st.lists(sel_atoms, min_size=1, max_size=3).map(lambda xs, n=name: ir.SiteRef(n, tuple(xs)))
        for name in SITES
    ],
)
"""Any site form: indices, negatives, slices with open ends, percents, lists, ``*``, head groups."""

_one = st.one_of(st.integers(-4, 3).map(ir.SelIndex), percents())
single_sites = st.one_of(
    st.builds(lambda a, b: ir.SiteRef("head", (a, b)), _one, _one),
    st.builds(lambda n, a: ir.SiteRef(n, (a,)), st.sampled_from(SITES), _one),
)
"""One site (what a probe reads): one layer, and one head for ``head``."""


# ----------------------------------------------------------------- scopes

_POS = st.integers(-9, 9)
_position_sel = st.one_of(
    st.none(),
    _POS.map(ir.PosIndex),
    st.builds(ir.PosSlice, st.none() | _POS, st.none() | _POS),
)

scopes = st.sampled_from([
    st.builds(ir.ScopeAll),
    st.builds(ir.ScopePrompt, _position_sel),
    st.builds(ir.ScopeGenerated, _position_sel),
    st.lists(st.integers(0, 40), min_size=1, max_size=4).map(lambda xs: ir.ScopePositions(tuple(xs))),
    strings(min_size=1, max_size=8).map(ir.ScopeAfter),
]).flatmap(lambda kind: kind)
"""Every token scope form (the kind is drawn first, so each comes about as often)."""


# ------------------------------------------------------------------ gates

_COMPARE = st.sampled_from(["<", "<=", ">", ">="])


def _gates(depth: int) -> st.SearchStrategy:
    scalar = SCALAR[1]
    compare = st.one_of(
        st.builds(ir.Compare, st.just(_PROBE), _COMPARE, scalar),
        st.builds(ir.Compare, scalar, _COMPARE, st.just(_PROBE)),
    )
    if depth <= 0:
        return compare
    sub = _gates(depth - 1)
    kinds = {
        "compare": compare,
        "and": st.builds(ir.GateAnd, sub, sub),
        "or": st.builds(ir.GateOr, sub, sub),
        "not": sub.map(ir.GateNot),
    }
    return st.sampled_from(["compare", "compare", "and", "or", "not"]).flatmap(kinds.__getitem__)


GATES = _gates(2)
"""and / or / not / parentheses over comparisons of probes with scalars, in both orders."""


# ------------------------------------------------------------ operations

_vec1 = VECTOR[1]
OPERATION_KINDS = {
    "add": _vec1.map(ir.Add),
    "scale": st.one_of(SCALAR[1], _vec1).map(ir.Scale),
    "set": _vec1.map(ir.Set),
    "suppress": st.builds(ir.Suppress),
    "ablate": st.lists(_vec1, min_size=1, max_size=3).map(lambda xs: ir.Ablate(tuple(xs))),
    "clamp": st.builds(ir.Clamp, _vec1, SCALAR[1]),
    "rotate": st.builds(ir.Rotate, _vec1, _vec1, st.sampled_from(["to", "by"]),
                        st.sampled_from([SCALAR[1], degrees()]).flatmap(lambda angle: angle)),
    "loreft": st.builds(ir.LoReFT, st.just(_MATRIX), st.just(_MATRIX), _vec1),
    "clamp feature": st.builds(ir.ClampFeature, st.builds(ir.Index, st.just(_SAE), st.integers(0, 99).map(ir.Number)),
                               SCALAR[1]),
}
# The kind is drawn first so that every operation is drawn about as often
# (a plain one_of favours the branches that draw less data).
OPERATIONS = st.sampled_from(sorted(OPERATION_KINDS)).flatmap(OPERATION_KINDS.__getitem__)
"""Every operation (placeholders unresolved)."""

READOUT_KINDS = {
    "cosine": _vec1.map(ir.Cosine),
    "projected_cosine": st.lists(_vec1, min_size=1, max_size=3).map(lambda xs: ir.ProjectedCosine(tuple(xs))),
    "subspace_cosine": st.lists(_vec1, min_size=1, max_size=3).map(lambda xs: ir.SubspaceCosine(tuple(xs))),
    "dot": st.builds(ir.Dot, _vec1,
                     st.lists(st.builds(ir.Offset, st.sampled_from("+-"), SCALAR[1]), max_size=2).map(tuple)),
    "norm": st.builds(ir.Norm),
    "s[i]": st.builds(ir.FeatureReadout, st.builds(ir.Index, st.just(_SAE), st.integers(0, 99).map(ir.Number))),
}
READOUTS = st.sampled_from(sorted(READOUT_KINDS)).flatmap(READOUT_KINDS.__getitem__)
"""Every readout (placeholders unresolved)."""


# ------------------------------------------------------------ statements

_MODEL_VALUES = {
    "family": st.sampled_from(["llama", "gpt2", "qwen2", "gemma2"]).map(ir.Str),
    "layers": st.integers(1, 80).map(ir.Number),
    "hidden": st.integers(1, 8192).map(ir.Number),
    "heads": st.integers(1, 64).map(ir.Number),
    "kv_heads": st.integers(1, 64).map(ir.Number),
    "head_dim": st.integers(1, 256).map(ir.Number),
    "intermediate": st.integers(1, 30000).map(ir.Number),
    "vocab": st.integers(1, 300000).map(ir.Number),
    "tied_embeddings": st.booleans().map(ir.Bool),
    "parallel_residual": st.booleans().map(ir.Bool),
}


@st.composite
def model_blocks(draw) -> ir.ModelBlock:
    keys = draw(st.lists(st.sampled_from(sorted(_MODEL_VALUES)), unique=True, max_size=4))
    return ir.ModelBlock(tuple(ir.ModelField(k, draw(_MODEL_VALUES[k])) for k in keys))


@st.composite
def constraints(draw):
    """Every constraint form: json_schema / regex / grammar inline or ``from`` a file, and choice."""
    kind = draw(st.sampled_from(["choice", "json_schema", "regex", "grammar"]))
    if kind == "choice":
        options = draw(st.lists(strings(allow_long=False), max_size=4))
        return ir.ConstrainChoice(tuple(options))
    from_file = draw(st.booleans())
    return ir.ConstrainText(kind, draw(strings(min_size=1 if from_file else 0)), from_file)


def _matrix_decl(draw, scope: Scope) -> ir.MatrixDecl:
    """``matrix NAME = load("...", key=...)`` (a matrix's load takes no ``per_layer``), declared in ``scope``."""
    load = draw(loads())
    decl = ir.MatrixDecl(scope.fresh(draw), record.evolve(load, kwargs=tuple(k for k in load.kwargs
                                                                            if k.name != "per_layer")))
    scope.matrices.append(decl.name)
    return decl


def _sae_decl(draw, scope: Scope) -> ir.SaeDecl:
    """``sae NAME = sae("...")`` (parses; the folder need not exist), declared in ``scope``."""
    decl = ir.SaeDecl(scope.fresh(draw), ir.Call("sae", (draw(strings(min_size=1, allow_long=False)),)))
    scope.saes.append(decl.name)
    return decl


@st.composite
def programs(draw, max_statements: int = 7, with_constraint: bool = True, with_loads: bool = False,
             with_model: bool = True) -> ir.Program:
    """A random, well-formed program (as the parser would build it, without spans)."""
    scope = Scope()
    statements: list = []
    if with_model and draw(st.integers(0, 3)) == 0:
        statements.append(draw(model_blocks()))
    kinds = ["param", "vector", "vector", "matrix", "sae", "probe", "probe", "intervention", "intervention",
             "intervention"]
    for _ in range(draw(st.integers(0, max_statements))):
        kind = draw(st.sampled_from(kinds))
        if kind == "param":
            value = _resolve(draw(SCALAR[2]), draw, scope)
            statements.append(ir.ParamDecl(scope.fresh(draw), value))
            scope.params.append(statements[-1].name)
        elif kind == "vector":
            if with_loads and draw(st.integers(0, 3)) == 0:
                value = draw(loads())
            else:
                value = _resolve(draw(VECTOR[2]), draw, scope)
            statements.append(ir.VectorDecl(scope.fresh(draw), value))
            scope.vectors.append(statements[-1].name)
        elif kind == "matrix":  # a load (with_loads), or another matrix
            if with_loads and (not scope.matrices or draw(st.booleans())):
                statements.append(_matrix_decl(draw, scope))
            elif scope.matrices:
                statements.append(ir.MatrixDecl(scope.fresh(draw), ir.Name(draw(st.sampled_from(scope.matrices)))))
                scope.matrices.append(statements[-1].name)
        elif kind == "sae":  # a folder (with_loads), or another SAE
            if with_loads and (not scope.saes or draw(st.booleans())):
                statements.append(_sae_decl(draw, scope))
            elif scope.saes:
                statements.append(ir.SaeDecl(scope.fresh(draw), ir.Name(draw(st.sampled_from(scope.saes)))))
                scope.saes.append(statements[-1].name)
        elif kind == "probe":
            readout = draw(READOUTS)
            if isinstance(readout, ir.FeatureReadout) and not scope.saes:  # its SAE is read, or it reads the norm
                if with_loads:
                    statements.append(_sae_decl(draw, scope))
                else:
                    readout = ir.Norm()
            probe = ir.ProbeDecl(
                scope.fresh(draw),
                draw(single_sites),
                _resolve(readout, draw, scope),
                ir.Pool(draw(st.sampled_from(["prompt.mean", "prompt.last", "token"]))),
            )
            statements.append(probe)
            scope.probes.append(probe.name)
        else:
            tokens = draw(st.none() | st.lists(scopes, min_size=1, max_size=3).map(tuple))
            gate = _resolve(draw(GATES), draw, scope) if scope.probes and draw(st.integers(0, 2)) else None
            op = draw(OPERATIONS)
            if isinstance(op, ir.LoReFT) and not scope.matrices:  # its matrices are loaded, or it is no loreft
                if with_loads:
                    statements.append(_matrix_decl(draw, scope))
                else:
                    op = ir.Suppress()
            if isinstance(op, ir.ClampFeature) and not scope.saes:  # its SAE is read, or it is no clamp feature
                if with_loads:
                    statements.append(_sae_decl(draw, scope))
                else:
                    op = ir.Suppress()
            statements.append(ir.InterventionDecl(
                scope.fresh(draw),
                draw(sites),
                _resolve(op, draw, scope),
                tokens,
                gate,
                ir.Preserve() if draw(st.integers(0, 3)) == 0 else None,
            ))
    if with_constraint and draw(st.integers(0, 3)) == 0:
        statements.insert(draw(st.integers(0, len(statements))), draw(constraints()))
    return ir.Program(1, tuple(statements))


def _long_string_lines(text: str) -> tuple[set[int], set[int]]:
    """(lines whose start is inside a \"\"\" string, lines whose end is inside one), 0-based."""
    starts_inside, ends_inside = set(), set()
    inside = False
    for n, line in enumerate(text.split("\n")):
        if inside:
            starts_inside.add(n)
        inside ^= line.count('"""') % 2 == 1
        if inside:
            ends_inside.add(n)
    return starts_inside, ends_inside


@st.composite
def commented(draw, text: str) -> tuple[str, list[str]]:
    """``text`` with random comments added; returns (new text, comment texts in order).

    Comments go on lines of their own (indented at random) or at the end of
    a line, never inside a ``\"\"\"`` string.
    """
    lines = text.rstrip("\n").split("\n")
    starts_inside, ends_inside = _long_string_lines(text)
    out: list[str] = []
    added: list[str] = []
    for n, line in enumerate(lines):
        if n not in starts_inside and draw(st.integers(0, 4)) == 0:
            c = draw(comments_text())
            out.append(" " * draw(st.integers(0, 4)) + c)
            added.append(c)
        if n not in ends_inside and draw(st.integers(0, 3)) == 0:
            c = draw(comments_text())
            line = line + " " * draw(st.integers(1, 3)) + c
            added.append(c)
        out.append(line)
    if draw(st.booleans()):
        c = draw(comments_text())
        out.append(c)
        added.append(c)
    return "\n".join(out) + "\n", added


# --------------------------------------------------------------- mutations

_TOKEN = re.compile(r'"""|"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|[0-9.]+%?|\S')
_INTERESTING = [
    "{", "}", "[", "]", "(", ")", ",", ":", "=", "%", "*", "-", "+", "/", "<", ">=", '"', '"""', "#", "\n",
    "\\", "\\d", "\t", " ", ".", "deg", "1e999", "-0", "0", "-1", "100%", "101%", "1:", ":-1", "nan", "inf",
    "steer", "model", "param", "vector", "probe", "intervention", "constrain", "at", "read", "pool",
    "tokens", "when", "preserve norm", "add", "scale", "set", "suppress", "ablate", "clamp", "to", "rotate in",
    "matrix", "loreft", "sae", "feature", "clamp feature",
    "by", "all", "prompt", "generated", "after", "and", "or", "not", "true", "false", "load", "normalize",
    "cosine", "projected_cosine", "subspace_cosine", "dot", "norm", "head", "resid_pre", "resid_post", "attn_out", "mlp_out",
    "prompt.mean", "token", "key=", "per_layer=true", "json_schema", "regex", "grammar", "choice", "from",
    "per request", "in [0, 1]", "é", "\u2028", "\x00", "\r",
]


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` after 1-4 random edits: delete, insert or replace characters or tokens."""
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            text = draw(st.sampled_from(_INTERESTING))
            continue
        how = draw(st.sampled_from(["del_char", "ins_char", "rep_char", "del_tok", "ins_tok", "rep_tok", "dup_line"]))
        if how.endswith("_char"):
            i = draw(st.integers(0, len(text) - 1))
            j = min(len(text), i + draw(st.integers(1, 3)))
            new = draw(st.text(min_size=1, max_size=3)) if how != "del_char" else ""
            text = text[:i] + new + (text[i:] if how == "ins_char" else text[j:])
        elif how == "dup_line":
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            lines.insert(k, lines[k])
            text = "\n".join(lines)
        else:
            toks = list(_TOKEN.finditer(text))
            if not toks:
                continue
            m = draw(st.sampled_from(toks))
            new = "" if how == "del_tok" else draw(st.sampled_from(_INTERESTING))
            if how == "ins_tok":
                text = text[: m.start()] + new + " " + text[m.start():]
            else:
                text = text[: m.start()] + new + text[m.end():]
    return text


def random_text() -> st.SearchStrategy[str]:
    """Arbitrary text, and token soup made of Steer's own words and punctuation."""
    soup = st.lists(st.sampled_from(_INTERESTING), max_size=30).map(" ".join)
    return st.one_of(st.text(max_size=60), soup, soup.map(lambda s: "steer 1\n" + s))


# ---------------------------------------------------------- hostile edits

def _hostile_pieces() -> st.SearchStrategy[str]:
    """Text that tests a limit or a value policy, at and around its bound (see steerc/core/limits.py)."""
    near = st.sampled_from([1, 2, 63, 64, 65, 66, 120, 500])
    digits = st.sampled_from([17, 99, 100, 101, 309, 400, 4301])
    return st.one_of(
        near.map(lambda n: "-" * n + "1"),
        near.map(lambda n: "(" * n + "1" + ")" * n),
        near.map(lambda n: "[" * n + "1" + "]" * n),
        near.map(lambda n: " + ".join(["1"] * n)),
        near.map(lambda n: "not " * n),
        near.map(lambda n: "normalize(" * n + "[1.0]" + ")" * n),
        digits.map(lambda n: "9" * n),
        digits.map(lambda n: "-" + "9" * n),
        digits.map(lambda n: "0." + "0" * n + "1"),
        digits.map(lambda n: "9" * n + "%"),
        st.sampled_from(["1e39", "-1e39", "3.4e38", "1e308", "1e999", "1e-400", "2147483648", "99999999999",
                         "1e30 * 1e30", "1e38 * 10", "1 / 1e-300"]),
        st.sampled_from(['"\\ud800"', '"\\udfff"', '"\\ud83d\\ude00"', '"\\ud83d"', '"x\\udc00"', '"\\u0000"',
                         '"""\\ud800"""', '"{\\"const\\": \\"\\ud800\\"}"']),
        st.sampled_from(["(true)", "(false)", "(true) * 2", "true", "false", "(not)", "(deg)"]),
        st.sampled_from([257, 1000]).map(lambda n: "a" * n),
        st.sampled_from([5000]).map(lambda n: '"' + "a/" * n + '"'),
        st.sampled_from([70_000]).map(lambda n: '"' + "x" * n + '"'),
        st.sampled_from(["*", ":", "0:999999999", "-99999:", "(0, 2000)", "1024", "1025", "-1025"]),
    )


@st.composite
def hostile(draw, text: str) -> str:
    """``text`` with one to three hostile pieces put at token boundaries (or replacing a token)."""
    for _ in range(draw(st.integers(1, 3))):
        piece = draw(_hostile_pieces())
        toks = list(_TOKEN.finditer(text))
        if not toks:
            text = text + piece
            continue
        m = draw(st.sampled_from(toks))
        if draw(st.booleans()):
            text = text[: m.start()] + piece + text[m.end():]
        else:
            text = text[: m.start()] + piece + " " + text[m.start():]
    return text
