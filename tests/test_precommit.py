"""The hooks of ``.pre-commit-hooks.yaml``, run by the real ``pre-commit`` as a user's repository runs them.

``pre-commit try-repo`` installs steerc from a copy of this working tree
(committed into a temporary git repository, so uncommitted and untracked
files count) into a fresh virtual environment, with steerc's plain
dependencies from the package index, then runs both hooks on a user's
repository. The test is slow (the environment is built each time, about a
minute) and needs the index; it skips only when pre-commit is not
installed, and fails instead under ``CI=true`` (pre-commit is in the
``test`` extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.slow

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
MODEL = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
         "tie_word_embeddings": False}
GOOD = "steer 1\n\nparam strength = 2\n\nintervention push {\n  at    resid_post[1]\n  scale strength\n}\n"
DEEP = GOOD.replace("resid_post[1]", "resid_post[9]")  # wrong only against the model steer.toml names
MESSY = GOOD.replace("  at    resid_post[1]", "  at resid_post[1]  ").replace("push {", "push{")


def _pre_commit() -> list[str]:
    if importlib.util.find_spec("pre_commit") is not None:
        return [sys.executable, "-m", "pre_commit"]
    if shutil.which("pre-commit"):
        return ["pre-commit"]
    if os.environ.get("CI") == "true":
        pytest.fail("pre-commit is not installed (it is in steerc's `test` extra)")
    pytest.skip("pre-commit is not installed")


def _git(cwd, *args) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


def _hooks_repo(path) -> str:
    """This working tree's package and hooks, committed in a git repository of their own."""
    path.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy(os.path.join(REPO, name), path / name)
    shutil.copytree(os.path.join(REPO, "steerc"), path / "steerc", ignore=ignore)
    _git(path, "init", "-q")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "steerc")
    return str(path)


def test_both_hooks_run_on_the_staged_programs(tmp_path):
    pre_commit = _pre_commit()
    hooks = _hooks_repo(tmp_path / "hooks")
    user = tmp_path / "user"
    (user / "models" / "tiny").mkdir(parents=True)
    (user / "models" / "tiny" / "config.json").write_text(json.dumps(MODEL))
    (user / "steer.toml").write_text('[defaults]\nmodel = "models/tiny"\n')
    for name, text in {"good.steer": GOOD, "deep.steer": DEEP, "messy.steer": MESSY,
                       "notes.txt": "not a program\n"}.items():
        (user / name).write_text(text)
    _git(user, "init", "-q")
    _git(user, "add", ".")
    env = {**os.environ, **GIT_ENV, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([*pre_commit, "try-repo", hooks, "--files", "good.steer", "deep.steer", "messy.steer",
                           "notes.txt"], cwd=user, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    check, fmt = out.split("steerc check")[-1].split("steerc fmt")
    assert "Failed" in check and "error[layer-out-of-range]" in check and "deep.steer:6:" in check, out
    assert "3 files checked: 1 error, 0 warnings" in check and "notes.txt" not in check, out
    assert "Failed" in fmt and "files were modified by this hook" in fmt and "reformatted messy.steer" in fmt, out
    assert "good.steer" not in fmt and "deep.steer" not in fmt, out
    assert (user / "messy.steer").read_text() == GOOD  # formatted in place
    assert (user / "good.steer").read_text() == GOOD and (user / "deep.steer").read_text() == DEEP
    assert "torch" not in out
