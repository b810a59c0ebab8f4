"""Diagnostics as GitHub Actions workflow commands: one annotation a diagnostic.

``::error title=CODE,file=PATH,line=L,endLine=L2,col=C,endColumn=C2::MESSAGE``
(``::warning`` for a warning), properties in the order and with the
escaping of ``@actions/core`` (``packages/core/src/command.ts``): in the
message ``%``, CR and LF become ``%25``, ``%0D``, ``%0A``; in a property
also ``:`` and ``,`` become ``%3A`` and ``%2C``. Columns count characters,
as in steerc's text; they are left out when a span covers several lines
(the runner takes columns only within one line). A diagnostic without a
place in a file (``<stdin>``, ``<command line>``, none at all) has no
``file``: its place is written into the message. Notes and help follow the
message on lines of their own.

>>> from steerc.diagnostics import Diagnostic
>>> from steerc.core.source import Source
>>> src = Source("a,b.steer", "steer 1\\nvector v = w\\n", "/work/a,b.steer")
>>> d = Diagnostic.error("undefined-name", "undefined name `w`: 100%", src.span(19, 20), help="declare it")
>>> print(workflow_command(d, {src.name: src}, cwd="/work"))
::error title=undefined-name,file=a%2Cb.steer,line=2,endLine=2,col=12,endColumn=13::undefined name `w`: 100%25%0Ahelp: declare it
"""

from __future__ import annotations

import os

from steerc.diagnostics import printable
from steerc.diagnostics.places import file_path, relative_path, text_lines

COMMANDS = {"error": "error", "warning": "warning"}  # any other severity would be a `notice`


def escape_data(text: str) -> str:
    """A command's message, escaped as ``escapeData`` in ``@actions/core``.

    >>> escape_data("50%\\r\\nnext: a,b")
    '50%25%0D%0Anext: a,b'
    """
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value, escaped as ``escapeProperty`` in ``@actions/core``.

    >>> escape_property("C:\\\\a,b%\\n")
    'C%3A\\\\a%2Cb%25%0A'
    """
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(d, sources, cwd: str | None = None) -> str:
    """The annotation of diagnostic ``d`` (``sources``: the texts its spans point into)."""
    props: dict[str, object] = {"title": d.code}
    span = d.span
    path = file_path(span, sources) if span is not None else None
    if path is not None:
        props["file"] = relative_path(path, cwd or os.getcwd()) or path
        props.update(line=span.line, endLine=span.end_line)
        if span.line == span.end_line:
            props.update(col=span.column, endColumn=max(span.end_column, span.column))
    body = ",".join(f"{k}={escape_property(printable(str(v)))}" for k, v in props.items())
    message = "\n".join(text_lines(d, sources, related=False))
    return f"::{COMMANDS.get(d.severity, 'notice')} {body}::{escape_data(message)}"
