"""The positional JSON parser: values, offsets, and exact syntax errors."""

from __future__ import annotations

import json

import pytest

from steerc.constraints.jsonpos import char_offsets, parse_json, pointer


def only_problem(text):
    doc, problems = parse_json(text)
    assert len(problems) == 1, problems
    return doc, problems[0]


def test_values_and_spans():
    text = '{"properties": {"a": {"type": "string"}}, "n": [1, -2.5e3, null]}'
    doc, problems = parse_json(text)
    assert problems == []
    assert doc.value == json.loads(text)
    start, end = doc.values["/properties/a/type"]
    assert text[start:end] == '"string"'
    start, end = doc.keys["/properties/a"]
    assert text[start:end] == '"a"'
    assert text[slice(*doc.values["/n/1"])] == "-2.5e3"
    assert doc.values[""] == (0, len(text))


def test_pointer_escaping():
    doc, _ = parse_json('{"a/b": {"~c": 1}}')
    assert "/a~1b/~0c" in doc.values
    assert pointer("", "a/b~") == "/a~1b~0"


def test_int_and_float_kept_apart():
    doc, _ = parse_json("[1, 1.0, 1e2]")
    assert [type(v) for v in doc.value] == [int, float, float]


def test_string_escapes_and_surrogates():
    doc, problems = parse_json(r'"\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"')
    assert problems == []
    assert doc.value == '"\\/\b\f\n\r\t\u00e9\U0001F600'


@pytest.mark.parametrize(("text", "message", "offset"), [
    ('{"type": "object", "properties": {"a": {"type": "strin"}', "unexpected end of text — 2 `{` still open", 56),
    ("[1, [2", "unexpected end of text — 2 `[` still open", 6),
    ('{"a": [1', "unexpected end of text — 1 `{` and 1 `[` still open", 8),
    ('{"a": 1 "b": 2}', "expected `,` or `}` after an object member", 8),
    ("[1 2]", "expected `,` or `]` after an array element", 3),
    ('{"a": 1,}', "a trailing comma is not allowed in JSON", 7),
    ("[1,]", "a trailing comma is not allowed in JSON", 2),
    ('{"a" 1}', "expected `:` after an object key", 5),
    ("{a: 1}", "expected a string key in double quotes", 1),
    ("{'a': 1}", "JSON strings use double quotes, not `'`", 1),
    ('"abc', "unterminated string", 0),
    ('{"a": "x\n"}', "unterminated string", 6),
    ('"a\\qb"', "invalid escape `\\q` in a string", 2),
    ('"\\u12"', "`\\u` must be followed by four hex digits", 1),
    ('"a\tb"', "control character U+0009 must be escaped inside a string", 2),
    ("NaN", "`NaN` is not a JSON value", 0),
    ("[Infinity]", "`Infinity` is not a JSON value", 1),
    ("01", "malformed number `01`", 0),
    ("1.", "malformed number `1.`", 0),
    ("-", "a number must have a digit after `-`", 0),
    ("{} []", "unexpected `[` after the end of the JSON value", 3),
    ("// x\n{}", "comments are not allowed in JSON", 0),
    ('{"a": 1 /* c */}', "comments are not allowed in JSON", 8),
    ("", "expected a JSON value, but the text is empty", 0),
    ("[@]", "expected a JSON value, found `@`", 1),
])
def test_syntax_errors(text, message, offset):
    doc, problem = only_problem(text)
    assert doc is None
    assert (problem.message, problem.offset) == (message, offset)
    assert problem.code == "invalid-constraint"


def test_unterminated_help_names_the_open_brace():
    _, problem = only_problem('{"a": {"b": 1}')
    assert problem.help == "the `{` at offset 0 is never closed"


def test_word_suggestions():
    assert only_problem("True")[1].help == "did you mean `true`?"
    assert only_problem("[None]")[1].help == "did you mean `null`?"
    assert only_problem("nul")[1].help == "did you mean `null`?"


def test_duplicate_key_points_at_second_key_and_parsing_goes_on():
    text = '{"a": 1, "b": {"a": 2}, "a": 3}'
    doc, problem = only_problem(text)
    assert doc is not None and doc.value == {"a": 3, "b": {"a": 2}}
    assert (problem.offset, problem.end) == (24, 27)
    assert problem.message == "duplicate key `a` in an object"
    assert problem.help == "the key first appears at offset 1"


def test_deep_nesting_is_an_error_not_a_crash():
    doc, problem = only_problem("[" * 1000 + "]" * 1000)
    assert doc is None and "nested deeper" in problem.message


def test_char_offsets_follow_escapes():
    text = r'{"p": "a\u0028\ud83d\ude00b"}'
    start = text.index('"a')
    offsets = char_offsets(text, start)
    assert [text[o] for o in offsets] == ["a", "\\", "\\", "b", '"']
