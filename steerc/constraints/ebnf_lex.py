"""Tokens of xgrammar's EBNF (GBNF-style), with character offsets.

Mirrors xgrammar's lexer: names are ``[A-Za-z_.-][A-Za-z0-9_.-]*``; ``#``
starts a comment; strings are double-quoted, on one line, with C escapes
plus ``\\xH...``, ``\\uXXXX`` and ``\\UXXXXXXXX``; a character class is one
token; ``(=`` opens a lookahead; a name followed by ``::=`` starts a rule and
must begin its line.

>>> [t.kind for t in tokenize('root ::= "a" [b-c]*  # c')[0]]
['RULE', 'ASSIGN', 'STRING', 'CLASS', 'STAR', 'EOF']
"""

from __future__ import annotations

import re

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import show
from steerc.core.record import field, frozen

MAX_INTEGER = 10**15  # xgrammar's kMaxIntegerInGrammar
_NAME = re.compile(r"[A-Za-z_.\-][A-Za-z0-9_.\-]*")
_ATTRIBUTES = re.compile(r"\[[^\]\n\r]*\][ \t]*::=")
_SIMPLE = {"|": "PIPE", "*": "STAR", "+": "PLUS", "?": "QUEST", "{": "LBRACE", "}": "RBRACE",
           ",": "COMMA", "=": "EQUAL", ")": "RPAREN"}
_C_ESCAPES = {"'": 39, '"': 34, "?": 63, "\\": 92, "/": 47, "a": 7, "b": 8, "f": 12, "n": 10,
              "r": 13, "t": 9, "v": 11, "0": 0, "e": 27}
_CLASS_ESCAPES = {c: ord(c) for c in "^$\\.*+?()[]{}|/-"}
_CLASS_HELP = {"d": "[0-9]", "D": "[^0-9]", "w": "[a-zA-Z0-9_]", "W": "[^a-zA-Z0-9_]",
               "s": "[ \\t\\n\\r]", "S": "[^ \\t\\n\\r]"}


@frozen
class Token:
    r"""One token: ``kind``, its text span, a decoded ``value`` and whether a line break precedes it.

    For ``STRING`` the value is the decoded text and ``chars`` holds the source
    offset of each decoded character.

    >>> tokenize(r'x ::= "\tb"')[0][2]
    Token(kind='STRING', start=6, end=11, value='\tb', newline=False, chars=(7, 9, 10))
    """

    kind: str
    start: int
    end: int
    value: object = None
    newline: bool = False
    chars: tuple[int, ...] = field(default=(), eq=False)


class Fail(Exception):
    """A fault the parser cannot recover from."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem
        self.earlier: list[Problem] = []  # recoverable problems the lexer had found before


def fail(message: str, start: int | None, end: int | None = None, help: str | None = None):
    """Stop lexing or parsing with one problem.

    >>> try:
    ...     fail("unexpected character `;`", 3, 4)
    ... except Fail as stop:
    ...     print(stop.problem.offset)
    3
    """
    raise Fail(Problem(INVALID, message, start, end, help))


def tokenize(text: str) -> tuple[list[Token], list[Problem]]:
    """Split ``text`` into tokens; raise :class:`Fail` on a fatal fault, return the recoverable ones.

    >>> tokens, problems = tokenize('root ::= "\\\\q"')
    >>> problems[0].message, problems[0].offset
    ('invalid escape `\\\\q` in a string literal', 10)
    """
    lexer = _Lexer(text)
    try:
        tokens = lexer.run()
        _mark_rules(tokens)
    except Fail as failure:
        failure.earlier = lexer.problems
        raise
    return tokens, lexer.problems


class _Lexer:
    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.problems: list[Problem] = []

    def note(self, message: str, start: int, end: int, help: str | None = None) -> None:
        self.problems.append(Problem(INVALID, message, start, end, help))

    def run(self) -> list[Token]:
        tokens = []
        while True:
            newline = self.skip_space()
            token = self.next_token(newline)
            tokens.append(token)
            if token.kind == "EOF":
                return tokens

    def skip_space(self) -> bool:
        t, newline = self.t, False
        while self.i < len(t) and t[self.i] in " \t\r\n#":
            if t[self.i] == "#":
                while self.i < len(t) and t[self.i] not in "\r\n":
                    self.i += 1
                continue
            newline |= t[self.i] in "\r\n"
            self.i += 1
        return newline

    def next_token(self, newline: bool) -> Token:
        t, start = self.t, self.i
        if start >= len(t):
            return Token("EOF", start, start, None, newline)
        ch = t[start]
        kind = _SIMPLE.get(ch)
        if ch == "(":
            kind = "LOOK" if t.startswith("(=", start) else "LPAREN"
        elif ch == ":":
            if not t.startswith("::=", start):
                fail("expected `::=`", start, start + 1, help="rules are written `name ::= ...`")
            self.i += 3
            return Token("ASSIGN", start, self.i, None, newline)
        elif ch == '"':
            return self.string(newline)
        elif ch == "[":
            return self.char_class(newline)
        elif ch in "0123456789":
            return self.integer(newline)
        elif _NAME.match(t, start):
            return self.name(newline)
        if kind is None:
            help = {"'": 'string literals use double quotes: `"a"`', ";": "rules end where the next rule starts; "
                    "remove the `;`"}.get(ch)
            fail(f"unexpected character {show(ch)}", start, start + 1, help=help)
        self.i += 2 if kind == "LOOK" else 1
        return Token(kind, start, self.i, None, newline)

    def name(self, newline: bool) -> Token:
        m = _NAME.match(self.t, self.i)
        self.i = m.end()
        attrs = _ATTRIBUTES.match(self.t, self.i) if self.t.startswith("[", self.i) else None
        if attrs is not None:
            end = self.t.index("]", self.i) + 1
            self.note(f"rule attributes like {show(self.t[self.i:end])} are an xgrammar extension steerc "
                      "does not accept", self.i, end, help="remove the `[...]` after the rule name")
            self.i = end
        return Token("NAME", m.start(), m.end(), m.group(0), newline)

    def integer(self, newline: bool) -> Token:
        m = re.compile(r"[0-9]+").match(self.t, self.i)
        self.i = m.end()
        value = int(m.group(0))
        if value > MAX_INTEGER:
            self.note(f"the number {show(m.group(0))} is too large (at most {MAX_INTEGER})", m.start(), m.end())
        return Token("INT", m.start(), m.end(), value, newline)

    def string(self, newline: bool) -> Token:
        t, start = self.t, self.i
        i, out, chars = start + 1, [], []
        while i < len(t) and t[i] not in '"\r\n':
            chars.append(i)
            if t[i] == "\\" and i + 1 < len(t) and t[i + 1] not in "\r\n":
                code, i = self.escape(i, _C_ESCAPES, "a string literal")
            else:
                code, i = (ord(t[i]), i + 1) if t[i] != "\\" else (92, i + 1)
            out.append(chr(code))
        if i >= len(t) or t[i] != '"':
            fail("unterminated string literal", start, i, help='close it with `"` on the same line')
        self.i = i + 1
        return Token("STRING", start, self.i, "".join(out), newline, tuple(chars) + (i,))

    def escape(self, i: int, table: dict[str, int], where: str) -> tuple[int, int]:
        """Decode the escape at ``t[i] == '\\\\'``; return (code point, next offset)."""
        t, c = self.t, self.t[i + 1]
        if c in table:
            return table[c], i + 2
        forms = {"x": r"[0-9a-fA-F]+", "u": r"[0-9a-fA-F]{4}", "U": r"[0-9a-fA-F]{8}"}
        m = re.compile(forms[c]).match(t, i + 2) if c in forms else None
        if m is not None and int(m.group(0), 16) <= 0x10FFFF:
            return int(m.group(0), 16), m.end()
        if m is not None:
            self.note(f"the escape {show(t[i:m.end()])} is beyond U+10FFFF", i, m.end())
            return 0xFFFD, m.end()
        help = {"x": "`\\x` needs hex digits", "u": "`\\u` needs four hex digits",
                "U": "`\\U` needs eight hex digits"}.get(c, "valid escapes: \\\" \\\\ \\n \\r \\t \\xHH \\uXXXX ...")
        self.note(f"invalid escape {show(t[i:i + 2])} in {where}", i, i + 2, help=help)
        return ord(c), i + 2

    def char_class(self, newline: bool) -> Token:
        t, start = self.t, self.i
        i = start + 1 + t.startswith("^", start + 1)
        items: list[tuple[str, int, int, int]] = []  # (kind, code point, start, end)
        while i < len(t) and t[i] != "]":
            if t[i] in "\r\n":
                fail("character class is not closed on this line", start, i, help="add a `]`")
            if t[i] == "\\" and i + 1 < len(t) and t[i + 1] in _CLASS_HELP:
                self.note(f"class escape {show(t[i:i + 2])} is not supported inside an EBNF character class",
                          i, i + 2, help=f"write the characters out, e.g. `{_CLASS_HELP[t[i + 1]]}`")
                code, nxt = 0, i + 2
            elif t[i] == "\\" and i + 1 < len(t) and t[i + 1] not in "\r\n":
                code, nxt = self.escape(i, {**_C_ESCAPES, **_CLASS_ESCAPES}, "a character class")
            else:
                code, nxt = ord(t[i]), i + 1
            items.append(("dash" if t[i] == "-" else "char", code, i, nxt))
            i = nxt
        if i >= len(t):
            fail("unterminated character class", start, i, help="add a `]`, or write `\"[\"` for a literal `[`")
        self.i = i + 1
        self.check_ranges(items)
        return Token("CLASS", start, self.i, None, newline)

    def check_ranges(self, items: list[tuple[str, int, int, int]]) -> None:
        """``a-z`` must be in order; a ``-`` first, last or after a range is literal."""
        k = 0
        while k < len(items):
            low = items[k]
            k += 1
            if k + 1 < len(items) and items[k][0] == "dash":
                high = items[k + 1]
                if low[1] > high[1]:
                    self.note(f"range {show(self.t[low[2]:high[3]])} is out of order", low[2], high[3],
                              help="put the lower character first")
                k += 2


def _mark_rules(tokens: list[Token]) -> None:
    """Turn each ``NAME`` before ``::=`` into ``RULE``; a rule must start its line."""
    for k, token in enumerate(tokens):
        if token.kind != "ASSIGN":
            continue
        if k == 0 or tokens[k - 1].kind != "NAME":
            fail("`::=` must follow a rule name", token.start, token.end)
        name = tokens[k - 1]
        if k >= 2 and not name.newline:
            fail(f"the rule {show(name.value)} must start on a new line", name.start, name.end,
                 help="put a line break before the rule name")
        tokens[k - 1] = Token("RULE", name.start, name.end, name.value, name.newline)
