"""Text shown on a terminal or a page: characters that act instead of print (ESC, BEL, BS, bidi overrides, line
separators) written as escapes, so that a user's file can neither move the cursor, retitle the window, clear the
screen nor reorder what is shown. One rule for diagnostics' source lines and ``explain --tokens``.

>>> shown("ok \\x1b]0;pwned\\x07 \\u202e")
'ok \\\\x1b]0;pwned\\\\x07 \\\\u202e'
>>> shown_with_offsets("a\\x1bb")
('a\\\\x1bb', [0, 1, 5, 6])
"""

from __future__ import annotations

import unicodedata

# Control, format, surrogate, private-use and unassigned characters, and the line and paragraph separators.
HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escape(c: str) -> str:
    """One character as it is shown: itself, or its escape."""
    if c in NAMED:
        return NAMED[c]
    if c == " " or unicodedata.category(c) not in HIDDEN:
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"


def shown(text: str) -> str:
    """``text`` with every hidden character escaped (quick when there is none)."""
    if text.isprintable():
        return text
    return "".join(escape(c) for c in text)


def shown_with_offsets(text: str) -> tuple[str, list[int]]:
    """(``shown(text)``, where each character of ``text`` starts in it, and its end): for carets under a line."""
    out, at = [], [0]
    for c in text:
        out.append(escape(c))
        at.append(at[-1] + len(out[-1]))
    return "".join(out), at
