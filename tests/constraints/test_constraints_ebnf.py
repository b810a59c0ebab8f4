"""The EBNF checker: xgrammar's GBNF-style dialect, with exact offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from steerc.constraints import check_grammar
from steerc.constraints.ebnf import _xgrammar_problems

ARITH = Path(__file__).resolve().parent.parent / "fixtures" / "examples" / "grammars" / "arith.ebnf"

GOOD = [
    'root ::= "a"',
    'root ::= ()',
    'root ::= ""',
    'root ::= "a" | "b" "c"\n',
    'root ::= item ("," item)*\nitem ::= [a-z]+',
    'root ::= "x"{2} "y"{1,} "z"{0,3} "w"{1, 3} "v" {2}',
    'root ::=\n  "a"\n  | "b"   # a comment\n# another\n',
    'root ::= "\\x41\\u00e9\\U0001F600\\n\\t\\"\\\\"',
    'root ::= [^"\\\\\\n] [\\]\\-] [a-] [-a] [] [^]',
    'root ::= "a" (= "b")',
    'root ::= a-b.c_d\na-b.c_d ::= "x"',
    'root ::= x\nx ::= x "a" | "a"',
    'root::="a"',
    'root ::= "a"\r\nx ::= "b"\r\n',
    'root ::= TagDispatch(("<a>", a), ("<b>", b), loop_after_dispatch=false, excludes=("</x>",))\n'
    'a ::= "A"\nb ::= "B"',
    'root ::= Regex("[a-z]+", json_string=true)',
    'root ::= Substring("ab", "cd")',
]


@pytest.mark.parametrize("text", GOOD)
def test_accepted(text):
    assert check_grammar(text) == []


def test_example_file_passes_clean():
    assert check_grammar(ARITH.read_text()) == []


def first(text):
    problems = check_grammar(text)
    assert problems, text
    return problems[0]


@pytest.mark.parametrize(("text", "message", "offset", "end"), [
    ('root ::= "a" foo', "rule `foo` is not defined", 13, 16),
    ('root ::= "a"\nroot ::= "b"', "rule `root` is defined twice", 13, 17),
    ('rot ::= "a"', "the grammar has no `root` rule, where structured decoding starts", None, None),
    ("", "the grammar has no rules", None, None),
    ('root ::= "a" |', "expected an element (a string, a character class, a rule name or `(`) after `|`", 13, 14),
    ("root ::=", "expected an element (a string, a character class, a rule name or `(`) after `::=`", 5, 8),
    ('root ::= "a" | | "b"', "expected an element (a string, a character class, a rule name or `(`) after `|`", 13, 14),
    ('root ::= ( "a"', "`(` is never closed", 9, 10),
    ('root ::= ( "a"\nx ::= "b"', "`(` is never closed", 9, 10),
    ('root ::= "a" )', "unmatched `)`", 13, 14),
    ('root ::= "abc', "unterminated string literal", 9, 13),
    ('root ::= "a\nb"', "unterminated string literal", 9, 11),
    ('root ::= "\\q"', "invalid escape `\\q` in a string literal", 10, 12),
    ("root ::= [a-z", "unterminated character class", 9, 13),
    ("root ::= [a-z\n]", "character class is not closed on this line", 9, 13),
    ("root ::= [z-a]", "range `z-a` is out of order", 10, 13),
    ("root ::= [\\d]", "class escape `\\d` is not supported inside an EBNF character class", 10, 12),
    ('root ::= *"a"', "`*` has nothing to repeat", 9, 10),
    ('root ::= "a"**', "a quantifier cannot follow another quantifier", 13, 14),
    ('root ::= "a"{2}?', "a quantifier cannot follow another quantifier", 15, 16),
    ('root ::= "a"{3,2}', "repetition range `{3,2}` has its minimum above its maximum", 12, 17),
    ('root ::= "a"{,2}', "expected a number after `{`, found `,`", 13, 14),
    ('root ::= "a"{-1}', "expected a non-negative number after `{`, found `-1`", 13, 15),
    ('root ::= "a"{2', "expected `}` to close the repetition range", 14, 14),
    ('root := "a"', "expected `::=`", 5, 6),
    ('root ::= "a";', "unexpected character `;`", 12, 13),
    ("root ::= 'a'", "unexpected character `'`", 9, 10),
    ('root ::= "a"\n::= "b"', "`::=` must follow a rule name", 13, 16),
    ('root ::= "a" x ::= "b"', "the rule `x` must start on a new line", 13, 14),
    ('root ::= "a" (= "b") "c"', "a lookahead assertion `(= ...)` must end its rule", 21, 24),
    ('root ::= (= "b")', "a lookahead assertion `(= ...)` may only come at the very end of a rule", 9, 11),
    ('root ::= ("a" (= "b"))', "a lookahead assertion `(= ...)` may only come at the very end of a rule", 14, 16),
    ("root ::= 12", "expected an element (a string, a character class, a rule name or `(`), found `12`", 9, 11),
    ("root ::= true", "`true` is a reserved word and cannot name a rule", 9, 13),
    ('root[max_tokens=3] ::= "a"', "rule attributes like `[max_tokens=3]` are an xgrammar extension steerc does "
                                   "not accept", 4, 18),
    ("root ::= Token(1, 2)", "`Token(...)` matches tokenizer token ids, which depend on one model's vocabulary; "
                             "steerc accepts text-level grammars only", 9, 20),
    ("root ::= Regex", "`Regex` is a built-in macro and needs its arguments in `( )`", 9, 14),
    ('root ::= Regex("a(b")', "in `Regex`: `(` is never closed", 17, 18),
    ('root ::= Regex("x\\\\qy")', "in `Regex`: unknown escape `\\q`", 17, 20),
    ('root ::= TagDispatch(("<a>", a))', "rule `a` is not defined", 29, 30),
    ('root ::= TagDispatch(("", a))\na ::= "x"', "a `TagDispatch` tag must be a non-empty string", 22, 24),
    ('root ::= TagDispatch("<a>")', 'each `TagDispatch` entry must be a pair `("tag", rule)`', 21, 26),
    ('root ::= TagDispatch(("<a>", a), excludes=("<",))\na ::= "x"',
     "the exclude `<` is a prefix of a tag, so that tag could never fire", 43, 46),
    ('root ::= TagDispatch(("<a>", a), loop=true)\na ::= "x"',
     "`TagDispatch` has no argument `loop` (it takes: `loop_after_dispatch`, `excludes`)", 38, 42),
    ('root ::= Regex("a", flags="q")', "`Regex` flags may only use `i`, `s` and `u`, not `q`", 26, 29),
    ('root ::= Substring("a", 1)', "`Substring` arguments must be strings", 24, 25),
    ('root ::= Regex("a",)', "expected a string, number, boolean, rule name or tuple, found `)`", 19, 20),
    ('root ::= "é" foo', "rule `foo` is not defined", 13, 16),
])
def test_rejected_with_offsets(text, message, offset, end):
    problem = first(text)
    assert (problem.message, problem.offset, problem.end) == (message, offset, end)
    assert problem.severity == "error"


def test_did_you_mean_for_undefined_rules():
    problem = first('root ::= expresion\nexpression ::= "1"')
    assert problem.help == "did you mean `expression`?"


def test_missing_root_help():
    assert first('rot ::= "a"').help == "rename `rot` to `root`"
    assert first('start ::= "a"').help == "add a rule `root ::= ...`"


def test_all_undefined_references_are_reported():
    problems = check_grammar("root ::= a b\nc ::= d")
    assert [p.message for p in problems] == [
        "rule `a` is not defined", "rule `b` is not defined", "rule `d` is not defined"]


def test_deep_nesting_does_not_crash():
    problems = check_grammar("root ::= " + "(" * 300 + '"a"' + ")" * 300)
    assert problems and "nested" in problems[0].message


def test_xgrammar_line_and_byte_column_become_a_character_offset():
    pytest.importorskip("xgrammar")
    text = 'root ::= "a"\n# é\nx ::= "é" y'
    (problem,) = _xgrammar_problems(text)
    assert 'Rule "y" is not defined' in problem.message
    assert problem.offset == text.rindex("y")


def test_use_xgrammar_on_the_example():
    assert check_grammar(ARITH.read_text(), use_xgrammar=True) == []


def test_lexer_problems_before_a_fatal_one_are_kept():
    problems = check_grammar('root ::= "\\q" "abc')
    assert [p.message for p in problems] == ["invalid escape `\\q` in a string literal", "unterminated string literal"]
