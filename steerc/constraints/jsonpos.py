"""A strict JSON parser (RFC 8259) that remembers where every value and key is.

:func:`parse_json` returns the plain Python value plus a :class:`Located`
side table mapping JSON pointers (``"/properties/a/type"``) to the
``(start, end)`` character offsets of each value and of each member's key.
No trailing commas, comments, single quotes or ``NaN``; a duplicate key is
reported (pointing at the second key) but parsing goes on, last value wins.

>>> doc, problems = parse_json('{"a": [1, true]}')
>>> doc.value, doc.values["/a/1"], doc.keys["/a"], problems
({'a': [1, True]}, (10, 14), (1, 4), [])
>>> parse_json('{"a": 1,}')[1][0].message
'a trailing comma is not allowed in JSON'
"""

from __future__ import annotations

import math
import re

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import did_you_mean, show
from steerc.core.limits import MAX_JSON_INT_DIGITS
from steerc.core.record import field, frozen

MAX_DEPTH = 128  # keeps the recursive descent well inside Python's stack
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_WS = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WORDS = {"true": True, "false": False, "null": None}


@frozen
class Located:
    """A parsed JSON document with the offsets of its values and keys."""

    value: object
    values: dict[str, tuple[int, int]] = field(factory=dict)
    keys: dict[str, tuple[int, int]] = field(factory=dict)


def pointer(parent: str, token: str | int) -> str:
    """Extend a JSON pointer by one reference token (escaping ``~`` and ``/``).

    >>> pointer("/properties", "a/b")
    '/properties/a~1b'
    """
    return parent + "/" + str(token).replace("~", "~0").replace("/", "~1")


class _Fail(Exception):
    """A syntax error: parsing cannot go on."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


def parse_json(text: str) -> tuple[Located | None, list[Problem]]:
    """Parse ``text``; return ``(document, problems)`` with ``document`` None on a syntax error.

    >>> parse_json('{"a": 1, "a": 2}')[1][0].offset
    9
    >>> parse_json('[1, 2')[1][0].message
    'unexpected end of text — 1 `[` still open'
    """
    parser = _Parser(text)
    try:
        value = parser.document()
    except _Fail as failure:
        return None, parser.problems + [failure.problem]
    except RecursionError:
        return None, parser.problems + [Problem(INVALID, "the JSON is nested too deeply to check", None)]
    return Located(value, parser.values, parser.keys), parser.problems


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.i = 0
        self.open: list[tuple[str, int]] = []  # ("{" or "[", offset) of unclosed brackets
        self.values: dict[str, tuple[int, int]] = {}
        self.keys: dict[str, tuple[int, int]] = {}
        self.problems: list[Problem] = []

    # -- helpers ---------------------------------------------------------

    def fail(self, message: str, offset: int, end: int | None = None, help: str | None = None):
        raise _Fail(Problem(INVALID, message, offset, end, help))

    def skip_ws(self) -> None:
        text, i = self.text, self.i
        while i < len(text) and text[i] in _WS:
            i += 1
        self.i = i
        if text.startswith(("//", "/*"), i):
            self.fail("comments are not allowed in JSON", i, i + 2)

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def end_of_text(self) -> None:
        """Fail at the end of the text, saying what is still open."""
        counts = {b: sum(1 for o, _ in self.open if o == b) for b in "{["}
        still = " and ".join(f"{n} `{b}`" for b, n in counts.items() if n)
        message = "unexpected end of text" + (f" — {still} still open" if still else "")
        help = None
        if self.open:
            bracket, at = self.open[-1]
            help = f"the `{bracket}` at offset {at} is never closed"
        self.fail(message, len(self.text), help=help)

    # -- grammar ---------------------------------------------------------

    def document(self) -> object:
        self.skip_ws()
        if self.i >= len(self.text):
            self.fail("expected a JSON value, but the text is empty", 0)
        value = self.value("")
        self.skip_ws()
        if self.i < len(self.text):
            self.fail(f"unexpected {show(self.peek())} after the end of the JSON value", self.i, self.i + 1)
        return value

    def value(self, ptr: str) -> object:
        self.skip_ws()
        start, ch = self.i, self.peek()
        if ch == "{":
            value: object = self.container(ptr, "{", "}", self.members)
        elif ch == "[":
            value = self.container(ptr, "[", "]", self.elements)
        elif ch == '"':
            value = self.string()
        elif ch != "" and ch in "-0123456789":
            value = self.number()
        elif ch == "":
            self.end_of_text()
        else:
            value = self.word()
        self.values[ptr] = (start, self.i)
        return value

    def container(self, ptr, opening, closing, body):
        if len(self.open) >= MAX_DEPTH:
            self.fail(f"JSON nested deeper than {MAX_DEPTH} levels", self.i, self.i + 1)
        self.open.append((opening, self.i))
        self.i += 1
        self.skip_ws()
        if self.peek() == closing:
            result = {} if opening == "{" else []
        else:
            result = body(ptr)
        self.i += 1  # the closing bracket, checked by ``body``
        self.open.pop()
        return result

    def members(self, ptr: str) -> dict:
        result: dict = {}
        while True:
            self.skip_ws()
            key_start = self.i
            key = self.key()
            member = pointer(ptr, key)
            if key in result:
                self.problems.append(Problem(
                    INVALID, f"duplicate key {show(key)} in an object", key_start, self.i,
                    help=f"the key first appears at offset {self.keys[member][0]}"))
            self.keys[member] = (key_start, self.i)
            self.skip_ws()
            if self.peek() != ":":
                self.expected_after("`:` after an object key")
            self.i += 1
            result[key] = self.value(member)
            if not self.separator("}", "an object member"):
                return result

    def elements(self, ptr: str) -> list:
        result: list = []
        while True:
            result.append(self.value(pointer(ptr, len(result))))
            if not self.separator("]", "an array element"):
                return result

    def separator(self, closing: str, what: str) -> bool:
        """After a member/element: True on `,` (more follow), False on the closing bracket."""
        self.skip_ws()
        ch = self.peek()
        if ch == closing:
            return False
        if ch != ",":
            self.expected_after(f"`,` or `{closing}` after {what}")
        comma = self.i
        self.i += 1
        self.skip_ws()
        if self.peek() == closing:
            self.fail("a trailing comma is not allowed in JSON", comma, comma + 1, help="remove the `,`")
        return True

    def expected_after(self, what: str):
        if self.i >= len(self.text):
            self.end_of_text()
        self.fail(f"expected {what}", self.i, self.i + 1)

    def key(self) -> str:
        ch = self.peek()
        if ch == '"':
            return self.string()
        if ch == "":
            self.end_of_text()
        if ch == "'":
            self.fail("JSON strings use double quotes, not `'`", self.i, self.i + 1)
        help = 'write the key in double quotes, e.g. `"type"`' if ch.isalpha() or ch == "_" else None
        self.fail("expected a string key in double quotes", self.i, self.i + 1, help=help)

    def string(self) -> str:
        start = self.i
        text, i = self.text, self.i + 1
        out: list[str] = []
        while True:
            j = i
            while j < len(text) and text[j] not in '"\\' and text[j] >= " ":
                j += 1
            out.append(text[i:j])
            i = j
            if i >= len(text) or text[i] in "\r\n":
                self.fail("unterminated string", start, i,
                          help="close it with `\"` on the same line" if i < len(text) else None)
            ch = text[i]
            if ch == '"':
                self.i = i + 1
                return "".join(out)
            if ch == "\\":
                decoded, i = self.escape(i)
                out.append(decoded)
            else:
                self.fail(f"control character U+{ord(ch):04X} must be escaped inside a string", i, i + 1)

    def escape(self, i: int) -> tuple[str, int]:
        text = self.text
        ch = text[i + 1: i + 2]
        if ch in _ESCAPES:
            return _ESCAPES[ch], i + 2
        if ch == "u":
            digits = text[i + 2: i + 6]
            if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
                return self.surrogate_pair(int(digits, 16), i + 6)
            self.fail("`\\u` must be followed by four hex digits", i, min(i + 6, len(text)))
        if ch == "":
            self.fail("unterminated string", i, i + 1)
        self.fail(f"invalid escape `\\{ch}` in a string", i, i + 2,
                  help='valid escapes are \\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX')

    def surrogate_pair(self, code: int, i: int) -> tuple[str, int]:
        text = self.text
        if 0xD800 <= code < 0xDC00 and text[i: i + 2] == "\\u":
            digits = text[i + 2: i + 6]
            if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
                low = int(digits, 16)
                if 0xDC00 <= low < 0xE000:
                    return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 6
        if 0xD800 <= code < 0xE000:  # a lone surrogate is not a character: no text can hold it
            self.fail(f"`\\u{code:04x}` is a lone surrogate, not a character", i - 6, i,
                      help="write the character itself, or a complete surrogate pair such as `\\ud83d\\ude00`")
        return chr(code), i

    def number(self) -> int | float:
        m = _NUMBER.match(self.text, self.i)
        if m is None:
            self.fail("a number must have a digit after `-`", self.i, self.i + 1)
        after = self.text[m.end(): m.end() + 1]
        if after and (after.isalnum() or after in ".+-"):
            self.fail(f"malformed number {show(self.text[self.i: m.end() + 1])}", self.i, m.end() + 1,
                      help="JSON numbers look like `12`, `-0.5` or `1e3`, without leading zeros")
        start, self.i = self.i, m.end()
        if m.group(1) or m.group(2):
            value = float(m.group(0))
            if math.isinf(value):
                self.fail(f"the number {show(m.group(0))} is too large for a float64", start, self.i)
            return value
        digits = len(m.group(0).lstrip("-"))
        if digits > MAX_JSON_INT_DIGITS:  # int() of more digits than Python allows would raise
            self.fail(f"an integer of {digits:,} digits (at most {MAX_JSON_INT_DIGITS})", start, self.i)
        return int(m.group(0))

    def word(self) -> object:
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.i)
        if m is None:
            ch = self.peek()
            if ch == "'":
                self.fail("JSON strings use double quotes, not `'`", self.i, self.i + 1)
            self.fail(f"expected a JSON value, found {show(ch)}", self.i, self.i + 1)
        word = m.group(0)
        if word in _WORDS:
            self.i = m.end()
            return _WORDS[word]
        aliases = {"True": "true", "False": "false", "None": "null", "nil": "null"}
        help = (f"did you mean `{aliases[word]}`?" if word in aliases
                else did_you_mean(word, _WORDS) if word not in ("NaN", "Infinity") else None)
        self.fail(f"{show(word)} is not a JSON value", self.i, m.end(), help=help)


def char_offsets(text: str, start: int) -> list[int]:
    """Where each character of the JSON string literal at ``text[start]`` came from.

    Item ``k`` is the source offset of decoded character ``k``; one more item
    gives the offset of the closing quote.

    >>> char_offsets(r'"a\\tb"', 0)
    [1, 2, 4, 5]
    """
    out: list[int] = []
    i = start + 1
    while i < len(text) and text[i] != '"':
        out.append(i)
        if text[i] != "\\":
            i += 1
        elif text[i + 1: i + 2] != "u":
            i += 2
        else:
            high = text[i + 2: i + 6]
            i += 6
            if high[:2].upper() == "D8" or high[:2].upper() in ("D9", "DA", "DB"):
                low = text[i + 2: i + 6]
                if text[i: i + 2] == "\\u" and len(low) == 4 and low[0] in "dD" and low[1] in "cdefCDEF":
                    i += 6
    out.append(i)
    return out
