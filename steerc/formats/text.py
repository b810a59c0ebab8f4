"""What an importer writes into a program's text from a foreign file: comment text and string literals, made
safe (a foreign file is hostile input: its names and descriptions may hold newlines, control characters or a
closing quote).

>>> comment("two\\nlines\\tand a bell\\x07", 40)
'two lines and a bell\\\\x07'
>>> literal('a "quoted" name')
'"a \\\\"quoted\\\\" name"'
"""

from __future__ import annotations


def comment(text: str, limit: int = 200) -> str:
    """One line of comment text: line breaks and tabs as spaces, control characters escaped, at most ``limit``
    characters (the rest as ``...``)."""
    from steerc.core.text import shown

    text = shown(text.replace("\r\n", "\n").replace("\n", " ").replace("\t", " "))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def literal(s: str) -> str:
    """A Steer string literal of ``s``, escaped as ``steerc fmt`` writes it."""
    from steerc.frontend.fmt import string
    from steerc.ir.nodes import Str

    return string(Str(s))


__all__ = ["comment", "literal"]
