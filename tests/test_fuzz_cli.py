"""Fuzzing the command line's inputs (steer.toml contents, globs over link loops, line ends by every path a
program comes) and the language server's wire (frames, renames).

Each input runs through the real entry points: ``steerc check`` in-process (``support.run_cli``), the API,
and a real ``steerc lsp`` process over its standard input and output.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st
from lsp_client import REPO, Client
from strategies import commented, programs
from support import run_cli

from steerc.frontend.fmt import format_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ------------------------------------------------------------------ line ends


def _positions(diagnostics: list[dict], name: str) -> list[tuple]:
    """(code, line, column, end line, end column) of each JSON diagnostic in the file ``name``."""
    return sorted((d["code"], d["line"], d["column"], d["end_line"], d["end_column"])
                  for d in diagnostics if d["file"] == name)


def _api_positions(result) -> list[tuple]:
    return sorted((d.code, d.span.line, d.span.column, d.span.end_line, d.span.end_column)
                  for d in result.diagnostics if d.span is not None and d.span.file == result.source.name)


def _lsp_positions(items: list[dict]) -> list[tuple]:
    """LSP diagnostics (utf-32: code points, as steerc counts columns) as 1-based positions."""
    return sorted((d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1,
                   d["range"]["end"]["line"] + 1, d["range"]["end"]["character"] + 1) for d in items)


def _check_stdin(stdin) -> list[tuple]:
    old = sys.stdin
    sys.stdin = stdin
    try:
        code, out, err = run_cli(["check", "--format", "json", "-"])
    finally:
        sys.stdin = old
    assert "Traceback" not in err, err
    return _positions(json.loads(out)["diagnostics"], "<stdin>")


_ENDS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _line_ended(draw) -> bytes:
    """A random program (comments added, and often a duplicate name behind a comment), its lines ended with
    random ``\\n``, ``\\r\\n`` and ``\\r``, sometimes after a byte-order mark."""
    text, _ = draw(commented(format_program(draw(programs(max_statements=5, with_constraint=False)))))
    if draw(st.booleans()):  # one file, two programs: `# note\rparam a = 2` was inside a comment on stdin
        text += "param dup = 1 # note\nparam dup = 2\n"
    lines = text.split("\n")
    out = lines[0]
    for line in lines[1:]:
        out += draw(_ENDS) + line
    data = out.encode("utf-8")
    return (b"\xef\xbb\xbf" + data) if draw(st.integers(0, 3)) == 0 else data


@pytest.fixture(scope="module")
def lsp_utf32(tmp_path_factory):
    root = tmp_path_factory.mktemp("ends")
    client = Client(cwd=str(root))
    client.initialize(encodings=["utf-32"], root=str(root))
    yield client, root
    client.kill()


def test_the_same_bytes_are_the_same_program_by_every_path(tmp_path, monkeypatch, lsp_utf32):
    """A file, standard input (its bytes, and a text stream), the API (check_file and check_source) and the
    language server give the same diagnostics, at the same places, for the same bytes."""
    from steerc.api import check_file, check_source

    client, root = lsp_utf32
    monkeypatch.chdir(root)
    path = root / "p.steer"
    count = [0]

    @fuzz(40, "line-ends")
    @given(_line_ended())
    def run(data):
        path.write_bytes(data)
        code, out, err = run_cli(["check", "--format", "json", str(path)])
        assert "Traceback" not in err, err
        by_file = _positions(json.loads(out)["diagnostics"], str(path))
        stdin_bytes = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")  # sys.stdin: text over bytes
        assert _check_stdin(stdin_bytes) == by_file
        assert _check_stdin(io.StringIO(data.decode("utf-8"))) == by_file  # a text-only stream
        assert _api_positions(check_file(str(path))) == by_file
        text = data.decode("utf-8-sig")  # what an editor holds: the mark dropped, the line ends kept
        assert _api_positions(check_source(text, str(path))) == by_file
        count[0] += 1
        uri = (root / f"d{count[0]}.steer").as_uri()
        client.open(uri, text)
        assert _lsp_positions(client.diagnostics(uri, 1)) == by_file
        client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        RAN["line-ends"] += 1

    run()


def test_a_lone_cr_ends_a_line_on_real_standard_input(tmp_path):
    """The bytes path of a real process: `check -` and `check FILE` agree on `# note\\rparam a = 2`."""
    data = b"steer 1\nparam a = 1 # note\rparam a = 2\n"
    (tmp_path / "p.steer").write_bytes(data)
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1")
    runs = [subprocess.run([sys.executable, "-m", "steerc", "check", "--format", "json", *argv], input=data,
                           cwd=str(tmp_path), env=env, capture_output=True, timeout=120) for argv in (["-"], ["p.steer"])]
    found = [[(d["code"], d["line"], d["column"]) for d in json.loads(r.stdout)["diagnostics"]] for r in runs]
    assert found[0] == found[1] and ("duplicate-name", 3, 7) in found[0], found
    parsed = subprocess.run([sys.executable, "-m", "steerc", "fmt", "-"], input=b"\xef\xbb\xbf" + data,
                            cwd=str(tmp_path), env=env, capture_output=True, timeout=120)
    assert parsed.returncode == 0 and parsed.stdout == b"steer 1\n\nparam a = 1  # note\nparam a = 2\n"
