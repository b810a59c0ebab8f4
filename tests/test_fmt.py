"""``steerc fmt``: round trips, idempotence, comments, golden layouts, the command line."""

from __future__ import annotations

import glob
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import commented, programs
from support import GOLDEN, compare_golden, examples_path, run_cli

from steerc.core.source import Source
from steerc.frontend import parse_source
from steerc.frontend.fmt import format_program

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse_ok(text: str, name: str = "t.steer"):
    program, diagnostics = parse_source(text, name)
    assert program is not None and not diagnostics.items, (text, [d.message for d in diagnostics])
    return program


def fmt_text(text: str, name: str = "t.steer") -> str:
    return format_program(parse_ok(text, name), Source(name, text))


# --------------------------------------------------------------- properties


@FAST
@given(programs())
def test_format_then_parse_gives_the_program_back(p):
    text = format_program(p)
    assert parse_ok(text) == p, text


@FAST
@given(programs())
def test_formatting_is_idempotent(p):
    text = format_program(p)
    assert format_program(parse_ok(text)) == text
    assert fmt_text(text) == text  # with the source too (blank lines are kept, not added)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_comments_survive_formatting(data):
    p = data.draw(programs())
    text, added = data.draw(commented(format_program(p)))
    q = parse_ok(text)
    assert q == p
    assert [c.text for c in q.comments] == added
    once = fmt_text(text)
    r = parse_ok(once)
    assert r == p
    assert [c.text for c in r.comments] == added, once
    assert fmt_text(once) == once


# ------------------------------------------------------------ the examples


def _examples() -> list[str]:
    ex = examples_path()
    files = sorted(glob.glob(os.path.join(ex, "*.steer"))) + sorted(glob.glob(os.path.join(ex, "bad", "*.steer")))
    return [os.path.relpath(f, ex) for f in files if not f.endswith("syntax_missing_brace.steer")]


EXAMPLES = _examples()


def _read(examples_dir: str, rel: str) -> str:
    with open(os.path.join(examples_dir, rel), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("rel", EXAMPLES)
def test_example_formatting_keeps_ir_and_comments(rel, examples_dir):
    text = _read(examples_dir, rel)
    before = parse_ok(text, rel)
    once = fmt_text(text, rel)
    after = parse_ok(once, rel)
    assert after == before
    assert len(after.comments) == len(before.comments)
    assert [c.text for c in after.comments] == [c.text for c in before.comments]
    assert [c.own_line for c in after.comments] == [c.own_line for c in before.comments]
    assert fmt_text(once, rel) == once


@pytest.mark.parametrize("rel", EXAMPLES)
def test_example_golden(rel, examples_dir, update_golden):
    formatted = fmt_text(_read(examples_dir, rel), rel)
    compare_golden(os.path.join(GOLDEN, "fmt", rel), formatted, update_golden)


def test_most_examples_are_already_formatted(examples_dir):
    # The examples were written by hand in (nearly) the canonical layout.
    same = [rel for rel in EXAMPLES if fmt_text(_read(examples_dir, rel), rel) == _read(examples_dir, rel)]
    assert {"01_add.steer", "02_abliterate.steer", "06_heads.steer", "11_rotate.steer"} <= set(same)


# ------------------------------------------------------------- the layout


def test_layout_rules():
    text = ("steer 1\nparam  g=2\nparam longer=-3\nvector v=[1,2]\n"
            "intervention x{tokens generated\nadd g*v\nat resid_pre[0]\npreserve norm}\n")
    assert fmt_text(text) == (
        "steer 1\n"
        "\n"
        "param g      = 2\n"
        "param longer = -3\n"
        "\n"
        "vector v = [1, 2]\n"
        "\n"
        "intervention x {\n"
        "  at     resid_pre[0]\n"
        "  add    g * v\n"
        "  tokens generated\n"
        "  preserve norm\n"
        "}\n"
    )


def test_parentheses_are_kept_only_where_needed():
    text = "steer 1\nparam a = ((1 - (2 - 3)) * (4 + 5)) / -(6)\n"
    assert fmt_text(text).splitlines()[-1] == "param a = (1 - (2 - 3)) * (4 + 5) / -6"


def test_long_vector_literals_wrap_at_100_columns():
    items = ", ".join(["0.125"] * 40)
    out = fmt_text(f"steer 1\nvector v = [{items}]\n")
    lines = out.splitlines()[2:]
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines)
    assert all(line.startswith(" " * len("vector v = [")) for line in lines[1:])


def test_trailing_comment_after_multiline_statement_stays_with_it():
    out = fmt_text("steer 1\nvector v = [1,\n  2]  # about v\nparam a = 1\n")
    assert "vector v = [1, 2]  # about v" in out


@pytest.mark.parametrize("block", [
    'intervention x {\n  at     resid_pre[0]\n  scale  2\n  tokens after """A\nB"""\n}\n',
    'model {\n  family = """ll\nama"""\n}\n',
])
def test_multiline_string_in_a_block_keeps_its_text(block):
    text = "steer 1\n\n" + block
    once = fmt_text(text)
    assert parse_ok(once) == parse_ok(text), once
    assert fmt_text(once) == once


# ----------------------------------------------------------- command line


def test_fmt_check_exit_codes(examples_dir, tmp_path):
    messy = tmp_path / "messy.steer"
    shutil.copy(os.path.join(examples_dir, "05_ops_and_scopes.steer"), messy)
    original = messy.read_text()
    code, out, err = run_cli(["fmt", "--check", str(messy)])
    assert code == 1 and "would reformat" in out
    assert messy.read_text() == original  # --check changes nothing

    tidy = tmp_path / "tidy.steer"
    tidy.write_text(fmt_text(original))
    code, out, err = run_cli(["fmt", "--check", str(tidy)])
    assert (code, out, err) == (0, "", "1 file already formatted\n")  # clean files still say what was checked

    code, _, err = run_cli(["fmt", "--check", str(tidy), str(messy)])
    assert code == 1 and err == "1 file would be reformatted, 1 file already formatted\n"


def test_fmt_takes_folders_and_globs_as_check_does(examples_dir, tmp_path, monkeypatch):
    """`steerc fmt --check .` in CI: every .steer below, hidden folders and virtual environments skipped."""
    messy_text = open(os.path.join(examples_dir, "05_ops_and_scopes.steer"), encoding="utf-8").read()
    (tmp_path / "a").mkdir()
    (tmp_path / ".venv").mkdir()
    (tmp_path / "a" / "messy.steer").write_text(messy_text)
    (tmp_path / "tidy.steer").write_text(fmt_text(messy_text))
    (tmp_path / ".venv" / "vendored.steer").write_text(messy_text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["fmt", "--check", "."])
    assert code == 1 and out.splitlines() == [f"would reformat {os.path.join('a', 'messy.steer')}"], out
    code, out, _ = run_cli(["fmt", "**/*.steer"])
    assert code == 0 and (tmp_path / "a" / "messy.steer").read_text() == fmt_text(messy_text)
    assert (tmp_path / ".venv" / "vendored.steer").read_text() == messy_text
    assert run_cli(["fmt", "--check", "."])[0] == 0
    code, _, err = run_cli(["fmt", "nothing/*.steer"])
    assert code == 2 and "nothing/*.steer" in err


def test_fmt_rewrites_files(examples_dir, tmp_path):
    messy = tmp_path / "messy.steer"
    shutil.copy(os.path.join(examples_dir, "04_bank.steer"), messy)
    expected = fmt_text(messy.read_text())
    code, out, _ = run_cli(["fmt", str(messy)])
    assert code == 0 and "reformatted" in out
    assert messy.read_text() == expected
    code, out, err = run_cli(["fmt", str(messy)])
    assert (code, out, err) == (0, "", "1 file already formatted\n")


def test_fmt_diff(examples_dir, tmp_path):
    messy = tmp_path / "messy.steer"
    shutil.copy(os.path.join(examples_dir, "04_bank.steer"), messy)
    original = messy.read_text()
    code, out, _ = run_cli(["fmt", "--diff", str(messy)])
    assert code == 0 and out.startswith("---") and "+vector bank = " in out
    assert messy.read_text() == original


def test_fmt_from_stdin():
    code, out, err = run_cli(["fmt", "-"], stdin="steer 1\nparam  g=2 # c\n")
    assert (code, err) == (0, "")
    assert out == "steer 1\n\nparam g = 2  # c\n"


def test_fmt_refuses_programs_with_syntax_errors(tmp_path):
    bad = tmp_path / "bad.steer"
    bad.write_text("steer 1\nparam = 2\n")
    code, out, err = run_cli(["fmt", str(bad)])
    assert code == 1 and "error[syntax-error]" in err
    assert bad.read_text() == "steer 1\nparam = 2\n"
    code, out, err = run_cli(["fmt", "-"], stdin='steer 1\nconstrain regex "\\d"\n')
    assert code == 1 and out == "" and "error[syntax-error]" in err


def test_fmt_missing_file_is_a_usage_error(tmp_path):
    code, _, err = run_cli(["fmt", str(tmp_path / "nope.steer")])
    assert code == 2 and "no such file" in err
