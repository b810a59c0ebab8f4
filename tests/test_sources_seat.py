"""The seats for vector sources and built-in functions (issue 33, item 5).

A kind of vector file is one entry of ``steerc.io.vectors.READERS``; the
built-in functions are one table, ``steerc.ir.builtins.BUILTINS``. These tests
hold every user to those tables: a reader registered in a test (no steerc
module edited) is used by ``load`` in a program through check and fold, every
extension has a reader, and the checker, the highlighters and the language
server's completion name exactly the table's functions.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from steerc.api import Options, check_source
from steerc.io import vectors as vectorio
from steerc.io.vectorfile import TensorInfo, VectorFile, VectorFileError
from steerc.ir.builtins import BUILTINS, FUNCTIONS


def _open_testvec(path: str) -> VectorFile:
    """A test-only format: one ``name: x y z ...`` line per vector."""
    rows = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                name, _, numbers = line.partition(":")
                rows[name.strip()] = np.array([float(x) for x in numbers.split()], dtype=np.float32)
    tensors = {name: TensorInfo(name, "float32", row.shape) for name, row in rows.items()}
    return VectorFile(path, "testvec", tensors, lambda name: rows[name])


@pytest.fixture
def testvec(monkeypatch):
    reader = vectorio.Reader("testvec", (".testvec",), _open_testvec, "test-only text vectors", "a .testvec file")
    monkeypatch.setitem(vectorio.READERS, "testvec", reader)
    return reader


def _check(text: str, folder) -> object:
    path = os.path.join(str(folder), "prog.steer")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return check_source(text, "prog.steer", path=path, options=Options())


def test_a_registered_reader_is_loaded_checked_and_folded(tmp_path, testvec):
    """issue 33: a new source is one entry in READERS; load() reaches it through check and fold."""
    (tmp_path / "x.testvec").write_text("joy: 1 2 3 4\nsad: 0 0 0 -1\n", encoding="utf-8")
    r = _check('steer 1\nvector v = load("x.testvec", key="joy")\nvector w = normalize(v) * 2\n', tmp_path)
    assert not r.errors, [(d.code, d.message) for d in r.errors]
    assert np.allclose(r.values["v"], [1, 2, 3, 4])
    assert np.allclose(np.linalg.norm(r.values["w"]), 2.0)
    assert ".testvec" in vectorio.formats() and vectorio.reader_for("a/b/X.TESTVEC") is testvec


def test_a_registered_readers_key_errors_are_the_checkers(tmp_path, testvec):
    """issue 33: the checker's missing-key diagnostic works for a new source as for the built-in ones."""
    (tmp_path / "x.testvec").write_text("joy: 1 2 3 4\n", encoding="utf-8")
    r = _check('steer 1\nvector v = load("x.testvec", key="jo")\n', tmp_path)
    found = [d for d in r.errors if d.code == "missing-key"]
    assert len(found) == 1 and found[0].help == "did you mean `joy`?" and found[0].span.line == 2


def test_unknown_format_help_lists_the_table(tmp_path, testvec):
    """issue 33: the unknown-format message is derived from the table, new entries included."""
    with pytest.raises(VectorFileError) as exc:
        vectorio.open_vector_file(str(tmp_path / "v.bin"))
    assert exc.value.message == "unknown vector format `.bin`"
    assert exc.value.help.startswith("use .safetensors, .npy (no pickle), ")
    assert exc.value.help.endswith(", or a .testvec file")


def test_unknown_format_help_is_unchanged_without_additions():
    """issue 33: the table reproduces the help the if-chain gave."""
    with pytest.raises(VectorFileError) as exc:
        vectorio.open_vector_file("v.bin")
    assert exc.value.help == ("use .safetensors, .npy (no pickle), a .pt file saved with torch.save of tensors, "
                              "a llama.cpp control vector (.gguf), or a BrainPatch archive (.brainpatch)")


def test_every_extension_has_one_reader():
    """issue 33: every extension in the table selects exactly one callable reader."""
    assert vectorio.FORMATS == vectorio.formats() == (".safetensors", ".npy", ".pt", ".pth", ".gguf", ".brainpatch")
    for ext in vectorio.FORMATS:
        owners = [r for r in vectorio.READERS.values() if ext in r.extensions]
        assert len(owners) == 1, ext
        assert callable(owners[0].open) and owners[0].description and owners[0].hint
        assert vectorio.reader_for("v" + ext.upper()) is owners[0]
        assert ext == ext.lower() and ext.startswith(".")


def test_reading_the_table_imports_no_torch():
    """issue 33: readers import heavy things only when their kind of file is read."""
    import subprocess
    import sys

    code = ("import sys, steerc.io.vectors as v; v.reader_for('a.pt'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_checker_highlighters_and_completion_name_the_tables_functions():
    """issue 33: one table of built-in functions; every user names exactly its functions."""
    from steerc.highlight import words
    from steerc.highlight.textmate import render
    from steerc.lsp.complete import complete
    from steerc.passes import names, types

    assert FUNCTIONS == tuple(BUILTINS) == names.FUNCTIONS == words.FUNCTIONS
    text = "steer 1\nvector v = "
    items = [i for i in complete(text, len(text)) if i.kind == "function"]
    assert tuple(i.label for i in items) == FUNCTIONS
    assert all(i.detail.startswith(BUILTINS[i.label].signature + ": ") for i in items)
    assert words.alternation(FUNCTIONS) in render()  # the TextMate grammar's built-in calls
    pytest.importorskip("pygments")
    from pygments.token import Name

    from steerc.highlight.pygments_lexer import SteerLexer

    for f in FUNCTIONS:
        tokens = [(t, v) for t, v in SteerLexer().get_tokens(f"vector v = {f}(x)\n") if v.strip()]
        assert (Name.Builtin, f) in tokens, (f, tokens)
    tokens = [(t, v) for t, v in SteerLexer().get_tokens("vector v = lod(x)\n") if v.strip()]
    assert (Name.Builtin, "lod") not in tokens
    assert types.SCHEDULES == {"ramp": 1, "decay": 1, "window": 2}
    assert types.LOAD_KEYWORDS == {"key": types.STRING, "per_layer": types.BOOL}


def test_the_checker_knows_every_function_and_no_other():
    """issue 33: `names` accepts each built-in and reports any other called name."""
    for b in BUILTINS.values():
        args = ", ".join("1" for _ in b.params)
        r = check_source(f"steer 1\nparam p = {b.name}({args})\n", "p.steer", options=Options())
        assert not [d for d in r.errors if d.code == "undefined-name"], b.name
    r = check_source("steer 1\nparam p = nromalize(1)\n", "p.steer", options=Options())
    assert [d.help for d in r.errors if d.code == "undefined-name"] == ["did you mean `normalize`?"]
