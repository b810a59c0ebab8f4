"""Diagnostics: golden renderings of the bad examples, the JSON form, exit codes, the code registry."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
from support import GOLDEN, compare_golden, examples_path, needs_constraints, run_cli, uses_constraint

from steerc.core.source import Source
from steerc.diagnostics import CODES, Diagnostic, Diagnostics, Note, render_text, to_json_dict
from steerc.diagnostics.codes import severity_of

EXPECT = re.compile(r"^#\s*expect:\s*(error|warning)\[([a-z-]+)\]\s+line\s+(\d+)\s*$", re.M)
MODEL = re.compile(r"^#\s*model:\s*(\S+)\s*$", re.M)
JSON_FIELDS = ("code", "severity", "message", "file", "line", "column", "end_line", "end_column")
LANGUAGE_CODES = (
    "syntax-error unsupported-version undefined-name duplicate-name type-error unknown-site layer-out-of-range "
    "head-out-of-range shape-mismatch file-not-found missing-key path-escape model-mismatch causality "
    "multiple-constraints invalid-constraint unsupported-by-target"
).split()

BAD = sorted(os.path.basename(f) for f in glob.glob(os.path.join(examples_path(), "bad", "*.steer")))


def bad_args(examples_dir: str, name: str) -> tuple[list[str], str]:
    """(arguments for `steerc check`, run from the examples folder) and the program text."""
    with open(os.path.join(examples_dir, "bad", name), encoding="utf-8") as fh:
        text = fh.read()
    if uses_constraint(text):
        needs_constraints()
    args = [f"bad/{name}"]
    model = MODEL.search(text)
    if model:
        args += ["--model", model.group(1)]
    return args, text


# ----------------------------------------------------------------- golden


@pytest.mark.parametrize("name", BAD)
def test_rendered_diagnostics_golden(name, examples_dir, monkeypatch, update_golden):
    args, _ = bad_args(examples_dir, name)
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(["check", *args])
    assert code == 1
    assert err == ""
    text = out.replace(examples_dir, "<examples>")
    compare_golden(os.path.join(GOLDEN, "diagnostics", name.replace(".steer", ".txt")), text, update_golden)


@pytest.mark.parametrize("name", BAD)
def test_expected_errors_and_caret(name, examples_dir, monkeypatch):
    """Each `# expect:` line is met, and the caret sits under the reported columns."""
    args, text = bad_args(examples_dir, name)
    monkeypatch.chdir(examples_dir)
    code, out, _ = run_cli(["check", "--format", "json", *args])
    assert code == 1
    found = json.loads(out)["diagnostics"]
    for severity, c, line in EXPECT.findall(text):
        assert any((d["severity"], d["code"], d["line"]) == (severity, c, int(line)) for d in found), (c, line, found)
    code, rendered, _ = run_cli(["check", *args])
    lines = text.split("\n")
    for d in found:
        if d["file"] != f"bad/{name}":
            continue
        assert f"{d['severity']}[{d['code']}]: {d['message']}" in rendered
        assert f"--> bad/{name}:{d['line']}:{d['column']}" in rendered
        source_line = lines[d["line"] - 1]
        assert f"{d['line']} | {source_line}" in rendered
        if d["end_line"] == d["line"]:
            caret = " " * (d["column"] - 1) + "^" * max(d["end_column"] - d["column"], 1)
            assert re.search(r"\| " + re.escape(caret) + r"(\s|$)", rendered), caret


# ------------------------------------------------------------- JSON format


def test_json_output_shape(examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(["check", "--format", "json", "bad/causality.steer", "bad/undefined_vector.steer"])
    assert code == 1 and err == ""
    data = json.loads(out)
    assert isinstance(data, dict) and isinstance(data["diagnostics"], list)
    assert data["files"] == ["bad/causality.steer", "bad/undefined_vector.steer"]
    assert data["errors"] == 2 and data["warnings"] == sum(d["severity"] == "warning" for d in data["diagnostics"])
    for d in data["diagnostics"]:
        assert set(JSON_FIELDS) <= set(d)
        assert list(d)[: len(JSON_FIELDS)] == list(JSON_FIELDS)
        assert d["code"] in CODES and d["severity"] in ("error", "warning")
        assert isinstance(d["message"], str) and d["message"]
        assert d["file"] in data["files"]
        for k in ("line", "column", "end_line", "end_column"):
            assert isinstance(d[k], int) and d[k] >= 1
        assert (d["end_line"], d["end_column"]) >= (d["line"], d["column"])
    causality = next(d for d in data["diagnostics"] if d["code"] == "causality")
    assert (causality["line"], causality["column"]) == (14, 8)
    assert causality["notes"][0]["line"] == 7 and set(JSON_FIELDS[2:]) <= set(causality["notes"][0])
    assert "help" in causality


def test_json_output_of_a_clean_file(examples_dir):
    code, out, _ = run_cli(["check", "--format", "json", os.path.join(examples_dir, "06_heads.steer")])
    assert code == 0
    assert json.loads(out) == {"diagnostics": [], "files": [os.path.join(examples_dir, "06_heads.steer")],
                               "errors": 0, "warnings": 0}


def test_to_json_dict_without_span():
    d = Diagnostic.error("undefined-name", "no such param", None, help="h")
    obj = to_json_dict(d)
    assert [obj[k] for k in JSON_FIELDS] == ["undefined-name", "error", "no such param", None, None, None, None, None]
    assert obj["help"] == "h"


# --------------------------------------------------------------- exit codes


def test_exit_codes(examples_dir, monkeypatch, tmp_path):
    monkeypatch.chdir(examples_dir)
    assert run_cli(["check", "06_heads.steer"])[0] == 0
    assert run_cli(["check", "06_heads.steer", "--model", "models/tiny-llama"])[0] == 0
    assert run_cli(["check", "bad/causality.steer"])[0] == 1
    assert run_cli(["check", "06_heads.steer", "bad/causality.steer"])[0] == 1
    warn = tmp_path / "warn.steer"
    warn.write_text("steer 1\nparam unused = 1\n")
    code, out, _ = run_cli(["check", str(warn)])
    assert code == 0 and "warning[unused-name]" in out and "0 errors, 1 warning" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["check", "no_such_file.steer"], "no such file"),
        (["check", "models"], "no .steer files in the folder models"),
        (["check", "no_such_*.steer"], "no file matches the glob"),
        (["fmt", "--check", "no_such_*.steer"], "no file matches the glob"),  # never `fmt` on the shared folder
        (["check", "01_add.steer", "--set", "strength"], "NAME=VALUE"),
        (["check", "01_add.steer", "--set", "=1"], "NAME=VALUE"),
        (["check", "01_add.steer", "--set", "strength=abc"], "not a number"),
        (["check", "01_add.steer", "--set", "strength=nan"], "finite"),
        (["check", "01_add.steer", "--set", "strength=inf"], "finite"),
        (["check", "01_add.steer", "--model", "models/no-such-model"], "no-such-model"),
        (["check", "01_add.steer", "--model", "bad"], "config.json"),
        (["check", "01_add.steer", "--model", "01_add.steer"], "JSON"),
        (["check", "01_add.steer", "--root", "no/such/folder"], "no such folder"),
        (["check", "01_add.steer", "--format", "yaml"], "invalid choice"),
        (["check"], "required"),
        (["frobnicate"], "invalid choice"),
        ([], "usage"),
        (["parse", "no_such_file.steer"], "no such file"),
        (["fmt", "no_such_file.steer"], "no such file"),
    ],
)
def test_usage_errors_exit_2(argv, fragment, examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(argv)
    assert code == 2, (out, err)
    assert fragment in err
    assert "Traceback" not in err


def test_unknown_set_name_is_a_diagnostic(examples_dir):
    code, out, _ = run_cli(["check", os.path.join(examples_dir, "03_cast_gate.steer"), "--set", "strenght=1"])
    assert code == 1
    assert "error[undefined-name]" in out and "strenght" in out and "did you mean `strength`?" in out


def test_unknown_family_is_a_diagnostic(tmp_path, examples_dir):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "num_hidden_layers": 2}))
    code, out, err = run_cli(["check", os.path.join(examples_dir, "06_heads.steer"), "--model", str(cfg)])
    assert code == 1
    assert "error[unknown-family]" in err and "mamba" in err
    program = os.path.join(examples_dir, "06_heads.steer")
    code, out, err = run_cli(["check", "--format", "json", program, "--model", str(tmp_path)])
    assert code == 1
    assert [d["code"] for d in json.loads(out)["diagnostics"]] == ["unknown-family"]


def test_main_returns_instead_of_raising(tmp_path, examples_dir):
    from steerc.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba"}))
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["check", os.path.join(examples_dir, "06_heads.steer"), "--model", str(cfg)]) == 1


# ------------------------------------------------------------------ registry


def test_every_code_is_registered_with_a_valid_severity():
    assert CODES
    for name, code in CODES.items():
        assert code.name == name
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name), name
        assert code.severity in ("error", "warning")
        assert code.summary and severity_of(name) == code.severity


def test_the_language_codes_are_all_registered_as_errors():
    for name in LANGUAGE_CODES:
        assert CODES[name].severity == "error", name


def test_unregistered_codes_raise():
    with pytest.raises(ValueError, match="unregistered"):
        Diagnostic.error("no-such-code", "x", None)
    with pytest.raises(ValueError):
        Diagnostics().warning("Syntax-Error", "x", None)


def test_default_severity():
    assert Diagnostic.of("no-effect", "x", None).severity == "warning"
    assert Diagnostic.of("causality", "x", None).severity == "error"


# --------------------------------------------------------------- rendering


def test_render_text_layout():
    src = Source("x.steer", "steer 1\nvector v = wonky + 1\n")
    other = Source("y.json", '{"a": 1}\n')
    d = Diagnostic.error(
        "undefined-name", "undefined name `wonky`", src.span(19, 24),
        notes=(Note("declared elsewhere", other.span(1, 4)), Note("plain note")), help="did you mean `v`?",
    )
    assert render_text(d, {"x.steer": src, "y.json": other}) == (
        "error[undefined-name]: undefined name `wonky`\n"
        " --> x.steer:2:12\n"
        "  |\n"
        "2 | vector v = wonky + 1\n"
        "  |            ^^^^^\n"
        "  |\n"
        " ::: y.json:1:2\n"
        "1 | {\"a\": 1}\n"
        "  |  --- declared elsewhere\n"
        "  |\n"
        "  = note: plain note\n"
        "  = help: did you mean `v`?"
    )


def test_render_text_without_a_span_or_source():
    d = Diagnostic.warning("no-effect", "nothing happens", None)
    assert render_text(d, {}) == "warning[no-effect]: nothing happens"
    src = Source("x.steer", "steer 1\n")
    d = Diagnostic.error("syntax-error", "bad", src.span(0, 5))
    assert render_text(d, {}) == "error[syntax-error]: bad\n --> x.steer:1:1"


def test_render_text_multiline_span_and_wide_gutter():
    text = "steer 1\n" + "\n" * 8 + "intervention x {\n  at resid_pre[0]\n}\n"
    src = Source("x.steer", text)
    start = text.index("intervention")
    d = Diagnostic.warning("no-effect", "nothing", src.span(start, len(text) - 1))
    out = render_text(d, {"x.steer": src})
    assert out.splitlines()[1] == "  --> x.steer:10:1"
    assert "10 | intervention x {" in out
    assert "   | ^^^^^^^^^^^^^^^^" in out
    assert "   | ..." in out
