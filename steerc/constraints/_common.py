"""Helpers shared by the checkers: suggestions, offsets, and the optional xgrammar.

>>> did_you_mean("strin", ["string", "number"])
'did you mean `string`?'
>>> line_col_to_offset("ab\\ncd", 2, 2)
4
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Callable, Iterable, Iterator

from steerc.constraints import INVALID, Problem
from steerc.core.cache import cache_root, read_json, write_json


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be, if any is close.

    >>> closest("Minlength", ["minLength", "maxLength"])
    'minLength'
    >>> closest("zzz", ["minLength"]) is None
    True
    """
    pool = [c for c in candidates if c != word]
    folded = {c.casefold(): c for c in pool}
    if word.casefold() in folded:
        return folded[word.casefold()]
    found = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A ``did you mean `x`?`` help line, or ``None``.

    >>> did_you_mean("propertys", ["properties"])
    'did you mean `properties`?'
    """
    best = closest(word, candidates)
    return f"did you mean `{best}`?" if best is not None else None


def show(text: str, limit: int = 40) -> str:
    """Quote a piece of user text for a message, shortened and with control characters escaped.

    >>> show("a\\nb")
    '`a\\\\nb`'
    """
    shown = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return f"`{shown}`"


def line_col_to_offset(text: str, line: int, column: int) -> int | None:
    """0-based character offset of a 1-based ``line``/``column`` counted in UTF-8 bytes.

    xgrammar's EBNF errors count columns in bytes and treat ``\\n``, ``\\r\\n``
    and a lone ``\\r`` as line breaks.

    >>> line_col_to_offset("é x", 1, 4)
    2
    >>> line_col_to_offset("a", 9, 1) is None
    True
    """
    starts = [0]
    for m in re.finditer(r"\r\n|\r|\n", text):
        starts.append(m.end())
    if line < 1 or line > len(starts):
        return None
    start = starts[line - 1]
    end = starts[line] if line < len(starts) else len(text)
    budget = column - 1
    offset = start
    while budget > 0 and offset < end:
        budget -= len(text[offset].encode("utf-8", "surrogatepass"))
        offset += 1
    return offset


# -------------------------------------------------------------- xgrammar


def load_xgrammar():
    """The ``xgrammar`` module, or ``None`` when it is not installed (or fails to load).

    >>> load_xgrammar() is None or hasattr(load_xgrammar(), "Grammar")
    True
    """
    try:
        import xgrammar  # noqa: PLC0415  (optional, imported lazily on purpose)
    except Exception:  # noqa: BLE001  (a broken install is as good as none)
        return None
    return xgrammar


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (xgrammar's C++ logs warnings there) for a moment.

    >>> with quiet_stderr():
    ...     print("stdout still works")
    stdout still works
    """
    try:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def xgrammar_error(call: Callable[[object], object], key: str | None = None) -> str | None:
    """Run ``call(xgrammar)``; return the cleaned error text if xgrammar rejects the input.

    Returns ``None`` when it accepts, or when xgrammar is not installed.
    With a ``key`` (what is compiled, e.g. ``"regex:" + pattern``) the
    verdict is remembered in the user cache for this xgrammar version, so a
    second check of the same text neither imports xgrammar (and torch, about
    1.5 s) nor compiles again.

    >>> xgrammar_error(lambda xgr: None) is None
    True
    """
    version = _xgrammar_version()
    if version is None:
        return None
    path = _verdict_path(version, key) if key is not None else None
    if path is not None:
        known = read_json(path, {})
        if "error" in known and (known["error"] is None or isinstance(known["error"], str)):
            return known["error"]
    xgr = load_xgrammar()
    if xgr is None:
        return None
    try:
        with quiet_stderr():
            call(xgr)
    except (UnicodeError, MemoryError, RecursionError):
        return None  # text xgrammar's binding cannot even receive; not a verdict
    except Exception as exc:  # noqa: BLE001  (xgrammar raises RuntimeError and friends)
        message = clean_xgrammar_message(str(exc))
    else:
        message = None
    if path is not None:
        write_json(path, {"error": message})
    return message


def _xgrammar_version() -> str | None:
    """The installed xgrammar's version, read from its metadata (nothing imported)."""
    from importlib import metadata

    try:
        return metadata.version("xgrammar")
    except metadata.PackageNotFoundError:
        return None


def _verdict_path(version: str, key: str) -> str | None:
    import hashlib


    try:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    except UnicodeError:
        return None
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", version)
    return os.path.join(cache_root(), "xgrammar", safe, digest + ".json")


def clean_xgrammar_message(raw: str) -> str:
    """Strip xgrammar's log prefix (time stamp, C++ file and line) from an error.

    >>> clean_xgrammar_message("[08:02:02] /project/cpp/x.cc:94: Regex parsing error at position 4: Bad.")
    'Regex parsing error at position 4: Bad.'
    """
    lines = [ln for ln in raw.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else raw
    return re.sub(r"^\s*(\[[^\]]*\]\s*)?(\S+\.(cc|h|cpp):\d+:\s*)?", "", last).strip()


def xgrammar_problem(message: str, offset: int | None) -> Problem:
    """The Problem for an error only xgrammar found.

    >>> xgrammar_problem("Unmatched ')'", 2).message
    "xgrammar rejects this: Unmatched ')'"
    """
    return Problem(INVALID, f"xgrammar rejects this: {message}", offset)
