"""Where a span is, for the formats that name files for other tools (SARIF, GitHub annotations).

A span's ``file`` is what steerc prints: a path as the user gave it, a
path as the program wrote it (a schema, next to the program), or a
pseudo-file in angle brackets (``<stdin>``, ``<command line>``) that no
tool can open. These helpers turn it into a path relative to the working
directory (or an absolute one, for a file outside it), or None for a
pseudo-file, whose place is then written into the message instead.

>>> from steerc.core.source import Source
>>> src = Source("<command line>", "steerc check x.steer --set k=1")
>>> file_path(src.span(27, 30), {src.name: src}) is None
True
>>> utf16_column(Source("a", "é😀x\\n"), 1, 3)
4
"""

from __future__ import annotations

import os

from steerc.core.source import Source, Span
from steerc.diagnostics import omitted_line


def is_pseudo(name: str) -> bool:
    """Whether ``name`` is a pseudo-file such as ``<stdin>``: a text with no file behind it."""
    return name.startswith("<") and name.endswith(">")


def file_path(span: Span, sources: dict[str, Source]) -> str | None:
    """The path of the file ``span`` is in (as steerc opened it), or None for a pseudo-file."""
    if is_pseudo(span.file):
        return None
    src = sources.get(span.file)
    return src.path if src is not None and src.path else span.file


def relative_path(path: str, cwd: str) -> str | None:
    """``path`` relative to ``cwd`` in ``/`` form when it lies under it (symbolic links resolved or not)."""
    for here in dict.fromkeys((cwd, os.path.realpath(cwd))):
        for there in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            rel = os.path.relpath(there, here)
            if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                return rel.replace(os.sep, "/")
    return None


def where(span: Span) -> str:
    """``file:line:column``, as the text rendering prints a place."""
    return f"{span.file}:{span.line}:{span.column}"


def utf16_column(source: Source | None, line: int, column: int) -> int:
    """A 1-based character column as a 1-based column in UTF-16 code units (SARIF's default ``columnKind``).

    Characters outside the Basic Multilingual Plane (emoji, many CJK extensions) count two units; a column
    past the end of the line counts one unit a character beyond it. Without the source, the column is kept.
    """
    if source is None:
        return column
    prefix = source.line_text(line)[: column - 1]
    if prefix.isascii():
        return column
    units = len(prefix.encode("utf-16-le", "surrogatepass")) // 2
    return 1 + units + (column - 1 - len(prefix))


def text_lines(d, sources: dict[str, Source], related: bool) -> list[str]:
    """The lines of a diagnostic's text for a tool: the message (with its place when that is a pseudo-file),
    each note a tool cannot show at a place (``related``: one in a real file can be), the help, the count of
    those left out."""

    head = d.message
    if d.span is not None and file_path(d.span, sources) is None:
        head += f" (at {where(d.span)})"
    lines = [head]
    for note in d.notes:
        if note.span is None:
            lines.append(f"note: {note.message}")
        elif not related or file_path(note.span, sources) is None:
            lines.append(f"note: {note.message} (at {where(note.span)})")
    if d.help:
        lines.append(f"help: {d.help}")
    if d.omitted:
        lines.append(omitted_line(d))
    return lines
