"""Compiled artifacts get the mode ``open`` would give them under the user's umask (``0o644`` under ``022``), not
the owner-only ``0o600`` of the temporary files they are written through: a model folder from ``--target
weights`` or a plan from ``--target vllm`` is read by servers that may run as another user."""

from __future__ import annotations

import os
import stat

import pytest
from support import run_cli

from steerc.core.paths import new_file_mode, write_atomically

PROGRAM = "steer 1\nintervention damp {\n  at  mlp_out[1]\n  scale 0.5\n}\n"


@pytest.fixture
def umask():
    """Set a umask for the test, and put the process's own back after it."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_write_atomically_gives_the_umask_mode(tmp_path, umask, mask, mode):
    umask(mask)
    assert new_file_mode() == mode
    write_atomically(str(tmp_path / "a" / "f.bin"), b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "f.bin").st_mode) == mode
    assert os.listdir(tmp_path / "a") == ["f.bin"]


@pytest.mark.parametrize("target", ["weights", "vllm", "hf"])
def test_every_file_a_compile_writes_is_readable_as_open_makes_it(tmp_path, umask, monkeypatch, target):
    from tiny_models import save_tiny_llama

    save_tiny_llama(tmp_path / "model")
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    umask(0o022)
    code, _, err = run_cli(["compile", "p.steer", "--model", "model", "--target", target, "-o", "out"])
    assert code == 0, err
    files = [os.path.join(d, f) for d, _, names in os.walk(tmp_path / "out") for f in names]
    assert files and {oct(stat.S_IMODE(os.stat(f).st_mode)) for f in files} == {oct(0o644)}, files
