"""What ``steerc check FILE...`` checks: files, folders and globs, expanded in a fixed order.

* a file (any name) or ``-`` (standard input) is taken as it is;
* a folder means every ``*.steer`` file below it, recursively, in sorted
  order (by path components), skipping hidden files and folders (``.git``,
  ``.venv``, an editor's ``.#x.steer``), ``node_modules``, ``__pycache__``
  and any folder holding a ``pyvenv.cfg`` (a virtual environment under any
  name); symbolic links to folders are not followed;
* an argument with ``*``, ``?`` or ``[`` that is not an existing path is a
  glob, expanded by steerc as ``glob.glob(recursive=True)`` does (``**``
  crosses folders; hidden names match only a pattern part that starts with
  ``.``), its matching files in sorted order; a wildcard does not enter the
  folders a folder walk skips, though the pattern may name one outright, and
  ``**`` does not enter symbolic links to folders (so a link loop ends it);
  a glob that looks at more than MAX_GLOB_PATHS folder entries is a
  ``limit-exceeded`` diagnostic at the argument;
* a path named twice (also through a folder or a glob) is checked once,
  where it first appears.

A folder without ``.steer`` files and a glob matching no file are usage
errors. Anything else is left for reading to report (``no such file``).

>>> import os, tempfile
>>> top = tempfile.mkdtemp()
>>> for rel in ("b.steer", "a/z.steer", "a/y.txt", ".git/x.steer", "node_modules/m.steer"):
...     os.makedirs(os.path.dirname(os.path.join(top, rel)), exist_ok=True)
...     open(os.path.join(top, rel), "w").close()
>>> [os.path.relpath(p, top) for p in expand([top])]
['a/z.steer', 'b.steer']
>>> [os.path.relpath(p, top) for p in expand([os.path.join(top, "**", "*.steer"), os.path.join(top, "b.steer")])]
['a/z.steer', 'b.steer']
"""

from __future__ import annotations

import fnmatch
import os

from steerc.cli import EXIT_ERRORS, UsageError
from steerc.core.limits import MAX_GLOB_PATHS
from steerc.diagnostics.codes import LIMIT_EXCEEDED

SKIPPED_FOLDERS = ("node_modules", "__pycache__")
GLOB_CHARS = frozenset("*?[")


class GlobTooLarge(Exception):
    """A glob looked at more than MAX_GLOB_PATHS folder entries."""


def expand(items: list[str], args=None) -> list[str]:
    """The programs ``items`` name, in order, each once (raises UsageError for an empty folder or glob).

    A glob past MAX_GLOB_PATHS is a ``limit-exceeded`` diagnostic pointing at it in the command line of
    ``args``, printed in its ``--format`` (exits 1).
    """
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        try:
            paths = _one(item)
        except GlobTooLarge:
            _too_large(item, args)
        for path in paths:
            key = path if path == "-" else os.path.abspath(path)
            if key not in seen:
                seen.add(key)
                out.append(path)
    return out


def _one(item: str) -> list[str]:
    if item == "-" or os.path.isfile(item):
        return [item]
    if os.path.isdir(item):
        found = folder_programs(item)
        if not found:
            raise UsageError(f"no .steer files in the folder {item} (hidden folders, node_modules and "
                             "virtual environments are skipped)")
        return found
    if GLOB_CHARS & set(item):
        found = glob_programs(item)
        if not found:
            raise UsageError(f"no file matches the glob {item!r}")
        return found
    return [item]  # reading it reports what is wrong


def _too_large(item: str, args) -> None:
    from steerc.diagnostics import Diagnostic

    message = f"the glob {item!r} looks at more than {MAX_GLOB_PATHS:,} folder entries"
    help = "name fewer folders (a narrower pattern, or the folder itself: a folder walk has no limit)"
    if args is None:
        raise UsageError(f"{message}; {help}")
    from steerc.cli.common import argument_word
    from steerc.cli.report import Report, write

    src, span = argument_word(args, item)
    report = Report([Diagnostic.error(LIMIT_EXCEEDED, message, span, help=help)], {src.name: src})
    if hasattr(args, "format"):
        write(args.format, [report], [])
    else:
        from steerc.cli.common import print_diagnostics

        print_diagnostics(report)
    raise SystemExit(EXIT_ERRORS)


def glob_programs(pattern: str, limit: int | None = None) -> list[str]:
    """The files ``pattern`` matches, sorted by path components; folders a wildcard crosses are skipped as
    in a folder walk (``node_modules``, virtual environments), those the pattern names outright are not.

    Raises GlobTooLarge when it would look at more than ``limit`` (MAX_GLOB_PATHS) folder entries.
    """
    parts = [p for i, p in enumerate(pattern.split(os.sep)) if p or i == 0]
    literal = next((n for n, part in enumerate(parts) if GLOB_CHARS & set(part)), len(parts))
    base = os.sep.join(parts[:literal]) or (os.sep if literal else "")  # "" for the working directory
    found: list[str] = []
    _Glob(parts[literal:], MAX_GLOB_PATHS if limit is None else limit, found).match(base, 0)
    fixed = 0  # how many leading components (as normalised) hold no wildcard
    for part in _components(pattern):
        if GLOB_CHARS & set(part):
            break
        fixed += 1
    out, real = [], set()
    for path in sorted(found, key=_components):
        if os.path.isfile(path) and not _crosses_skipped(path, fixed):
            key = os.path.realpath(path)  # two links to one file: checked once
            if key not in real:
                real.add(key)
                out.append(path)
    return out


class _Glob:
    """``glob.glob(recursive=True)`` over the parts of a pattern below its fixed folder, counting each folder
    entry looked at; ``**`` walks folders without entering links to folders or folders a walk skips."""

    def __init__(self, parts: list[str], limit: int, out: list[str]):
        self.parts, self.left, self.out = parts, limit, out
        self.done: set[tuple[int, int, int]] = set()  # (device, inode, part): each folder matched from once

    def match(self, folder: str, i: int) -> None:
        """Every path below ``folder`` that matches the parts from ``i`` on, into ``out`` (a worklist, not
        recursion: a pattern may have thousands of parts)."""
        todo = [(folder, i)]
        while todo:
            folder, i = todo.pop()
            if i == len(self.parts):
                self.out.append(folder)
                continue
            try:  # a folder reached again (`**/**`, or through a link to it) adds no file of its own
                st = os.stat(folder or os.curdir)
            except OSError:
                continue
            if (st.st_dev, st.st_ino, i) in self.done:
                continue
            self.done.add((st.st_dev, st.st_ino, i))
            part, last = self.parts[i], i == len(self.parts) - 1
            if part == "**":
                todo.append((folder, i + 1))  # no folder at all
                for path, is_folder in self.walk(folder):
                    if is_folder:
                        todo.append((path, i + 1))
                    elif last:
                        self.out.append(path)
            elif GLOB_CHARS & set(part):
                for name, _, is_dir in self.entries(folder):
                    if (part.startswith(".") or not name.startswith(".")) and fnmatch.fnmatchcase(name, part):
                        if last or is_dir:
                            todo.append((os.path.join(folder, name), i + 1))
            else:
                path = os.path.join(folder, part)
                self.pay(1)
                if os.path.lexists(path) if last else os.path.isdir(path):
                    todo.append((path, i + 1))

    def walk(self, folder: str):
        """(path, is a folder) below ``folder``, hidden and skipped folders left out, links not entered."""
        stack = [folder]
        while stack:
            here = stack.pop()
            for name, is_folder, _ in self.entries(here):
                if name.startswith("."):
                    continue
                path = os.path.join(here, name)
                if is_folder:
                    if _skipped(path, name):
                        continue
                    stack.append(path)
                yield path, is_folder

    def entries(self, folder: str) -> list[tuple[str, bool, bool]]:
        """(name, is a folder and not a link, is a folder or a link to one) for each entry of ``folder``, by
        name; none when it cannot be read."""
        out = []
        try:
            with os.scandir(folder or os.curdir) as it:
                for entry in it:
                    self.pay(1)
                    try:
                        out.append((entry.name, entry.is_dir(follow_symlinks=False), entry.is_dir()))
                    except OSError:
                        out.append((entry.name, False, False))
        except OSError:
            pass
        return sorted(out, reverse=True)  # popped from a worklist: the first name is matched first

    def pay(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise GlobTooLarge()


def folder_programs(folder: str) -> list[str]:
    """Every ``*.steer`` file below ``folder``, sorted by path components, named from ``folder`` as given."""
    found = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not _skipped(os.path.join(here, d), d)]
        found.extend(os.path.relpath(os.path.join(here, f), folder) for f in files
                     if f.endswith(".steer") and not f.startswith("."))
    prefix = "" if os.path.normpath(folder) == "." else folder
    return [os.path.join(prefix, rel) if prefix else rel for rel in sorted(found, key=_components)]


def _crosses_skipped(path: str, fixed: int) -> bool:
    """Whether a folder of ``path`` below its first ``fixed`` components is one a walk skips."""
    folder = os.path.dirname(os.path.normpath(path))
    while len(_components(folder)) > fixed and folder not in ("", os.sep):
        if _skipped(folder, os.path.basename(folder)):
            return True
        folder = os.path.dirname(folder)
    return False


def _skipped(path: str, name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_FOLDERS or os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _components(path: str) -> tuple[str, ...]:
    return tuple(os.path.normpath(path).split(os.sep))
