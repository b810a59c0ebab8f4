"""``./dev``'s torch install says plainly what happened where PyTorch's CPU index cannot serve it (issue 32: a new
user read pip's "ResolutionImpossible" as a dependency conflict).

The function is taken out of ``dev`` and run under bash with a stand-in for Python (``fake_python``, named so):
it answers ``import torch`` with a failure, the CPU index with the error under test, and PyPI with success.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support import REPO

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  "-c import torch") exit 1 ;;
  *--index-url*) printf '%s\\n' "$PIP_SAYS"; exit 1 ;;
  *) exit 0 ;;
esac
"""

UNREACHABLE = ("WARNING: Retrying after connection broken by 'NewConnectionError(Failed to establish a new connection: "
               "[Errno 101] Network is unreachable)'\nERROR: Could not find a version that satisfies the requirement "
               "torch==2.13.0+cpu (from versions: none)\nERROR: ResolutionImpossible: for help visit ...")
NO_SUCH_BUILD = ("ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: "
                 "2.4.0+cpu)\nERROR: No matching distribution found for torch==2.13.0+cpu")


def _install_torch(tmp_path, pip_says: str) -> tuple[str, list[str]]:
    with open(os.path.join(REPO, "dev"), encoding="utf-8") as fh:
        function = re.search(r"^install_torch\(\) \{\n.*?^\}\n", fh.read(), re.S | re.M).group(0)
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(calls), "PIP_SAYS": pip_says}
    script = f"{function}\ninstall_torch {fake} {tmp_path / 'setup.log'}\n"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    return out.stderr, calls.read_text().splitlines()


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash")
def test_an_unreachable_index_is_called_a_network_problem(tmp_path):
    err, calls = _install_torch(tmp_path, UNREACHABLE)
    assert "could not be reached" in err and "not a dependency conflict" in err
    assert "ResolutionImpossible" not in err  # pip's words go to the log
    assert "ResolutionImpossible" in (tmp_path / "setup.log").read_text()
    assert "installing PyPI's torch==2.13.0 instead" in err
    assert calls[-1].endswith("torch==2.13.0")  # and PyPI's build was installed


def test_an_index_without_the_build_says_so(tmp_path):
    err, _ = _install_torch(tmp_path, NO_SUCH_BUILD)
    assert "offered no torch==2.13.0+cpu" in err and "could not be reached" not in err
