"""Fuzzing the commands that run a model (eval, tune, capture, derive, run, compile) with hostile arguments and
data files, as issue 32's campaign did by hand.

Each input runs ``steerc`` in-process (``support.run_cli``) in a project folder of its own. The model loader is
replaced by one that raises :class:`ReachedTheModel` (a BaseException, so nothing in steerc can swallow it): an
input that gets that far was accepted, and the model's own work is not what is fuzzed here. Every other input
must end as a diagnostic or a usage error: an exit code of 1 or 2, no traceback, no raw control character on
the terminal, no temporary file left behind, nothing written outside the project, and steer.toml unchanged.
"""

from __future__ import annotations

import json
import os
import string

import pytest
from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st
from support import run_cli

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WIDTH = 64  # the tiny Llama's hidden size
VECTOR = "[" + ", ".join(f"{0.05 * ((i % 7) - 3):.2f}" for i in range(WIDTH)) + "]"
PROGRAM = (f"steer 1\nparam strength = 4.0\nprobe p {{\n  at resid_post[1]\n  read cosine({VECTOR})\n"
           f"  pool prompt.mean\n}}\nparam threshold = 0.1\nintervention push {{\n  at resid_post[1:3]\n"
           f"  add strength * {VECTOR}\n  tokens generated\n  when p > threshold\n}}\n")
ITEMS = '{"prompt": "Hi", "positive": " yes", "negative": " no"}\n{"text": "Rain falls on the town."}\n'
PAIRS = "".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in
                [("I love it", "I hate it"), ("Great day", "Awful day"), ("So happy", "So sad"), ("Wow", "Meh")])
TOML = "# shared settings\r\n[params]\nstrength = 2.0  # tuned\n"
FIXED = {"steer.toml": TOML, "p.steer": PROGRAM, "e.jsonl": ITEMS, "pairs.jsonl": PAIRS,
         "t.txt": "The sun is out.\nRain again today.\n"}


class ReachedTheModel(BaseException):
    """The input passed every check made before the model loads."""


# Values that broke something once, or look as if they might: paths, numbers, flags, control characters.
HOSTILE_WORDS = ["", "--", "-", "-1", "0", "1e12", "1e3", "nan", "inf", "-inf", "2.5", "4294967296", "9" * 30,
                 ".", "..", "/", "d", "d/", "nosuch/x.png", "x.txt", "p.png", "p", "p.steer", "e.jsonl", "steer.toml",
                 "../escape.png", "/dev/null", "\x1b]0;pwned\x07", "a b", "$(touch PWNED)", "é", "x" * 300,
                 "strength=2e38:0:2", "strength=0:8:5", "strength=1:1:1", "strength=0:1:0", "nosuch=0:1:2",
                 "strength=", "=1", "kl<=0.1", "kl<=nan", "behavior>", "behavior", "kl.low", "win_rate.high<=1",
                 "resid_post[1]", "resid_post[1:99]", "head[1, 0:9]", "resid_post[", "last", "all"]
WORDS = st.one_of(st.sampled_from(HOSTILE_WORDS), st.text(string.printable + "\x00\x1b\x07\u202e", max_size=12))

FLAGS = {
    "eval": ["--seed", "--resamples", "--plot", "--sweep", "--set", "--data", "--model", "--engine"],
    "tune": ["--seed", "--resamples", "--plot", "--sweep", "--set", "--data", "--maximize", "--minimize",
             "--subject-to"],
    "capture": ["-o", "--read", "--batch-size", "--set", "--data", "--root", "--model"],
    "derive": ["-o", "--plot", "--seed", "--heldout", "--batch-size", "--at", "--method", "--read", "--data",
               "--calibrate", "--probe", "--write"],
    "run": ["--prompt", "--max-new-tokens", "--temperature", "--top-p", "--seed", "--set", "--model"],
    "compile": ["-o", "--target", "--set", "--dialect", "--model"],
}


def _base(command: str, model: str) -> list[str]:
    """A command line that would run (and so reach the model) as it is."""
    return {
        "eval": ["eval", "p.steer", "--model", model, "--data", "e.jsonl", "--sweep", "strength=0:4:2"],
        "tune": ["tune", "p.steer", "--model", model, "--data", "e.jsonl", "--sweep", "strength=0:4:2",
                 "--maximize", "behavior", "--dry-run"],
        "capture": ["capture", "resid_post[1]", "--model", model, "--data", "t.txt", "-o", "cap.safetensors"],
        "derive": ["derive", "--model", model, "--data", "pairs.jsonl", "--at", "resid_post[1]", "-o",
                   "bank.safetensors"],
        "run": ["run", "p.steer", "--model", model, "--prompt", "Hello"],
        "compile": ["compile", "p.steer", "--model", model, "--target", "vllm", "-o", "out"],
    }[command]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-fuzz-commands"))


def _project(root) -> None:
    for name in list(os.listdir(root)):
        path = root / name
        if path.is_dir() and not path.is_symlink():
            import shutil

            shutil.rmtree(path)
        else:
            path.unlink()
    for name, text in FIXED.items():
        (root / name).write_bytes(text.encode())
    (root / "d").mkdir()


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_each_base_command_runs(command, tmp_path, monkeypatch, tiny):
    """What the fuzz starts from is a command that runs: an input it refuses was refused for what it changed."""
    monkeypatch.chdir(tmp_path)
    _project(tmp_path)
    code, _, err = run_cli(_base(command, tiny))
    assert code == 0, err


def _files(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            path = os.path.join(dirpath, n)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, root)] = fh.read()
    return out


def _outputs(argv: list[str], root, outside) -> list[str]:
    """The outputs ``argv`` names (``-o``, ``--out``, ``--plot``, either form), relative to ``outside``."""
    flags = ("-o", "--out", "--output", "--plot")
    named = [v for f, v in zip(argv, argv[1:]) if f in flags]
    named += [w.split("=", 1)[1] for w in argv if w.split("=", 1)[0] in flags and "=" in w]
    return [os.path.relpath(os.path.normpath(os.path.join(root, v)), outside) for v in named if v and "\0" not in v]


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c not in "\n\t" and (ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u202e")]


@pytest.mark.parametrize("with_model", [False, True], ids=["before-the-model", "with-the-model"])
def test_hostile_arguments_end_in_a_diagnostic(with_model, tmp_path, monkeypatch, tiny):
    """Without the model (300 inputs): every refusal comes before it loads. With the tiny model (80 inputs, each
    a real run): what a check lets through runs to its end or is refused after, never a traceback (plot paths,
    seeds and sweeps once failed after the whole run)."""
    from steerc.runtime import models

    def reached(*_, **__):
        raise ReachedTheModel

    if not with_model:
        monkeypatch.setattr(models, "load_model", reached)
        monkeypatch.setattr(models, "load_tokenizer", reached)
    name = "cli-commands-with-model" if with_model else "cli-commands"
    outside = tmp_path / "outside"
    outside.mkdir()
    root = outside / "project"
    root.mkdir()
    monkeypatch.chdir(root)

    @fuzz(80 if with_model else 300, name)
    @given(st.sampled_from(sorted(FLAGS)), st.data())
    def run(command, data):
        _project(root)
        argv = _base(command, tiny)
        for _ in range(data.draw(st.integers(0 if with_model else 1, 2 if with_model else 3))):
            flag = data.draw(st.sampled_from(FLAGS[command]))
            value = data.draw(WORDS)
            argv += [f"{flag}={value}"] if data.draw(st.booleans()) else [flag, value]
        before = set(_files(outside))
        try:
            code, out, err = run_cli(argv)
        except ReachedTheModel:
            code, out, err = None, "", ""
        assert "Traceback" not in out + err, (argv, err[-3000:])
        assert code in (None, 0, 1, 2), (argv, code, err[-2000:])
        assert not _raw_controls(err), (argv, err[-500:])
        after = _files(outside)
        assert not [n for n in after if ".tmp" in os.path.basename(n)], (argv, sorted(after))
        asked = _outputs(argv, root, outside)  # an output the command line names may be anywhere
        assert not [n for n in set(after) - before if not n.startswith("project" + os.sep)
                    and not any(n == a or n.startswith(a + os.sep) for a in asked)], (argv, sorted(after))
        assert after[os.path.join("project", "steer.toml")] == TOML.encode()  # --dry-run, and nothing else writes it
        assert not (root / "PWNED").exists() and not (outside / "PWNED").exists()
        RAN[name] += 1

    run()


_ITEM_PIECES = st.sampled_from(['{', '}', '"prompt"', '"positive"', '"negative"', '"text"', ': ', ', ', '"a"',
                                '""', '1e999', 'NaN', 'null', '[]', '\n', '\r\n', '\x1b[2J', '"\\u0000"',
                                '"\\ud800"', '\ufeff', ' ', '"x"', '"' + 'y' * 2000 + '"'])


def test_any_data_file_is_read_or_refused_with_a_line(tmp_path, monkeypatch, tiny):
    """``eval --data`` and ``derive --data`` on arbitrary JSONL: read (the model is reached) or refused with a
    diagnostic in the data file, never a traceback."""
    from steerc.runtime import models

    def reached(*_, **__):
        raise ReachedTheModel

    monkeypatch.setattr(models, "load_model", reached)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(PROGRAM)

    @fuzz(150, "cli-data-files")
    @given(st.lists(_ITEM_PIECES, max_size=40).map("".join), st.sampled_from(["eval", "derive"]))
    def run(text, command):
        (tmp_path / "items.jsonl").write_bytes(text.encode("utf-8", "surrogatepass"))
        argv = (["eval", "p.steer", "--model", tiny, "--data", "items.jsonl"] if command == "eval" else
                ["derive", "--model", tiny, "--data", "items.jsonl", "--at", "resid_post[1]", "-o", "b.safetensors"])
        try:
            code, out, err = run_cli(argv)
        except ReachedTheModel:
            RAN["cli-data-files"] += 1
            return
        assert "Traceback" not in out + err, err[-3000:]
        assert code in (1, 2), (code, err[-2000:])
        assert not _raw_controls(err), err[-500:]
        RAN["cli-data-files"] += 1

    run()


def test_a_refusal_from_below_the_command_is_its_diagnostics(monkeypatch):
    """A :class:`~steerc.diagnostics.Refusal` raised under a command (a kernel the HF hooks cannot lower, from
    ``steerc run``) is printed as its diagnostics with exit 1, not a traceback."""
    from steerc.cli import check
    from steerc.diagnostics import Diagnostic, Refusal

    def refuse(args):
        raise Refusal([Diagnostic.error("unsupported-by-target", "hf cannot lower `twist`", None)])

    monkeypatch.setattr(check, "run", refuse)
    code, _, err = run_cli(["check", "x.steer"])
    assert code == 1 and "error[unsupported-by-target]: hf cannot lower `twist`" in err and "Traceback" not in err


def test_a_nul_in_an_argument_is_a_usage_error():
    code, _, err = run_cli(["eval", "p.steer", "--data", "a\0b", "--model", "m"])
    assert code == 2 and "NUL" in err
