"""The IR's JSON form (``steerc parse --emit ir``): exact round trips, spans included."""

from __future__ import annotations

import glob
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import programs
from support import examples_path, run_cli

from steerc.core import record
from steerc.core.source import Span
from steerc.frontend import parse_source
from steerc.frontend.fmt import format_program
from steerc.ir import nodes as ir
from steerc.ir.serialize import FORMAT, dumps, from_json, loads, to_json

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EXAMPLES = sorted(
    os.path.relpath(f, examples_path())
    for f in glob.glob(os.path.join(examples_path(), "*.steer"))
    + glob.glob(os.path.join(examples_path(), "bad", "*.steer"))
    if not f.endswith("syntax_missing_brace.steer")
)


def parse_file(examples_dir: str, rel: str) -> ir.Program:
    with open(os.path.join(examples_dir, rel), encoding="utf-8") as fh:
        program, diagnostics = parse_source(fh.read(), rel)
    assert program is not None and not diagnostics.items
    return program


def all_fields(a, b, path="program"):
    """Yield (path, value_a, value_b) for every attribute of two node trees, eq=False fields included."""
    assert type(a) is type(b), path
    if isinstance(a, tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            yield from all_fields(x, y, f"{path}[{i}]")
    elif record.has(type(a)) and not isinstance(a, Span):
        for f in record.fields(type(a)):
            yield from all_fields(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    else:
        yield path, a, b


# --------------------------------------------------------------- properties


@FAST
@given(programs(with_loads=True))
def test_ir_json_ir_is_identity(p):
    text = dumps(p)
    back = loads(text)
    assert back == p
    assert dumps(back) == text
    assert format_program(back) == format_program(p)  # spellings (eq=False fields) survive too


@FAST
@given(programs(with_loads=True))
def test_json_is_plain_json_with_node_first(p):
    data = json.loads(dumps(p))
    assert data["format"] == FORMAT and data["file"] is None
    assert list(data) == ["format", "file", "program"]

    def check(value):
        if isinstance(value, dict):
            assert next(iter(value)) == "node" and value["node"] in ir.NODE_CLASSES
            for v in value.values():
                check(v)
        elif isinstance(value, list):
            for v in value:
                check(v)
        else:
            assert value is None or isinstance(value, (str, int, float, bool))

    check(data["program"])


# ------------------------------------------------------------ the examples


@pytest.mark.parametrize("rel", EXAMPLES)
def test_spans_and_comments_survive(rel, examples_dir):
    p = parse_file(examples_dir, rel)
    text = dumps(p)
    back = loads(text)
    assert back == p and dumps(back) == text
    spans = 0
    for path, x, y in all_fields(p, back):
        if isinstance(x, Span):
            spans += 1
            assert x.as_tuple() == y.as_tuple() and x.file == y.file == rel, path
        else:
            assert x == y, path
    assert spans >= 2  # at least the program and its header
    assert back.comments == p.comments


def test_span_encoding(examples_dir):
    data = to_json(parse_file(examples_dir, "01_add.steer"))
    assert data["file"] == "01_add.steer"
    program = data["program"]
    assert program["version_span"] == "1:7-1:8"
    iv = program["statements"][1]
    assert iv["node"] == "InterventionDecl" and iv["span"] == "6:1-10:2" and iv["name_span"] == "6:14-6:22"
    assert program["comments"][0] == {"node": "Comment", "line": 3, "column": 1,
                                       "text": program["comments"][0]["text"], "own_line": True}


def test_nodes_without_spans_have_no_span_keys():
    p = ir.Program(1, (ir.ParamDecl("g", ir.Number(2)),))
    data = to_json(p)
    assert data["file"] is None
    assert data["program"] == {
        "node": "Program",
        "version": 1,
        "statements": [{"node": "ParamDecl", "name": "g", "value": {"node": "Number", "value": 2, "text": ""},
                        "range": None, "per_request": False}],
    }


def test_from_json_refuses_other_documents():
    with pytest.raises(ValueError):
        from_json({"format": "something-else", "program": {}})


# ------------------------------------------------------------ command line


@pytest.mark.parametrize(
    "rel", ["01_add.steer", "06_heads.steer", "12_per_token_gate.steer", "10_regex_inline_schema.steer"]
)
def test_emit_ir_prints_dumps(rel, examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(["parse", rel, "--emit", "ir"])
    assert (code, err) == (0, "")
    assert out == dumps(parse_file(examples_dir, rel))


def test_emit_ir_is_the_default(examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    assert run_cli(["parse", "02_abliterate.steer"]) == run_cli(["parse", "02_abliterate.steer", "--emit", "ir"])


def test_emit_ir_from_stdin():
    code, out, _ = run_cli(["parse", "-"], stdin="steer 1\nparam g = 2\n")
    assert code == 0
    data = json.loads(out)
    assert data["file"] == "<stdin>"
    assert loads(out) == parse_source("steer 1\nparam g = 2\n")[0]


def test_emit_ir_on_errors(examples_dir):
    code, out, err = run_cli(["parse", os.path.join(examples_dir, "bad", "syntax_missing_brace.steer")])
    assert code == 1 and out == "" and "error[syntax-error]" in err


def _strict(text: str):
    """``text`` read as RFC 8259 JSON: NaN, Infinity and -Infinity refused."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "1.7976931348623159e308", "2.5E+400"])
def test_emit_ir_of_a_number_too_large_is_strict_json_that_steerc_reads_back(literal):
    text = f"steer 1\nparam g = {literal}\nintervention x {{\n  at resid_post[1]\n  add {literal} * [1.0, 2.0]\n}}\n"
    code, out, err = run_cli(["parse", "-"], stdin=text)
    assert (code, err) == (0, "")
    data = _strict(out)
    number = data["program"]["statements"][0]["value"]
    while number["node"] != "Number":  # -1e999 is a negation of a number
        number = number["operand"]
    assert number["value"] == {"float": "inf"} and number["text"] == literal.lstrip("-")
    program = loads(out)  # steerc's own reader (steerc.core.jsonio: strict) takes it
    assert program == parse_source(text, "<stdin>")[0]
    assert dumps(program) == out


def test_the_cli_json_writer_is_strict_and_encodes_non_finite_floats():
    import io

    from steerc.cli.common import print_json
    from steerc.core.jsonio import decode_float
    from steerc.core.jsonio import loads as steerc_loads

    out = io.StringIO()
    print_json({"a": [float("nan"), float("inf"), -float("inf"), 1.5], "b": {"c": (float("inf"),)}}, out)
    data = _strict(out.getvalue())
    assert data == steerc_loads(out.getvalue())
    assert data["a"][:3] == [{"float": "nan"}, {"float": "inf"}, {"float": "-inf"}] and data["a"][3] == 1.5
    assert decode_float(data["b"]["c"][0]) == float("inf") and decode_float({"float": "x"}) == {"float": "x"}
