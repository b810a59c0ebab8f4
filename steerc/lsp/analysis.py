"""What the editor asks about one checked version of a document.

An :class:`Analysis` holds the check result and, built when first asked,
the program's names: each declaration (param, vector, probe, intervention)
and every place its name is used. :meth:`Analysis.at` says what stands at
an offset: a use or a declaration of a name, a site, or one atom of a
site's selector.

>>> from steerc.api import check_source
>>> text = "steer 1\\nparam g = 2\\nintervention x {\\n  at resid_pre[0]\\n  scale g\\n}\\n"
>>> a = Analysis(check_source(text, "x.steer"))
>>> a.at(text.index("g\\n}")).kind, [s.line for s in a.symbols["g"].uses]
('name', [5])
>>> hit = a.at(text.index("[0]") + 1)
>>> hit.kind, type(hit.node).__name__, hit.axis
('selector', 'SelIndex', 0)

While the text has a syntax error, :class:`Lookup` reads the last analysis
that parsed through the edits made since: it answers at offsets in text
those edits left alone, and moves its spans into the current text.
"""

from __future__ import annotations

import bisect

from steerc.core.record import define, field
from steerc.core.source import Source, Span
from steerc.ir import nodes as ir
from steerc.ir.walk import walk
from steerc.lsp.reparse import common_prefix, common_suffix

DECLARATIONS = {
    ir.ParamDecl: "param",
    ir.VectorDecl: "vector",
    ir.MatrixDecl: "matrix",
    ir.SaeDecl: "sae",
    ir.ProbeDecl: "probe",
    ir.InterventionDecl: "intervention",
}


@define
class Symbol:
    name: str
    kind: str  # param | vector | matrix | sae | probe | intervention
    decl: object  # the declaring statement (the first, when a name is declared twice)
    uses: list[Span] = field(factory=list)


@define(frozen=True)
class Hit:
    """What stands at an offset.

    ``kind``: ``name`` (a use; ``node`` is the ir.Name), ``decl`` (a declared name; ``node`` the
    statement), ``site`` (``node`` the ir.SiteRef) or ``selector`` (``node`` the atom, ``site`` its
    SiteRef, ``axis`` 0 for layers and 1 for heads).
    """

    kind: str
    node: object
    span: Span
    site: object = None
    axis: int = 0


class Analysis:
    def __init__(self, result) -> None:
        self.result = result
        self.source = result.source
        self.program = result.program
        self._symbols: dict[str, Symbol] | None = None
        self._starts: list[int] | None = None

    @property
    def symbols(self) -> dict[str, Symbol]:
        if self._symbols is None:
            self._symbols = _symbols(self.program) if self.program is not None else {}
        return self._symbols

    def symbol_at(self, offset: int) -> tuple[Symbol, Span] | None:
        """The symbol whose name (declared or used) is at ``offset``, and that name's span."""
        hit = self.at(offset)
        if hit is None or hit.kind not in ("name", "decl"):
            return None
        name = hit.node.id if hit.kind == "name" else hit.node.name
        sym = self.symbols.get(name)
        return (sym, hit.span) if sym is not None else None

    def at(self, offset: int) -> Hit | None:
        """The smallest thing at ``offset`` (a cursor just after a name is still on it)."""
        stmt = self._statement_at(offset)
        if stmt is None:
            return None
        best = None
        for hit in _hits(stmt):
            s = hit.span
            if s is not None and s.start <= offset <= s.end and (
                    best is None or s.end - s.start < best.span.end - best.span.start):
                best = hit
        return best

    def _statement_at(self, offset: int):
        if self.program is None:
            return None
        statements = self.program.statements
        if self._starts is None:
            self._starts = [s.span.start if s.span is not None else -1 for s in statements]
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        stmt = statements[i]
        return stmt if stmt.span is not None and offset <= stmt.span.end else None


class Lookup:
    """An offset in the current text, and the analysis that answers for it there.

    ``analysis`` is the current one, or (``stale``) the last one that parsed while the current text has
    a syntax error; ``offset`` is in ``analysis``' text (None where the edits since changed the text, so
    that nothing answers), and :meth:`span` moves one of its spans into the current text (None for a span
    in text that changed).

    >>> from steerc.api import check_source
    >>> old = "steer 1\\nparam g = 2\\nintervention x {\\n  at resid_pre[0]\\n  scale g\\n}\\n"
    >>> new = old.replace("param g", "par@m h = 3\\nparam g")
    >>> look = Lookup(Analysis(check_source(old, "x.steer")), Source("x.steer", new), new.index("g\\n}"))
    >>> look.stale, look.offset == old.index("g\\n}"), look.span(look.analysis.symbols["g"].uses[0]).line
    (True, True, 6)
    >>> Lookup(look.analysis, Source("x.steer", new), new.index("h = 3")).offset is None
    True
    """

    def __init__(self, analysis: Analysis, source: Source, offset: int) -> None:
        self.analysis, self.source = analysis, source
        old, new = analysis.source.text, source.text
        self.stale = old != new
        self.prefix = common_prefix(old, new)
        self.suffix = common_suffix(old, new, min(len(old), len(new)) - self.prefix)
        self.delta = len(new) - len(old)
        self.offset = self._old(offset)

    def _old(self, offset: int) -> int | None:
        if offset <= self.prefix:
            return offset
        if offset >= len(self.source.text) - self.suffix:
            return offset - self.delta
        return None

    def span(self, span: Span | None) -> Span | None:
        """``span`` (in the analysis' text) in the current text, or None if the edits since touched it."""
        if span is None or not self.stale:
            return span
        if span.end <= self.prefix:
            return span
        if span.start >= len(self.analysis.source.text) - self.suffix:
            return self.source.span(span.start + self.delta, span.end + self.delta)
        return None


def _symbols(program: ir.Program) -> dict[str, Symbol]:
    symbols: dict[str, Symbol] = {}
    for stmt in program.statements:
        kind = DECLARATIONS.get(type(stmt))
        if kind is not None and stmt.name not in symbols:
            symbols[stmt.name] = Symbol(stmt.name, kind, stmt)
    for stmt in program.statements:
        for node in walk(stmt):
            if isinstance(node, ir.Name) and node.id in symbols and node.span is not None:
                symbols[node.id].uses.append(node.span)
    return symbols


def _hits(stmt):
    if type(stmt) in DECLARATIONS and stmt.name_span is not None:
        yield Hit("decl", stmt, stmt.name_span)
    for node in walk(stmt):
        if isinstance(node, ir.Name):
            yield Hit("name", node, node.span)
        elif isinstance(node, ir.SiteRef):
            yield Hit("site", node, node.span)
            for axis, item in enumerate(node.items):
                for atom in item.items if isinstance(item, ir.SelGroup) else (item,):
                    yield Hit("selector", atom, atom.span, node, axis if node.name == "head" else 0)
