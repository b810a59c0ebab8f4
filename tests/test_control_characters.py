"""A user's file never drives the terminal: control characters in an echoed line are shown escaped (issue 32 #19).

Before, an ``eval --data`` line holding raw ESC, BEL or BS was echoed as it was in the diagnostic (a window title
set, the screen cleared, text overwritten); the renderer is shared with ``.steer`` sources.
"""

from __future__ import annotations

import os

import pytest

from steerc.core.source import Source
from steerc.diagnostics import Diagnostic, render_text
from tests.support import examples_path, run_cli

HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "abc\x08\x08\x08xyz", "\u202eevil", "a\u2028b", "\x9b31m", "\x7f"]


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c not in "\n" and (ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u202e\u2028")]


@pytest.mark.parametrize("bad", HOSTILE, ids=range(len(HOSTILE)))
def test_the_source_line_and_the_message_are_escaped(bad):
    line = f"x = {bad} + y"
    src = Source("p.steer", f"steer 1\n{line}\n")
    at = src.text.index("+")
    d = Diagnostic.error("undefined-name", f"undefined name `{bad}`", src.span(at, at + 1), help=f"not {bad}")
    out = render_text(d, {"p.steer": src})
    assert _raw_controls(out) == []
    shown_line, caret = [ln for ln in out.splitlines() if ln.startswith("2 |") or ln.startswith("  |")][1:3]
    assert caret.index("^") == shown_line.index("+")  # the caret still stands under what it points at


def test_an_eval_data_line_with_escapes_is_echoed_escaped(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_bytes(b'{"prompt": "\x1b]0;pwned\x07\x1b[2J", oops}\n')
    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, out, err = run_cli(["eval", os.path.join(examples_path(), "01_add.steer"), "--model", model,
                              "--data", str(data)])
    assert code == 1
    assert "invalid-data" in err or "error[" in err
    assert _raw_controls(err) == []
    assert "\\x1b]0;pwned\\x07" in err
