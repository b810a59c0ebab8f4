"""The regex checker: the supported dialect, and exact offsets for what it rejects."""

from __future__ import annotations

import pytest

from steerc.constraints import check_regex
from steerc.constraints.regex import _xgrammar_problems

GOOD = [
    "", "abc", r"\d{3}-\d{4}", r"[A-Za-z_][A-Za-z0-9_]*", r"^(yes|no)$", r"(?:ab)+?", r"a{2}", r"a{2,}",
    r"a{2,5}?", r"[^\]\\]", r"\.\*\+\?\(\)\[\]\{\}\|\/\^\$", r"\u00e9\u{1F600}\x41\UFFFFFFFF"[:-10], r"\t\n\r\f\v\0",
    r"[\d\s\w-]", r"[\d-z]", r"[-a]", r"[a-]", "[^]", "(?<year>[0-9]{4})", r"\cA", "a|", "|b", "()", "(a|)",
    r"\\", "]", "}", r"[\]]", r"[\b]", "(^a|^b)c", "a(b$|c$)", r"^\s*$", "x*?y+?z??",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
]


@pytest.mark.parametrize("pattern", GOOD)
def test_accepted(pattern):
    assert check_regex(pattern) == []


@pytest.mark.parametrize(("pattern", "message", "offset", "end"), [
    ("ab(c", "`(` is never closed", 2, 3),
    ("(a(b)", "`(` is never closed", 0, 1),
    ("ab)c", "unmatched `)`", 2, 3),
    ("*a", "nothing to repeat: `*` needs something before it", 0, 1),
    ("a|+b", "nothing to repeat: `+` needs something before it", 2, 3),
    ("(?b", None, None, None),
    ("^*", "nothing to repeat: `^` is an anchor, so `*` needs something before it", 1, 2),
    ("a**", "a quantifier cannot follow another quantifier", 2, 3),
    ("a{2}{3}", "a quantifier cannot follow another quantifier", 4, 5),
    ("x{2,3}?+", "a quantifier cannot follow another quantifier", 7, 8),
    ("[z-a]", "range `z-a` is out of order", 1, 4),
    ("x[a-c9-0]", "range `9-0` is out of order", 5, 8),
    ("a{3,1}", "repetition range `{3,1}` has its minimum above its maximum", 1, 6),
    ("a{,3}", "`{` must start a repetition count like `{2}`, `{2,}` or `{2,5}`", 1, 2),
    ("a{x}", "`{` must start a repetition count like `{2}`, `{2,}` or `{2,5}`", 1, 2),
    ("[abc", "unterminated character class: `[` is never closed", 0, 4),
    ("ab\\", "dangling backslash at the end of the pattern", 2, 3),
    ("[]", "empty character class `[]` can never match", 0, 2),
    (r"[a-\d]", "a range cannot end at a class escape like `\\d`", 1, 5),
    (r"(a)\1", "backreference `\\1` is not supported: structured decoding cannot enforce it", 3, 5),
    (r"(?<n>a)\k<n>", "backreference `\\k<n>` is not supported: structured decoding cannot enforce it", 7, 12),
    ("a(?=b)", "lookahead `(?=` is not supported: structured decoding cannot enforce it", 1, 4),
    ("a(?!b)", "lookahead `(?!` is not supported: structured decoding cannot enforce it", 1, 4),
    ("(?<=a)b", "lookbehind `(?<=` is not supported: structured decoding cannot enforce it", 0, 4),
    ("(?<!a)b", "lookbehind `(?<!` is not supported: structured decoding cannot enforce it", 0, 4),
    ("(?P<n>a)", "Python-style named group `(?P<n>` is not supported", 0, 6),
    ("(?<n1>a)", "group name `n1` must be made of ASCII letters only", 0, 6),
    ("(?i)abc", "inline flags `(?i)` are not supported: structured decoding cannot apply them", 0, 3),
    ("(?i:a)", "inline flags `(?i:` are not supported: structured decoding cannot apply them", 0, 4),
    (r"\bword", "word boundary `\\b` is not supported: structured decoding cannot enforce it", 0, 2),
    (r"\p{L}+", "Unicode property escape `\\p{L}` is not supported: structured decoding cannot enforce it", 0, 5),
    (r"a\q", "unknown escape `\\q`", 1, 3),
    (r"\uZZ", "`\\u` must be followed by four hex digits (`\\u00e9`) or `{...}`", 0, 2),
    (r"\x4", "`\\x` must be followed by exactly two hex digits (use `\\u` for more)", 0, 2),
    ("a^b", "`^` away from the start of the pattern cannot be enforced by structured decoding", 1, 2),
    ("a$b", "`$` away from the end of the pattern cannot be enforced by structured decoding", 1, 2),
    ("(?:^a)+", "`^` away from the start of the pattern cannot be enforced by structured decoding", 3, 4),
])
def test_rejected_with_offsets(pattern, message, offset, end):
    problems = check_regex(pattern)
    assert problems, pattern
    if message is None:
        return
    first = problems[0]
    assert (first.message, first.offset, first.end) == (message, offset, end)
    assert first.code == "invalid-constraint" and first.severity == "error"


def test_several_recoverable_problems_are_all_reported():
    problems = check_regex(r"[z-a](?=x)\q")
    assert [p.offset for p in problems] == [1, 5, 10]


def test_helps():
    assert check_regex("a{3,1}")[0].help == "write `{1,3}`"
    assert check_regex("[z-a]")[0].help == "put the lower character first: `a-z`"
    assert check_regex(r"\A")[0].help == "use `^`"
    assert check_regex("*")[0].help == "write `\\*` to match a literal `*`"


def test_deep_groups_do_not_crash():
    problems = check_regex("(" * 500 + ")" * 500)
    assert problems and "nested" in problems[0].message


def test_xgrammar_position_is_converted_to_an_offset():
    pytest.importorskip("xgrammar")
    (problem,) = _xgrammar_problems("a(b")
    assert problem.offset == 3  # "position 4" is 1-based, at the end
    assert "The parenthesis is not closed" in problem.message
    assert _xgrammar_problems("abc") == []


def test_use_xgrammar_adds_nothing_to_a_clean_pattern():
    assert check_regex(r"^\d+$", use_xgrammar=True) == []
