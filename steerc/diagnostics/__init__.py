"""Diagnostics: what steerc tells a user about their program.

One path for every error and warning a user can cause: a :class:`Diagnostic`
with a registered code, a severity, a message, a primary span, optional
notes (each with its own span) and an optional ``help`` line.

>>> from steerc.core.source import Source
>>> src = Source("x.steer", "steer 1\\nvector v = w\\n")
>>> d = Diagnostic.error("undefined-name", "undefined name `w`", src.span(19, 20),
...                      help="declare it with `vector w = ...` before this line")
>>> print(render_text(d, {"x.steer": src}))
error[undefined-name]: undefined name `w`
 --> x.steer:2:12
  |
2 | vector v = w
  |            ^
  |
  = help: declare it with `vector w = ...` before this line
"""

from __future__ import annotations

from steerc.core.limits import MAX_ECHO_COLUMNS, MAX_MESSAGE_CHARS, MAX_REPEATS
from steerc.core.record import evolve, field, frozen
from steerc.core.source import Source, Span, normalize_newlines
from steerc.core.text import shown, shown_with_offsets
from steerc.diagnostics.codes import CODES, INVALID_ENCODING

__all__ = [
    "CODES",
    "Diagnostic",
    "Diagnostics",
    "Note",
    "Refusal",
    "capped",
    "not_utf8",
    "omitted_line",
    "omitted_note",
    "printable",
    "render_text",
    "to_json_dict",
]


def printable(text: str) -> str:
    """``text`` with lone surrogates (not encodable as UTF-8) written as ``\\udXXX`` escapes.

    >>> printable("a\\ud800b")
    'a\\\\ud800b'
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _shorten(text: str | None) -> str | None:
    """A message, help line or note: printable, and at most MAX_MESSAGE_CHARS long."""
    if text is None:
        return None
    if len(text) > MAX_MESSAGE_CHARS:
        keep = MAX_MESSAGE_CHARS - 5
        text = text[: keep * 2 // 3] + " ... " + text[len(text) - (keep - keep * 2 // 3):]
    return printable(text)


@frozen
class Note:
    message: str = field(converter=_shorten)
    span: Span | None = None


@frozen
class Diagnostic:
    code: str
    severity: str
    message: str = field(converter=_shorten)
    span: Span | None
    notes: tuple[Note, ...] = ()
    help: str | None = field(default=None, converter=_shorten)
    label: str | None = field(default=None, converter=_shorten)
    # How many more diagnostics of this code were left out after this one (see `capped`).
    omitted: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unregistered diagnostic code {self.code!r}")

    @classmethod
    def error(cls, code: str, message: str, span: Span | None, **kw) -> Diagnostic:
        return cls(code, "error", message, span, **kw)

    @classmethod
    def warning(cls, code: str, message: str, span: Span | None, **kw) -> Diagnostic:
        return cls(code, "warning", message, span, **kw)

    @classmethod
    def of(cls, code: str, message: str, span: Span | None, **kw) -> Diagnostic:
        """A diagnostic with the registered default severity of ``code``."""
        return cls(code, CODES[code].severity, message, span, **kw)

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def sort_key(self) -> tuple:
        s = self.span
        return (s.file, s.line, s.column) if s else ("", 0, 0)


class Diagnostics:
    """An ordered collector; passes append, drivers read.

    >>> ds = Diagnostics()
    >>> ds.has_errors
    False
    """

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def add(self, diagnostic: Diagnostic) -> None:
        self.items.append(diagnostic)

    def error(self, code: str, message: str, span: Span | None, **kw) -> None:
        self.items.append(Diagnostic.error(code, message, span, **kw))

    def warning(self, code: str, message: str, span: Span | None, **kw) -> None:
        self.items.append(Diagnostic.warning(code, message, span, **kw))

    def extend(self, diagnostics) -> None:
        self.items.extend(diagnostics)

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.items)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.is_error]

    def sorted(self) -> list[Diagnostic]:
        return sorted(self.items, key=Diagnostic.sort_key)

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def capped(diagnostics, limit: int = MAX_REPEATS) -> list[Diagnostic]:
    """At most ``limit`` diagnostics per code, in order; the last one kept counts the rest.

    >>> from steerc.core.source import Source
    >>> ds = [Diagnostic.warning("no-effect", f"w{i}", None) for i in range(5)]
    >>> [(d.message, d.omitted) for d in capped(ds, 2)]
    [('w0', 0), ('w1', 3)]
    """
    counts: dict[str, int] = {}
    for d in diagnostics:
        counts[d.code] = counts.get(d.code, 0) + 1
    if all(n <= limit for n in counts.values()):
        return list(diagnostics)
    seen: dict[str, int] = {}
    out = []
    for d in diagnostics:
        n = seen[d.code] = seen.get(d.code, 0) + 1
        if n < limit or (n == limit and counts[d.code] == limit):
            out.append(d)
        elif n == limit:
            out.append(evolve(d, omitted=d.omitted + counts[d.code] - limit))
    return out


def _window(text: str, start: int, width: int) -> tuple[str, int, int]:
    """At most MAX_ECHO_COLUMNS of a long line around columns [start, start + width)."""
    if len(text) <= MAX_ECHO_COLUMNS:
        return text, start, width
    lo = max(0, min(start - MAX_ECHO_COLUMNS // 4, len(text) - MAX_ECHO_COLUMNS))
    hi = lo + MAX_ECHO_COLUMNS
    shown = ("..." if lo else "") + text[lo:hi] + ("..." if hi < len(text) else "")
    offset = 3 if lo else 0
    new_start = start - lo + offset
    new_width = max(1, min(width, hi - start))
    return shown, new_start, new_width


def _escaped(text: str, start: int, width: int) -> tuple[str, int, int]:
    """``text`` with its control characters shown as escapes, and the caret's columns moved to match."""
    text, at = shown_with_offsets(text)

    def column(i: int) -> int:  # a caret may stand past the line's end
        return at[i] if i < len(at) else at[-1] + i - (len(at) - 1)

    return printable(text), column(start), max(column(start + width) - column(start), 1)


def _snippet(span: Span, sources: dict[str, Source], gutter: int, label: str | None,
             marker: str) -> list[str]:
    src = sources.get(span.file)
    if src is None:
        return []
    pad = " " * gutter
    text = src.line_text(span.line)
    start = max(span.column - 1, 0)
    if span.end_line == span.line:
        width = max(span.end_column - span.column, 1)
    else:
        width = max(len(text) - start, 1)
    text, start, width = _window(text, start, width)
    text, start, width = _escaped(text.replace("\t", " "), start, width)
    underline = " " * start + marker * width
    if label:
        underline += " " + label
    lines = [f"{str(span.line).rjust(gutter)} | {text}", f"{pad} | {underline.rstrip()}"]
    if span.end_line > span.line:
        lines.append(f"{pad} | ...")
    return lines


def omitted_note(d: Diagnostic) -> str:
    """What a diagnostic that stands for others (see `capped`) says about them."""
    return (f"{d.omitted:,} more `{d.code}` {d.severity}{'s' if d.omitted > 1 else ''} like this one are not "
            f"shown (at most {MAX_REPEATS} per code)")


def omitted_line(d: Diagnostic) -> str:
    """The note line saying how many diagnostics like ``d`` were left out (see `capped`)."""
    return f"note: {omitted_note(d)}"


def render_text(d: Diagnostic, sources: dict[str, Source]) -> str:
    """Render one diagnostic the way a compiler does: header, location, caret."""
    head = f"{d.severity}[{d.code}]: {d.message}"
    spans = [d.span] + [n.span for n in d.notes]
    gutter = max((len(str(s.line)) for s in spans if s is not None), default=1)
    pad = " " * gutter
    out = [head]
    if d.span is not None:
        s = d.span
        out.append(f"{pad}--> {s.file}:{s.line}:{s.column}")
        snippet = _snippet(s, sources, gutter, d.label, "^")
        if snippet:
            out.append(f"{pad} |")
            out.extend(snippet)
    trailer = []
    for note in d.notes:
        if note.span is not None and note.span.file in sources:
            s = note.span
            out.append(f"{pad} |")
            out.append(f"{pad}::: {s.file}:{s.line}:{s.column}")
            out.extend(_snippet(s, sources, gutter, note.message, "-"))
        else:
            trailer.append(f"{pad} = note: {note.message}")
    if d.help:
        trailer.append(f"{pad} = help: {d.help}")
    if d.omitted:
        trailer.append(f"{pad} = note: {omitted_note(d)}")
    if trailer:
        out.append(f"{pad} |")
        out.extend(trailer)
    return printable("\n".join(shown(line) for line in out))


def _span_fields(span: Span | None) -> dict:
    if span is None:
        return {"file": None, "line": None, "column": None, "end_line": None, "end_column": None}
    return {
        "file": printable(span.file),
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
    }


def to_json_dict(d: Diagnostic) -> dict:
    """The JSON object of one diagnostic (LANGUAGE.md section 8 field names)."""
    obj = {"code": d.code, "severity": d.severity, "message": d.message}
    obj.update(_span_fields(d.span))
    if d.help:
        obj["help"] = d.help
    if d.notes:
        obj["notes"] = [dict(message=n.message, **_span_fields(n.span)) for n in d.notes]
    if d.omitted:
        obj["omitted"] = d.omitted
    return obj


_NOT_UTF8 = {
    "invalid start byte": "cannot begin a character",
    "invalid continuation byte": "begins a character that the bytes after it do not complete",
    "unexpected end of data": "begins a character that the file ends inside",
}


def not_utf8(name: str, exc: UnicodeDecodeError, path: str | None = None):
    """The ``invalid-encoding`` diagnostic for bytes that :func:`steerc.core.source.decode_program` refused, and the
    :class:`Source` it points into: the text up to the first bad byte as it reads, the rest with each bad
    byte as U+FFFD, and the caret on that first one.

    >>> from steerc.core.source import decode_program
    >>> try:
    ...     decode_program(b"steer 1\\nvector caf\\xe9 = [1]")
    ... except UnicodeDecodeError as exc:
    ...     d, src = not_utf8("a.steer", exc)
    >>> d.code, (d.span.line, d.span.column), d.message
    ('invalid-encoding', (2, 11), 'this file is not UTF-8: byte 0xE9 at line 2, column 11 begins a character that the bytes after it do not complete')
    """
    data = exc.object
    good = normalize_newlines(data[:exc.start].decode("utf-8"))
    source = Source(name, good + normalize_newlines(data[exc.start:].decode("utf-8", "replace")), path)
    span = source.span(len(good), len(good) + 1)
    what = _NOT_UTF8.get(exc.reason, exc.reason)
    diagnostic = Diagnostic(
        INVALID_ENCODING, "error",
        f"this file is not UTF-8: byte 0x{data[exc.start]:02X} at line {span.line}, column {span.column} {what}",
        span, label="not UTF-8",
        help="save it as UTF-8: steerc reads every program as UTF-8 text (a leading byte-order mark is allowed)")
    return diagnostic, source


class Refusal(ValueError):
    """A request steerc refuses, as diagnostics: ``diagnostics`` (each with a code, and a span into
    ``sources`` where there is one) say why; ``render()`` gives them as the command line prints them."""

    def __init__(self, diagnostics, sources=None):
        super().__init__("; ".join(d.message for d in diagnostics))
        self.diagnostics = list(diagnostics)
        self.sources = dict(sources or {})

    def render(self) -> str:
        return "\n\n".join(render_text(d, self.sources) for d in self.diagnostics)
