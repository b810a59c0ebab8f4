"""Parse tree to program IR.

:class:`ToIR` walks the Lark tree and builds :mod:`steerc.ir.nodes` from
the tree, attaching a span to every node. The only diagnostics it reports
are those the IR cannot represent: a block line given twice
(``duplicate-field``) and bad string escapes (``syntax-error``). Everything
semantic is the checker's job.
"""

from __future__ import annotations

from lark import Token, Tree

from steerc.core.record import evolve
from steerc.core.source import Source, Span
from steerc.diagnostics import Diagnostics, Note
from steerc.diagnostics.codes import DUPLICATE_FIELD, SYNTAX_ERROR
from steerc.ir import nodes as ir

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _number(text: str):
    return int(text) if text.isdigit() else float(text)


class ToIR:
    """Builds IR bottom-up: one method per rule (or alias), called as ``method(meta, children)``."""

    def __init__(self, source: Source, diagnostics: Diagnostics):
        self.source = source
        self.diagnostics = diagnostics

    def transform(self, tree: Tree):
        dispatch: dict = {}

        def visit(t: Tree):
            children = [visit(c) if isinstance(c, Tree) else c for c in t.children]
            method = dispatch.get(t.data)
            if method is None:
                method = dispatch[t.data] = getattr(self, t.data)
            return method(t.meta, children)

        return visit(tree)

    # -------------------------------------------------------------- helpers

    def _span(self, meta) -> Span | None:
        if getattr(meta, "empty", True):
            return None
        return self.source.span(meta.start_pos, meta.end_pos)

    def _tok(self, tok: Token) -> Span:
        return self.source.span(tok.start_pos, tok.end_pos)

    def _unescape(self, tok: Token) -> str:
        body = tok.value[1:-1]
        if "\\" not in body:
            return body
        out = []
        i = 0
        while i < len(body):
            ch = body[i]
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            nxt = body[i + 1 : i + 2]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
            elif nxt == "u" and len(body) >= i + 6 and is_hex(body[i + 2 : i + 6]):
                code = int(body[i + 2 : i + 6], 16)
                low = low_surrogate(body, i + 6) if 0xD800 <= code <= 0xDBFF else None
                if low is not None:  # a surrogate pair is one character, as in JSON
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 12
                    continue
                if 0xD800 <= code <= 0xDFFF:
                    start = tok.start_pos + 1 + i
                    self.diagnostics.error(
                        SYNTAX_ERROR,
                        f"`\\u{body[i + 2 : i + 6]}` is a lone surrogate, not a character",
                        self.source.span(start, start + 6),
                        help="write the character itself, or a complete surrogate pair such as `\\ud83d\\ude00`",
                    )
                    code = 0xFFFD
                out.append(chr(code))
                i += 6
            else:
                start = tok.start_pos + 1 + i
                self.diagnostics.error(
                    SYNTAX_ERROR,
                    f"unknown escape `\\{nxt}` in a string",
                    self.source.span(start, start + 2),
                    help="write `\\\\` for a backslash; known escapes are \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX",
                )
                out.append(nxt)
                i += 2
        return "".join(out)

    # -------------------------------------------------------------- program

    def start(self, meta, children):
        header, *statements = children
        version, version_span = header
        return ir.Program(version, tuple(statements), span=self._span(meta), version_span=version_span)

    def header(self, meta, children):
        (tok,) = children
        return int(tok.value), self._tok(tok)

    # -------------------------------------------------------------- literals

    def string(self, meta, children):
        (tok,) = children
        if tok.type == "LONG_STRING":
            return ir.Str(tok.value[3:-3], long=True, span=self._tok(tok))
        return ir.Str(self._unescape(tok), span=self._tok(tok))

    def boolean(self, meta, children):
        (tok,) = children
        return ir.Bool(tok.value == "true", span=self._tok(tok))

    def signed_number(self, meta, children):
        (tok,) = children
        return ir.Number(_number(tok.value), text=tok.value, span=self._tok(tok))

    def negative_number(self, meta, children):
        (tok,) = children
        return ir.Number(-_number(tok.value), text="-" + tok.value, span=self._span(meta))

    # ----------------------------------------------------------- statements

    def model_block(self, meta, children):
        return ir.ModelBlock(tuple(children), span=self._span(meta))

    def model_field(self, meta, children):
        name, value = children
        return ir.ModelField(name.value, value, span=self._span(meta))

    def param_decl(self, meta, children):
        name, value, bounds, per_request = children
        lo_hi, range_span = bounds if bounds is not None else (None, None)
        return ir.ParamDecl(name.value, value, span=self._span(meta), name_span=self._tok(name), range=lo_hi,
                            per_request=per_request is not None, range_span=range_span)

    def param_range(self, meta, children):
        return (children[0], children[1]), self._span(meta)

    def per_request(self, meta, children):
        return True

    def vector_decl(self, meta, children):
        name, value = children
        return ir.VectorDecl(name.value, value, span=self._span(meta), name_span=self._tok(name))

    def matrix_decl(self, meta, children):
        name, value = children
        return ir.MatrixDecl(name.value, value, span=self._span(meta), name_span=self._tok(name))

    def sae_decl(self, meta, children):
        name, value = children
        return ir.SaeDecl(name.value, value, span=self._span(meta), name_span=self._tok(name))

    def _collect(self, lines, kinds: dict[str, str], block: str):
        """Map line kind -> (value, span); a second line of a kind is an error."""
        seen: dict[str, tuple[object, Span | None]] = {}
        for kind, value, span in lines:
            slot = kinds.get(kind, kind)
            if slot in seen:
                first_span = seen[slot][1]
                what = "an operation" if slot == "op" else f"a line `{kind} ...`"
                self.diagnostics.error(
                    DUPLICATE_FIELD,
                    f"{block} already has {what}",
                    span,
                    notes=(Note("the first one is here", first_span),) if first_span else (),
                    help="compose operations with a second intervention; they apply in source order"
                    if slot == "op"
                    else "keep one of the two lines",
                )
                continue
            seen[slot] = (value, span)
        return {k: v for k, (v, _) in seen.items()}

    def probe_decl(self, meta, children):
        name, *lines = children
        got = self._collect(lines, {}, f"probe `{name.value}`")
        return ir.ProbeDecl(
            name.value,
            got.get("at"),
            got.get("read"),
            got.get("pool"),
            span=self._span(meta),
            name_span=self._tok(name),
        )

    _OPS = {k: "op" for k in ("add", "scale", "set", "suppress", "ablate", "clamp", "rotate", "loreft")}

    def intervention_decl(self, meta, children):
        name, *lines = children
        got = self._collect(lines, self._OPS, f"intervention `{name.value}`")
        return ir.InterventionDecl(
            name.value,
            got.get("at"),
            got.get("op"),
            got.get("tokens"),
            got.get("when"),
            got.get("preserve"),
            span=self._span(meta),
            name_span=self._tok(name),
        )

    def at_line(self, meta, children):
        return ("at", children[0], self._span(meta))

    def read_line(self, meta, children):
        return ("read", children[0], self._span(meta))

    def pool_line(self, meta, children):
        return ("pool", children[0], self._span(meta))

    def pool(self, meta, children):
        return ir.Pool(".".join(t.value for t in children), span=self._span(meta))

    def tokens_line(self, meta, children):
        return ("tokens", tuple(children), self._span(meta))

    def when_line(self, meta, children):
        return ("when", children[0], self._span(meta))

    def preserve_line(self, meta, children):
        span = self._span(meta)
        return ("preserve", ir.Preserve(span=span), span)

    def constrain_stmt(self, meta, children):
        return evolve(children[0], span=self._span(meta))

    # ------------------------------------------------------------------ ops

    def _op(self, kind, node, meta):
        return (kind, node, self._span(meta))

    def add_op(self, meta, c):
        return self._op("add", ir.Add(c[0], span=self._span(meta)), meta)

    def scale_op(self, meta, c):
        return self._op("scale", ir.Scale(c[0], span=self._span(meta)), meta)

    def set_op(self, meta, c):
        return self._op("set", ir.Set(c[0], span=self._span(meta)), meta)

    def suppress_op(self, meta, c):
        return self._op("suppress", ir.Suppress(span=self._span(meta)), meta)

    def ablate_op(self, meta, c):
        return self._op("ablate", ir.Ablate(tuple(c), span=self._span(meta)), meta)

    def clamp_op(self, meta, c):
        return self._op("clamp", ir.Clamp(c[0], c[1], span=self._span(meta)), meta)

    def clamp_feature_op(self, meta, c):
        return self._op("clamp", ir.ClampFeature(c[0], c[1], span=self._span(meta)), meta)

    def rotate_to_op(self, meta, c):
        return self._op("rotate", ir.Rotate(c[0], c[1], "to", c[2], span=self._span(meta)), meta)

    def rotate_by_op(self, meta, c):
        return self._op("rotate", ir.Rotate(c[0], c[1], "by", c[2], span=self._span(meta)), meta)

    def loreft_op(self, meta, c):
        return self._op("loreft", ir.LoReFT(c[0], c[1], c[2], span=self._span(meta)), meta)

    # ---------------------------------------------------------- expressions

    def _bin(op):  # noqa: N805 - a method factory used in the class body
        def build(self, meta, children):
            left, right = children
            return ir.BinOp(op, left, right, span=self._span(meta))

        return build

    add = _bin("+")
    sub = _bin("-")
    mul = _bin("*")
    div = _bin("/")
    del _bin

    def neg(self, meta, children):
        return ir.Neg(children[0], span=self._span(meta))

    def number(self, meta, children):
        (tok,) = children
        return ir.Number(_number(tok.value), text=tok.value, span=self._tok(tok))

    def degrees(self, meta, children):
        (tok,) = children
        return ir.Degrees(_number(tok.value), text=tok.value, span=self._span(meta))

    def name(self, meta, children):
        (tok,) = children
        return ir.Name(tok.value, span=self._tok(tok))

    def call(self, meta, children):
        func, *args = children
        positional = tuple(a for a in args if a is not None and not isinstance(a, ir.Keyword))
        keywords = tuple(a for a in args if isinstance(a, ir.Keyword))
        return ir.Call(func.value, positional, keywords, span=self._span(meta), func_span=self._tok(func))

    def index(self, meta, children):
        base, index = children
        return ir.Index(ir.Name(base.value, span=self._tok(base)), index, span=self._span(meta))

    def positional_arg(self, meta, children):
        return children[0]

    def keyword_arg(self, meta, children):
        name, value = children
        return ir.Keyword(name.value, value, span=self._span(meta))

    def vector_literal(self, meta, children):
        return ir.VectorLit(tuple(c for c in children if c is not None), span=self._span(meta))

    # ---------------------------------------------------------------- sites

    def site(self, meta, children):
        name, *items = children
        return ir.SiteRef(name.value, tuple(items), span=self._span(meta), name_span=self._tok(name))

    def bound(self, meta, children):
        return self._bound(children[0])

    def position_sel(self, meta, children):
        return children[0]

    def _bound(self, tok):
        if tok is None or not isinstance(tok, Token):
            return tok
        if tok.type == "PERCENT":
            return ir.SelPercent(float(tok.value[:-1]), text=tok.value, span=self._tok(tok))
        return ir.SelIndex(int(tok.value), span=self._tok(tok))

    def sel_index(self, meta, children):
        return self._bound(children[0])

    def sel_percent(self, meta, children):
        return self._bound(children[0])

    def sel_all(self, meta, children):
        return ir.SelAll(span=self._span(meta))

    def sel_slice(self, meta, children):
        start, stop = children
        return ir.SelSlice(self._bound(start), self._bound(stop), span=self._span(meta))

    def sel_group(self, meta, children):
        return ir.SelGroup(tuple(children), span=self._span(meta))

    # --------------------------------------------------------------- scopes

    def slice(self, meta, children):
        start, stop = children
        return ir.PosSlice(
            int(start.value) if start is not None else None,
            int(stop.value) if stop is not None else None,
            span=self._span(meta),
        )

    def _position_sel(self, child):
        if child is None or isinstance(child, ir.PosSlice):
            return child
        return ir.PosIndex(int(child.value), span=self._tok(child))

    def scope_all(self, meta, children):
        return ir.ScopeAll(span=self._span(meta))

    def scope_prompt(self, meta, children):
        return ir.ScopePrompt(self._position_sel(children[0]), span=self._span(meta))

    def scope_generated(self, meta, children):
        return ir.ScopeGenerated(self._position_sel(children[0]), span=self._span(meta))

    def scope_positions(self, meta, children):
        return ir.ScopePositions(tuple(int(t.value) for t in children), span=self._span(meta))

    def scope_after(self, meta, children):
        return ir.ScopeAfter(children[0], span=self._span(meta))

    # ---------------------------------------------------------------- gates

    def compare(self, meta, children):
        left, op, right = children
        return ir.Compare(left, op.value, right, span=self._span(meta))

    def gate_and(self, meta, children):
        return ir.GateAnd(children[0], children[1], span=self._span(meta))

    def gate_or(self, meta, children):
        return ir.GateOr(children[0], children[1], span=self._span(meta))

    def gate_not(self, meta, children):
        return ir.GateNot(children[0], span=self._span(meta))

    # ------------------------------------------------------------- readouts

    def cosine_readout(self, meta, children):
        return ir.Cosine(children[0], span=self._span(meta))

    def projected_cosine_readout(self, meta, children):
        return ir.ProjectedCosine(tuple(children), span=self._span(meta))

    def subspace_cosine_readout(self, meta, children):
        return ir.SubspaceCosine(tuple(children), span=self._span(meta))

    def dot_readout(self, meta, children):
        vector, *offsets = children
        return ir.Dot(vector, tuple(offsets), span=self._span(meta))

    def plus_offset(self, meta, children):
        return ir.Offset("+", children[0], span=self._span(meta))

    def minus_offset(self, meta, children):
        return ir.Offset("-", children[0], span=self._span(meta))

    def norm_readout(self, meta, children):
        return ir.Norm(span=self._span(meta))

    def feature_readout(self, meta, children):
        return ir.FeatureReadout(self.index(meta, children), span=self._span(meta))

    # ---------------------------------------------------------- constraints

    def _text_constraint(kind, from_file):  # noqa: N805
        def build(self, meta, children):
            return ir.ConstrainText(kind, children[0], from_file, span=self._span(meta))

        return build

    json_schema_file = _text_constraint("json_schema", True)
    json_schema_inline = _text_constraint("json_schema", False)
    regex_file = _text_constraint("regex", True)
    regex_inline = _text_constraint("regex", False)
    grammar_file = _text_constraint("grammar", True)
    grammar_inline = _text_constraint("grammar", False)
    del _text_constraint

    def choice(self, meta, children):
        return ir.ConstrainChoice(tuple(c for c in children if c is not None), span=self._span(meta))


def is_hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)


def low_surrogate(body: str, i: int) -> int | None:
    """The low surrogate written as ``\\uXXXX`` at ``body[i:]``, if there is one."""
    if body[i : i + 2] == "\\u" and is_hex(body[i + 2 : i + 6]):
        code = int(body[i + 2 : i + 6], 16)
        if 0xDC00 <= code <= 0xDFFF:
            return code
    return None
