"""A Hugging Face id as ``--model`` is told that steerc reads local folders and how to get one (issue 32: a new
user got only "no such file or folder")."""

from __future__ import annotations

import os

import pytest

from tests.support import examples_path, run_cli


@pytest.mark.parametrize("command", [["check"], ["explain"], ["compile", "--target", "vllm", "-o", "out"]])
def test_a_hub_id_gets_the_download_hint(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program = os.path.join(examples_path(), "01_add.steer")
    code, _, err = run_cli([command[0], program, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", *command[1:]])
    assert code in (1, 2)
    assert "steerc downloads nothing" in err
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir models/SmolLM2-135M-Instruct" in err


def test_a_local_path_that_is_missing_gets_no_hub_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    program = os.path.join(examples_path(), "01_add.steer")
    code, _, err = run_cli(["check", program, "--model", "models/nothing-here"])
    assert code in (1, 2)
    assert "no such file or folder" in err and "hf download" not in err


def test_run_gets_the_hint_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program = os.path.join(examples_path(), "01_add.steer")
    code, _, err = run_cli(["run", program, "--model", "meta-llama/Llama-3.1-8B", "--prompt", "hi"])
    assert code in (1, 2) and "hf download meta-llama/Llama-3.1-8B" in err
