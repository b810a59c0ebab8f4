"""Where a key or a value sits in a TOML text, for carets into ``steer.toml``.

``tomllib`` gives values, not positions. This scanner reads the table
headers and ``key = value`` lines (bare, quoted and dotted keys) of a text
that has already parsed, and records, for each full key path, the span of
the key and of its value on its line. A key inside an inline table or on a
continuation line of a multi-line value is not recorded: :func:`locate`
then answers for the nearest enclosing key it knows.

>>> spots = scan('[defaults]\\nmodel = "m"  # here\\n"two words".x = 1\\n')
>>> spots[("defaults", "model")]
((11, 16), (19, 22))
>>> spots[("defaults", "two words", "x")][0]
(31, 44)
"""

from __future__ import annotations

import re

from steerc.project.toml import tomllib

_BARE = r"[A-Za-z0-9_-]+"
_BASIC = r'"(?:[^"\\\n]|\\.)*"'
_LITERAL = r"'[^'\n]*'"
_KEY = rf"(?:{_BARE}|{_BASIC}|{_LITERAL})"
_DOTTED = rf"{_KEY}(?:[ \t]*\.[ \t]*{_KEY})*"
_HEADER = re.compile(rf"[ \t]*\[\[?[ \t]*({_DOTTED})[ \t]*\]")
_PAIR = re.compile(rf"[ \t]*({_DOTTED})[ \t]*=[ \t]*")
_CLOSE = {"[": "]", "{": "}"}

Spot = tuple[tuple[int, int], tuple[int, int]]  # (key start, end), (value start, end): character offsets


def scan(text: str) -> dict[tuple[str, ...], Spot]:
    """Every key path the scanner finds, with its key and value spans (offsets into ``text``)."""
    spots: dict[tuple[str, ...], Spot] = {}
    table: tuple[str, ...] = ()
    offset = 0
    for line in text.split("\n"):
        header = _HEADER.match(line)
        pair = None if header else _PAIR.match(line)
        if header:
            table = _parts(header.group(1))
            key = (offset + header.start(1), offset + header.end(1))
            spots.setdefault(table, (key, key))
        elif pair:
            start = pair.end()
            key = (offset + pair.start(1), offset + pair.end(1))
            value = (offset + start, offset + start + _value_length(line[start:]))
            spots.setdefault(table + _parts(pair.group(1)), (key, value))
        offset += len(line) + 1
    return spots


def locate(spots: dict[tuple[str, ...], Spot], path: tuple[str, ...], value: bool = False) -> tuple[int, int] | None:
    """The span of the key ``path`` (or of its value), else of the nearest enclosing key found; None if none."""
    for n in range(len(path), 0, -1):
        spot = spots.get(path[:n])
        if spot is not None:
            return spot[1] if value and n == len(path) else spot[0]
    return None


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(_unquote(k) for k in re.findall(_KEY, dotted))


def _unquote(key: str) -> str:
    if key.startswith("'"):
        return key[1:-1]
    if key.startswith('"'):
        return tomllib.loads(f"k = {key}")["k"]
    return key


def _value_length(rest: str) -> int:
    """How much of ``rest`` (the line after ``=``) is the value: a string, a bracketed value closed on this
    line, or everything before a comment."""
    if rest[:1] in ('"', "'"):
        m = re.match(_BASIC if rest[0] == '"' else _LITERAL, rest)
        if m:
            return m.end()
    if rest[:1] in _CLOSE:
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == rest[0]
            depth -= ch == _CLOSE[rest[0]]
            if depth == 0:
                return i + 1
    body = rest.split("#", 1)[0].rstrip()
    return max(len(body), 1) if rest else 0


def too_deep(text: str, limit: int) -> int | None:
    """The offset of the first ``[`` or ``{`` nested deeper than ``limit`` (strings and comments skipped), or None.

    ``tomllib`` recurses once per level and would overflow the stack on a deep enough value.

    >>> too_deep('a = [[1], "[[["]  # [[[', 2), too_deep("a = [[[1]]]", 2)
    (None, 6)
    """
    depth, i, quote = 0, 0, None
    while i < len(text):
        i, quote, bare = _scan(text, i, quote)
        if not bare:
            continue
        if text[i] in "[{":
            depth += 1
            if depth > limit:
                return i
        elif text[i] in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


_WORD = re.compile(r"[0-9A-Za-z_.+:-]+")


def long_number(text: str, limit: int) -> tuple[int, int] | None:
    """The offsets of the first bare number (strings and comments skipped) longer than ``limit`` characters,
    or None.

    Python reads a TOML integer with ``int``, which refuses more than 4,300 digits and takes time quadratic
    in the digits below that.

    >>> long_number('a = "1111111"  # 2222222\\nb = 3_333_333', 5)
    (29, 38)
    >>> long_number("a1111111 = [1, 22]", 5) is None
    True
    """
    i, quote = 0, None
    while i < len(text):
        i, quote, bare = _scan(text, i, quote)
        if not bare:
            continue
        ch = text[i]
        m = _WORD.match(text, i)  # a number, or a key or word skipped whole (`a1111 = 1` is a key)
        if m is not None:
            if (ch.isdigit() or ch in "+-.") and m.end() - i > limit:
                return i, m.end()
            i = m.end() - 1
        i += 1
    return None


def _scan(text: str, i: int, quote: str | None) -> tuple[int, str | None, bool]:
    """One step through TOML text at ``i`` inside the string opened by ``quote`` (None: outside any):
    ``(where to go on, the string still open, whether text[i] is bare TOML)``. Strings and comments are
    stepped over; at a bare character nothing moves, and the caller reads it and steps on."""
    ch = text[i]
    if quote is not None:
        if ch == "\\" and quote[0] == '"':
            return i + 2, quote, False
        if text.startswith(quote, i) or (ch == "\n" and len(quote) == 1):
            return i + len(quote), None, False
        return i + 1, quote, False
    if ch == "#":
        end = text.find("\n", i)
        return (len(text) if end < 0 else end), None, False
    if ch in "\"'":
        quote = ch * 3 if text.startswith(ch * 3, i) else ch
        return i + len(quote), quote, False
    return i, None, True
