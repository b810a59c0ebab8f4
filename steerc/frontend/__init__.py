"""The frontend: Steer source text to program IR.

>>> from steerc.frontend import parse_source
>>> program, diagnostics = parse_source("steer 1\\nparam gain = 2\\n")
>>> program.statements[0].name, len(diagnostics)
('gain', 0)
"""

from __future__ import annotations

from steerc.core.source import Source, normalize_newlines
from steerc.diagnostics import Diagnostics
from steerc.frontend.lower import ToIR
from steerc.frontend.parser import SyntaxDiagnostic, parse_tree
from steerc.ir import nodes as ir

__all__ = ["parse", "parse_source"]


def parse(source: Source, diagnostics: Diagnostics | None = None) -> ir.Program | None:
    """Parse ``source`` into IR; problems go to ``diagnostics``.

    Returns ``None`` when the text is not a program at all (a syntax error).
    """

    if diagnostics is None:
        diagnostics = Diagnostics()
    try:
        tree, comments = parse_tree(source)
    except SyntaxDiagnostic as exc:
        diagnostics.add(exc.diagnostic)
        return None
    program = ToIR(source, diagnostics).transform(tree)
    if comments:
        program = _with_comments(program, source, comments)
    return program


def _with_comments(program: ir.Program, source: Source, comments) -> ir.Program:
    from steerc.core.record import evolve

    kept = tuple(
        ir.Comment(line, column, text, not source.line_text(line)[: column - 1].strip())
        for line, column, text in comments
    )
    return evolve(program, comments=kept)


def parse_source(text: str, name: str = "<string>") -> tuple[ir.Program | None, Diagnostics]:
    """Parse text held in memory (no file needed), its line ends read as a file's are."""

    diagnostics = Diagnostics()
    return parse(Source(name, normalize_newlines(text)), diagnostics), diagnostics
