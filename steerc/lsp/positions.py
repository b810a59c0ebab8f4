"""LSP positions and steerc's: code units of an encoding against code points.

An LSP position is a 0-based line and a 0-based ``character`` counted in
code units of the negotiated encoding: ``utf-16`` (the default), ``utf-8``
or ``utf-32`` (LSP 3.17 ``positionEncoding``). Lines end at ``\\n``,
``\\r\\n`` or ``\\r``, and nowhere else (not at U+2028 or form feeds, where
``str.splitlines`` would cut). steerc counts columns in code points, and
checks the text with its line ends made ``\\n`` (as ``steerc check`` reads a
file), which keeps every line's number and content.

>>> units("a😀b", UTF16), units("a😀b", UTF8), units("a😀b", UTF32)
(4, 6, 3)
>>> index("a😀b", 3, UTF16), index("a😀b", 2, UTF16)  # inside the pair: the start of 😀
(2, 1)
>>> doc = Document("x = 1\\r\\ny = 😀 + 2\\n")
>>> doc.apply(((1, 4), (1, 6)), "3")  # 😀 is two UTF-16 units
>>> doc.text
'x = 1\\r\\ny = 3 + 2\\n'
"""

from __future__ import annotations

import re

from steerc.core.source import Source

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)

_LINE_END = re.compile(r"\r\n|\r|\n")


def _width(ch: str, encoding: str) -> int:
    o = ord(ch)
    if encoding == UTF16:
        return 2 if o > 0xFFFF else 1
    if encoding == UTF8:
        return 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
    return 1


def units(text: str, encoding: str) -> int:
    """The length of ``text`` in code units of ``encoding`` (a lone surrogate is one UTF-16 unit)."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF16:
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    return len(text.encode("utf-8", "surrogatepass"))


def index(line: str, character: int, encoding: str) -> int:
    """The code-point index in ``line`` of ``character`` code units; a unit inside a character gives that
    character's start, one past the end gives the line's end."""
    character = max(character, 0)
    if encoding == UTF32 or line.isascii():
        return min(character, len(line))
    count = 0
    for i, ch in enumerate(line):
        count += _width(ch, encoding)
        if count > character:
            return i
    return len(line)


def normalize(text: str) -> str:
    """``text`` with ``\\r\\n`` and ``\\r`` made ``\\n``, as ``steerc check`` reads a file (the same function)."""
    from steerc.core.source import normalize_newlines

    return normalize_newlines(text)


class Document:
    """An open document: its text as the client has it, and edits to it in LSP positions.

    ``encoding`` is the negotiated position encoding; ``version`` the client's.
    """

    __slots__ = ("text", "version", "encoding", "_starts")

    def __init__(self, text: str, version: int = 0, encoding: str = UTF16):
        self.text = text
        self.version = version
        self.encoding = encoding
        self._starts: list[int] | None = None

    def _line_starts(self) -> list[int]:
        if self._starts is None:
            self._starts = [0] + [m.end() for m in _LINE_END.finditer(self.text)]
        return self._starts

    def offset(self, line: int, character: int) -> int:
        """The code-point offset in ``text`` of an LSP position (clamped into the text)."""
        starts = self._line_starts()
        if line < 0:
            return 0
        if line >= len(starts):
            return len(self.text)
        start = starts[line]
        end = starts[line + 1] if line + 1 < len(starts) else len(self.text)
        body = _LINE_END.sub("", self.text[start:end])
        return start + index(body, character, self.encoding)

    def apply(self, rng: tuple[tuple[int, int], tuple[int, int]] | None, text: str) -> None:
        """Replace the range ``((line, character), (line, character))`` with ``text``; None replaces it all."""
        if rng is None:
            self.text = text
        else:
            (l1, c1), (l2, c2) = rng
            start, end = self.offset(l1, c1), self.offset(l2, c2)
            start, end = min(start, end), max(start, end)
            self.text = self.text[:start] + text + self.text[end:]
        self._starts = None

    def end(self) -> tuple[int, int]:
        """The LSP position of the end of the text."""
        starts = self._line_starts()
        return len(starts) - 1, units(self.text[starts[-1]:], self.encoding)


def lsp_position(source: Source, line: int, column: int, encoding: str) -> tuple[int, int]:
    """The LSP (line, character) of steerc's 1-based ``line`` and code-point ``column`` in ``source``.

    >>> lsp_position(Source("a", "é😀x\\n"), 1, 3, UTF16), lsp_position(Source("a", "é😀x\\n"), 1, 3, UTF8)
    ((0, 3), (0, 6))
    """
    text = source.line_text(line)
    return line - 1, units(text[: max(column - 1, 0)], encoding)


def source_offset(source: Source, line: int, character: int, encoding: str) -> int:
    """The code-point offset in ``source`` (normalized text) of an LSP position.

    >>> source_offset(Source("a", "x\\n😀y\\n"), 1, 2, UTF16)
    3
    """
    if line >= source.line_count:
        return len(source.text)
    if line < 0:
        return 0
    return source.offset(line + 1, 1) + index(source.line_text(line + 1), character, encoding)
