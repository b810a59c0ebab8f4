"""steerc's values as LSP messages (lsprotocol types): ranges, diagnostics, completion items."""

from __future__ import annotations

import os
import pathlib

from lsprotocol import types as lsp

from steerc.diagnostics import capped, omitted_note
from steerc.diagnostics.codes import DEAD_INTERVENTION, NO_EFFECT, UNUSED_NAME
from steerc.lsp.positions import lsp_position

SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning}
# Codes an editor may show faded: the text they point at does nothing.
UNNECESSARY = {UNUSED_NAME, NO_EFFECT, DEAD_INTERVENTION}
COMPLETION_KINDS = {
    "keyword": lsp.CompletionItemKind.Keyword,
    "site": lsp.CompletionItemKind.Field,
    "param": lsp.CompletionItemKind.Constant,
    "vector": lsp.CompletionItemKind.Variable,
    "matrix": lsp.CompletionItemKind.Variable,
    "sae": lsp.CompletionItemKind.Module,
    "probe": lsp.CompletionItemKind.Event,
    "function": lsp.CompletionItemKind.Function,
    "field": lsp.CompletionItemKind.Property,
}
_START = lsp.Range(lsp.Position(0, 0), lsp.Position(0, 0))


def span_range(span, source, encoding: str) -> lsp.Range:
    """The LSP range of a steerc span in ``source``."""
    line, character = lsp_position(source, span.line, span.column, encoding)
    end_line, end_character = lsp_position(source, span.end_line, span.end_column, encoding)
    return lsp.Range(lsp.Position(line, character), lsp.Position(end_line, end_character))


def file_uri(path: str) -> str:
    return pathlib.Path(os.path.abspath(path)).as_uri()


def diagnostics(result, uri: str, encoding: str, spec: str | None) -> list[lsp.Diagnostic]:
    """The check's diagnostics for the document at ``uri`` (at most MAX_REPEATS per code, as check prints)."""
    return [diagnostic(d, result, uri, encoding, spec) for d in capped(result.diagnostics)]


def diagnostic(d, result, uri: str, encoding: str, spec: str | None) -> lsp.Diagnostic:
    """One diagnostic: ``message`` is check's, then its help and the notes that have no place; notes with
    a place are related information. A diagnostic placed outside the document sits at its start, its place
    the first related information."""
    extra, related = [], []
    here = _location(d.span, result, uri, encoding)
    if here is not None and here.uri != uri:
        related.append(lsp.DiagnosticRelatedInformation(here, "here"))
    for note in d.notes:
        where = _location(note.span, result, uri, encoding)
        if where is None:
            extra.append(f"note: {note.message}")
        else:
            related.append(lsp.DiagnosticRelatedInformation(where, note.message))
    if d.help:
        extra.append(f"help: {d.help}")
    if d.omitted:
        extra.append(f"note: {omitted_note(d)}")
    return lsp.Diagnostic(
        range=here.range if here is not None and here.uri == uri else _START,
        message="\n".join([d.message, *extra]),
        severity=SEVERITY[d.severity],
        code=d.code,
        code_description=lsp.CodeDescription(href=f"{spec}#{d.code}") if spec else None,
        source="steerc",
        related_information=related or None,
        tags=[lsp.DiagnosticTag.Unnecessary] if d.code in UNNECESSARY else None,
    )


def _location(span, result, uri: str, encoding: str) -> lsp.Location | None:
    if span is None:
        return None
    source = result.sources.get(span.file)
    if source is None:
        return None
    if source is result.source:
        return lsp.Location(uri, span_range(span, source, encoding))
    if not source.path:
        return None
    return lsp.Location(file_uri(source.path), span_range(span, source, encoding))


def completion_item(item) -> lsp.CompletionItem:
    return lsp.CompletionItem(label=item.label, kind=COMPLETION_KINDS.get(item.kind), detail=item.detail or None)
