"""The requests and notifications ``steerc lsp`` answers, registered on a :class:`SteerServer`."""

from __future__ import annotations

import re

from lsprotocol import types as lsp

from steerc.core.limits import MAX_NAME_CHARS
from steerc.core.source import Source
from steerc.frontend.fmt import MeaningChanged, format_source
from steerc.ir import nodes as ir
from steerc.ir.walk import walk
from steerc.lsp import wire
from steerc.lsp.complete import complete, keywords
from steerc.lsp.hover import hover as hover_text
from steerc.lsp.positions import Document, normalize, source_offset
from steerc.lsp.server import OpenDocument, Refused, SteerServer, resolved_model, spec_href

TRIGGERS = [" ", "(", ",", "*"]
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RENAMED = ("param", "vector", "matrix", "sae", "probe", "intervention")
# The files a check reads besides the program: steer.toml, vectors, schemas, grammars, a model's config.json.
WATCHED = ("**/steer.toml", "**/*.{safetensors,npy,pt,gguf}", "**/*.json", "**/*.{ebnf,gbnf}")


def register(server: SteerServer) -> None:
    for method, handler, options in (
        (lsp.INITIALIZE, initialize, None),
        (lsp.INITIALIZED, initialized, None),
        (lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES, watched_files_changed, None),
        (lsp.SHUTDOWN, shutdown, None),
        (lsp.TEXT_DOCUMENT_DID_OPEN, did_open, None),
        (lsp.TEXT_DOCUMENT_DID_CHANGE, did_change, None),
        (lsp.TEXT_DOCUMENT_DID_CLOSE, did_close, None),
        (lsp.TEXT_DOCUMENT_HOVER, hover, None),
        (lsp.TEXT_DOCUMENT_DEFINITION, definition, None),
        (lsp.TEXT_DOCUMENT_REFERENCES, references, None),
        (lsp.TEXT_DOCUMENT_PREPARE_RENAME, prepare_rename, None),
        (lsp.TEXT_DOCUMENT_RENAME, rename, None),
        (lsp.TEXT_DOCUMENT_FORMATTING, formatting, None),
        (lsp.TEXT_DOCUMENT_COMPLETION, completion, lsp.CompletionOptions(trigger_characters=TRIGGERS)),
    ):
        server.feature(method, options)(handler)


# ------------------------------------------------------------- lifecycle


def initialize(ls: SteerServer, params: lsp.InitializeParams) -> None:
    options = params.initialization_options if isinstance(params.initialization_options, dict) else {}
    if params.root_uri and params.root_uri.startswith("file:"):
        from pygls.uris import to_fs_path

        ls.model_base = to_fs_path(params.root_uri) or ls.model_base
    if isinstance(options.get("model"), str) and options["model"]:
        ls.model = resolved_model(options["model"], ls.model_base)
    if isinstance(options.get("specUrl"), str):
        ls.spec = spec_href(options["specUrl"])


def initialized(ls: SteerServer, params) -> None:
    """Ask the editor to report changes to the files a check reads (where it lets a server ask)."""
    caps = ls.client_capabilities.workspace
    watch = caps.did_change_watched_files if caps is not None else None
    if watch is None or not watch.dynamic_registration:
        return
    options = lsp.DidChangeWatchedFilesRegistrationOptions([lsp.FileSystemWatcher(g) for g in WATCHED])
    ls.client_register_capability(lsp.RegistrationParams([lsp.Registration(
        "steerc-watched-files", lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES, options)]))


def watched_files_changed(ls: SteerServer, params: lsp.DidChangeWatchedFilesParams) -> None:
    """A file a check may read changed on disk: check every open document again."""
    for od in ls.open.values():
        od.checked_version = None
        ls.publish_soon(od.uri, od.doc.version)


def shutdown(ls: SteerServer, params) -> None:
    ls.shut_down = True


def did_open(ls: SteerServer, params: lsp.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    ls.open[item.uri] = OpenDocument(item.uri, Document(item.text, item.version, ls.encoding))
    ls.publish_soon(item.uri, item.version)


def did_change(ls: SteerServer, params: lsp.DidChangeTextDocumentParams) -> None:
    od = ls.open.get(params.text_document.uri)
    if od is None:
        return
    for change in params.content_changes:
        rng = getattr(change, "range", None)
        od.doc.apply(None if rng is None else ((rng.start.line, rng.start.character),
                                               (rng.end.line, rng.end.character)), change.text)
    od.doc.version = params.text_document.version
    ls.publish_soon(od.uri, od.doc.version)


def did_close(ls: SteerServer, params: lsp.DidCloseTextDocumentParams) -> None:
    if ls.open.pop(params.text_document.uri, None) is not None:
        ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(params.text_document.uri, []))


# ------------------------------------------------------------- requests


def hover(ls: SteerServer, params: lsp.HoverParams) -> lsp.Hover | None:
    look = ls.lookup(params.text_document.uri, params.position)
    if look.offset is None:
        return None
    hit = look.analysis.at(look.offset)
    where = ls.range_of(look, hit.span) if hit is not None else None
    text = hover_text(look.analysis, look.offset) if where is not None else None
    return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, text), where) if text is not None else None


def definition(ls: SteerServer, params: lsp.DefinitionParams) -> lsp.Location | None:
    look = ls.lookup(params.text_document.uri, params.position)
    found = _symbol(ls, look)
    where = ls.range_of(look, found[0].decl.name_span) if found is not None else None
    return lsp.Location(params.text_document.uri, where) if where is not None else None


def references(ls: SteerServer, params: lsp.ReferenceParams) -> list[lsp.Location] | None:
    look = ls.lookup(params.text_document.uri, params.position)
    found = _symbol(ls, look)
    if found is None:
        return None
    sym = found[0]
    spans = ([sym.decl.name_span] if params.context.include_declaration else []) + sym.uses
    ranges = (ls.range_of(look, s) for s in spans)
    return [lsp.Location(params.text_document.uri, r) for r in ranges if r is not None]


def prepare_rename(ls: SteerServer, params: lsp.PrepareRenameParams) -> lsp.Range:
    look = _renamable(ls, params)
    return ls.range_of(look, _symbol(ls, look)[1])


def rename(ls: SteerServer, params: lsp.RenameParams) -> lsp.WorkspaceEdit | None:
    look = _renamable(ls, params)
    sym, new = _symbol(ls, look)[0], params.new_name
    analysis = look.analysis
    if new == sym.name:
        return None
    if not NAME.fullmatch(new) or len(new) > MAX_NAME_CHARS:
        raise Refused(f"`{new}` is not a name: a letter or `_`, then letters, digits or `_` "
                      f"(at most {MAX_NAME_CHARS} characters)")
    if new in keywords():
        raise Refused(f"`{new}` is a keyword of the language")
    if new in analysis.symbols:
        raise Refused(f"`{new}` is already declared (a {analysis.symbols[new].kind})")
    if new in _used_names(analysis.program):
        raise Refused(f"`{new}` is used in this program but not declared: renamed, `{sym.name}` would capture "
                      f"those uses and change what the program means (declare or rename them first)")
    spans = [sym.decl.name_span, *sym.uses]
    edits = [lsp.TextEdit(ls.range_of(look, s), new) for s in spans]
    return lsp.WorkspaceEdit(changes={params.text_document.uri: edits})


def _used_names(program) -> set[str]:
    """Every name the program uses (``ir.Name``), declared or not."""
    return {node.id for stmt in program.statements for node in walk(stmt) if isinstance(node, ir.Name)}


def _symbol(ls: SteerServer, look):
    """The symbol named at the lookup's offset and that name's span, or None (also where the text changed)."""
    if look.offset is None:
        return None
    found = look.analysis.symbol_at(look.offset)
    return found if found is not None and ls.range_of(look, found[1]) is not None else None


def _renamable(ls: SteerServer, params):
    """The lookup for a rename: refused on a text with a syntax error (a name's uses there are not all known),
    and where no param, vector, probe or intervention is named."""
    look = ls.lookup(params.text_document.uri, params.position)
    if look.stale:
        raise Refused("cannot rename while the program has a syntax error: every use of the name must be known "
                      "(fix the error first)")
    found = _symbol(ls, look)
    if found is None or found[0].kind not in RENAMED:
        raise Refused("nothing to rename here: put the cursor on the name of a param, vector, probe or "
                      "intervention")
    return look


def formatting(ls: SteerServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit]:
    analysis = ls.analysis(params.text_document.uri)
    doc = ls.open[params.text_document.uri].doc
    try:
        formatted, diagnostics = format_source(analysis.source)
    except MeaningChanged:
        raise Refused("formatting would change what this program means (a bug in steerc fmt; "
                      "please report it with the file)") from None
    if formatted is None:
        first = next((d for d in diagnostics if d.is_error), None)
        where = f" (line {first.span.line}: {first.message})" if first is not None and first.span else ""
        raise Refused(f"cannot format a program with errors{where}")
    if formatted == doc.text:
        return []
    end = doc.end()
    return [lsp.TextEdit(lsp.Range(lsp.Position(0, 0), lsp.Position(*end)), formatted)]


def completion(ls: SteerServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    od = ls.open.get(params.text_document.uri)
    if od is None:
        raise Refused(f"{params.text_document.uri} is not open")
    source = Source(od.uri, normalize(od.doc.text))  # the text alone: completion needs no check
    offset = source_offset(source, params.position.line, params.position.character, ls.encoding)
    items = [wire.completion_item(i) for i in complete(source.text, offset)]
    return lsp.CompletionList(is_incomplete=False, items=items)
