"""Rewriting a user's file where it stands: how ``steerc tune`` and ``steerc derive --calibrate --write`` write
``steer.toml``.

A user's file keeps everything the write does not mean to change:

* **Links.** A symbolic link is followed: the file it leads to is rewritten
  and the link stays a link, so settings shared through it stay shared. A
  file with other hard links is rewritten in place: every name still sees
  the one file.
* **Identity.** Its mode, owner and group stay. A file with one name, whose
  owner and group a new copy can take, is replaced atomically (a temporary
  file beside it, flushed, then renamed over it); any other is overwritten
  in place and flushed, which keeps its inode, and gets its old bytes back
  if the write fails half way (a full disk).
* **Bytes.** :func:`read` gives the text without its UTF-8 byte-order mark
  and says whether it had one; :func:`write` puts the mark back.
* **Refusals, before the work.** :func:`target` says why a file cannot be
  written: a link to nothing, not a regular file, read-only (no write
  permission bit: refused even for the superuser, as an editor refuses), not
  writable by this user, or, for a new file, a folder that cannot take it.
  A command calls it (and :func:`read`) before its long work, so it refuses
  then rather than after.

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> real = os.path.join(folder, "shared.toml")
>>> with open(real, "wb") as fh:
...     _ = fh.write(b"\\xef\\xbb\\xbf[params]\\r\\n")
>>> os.chmod(real, 0o640)
>>> os.symlink("shared.toml", os.path.join(folder, "steer.toml"))
>>> text, bom = read(os.path.join(folder, "steer.toml"))
>>> text, bom
('[params]\\r\\n', True)
>>> write(os.path.join(folder, "steer.toml"), text + "a = 1\\r\\n", bom)
>>> os.path.islink(os.path.join(folder, "steer.toml")), oct(os.stat(real).st_mode & 0o777)
(True, '0o640')
>>> open(real, "rb").read()
b'\\xef\\xbb\\xbf[params]\\r\\na = 1\\r\\n'
"""

from __future__ import annotations

import codecs
import os
import secrets
import stat

from steerc.core.limits import MAX_SOURCE_BYTES

__all__ = ["WriteError", "read", "target", "write"]

BOM = codecs.BOM_UTF8


class WriteError(ValueError):
    """A file steerc may not or cannot write (the message says why, without the file's name)."""


def target(path: str) -> str:
    """The file a write to ``path`` changes: ``path``, or where its symbolic links lead (absolute). Raises
    WriteError when that file could not be written (or, when there is none, created)."""
    real = os.path.realpath(path)
    if os.path.islink(path) and not os.path.lexists(real):
        raise WriteError(f"is a symbolic link to {real}, which does not exist")
    if not os.path.lexists(real):
        folder = os.path.dirname(real)
        if not os.path.isdir(folder):
            raise WriteError(f"cannot be created: there is no folder {folder}")
        _writable(folder, f"cannot be created: its folder {folder}")
        return real
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise WriteError("is not a regular file" + (f" (it leads to {real})" if real != os.path.abspath(path) else ""))
    _writable(real, "")
    return real


def _writable(path: str, folder: str) -> None:
    """Refuse ``path`` without a write permission bit, or not writable by this user; ``folder`` starts the
    message when ``path`` is the folder of a file to create."""
    mode = stat.filemode(os.stat(path).st_mode)
    if not os.stat(path).st_mode & 0o222:
        if folder:
            raise WriteError(f"{folder} is read-only (mode {mode})")
        raise WriteError(f"is read-only (mode {mode}): steerc does not overwrite a read-only file; make it "
                         "writable (chmod u+w) to let it")
    if not os.access(path, os.W_OK):
        raise WriteError(f"{folder} cannot be written by this user (mode {mode})" if folder
                         else f"cannot be written by this user (mode {mode})")


def read(path: str) -> tuple[str, bool]:
    """(the text of ``path`` without a leading byte-order mark, whether it had one); ``("", False)`` for a
    file that does not exist. Line ends are kept as they are. Raises WriteError when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except FileNotFoundError:
        return "", False
    except OSError as exc:
        raise WriteError(f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise WriteError(f"is larger than {MAX_SOURCE_BYTES:,} bytes")
    bom = data.startswith(BOM)
    try:
        return data[len(BOM) if bom else 0:].decode("utf-8"), bom
    except UnicodeDecodeError as exc:
        raise WriteError(f"is not UTF-8 text (byte {exc.start + (3 if bom else 0)})") from None


def write(path: str, text: str, bom: bool = False) -> None:
    """Make ``path`` (through its links) hold ``text``, UTF-8, after a byte-order mark when ``bom``; its
    mode, owner, group and links kept. Raises WriteError (the file is then as it was)."""
    real = target(path)
    data = (BOM if bom else b"") + text.encode("utf-8")
    try:
        if not os.path.exists(real):
            _replace(real, data, None)
            return
        st = os.stat(real)
        if st.st_nlink > 1 or not _replace(real, data, st):
            _overwrite(real, data)
    except OSError as exc:
        raise WriteError(f"cannot be written ({exc.strerror or exc})") from None


def _replace(real: str, data: bytes, st: os.stat_result | None) -> bool:
    """Write ``data`` to a new file beside ``real`` and rename it over ``real``, the new file given ``st``'s
    mode, owner and group (a new file: the mode the umask gives). False, with nothing changed, when the
    folder takes no new file or the owner or group cannot be kept."""
    folder, name = os.path.split(real)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except PermissionError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            if st is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
                mine = os.fstat(fh.fileno())
                if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
                    try:
                        os.fchown(fh.fileno(), st.st_uid, st.st_gid)
                    except PermissionError:
                        os.unlink(tmp)
                        return False
                    os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))  # chown clears the set-id bits
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    _sync_folder(folder)
    return True


def _overwrite(real: str, data: bytes) -> None:
    """Write ``data`` over ``real``'s bytes (its inode kept); on a failure its old bytes go back, whose blocks
    the file still holds."""
    fd = os.open(real, os.O_RDWR)
    try:
        old = b"".join(iter(lambda: os.read(fd, 1 << 16), b""))
        try:
            _put(fd, data)
        except OSError:
            try:
                _put(fd, old)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def _put(fd: int, data: bytes) -> None:
    view, at = memoryview(data), 0
    while at < len(data):
        at += os.pwrite(fd, view[at:], at)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _sync_folder(folder: str) -> None:
    """Flush the rename to disk where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
