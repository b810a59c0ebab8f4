"""The compiler core stays light: checking never imports torch, transformers, xgrammar or vllm, nor the
language server's pygls and lsprotocol (the `lsp` extra, imported by `steerc lsp` alone), nor pygments (the
`highlight` extra)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "xgrammar", "vllm", "pygls", "lsprotocol", "pygments")
PROBE = (
    "import sys; from steerc.cli import main; rc = main({argv!r}); "
    "print(sorted(m for m in {heavy!r} if m in sys.modules))"
)


def run_python(code: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_import_steerc_is_light(tmp_path):
    proc = run_python(f"import sys, steerc; print(sorted(m for m in {HEAVY!r} if m in sys.modules))", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("program", ["01_add.steer", "06_heads.steer"])
@pytest.mark.parametrize("model", [None, "models/tiny-llama", "models/tiny-gpt2"])
def test_check_imports_nothing_heavy(program, model, examples_dir):
    argv = ["check", program] + (["--model", model] if model else [])
    proc = run_python(PROBE.format(argv=argv, heavy=HEAVY), examples_dir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "[]", proc.stdout
    assert "0 errors" in proc.stdout


def test_fmt_and_parse_import_nothing_heavy(examples_dir):
    code = (
        "import sys, io, contextlib; from steerc.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['fmt', '--check', '05_ops_and_scopes.steer']); main(['parse', '12_per_token_gate.steer'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = run_python(code, examples_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
