"""Writing params into a ``steer.toml``'s ``[params]`` table, keeping every other character: comments, layout,
order, a byte-order mark, and each line's own line end.

``steerc tune`` writes its choice this way (and ``derive --calibrate
--write`` its threshold). A param the table already sets has its value
replaced where it stands (a comment after it stays), under ``[params]`` or
as a dotted ``params.NAME = ...`` key; a new one goes on a line after the
table's last key (``params.NAME = ...`` after the last dotted one, for a
table made of dotted keys), ending as that line ends; a file without the
table gets one at its end, its lines ending as most of the file's lines do.
The result is read back with ``tomllib`` and must hold the new values and
every old value unchanged, or nothing is written (:class:`EditError`). A
``params = {...}`` inline table is not rewritten (:class:`EditError` with
its place).

>>> print(set_params('# mine\\n[params]\\nstrength = 2.0  # was tuned\\nlayer = 8\\n', {"strength": 4.5, "bias": 1.0}), end="")
# mine
[params]
strength = 4.5  # was tuned
layer = 8
bias = 1.0
>>> set_params('params.strength = 1\\r\\n[defaults]\\n', {"strength": 2.0, "bias": 0.5})
'params.strength = 2.0\\r\\nparams.bias = 0.5\\r\\n[defaults]\\n'
"""

from __future__ import annotations

import math
import re
from collections import Counter

from steerc.project.locate import scan
from steerc.project.toml import tomllib

_BARE = re.compile(r"[A-Za-z0-9_-]+")


class EditError(ValueError):
    """The params cannot be written without changing what the file means (the message says why); ``span``
    is where in the file, as offsets into its text with line ends made ``\\n`` and no byte-order mark (as
    :class:`steerc.project.Project`'s source holds it), when one place is to blame; ``help`` says what to do."""

    def __init__(self, message: str, span: tuple[int, int] | None = None, help: str | None = None):
        super().__init__(message)
        self.message, self.span, self.help = message, span, help


def number(value: float) -> str:
    """A TOML float for ``value``: the shortest text that reads back as the same float."""
    if not math.isfinite(value):
        raise EditError(f"{value} is not a finite number")
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def _key(name: str) -> str:
    return name if _BARE.fullmatch(name) else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Lines:
    """A text as lines, each with its own line end (``\\r\\n``, ``\\n``, a lone ``\\r``, or none for the last),
    edited by line so that no other line end changes."""

    def __init__(self, text: str):
        parts = re.split(r"(\r\n|\r|\n)", text)
        self.bodies: list[str] = parts[0::2]
        self.ends: list[str] = [*parts[1::2], ""]

    def text(self) -> str:
        return "".join(b + e for b, e in zip(self.bodies, self.ends))

    def normal(self) -> str:
        """The text with every line end ``\\n`` (what tomllib and the scanner read)."""
        return "\n".join(self.bodies)

    def dominant(self) -> str:
        """The line end most lines have (``\\n`` for a text without one; on a tie, the last line's end)."""
        counts = Counter(e for e in self.ends if e)
        if not counts:
            return "\n"
        last = next(e for e in reversed(self.ends) if e)
        top = max(counts.values())
        return last if counts[last] == top else next(e for e in counts if counts[e] == top)

    def where(self, offset: int) -> tuple[int, int]:
        """(line, column) of an offset into :meth:`normal`."""
        line = 0
        while offset > len(self.bodies[line]):
            offset -= len(self.bodies[line]) + 1
            line += 1
        return line, offset

    def replace(self, start: int, end: int, value: str) -> None:
        line, a = self.where(start)
        body = self.bodies[line]
        self.bodies[line] = body[:a] + value + body[a + end - start:]

    def insert_after(self, line: int, body: str) -> None:
        """A new line after ``line``, ending as that line does (a last line without an end gets the file's
        usual end, and the new line, now last, none)."""
        end = self.ends[line]
        if not end:
            self.ends[line] = self.dominant()
        self.bodies.insert(line + 1, body)
        self.ends.insert(line + 1, end)

    def append(self, *bodies: str) -> None:
        """Lines at the end after a blank line (none at the start of an empty text), the file's usual line end
        after each; a text that ended without a line end still does."""
        eol = self.dominant()
        final = self.bodies[-1] == ""  # the text ended with a line end (or is empty)
        if final:
            self.bodies.pop()
            self.ends.pop()
        else:
            self.ends[-1] = eol
        if self.bodies and self.bodies[-1].strip():
            self.bodies.append("")  # an empty line ending "\n" after a lone "\r" would read as one "\r\n"
            self.ends.append("\r" if self.ends[-1] == "\r" else eol)
        for body in bodies:
            self.bodies.append(body)
            self.ends.append(eol)
        if final:
            self.bodies.append("")
            self.ends.append("")
        else:
            self.ends[-1] = ""


def set_params(text: str, values: dict[str, float]) -> str:
    """``text`` with ``[params]`` setting each of ``values`` (raises EditError when it cannot)."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    lines = _Lines(text[len(bom):])
    normal = lines.normal()
    try:
        before = tomllib.loads(normal)
    except tomllib.TOMLDecodeError as exc:
        raise EditError(f"steer.toml does not parse ({exc})") from None
    table = before.get("params", {})
    if not isinstance(table, dict):
        raise EditError("steer.toml's `params` is not a table")
    for name, value in values.items():
        _set_one(lines, name, number(value), name in table)
    try:
        after = tomllib.loads(lines.normal())
    except tomllib.TOMLDecodeError:
        after = None
    expected = dict(before, params={**table, **{k: float(v) for k, v in values.items()}})
    if after != expected:
        raise EditError("writing [params] here would change other values; edit steer.toml by hand")
    return bom + lines.text()


def _set_one(lines: _Lines, name: str, value: str, present: bool) -> None:
    spots = scan(lines.normal())
    whole = spots.get(("params",))
    if whole is not None and whole[0] != whole[1]:  # `params = {...}`: a key and its value, not a [params] header
        raise EditError("steer.toml sets its params as an inline table (`params = {...}`), which steerc does not "
                        "rewrite", span=whole[0], help="write them as a [params] table, one `NAME = VALUE` a line")
    if present:
        spot = spots.get(("params", name))
        if spot is None:  # set over several lines, or in a form the scanner does not read
            raise EditError(f"steer.toml sets params.{name} in a form steerc does not rewrite; write it as "
                            f"`{_key(name)} = ...` under [params]")
        lines.replace(*spot[1], value)
        return
    inside = [s for path, s in spots.items() if len(path) == 2 and path[0] == "params"]
    if whole is None and not inside:
        lines.append("[params]", f"{_key(name)} = {value}")
        return
    at = max((s[1][1] for s in inside), default=whole[0][1] if whole else 0)
    dotted = whole is None  # the table is made of `params.NAME = ...` keys before any table header
    lines.insert_after(lines.where(at)[0], f"{'params.' if dotted else ''}{_key(name)} = {value}")
