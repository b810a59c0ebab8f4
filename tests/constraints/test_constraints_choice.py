"""`constrain choice [...]`."""

from __future__ import annotations

from steerc.constraints import check_choice


def test_good():
    assert check_choice(["yes", "no", "maybe"]) == []
    assert check_choice(["a"]) == []


def test_empty_list():
    (problem,) = check_choice([])
    assert problem.message == "`choice` needs at least one option"
    assert problem.offset is None and problem.severity == "error"


def test_empty_string_and_duplicates_name_the_index():
    problems = check_choice(["yes", "", "no", "yes", "no"])
    assert [p.message for p in problems] == [
        "option at index 1 is an empty string",
        'option at index 3 (`"yes"`) repeats the option at index 0',
        'option at index 4 (`"no"`) repeats the option at index 2',
    ]
    assert all(p.code == "invalid-constraint" for p in problems)


def test_non_strings_do_not_crash():
    assert check_choice(["a", 3])[0].message == "option at index 1 is not a string"
    assert check_choice(None)[0].message == "`choice` needs a list of strings"
