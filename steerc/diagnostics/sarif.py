"""Diagnostics as a SARIF 2.1.0 log, for code scanning and editors' SARIF viewers.

One run; ``tool.driver`` lists every code of the registry as a rule (id =
code, the registry's summary, a link to its section of
``spec/diagnostics.md``, its severity as the default level). Each
diagnostic is a result: its rule, level, message, the span as a region
(columns in UTF-16 code units, the run's ``columnKind``), its notes as
related locations, its help in the message and in ``properties.help``.
Paths under the working directory are relative to ``%SRCROOT%``, which
``originalUriBaseIds`` sets to that directory; others are ``file:`` URIs.
A span in a pseudo-file (``<stdin>``, ``<command line>``) has no location:
its place is written into the message. ``spec/formats.md`` has the
details.

>>> from steerc.diagnostics import Diagnostic
>>> from steerc.core.source import Source
>>> src = Source("x.steer", "steer 1\\nvector v = w\\n", "/work/x.steer")
>>> d = Diagnostic.error("undefined-name", "undefined name `w`", src.span(19, 20))
>>> log = to_sarif([(d, {src.name: src})], cwd="/work")
>>> result, = log["runs"][0]["results"]
>>> result["ruleId"], result["locations"][0]["physicalLocation"]["artifactLocation"]
('undefined-name', {'uri': 'x.steer', 'uriBaseId': '%SRCROOT%'})
>>> result["locations"][0]["physicalLocation"]["region"]
{'startLine': 2, 'startColumn': 12, 'endLine': 2, 'endColumn': 13}
"""

from __future__ import annotations

import os
import pathlib
import re
import urllib.parse

from steerc import __version__, docs_url
from steerc.diagnostics.codes import CODES
from steerc.diagnostics.places import file_path, relative_path, text_lines, utf16_column

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
RULE_INDEX = {code: i for i, code in enumerate(CODES)}


def to_sarif(items, cwd: str | None = None) -> dict:
    """The SARIF log of ``items``: (diagnostic, the sources its spans point into) pairs, in order."""
    cwd = os.path.abspath(cwd or os.getcwd())
    run = {
        "tool": {"driver": driver()},
        "originalUriBaseIds": {SRCROOT: {"uri": pathlib.Path(cwd).as_uri().rstrip("/") + "/"}},
        "columnKind": "utf16CodeUnits",
        "results": [_result(d, sources, cwd) for d, sources in items],
    }
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def driver() -> dict:
    """The ``tool.driver`` object: steerc, its version, and a rule per registered code."""
    home = docs_url()
    out = {"name": "steerc", "version": __version__, "semanticVersion": __version__}
    if home:
        out["informationUri"] = home
    out["rules"] = [_rule(code, home) for code in CODES.values()]
    return out


def _rule(code, home: str | None) -> dict:
    out = {
        "id": code.name,
        "shortDescription": {"text": code.summary},
        "help": {"text": f"steerc's spec/diagnostics.md, section `{code.name}`: what reports it and what to do"},
        "defaultConfiguration": {"level": code.severity},
    }
    if home:
        out["helpUri"] = f"{home}/blob/main/spec/diagnostics.md#{code.name}"
    return out


def _result(d, sources, cwd: str) -> dict:
    out = {
        "ruleId": d.code,
        "ruleIndex": RULE_INDEX[d.code],
        "level": d.severity,
        "message": {"text": _plain("\n".join(text_lines(d, sources, related=True)))},
    }
    location = _location(d.span, sources, cwd) if d.span is not None else None
    if location is not None:
        out["locations"] = [location]
    related = []
    for note in d.notes:
        place = _location(note.span, sources, cwd) if note.span is not None else None
        if place is not None:
            related.append({"id": len(related) + 1, **place, "message": {"text": _plain(note.message)}})
    if related:
        out["relatedLocations"] = related
    properties = {k: v for k, v in (("help", d.help), ("omitted", d.omitted)) if v}
    if properties:
        out["properties"] = properties
    return out


def _location(span, sources, cwd: str) -> dict | None:
    path = file_path(span, sources)
    if path is None:
        return None
    rel = relative_path(path, cwd)
    if rel is not None:
        artifact = {"uri": urllib.parse.quote(os.fsencode(rel)), "uriBaseId": SRCROOT}
    else:
        artifact = {"uri": "file://" + urllib.parse.quote(os.fsencode(os.path.abspath(path)))}
    src = sources.get(span.file)
    region = {
        "startLine": span.line,
        "startColumn": utf16_column(src, span.line, span.column),
        "endLine": span.end_line,
        "endColumn": utf16_column(src, span.end_line, span.end_column),
    }
    return {"physicalLocation": {"artifactLocation": artifact, "region": region}}


_LINK = re.compile(r"\]\(")


def _plain(text: str) -> str:
    """A plain-text SARIF message: brackets escaped where ``[text](target)`` would read as an embedded link."""
    if not _LINK.search(text):
        return text
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
