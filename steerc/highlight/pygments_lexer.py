"""A Pygments lexer for Steer (``.steer`` files).

Installed with steerc, it is found by name, alias and file name through the
``pygments.lexers`` entry point, so Sphinx, MkDocs and anything else that
highlights with Pygments colour ```` ```steer ```` blocks and ``*.steer``
files::

    pip install "steerc[highlight]"
    pygmentize -l steer examples/smollm2/joy.steer

Keywords in Steer are contextual (``vector add = [1.0]`` declares a vector
called ``add``), so the lexer follows the shape of the grammar: a state for
each statement, block and block line, with the keywords that the grammar
accepts there. Within brackets a newline is only space, as in the grammar.
The token classes, and the words in each, are those of
:mod:`steerc.highlight.words`; ``spec/highlighting.md`` lists them.
``tests/test_highlight.py`` checks, on every example and on random
programs, that each character gets the class that steerc's own lexer gives
it.

>>> from pygments.token import Keyword, Name
>>> toks = list(SteerLexer().get_tokens("steer 1\\nvector add = [1.0]\\n"))
>>> [t for t in toks if t[1] in ("vector", "add")]
[(Token.Keyword.Declaration, 'vector'), (Token.Name.Variable, 'add')]
"""

from __future__ import annotations

import re

from pygments.lexer import RegexLexer, bygroups
from pygments.token import Comment, Whitespace, string_to_tokentype

from steerc.highlight import words as W

__all__ = ["SteerLexer"]


def _t(cls: str):
    return string_to_tokentype(W.CLASSES[cls].pygments)


def _kw(cls: str) -> str:
    """A regex for the keywords of one class, each a whole word."""
    return W.START + W.alternation(W.KEYWORD_CLASSES[cls]) + W.END


def _one(word: str) -> str:
    assert W.keyword_class(word), word
    return W.START + word + W.END


_S = W.SPACE + "*"
_NOT_YET = bygroups()  # a zero-width match: change state, emit nothing

# ---------------------------------------------------------------- pieces

_SPACE = [
    (W.SPACE + "+", Whitespace),
    (r"#[^\n]*", Comment.Single),
]
_STRINGS = [
    (W.LONG_STRING, _t("long_string")),
    (r'"""(?:[^"]|"(?!""))*\Z', _t("long_string")),  # unterminated: the rest of the text
    (r'"', _t("string"), "string"),
]
_NUMBERS = [
    (r"(" + W.NUMBER_FLOAT + r")(" + _S + r")(deg" + W.END + ")", bygroups(_t("float"), Whitespace, _t("unit"))),
    (r"(" + W.NUMBER_INT + r")(" + _S + r")(deg" + W.END + ")", bygroups(_t("integer"), Whitespace, _t("unit"))),
    (W.NUMBER_FLOAT, _t("float")),
    (W.NUMBER_INT, _t("integer")),
]
_EXPRESSION = _SPACE + _STRINGS + _NUMBERS + [
    (r"(" + W.START + W.alternation(W.FUNCTIONS) + W.END + r")(" + _S + r")(\()",
     bygroups(_t("function"), Whitespace, _t("bracket")), "call"),
    (r"(" + W.NAME + r")(" + _S + r")(\()", bygroups(_t("call"), Whitespace, _t("bracket")), "call"),
    (W.NAME, _t("name")),
    (r"\(", _t("bracket"), "paren"),
    (r"\[", _t("bracket"), "bracket"),
    (r"<=|>=|<|>", _t("comparison")),
    (r"[-+*/]", _t("arithmetic")),
    (r"=", _t("assignment")),
    (r"[,:.]", _t("punctuation")),
    (r"[)\]{}]", _t("bracket")),
]
_SELECTOR = [
    (r"\n", Whitespace),
    (W.PERCENT, _t("percent")),
    (W.SIGNED_INT, _t("integer")),
    (r"\*", _t("arithmetic")),
] + _EXPRESSION
# A line that can only start a statement, met inside a block or a bracket: a `}`, `)` or `]` is
# missing (text being edited), and every state but the top level ends there.
_UNCLOSED = [(r"(?=" + W.STATEMENT_LINE + ")", _NOT_YET, "#pop")]
_LINE_END = [(r"\n", Whitespace, "#pop")] + _UNCLOSED
# A line inside a block ends at its newline or at the block's `}` (`scale 2 }`).
_BLOCK_LINE_END = [(r"\n", Whitespace, "#pop"), (r"\}", _t("bracket"), "#pop:2")] + _UNCLOSED


# `not` starts a condition; `and` and `or` follow one (`when and > 1` compares a probe `and`).
_GATE = [
    (_one("not"), _t("logical")),
    (W.AFTER_OPERAND + r"(" + _S + r")(" + W.START + "(?:and|or)" + W.END + ")", bygroups(Whitespace, _t("logical"))),
    (r"\(", _t("bracket"), "gate-paren"),
] + _EXPRESSION


def _site_name(lexer, match):
    name = match.group()
    yield match.start(), _t("site") if name in W.SITE_KINDS else _t("name"), name


def _pool(lexer, match):
    text = match.group()
    cls = _t("pool") if text in W.POOLS else _t("name")
    for m in re.finditer(r"[^.]+|\.", text):
        yield match.start() + m.start(), _t("punctuation") if m.group() == "." else cls, m.group()


class SteerLexer(RegexLexer):
    """Steer, the declarative steering language of steerc."""

    name = "Steer"
    aliases = ["steer"]
    filenames = ["*.steer"]
    mimetypes = ["text/x-steer"]

    flags = re.MULTILINE

    tokens = {
        # Top level: a statement starts at each line.
        "root": [
            (r"\n", Whitespace),
            (_one("steer"), _t("header"), "header"),
            (_one("model"), _t("declaration"), "model"),
            (r"(" + W.START + "(?:param|vector|matrix|sae)" + W.END + r")(" + _S + r")(" + W.NAME + ")?",
             bygroups(_t("declaration"), Whitespace, _t("declared")), "param"),
            (r"(" + W.START + "(?:probe|intervention)" + W.END + r")(" + _S + r")(" + W.NAME + ")?",
             bygroups(_t("declaration"), Whitespace, _t("block")), "block-head"),
            (_one("constrain"), _t("declaration"), "constrain"),
            *_EXPRESSION,
        ],
        "header": _LINE_END + _EXPRESSION,
        # `param x = e [in [lo, hi]] [per request]`, `vector v = e`, `matrix m = load(...)`, `sae s = sae(...)`
        "param": _LINE_END + [
            (_one("in") + r"(?=" + _S + r"\[)", _t("connective")),
            (r"(" + _one("per") + r")(" + W.SPACE + r"+)(" + _one("request") + ")",
             bygroups(_t("connective"), Whitespace, _t("connective"))),
        ] + _EXPRESSION,
        # `model { field = literal ... }`
        "model": _LINE_END + [(r"\{", _t("bracket"), ("#pop", "model-body"))] + _EXPRESSION,
        "model-body": _UNCLOSED + [
            (r"\n", Whitespace),
            (r"\}", _t("bracket"), "#pop"),
            (r"(" + W.NAME + r")(" + _S + r")(=)", bygroups(_t("field"), Whitespace, _t("assignment"))),
            (_kw("constant"), _t("constant")),
            *_EXPRESSION,
        ],
        # `probe p {` / `intervention i {`: the body's lines start with their keywords.
        "block-head": _LINE_END + [(r"\{", _t("bracket"), ("#pop", "block-body"))] + _EXPRESSION,
        "block-body": _UNCLOSED + [
            (r"\n", Whitespace),
            (r"\}", _t("bracket"), "#pop"),
            (_one("at"), _t("keyword"), "at"),
            (_one("read"), _t("keyword"), "read"),
            (_one("pool"), _t("keyword"), "pool"),
            (_one("tokens"), _t("keyword"), "tokens"),
            (_one("when"), _t("keyword"), "gate"),
            (r"(" + _one("preserve") + r")(" + _S + r")(" + _one("norm") + ")?",
             bygroups(_t("keyword"), Whitespace, _t("readout")), "line"),
            (r"(" + _one("clamp") + r")(" + W.SPACE + r"+)(" + _one("feature") + ")",  # `clamp feature s[0] to 4`
             bygroups(_t("keyword"), Whitespace, _t("connective")), "clamp"),
            (r"(" + _one("clamp") + r")(" + W.SPACE + r"+)(to" + W.END + ")",  # `clamp to to 1`: a vector `to`
             bygroups(_t("keyword"), Whitespace, _t("name")), "clamp"),
            (_one("clamp"), _t("keyword"), "clamp"),
            (_one("rotate"), _t("keyword"), "rotate"),
            (_kw("keyword"), _t("keyword"), "line"),
            *_EXPRESSION,
        ],
        "line": _BLOCK_LINE_END + _EXPRESSION,
        # `at site[selectors]`
        "at": _BLOCK_LINE_END + _SPACE + [
            (W.NAME, _site_name),
            (r"\[", _t("bracket"), "selector"),
        ] + _EXPRESSION,
        # `[1:3]`, `[-2, 50%]`, `[*]`, `[(1, 3), 0:2]`; also the positions of `tokens`
        "selector": [(r"\]", _t("bracket"), "#pop"), (r"\(", _t("bracket"), "selector-group")] + _UNCLOSED + _SELECTOR,
        "selector-group": [(r"\)", _t("bracket"), "#pop")] + _UNCLOSED + _SELECTOR,
        # `read cosine(v)`, `read dot(w) + 0.5`, `read norm`
        "read": _BLOCK_LINE_END + _SPACE + [(_kw("readout"), _t("readout"), ("#pop", "line"))] + _EXPRESSION,
        # `pool prompt.mean`
        "pool": _BLOCK_LINE_END + _SPACE + [
            (W.NAME + r"(?:\." + W.NAME + ")?", _pool),
        ] + _EXPRESSION,
        # `tokens prompt[-1:], generated, after "x", [0, 3]`
        "tokens": _BLOCK_LINE_END + [
            (_kw("scope"), _t("scope")),
            (_one("after"), _t("connective")),
            (r"\[", _t("bracket"), "selector"),
        ] + _EXPRESSION,
        # `when p > 0.5 and not (q < 1)`
        "gate": _BLOCK_LINE_END + _GATE,
        "gate-paren": [(r"\n", Whitespace), (r"\)", _t("bracket"), "#pop")] + _UNCLOSED + _GATE,
        # `clamp v to 3.0`
        "clamp": _BLOCK_LINE_END + [(_one("to"), _t("connective"))] + _EXPRESSION,
        # `rotate in (a, b) to 90deg` / `... by 15deg`
        "rotate": _BLOCK_LINE_END + [
            (r"(" + _one("in") + r")(" + _S + r")(\()", bygroups(_t("connective"), Whitespace, _t("bracket")),
             "paren"),
            (W.START + "(?:to|by)" + W.END, _t("connective")),
        ] + _EXPRESSION,
        # `constrain json_schema from "x.json"`, `constrain choice ["a", "b"]`
        "constrain": _LINE_END + [
            (_kw("constraint"), _t("constraint")),
            (_one("from"), _t("connective")),
        ] + _EXPRESSION,
        # Inside ( ) and [ ] a newline is a space.
        "paren": [(r"\n", Whitespace), (r"\)", _t("bracket"), "#pop")] + _UNCLOSED + _EXPRESSION,
        "bracket": [(r"\n", Whitespace), (r"\]", _t("bracket"), "#pop")] + _UNCLOSED + _EXPRESSION,
        # A call's arguments: `true` and `false` are booleans where an argument starts.
        "call": [
            (r"(?<=[(,=])(" + _S + r")(" + _kw("constant") + ")", bygroups(Whitespace, _t("constant"))),
            (r"\n", Whitespace),
            (r"\)", _t("bracket"), "#pop"),
            *_UNCLOSED,
            (r"(" + W.NAME + r")(" + _S + r")(=)", bygroups(_t("argument"), Whitespace, _t("assignment"))),
            *_EXPRESSION,
        ],
        # "...": escapes; a newline ends it (unterminated: steerc reports it).
        "string": [
            (W.ESCAPE, _t("escape")),
            (r"\\[^\n]", _t("bad_escape")),
            (r'[^"\\\n]+', _t("string")),
            (r'"', _t("string"), "#pop"),
            (r"\\", _t("bad_escape")),
            (r"(?=\n)", _NOT_YET, "#pop"),
        ],
    }

    def analyse_text(text):  # noqa: N805 - Pygments calls it on the class, without self
        """A Steer program starts with `steer N`, after comments and blank lines."""
        if re.match(r"\A(?:[ \t\f\r]*(?:#[^\n]*)?\n)*[ \t\f\r]*steer[ \t]+[0-9]+[ \t\f\r]*(?:#[^\n]*)?$", text, re.M):
            return 0.6
        return 0.0
