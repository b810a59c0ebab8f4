"""steerc's user cache: dequantized GGUF models and xgrammar verdicts.

The cache lives in ``$STEERC_CACHE_DIR`` when that is set, else in
``$XDG_CACHE_HOME/steerc-cache``, else in ``~/.cache/steerc-cache`` (a name
that is not an identifier, so the folder is never imported as the package
``steerc``: see :mod:`steerc.core.paths`). Everything in it
can be deleted at any time; it is rebuilt when needed. Nothing in it is
pickled: JSON, safetensors and the tokenizer files transformers writes.

A file's SHA-256 is computed once and remembered by (real path, size,
modification time) in ``hashes.json``, so a 100 MB model is hashed on the
first use only.

>>> import os, tempfile
>>> os.environ["STEERC_CACHE_DIR"] = tempfile.mkdtemp()
>>> path = os.path.join(cache_root(), "x.bin")
>>> with open(path, "wb") as fh:
...     _ = fh.write(b"abc")
>>> file_sha256(path)[:16]
'ba7816bf8f01cfea'
>>> cached_hash(path) == file_sha256(path)
True
>>> del os.environ["STEERC_CACHE_DIR"]
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from steerc.core.paths import CACHE_NAME

ENV = "STEERC_CACHE_DIR"


def cache_root() -> str:
    """The cache folder (created on first use; not created by this call)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), CACHE_NAME)


def display(path: str) -> str:
    """``path`` with the home folder written as ``~``."""
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home not in ("", "/") and path.startswith(home + os.sep) else path


def _stamp(path: str) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cached_hash(path: str) -> str | None:
    """The remembered SHA-256 of ``path``, if the file has not changed since it was hashed."""
    entry = read_json(os.path.join(cache_root(), "hashes.json"), {}).get(os.path.realpath(path))
    if isinstance(entry, dict) and {k: entry.get(k) for k in ("size", "mtime_ns")} == _stamp(path):
        return entry.get("sha256")
    return None


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, remembered by real path, size and modification time."""
    known = cached_hash(path)
    if isinstance(known, str):
        return known
    stamp = _stamp(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    index_path = os.path.join(cache_root(), "hashes.json")
    index = {k: v for k, v in read_json(index_path, {}).items() if os.path.exists(k)}
    index[os.path.realpath(path)] = {**stamp, "sha256": value}
    write_json(index_path, index)
    return value


def read_json(path: str, default):
    """The JSON in ``path``, or ``default`` when it is missing, unreadable or of another type."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return default
    return value if isinstance(value, type(default)) else default


def write_json(path: str, value) -> bool:
    """Write ``value`` atomically; False (and nothing raised) when the cache is not writable."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(value, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return True
    except OSError:
        return False
