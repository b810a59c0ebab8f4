"""What an artifact says about how it was made is a command to paste: every word a safe shell literal (issue 32 #18).

Before, the "Made by:" line of an emitted HF package (and the export target's ``steer.json`` ``command``)
quoted only words *without* spaces, so a file named ``x $(touch PWNED) .steer`` gave a line that ran
``touch PWNED`` when pasted into a shell.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess

import pytest

from tests.support import examples_path, run_cli

HOSTILE_NAMES = ["x $(touch PWNED) .steer", "a `touch PWNED`.steer", "b'; touch PWNED; echo '.steer",
                 'c" && touch PWNED && "d.steer', "e\ntouch PWNED\n.steer"]


def _project(tmp_path, name: str) -> str:
    for part in ("vectors", "steer.toml"):
        src = os.path.join(examples_path(), part)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, tmp_path / part)
    shutil.copy(os.path.join(examples_path(), "01_add.steer"), tmp_path / name)
    return str(tmp_path / name)


def _made_by(package: str) -> str:
    with open(os.path.join(package, "__init__.py"), encoding="ascii") as fh:
        doc = ast.get_docstring(ast.parse(fh.read()), clean=False)
    return doc.split("\nMade by: ", 1)[1].split("\n\nUse: ", 1)[0]  # a quoted word may hold a line end


def _pasted(command: str, cwd) -> list[str]:
    """The words a POSIX shell gives ``command`` when it is pasted, with ``steerc`` replaced by a printer."""
    assert command.startswith("steerc ")
    out = subprocess.run(["sh", "-c", "printf '%s\\0' " + command[len("steerc "):]], cwd=cwd, capture_output=True,
                         check=True)
    return out.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_the_made_by_line_runs_nothing_when_pasted(name, tmp_path, monkeypatch):
    program = _project(tmp_path, name)
    monkeypatch.chdir(tmp_path)
    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, _, err = run_cli(["compile", name, "--model", model, "--target", "hf", "-o", "pkg"])
    assert code == 0, err
    command = _made_by(str(tmp_path / "pkg"))
    words = _pasted(command, tmp_path)
    assert not (tmp_path / "PWNED").exists()
    assert words == ["compile", os.path.basename(program), "--target", "hf"]


def test_set_values_are_quoted_words_too(tmp_path):
    import argparse

    from steerc.cli.compile import _command

    args = argparse.Namespace(file="p.steer", target="hf", dialect="steerc",
                              overrides=["strength=$(touch PWNED)", "a b=1"])
    command = _command(args)
    assert _pasted(command, tmp_path) == ["compile", "p.steer", "--target", "hf", "--set", "strength=$(touch PWNED)",
                                          "--set", "a b=1"]
    assert not (tmp_path / "PWNED").exists()
    plain = argparse.Namespace(file="d/p.steer", target="vllm", dialect="steerc", overrides=["strength=6"])
    assert _command(plain) == "steerc compile p.steer --target vllm --set strength=6"  # plain words stay as they were


def test_importing_an_emitted_package_leaves_no_bytecode_in_it(tmp_path, monkeypatch):
    """The export target imports the hf package it writes (to install it on the model it exports); that import
    left ``hooks/__pycache__`` (compiled bytecode, different on each Python) in the output folder."""
    import sys

    from hf_util import load_emitted

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as a plain `python -m steerc` runs
    monkeypatch.chdir(tmp_path)
    _project(tmp_path, "p.steer")
    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, _, err = run_cli(["compile", "p.steer", "--model", model, "--target", "hf", "-o", "pkg"])
    assert code == 0, err
    before = sorted(os.listdir(tmp_path / "pkg"))
    load_emitted(str(tmp_path / "pkg"), "steer_pkg_no_bytecode")
    assert sorted(os.listdir(tmp_path / "pkg")) == before and "__pycache__" not in before
    assert sys.dont_write_bytecode is False  # put back as it was
