"""Files named in a program: resolved under the path policy (see :mod:`steerc.core.paths`)."""

from __future__ import annotations

import os

from steerc.core.limits import MAX_PATH_CHARS
from steerc.core.paths import resolve
from steerc.diagnostics.codes import FILE_NOT_FOUND, INVALID_VALUE, LIMIT_EXCEEDED, PATH_ESCAPE
from steerc.ir import nodes as ir
from steerc.passes.context import CheckContext, Fault


def resolve_path(ctx: CheckContext, path: ir.Str, what: str = "file", folder: bool = False) -> str:
    """The real path of a file (with ``folder``, a folder) named in the program; faults outside the root or
    missing."""
    if "\0" in path.value:
        ctx.error(INVALID_VALUE, "a path cannot contain a NUL character", path.span)
        raise Fault
    if len(path.value) > MAX_PATH_CHARS:  # resolving takes time in the length
        ctx.error(LIMIT_EXCEEDED, f"this path is {len(path.value):,} characters long; steerc reads paths of "
                  f"at most {MAX_PATH_CHARS:,}", path.span)
        raise Fault
    resolved = resolve(path.value, ctx.base_dir, ctx.root)
    if resolved.escapes:
        where = "given by --root" if ctx.options.root else "the nearest folder with a steer.toml"
        ctx.error(
            PATH_ESCAPE,
            f"`{path.value}` leaves the project root",
            path.span,
            help=f"the project root is {ctx.root} ({where}); move the file inside it, or pass --root",
        )
        raise Fault
    if not (os.path.isdir if folder else os.path.isfile)(resolved.path):
        ctx.error(
            FILE_NOT_FOUND,
            f"{what} `{path.value}` does not exist",
            path.span,
            help=_relative_to(ctx),
        )
        raise Fault
    return resolved.path


def _relative_to(ctx) -> str:
    """Where relative paths started from, as the help line of ``file-not-found`` says it."""
    if ctx.options.base_dir:
        return f"paths are relative to {ctx.base_dir} (Options.base_dir)"
    if ctx.source.path:
        return f"paths are relative to the .steer file's folder ({ctx.base_dir})"
    return (f"paths are relative to the working folder ({ctx.base_dir}): the text has no file (check_source "
            "without path=, or standard input); give path= or Options(base_dir=...) to resolve them elsewhere")
