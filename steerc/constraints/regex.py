"""Validate a regex in the dialect structured decoding (xgrammar's regex converter) supports.

Supported: literals; escapes ``\\d \\D \\w \\W \\s \\S``, ``\\t \\n \\r \\f \\v \\0
\\a \\e``, ``\\xHH``, ``\\uXXXX``, ``\\u{...}``, ``\\UXXXXXXXX``, ``\\cX`` and any
escaped punctuation; classes ``[...]``/``[^...]`` with ranges; ``.``; groups
``( )``, ``(?: )`` and ``(?<name> )``; ``|``; quantifiers ``* + ?``, ``{n}``,
``{n,}``, ``{n,m}`` with an optional lazy ``?``; ``^`` at the start and ``$``
at the end (the whole output must match anyway).

Rejected, because structured decoding cannot enforce them: backreferences,
lookarounds, word boundaries, ``\\p{...}``, inline flags, ``(?P<...>)``.
Deliberately stricter than xgrammar (which warns and carries on): unknown
letter escapes such as ``\\q``, malformed ``\\u``/``\\x``, and ``^``/``$``
in the middle of a pattern (xgrammar silently ignores those anchors).

>>> check_regex(r"\\d{3}-\\d{4}")
[]
>>> [(p.message, p.offset) for p in check_regex("ab)")]
[('unmatched `)`', 2)]
"""

from __future__ import annotations

import re

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import show, xgrammar_error, xgrammar_problem
from steerc.constraints.regex_anchors import check_anchors

MAX_GROUP_DEPTH = 64
MAX_COUNT = 10**15  # the largest integer xgrammar's grammar parser takes
_CLASS_ESCAPES = "dDwWsS"
_CHAR_ESCAPES = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11, "0": 0, "a": 7, "e": 27}
_NO_ENFORCE = "structured decoding cannot enforce it"


def check_regex(pattern: str, use_xgrammar: bool = False) -> list[Problem]:
    """Check ``pattern``; return its problems (offsets index into ``pattern``).

    With ``use_xgrammar=True`` and a pattern this checker accepts, also ask
    ``xgrammar.Grammar.from_regex`` and report what it rejects.

    >>> [(p.message, p.offset, p.end) for p in check_regex("[z-a]")]
    [('range `z-a` is out of order', 1, 4)]
    >>> check_regex("(?=a)b")[0].message
    'lookahead `(?=` is not supported: structured decoding cannot enforce it'
    """
    parser = _Parser(pattern)
    try:
        tree = parser.parse()
    except _Fail as failure:
        return parser.problems + [failure.problem]
    except RecursionError:
        return [Problem(INVALID, "the pattern is nested too deeply to check", None)]
    if not parser.problems:
        parser.problems.extend(check_anchors(tree))
    if use_xgrammar and not parser.problems:
        parser.problems.extend(_xgrammar_problems(pattern))
    return parser.problems


def _xgrammar_problems(pattern: str) -> list[Problem]:
    """What ``xgrammar.Grammar.from_regex`` says about ``pattern``."""
    message = xgrammar_error(lambda xgr: xgr.Grammar.from_regex(pattern), key="regex:" + pattern)
    if message is None:
        return []
    m = re.search(r"at position (\d+)", message)
    offset = min(max(int(m.group(1)) - 1, 0), len(pattern)) if m else None
    return [xgrammar_problem(message, offset)]


class _Fail(Exception):
    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


# Parse tree (see regex_anchors): an alternation is a list of sequences; a
# sequence is a list of items: ("atom",), ("anchor", char, offset),
# ("group", alternation), ("repeat", item, max_or_None).


class _Parser:
    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.depth = 0
        self.problems: list[Problem] = []

    def fail(self, message, offset, end=None, help=None):
        raise _Fail(Problem(INVALID, message, offset, end, help))

    def note(self, message, offset, end=None, help=None):
        self.problems.append(Problem(INVALID, message, offset, end, help))

    def peek(self, k: int = 0) -> str:
        return self.t[self.i + k: self.i + k + 1]

    def parse(self) -> list:
        tree = self.alternation()
        if self.i < len(self.t):  # only a `)` stops an alternation early
            self.fail("unmatched `)`", self.i, self.i + 1, help="remove it, or add the `(` it closes")
        return tree

    def alternation(self) -> list:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches

    def sequence(self) -> list:
        items: list = []
        while self.i < len(self.t) and self.t[self.i] not in "|)":
            if self.t[self.i] in "*+?{":
                self.quantify(items)
            else:
                items.append(self.atom())
        return items

    def quantify(self, items: list) -> None:
        start, ch = self.i, self.t[self.i]
        if not items or items[-1][0] == "anchor":
            what = f"`{items[-1][1]}` is an anchor, so " if items else ""
            self.fail(f"nothing to repeat: {what}`{ch}` needs something before it", start, start + 1,
                      help=f"write `\\{ch}` to match a literal `{ch}`")
        if items[-1][0] == "repeat":
            self.fail("a quantifier cannot follow another quantifier", start, start + 1,
                      help="wrap the repeated part in `(?:...)` first")
        hi = self.braces(start) if ch == "{" else (1 if ch == "?" else None)
        if ch != "{":
            self.i += 1
        if self.peek() == "?":  # lazy: accepted, meaningless for a constraint
            self.i += 1
        items[-1] = ("repeat", items[-1], hi)

    def braces(self, start: int) -> int | None:
        m = re.compile(r"\{([0-9]+)(,([0-9]*))?\}").match(self.t, start)
        if m is None:
            self.fail("`{` must start a repetition count like `{2}`, `{2,}` or `{2,5}`", start, start + 1,
                      help="write `\\{` to match a literal `{`")
        self.i = m.end()
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
        if max(lo, hi or 0) > MAX_COUNT:
            self.note(f"repetition count in {show(m.group(0))} is too large (at most {MAX_COUNT})", start, m.end())
        elif hi is not None and lo > hi:
            self.note(f"repetition range {show(m.group(0))} has its minimum above its maximum",
                      start, m.end(), help=f"write `{{{hi},{lo}}}`")
        return hi

    def atom(self) -> tuple:
        ch = self.t[self.i]
        if ch == "(":
            return self.group()
        if ch == "[":
            self.char_class()
            return ("atom",)
        if ch == "\\":
            self.escape(in_class=False)
            return ("atom",)
        self.i += 1
        if ch in "^$":
            return ("anchor", ch, self.i - 1)
        return ("atom",)

    def group(self) -> tuple:
        start = self.i
        self.i += 1
        if self.peek() == "?":
            self.modifier(start)
        if self.depth >= MAX_GROUP_DEPTH:
            self.fail(f"groups are nested more than {MAX_GROUP_DEPTH} deep", start, start + 1)
        self.depth += 1
        inner = self.alternation()
        self.depth -= 1
        if self.i >= len(self.t):
            self.fail("`(` is never closed", start, start + 1, help="add a `)`, or write `\\(` for a literal `(`")
        self.i += 1
        return ("group", inner)

    def modifier(self, start: int) -> None:
        """After ``(?``: accept ``:`` and ``<name>``; note what cannot be enforced."""
        t, j = self.t, self.i + 1
        nxt = t[j: j + 1]
        if nxt == ":":
            self.i = j + 1
        elif nxt in ("=", "!") or t[j: j + 2] in ("<=", "<!"):
            kind = "lookahead" if nxt in "=!" else "lookbehind"
            self.i = j + (1 if kind == "lookahead" else 2)
            self.note(f"{kind} `{t[start:self.i]}` is not supported: {_NO_ENFORCE}", start, self.i)
        elif nxt == "<" or t[j: j + 2] == "P<":
            self.named_group(start, j + (1 if nxt == "<" else 2), python=nxt == "P")
        elif t[j: j + 2] == "P=":
            self.i = j + 2
            self.note(f"backreference `(?P=` is not supported: {_NO_ENFORCE}", start, self.i)
        elif nxt == "":
            self.fail("unfinished group: `(?` at the end of the pattern", start, j)
        else:
            m = re.compile(r"[a-zA-Z]*-?[a-zA-Z]*[:)]?").match(t, j)
            self.i = max(m.end() - (1 if m.group(0).endswith(")") else 0), j + 1)
            if m.group(0).rstrip(":)").replace("-", ""):
                message = f"inline flags {show(t[start:m.end()])} are not supported: structured decoding " \
                          "cannot apply them"
            else:
                message = f"group syntax {show(t[start:self.i])} is not supported: {_NO_ENFORCE}"
            self.note(message, start, self.i, help="use a plain group `(...)` or `(?:...)`")

    def named_group(self, start: int, name_start: int, python: bool) -> None:
        m = re.compile(r"([A-Za-z0-9_$]*)>").match(self.t, name_start)
        if m is None:
            self.fail("malformed named group; write `(?<name>...)`", start, name_start)
        self.i = m.end()
        name = m.group(1)
        if python:
            self.note(f"Python-style named group `(?P<{name}>` is not supported", start, self.i,
                      help=f"write `(?<{name}>...)` or a plain group `(...)`")
        elif not name:
            self.note("a named group needs a name, like `(?<name>...)`", start, self.i)
        elif not (name.isascii() and name.isalpha()):
            self.note(f"group name {show(name)} must be made of ASCII letters only", start, self.i,
                      help="structured decoding ignores group names; a plain group `(...)` works too")

    def char_class(self) -> None:
        start = self.i
        self.i += 1
        negated = self.peek() == "^"
        self.i += negated
        if self.peek() == "]":
            self.i += 1
            if not negated:
                self.note("empty character class `[]` can never match", start, self.i,
                          help="write `\\]` to match a literal `]`")
            return
        while self.i < len(self.t) and self.t[self.i] != "]":
            self.class_item()
        if self.i >= len(self.t):
            self.fail("unterminated character class: `[` is never closed", start, len(self.t),
                      help="add a `]`, or write `\\[` for a literal `[`")
        self.i += 1

    def class_item(self) -> None:
        item_start = self.i
        lo = self.class_char()
        if self.peek() != "-" or self.peek(1) in ("", "]") or lo is None:
            return
        self.i += 1
        hi = self.class_char()
        if hi is None:
            self.note("a range cannot end at a class escape like `\\d`", item_start, self.i,
                      help="write `\\-` for a literal `-`")
        elif lo > hi:
            self.note(f"range {show(self.t[item_start:self.i])} is out of order", item_start, self.i,
                      help=f"put the lower character first: `{_printable(hi)}-{_printable(lo)}`")

    def class_char(self) -> int | None:
        """One class member: its code point, or None for ``\\d`` and friends."""
        if self.t[self.i] == "\\":
            return self.escape(in_class=True)
        self.i += 1
        return ord(self.t[self.i - 1])

    def escape(self, in_class: bool) -> int | None:
        """Consume an escape; its code point, or None for a class escape or an error."""
        t, start = self.t, self.i
        if start + 1 >= len(t):
            self.fail("dangling backslash at the end of the pattern", start, start + 1,
                      help="write `\\\\` to match a backslash")
        c = t[start + 1]
        self.i = start + 2
        if c in _CLASS_ESCAPES:
            return None
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        if c == "b" and in_class:
            return 8
        if c in "uUx":
            return self.hex_escape(start, c)
        if c == "c":
            return self.control_escape(start)
        if c.isascii() and c.isalnum():
            return self.bad_escape(start, c, in_class)
        return ord(c)

    def hex_escape(self, start: int, c: str) -> int | None:
        t = self.t
        forms = {"u": r"\{([0-9a-fA-F]{1,6})\}|([0-9a-fA-F]{4})", "U": r"([0-9a-fA-F]{8})",
                 "x": r"([0-9a-fA-F]{2})(?![0-9a-fA-F])"}
        m = re.compile(forms[c]).match(t, start + 2)
        value = int(m.group(m.lastindex), 16) if m else 0x110000
        if m is None or value > 0x10FFFF:
            shape = {"u": "four hex digits (`\\u00e9`) or `{...}`", "U": "eight hex digits",
                     "x": "exactly two hex digits (use `\\u` for more)"}[c]
            self.note(f"`\\{c}` must be followed by {shape}", start, start + 2)
            return None
        self.i = m.end()
        return value

    def control_escape(self, start: int) -> int | None:
        letter = self.t[start + 2: start + 3]
        if letter.isascii() and letter.isalpha():
            self.i = start + 3
            return ord(letter) % 32
        self.note("`\\c` must be followed by a letter", start, start + 2)
        return None

    def bad_escape(self, start: int, c: str, in_class: bool) -> None:
        end = self.i
        if (c.isdigit() or c == "k") and not in_class:
            m = re.compile(r"<[^>]*>|" if c == "k" else "[0-9]*").match(self.t, end)
            self.i = m.end()
            self.note(f"backreference {show(self.t[start:self.i])} is not supported: {_NO_ENFORCE}",
                      start, self.i)
        elif c in "bB" and not in_class:
            self.note(f"word boundary `\\{c}` is not supported: {_NO_ENFORCE}", start, end)
        elif c in "pP":
            m = re.compile(r"\{[^}]*\}").match(self.t, end)
            self.i = m.end() if m else end
            self.note(f"Unicode property escape {show(self.t[start:self.i])} is not supported: "
                      f"{_NO_ENFORCE}", start, self.i, help="list the characters in a class like `[a-zA-Z]`")
        else:
            help = {"A": "use `^`", "Z": "use `$`", "z": "use `$`"}.get(c, f"write `{c}` to match it literally")
            self.note(f"unknown escape `\\{c}`", start, end, help=help)


def _printable(code: int) -> str:
    """A code point as it could be written inside a class."""
    ch = chr(code)
    return ch if ch.isprintable() and ch not in "\\]-^" else f"\\u{{{code:x}}}"
