"""What a line of a block needs, for syntax errors in the middle of one.

When the parser stops inside a line such as ``clamp joy 3.0``, the useful
message names what that line's keyword takes (here: ``to`` before the
value) and shows the line corrected, rather than the parser's raw list of
acceptable tokens.

>>> from lark import Token
>>> text = "intervention x {\\n  at resid_post[1]\\n  clamp joy 3.0\\n}\\n"
>>> tok = Token("NUMBER", "3.0", start_pos=text.index("3.0"))
>>> block_line_help(text, text.index("{") + 1, tok, {"TO", "STAR"}, None)
('`clamp` needs `to` before the value it pins the component to', 'write `clamp joy to 3.0`')
"""

from __future__ import annotations

import re

LINE_KEYWORDS = ("at", "tokens", "when", "preserve", "add", "scale", "set", "suppress", "ablate", "clamp",
                 "rotate", "loreft", "read", "pool")
_OPERAND = {"NAME", "NUMBER", "INT", "SIGNED_INT", "PERCENT", "LSQB", "LPAR", "STRING", "LONG_STRING"}
_SCOPE_WORDS = {"all", "prompt", "generated", "after"}
_NUMBERS = {"NUMBER", "INT", "SIGNED_INT", "PERCENT"}


def logical_line_start(text: str, block_start: int, stop: int) -> int:
    """Offset where the block line holding ``stop`` begins (new lines inside ( ) and [ ] do not count).

    >>> t = "{\\n  add [1.0,\\n  2.0] joy\\n"
    >>> t[logical_line_start(t, 1, t.index("joy")):].split()[0]
    'add'
    """
    depth, start, i = 0, block_start, block_start
    while i < stop:
        ch = text[i]
        if ch == '"':
            end = text.find('"', i + 1)
            i = stop if end < 0 else end + 1
            continue
        if ch == "#":
            end = text.find("\n", i)
            i = stop if end < 0 else end
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(depth - 1, 0)
        elif ch == "\n" and depth == 0:
            start = i + 1
        i += 1
    return start


def _flat(s: str) -> str:
    return " ".join(s.split())


def _code(s: str, limit: int = 60) -> str:
    s = _flat(s)
    return f"`{s}`" if len(s) <= limit else f"`…{s[-(limit - 1):]}`"


def block_line_help(text: str, block_start: int, tok, expected: set[str], previous) -> tuple[str, str] | None:
    """(what the line needs, a help line) for an unexpected ``tok`` inside a block line, or None.

    ``expected`` is the parser's set of acceptable terminals; ``previous`` the
    token before ``tok`` (or None).
    """
    at = tok.start_pos
    if at is None:
        return None
    start = logical_line_start(text, block_start, at)
    line = text[start:at].strip()
    if not line:
        return None
    keyword = line.split()[0]
    end = text.find("\n", at)
    rest = text[at: end if end >= 0 else len(text)].split("#", 1)[0].strip()
    value = str(tok.value)
    if value in LINE_KEYWORDS and keyword in LINE_KEYWORDS:
        return (f"expected a new line (`{value}` starts a line of its own)",
                f"each line of a block goes on its own line: put `{value} ...` on the next line")
    words = line.split()
    if keyword == "clamp" and "TO" in expected and "to" not in words and "feature" in words[1:2]:
        return ("`clamp feature s[i]` needs `to` before the activation it sets the feature to",
                f"write {_code(f'{line} to {rest}')}")
    if keyword == "clamp" and "TO" in expected and "to" not in words:
        return ("`clamp` needs `to` before the value it pins the component to",
                f"write {_code(f'{line} to {rest}')}")
    if keyword == "rotate" and expected & {"TO", "BY"} and not {"to", "by"} & set(words):
        return ("`rotate in (b1, b2)` continues with `to` (the angle to set) or `by` (the angle to turn by)",
                f"for example {_code(f'{line} by {rest}')}")
    if keyword == "loreft" and "COMMA" in expected and line.count(",") < 2:
        parts = [w for w in re.split(r"[\s,]+", f"{line} {rest}")[1:] if w]
        return ("`loreft` takes three operands separated by commas: the matrices R and W, then the vector b",
                f"write {_code('loreft ' + ', '.join(parts))}" if len(parts) == 3 else "write `loreft R, W, b`")
    if not expected & {"_NL", "RBRACE"}:
        return None
    return _after_complete_line(keyword, line, rest, tok, previous)


def _after_complete_line(keyword: str, line: str, rest: str, tok, previous) -> tuple[str, str]:
    """The line was complete before ``tok``: say what the keyword takes."""
    operand = tok.type in _OPERAND
    if keyword in ("add", "scale", "set", "clamp", "rotate") and operand:
        what = f"`{keyword}` takes one expression" if keyword in ("add", "scale", "set") else \
            f"`{keyword}` takes one expression after `{'to' if ' to ' in f' {line} ' else 'by'}`"
        if previous is not None and previous.type in _NUMBERS:
            return what, f"to multiply, write {_code(f'{line} * {rest}')}"
        return what, f"join the terms with an operator (`+`, `-`, `*`, `/`), e.g. {_code(f'{line} + {rest}')}"
    if keyword == "ablate" and operand:
        return "`ablate` separates its directions with commas", f"write {_code(f'{line}, {rest}')}"
    if keyword == "loreft" and operand:
        return ("`loreft` takes three operands: `loreft R, W, b`",
                "R and W are matrices, b a vector; to scale b write `loreft R, W, 2 * b`")
    if keyword == "tokens" and (operand or str(tok.value) in _SCOPE_WORDS):
        return "`tokens` separates its scopes with commas", f"write {_code(f'{line}, {rest}')}"
    if keyword == "at":
        m = re.match(r"at\s+(\w+)", line)
        kind = m.group(1) if m else "resid_post"
        example = f"`{kind}[1, 3]` or `{kind}[2:6]`" if kind != "head" else "`head[(1, 3), 0:2]`"
        return ("`at` takes one site",
                f"select several layers inside one site's brackets ({example}); "
                "a site of another kind needs an intervention of its own")
    if keyword == "suppress":
        return ("`suppress` takes no operand",
                "`suppress` sets the site to zero; to remove directions write `ablate v`, to shrink `scale 0.5`")
    if keyword == "preserve":
        return "`preserve norm` takes nothing more", "write `preserve norm` alone on its line"
    if keyword == "when":
        return ("a gate is comparisons joined by `and`, `or` and `not`",
                "for example `when p > 0.5 and not q > 0.2`")
    if keyword in ("read", "pool"):
        return f"`{keyword}` takes one {'readout' if keyword == 'read' else 'pool'}", \
            "each line of a block goes on its own line"
    return "expected the end of the line", "each line of a block goes on its own line"
