"""Writing a target's files: each atomically (a temporary file, then a rename), in the order given; and the
output folder's manifest, which lets a compile into a folder an earlier one wrote remove what that one wrote
(an old ``_params.py`` it would not write again), never a file steerc did not write (spec/targets.md).

The manifest, ``OUT/.steerc-output.json``, lists every file the last compile wrote there with its sha256.
"""

from __future__ import annotations

import hashlib
import os

from steerc.core.paths import where_to_write, write_atomically

MANIFEST = ".steerc-output.json"
FORMAT = "steerc.output/1"
MAX_MANIFEST_BYTES = 1 << 20


def write_files(out_dir: str, blobs: dict[str, bytes], folders: tuple[str, ...] = ()) -> list[str]:
    """Write ``{name relative to out_dir: bytes}``, making their folders and ``folders`` (even when
    empty); returns the names, in order."""
    for folder in folders:
        os.makedirs(os.path.join(out_dir, folder), exist_ok=True)
    for name, data in blobs.items():
        write_atomically(os.path.join(out_dir, name), data)
    return list(blobs)


# ------------------------------------------------------------------------------------------ the manifest


def folder_problem(out_dir: str) -> str | None:
    """Why ``out_dir`` cannot take a compile's files (None: it can): an empty path, a file, a folder under a
    file or one the user cannot write in, or a folder holding files (other than hidden ones) that no compile
    wrote (it has no manifest), which the compile could overwrite. A missing folder is made.

    >>> folder_problem("")
    'an empty path names no folder'
    """
    if out_dir == "":
        return "an empty path names no folder"
    if "\0" in out_dir:
        return "a path cannot hold a NUL character"
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        return f"{out_dir} is a file, not a folder"
    problem = where_to_write(out_dir)
    if problem is not None:
        return problem
    if os.path.isdir(out_dir) and not os.path.isfile(os.path.join(out_dir, MANIFEST)):
        theirs = sorted(n for n in os.listdir(out_dir) if not n.startswith("."))
        if theirs:
            shown = ", ".join(theirs[:3]) + (", ..." if len(theirs) > 3 else "")
            return f"{out_dir} holds files steerc did not write ({shown}), which a compile could overwrite"
    return None


def previous(out_dir: str) -> dict[str, str]:
    """{name: sha256} of the files the last compile into ``out_dir`` wrote ({} without a readable manifest).
    A name that is not a plain relative path inside the folder is dropped: the manifest never reaches out."""
    from steerc.core.jsonio import JSONError, read_file

    try:
        _, doc = read_file(os.path.join(out_dir, MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, JSONError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(files, dict):
        return {}
    return {name: digest for name, digest in files.items() if isinstance(digest, str) and _inside(name)}


def _inside(name: str) -> bool:
    """A relative path of plain names below the folder (no '..', no absolute path, no empty part).

    >>> _inside("artifacts/a.safetensors"), _inside("../x"), _inside("/etc/passwd"), _inside("a//b")
    (True, False, False, False)
    """
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def clear(out_dir: str) -> tuple[list[str], list[str]]:
    """Before a compile writes into ``out_dir``: remove the files the previous compile wrote there (its
    manifest's) and the folders that leaves empty, so that the folder ends holding this compile's files and
    the user's, nothing stale. A file changed since steerc wrote it (its sha256 differs), or no longer a
    plain file, is the user's now and kept. Returns (removed, kept)."""
    before = previous(out_dir)
    removed, kept = [], []
    for name in sorted(before):
        path = os.path.join(out_dir, name)
        if not os.path.lexists(path):
            continue
        if (os.path.islink(path) or not os.path.isfile(path) or not _below(out_dir, path)
                or _sha256(path) != before[name]):
            kept.append(name)
            continue
        os.unlink(path)
        removed.append(name)
        _remove_empty_folders(out_dir, os.path.dirname(name))
    if before:
        record(out_dir, [])  # a compile that fails from here leaves a folder that is still steerc's
    return removed, kept


def _below(out_dir: str, path: str) -> bool:
    """Whether ``path`` really is in ``out_dir`` (no folder on the way is a link out of it)."""
    root = os.path.realpath(out_dir)
    return os.path.realpath(os.path.dirname(path)).startswith(root.rstrip(os.sep) + os.sep) or \
        os.path.realpath(os.path.dirname(path)) == root


def record(out_dir: str, written: list[str]) -> None:
    """Write the manifest of ``out_dir``: ``written`` (names relative to it), each with its sha256."""
    from steerc.core.jsonio import dumps

    files = {name: _sha256(os.path.join(out_dir, name)) for name in sorted(written)}
    write_atomically(os.path.join(out_dir, MANIFEST),
                      (dumps({"format": FORMAT, "files": files}, indent=2) + "\n").encode("utf-8"))


def _remove_empty_folders(out_dir: str, folder: str) -> None:
    """``folder`` (relative to ``out_dir``) and its parents below ``out_dir``, while they are empty."""
    while folder:
        try:
            os.rmdir(os.path.join(out_dir, folder))
        except OSError:  # not empty: it holds something else
            return
        folder = os.path.dirname(folder)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
