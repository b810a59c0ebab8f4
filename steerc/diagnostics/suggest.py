"""Help lines that name what was meant: the closest candidate to a misspelt name, and a list of choices.

>>> did_you_mean("resid_psot", ["resid_pre", "resid_post"])
'did you mean `resid_post`?'
>>> one_of(["a", "b", "c"])
'`a`, `b` or `c`'
"""

from __future__ import annotations

from steerc.core.limits import MAX_NAME_CHARS, MAX_SUGGESTION_CANDIDATES


def did_you_mean(name: str, candidates) -> str | None:
    """A ``help`` line suggesting the closest candidate, if one is close.

    Among more than MAX_SUGGESTION_CANDIDATES candidates only those of about the same
    length and the same first letter are compared (each comparison costs time in both
    lengths, and a program may ask for thousands of suggestions).
    """
    import difflib  # on a misspelling only: a clean check never needs it

    pool = list(candidates)
    if len(pool) > MAX_SUGGESTION_CANDIDATES or len(name) > MAX_NAME_CHARS:
        if len(name) > MAX_NAME_CHARS:
            return None
        pool = [c for c in pool if c[:1] == name[:1] and abs(len(c) - len(name)) <= 2][:MAX_SUGGESTION_CANDIDATES]
    match = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f"did you mean `{match[0]}`?" if match else None


def one_of(options) -> str:
    items = [f"`{o}`" for o in options]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
