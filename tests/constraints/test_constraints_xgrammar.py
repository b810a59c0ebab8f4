"""Differential tests: our checkers against xgrammar itself (skipped when xgrammar is absent).

On a corpus of valid and invalid regexes and grammars, our verdict (any error
or none) must match whether ``xgrammar.Grammar.from_regex`` /
``Grammar.from_ebnf`` accepts. The deliberate disagreements are listed in
``REGEX_STRICTER`` and ``GRAMMAR_STRICTER``: in every one of them we reject
what xgrammar accepts, because xgrammar would silently reinterpret the text
(or only fail later, when the grammar is compiled for a tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steerc.constraints import check_grammar, check_json_schema, check_regex, errors
from steerc.constraints.schema import XGRAMMAR_SUPPORT

xgr = pytest.importorskip("xgrammar")


def xgrammar_accepts(build, text) -> bool:
    try:
        build(text)
    except Exception:  # noqa: BLE001
        return False
    return True


REGEX_AGREE = [
    # accepted by both
    "", "abc", r"\d{3}-\d{4}", r"^(yes|no)$", "[A-Za-z_][A-Za-z0-9_]*", "(?:ab)+?", "a{2,5}", "[^]",
    "(?<year>[0-9]{4})", r"\u00e9", r"\x41", r"\cA", r"\u{1F600}", "a|", "()", "[-a]", "[a-]", r"[\d-z]",
    r"[\]]", "]", "}", r"^\s*$", "x*?y+?z??", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", "(^a|^b)", r"\.\*\(\)",
    # rejected by both
    "a(b", "a)b", "*a", "a**", "[z-a]", "a{3,1}", "[abc", "a\\", r"\1", "(?=a)", "(?!a)", "(?<=a)b",
    "(?i)a", "(?P<n>a)", "a{,3}", "[]", r"\b", r"\p{L}", "a{1,2}{3}", "^*", "(*)", "a|*", r"[a-\d]",
    r"\k<n>", "{", "a{1,2", r"\u12", "(?<n1>a)", "a{99999999999999999}",
]
REGEX_STRICTER = {
    r"\q": "unknown letter escape: xgrammar warns and matches `q`",
    "a^b": "`^` mid-pattern: xgrammar ignores the anchor",
    "a$b": "`$` mid-pattern: xgrammar ignores the anchor",
    r"\uZZZZ": "malformed \\u: xgrammar matches `uZZZZ`",
    r"\x4g": "one hex digit after \\x: ambiguous, we ask for exactly two",
    "(?<>a)": "empty group name",
}


@pytest.mark.parametrize("pattern", REGEX_AGREE)
def test_regex_verdicts_agree(pattern):
    ours = not errors(check_regex(pattern))
    assert ours == xgrammar_accepts(xgr.Grammar.from_regex, pattern)


@pytest.mark.parametrize("pattern", sorted(REGEX_STRICTER))
def test_regex_deliberately_stricter(pattern):
    assert errors(check_regex(pattern))
    assert xgrammar_accepts(xgr.Grammar.from_regex, pattern)


GRAMMAR_AGREE = [
    # accepted by both
    (Path(__file__).resolve().parent.parent / "fixtures" / "examples" / "grammars" / "arith.ebnf").read_text(),
    'root ::= "a"', "root ::= ()", 'root ::= ""', 'root ::= "a" | "b" "c"',
    'root ::= item ("," item)*\nitem ::= [a-z]+', 'root ::= "x"{2} "y"{1,} "z"{0,3} "w"{1, 3}',
    'root ::=\n  "a"\n  | "b"   # comment\n', 'root ::= "\\x41\\u00e9\\U0001F600\\n"', 'root ::= [^"\\\\\\n] [] [^]',
    'root ::= "a" (= "b")', 'root ::= a-b.c\na-b.c ::= "x"', 'root ::= x\nx ::= x "a" | "a"', 'root::="a"',
    'root ::= "a"\r\nx ::= "b"', 'root ::= TagDispatch(("<a>", a))\na ::= "A"', 'root ::= Regex("[a-z]+")',
    'root ::= Substring("ab", "cd")', 'root ::= Regex("(?i)abc")',
    # rejected by both
    'root ::= foo', 'root ::= "a"\nroot ::= "b"', 'rot ::= "a"', "", 'root ::= "a" |', "root ::=",
    'root ::= ( "a"', 'root ::= "a" )', 'root ::= "abc', 'root ::= "\\q"', "root ::= [a-z", "root ::= [z-a]",
    "root ::= [\\d]", 'root ::= *"a"', 'root ::= "a"**', 'root ::= "a"{3,2}', 'root ::= "a"{,2}',
    'root ::= "a"{-1}', 'root := "a"', 'root ::= "a";', "root ::= 'a'", 'root ::= "a"\n::= "b"',
    'root ::= "a" x ::= "b"', 'root ::= "a" (= "b") "c"', 'root ::= (= "b")', "root ::= 12", "root ::= true",
    "root ::= Regex", 'root ::= TagDispatch(("<a>", a))', 'root ::= TagDispatch(("", a))\na ::= "x"',
    'root ::= Regex("a", flags="q")', 'root ::= Substring("a", 1)',
]
GRAMMAR_STRICTER = {
    'root[max_tokens=3] ::= "a"': "rule attributes: xgrammar runtime controls, not accepted by steerc",
    "root ::= Token(1, 2)": "token-id macros depend on one tokenizer's vocabulary",
    "root ::= ExcludeToken(1)": "token-id macros depend on one tokenizer's vocabulary",
    'root ::= TokenTagDispatch((1, a))\na ::= "x"': "token-id macros depend on one tokenizer's vocabulary",
    'root ::= Regex("a(b")': "xgrammar only parses the pattern later, when compiling for a tokenizer",
    'root ::= Regex("a^b")': "Regex patterns are checked like `constrain regex`",
    "root ::= " + "(" * 80 + '"a"' + ")" * 80: "we stop at 64 nested groups; xgrammar at 1000",
}


@pytest.mark.parametrize("text", GRAMMAR_AGREE)
def test_grammar_verdicts_agree(text):
    ours = not errors(check_grammar(text))
    assert ours == xgrammar_accepts(xgr.Grammar.from_ebnf, text)


@pytest.mark.parametrize("text", sorted(GRAMMAR_STRICTER))
def test_grammar_deliberately_stricter(text):
    assert errors(check_grammar(text))
    assert xgrammar_accepts(xgr.Grammar.from_ebnf, text)


def test_corpus_size():
    assert len(REGEX_AGREE) + len(REGEX_STRICTER) >= 40
    assert len(GRAMMAR_AGREE) + len(GRAMMAR_STRICTER) >= 40


# ---------------------------------------------------------------- schema table
# Re-run the experiments behind XGRAMMAR_SUPPORT: (keyword, schema, an instance
# the keyword must reject, an instance it must accept).
S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}  # noqa: E741  (the schema table reads as types)
AI = {"type": "array", "items": I}
O = {"type": "object", "properties": {"a": I, "b": S}}  # noqa: E741
WITNESSES = [
    ("type", S, 1, "x"),
    ("const", {"const": "x"}, "y", "x"),
    ("enum", {"enum": ["x", 1]}, "y", 1),
    ("minimum", dict(I, minimum=1), 0, 1),
    ("maximum", dict(N, maximum=10), 10.5, 10),
    ("exclusiveMinimum", dict(I, exclusiveMinimum=1), 1, 2),
    ("exclusiveMaximum", dict(N, exclusiveMaximum=10), 10, 9.5),
    ("minLength", dict(S, minLength=2), "a", "ab"),
    ("maxLength", dict(S, maxLength=2), "abc", "ab"),
    ("items", {"type": "array", "items": I}, ["x"], [1]),
    ("prefixItems", {"type": "array", "prefixItems": [S]}, [1], ["x"]),
    ("unevaluatedItems", {"type": "array", "prefixItems": [S], "unevaluatedItems": I}, ["x", "y"], ["x", 1]),
    ("minItems", dict(AI, minItems=2), [1], [1, 2]),
    ("maxItems", dict(AI, maxItems=1), [1, 2], [1]),
    ("properties", {"type": "object", "properties": {"a": I}}, {"a": "x"}, {"a": 1}),
    ("required", dict(O, required=["a"]), {"b": "x"}, {"a": 1}),
    ("additionalProperties", {"type": "object", "properties": {"a": I}, "additionalProperties": I},
     {"a": 1, "z": "x"}, {"a": 1, "z": 2}),
    ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, {"A1": 1}, {"ab": 1}),
    ("minProperties", {"type": "object", "additionalProperties": I, "minProperties": 1}, {}, {"a": 1}),
    ("maxProperties", {"type": "object", "additionalProperties": I, "maxProperties": 1}, {"a": 1, "b": 2}, {"a": 1}),
    ("unevaluatedProperties", {"type": "object", "properties": {"a": I}, "unevaluatedProperties": S},
     {"a": 1, "z": 2}, {"a": 1, "z": "x"}),
    ("anyOf", {"anyOf": [S, I]}, True, 1),
    ("$ref", {"$ref": "#/$defs/x", "$defs": {"x": S}}, 1, "x"),
    ("uniqueItems", dict(AI, uniqueItems=True), [1, 1], [1, 2]),
    ("contains", dict(AI, contains={"const": 1}), [2], [1, 2]),
    ("minContains", dict(AI, contains={"const": 1}, minContains=2), [1, 2], [1, 1]),
    ("maxContains", dict(AI, contains={"const": 1}, maxContains=1), [1, 1], [1, 2]),
    ("dependentRequired", dict(O, dependentRequired={"a": ["b"]}), {"a": 1}, {"a": 1, "b": "x"}),
    ("dependentSchemas", dict(O, dependentSchemas={"a": {"required": ["b"]}}), {"a": 1}, {"a": 1, "b": "x"}),
    ("not", dict(S, **{"not": {"const": "x"}}), "x", "y"),
    ("if", dict(S, **{"if": {"maxLength": 2}, "then": {"const": "a"}}), "b", "a"),
    ("then", dict(S, **{"if": {"maxLength": 2}, "then": {"const": "a"}}), "b", "a"),
    ("else", dict(S, **{"if": {"maxLength": 2}, "else": {"const": "abc"}}), "abcd", "abc"),
    ("$dynamicRef", {"$dynamicRef": "#/$defs/x", "$defs": {"x": S}}, 1, "x"),
]


@pytest.mark.parametrize(("keyword", "schema", "bad", "good"), WITNESSES, ids=[w[0] for w in WITNESSES])
def test_support_table_matches_xgrammar(keyword, schema, bad, good):
    testing = pytest.importorskip("xgrammar.testing")
    accepts = getattr(testing, "_is_grammar_accept_string", None)
    if accepts is None:
        pytest.skip("this xgrammar has no string matcher for tests")
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema))
    status = XGRAMMAR_SUPPORT[keyword][0]
    assert accepts(grammar, json.dumps(good))
    assert accepts(grammar, json.dumps(bad)) == (status == "ignored"), (keyword, status)
    warned = [p for p in check_json_schema(json.dumps(schema))[1] if p.severity == "warning"]
    assert bool(warned) == (status == "ignored")
