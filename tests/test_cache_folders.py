"""The folders steerc creates for itself never shadow the installed package.

A folder named ``steerc`` in the system temp folder (or in ``~/.cache``) would be imported, as a namespace
package, by any process started there ahead of the installed (editable) steerc: ``steerc.__version__``
then fails. Every such folder is named ``steerc-<what>``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from steerc.core.paths import CACHE_NAME, importable, temp_folder

WRITE = """
import os, sys
from steerc.runtime.vllm import plan_file
from steerc.runtime.vllm.serve import ArtifactStore
from steerc.core.cache import file_sha256
print(plan_file(b"a plan"))
print(ArtifactStore().root)
probe = os.path.join(sys.argv[1], "probe.bin")
open(probe, "wb").write(b"abc")
file_sha256(probe)
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("STEERC_CACHE_DIR", "STEERC_CACHE", "STEERC_ARTIFACTS")}
    return {**env, **extra}


def test_a_process_started_where_steerc_wrote_its_folders_still_imports_steerc(tmp_path):
    tmp, xdg, data = tmp_path / "tmp", tmp_path / "xdg", tmp_path / "data"
    for d in (tmp, xdg, data):
        d.mkdir()
    env = _env(TMPDIR=str(tmp), XDG_CACHE_HOME=str(xdg))
    wrote = subprocess.run([sys.executable, "-c", WRITE, str(data)], env=env, capture_output=True, text=True)
    assert wrote.returncode == 0, wrote.stderr
    plan, store = wrote.stdout.split()
    assert os.path.dirname(plan) == str(tmp / "steerc-plans") and os.path.isfile(plan)
    assert store == str(tmp / "steerc-artifacts")
    assert os.path.isfile(xdg / CACHE_NAME / "hashes.json")
    for parent in (tmp, xdg):
        made = sorted(os.listdir(parent))
        assert made and not any(importable(name) for name in made), made
        ran = subprocess.run([sys.executable, "-c", "import steerc; print(steerc.__version__)"], cwd=parent,
                             env=env, capture_output=True, text=True)
        assert ran.returncode == 0 and ran.stdout.strip() == __import__("steerc").__version__, ran.stderr


def test_a_folder_named_steerc_would_shadow_it(tmp_path):
    """The hazard is real here (so the test above can fail): an identifier-named folder shadows steerc."""
    (tmp_path / "steerc" / "plans").mkdir(parents=True)
    ran = subprocess.run([sys.executable, "-c", "import steerc; steerc.__version__"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True)
    assert ran.returncode != 0 and "__version__" in ran.stderr


def test_folder_names_are_not_identifiers():
    assert not importable(CACHE_NAME)
    assert os.path.basename(temp_folder("plans")) == "steerc-plans"
    assert importable("steerc") and not importable("steerc-plans")
