"""The path policy: files named in a program stay inside the project root.

The root is the nearest folder at or above the ``.steer`` file that holds a
``steer.toml``, else the file's own folder; ``--root`` overrides it. Paths
are relative to the ``.steer`` file. A path that resolves (symbolic links
followed) outside the root is refused before anything is read.

>>> import os, tempfile
>>> top = tempfile.mkdtemp()
>>> open(os.path.join(top, "steer.toml"), "w").close()
>>> os.makedirs(os.path.join(top, "sub"))
>>> find_root(os.path.join(top, "sub")) == os.path.realpath(top)
True
>>> resolve("../../x.npy", os.path.join(top, "sub"), os.path.realpath(top)).escapes
True

The folders steerc creates for itself (in the system temp folder, in the user
cache) are named ``steerc-<what>``: not a Python identifier, so a process
started with their parent as its working folder can never import one of them
as a namespace package ``steerc`` ahead of the installed steerc.

>>> os.path.basename(temp_folder("plans"))
'steerc-plans'
>>> importable(os.path.basename(temp_folder("plans"))), importable(CACHE_NAME)
(False, False)
"""

from __future__ import annotations

import os

from steerc.core.record import frozen

MARKER = "steer.toml"
CACHE_NAME = "steerc-cache"  # the user cache's folder under $XDG_CACHE_HOME or ~/.cache (steerc.core.cache)


def temp_folder(what: str) -> str:
    """``<system temp folder>/steerc-<what>``: where steerc keeps ``what`` when no folder is configured."""
    import tempfile  # not at import: `steerc check` never needs it

    name = f"steerc-{what}"
    assert not importable(name), name
    return os.path.join(tempfile.gettempdir(), name)


def importable(folder_name: str) -> bool:
    """Whether ``import <folder_name>`` could find a folder of that name (it is an identifier)."""
    return folder_name.isidentifier()


def find_root(start_dir: str) -> str:
    """The project root for a program living in ``start_dir``."""
    marker = find_marker(start_dir)
    return os.path.dirname(marker) if marker else os.path.realpath(start_dir)


def find_marker(start_dir: str) -> str | None:
    """The nearest ``steer.toml`` at or above ``start_dir`` (symbolic links resolved), or None."""
    probe = os.path.realpath(start_dir)
    while True:
        candidate = os.path.join(probe, MARKER)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent


@frozen
class Resolved:
    path: str  # absolute, symbolic links resolved
    escapes: bool


def resolve(relative: str, base_dir: str, root: str) -> Resolved:
    """Resolve ``relative`` against ``base_dir``; say whether it leaves ``root``."""
    joined = os.path.join(base_dir, relative)
    real = os.path.realpath(joined)
    root_real = os.path.realpath(root)
    inside = real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)
    return Resolved(real, not inside)


def new_file_mode() -> int:
    """The mode a new file gets from ``open`` under this process's umask (``0o644`` under the usual ``022``)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomically(path: str, data: bytes) -> None:
    """``data`` at ``path`` by a temporary file in the same folder and a rename (missing folders made): never half
    a file, and no temporary file left behind whatever fails. The file gets the mode ``open`` would give it
    (:func:`new_file_mode`), not the temporary file's owner-only ``0o600``: a compiled artifact is read by
    servers and tools that may run as another user."""
    import contextlib
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def where_to_write(path: str, holding: str | None = None) -> str | None:
    """Why a folder cannot be had at ``path`` (its nearest existing ancestor is a file, or not writable), or
    None: checked before a long run, so that its result is not lost at the end. ``holding`` names the file the
    folder is for, in the message."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        return f"{shown_folder(existing)} is a file, not a folder" + (f", so it cannot hold {holding}" if holding
                                                                        else "")
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write in {shown_folder(existing)} (permission denied)"
    return None


def shown_folder(folder: str) -> str:
    """A folder as the user would write it: relative to the working folder when under it."""
    rel = os.path.relpath(folder)
    return folder if rel.startswith("..") else rel
