"""Text into generated Python, safely: the only ways the HF emitter writes a value or a text into source.

Every string the emitter does not write itself (file names, vector keys, names, op source text, facts
read from a file, the command line) reaches ``__init__.py`` through one of these, whatever it holds:

* :func:`literal`: a Python literal of a value (None, bool, int, float, str, tuple, list, dict of
  those), printable ASCII only: strings as ``ascii()`` writes them (every quote, backslash, line
  break, control, surrogate and non-ASCII character escaped), infinities as ``1e999``;
* :func:`comment`: one ``#`` comment line, every character outside printable ASCII escaped the same
  way (``\\n``, ``\\r``, ``\\x00``, ``\\u2028``, ``\\ud800``) and a backslash doubled, so no text can end
  the comment line;
* :func:`docstring`: a triple-quoted string whose line breaks are the emitter's own (one per line it is
  given); inside each line the same escapes plus ``\\"``.

The generated file is printable ASCII plus line breaks, so it is the same bytes in any encoding and
every value reads back (``ast.literal_eval``) as the value written.

>>> print(literal(("it's", "x" + chr(34) * 3, None, 2, -0.5, float("inf"))))
("it's", 'x\"\"\"', None, 2, -0.5, 1e999)
>>> print(comment("key" + chr(10) + "import os" + chr(0x2028)))
# key\\nimport os\\u2028
>>> import ast
>>> value = {chr(0xD800): [chr(0x2028), 1e-300, ("x",)]}
>>> ast.literal_eval(literal(value)) == value
True
"""

from __future__ import annotations

import math
import numbers


def literal(value) -> str:
    """``value`` as a Python literal in printable ASCII; raises TypeError for any other kind of value."""
    if value is None or value is True or value is False:
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            raise ValueError("NaN has no Python literal")
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return repr(value)
    if isinstance(value, str):
        return ascii(str(value))
    if isinstance(value, tuple):
        items = [literal(v) for v in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for a {type(value).__name__}")


def _escape(text: str, quote: bool = False) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif quote and ch == '"':
            out.append('\\"')
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def comment(text: str) -> str:
    """A single comment line (``# ...``) that says ``text``."""
    return "# " + _escape(str(text))


def docstring(lines: list[str], indent: str = "") -> str:
    """A triple-quoted string of ``lines``, one source line each (indented by ``indent`` after the first)."""
    escaped = [_escape(str(line), quote=True) for line in lines]
    body = escaped[:1] + [indent + line if line else "" for line in escaped[1:]]
    return '"""' + "\n".join(body) + '"""'


def identifier(name: str) -> str:
    """``name`` if it is an ASCII Python identifier (the emitter's own names); anything else is a bug."""
    if not (name.isascii() and name.isidentifier()):
        raise ValueError(f"not an identifier: {name!r}")
    return name
