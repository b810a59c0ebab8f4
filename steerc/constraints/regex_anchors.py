"""Where ``^`` and ``$`` may stand in a constraint regex.

Structured decoding matches the whole output against the pattern, so ``^``
can only mean something where nothing has been matched yet, and ``$`` where
nothing more will be; xgrammar silently ignores anchors anywhere else, which
changes what the pattern means. The tree comes from :mod:`.regex`'s parser:
an alternation is a list of sequences; a sequence a list of items
``("atom",)``, ``("anchor", char, offset)``, ``("group", alternation)`` or
``("repeat", item, max_or_None)``.

>>> [p.offset for p in check_anchors([[("atom",), ("anchor", "^", 1)]])]
[1]
>>> check_anchors([[("anchor", "^", 0), ("group", [[("atom",)], [("anchor", "^", 3)]])]])
[]
"""

from __future__ import annotations

from steerc.constraints import INVALID, Problem


def check_anchors(tree: list) -> list[Problem]:
    """Problems for each ``^`` not at the start and ``$`` not at the end of the pattern.

    >>> check_anchors([[("atom",), ("anchor", "$", 1)]])
    []
    """
    problems: list[Problem] = []
    _branches(tree, True, True, problems)
    return problems


def _branches(branches: list, at_start: bool, at_end: bool, problems: list[Problem]) -> None:
    """Report ``^`` not at the start and ``$`` not at the end of the whole pattern."""
    for seq in branches:
        for index, item in enumerate(seq):
            first = at_start and all(x[0] == "anchor" for x in seq[:index])
            last = at_end and all(x[0] == "anchor" for x in seq[index + 1:])
            _item(item, first, last, problems)


def _item(item: tuple, first: bool, last: bool, problems: list[Problem]) -> None:
    kind = item[0]
    if kind == "anchor":
        ok = first if item[1] == "^" else last
        if not ok:
            where = "start" if item[1] == "^" else "end"
            problems.append(Problem(
                INVALID, f"`{item[1]}` away from the {where} of the pattern cannot be enforced by "
                         "structured decoding", item[2], item[2] + 1,
                help=f"the whole output must match, so `{item[1]}` only means something at the {where}; "
                     f"write `\\{item[1]}` for a literal `{item[1]}`"))
    elif kind == "group":
        _branches(item[1], first, last, problems)
    elif kind == "repeat":
        once = item[2] == 1
        _item(item[1], first and once, last and once, problems)
