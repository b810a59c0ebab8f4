"""The one JSON reader of steerc: bounded before it is parsed.

Every JSON input the compiler reads — a safetensors header, a
``config.json``, a facts JSON, a serve plan, the IR JSON — goes through
:func:`loads`, which refuses (with :class:`JSONError`, never another
exception) what Python's ``json`` would accept or choke on:

* text over ``max_bytes`` (default :data:`~steerc.core.limits.MAX_JSON_BYTES`), or
  not UTF-8;
* arrays and objects nested deeper than
  :data:`~steerc.core.limits.MAX_JSON_DEPTH` (found by a scan that does not
  recurse, before parsing);
* integers of more than :data:`~steerc.core.limits.MAX_JSON_INT_DIGITS` digits,
  numbers too large for a float64 (``1e999``), and the non-JSON constants
  ``NaN``, ``Infinity`` and ``-Infinity``;
* strings (keys included) holding a lone surrogate (``"\\ud800"``), which is
  not a character and cannot be printed or written as UTF-8;
* with ``unique_keys``, an object that repeats a key.

>>> loads('{"a": [1, 2.5, "x"]}')
{'a': [1, 2.5, 'x']}
>>> loads("[" * 300 + "]" * 300)
Traceback (most recent call last):
  ...
steerc.core.jsonio.JSONError: arrays and objects nest more than 200 levels deep (at offset 200)

And the one JSON writer: :func:`dumps` writes strict JSON (what ``json.dumps``
writes with ``allow_nan=False``), which :func:`loads` reads back. A float that
is not finite, which JSON has no number for, is written as the object
``{"float": "inf"}``, ``{"float": "-inf"}`` or ``{"float": "nan"}``
(spec/json.md); :func:`decode_float` turns such an object back into the float.

>>> dumps([1.5, float("inf"), -float("inf")])
'[1.5, {"float": "inf"}, {"float": "-inf"}]'
>>> [decode_float(v) for v in loads(dumps([float("-inf")]))]
[-inf]
"""

from __future__ import annotations

import json
import math
import re

from steerc.core.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS, human

__all__ = ["JSONError", "decode_float", "dumps", "finite", "loads", "read_file"]

FLOAT_KEY = "float"  # {"float": "inf" | "-inf" | "nan"}: a float JSON has no number for
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class JSONError(ValueError):
    """Text that steerc does not read as JSON; ``offset`` is where (a character offset), when known."""

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message if offset is None else f"{message} (at offset {offset})")
        self.message = message
        self.offset = offset


# Strings (skipped whole, escapes included) and the brackets between them.
_SCAN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]", re.ASCII)


def _max_depth_offset(text: str, limit: int) -> int | None:
    """The offset of the first bracket nested deeper than ``limit``, or None."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for m in _SCAN.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c == "]" or c == "}":
            depth -= 1
    return None


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise JSONError(f"an integer of {len(digits.lstrip('-')):,} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(digits)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONError(f"the number {text[:40]} is too large for a float64")
    return value


def _no_constant(name: str):
    raise JSONError(f"`{name}` is not JSON")


def _unique(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise JSONError(f"the key {json.dumps(k)} appears twice in one object")
            seen.add(k)
    return out


def _lone_surrogate(value) -> str | None:
    """A string inside ``value`` (a key or a value) holding a lone surrogate."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def loads(data: str | bytes, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
          unique_keys: bool = False):
    """Parse JSON text (``str``, or UTF-8 ``bytes``) under steerc's limits; raises :class:`JSONError`."""
    if len(data) > max_bytes:
        raise JSONError(f"{len(data):,} bytes is more than the {human(max_bytes, 'bytes')} steerc reads as JSON")
    if isinstance(data, (bytes, bytearray)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONError(f"not UTF-8 ({exc.reason})", exc.start) from None
    else:
        text = data
    at = _max_depth_offset(text, max_depth)
    if at is not None:
        raise JSONError(f"arrays and objects nest more than {max_depth} levels deep", at)
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_no_constant,
                           object_pairs_hook=_unique if unique_keys else None)
    except json.JSONDecodeError as exc:
        raise JSONError(exc.msg, exc.pos) from None
    except JSONError:
        raise
    except (ValueError, RecursionError) as exc:  # a last guard: the depth scan should prevent recursion
        raise JSONError(str(exc)[:200]) from None
    if _SURROGATE_ESCAPE.search(text) or not text.isascii():
        bad = _lone_surrogate(value)
        if bad is not None:
            raise JSONError(f"the string {json.dumps(bad[:40])} holds a lone surrogate, which is not a character")
    return value


def read_file(path: str, *, max_bytes: int = MAX_JSON_BYTES, **kw):
    """(text, value) of a JSON file; OSError when it cannot be read, JSONError when it is not JSON."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JSONError(f"the file is larger than the {human(max_bytes, 'bytes')} steerc reads as JSON")
    value = loads(data, max_bytes=max_bytes, **kw)
    return data.decode("utf-8"), value


def _non_finite(value: float) -> dict:
    return {FLOAT_KEY: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def finite(value):
    """``value`` (dicts, lists, tuples as lists, scalars) with every float that is not finite written as
    ``{"float": ...}``; anything else is left as it is (so ``json.dumps`` still refuses what is not JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if not isinstance(value, (str, int, type(None))) and hasattr(value, "dtype") and hasattr(value, "item"):
        return finite(value.item())  # a numpy scalar
    return value


def dumps(value, **kw) -> str:
    """Strict JSON text of ``value`` (``json.dumps`` keywords apply; ``allow_nan`` is always False)."""
    kw["allow_nan"] = False
    return json.dumps(finite(value), **kw)


def canonical(value) -> str:
    """The one canonical JSON text, which hashes, salts, fingerprints and stored documents are taken over:
    sorted keys, no spaces, strict (:func:`dumps`), ASCII only (every other character escaped, so any text,
    a lone surrogate too, has bytes).

    >>> print(canonical({"b": [1.5, float("inf")], "a": "caf\u00e9"}))
    {"a":"caf\\u00e9","b":[1.5,{"float":"inf"}]}
    """
    return dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def decode_float(value):
    """The float a ``{"float": "inf" | "-inf" | "nan"}`` object stands for; any other value as it is."""
    if isinstance(value, dict) and len(value) == 1 and value.get(FLOAT_KEY) in _NON_FINITE:
        return _NON_FINITE[value[FLOAT_KEY]]
    return value
