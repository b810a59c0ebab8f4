"""``--engine`` for the commands that run a model on an engine (``derive``, ``capture``, ``eval`` and ``tune``):
its choices and help, and the boot, all read from the registry (:mod:`steerc.runtime.engines`), so that a new
engine changes nothing here."""

from __future__ import annotations

import contextlib

from steerc.cli import UsageError


def add_engine_argument(group, note: str = "") -> None:
    """``--engine``: the registry's engines, the default first, each with its one line of help (``note``: the
    command's own remark after them)."""
    from steerc.runtime import engines

    group.add_argument("--engine", choices=engines.names(), default=engines.DEFAULT,
                       help=engines.help_text() + note)


def layout(args, path: str, command: str):
    """The layout ``--engine``'s engine will run the weights at ``path`` with, where it is known before the
    boot (None: once booted); what the engine lacks is a usage error."""
    from steerc.runtime.engines import EngineError, named

    try:
        return named(args.engine).layout_of(path, command)
    except EngineError as exc:
        raise UsageError(exc.message) from None


@contextlib.contextmanager
def session(args, path: str, facts, plan, *, command: str, load):
    """The session of ``--engine``'s engine on the weights at ``path`` (``facts``: the layout the command
    checked, None where the engine reads it), steering as ``plan`` does (None: nothing), shut down on
    leaving. ``load(path)``: the command's transformers loader. What the engine lacks (not installed, a
    model it cannot read) is a usage error."""
    from steerc.runtime.engines import EngineError, named

    try:
        with named(args.engine).boot(path, facts, plan, command=command, load=load) as booted:
            yield booted
    except EngineError as exc:
        raise UsageError(exc.message) from None
