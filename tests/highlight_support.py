"""What steerc's own lexer says each character of a program is, for the highlighting tests.

:func:`reference_classes` runs the real parser (the contextual Lark lexer,
driven by the LALR parser's state, and the layout post-lexer) and records
every token it reads, so keywords are told from names exactly where the
grammar tells them. Each character gets a class of
:data:`steerc.highlight.words.CLASSES` for keywords and operators, or one of
``name``, ``number``, ``string``, ``comment``, ``space``.
"""

from __future__ import annotations

import glob
import os

from lark.exceptions import UnexpectedInput
from support import examples_path

from steerc.core.source import Source
from steerc.frontend import parser as P
from steerc.frontend.tables import load
from steerc.highlight import words as W

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TERMINAL_CLASSES = {
    "NAME": "name",
    "INT": "number",
    "SIGNED_INT": "number",
    "NUMBER": "number",
    "PERCENT": "number",
    "STRING": "string",
    "LONG_STRING": "string",
    "COMPARE_OP": "comparison",
    "PLUS": "arithmetic",
    "MINUS": "arithmetic",
    "STAR": "arithmetic",
    "SLASH": "arithmetic",
    "EQUAL": "assignment",
    "COMMA": "punctuation",
    "COLON": "punctuation",
    "DOT": "punctuation",
    "LPAR": "bracket",
    "RPAR": "bracket",
    "LSQB": "bracket",
    "RSQB": "bracket",
    "LBRACE": "bracket",
    "RBRACE": "bracket",
    "_NL": "comment",  # its `#...` part; the newline is space
}
"""Lark terminal -> class, for every terminal that is not a keyword (test_highlight checks it is complete)."""


def is_keyword_terminal(term) -> bool:
    return term.pattern.type == "str" and term.pattern.value.isidentifier()


class _Recording(P._Layout):
    """The layout post-lexer, recording every token the lexer hands it."""

    tokens: list

    def process(self, stream):
        def tee():
            for tok in stream:
                self.tokens.append(tok)
                yield tok

        return super().process(tee())


_RECORDER = _Recording()
_PARSER = None


def lark_tokens(text: str) -> tuple[list, bool]:
    """(the tokens steerc's lexer read, whether the whole text parsed)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = load(_RECORDER)
    _RECORDER.tokens = []
    state = P._ParseState(Source("<highlight>", text))
    reset = P._state.set(state)
    try:
        _PARSER.parse(text if text.endswith("\n") else text + "\n")
        ok = True
    except (UnexpectedInput, P.SyntaxDiagnostic):
        ok = False
    finally:
        P._state.reset(reset)
    return _RECORDER.tokens, ok


def reference_spans(text: str) -> tuple[list[tuple[int, int, str, str]], int]:
    """(the tokens as (start, end, class, text), how many leading characters the lexer vouches for).

    Comments are tokens of class ``comment``; spaces and newlines are not
    tokens. When the text does not parse, only the characters before the
    last token read are vouched for (that token, and what follows, the
    parser refused).
    """
    tokens, ok = lark_tokens(text)
    spans = []
    for tok in tokens:
        start, end = tok.start_pos, min(tok.end_pos, len(text))
        if tok.type == "_NL":
            end = start + len(tok.value.rstrip("\n"))
            if end > start:
                spans.append((start, end, "comment", text[start:end]))
            continue
        cls = TERMINAL_CLASSES[tok.type] if tok.type in TERMINAL_CLASSES else W.keyword_class(tok.value)
        assert cls is not None, tok
        spans.append((start, end, cls, tok.value))
    checked = len(text) if ok else (tokens[-1].start_pos if tokens else 0)
    return spans, checked


def char_classes(spans, length: int) -> list[str]:
    """A class for each character: its token's, or ``space``."""
    classes = ["space"] * length
    for start, end, cls, _ in spans:
        classes[start:end] = [cls] * (end - start)
    return classes


NAME_ROLES = ("function", "call", "site", "pool", "declared", "block", "argument", "field", "name")
"""The classes a highlighter may give a NAME token (by where it stands)."""


def may_colour_name(role: str, word: str) -> bool:
    """Whether a highlighter may colour the name ``word`` as ``role``: builtin colours only for builtin words."""
    if role == "function":
        return word in W.FUNCTIONS
    if role == "site":
        return word in W.SITE_KINDS
    if role == "pool":
        return word in {part for pool in W.POOLS for part in pool.split(".")}
    return role in NAME_ROLES


def steer_files() -> list[str]:
    """Every .steer file the tests know: the shared examples, examples/ and the corpus under tests/."""
    shared = examples_path()
    found = sorted(glob.glob(os.path.join(shared, "**", "*.steer"), recursive=True)) if os.path.isdir(shared) else []
    for root in ("examples", "tests"):
        found += sorted(glob.glob(os.path.join(REPO, root, "**", "*.steer"), recursive=True))
    return found


def file_id(path: str) -> str:
    shared = examples_path()
    if path.startswith(os.path.abspath(shared) + os.sep):
        return "shared/" + os.path.relpath(path, shared)
    return os.path.relpath(path, REPO)


def read(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read()


# Programs where a keyword of one place is a name in another (the grammar's keywords are contextual).
KEYWORDS_AS_NAMES = [
    "steer 1\nvector add = [1.0, 2.0]\nparam in = 2\n",
    "steer 1\nvector to = [1.0]\nintervention at {\n  at resid_pre[0]\n  clamp to to 2\n}\n",
    "steer 1\nparam deg = 30deg\nparam by = deg * 2 in [0, 4] per request\n",
    'steer 1\nvector norm = load("v.npy", per_layer=true)\nvector all = load("v.npy", per_layer=(true))\n',
    "steer 1\nprobe prompt {\n  at resid_post[1]\n  read dot(norm) - 0.5\n  pool prompt.last\n}\n",
    "steer 1\nmodel {\n  param = 3\n  model = true\n  vector = -2\n  steer = \"x\"\n}\n",
    "steer 1\nintervention rotate {\n  at head[(1, 3), 0:2]\n  rotate in (and, or) by -15 deg\n"
    "  tokens prompt[-3:], generated[:2], [0, 1], after \"A:\", all\n"
    "  when not (and > 0.5 or (or < 1)) and f(x) >= 2\n}\n",
    "steer 1\nintervention s { at mlp_out[1, 50%:100%]\n  preserve norm\n  suppress }\n",
    'steer 1\nconstrain regex from "r.txt"\n',
    'steer 1\nconstrain json_schema """{"a": "\\q"}"""\n',
    'steer 1\nconstrain regex from """k.\n"""\n',  # a string over two lines (found by the random programs)
    'steer 1\nconstrain choice ["a\\n\\u00e9", "\\"", ""]\n',
    "steer 1\nvector v = [1.,\n  .5, 2e-3,  # a comment inside brackets\n  1.5E+2]\n",
    "# leading comment\n\n\nsteer 1 # trailing\n\r\nparam p = 1\r\n",
    "steer 1\nintervention x {\n  at resid_post[*]\n"
    "  add decay(0.5) * ramp(4) * window(1, 8) * normalize(\n    [1, 2])\n}\n",
]


def assert_agrees(text: str, got: list, agrees, who: str, bounds: tuple[set, set], where: str = "") -> int:
    """Check what a highlighter gave each character of ``text`` against steerc's class for it.

    ``got[i]`` is what the highlighter gave character ``i``, ``agrees(cls,
    got[i], word)`` says whether that fits steerc's class ``cls`` (``word``:
    the text of the token holding it), ``bounds`` are the (starts, ends) of
    the highlighter's tokens: every name and keyword must be one token.
    Returns how many leading characters were checked.
    """
    spans, checked = reference_spans(text)
    classes = char_classes(spans, len(text))
    words = [""] * len(text)
    for start, end, _, value in spans:
        words[start:end] = [value] * (end - start)
    for i in range(checked):
        if not agrees(classes[i], got[i], words[i]):
            line = text.count("\n", 0, i) + 1
            col = i - (text.rfind("\n", 0, i) + 1) + 1
            raise AssertionError(
                f"{where}:{line}:{col}: {text[i]!r} in {words[i] or text[i]!r} is {classes[i]} to steerc, "
                f"{got[i]} to {who}\n  line: {text.splitlines()[line - 1]!r}"
            )
    starts, ends = bounds
    for start, end, cls, value in spans:
        if end <= checked and (cls == "name" or W.keyword_class(value) == cls):
            assert start in starts and end in ends, f"{where}: {value!r} at {start} is not one {who} token"
    return checked
