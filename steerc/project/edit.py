"""Writing params into a ``steer.toml``'s ``[params]`` table, keeping every other byte: comments, layout, order.

``steerc tune`` writes its choice this way. A param the table already sets
has its value replaced where it stands (a comment after it stays); a new one
goes on a line after the table's last key; a file without the table gets
one at its end. The result is read back with ``tomllib`` and must hold the
new values and every old value unchanged, or nothing is written
(:class:`EditError`).

>>> print(set_params('# mine\\n[params]\\nstrength = 2.0  # was tuned\\nlayer = 8\\n', {"strength": 4.5, "bias": 1.0}), end="")
# mine
[params]
strength = 4.5  # was tuned
layer = 8
bias = 1.0
"""

from __future__ import annotations

import math
import re

from steerc.project.locate import scan
from steerc.project.toml import tomllib

_BARE = re.compile(r"[A-Za-z0-9_-]+")


class EditError(ValueError):
    """The params cannot be written without changing what the file means (the message says why)."""


def number(value: float) -> str:
    """A TOML float for ``value``: the shortest text that reads back as the same float."""
    if not math.isfinite(value):
        raise EditError(f"{value} is not a finite number")
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def _key(name: str) -> str:
    return name if _BARE.fullmatch(name) else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def set_params(text: str, values: dict[str, float]) -> str:
    """``text`` with ``[params]`` setting each of ``values`` (raises EditError when it cannot)."""
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EditError(f"steer.toml does not parse ({exc})") from None
    table = before.get("params", {})
    if not isinstance(table, dict):
        raise EditError("steer.toml's `params` is not a table")
    out = text
    for name, value in values.items():
        out = _set_one(out, name, number(value), name in table)
    after = tomllib.loads(out)
    expected = dict(before, params={**table, **{k: float(v) for k, v in values.items()}})
    if after != expected:
        raise EditError("writing [params] here would change other values; edit steer.toml by hand")
    return out


def _set_one(text: str, name: str, value: str, present: bool) -> str:
    spots = scan(text)
    if present:
        spot = spots.get(("params", name))
        if spot is None:  # set in an inline table, a dotted key elsewhere, or over several lines
            raise EditError(f"steer.toml sets params.{name} in a form steerc does not rewrite (an inline table or "
                            f"a dotted key outside [params]); write it as `{_key(name)} = ...` under [params]")
        (start, end) = spot[1]
        return text[:start] + value + text[end:]
    line = f"{_key(name)} = {value}"
    if ("params",) not in spots:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}[params]\n{line}\n"
    inside = [s for path, s in spots.items() if len(path) == 2 and path[0] == "params"]
    at = max((s[1][1] for s in inside), default=spots[("params",)][0][1])
    eol = text.find("\n", at)
    if eol < 0:
        return f"{text}\n{line}\n"
    return f"{text[:eol + 1]}{line}\n{text[eol + 1:]}"
