"""``steer.toml`` defaults: the schema, its diagnostics with carets, and the precedence command line > steer.toml >
the program, for check, explain, compile and run."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support import run_cli

from steerc.project import project_at
from steerc.targets.registry import TARGET_NAMES  # every target steer.toml can name: the message lists them

PROGRAM = """steer 1

param strength = 1 in [0, 4]
vector v = [1.0""" + ", 0.0" * 63 + """]

intervention push {
  at  resid_post[LAYER]
  add strength * v
}
"""


@pytest.fixture
def project(tmp_path, monkeypatch, examples_dir):
    """A project folder with a tiny model, a program in a subfolder, the working directory elsewhere."""
    shutil.copytree(os.path.join(examples_dir, "models", "tiny-llama"), tmp_path / "proj" / "models" / "tiny")
    (tmp_path / "proj" / "progs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path / "proj"


def toml(project, text: str) -> None:
    (project / "steer.toml").write_text(text, encoding="utf-8")


def program(project, layer: int = 1, name: str = "p.steer", extra: str = "") -> str:
    path = project / "progs" / name
    path.write_text(PROGRAM.replace("LAYER", str(layer)) + extra)
    return str(path)


def diagnostics(argv: list[str]) -> tuple[int, list[tuple]]:
    code, out, err = run_cli(["check", "--format", "json", *argv])
    assert "Traceback" not in err, err
    return code, [(d["code"], os.path.basename(d["file"] or ""), d["line"]) for d in json.loads(out)["diagnostics"]]


# ------------------------------------------------------------------ the schema


def test_an_empty_or_comment_only_steer_toml_sets_nothing(tmp_path):
    assert project_at(str(tmp_path)).file is None
    toml(tmp_path, "# marks the project root\n")
    p = project_at(str(tmp_path))
    assert p.file == str(tmp_path / "steer.toml") and p.diagnostics == ()
    assert (p.model, p.target, p.params) == (None, None, {})


def test_the_values_and_where_they_are(project):
    toml(project, '[defaults]\nmodel = "models/tiny"  # the tiny one\ntarget = "serve"\n\n[params]\nstrength = 2\n'
                  'scale = -0.5\n')
    p = project_at(str(project))
    assert p.diagnostics == ()
    assert p.model == str(project / "models" / "tiny") and p.target == "serve"
    assert p.params == {"strength": 2.0, "scale": -0.5}
    text = p.source.text
    assert [text[s.start:s.end] for s in (p.spans["model"], p.spans["target"], p.spans["params.strength"])] == \
        ['"models/tiny"', '"serve"', "2"]


def test_a_model_name_is_a_model_unless_a_path_of_that_name_holds_a_model(project):
    toml(project, '[defaults]\nmodel = "smollm2"\n')
    assert project_at(str(project)).model == "smollm2"
    (project / "smollm2").mkdir()  # a folder of other things (examples/smollm2) does not hide the name
    assert project_at(str(project)).model == "smollm2"
    (project / "smollm2" / "config.json").write_text("{}", encoding="utf-8")
    assert project_at(str(project)).model == str(project / "smollm2")


@pytest.mark.parametrize("text, message, caret", [
    ('[defaults]\nmodle = "x"\n', "[defaults] has no key `modle`", "modle"),
    ('[chek]\nmodel = "x"\n', "steer.toml has no `chek` table: it takes [defaults] and [params]", "chek"),
    ('model = "models/tiny"\n', "steer.toml has no `model` table", "model"),
    ('defaults = 3\n', "`defaults` must be a table ([defaults]), got a number", "3"),
    ('[defaults]\nmodel = 3\n', "`model` must be a non-empty string, got a number", "3"),
    ('[defaults]\nmodel = ""\n', "`model` must be a non-empty string, got a string", '""'),
    ('[defaults]\nmodel = "nope"\n', 'model "nope": no such file or folder next to steer.toml', '"nope"'),
    ('[defaults]\ntarget = "vlm"  # typo\n', f'`target` must be one of {", ".join(TARGET_NAMES)}, got "vlm"', '"vlm"'),
    ("[defaults]\ntarget = ['hf']\n", "`target` must be a non-empty string, got an array", "['hf']"),
    ('[params]\nstrength = "2"\n', "param `strength` must be a number, got a string", '"2"'),
    ('[params]\nstrength = true\n', "param `strength` must be a number, got a boolean", "true"),
    ('[params]\nstrength = nan\n', "param `strength` must be a finite number, got nan", "nan"),
    ('[params]\nstrength = -inf\n', "param `strength` must be a finite number, got -inf", "-inf"),
    ('[params]\n"my-param" = 1\n', "`my-param` is not a param name", '"my-param"'),
    ('[params]\nday = 1979-05-27\n', "param `day` must be a number, got a date or time", "1979-05-27"),
    ('[params.inner]\nx = 1\n', "param `inner` must be a number, got a table", "params.inner"),
    ('defaults = {model = "models/tiny", colour = 1}\n', "[defaults] has no key `colour`", "defaults"),
])
def test_each_mistake_is_an_invalid_config_with_a_caret(project, text, message, caret):
    toml(project, text)
    p = project_at(str(project))
    (d,) = p.diagnostics
    assert d.code == "invalid-config" and d.severity == "error"
    assert d.message.startswith(message), d.message
    assert p.source.text[d.span.start:d.span.end] == caret


@pytest.mark.parametrize("text, position, message", [
    ("[defaults\nmodel = 1\n", (1, 10, 1, 10), "expected ']' at the end of a table declaration"),
    ('[defaults]\nmodel = "é😀" x\n', (2, 14, 2, 15), "expected newline or end of document after a statement"),
    ("[defaults]\nmodel = \n", (2, 9, 2, 9), "invalid value"),
    ("[params]\na = 1\na = 2\n", None, "cannot overwrite a value"),
])
def test_a_toml_syntax_error_points_at_its_position(project, text, position, message):
    toml(project, text)
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "invalid-config" and d.message == f"steer.toml is not valid TOML: {message}"
    if position is not None:
        assert d.span.as_tuple() == position


def test_a_steer_toml_that_is_not_utf8_is_a_diagnostic(project):
    (project / "steer.toml").write_bytes(b"[defaults]\nmodel = \"\xff\"\n")
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "invalid-config" and "not UTF-8" in d.message and d.span.line == 1


def test_steer_toml_diagnostics_render_with_a_caret(project):
    toml(project, '[defaults]\ntraget = "vllm"\n')
    code, out, err = run_cli(["check", program(project)])
    assert code == 1 and "Traceback" not in err
    # named as found: an absolute path, since it is outside the working directory
    assert out.startswith(f"error[invalid-config]: [defaults] has no key `traget`\n --> {project / 'steer.toml'}:2:1\n")
    assert "2 | traget = \"vllm\"\n  | ^^^^^^\n" in out and "= help: did you mean `target`?" in out


# ------------------------------------------------------------------ precedence


def test_the_model_comes_from_steer_toml_unless_given(project, examples_dir):
    path = program(project, layer=9)
    assert diagnostics([path]) == (0, [])  # no steer.toml: no model, no layout check
    toml(project, '[defaults]\nmodel = "models/tiny"\n')
    assert diagnostics([path]) == (1, [("layer-out-of-range", "p.steer", 7)])
    gpt2 = os.path.join(examples_dir, "models", "tiny-gpt2")
    code, found = diagnostics([path, "--model", gpt2])
    assert code == 1 and found == [("layer-out-of-range", "p.steer", 7)]
    big = project / "models" / "big"
    shutil.copytree(project / "models" / "tiny", big)
    cfg = json.loads((big / "config.json").read_text())
    cfg["num_hidden_layers"] = 12
    (big / "config.json").write_text(json.dumps(cfg))
    assert diagnostics([path, "--model", str(big)]) == (0, [])


def test_the_target_comes_from_steer_toml_unless_given(project):
    path = program(project, extra='\nintervention after_answer {\n  at     resid_pre[0]\n  add    v\n'
                                  '  tokens after "Answer:"\n}\n')
    assert diagnostics([path]) == (0, [])
    toml(project, '[defaults]\ntarget = "vllm"\n')
    assert diagnostics([path]) == (1, [("unsupported-by-target", "p.steer", 14)])
    assert diagnostics([path, "--target", "hf"]) == (0, [])


def test_params_come_from_steer_toml_unless_set(project):
    from steerc.api import check_file
    from steerc.cli import build_parser
    from steerc.cli.common import options_from

    path = program(project)
    toml(project, "[params]\nstrength = 3\nunused_elsewhere = 1\n")
    p = project_at(str(project))

    def value(*argv):
        args = build_parser().parse_args(["check", path, *argv])
        args.argv = ["check", path, *argv]
        result = check_file(path, options=options_from(args, p))
        assert result.ok, result.render()
        return result.checked.params["strength"]

    assert value() == 3.0  # steer.toml over `param strength = 1`; `unused_elsewhere` is left alone
    assert value("--set", "strength=0.5") == 0.5  # the command line over steer.toml
    assert diagnostics([path]) == (0, [])


def test_an_out_of_range_param_from_steer_toml_points_at_both(project):
    path = program(project)
    toml(project, "[params]\nstrength = 9\n")
    code, out, _ = run_cli(["check", path])
    assert code == 1
    assert "error[param-out-of-range]: `strength = 9` in " in out and "steer.toml is outside the range [0, 4]" in out
    assert "2 | strength = 9\n  |            - the value is given here" in out
    code, out, _ = run_cli(["check", path, "--set", "strength=2"])
    assert code == 0, out
    code, out, _ = run_cli(["check", path, "--set", "strength=5"])
    assert "`--set strength=5` is outside the range [0, 4]" in out and "<command line>" in out


def test_an_unknown_set_name_points_into_the_command_line(project, monkeypatch):
    # a relative path: the echoed line stays shorter than MAX_ECHO_COLUMNS whatever pytest's temporary folder is
    # called (pytest-123/... passed it by a character, and the line was shown as a window starting with "...")
    monkeypatch.chdir(project)
    path = os.path.relpath(program(project))
    code, out, _ = run_cli(["check", path, "--set", "strenght=2"])
    assert code == 1
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith(" --> <command line>:1:")))
    command_line, caret = lines[at + 2], lines[at + 3]
    assert command_line.startswith("1 | steerc check ") and command_line.endswith("--set strenght=2")
    assert caret.index("^") == command_line.index("strenght=2") and caret.count("^") == len("strenght=2")
    assert "did you mean `strength`?" in out


def test_a_broken_steer_toml_is_reported_once_and_its_programs_still_checked(project):
    toml(project, '[defaults]\ntraget = "vllm"\n')
    first, second = program(project, layer=1), program(project, layer=2, name="q.steer")
    code, found = diagnostics([first, second])
    assert code == 1 and found == [("invalid-config", "steer.toml", 2)]


def test_a_steer_toml_model_of_an_unknown_family_is_reported_once(project):
    cfg = json.loads((project / "models" / "tiny" / "config.json").read_text())
    (project / "models" / "tiny" / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    toml(project, '[defaults]\nmodel = "models/tiny"\n')
    code, found = diagnostics([program(project, layer=9), program(project, name="q.steer")])
    assert code == 1 and found == [("unknown-family", "config.json", 1)]  # the programs: without a model


def test_a_steer_toml_model_that_cannot_be_read_points_at_its_value(project):
    (project / "models" / "empty").mkdir()
    toml(project, '[defaults]\nmodel = "models/empty"\n')
    code, out, _ = run_cli(["check", program(project)])
    assert code == 1 and "error[invalid-config]: model " in out and "no config.json in that folder" in out
    assert '2 | model = "models/empty"\n  |         ^^^^^^^^^^^^^^' in out


def test_root_names_the_steer_toml_and_stdin_uses_the_working_directory(project, tmp_path, monkeypatch):
    toml(project, '[defaults]\nmodel = "models/tiny"\n')
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(program(project, layer=9), other / "p.steer")
    assert diagnostics([str(other / "p.steer")]) == (0, [])
    assert diagnostics([str(other / "p.steer"), "--root", str(project)]) == (1, [("layer-out-of-range", "p.steer", 7)])
    monkeypatch.chdir(project)
    code, out, _ = run_cli(["check", "--format", "json", "-"], stdin=PROGRAM.replace("LAYER", "9"))
    assert code == 1 and [d["code"] for d in json.loads(out)["diagnostics"]] == ["layer-out-of-range"]


# ------------------------------------------------------------------ the other commands


def test_explain_and_compile_take_model_and_target_from_steer_toml(project):
    path = program(project)
    code, _, err = run_cli(["explain", path])
    assert code == 2 and "--model is required (on the command line, or as `model` under [defaults]" in err
    toml(project, '[defaults]\nmodel = "models/tiny"\ntarget = "vllm"\n[params]\nstrength = 2\n')
    code, out, err = run_cli(["explain", path])
    assert code == 0, err
    assert "for target vllm" in out.splitlines()[0] and "|b| = 2.0" in out
    code, out, _ = run_cli(["explain", path, "--target", "hf", "--set", "strength=3"])
    assert "for target hf" in out.splitlines()[0] and "|b| = 3.0" in out
    outdir = project / "out"
    code, out, err = run_cli(["compile", path, "-o", str(outdir)])
    assert code == 0, err
    assert (outdir / "plan.msgpack").is_file()
    toml(project, '[defaults]\nmodel = "models/tiny"\n')
    code, _, err = run_cli(["compile", path, "-o", str(outdir)])
    assert code == 2 and "--target is required" in err


def test_explain_stops_at_a_broken_steer_toml(project):
    toml(project, '[defaults]\nmodel = "models/tiny"\ncolour = 1\n')
    code, out, err = run_cli(["explain", program(project)])
    assert code == 1 and out == ""
    assert "error[invalid-config]: [defaults] has no key `colour`" in err and "3 | colour = 1" in err


def test_run_points_at_the_steer_toml_model_without_weights(project):
    toml(project, '[defaults]\nmodel = "models/tiny"\n')
    code, _, err = run_cli(["run", program(project), "--prompt", "hi"])
    assert code == 1 and "Traceback" not in err
    assert "error[model-without-weights]" in err and "steer.toml:2:9" in err


# ------------------------------------------------------------------ the spec's examples


def _toml_examples():
    """Each ```text block of the spec that shows a steer.toml and a command: (page, toml, argv, output)."""
    import re

    here = os.path.dirname(os.path.abspath(__file__))
    for page in ("project.md", "diagnostics.md"):
        with open(os.path.join(here, "..", "spec", page), encoding="utf-8") as fh:
            text = fh.read()
        for block in re.findall(r"^```text\n(\$ cat steer\.toml\n.*?)^```$", text, re.S | re.M):
            toml_text, _, rest = block.partition("\n", )[2].partition("\n$ ")
            command, _, output = rest.partition("\n")
            yield pytest.param(toml_text + "\n", command.split()[1:], output, id=page)


@pytest.mark.parametrize("toml_text, argv, output", list(_toml_examples()))
def test_the_spec_shows_what_steerc_prints(toml_text, argv, output, examples_dir, tmp_path, monkeypatch):
    shutil.copytree(os.path.join(examples_dir, "models"), tmp_path / "models")
    shutil.copy(os.path.join(examples_dir, "01_add.steer"), tmp_path)
    shutil.copytree(os.path.join(examples_dir, "vectors"), tmp_path / "vectors")
    (tmp_path / "steer.toml").write_text(toml_text)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(argv)
    assert code == 1 and out.startswith(output), out


def test_a_deep_or_huge_steer_toml_is_limit_exceeded(project):
    toml(project, "[params]\nx = " + "[" * 70 + "]" * 70 + "\n")
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "limit-exceeded" and "more than 64 deep" in d.message and d.span.as_tuple() == (2, 69, 2, 70)
    toml(project, "[params]\nx = " + "[" * 5000 + "]" * 5000 + "\n")  # would overflow tomllib's recursion
    assert project_at(str(project)).diagnostics[0].code == "limit-exceeded"
    (project / "steer.toml").write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "limit-exceeded" and "larger than" in d.message


def test_no_steer_toml_text_makes_a_traceback(tmp_path):
    """Whatever steer.toml holds, reading it gives a Project, each diagnostic placed inside the file."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    pieces = st.sampled_from(['[defaults]', '[params]', '[x]', 'model', 'target', '"vllm"', '"models/m"', '=',
                              ' ', '\n', '"', "'", '#', '[', ']', '{', '}', ',', '.', '1', 'nan', 'true', 'é😀',
                              'strength', '"a\\"b"', "'''", '"""', '\\', '\t', '\r\n', '1979-05-27'])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(pieces, max_size=40).map("".join))
    def run(text):
        (tmp_path / "steer.toml").write_text(text, encoding="utf-8", newline="")
        p = project_at(str(tmp_path))
        for d in p.diagnostics:
            assert d.code in ("invalid-config", "limit-exceeded") and d.span is not None
            assert 0 <= d.span.start <= d.span.end <= len(p.source.text)

    run()


@pytest.mark.parametrize("digits", [40, 401, 4301, 5001, 100_000])
@pytest.mark.parametrize("command", [["check"], ["check", "--format", "json"], ["compile", "--target", "vllm"]])
def test_a_huge_integer_in_steer_toml_is_a_diagnostic(project, tmp_path, digits, command):
    """A 401-digit param made `float()` overflow, a 5,001-digit one hit Python's int-string limit inside tomllib;
    past float32 (40 digits) a param cannot reach the model."""
    toml(project, f"[params]\nstrength = {'9' * digits}\n")
    path = program(project)
    if command[0] == "compile":
        command = [*command, "-o", str(tmp_path / "out")]
    code, out, err = run_cli([*command, path, "--model", str(project / "models" / "tiny")])
    assert "Traceback" not in err and code == 1, err
    shown = out + err
    if digits > 100:
        assert "limit-exceeded" in shown and "longer than 100 characters" in shown
    else:
        assert "invalid-config" in shown and "does not fit float32" in shown
    (d,) = project_at(str(project)).diagnostics
    assert d.span.as_tuple()[:2] == (2, 12) and d.span.end - d.span.start == (digits if digits > 100 else digits)


@pytest.mark.parametrize("value", ["1e39", "-3.5e38", "340282350000000000000000000000000000001"])
def test_a_param_past_float32_points_at_its_value(project, value):
    toml(project, f"[params]\nstrength = {value}\n")
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "invalid-config" and "float32" in d.message and d.span.as_tuple() == (2, 12, 2, 12 + len(value))
    toml(project, "[params]\nstrength = 3.4e38\n")
    assert project_at(str(project)).diagnostics == ()


def test_a_reader_failure_that_is_not_a_syntax_error_is_still_a_diagnostic(project, monkeypatch):
    """Any other ValueError from the TOML reader (Python's int-string limit is one) is invalid-config, not a
    traceback."""
    import steerc.project as project_module

    def refuse(text):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr(project_module.tomllib, "loads", refuse)
    toml(project, "[params]\nstrength = 2\n")
    (d,) = project_at(str(project)).diagnostics
    assert d.code == "invalid-config" and "cannot be read: Exceeds the limit" in d.message
    assert d.span.as_tuple() == (1, 1, 1, 2)
