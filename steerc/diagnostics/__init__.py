"""Diagnostics: what steerc tells a user about their program.

One path for every error and warning a user can cause: a :class:`Diagnostic`
with a registered code, a severity, a message, a primary span, optional
notes (each with its own span) and an optional ``help`` line.

>>> from steerc.source import Source
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

from attrs import field, frozen

from steerc.diagnostics.codes import CODES
from steerc.source import Source, Span

__all__ = [
    "CODES",
    "Diagnostic",
    "Diagnostics",
    "Note",
    "render_text",
    "to_json_dict",
]


@frozen
class Note:
    message: str
    span: Span | None = None


@frozen
class Diagnostic:
    code: str
    severity: str
    message: str
    span: Span | None
    notes: tuple[Note, ...] = ()
    help: str | None = None
    label: str | None = field(default=None)

    def __attrs_post_init__(self) -> None:
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


def _snippet(span: Span, sources: dict[str, Source], gutter: int, label: str | None,
             marker: str) -> list[str]:
    src = sources.get(span.file)
    if src is None:
        return []
    pad = " " * gutter
    text = src.line_text(span.line).replace("\t", " ")
    start = max(span.column - 1, 0)
    if span.end_line == span.line:
        width = max(span.end_column - span.column, 1)
    else:
        width = max(len(text) - start, 1)
    underline = " " * start + marker * width
    if label:
        underline += " " + label
    lines = [f"{str(span.line).rjust(gutter)} | {text}", f"{pad} | {underline.rstrip()}"]
    if span.end_line > span.line:
        lines.append(f"{pad} | ...")
    return lines


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
    if trailer:
        out.append(f"{pad} |")
        out.extend(trailer)
    return "\n".join(out)


def _span_fields(span: Span | None) -> dict:
    if span is None:
        return {"file": None, "line": None, "column": None, "end_line": None, "end_column": None}
    return {
        "file": span.file,
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
    return obj
