"""The embedding API: check and compile Steer programs from Python.

Nothing here writes files or prints; results are objects. Diagnostics are
:class:`steerc.diagnostics.Diagnostic` values, rendered on demand.

>>> result = check_source('''
... steer 1
... vector v = [1.0, 0.0, 0.0, 0.0]
... intervention push {
...   at  resid_pre[0]
...   add 2 * v
... }
... ''')
>>> result.ok, [i.name for i in result.checked.interventions]
(True, ['push'])
>>> bad = check_source("steer 1\\nintervention x {\\n  at resid_pre[0]\\n  add w\\n}\\n")
>>> [(d.code, d.span.line) for d in bad.diagnostics]
[('undefined-name', 4)]
"""

from __future__ import annotations

import gc
import os

from steerc.core.record import define, field
from steerc.core.source import Source, normalize_newlines, read_program
from steerc.diagnostics import Diagnostic, Diagnostics, capped, not_utf8, render_text, to_json_dict
from steerc.frontend import parse
from steerc.ir import nodes as ir
from steerc.passes.check_pipeline import CHECK_PASSES, run_checks
from steerc.passes.context import CheckContext, Options

__all__ = ["CheckResult", "Options", "check_file", "check_source", "CHECK_PASSES"]


@define
class CheckResult:
    source: Source
    program: ir.Program | None
    diagnostics: list[Diagnostic]
    checked: object = None  # steerc.ir.checked.CheckedProgram
    facts: object = None  # steerc.facts.ModelFacts, when checked against a model
    plan: object = None  # steerc.ir.plan.Plan, when checked against a model without errors
    sources: dict[str, Source] = field(factory=dict)
    # name -> folded value of each param (a float) and vector (a numpy array or a PerLayer bank) that checked;
    # empty when only the diagnostics were asked for (check(..., diagnostics_only=True))
    values: dict[str, object] = field(factory=dict)

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    def render(self) -> str:
        """The diagnostics as text, each with its source line and caret (at most MAX_REPEATS per code)."""
        return "\n\n".join(render_text(d, self.sources) for d in capped(self.diagnostics))

    def to_json(self) -> list[dict]:
        """The diagnostics as JSON objects (at most MAX_REPEATS per code; see ``omitted``)."""
        return [to_json_dict(d) for d in capped(self.diagnostics)]


def check_source(
    text: str,
    name: str = "<string>",
    *,
    path: str | None = None,
    options: Options | None = None,
    facts=None,
    diagnostics_only: bool = False,
) -> CheckResult:
    """Check program text; ``facts`` (a ModelFacts) adds the layout checks. Its line ends are read as a
    file's are (``\\r\\n`` and a lone ``\\r`` end a line: ``steerc.core.source.normalize_newlines``).

    Relative paths in ``load(...)`` and ``from "..."`` resolve from ``options.base_dir`` when set, else
    from the folder of ``path`` (the file the text came from), else from the working folder.
    :func:`check_file` reads a file and passes its path. ``diagnostics_only``: see :func:`check`."""

    source = Source(name, normalize_newlines(text), path)
    return check(source, options or Options(), facts, diagnostics_only=diagnostics_only)


def check_file(path: str, *, options: Options | None = None, facts=None, name: str | None = None) -> CheckResult:
    """Check a ``.steer`` file (raises OSError if it cannot be read). A file that is not UTF-8 gives a result
    with its ``invalid-encoding`` diagnostic, as ``steerc check`` does."""

    try:
        text = read_program(path)
    except UnicodeDecodeError as exc:
        diagnostic, source = not_utf8(name or path, exc, os.path.abspath(path))
        return CheckResult(source, None, [diagnostic], sources={source.name: source})
    return check_source(text, name or path, path=os.path.abspath(path), options=options, facts=facts)


def check(source: Source, options: Options, facts=None, parser=parse, fuse: bool = True,
          diagnostics_only: bool = False) -> CheckResult:
    """Check ``source``; ``parser(source, diagnostics)`` gives its IR. ``steerc lsp``, which wants only the
    diagnostics, passes a parser that re-parses just the statements an edit touched, and ``fuse=False``:
    the plan's fusion passes report nothing.

    ``diagnostics_only`` (``steerc check`` without a model): the same diagnostics, but the folded values
    are not kept (``values`` is empty; the vectors in ``checked`` may be :class:`steerc.io.floats.Floats`
    rather than numpy arrays), so that small vectors fold without importing numpy. With ``facts`` the plan
    is built from the values, and they are numpy arrays as always."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the checker builds many small objects and keeps them all
    try:
        return _check(source, options, facts, parser, fuse, diagnostics_only and facts is None)
    finally:
        if gc_was_enabled:
            gc.enable()


def _check(source: Source, options: Options, facts, parser, fuse: bool, diagnostics_only: bool) -> CheckResult:
    diagnostics = Diagnostics()
    program = parser(source, diagnostics)
    result = CheckResult(source, program, diagnostics.items, sources={**options.sources, source.name: source},
                         facts=facts)
    if program is None:
        return result
    ctx = CheckContext(program, source, diagnostics, options, diagnostics_only=diagnostics_only)
    ctx.facts = facts
    run_checks(ctx)
    result.sources.update(ctx.extra_sources)
    result.checked = ctx.checked if not ctx.stop else None
    result.values = {} if diagnostics_only else ctx.values
    if facts is not None and result.checked is not None and not diagnostics.has_errors:
        from steerc.passes.plan_pipeline import build_plan  # with a model only: it needs numpy

        result.plan = build_plan(result.checked, facts, diagnostics=diagnostics, fuse=fuse)
    result.diagnostics = diagnostics.sorted()
    return result
