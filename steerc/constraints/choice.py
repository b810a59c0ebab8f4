"""``constrain choice [...]``: the option list must be usable as-is.

>>> check_choice(["a", "b"])
[]
"""

from __future__ import annotations

from steerc.constraints import INVALID, Problem


def check_choice(options: list[str]) -> list[Problem]:
    """Check a choice list: non-empty, only non-empty strings, no duplicates.

    Offsets are ``None`` (the list has no text of its own); messages name
    the 0-based index of the offending option.

    >>> check_choice([])[0].message
    '`choice` needs at least one option'
    >>> [p.message for p in check_choice(["a", "", "a"])]
    ['option at index 1 is an empty string', 'option at index 2 (`"a"`) repeats the option at index 0']
    """
    try:
        items = list(options)
    except TypeError:
        return [Problem(INVALID, "`choice` needs a list of strings", None)]
    if not items:
        return [Problem(INVALID, "`choice` needs at least one option", None,
                        help='write at least one option, e.g. `["yes", "no"]`')]
    problems: list[Problem] = []
    first_index: dict[str, int] = {}
    for index, option in enumerate(items):
        problems.extend(_check_option(index, option, first_index))
    return problems


def _check_option(index: int, option: object, first_index: dict[str, int]) -> list[Problem]:
    """Problems with one option; records it in ``first_index``."""
    if not isinstance(option, str):
        return [Problem(INVALID, f"option at index {index} is not a string", None)]
    if option == "":
        return [Problem(INVALID, f"option at index {index} is an empty string", None,
                        help="an empty option would let the model answer nothing; remove it")]
    if option in first_index:
        shown = '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return [Problem(INVALID, f"option at index {index} (`{shown}`) repeats the option at "
                                 f"index {first_index[option]}", None, help="remove the duplicate")]
    first_index[option] = index
    return []
