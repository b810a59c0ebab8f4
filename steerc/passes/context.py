"""What the check passes share while they work on one program."""

from __future__ import annotations

import difflib
import os

from attrs import define, field

from steerc.diagnostics import Diagnostics
from steerc.ir import nodes as ir
from steerc.source import Source


class Fault(Exception):
    """A fault already reported as a diagnostic; unwinds the current declaration."""


@define
class Options:
    """How a program is checked.

    ``root``: the project root (default: found from the file, see
    :mod:`steerc.paths`); ``overrides``: ``--set NAME=VALUE`` params;
    ``base_dir``: where relative paths start (default: the file's folder,
    or the working directory for text with no file); ``use_xgrammar``:
    also validate constraints with xgrammar (which imports torch).
    """

    root: str | None = None
    overrides: dict[str, float] = field(factory=dict)
    base_dir: str | None = None
    use_xgrammar: bool = False


@define
class Symbol:
    name: str
    kind: str  # param | vector | probe | intervention
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
    extra_sources: dict[str, Source] = field(factory=dict)  # schema/grammar files, for notes
    checked: object = None  # the CheckedProgram, once built
    facts: object = None  # ModelFacts, when checking against a model
    stop: bool = False

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
        from steerc.paths import find_root

        return find_root(self.base_dir)

    def error(self, code, message, span, **kw) -> None:
        self.diagnostics.error(code, message, span, **kw)

    def warning(self, code, message, span, **kw) -> None:
        self.diagnostics.warning(code, message, span, **kw)


def did_you_mean(name: str, candidates) -> str | None:
    """A ``help`` line suggesting the closest candidate, if one is close."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"did you mean `{match[0]}`?" if match else None


def one_of(options) -> str:
    items = [f"`{o}`" for o in options]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
