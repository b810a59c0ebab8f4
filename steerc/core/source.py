"""Source text and spans.

A :class:`Span` is a half-open region of one source: 1-based line and column
of its first character, and the line and column just past its last one. Spans
live in IR nodes in fields excluded from equality, so two programs that mean
the same thing compare equal wherever they were written.

>>> src = Source("a.steer", "steer 1\\nvector v = [1.0]\\n")
>>> span = src.span(8, 14)
>>> (span.line, span.column, span.end_line, span.end_column)
(2, 1, 2, 7)
>>> src.line_text(2)
'vector v = [1.0]'
"""

from __future__ import annotations

import bisect

from steerc.core.limits import MAX_SOURCE_BYTES
from steerc.core.record import field, frozen


@frozen
class Span:
    """Where something is: ``file``, 1-based ``line``/``column``, exclusive end."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int
    start: int = field(default=-1, eq=False)
    end: int = field(default=-1, eq=False)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.line, self.column, self.end_line, self.end_column)

    def to(self, other: Span) -> Span:
        """The span covering ``self`` through ``other``."""
        return Span(self.file, self.line, self.column, other.end_line,
                    other.end_column, self.start, other.end)


class Source:
    """One text being compiled, with a line index for span arithmetic.

    ``name`` is what diagnostics print (a path as the user gave it, or a
    placeholder such as ``<string>`` for embedded text).
    """

    __slots__ = ("name", "text", "path", "_line_starts")

    def __init__(self, name: str, text: str, path: str | None = None):
        self.name = name
        self.text = text
        self.path = path
        starts = [0]
        find = text.find
        i = find("\n")
        while i >= 0:
            starts.append(i + 1)
            i = find("\n", i + 1)
        self._line_starts = starts

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1] + 1

    def offset(self, line: int, column: int) -> int:
        line = max(1, min(line, len(self._line_starts)))
        return self._line_starts[line - 1] + column - 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        end_line, end_col = self.position(end)
        return Span(self.name, line, col, end_line, end_col, start, end)

    def line_text(self, line: int) -> str:
        if line < 1 or line > len(self._line_starts):
            return ""
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    @property
    def line_count(self) -> int:
        return len(self._line_starts)

    def whole_line(self, line: int) -> Span:
        text = self.line_text(line)
        start = self._line_starts[line - 1] if line <= len(self._line_starts) else len(self.text)
        return self.span(start, start + len(text))


def normalize_newlines(text: str) -> str:
    """``text`` with each line end made ``\\n``: ``\\r\\n`` and a lone ``\\r`` are one line end each.

    Every way a program arrives goes through this one function (files, standard input, the API's
    ``check_source``, the text an editor sends the language server), so the same bytes are the same program
    by every path. No other character ends a line (U+2028, U+0085, form feed, vertical tab): LSP cuts
    lines at these three only, and so does steerc.

    >>> normalize_newlines("a\\r\\nb\\rc\\n\\u2028d")
    'a\\nb\\nc\\n\\u2028d'
    """
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def decode_program(data: bytes) -> str:
    """The text of a program's bytes: UTF-8, a leading byte-order mark dropped (it marks the encoding, as
    editors read it), line ends normalized (:func:`normalize_newlines`).

    More than MAX_SOURCE_BYTES gives a text longer than the limit (never a shorter one), which the parser
    refuses with a ``limit-exceeded`` diagnostic. Raises UnicodeDecodeError for bytes (within the limit)
    that are not UTF-8.

    >>> decode_program(b"\\xef\\xbb\\xbfsteer 1\\r\\n# a\\rparam a = 1")
    'steer 1\\n# a\\nparam a = 1'
    """
    if len(data) > MAX_SOURCE_BYTES:
        return data.decode("utf-8", "replace")  # at least as many characters as the limit has bytes
    return normalize_newlines(data.decode("utf-8-sig"))


def read_program(path: str) -> str:
    """A program file's text (:func:`decode_program`), reading at most MAX_SOURCE_BYTES + 1 bytes.

    Raises OSError, and UnicodeDecodeError for a file (within the limit) that is not UTF-8.
    """
    with open(path, "rb") as fh:
        return decode_program(fh.read(MAX_SOURCE_BYTES + 1))


def read_stream(stream) -> str:
    """A program from a stream (standard input): its bytes decoded as a file's are, when it has them; the
    text of a text-only stream (an ``io.StringIO``) with its line ends normalized. Raises UnicodeDecodeError."""
    raw = getattr(stream, "buffer", None)
    if raw is not None:
        return decode_program(raw.read(MAX_SOURCE_BYTES + 1))
    text = stream.read(MAX_SOURCE_BYTES + 1)
    return text if len(text) > MAX_SOURCE_BYTES else normalize_newlines(text.removeprefix("\ufeff"))
