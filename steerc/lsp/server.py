"""``steerc lsp``: the language server, on pygls, over standard input and output.

Each open document is checked as ``steerc check`` checks a file (against
the model of :mod:`steerc.lsp.project`) after every change; requests read
the check of the current version. See spec/lsp.md for what each request
answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.uris import to_fs_path

from steerc import __version__
from steerc.lsp import wire
from steerc.lsp.analysis import Analysis, Lookup
from steerc.lsp.positions import ENCODINGS, UTF16, Document, normalize, source_offset
from steerc.lsp.project import FactsCache, project_setting, without_model
from steerc.lsp.reparse import Reparser

log = logging.getLogger("steerc.lsp")
REQUEST_FAILED = lsp.LSPErrorCodes.RequestFailed


class Refused(JsonRpcException):
    """A request steerc declines, with the reason (an LSP ``RequestFailed`` error response)."""

    def __init__(self, message: str):
        super().__init__(code=int(REQUEST_FAILED), message=message)


_ANSWERED = object()  # a request already answered with an error


class _Protocol(LanguageServerProtocol):
    """pygls' protocol, but the documents are steerc's own (:class:`~steerc.lsp.positions.Document`):
    pygls cuts lines where ``str.splitlines`` does (U+2028, form feeds, ...), LSP only at ``\\n``,
    ``\\r\\n`` and ``\\r``."""

    def structure_message(self, data):
        """pygls drops a request whose params it cannot read; JSON-RPC wants it answered (InvalidParams)."""
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if not ("method" in data and isinstance(data.get("id"), (int, str))):
                raise
            self._send_response(data["id"], None, exc.to_response_error())
            return _ANSWERED

    def handle_message(self, message):
        if message is not _ANSWERED:
            super().handle_message(message)

    def _user(self, method: str, params):
        handler = self.fm.features.get(method)
        if handler is not None:
            yield handler, (params,), None

    @lsp_method(lsp.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params):
        yield from self._user(lsp.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params):
        yield from self._user(lsp.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params):
        yield from self._user(lsp.TEXT_DOCUMENT_DID_CLOSE, params)


class OpenDocument:
    __slots__ = ("uri", "doc", "analysis", "checked_version", "reparser", "parsed")

    def __init__(self, uri: str, doc: Document):
        self.uri = uri
        self.doc = doc
        self.analysis: Analysis | None = None
        self.parsed: Analysis | None = None  # the last analysis whose text parsed
        self.checked_version: int | None = None
        self.reparser = Reparser()


class SteerServer(LanguageServer):
    def __init__(self, model: str | None = None):
        super().__init__("steerc", __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
                         protocol_cls=_Protocol)
        self.open: dict[str, OpenDocument] = {}
        self.model = model  # --model or initializationOptions.model: wins over steer.toml
        self.model_base = os.getcwd()
        self.spec = spec_href(None)
        self.facts = FactsCache()
        self.shut_down = False

    @property
    def encoding(self) -> str:
        chosen = getattr(self.workspace.position_encoding, "value", self.workspace.position_encoding)
        return chosen if chosen in ENCODINGS else UTF16

    # -------------------------------------------------------------- checking

    def analysis(self, uri: str) -> Analysis:
        """The check of the document's current version (made now if it is not yet)."""
        od = self.open.get(uri)
        if od is None:
            raise Refused(f"{uri} is not open")
        if od.checked_version != od.doc.version or od.analysis is None:
            od.analysis = Analysis(self._check(od))
            od.checked_version = od.doc.version
            if od.analysis.program is not None:
                od.parsed = od.analysis
        return od.analysis

    def _check(self, od: OpenDocument):
        """The document checked as ``steerc check`` checks a file: its project's steer.toml (params, target,
        model; its diagnostics first), then the model's problem if it cannot be used, then the program's."""
        from steerc.api import check
        from steerc.core.source import Source
        from steerc.project.session import check_options

        path = to_fs_path(od.uri) if od.uri.startswith("file:") else None
        source = Source(path or od.uri, normalize(od.doc.text), path)
        project = project_setting(os.path.dirname(path) if path else self.model_base)
        facts, problem, sources = self._facts(project)
        options = check_options(project)
        target = project.target if project is not None else None
        # A target's checks read the plan as compiled, so fusion stays on where one is set.
        result = check(source, options, facts, parser=od.reparser, fuse=target is not None)
        if target:
            from steerc.targets import check_target

            check_target(result, target)
        first = list(project.diagnostics) if project is not None else []
        result.diagnostics[:0] = first + ([problem] if problem is not None else [])
        result.sources.update(sources)
        if project is not None:
            result.sources.update(project.sources)
        return result

    def _facts(self, project):
        """(facts or None, a diagnostic when the model cannot be used, the sources it points into)."""
        if self.model:
            model, origin = self.model, "the editor's `model` setting (or --model)"
        elif project is not None and project.model:
            model, origin = project.model, f"`model` in {project.file}"
        else:
            return None, None, {}
        facts, problem, sources = self.facts.get(model)
        if problem is None:
            return facts, None, {}
        return None, without_model(problem, model, origin), sources

    def publish(self, uri: str) -> None:
        od = self.open.get(uri)
        if od is None:
            return
        try:
            analysis = self.analysis(uri)
            items = wire.diagnostics(analysis.result, uri, self.encoding, self.spec)
        except Exception:  # a bug in steerc: say so, keep serving
            log.error("checking %s failed:\n%s", uri, traceback.format_exc())
            self.window_show_message(lsp.ShowMessageParams(
                lsp.MessageType.Error, f"steerc lsp: checking failed (a bug; the log has the traceback): "
                                       f"{sys.exc_info()[1]!r}"))
            return
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, items, od.doc.version))

    def publish_soon(self, uri: str, version: int) -> None:
        """Publish once the messages already read are handled: a burst of changes is checked once."""
        async def later():
            await asyncio.sleep(0)
            od = self.open.get(uri)
            if od is not None and od.doc.version == version:
                self.publish(uri)

        asyncio.get_running_loop().create_task(later())

    def lookup(self, uri: str, position: lsp.Position) -> Lookup:
        """What answers at ``position``: the current analysis, or while the text has a syntax error the last
        one that parsed, read through the edits since."""
        analysis = self.analysis(uri)
        offset = source_offset(analysis.source, position.line, position.character, self.encoding)
        parsed = self.open[uri].parsed
        return Lookup(parsed if analysis.program is None and parsed is not None else analysis,
                      analysis.source, offset)

    def range_of(self, look: Lookup, span) -> lsp.Range | None:
        """The LSP range of a span of ``look``'s analysis in the current text (None where it changed)."""
        moved = look.span(span)
        return wire.span_range(moved, look.source, self.encoding) if moved is not None else None


def resolved_model(model: str, base: str) -> str:
    """``model`` joined to ``base`` when that names a file or folder, else as it is (a model name)."""
    near = os.path.join(base, model)
    return near if os.path.exists(near) else model


def spec_href(base: str | None) -> str | None:
    """Where a diagnostic code's section is: ``base``/diagnostics.md, else the spec of this checkout."""
    if base:
        return base.rstrip("/") + "/diagnostics.md"
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "spec",
                        "diagnostics.md")
    return wire.file_uri(here) if os.path.isfile(here) else None
