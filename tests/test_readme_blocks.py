"""The README's blocks. Its mistakes, run as written: each `(cd DIR && ../../../dev steerc ARGS)` line in a ```sh block
is run in DIR (in-process, as `./dev steerc` would run it there), and what it prints is the ```text block
that follows, line for line. DIR is a folder the clone ships (tests/fixtures/examples), so the commands
work on a bare clone."""

from __future__ import annotations

import os
import re
import shlex

import pytest
from support import REPO, run_cli

LINE = re.compile(r"^\(cd (\S+) && (?:\.\./)+dev steerc (.+)\)$")


def _shown() -> list[tuple[str, list[str], str]]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    pairs = re.findall(r"^```sh\n(.*?)^```\n\n```text\n(.*?)^```", text, re.S | re.M)
    found = []
    for commands, printed in pairs:
        for line in commands.splitlines():
            m = LINE.match(line.strip())
            if m:
                found.append((m.group(1), shlex.split(m.group(2)), printed))
    return found


def test_the_readme_shows_its_mistakes_from_the_clone():
    shown = _shown()
    assert len(shown) >= 2, "the README's mistakes are no longer shown as commands"
    for folder, _, _ in shown:
        depth = len(os.path.normpath(folder).split(os.sep))
        assert os.path.isdir(os.path.join(REPO, folder)), folder
        assert depth == 3, f"`../../../dev` reaches the clone from {folder} only at depth 3"


@pytest.mark.parametrize("folder,argv,printed", _shown(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_readme_mistake_prints_what_the_readme_shows(folder, argv, printed, monkeypatch):
    monkeypatch.chdir(os.path.join(REPO, folder))
    code, out, err = run_cli(argv)
    assert code == 1
    assert (out + err).strip("\n") == printed.strip("\n")


def test_every_readme_python_block_is_run_by_a_test():
    """A ```python block is either the Python section's script (tests/test_readme_python.py runs it on
    SmolLM2) or the steered request (tests/engine/test_serve.py runs it against the real server); each
    compiles as it stands."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text[text.index("## Using the compiler from Python"):]
    section = section[:section.index("\n## ", 3)]
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    assert blocks
    for code in blocks:
        compile(code, "README.md", "exec")
        assert code in section or "request_fields(" in code, code[:200]
