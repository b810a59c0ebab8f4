"""The JSON Schema checker: meta-schema shapes, references, and xgrammar support warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steerc.constraints import check_json_schema, errors
from steerc.constraints.metaschema import KEYWORDS
from steerc.constraints.schema import XGRAMMAR_SUPPORT

TYPES = "`array`, `boolean`, `integer`, `null`, `number`, `object`, `string`"
ANSWER = Path(__file__).resolve().parent.parent / "fixtures" / "examples" / "schemas" / "answer.schema.json"


def problems_of(schema):
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return text, check_json_schema(text)[1]


def only(schema):
    text, problems = problems_of(schema)
    assert len(problems) == 1, problems
    return text, problems[0]


def test_example_schema_passes_clean():
    schema, problems = check_json_schema(ANSWER.read_text())
    assert problems == []
    assert schema["required"] == ["answer", "confidence"]


def test_unterminated_schema_is_an_error():
    schema, problems = check_json_schema('{"type": "object", "properties": {"a": {"type": "strin"}')
    assert schema is None
    assert [p.severity for p in problems] == ["error"]
    assert problems[0].message == "unexpected end of text — 2 `{` still open"


def test_type_typo_gets_did_you_mean():
    text, problem = only('{"type": "strin"}')
    assert problem.code == "invalid-constraint"
    assert problem.help == "did you mean `string`?"
    assert text[problem.offset:problem.end] == '"strin"'
    assert "`type` must be one of" in problem.message and "not `strin`" in problem.message


@pytest.mark.parametrize(("schema", "snippet", "message", "help"), [
    ({"type": ["string", "nul"]}, '"nul"', f"`type` must be one of {TYPES}, not `nul`", "did you mean `null`?"),
    ({"type": "int"}, '"int"', f"`type` must be one of {TYPES}, not `int`", "did you mean `integer`?"),
    ({"type": []}, "[]", "`type` must not be an empty array", f"use one of {TYPES}"),
    ({"type": ["string", "string"]}, '"string"', "`type` lists `string` twice", None),
    ({"type": 3}, "3", "`type` must be a type name or an array of them, not a number", f"use one of {TYPES}"),
    ({"type": "string", "minLength": -1}, "-1", "`minLength` must be a non-negative integer, not -1", None),
    ({"type": "string", "maxLength": 2.5}, "2.5", "`maxLength` must be a whole number, not 2.5", None),
    ({"type": "string", "minLength": 2.0}, "2.0", "write `minLength` as an integer: structured decoding rejects "
                                                  "`2.0`", "write `2`"),
    ({"type": "array", "items": {}, "minItems": "1"}, '"1"', "`minItems` must be a number, not a string", None),
    ({"type": "number", "minimum": "0"}, '"0"', "`minimum` must be a number, not a string", None),
    ({"type": "number", "exclusiveMinimum": True}, "true", "`exclusiveMinimum` must be a number, not a boolean",
     'draft 2020-12 takes the bound itself, e.g. `"exclusiveMinimum": 0`'),
    ({"type": "integer", "multipleOf": 0}, "0", "`multipleOf` must be greater than 0, not 0", None),
    ({"type": "object", "properties": {"a": {}}, "required": "a"}, '"a"', "`required` must be an array of strings, not a string", None),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", 1]}, "1", "`required` must list strings; item 1 is a number", None),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}, '"a"', "`required` lists `a` twice", None),
    ({"type": "object", "properties": [], "additionalProperties": {}}, "[]", "`properties` must be an object mapping names to schemas, "
                                                 "not an array", None),
    ({"type": "object", "properties": {"a": 3}}, "3", "`a` must be a schema (an object or a boolean), not a number",
     None),
    ({"type": "array", "items": [{"type": "string"}]}, '[{"type": "string"}]',
     "`items` must be a schema (an object or a boolean), not an array",
     "draft 2020-12 uses `prefixItems` for a list of per-position schemas"),
    ({"anyOf": []}, "[]", "`anyOf` must not be empty", None),
    ({"oneOf": {}}, "{}", "`oneOf` must be a non-empty array of schemas, not an object", None),
    ({"enum": []}, "[]", "`enum` is empty, so no value could match", "list at least one value"),
    ({"enum": "a"}, '"a"', "`enum` must be an array of the allowed values, not a string", None),
    ({"type": "string", "pattern": 5}, "5", "`pattern` must be a string holding a regular expression, not a number",
     None),
    ({"type": "string", "readOnly": "yes"}, '"yes"', "`readOnly` must be a boolean, not a string", None),
    ({"title": 3, "type": "string"}, "3", "`title` must be a string, not a number", None),
    ({"$anchor": "1bad"}, '"1bad"', "`$anchor` must be a plain name like `node`, not `1bad`", None),
    ({"$ref": 3}, "3", "`$ref` must be a string, not a number", None),
    ({"$ref": "#/$defs/nope", "$defs": {"nope2": {}}}, '"#/$defs/nope"',
     "`$ref` `#/$defs/nope` does not resolve: there is no `nope` in `#/$defs`", "did you mean `nope2`?"),
    ({"$ref": "#missing"}, '"#missing"', "`$ref` `#missing` does not resolve: no `$anchor` is named `missing`", None),
    ({"$ref": "#/$defs/x", "$defs": {"x": False}}, '"#/$defs/x"',
     "`$ref` `#/$defs/x` points at the schema `false`, which structured decoding cannot compile", None),
    ([1], "[1]", "the document must be a schema (an object or a boolean), not an array", None),
])
def test_meta_schema_errors(schema, snippet, message, help):
    text, problem = only(schema)
    assert problem.severity == "error"
    assert problem.message == message
    assert problem.help == help
    assert (problem.offset, problem.end) == (text.rindex(snippet), text.rindex(snippet) + len(snippet))


def test_regex_problems_inside_schema_point_into_the_json_text():
    text = '{"type": "string", "pattern": "^[a-z]+(\\\\d$"}'
    problem = only(text)[1]
    assert problem.message == "in `pattern`: `(` is never closed"
    assert text[problem.offset] == "("
    text = '{"type": "object", "patternProperties": {"^x[": {}}}'
    problem = only(text)[1]
    assert problem.message.startswith("in `patternProperties` key: unterminated character class")
    assert text[problem.offset] == "["


@pytest.mark.parametrize(("schema", "key", "message", "help"), [
    ({"type": "object", "propertys": {}}, "propertys", "unknown keyword `propertys`; structured decoding ignores it",
     "did you mean `properties`?"),
    ({"type": "string", "minLenght": 1}, "minLenght", "unknown keyword `minLenght`; structured decoding ignores it",
     "did you mean `minLength`?"),
    ({"type": "string", "nullable": True}, "nullable",
     "`nullable` is not a draft 2020-12 keyword; structured decoding ignores it",
     'JSON Schema has no `nullable`; write `"type": ["string", "null"]`'),
    ({"type": "array", "items": {}, "uniqueItems": True}, "uniqueItems",
     "`uniqueItems` is ignored by structured decoding: duplicate items are not prevented", None),
    ({"type": "string", "not": {"const": "x"}}, "not",
     "`not` is ignored by structured decoding: the excluded values are still allowed", None),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}}, "dependentRequired",
     "`dependentRequired` is ignored by structured decoding: dependent properties are not required", None),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf",
     "`multipleOf` is ignored by structured decoding unless the type is `integer` and the divisor a whole number",
     None),
    ({"type": "string", "format": "emial"}, "format", "format `emial` is not enforced by structured decoding",
     "did you mean `email`?"),
    ({"minLength": 1}, "minLength", "`minLength` is ignored by structured decoding because the schema has no `type`",
     'add `"type": "string"`'),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf",
     "`allOf` with more than one schema is ignored by structured decoding: the value is left unconstrained",
     "merge the schemas into one"),
    ({"$ref": "#/$defs/s", "maxLength": 3, "$defs": {"s": {"type": "string"}}}, "maxLength",
     "`maxLength` beside `$ref` is ignored by structured decoding",
     "structured decoding only follows the `$ref`; move the keyword into the referenced schema"),
    ({"type": "integer", "enum": ["a", 1]}, "type", "`type` beside `enum` is ignored by structured decoding",
     "the `enum` values alone decide what is allowed"),
    ({"$ref": "https://example.com/s.json"}, "$ref",
     "`$ref` to another document (`https://example.com/s.json`) is not followed by structured decoding: the value "
     "is left unconstrained", "copy the schema into `$defs` and use `#/$defs/...`"),
    ({"type": "string", "pattern": "[0-9]+"}, "pattern",
     "structured decoding matches this pattern against the whole string, while JSON Schema only searches for it",
     "write `^[0-9]+$` if that is what you mean, or wrap it as `^.*(...).*$` to search"),
])
def test_warnings_point_at_the_keyword(schema, key, message, help):
    text, problem = only(schema)
    assert problem.code == "unsupported-schema-keyword" and problem.severity == "warning"
    assert (problem.message, problem.help) == (message, help)
    assert text[problem.offset:problem.end] == json.dumps(key)


@pytest.mark.parametrize(("schema", "message"), [
    (False, "structured decoding cannot compile the schema `false` (it accepts nothing)"),
    ({"type": "object", "properties": {"a": False}},
     "structured decoding cannot compile the schema `false` here (it accepts nothing)"),
    ({"type": "string", "minLength": 5, "maxLength": 2},
     "`minLength` (5) is greater than `maxLength` (2), so no value can match"),
    ({"type": "integer", "minimum": 3, "maximum": 1}, "`minimum` (3) is greater than `maximum` (1), so no value can match"),
    ({"type": "integer", "maximum": 2.5}, "structured decoding needs a whole-number `maximum` for an `integer`, not 2.5"),
    ({"type": "object", "propertyNames": {"type": "integer"}},
     "`propertyNames` must describe strings: property names are always strings"),
])
def test_what_xgrammar_cannot_compile_is_an_error(schema, message):
    _, problem = only(schema)
    assert (problem.severity, problem.message) == ("error", message)


@pytest.mark.parametrize("schema", [
    True,
    {},
    {"type": "string", "enum": ["a", "b"]},
    {"type": ["string", "null"], "minLength": 1},
    {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "integer", "multipleOf": 3, "minimum": 0, "exclusiveMaximum": 100},
    {"type": "string", "pattern": "^[a-z]+$", "format": "email"},
    {"type": "object", "additionalProperties": False, "properties": {"a": True}},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
    {"$ref": "#/$defs/a~1b", "$defs": {"a/b": {"type": "string"}}},
    {"$ref": "#/$defs/a%20b", "$defs": {"a b": {"type": "string"}}},
    {"type": "object", "properties": {"n": {"$ref": "#"}}},
    {"title": "t", "description": "d", "default": 1, "examples": [1], "deprecated": False, "readOnly": True,
     "writeOnly": False, "$comment": "c", "$id": "https://e.com/s", "$schema": "https://json-schema.org/draft/2020-12/schema",
     "type": "string", "contentEncoding": "base64", "contentMediaType": "text/plain"},
    {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]},
    {"allOf": [{"type": "string"}]},
    {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
])
def test_clean_schemas(schema):
    _, problems = problems_of(schema)
    assert problems == []


def test_subschemas_under_ignored_keywords_are_not_double_reported():
    _, problems = problems_of({"type": "string", "not": {"uniqueItems": True, "minLength": 1}})
    assert [p.message.split(" ")[0] for p in problems] == ["`not`"]


def test_unreferenced_defs_are_not_compiled():
    _, problems = problems_of({"type": "string", "$defs": {"unused": {"type": "string", "minLength": 5, "maxLength": 1}}})
    assert errors(problems) == []


def test_problems_are_sorted_by_offset():
    _, problems = problems_of({"zz": 1, "type": "strin", "aa": 2})
    offsets = [p.offset for p in problems]
    assert offsets == sorted(offsets) and len(problems) == 3


def test_returns_the_parsed_schema():
    schema, problems = check_json_schema('{"type": "string", "type": "integer"}')
    assert schema == {"type": "integer"}
    assert problems[0].message == "duplicate key `type` in an object"
    assert check_json_schema("[]")[0] is None


def test_every_keyword_has_a_support_verdict():
    assert set(KEYWORDS) == set(XGRAMMAR_SUPPORT)
    assert {v[0] for v in XGRAMMAR_SUPPORT.values()} == {"enforced", "partial", "ignored", "annotation"}


def test_deep_schema_does_not_crash():
    text = '{"items": ' * 60 + "{}" + "}" * 60
    assert check_json_schema(text)[1] == []
    text = '{"items": ' * 200 + "{}" + "}" * 200
    assert errors(check_json_schema(text)[1])


def test_use_xgrammar_reports_what_only_xgrammar_rejects():
    pytest.importorskip("xgrammar")
    text = '{"type": "integer", "maximum": 1e19}'
    _, problems = check_json_schema(text, use_xgrammar=True)
    assert [p.severity for p in problems] == ["error"]
    assert problems[0].message.startswith("xgrammar rejects this: ")
    assert problems[0].offset is None
    assert check_json_schema(text)[1] == []
    assert check_json_schema(ANSWER.read_text(), use_xgrammar=True)[1] == []


@pytest.mark.parametrize(("schema", "snippet", "severity", "message"), [
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, '"b"', "warning",
     "`b` is required but not declared in `properties`, and structured decoding (xgrammar's default strict mode) "
     "allows no undeclared property: the output can never contain it"),
    ({"type": "array", "maxItems": 3}, '"maxItems"', "warning",
     "with `maxItems` but nothing declared, structured decoding (xgrammar's default strict mode) accepts only the "
     "empty array `[]` here"),
    ({"type": "object", "maxProperties": 3}, '"maxProperties"', "warning",
     "with `maxProperties` but nothing declared, structured decoding (xgrammar's default strict mode) accepts only "
     "the empty object `{}` here"),
    ({"type": "array", "prefixItems": [{}], "minItems": 2}, "2", "error",
     "`minItems` (2) asks for more than the 1 items in `prefixItems`, and without `items` structured decoding "
     "(xgrammar's default strict mode) allows no others"),
    ({"type": "array", "prefixItems": [{}, {}], "items": {}, "maxItems": 1}, "1", "error",
     "`maxItems` (1) is less than the 2 schemas in `prefixItems`, which structured decoding cannot compile"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, "2", "error",
     "`minProperties` (2) is more than the 1 declared properties, and structured decoding (xgrammar's default "
     "strict mode) allows no others"),
    ({"type": "object", "propertyNames": True}, "true", "error",
     "structured decoding needs `propertyNames` as an object schema, not `true`"),
    ({"$ref": "#"}, '"#"', "error",
     "`$ref` `#` only leads back to itself through other `$ref`s, so there is no schema to follow"),
])
def test_strict_mode_and_other_compile_traps(schema, snippet, severity, message):
    text, problem = only(schema)
    assert (problem.severity, problem.message) == (severity, message)
    assert problem.offset == text.rindex(snippet)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": {"type": "integer"}},
    {"type": "object", "patternProperties": {"^b$": {}}, "required": ["b"]},
    {"type": "array", "maxItems": 3, "items": {"type": "integer"}},
    {"type": "array", "prefixItems": [{}], "minItems": 1},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},
])
def test_strict_mode_leaves_open_schemas_alone(schema):
    assert problems_of(schema)[1] == []


def test_ignored_allof_branches_still_report_errors_but_not_warnings():
    schema = {"allOf": [{"type": "string", "minLength": 3, "maxLength": 1}, {"not": {}}]}
    _, problems = problems_of(schema)
    assert [(p.severity, p.message.split(" ")[0]) for p in problems] == [("warning", "`allOf`"), ("error", "`minLength`")]


def test_fractional_integer_bound_in_a_type_array():
    _, problem = only({"type": ["integer", "null"], "minimum": 2.5})
    assert problem.severity == "error" and problem.help == "write `3`"
