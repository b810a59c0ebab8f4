"""Hostile command lines (issue 32): paths and numbers that used to end in a traceback, often after the whole
run, or that silently did something else than asked.

Every refusal here comes before any model loads (``load_model`` is replaced by one that fails the test), is a
diagnostic under the flag's value or a one-line usage error, and leaves no file behind; the few runs that
must load a model use the tiny random Llama saved as a folder.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_project import PROGRAM, VECTOR, tiny_folder, write_project
from support import run_cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_folder(tmp_path_factory, "tiny-hostile")


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A project folder (the working folder) with a program, its data, and an empty steer.toml."""
    root = write_project(tmp_path / "project")
    monkeypatch.chdir(root)
    (root / "d").mkdir()
    return root


@pytest.fixture()
def no_model(monkeypatch):
    """Any model load fails the test: what is refused is refused before the model."""
    from steerc.runtime import models

    def load_model(*_, **__):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", load_model)


def _leftovers(root) -> list[str]:
    """Temporary files under ``root`` and its parent (``-o ''`` used to leave one in the parent)."""
    found = []
    for base in (root, root.parent):
        for dirpath, _, names in os.walk(base):
            found += [os.path.join(dirpath, n) for n in names if ".tmp" in n]
    return found


def _caret_under(err: str, value: str) -> bool:
    """Whether the diagnostic's caret line marks ``value`` in the echoed command line."""
    lines = err.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("1 | steerc "))
    start = lines[at].rindex(" " + value) + 1
    return lines[at + 1].index("^") == start and lines[at + 1].count("^") == len(value)


# ------------------------------------------------------------------ 2: capture and calibrate use steer.toml


def test_capture_steers_at_the_projects_params_as_run_and_eval_do(project, tiny):
    """issue 32 #2: with ``strength = 0`` in steer.toml the capture of a program is unsteered (it was read at the
    program's default, 4); ``--set`` wins over steer.toml, and the values are in the provenance."""
    from safetensors.numpy import load_file

    assert run_cli(["capture", "resid_post[1:3]", "--model", tiny, "--data", "t.txt", "-o", "plain.safetensors"])[0] == 0
    (project / "steer.toml").write_text("[params]\nstrength = 0\n")
    code, out, err = run_cli(["capture", "p.steer", "--model", tiny, "--data", "t.txt", "-o", "zero.safetensors",
                              "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["program"]["params"] == {"strength": 0.0}
    plain, zero = load_file("plain.safetensors"), load_file("zero.safetensors")
    for key in ("resid_post.1", "resid_post.2"):
        np.testing.assert_array_equal(zero[key], plain[key])
    code, _, err = run_cli(["capture", "p.steer", "--model", tiny, "--data", "t.txt", "-o", "two.safetensors",
                            "--set", "strength=2"])
    assert code == 0, err
    assert np.abs(load_file("two.safetensors")["resid_post.2"] - plain["resid_post.2"]).max() > 0.05
    code, _, err = run_cli(["capture", "resid_post[1]", "--model", tiny, "--data", "t.txt", "-o", "x.safetensors",
                            "--set", "strength=2"])
    assert code == 2 and "--set goes with a .steer program" in err


def test_calibrate_reads_the_probe_at_the_projects_params(project, tiny):
    """issue 32 #2: ``derive --calibrate`` steers at steer.toml's params: with ``strength = 0`` there the probe
    reads what it reads in the same program whose default is 0 (it was read at the default, 4)."""
    probe = f"probe p {{\n  at resid_post[3]\n  read dot({VECTOR})\n  pool token\n}}\n"
    (project / "pos.txt").write_text("I love it\nGreat day\nSo happy\n")
    (project / "neg.txt").write_text("I hate it\nAwful day\nSo sad\n")
    (project / "cast.steer").write_text(PROGRAM + probe)
    (project / "zero").mkdir()
    (project / "zero" / "steer.toml").write_text("")
    (project / "zero" / "cast.steer").write_text(PROGRAM.replace("4.0", "0.0") + probe)

    def report(program: str) -> dict:
        code, out, err = run_cli(["derive", "--model", tiny, "--positive", "pos.txt", "--negative", "neg.txt",
                                  "--calibrate", program, "--probe", "p", "--format", "json"])
        assert code == 0, err
        return json.loads(out)

    default = report("cast.steer")
    (project / "steer.toml").write_text("[params]\nstrength = 0\n")
    assert report("cast.steer") == report("zero/cast.steer") != default


# --------------------------------------------------------------------------------------- 10: --plot paths


@pytest.mark.parametrize("plot, says", [
    ("p.txt", "matplotlib does not write .txt files"),
    ("e.jsonl", "matplotlib does not write .jsonl files"),
    ("t.txt/p.png", "t.txt is a file, not a folder"),
    ("d", "d is a folder, not a file"),
    ("", "an empty path names no file"),
])
@pytest.mark.parametrize("command", ["eval", "tune", "derive"])
def test_a_plot_that_cannot_be_written_is_refused_before_the_run(project, no_model, command, plot, says):
    """issue 32 #10: ``--plot`` used to fail after every point was scored (a traceback, no table)."""
    pytest.importorskip("matplotlib")
    argv = {"eval": ["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl"],
            "tune": ["tune", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep", "strength=0:4:2",
                     "--maximize", "behavior"],
            "derive": ["derive", "--model", "smollm2", "--data", "pairs.jsonl", "--at", "resid_post[1]",
                       "-o", "v.safetensors"]}[command]
    code, out, err = run_cli([*argv, "--plot", plot])
    assert code == 1 and "error[invalid-value]: --plot: " + says in err, err
    assert _caret_under(err, plot or "''") and out == ""
    assert not os.path.exists(project / "v.safetensors") and _leftovers(project) == []


def test_a_plot_format_matplotlib_cannot_write_here_is_refused(project, no_model, monkeypatch):
    """issue 32 #10: a format matplotlib lists but cannot write here (pgf without LaTeX) is found by drawing a
    small figure first, not by failing after the run."""
    pytest.importorskip("matplotlib")
    from steerc.eval import report

    monkeypatch.setattr(report, "try_format", lambda fmt: "RuntimeError: 'xelatex' not found" if fmt == "pgf" else None)
    code, _, err = run_cli(["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--plot", "p.pgf"])
    assert code == 1 and "matplotlib cannot write .pgf here: RuntimeError: 'xelatex' not found" in err


def test_a_plot_without_extension_is_written_and_named_as_a_png(project, tiny):
    """issue 32 #10: ``--plot NAME`` wrote ``NAME.png`` and printed ``NAME``; missing folders are made, as
    ``-o``'s are, and other formats are written in their own format."""
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(["eval", "p.steer", "--model", tiny, "--data", "e.jsonl", "--resamples", "10",
                              "--plot", "plots/behaviour"])
    assert code == 0, err
    assert out.splitlines()[-1] == "plot: plots/behaviour.png"
    assert (project / "plots" / "behaviour.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (project / "plots" / "behaviour").exists()
    code, out, err = run_cli(["derive", "--model", tiny, "--data", "pairs.jsonl", "--at", "resid_post[1:3]",
                              "--heldout", "0.5", "-o", "v.safetensors", "--plot", "layers.svg", "--no-cache"])
    assert code == 0, err
    assert "plot: layers.svg" in out and (project / "layers.svg").read_text().lstrip().startswith("<?xml")
    assert _leftovers(project) == []


def test_every_format_is_written_and_png_svg_pdf_are_the_same_bytes_each_time(tmp_path):
    """issue 32 #10: svg and the raster formats failed on png's metadata after the run; a figure is now the
    same bytes each time in png, svg and pdf."""
    pytest.importorskip("matplotlib")
    from steerc.derive.report import plot

    scores = {"mean_diff": {"1": 0.5, "2": 1.0}}
    for fmt in ("png", "svg", "pdf", "jpg", "eps"):
        a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
        plot(str(a), scores, [1, 2], "resid_post", "t")
        plot(str(b), scores, [1, 2], "resid_post", "t")
        assert a.stat().st_size > 0
        if fmt in ("png", "svg", "pdf"):
            assert a.read_bytes() == b.read_bytes(), fmt
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []


# ------------------------------------------------------------------------------------------- 11: -o paths


@pytest.mark.parametrize("out, says", [
    ("d", "d is a folder, not a file"),
    ("d/", "d/ names a folder, not a file"),
    ("t.txt/x.safetensors", "t.txt is a file, not a folder"),
    ("", "an empty path names no file"),
    ("t.txt", "t.txt is this command's input"),
    ("./p.steer", "./p.steer is this command's input p.steer"),
])
def test_capture_refuses_an_output_it_cannot_write_before_the_model(project, no_model, out, says):
    """issue 32 #11: ``capture -o DIR``, ``-o FILE/x`` and ``-o ''`` were tracebacks after the run, leaving a
    ``.tmp-*`` file (for ``-o ''`` in the parent folder); ``-o`` on an input destroyed it."""
    before = (project / "t.txt").read_bytes()
    code, stdout, err = run_cli(["capture", "p.steer", "--model", "smollm2", "--data", "t.txt", "-o", out])
    assert code == 1 and "error[invalid-value]: -o: " + says in err, err
    assert _caret_under(err, out or "''") and stdout == ""
    assert (project / "t.txt").read_bytes() == before and _leftovers(project) == []


@pytest.mark.parametrize("out, says", [
    ("d", "d is a folder, not a file"),
    ("t.txt/v.safetensors", "t.txt is a file, not a folder"),
    ("", "an empty path names no file"),
    ("pairs.jsonl", "pairs.jsonl is this command's input"),
])
def test_derive_refuses_an_output_it_cannot_write_before_the_model(project, no_model, out, says):
    """issue 32 #11: the same for ``derive -o`` (and ``--output``)."""
    for flag in ("-o", "--output"):
        code, _, err = run_cli(["derive", "--model", "smollm2", "--data", "pairs.jsonl", "--at", "resid_post[1]",
                                flag, out])
        assert code == 1 and f"error[invalid-value]: -o: {says}" in err, err
        assert _caret_under(err, out or "''")
    assert _leftovers(project) == []


def test_a_write_that_fails_after_the_run_is_an_error_and_leaves_no_temporary_file(project, tiny, monkeypatch):
    """issue 32 #11: what no check can see before the run (here a rename that fails as on a full disk) is one
    line, not a traceback, and the temporary file is removed."""
    real = os.replace

    def failing(src, dst, *a, **k):
        if str(dst).endswith("acts.safetensors"):
            raise OSError(28, "No space left on device")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", failing)
    code, _, err = run_cli(["capture", "resid_post[1]", "--model", tiny, "--data", "t.txt", "-o", "acts.safetensors"])
    assert code == 2 and "cannot write acts.safetensors: No space left on device" in err
    assert not (project / "acts.safetensors").exists() and _leftovers(project) == []


# ---------------------------------------------------------------------------------------- 12: --seed


@pytest.mark.parametrize("argv", [
    ["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl"],
    ["derive", "--model", "smollm2", "--data", "pairs.jsonl", "--at", "resid_post[1]", "-o", "v.safetensors",
     "--heldout", "0.5"],
])
@pytest.mark.parametrize("seed", ["-1", "4294967296", "1.5", "x"])
def test_a_seed_out_of_range_is_a_usage_error_before_the_model(project, no_model, argv, seed):
    """issue 32 #12: ``--seed -1`` was a numpy traceback after the model ran; seeds are 0 to 2**32 - 1."""
    code, _, err = run_cli([*argv, "--seed", seed])
    assert code == 2 and "argument --seed: a seed is an integer from 0 to 4294967295, not" in err, err
    assert not os.path.exists(project / "v.safetensors")


def test_the_largest_seed_is_taken():
    from steerc.cli.arguments import seed
    from steerc.eval.metrics import estimate

    assert estimate(lambda r: r[:, 0].mean(), [[1.0], [2.0], [4.0]], resamples=50, seed=seed("4294967295"))["n"] == 3


# ----------------------------------------------------------------------------------------- 13: --flag=--


@pytest.mark.parametrize("argv, flag", [
    (["eval", "p.steer", "--model", "m", "--data=--"], "--data"),
    (["eval", "p.steer", "--model=--", "--data", "e.jsonl"], "--model"),
    (["eval", "p.steer", "--model", "m", "--data", "e.jsonl", "--sweep=--"], "--sweep"),
    (["tune", "p.steer", "--model", "m", "--data", "e.jsonl", "--sweep", "strength=0:1:2", "--maximize=--"],
     "--maximize"),
    (["check", "p.steer", "--model=--"], "--model"),
    (["compile", "p.steer", "--model", "m", "--target", "hf", "-o--"], "-o"),
    (["capture", "resid_post[1]", "--model", "m", "--data", "t.txt", "-o=--"], "-o"),
    (["run", "p.steer", "--set=--"], "--set"),
])
def test_a_double_dash_glued_to_a_flag_is_a_usage_error_naming_it(project, argv, flag):
    """issue 32 #13: argparse turned ``--data=--`` into an empty list (tracebacks; ``check --model=--`` exited 0
    having checked against no model)."""
    code, out, err = run_cli(argv)
    assert code == 2 and out == ""
    assert err == f"steerc {argv[0]}: error: argument {flag}: '--' is not a value (it ends the options; a file " \
                  "named -- is ./--)\n"


def test_a_bare_double_dash_still_ends_the_options(project):
    (project / "-x.steer").write_text("steer 1\n")
    code, out, _ = run_cli(["check", "--", "-x.steer"])
    assert code == 0 and "1 file checked: 0 errors" in out


# -------------------------------------------------------------------------------------- 14: --resamples


@pytest.mark.parametrize("value, says", [
    ("1e12", "at most 100000 resamples"),
    ("100001", "at most 100000 resamples"),
    ("9" * 5000, "at most 100000 resamples"),
    ("0", "a whole number of resamples from 1 to 100000, not 0"),
    ("-3", "a whole number of resamples from 1 to 100000, not -3"),
    ("2.5", "a whole number of resamples from 1 to 100000, not 2.5"),
    ("nan", "a whole number of resamples from 1 to 100000, not nan"),
    ("lots", "a whole number of resamples from 1 to 100000, not 'lots'"),
])
def test_resamples_out_of_bounds_are_a_usage_error_before_the_model(project, no_model, value, says):
    """issue 32 #14: ``--resamples 1e8`` ran for hours and 1e12 asked for 14.6 TiB (a big integer is what
    argparse passed); every form is now a usage error."""
    for command in (["eval", "p.steer"], ["tune", "p.steer", "--sweep", "strength=0:1:2", "--maximize", "behavior"]):
        code, _, err = run_cli([*command, "--model", "smollm2", "--data", "e.jsonl", "--resamples", value])
        assert code == 2 and "argument --resamples: " + says in err, err


def test_resamples_in_exponent_form_are_taken():
    from steerc.cli.arguments import resamples

    assert resamples("1e4") == 10000 and resamples("100000") == 100000 and resamples(" 7 ") == 7


def test_the_bootstrap_draws_in_bounded_chunks_and_gives_the_same_interval(monkeypatch):
    """issue 32 #14: the resamples are drawn a bounded number of indices at a time (memory stays small at
    100,000 resamples of 100,000 items), the same stream as one draw: the same interval, bit for bit."""
    from steerc.eval import metrics as M

    rows = np.random.default_rng(1).normal(size=(37, 1))
    whole = M.estimate(lambda r: r[:, 0].mean(), rows, resamples=500, seed=3)
    monkeypatch.setattr(M, "PICKS_PER_DRAW", 100)  # two resamples of 37 items a draw
    assert M.estimate(lambda r: r[:, 0].mean(), rows, resamples=500, seed=3) == whole


# ------------------------------------------------------------------------------- compile's output folder


def _compile(program: str, out: str, target: str = "hf", *extra: str):
    model = os.path.join(os.path.dirname(__file__), "fixtures", "examples", "models", "tiny-llama")
    return run_cli(["compile", program, "--model", model, "--target", target, "-o", out, *extra])


PER_REQUEST = PROGRAM.replace("param strength = 4.0", "param strength = 4.0 per request")


def test_a_reused_output_folder_keeps_no_stale_file_and_every_file_of_the_user(project):
    """issue 32: a compile into a folder an earlier compile wrote removes that compile's files it does not
    write again (an old ``_params.py``), keeps the user's files and any steerc file the user changed."""
    (project / "pr.steer").write_text(PER_REQUEST)
    code, _, err = _compile("pr.steer", "out")
    assert code == 0, err
    assert (project / "out" / "_params.py").is_file() and (project / "out" / ".steerc-output.json").is_file()
    (project / "out" / "notes.txt").write_text("mine")
    code, _, err = _compile("p.steer", "out")
    assert code == 0, err
    assert sorted(os.listdir(project / "out")) == [".steerc-output.json", "__init__.py", "_hooks.py", "_support.py",
                                                   "notes.txt", "tensors.safetensors"]
    assert (project / "out" / "notes.txt").read_text() == "mine"
    # from hf to serve and back: the other target's files go, folders and all
    assert _compile("p.steer", "out", "serve", "--no-xgrammar")[0] == 0
    assert sorted(os.listdir(project / "out")) == [".steerc-output.json", "artifacts", "notes.txt", "plan.json"]
    (project / "out" / "plan.json").write_text("{}\n")  # the user changed a file steerc wrote: it is theirs now
    code, _, err = _compile("p.steer", "out")
    assert code == 0, err
    assert sorted(os.listdir(project / "out")) == [".steerc-output.json", "__init__.py", "_hooks.py", "_support.py",
                                                   "notes.txt", "plan.json", "tensors.safetensors"]
    assert "note: kept out/plan.json: an earlier compile wrote it and it has changed since" in err


def test_a_folder_steerc_did_not_write_is_refused_and_a_hostile_manifest_reaches_nothing(project):
    """issue 32: a compile never overwrites a folder of the user's files; a manifest naming paths outside its
    folder removes nothing there."""
    (project / "mine").mkdir()
    (project / "mine" / "__init__.py").write_text("# the user's own\n")
    code, _, err = _compile("p.steer", "mine")
    assert code == 1 and "error[invalid-value]: -o: mine holds files steerc did not write (__init__.py)" in err
    assert _caret_under(err, "mine")
    assert (project / "mine" / "__init__.py").read_text() == "# the user's own\n"
    (project / "victim.txt").write_text("keep me")
    import hashlib

    digest = hashlib.sha256(b"keep me").hexdigest()
    (project / "evil").mkdir()
    (project / "evil" / ".steerc-output.json").write_text(json.dumps(
        {"format": "steerc.output/1", "files": {"../victim.txt": digest, "/etc/hostname": digest}}))
    assert _compile("p.steer", "evil")[0] == 0
    assert (project / "victim.txt").read_text() == "keep me"


@pytest.mark.parametrize("out, says", [("", "an empty path names no folder"), ("t.txt", "t.txt is a file, not a folder"),
                                       ("t.txt/sub", "t.txt is a file, not a folder")])
def test_compile_refuses_an_output_folder_it_cannot_write(project, out, says):
    """issue 32: ``-o ''`` or a file was a traceback or an OSError after the program was checked."""
    code, _, err = _compile("p.steer", out)
    assert code == 1 and f"error[invalid-value]: -o: {says}" in err, err
    assert _leftovers(project) == []


def test_compile_errors_end_with_the_summary_line_check_prints(project):
    """issue 32: compile's errors ended without ``check``'s summary line."""
    (project / "bad.steer").write_text("steer 1\nintervention x {\n  at resid_post[99]\n  scale 2\n}\n")
    code, out, err = _compile("bad.steer", "out")
    assert code == 1 and out == ""
    assert err.rstrip("\n").splitlines()[-1] == "1 file checked: 1 error, 0 warnings"
    assert not (project / "out").exists()


# --------------------------------------------------------------------------------------------------- --help


def test_help_lists_every_compile_target_of_the_registry():
    """issue 32: ``steerc --help`` listed the targets from a hand-written string, without ``export``."""
    from steerc.targets.registry import TARGET_NAMES

    code, out, _ = run_cli(["--help"])
    flat = " ".join(out.split())
    assert code == 0 and f"compile a program for a target ({', '.join(TARGET_NAMES)})" in flat
    assert "export" in TARGET_NAMES
    code, out, _ = run_cli(["compile", "--help"])
    assert f"compile a program for a target ({', '.join(TARGET_NAMES)})" in " ".join(out.split())
