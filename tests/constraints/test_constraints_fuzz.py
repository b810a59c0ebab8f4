"""Property tests: no input makes a checker raise, and every offset lands inside the text."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steerc.constraints import check_choice, check_grammar, check_json_schema, check_regex
from steerc.constraints.jsonpos import parse_json
from steerc.constraints.metaschema import KEYWORDS

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODES = {"invalid-constraint", "unsupported-schema-keyword"}


def well_formed(problems, text):
    for p in problems:
        assert p.code in CODES
        assert isinstance(p.message, str) and p.message
        if p.offset is not None:
            assert 0 <= p.offset <= len(text), p
        if p.end is not None:
            assert p.offset is not None and p.offset <= p.end <= len(text), p


def any_text(alphabet: str):
    return st.one_of(st.text(max_size=60), st.text(alphabet=alphabet, max_size=60))


@FAST
@given(any_text('{}[]":,.-+0123456789eEtrufalsn \\/ubnq\n\t'))
def test_json_schema_never_raises(text):
    schema, problems = check_json_schema(text)
    well_formed(problems, text)
    assert schema is None or isinstance(schema, (dict, bool))


@FAST
@given(any_text("()[]{}|*+?^$.\\-,:=!<>Pdwsbkux0123456789azAZ"))
def test_regex_never_raises(text):
    well_formed(check_regex(text), text)


@FAST
@given(any_text('root:=|()[]{}*+?"#\\-^,=\n abx0129TagDispatchRegex'))
def test_grammar_never_raises(text):
    well_formed(check_grammar(text), text)


@FAST
@given(st.lists(st.one_of(st.text(max_size=5), st.integers(), st.none())))
def test_choice_never_raises(options):
    well_formed(check_choice(options), "")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@FAST
@given(JSON_VALUES, st.booleans())
def test_json_round_trip(value, indent):
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=indent)
    doc, problems = parse_json(text)
    assert problems == []
    assert doc.value == value
    for start, end in doc.values.values():
        assert json.loads(text[start:end]) is not None or text[start:end] == "null"


def _strict_loads(text):
    def no_constants(name):
        raise ValueError(name)
    return json.loads(text, parse_constant=no_constants)


@FAST
@given(st.text(alphabet='{}[]":,.-+01eEtrufalsn \\/u"a', max_size=30))
def test_json_accepts_exactly_what_python_json_accepts(text):
    try:
        _strict_loads(text)
        valid = True
    except ValueError:
        valid = False
    doc, _ = parse_json(text)
    assert (doc is not None) == valid


SCHEMA_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.sampled_from(["string", "#", "#/$defs/a", "^a$", "(", "strin"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(sorted(KEYWORDS) + ["a", "definitions"]), children, max_size=4),
    max_leaves=15,
)


@FAST
@given(SCHEMA_VALUES)
def test_generated_schemas_never_raise(value):
    text = json.dumps(value)
    _, problems = check_json_schema(text)
    well_formed(problems, text)
