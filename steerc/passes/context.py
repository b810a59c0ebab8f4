"""What the check passes share while they work on one program."""

from __future__ import annotations

import os

from steerc.core.limits import MAX_REPEATS, MAX_VALUES
from steerc.core.paths import find_root
from steerc.core.record import define, field
from steerc.core.source import Source, Span
from steerc.diagnostics import Diagnostics
from steerc.diagnostics.codes import LIMIT_EXCEEDED
from steerc.diagnostics.suggest import did_you_mean
from steerc.ir import nodes as ir


class Fault(Exception):
    """A fault already reported as a diagnostic; unwinds the current declaration."""


@define
class Options:
    """How a program is checked.

    ``root``: the project root (default: found from the file, see
    :mod:`steerc.core.paths`); ``overrides``: ``--set NAME=VALUE`` params;
    ``base_dir``: where relative paths start (default: the file's folder,
    or the working directory for text with no file); ``use_xgrammar``:
    also validate constraints with xgrammar (which imports torch);
    ``project_params``: a ``steer.toml``'s ``[params]``, the values of the
    params the program declares unless ``overrides`` names them (names it
    does not declare are left alone); ``origins``: where the value of
    each overridden param was written (a ``--set`` in the ``<command
    line>``, a line of ``steer.toml``), for diagnostics, with the texts of
    those spans in ``sources``.
    """

    root: str | None = None
    overrides: dict[str, float] = field(factory=dict)
    base_dir: str | None = None
    use_xgrammar: bool = False
    project_params: dict[str, float] = field(factory=dict)
    origins: dict[str, Span] = field(factory=dict)
    sources: dict[str, Source] = field(factory=dict)

    def given(self, name: str) -> float | None:
        """The value of param ``name`` from the command line, else from ``steer.toml``; None if neither.

        >>> Options(overrides={"a": 1.0}, project_params={"a": 2.0, "b": 3.0}).given("a")
        1.0
        """
        value = self.overrides.get(name)
        return self.project_params.get(name) if value is None else value


@define
class Symbol:
    name: str
    kind: str  # param | vector | matrix | sae | probe | intervention
    decl: object
    order: int  # index of the declaring statement
    used: bool = False


@define
class CheckContext:
    program: ir.Program
    source: Source
    diagnostics: Diagnostics
    options: Options
    symbols: dict[str, Symbol] = field(factory=dict)
    # Declarations whose errors were already reported: later passes skip them
    # instead of reporting the same fault again in other words.
    poisoned: set[str] = field(factory=set)
    types: dict[int, str | None] = field(factory=dict)  # id(expr) -> type
    values: dict[str, object] = field(factory=dict)  # param/vector name -> folded value
    file_cache: dict[str, object] = field(factory=dict)
    origins: dict[int, dict] = field(factory=dict)  # id(load call) -> the provenance steerc derive recorded
    extra_sources: dict[str, Source] = field(factory=dict)  # schema/grammar files, for notes
    checked: object = None  # the CheckedProgram, once built
    facts: object = None  # ModelFacts, when checking against a model
    stop: bool = False
    # "did you mean" searches left among the program's own names or a file's keys: each costs time in
    # their number, and beyond MAX_REPEATS diagnostics of a code are not shown anyway.
    suggestions_left: int = MAX_REPEATS
    values_left: int = MAX_VALUES  # vector entries folding may still compute (see MAX_VALUES)
    over_budget: bool = False  # MAX_VALUES was reported (once)
    # Only the diagnostics are wanted (`steerc check` without a model): small vectors fold in plain Python,
    # without importing numpy (steerc.passes.foldvec).
    diagnostics_only: bool = False

    @property
    def base_dir(self) -> str:
        if self.options.base_dir:
            return self.options.base_dir
        if self.source.path:
            return os.path.dirname(os.path.abspath(self.source.path))
        return os.getcwd()

    @property
    def root(self) -> str:
        if self.options.root:
            return os.path.realpath(self.options.root)

        return find_root(self.base_dir)

    def suggest(self, name: str, candidates) -> str | None:
        """``did_you_mean`` over a program-sized set (``candidates()`` is called only when searched)."""
        if self.suggestions_left <= 0:
            return None
        self.suggestions_left -= 1
        return did_you_mean(name, candidates())

    def spend(self, values: int, span) -> None:
        """Account for ``values`` vector entries about to be computed; faults past MAX_VALUES (reported once)."""
        self.values_left -= values
        if self.values_left >= 0:
            return
        if not self.over_budget:
            self.over_budget = True
            self.error(
                LIMIT_EXCEEDED,
                f"checking this program computes more than {MAX_VALUES:,} vector entries, the most steerc does",
                span,
                help="load a vector once and reuse its name, or use smaller vectors and banks",
            )
        raise Fault

    def error(self, code, message, span, **kw) -> None:
        self.diagnostics.error(code, message, span, **kw)

    def warning(self, code, message, span, **kw) -> None:
        self.diagnostics.warning(code, message, span, **kw)
