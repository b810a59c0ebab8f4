"""What ``steerc check FILE...`` checks: files, folders and globs, expanded in a fixed order.

* a file (any name) or ``-`` (standard input) is taken as it is;
* a folder means every ``*.steer`` file below it, recursively, in sorted
  order (by path components), skipping hidden files and folders (``.git``,
  ``.venv``, an editor's ``.#x.steer``), ``node_modules``, ``__pycache__``
  and any folder holding a ``pyvenv.cfg`` (a virtual environment under any
  name); symbolic links to folders are not followed;
* an argument with ``*``, ``?`` or ``[`` that is not an existing path is a
  glob, expanded by steerc with ``glob.glob(recursive=True)`` (``**``
  crosses folders; hidden names match only a pattern part that starts with
  ``.``), its matching files in sorted order; a wildcard does not enter the
  folders a folder walk skips, though the pattern may name one outright;
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

import glob
import os

from steerc.cli import UsageError

SKIPPED_FOLDERS = ("node_modules", "__pycache__")
GLOB_CHARS = frozenset("*?[")


def expand(items: list[str]) -> list[str]:
    """The programs ``items`` name, in order, each once (raises UsageError for an empty folder or glob)."""
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        for path in _one(item):
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


def glob_programs(pattern: str) -> list[str]:
    """The files ``pattern`` matches, sorted by path components; folders a wildcard crosses are skipped as
    in a folder walk (``node_modules``, virtual environments), those the pattern names outright are not."""
    fixed = 0  # how many leading components hold no wildcard
    for part in _components(pattern):
        if GLOB_CHARS & set(part):
            break
        fixed += 1
    out = []
    for path in glob.glob(pattern, recursive=True):
        if os.path.isfile(path) and not _crosses_skipped(path, fixed):
            out.append(path)
    return sorted(out, key=_components)


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
