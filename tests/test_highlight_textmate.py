"""The TextMate grammar (``editors/vscode``) is fresh, compiles, and agrees with steerc's lexer.

The grammar is generated from :mod:`steerc.highlight.words` (the committed
file must be what ``python -m steerc.highlight.textmate`` writes now). The
rest runs the real engine VS Code uses, ``vscode-textmate`` on
``vscode-oniguruma``, from a small Node.js script
(``editors/vscode/test/tokenize.js``): every regex compiles in Oniguruma,
and on every ``.steer`` file, on programs where keywords stand as names and
on random well-formed programs each character's innermost scope agrees
with the class steerc's Lark lexer gives it. Those tests skip, saying why,
where Node.js or the two npm packages are missing (``npm install`` in
``editors/vscode``; ``./dev`` does it when npm is there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import highlight_support as H
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import commented, programs

from steerc.highlight import textmate
from steerc.highlight import words as W

VSCODE = os.path.join(H.REPO, "editors", "vscode")
GRAMMAR = os.path.join(H.REPO, textmate.OUTPUT)
SCALE = max(1, int(os.environ.get("STEERC_FUZZ_SCALE", "1")))


def test_the_grammar_file_is_fresh():
    with open(GRAMMAR, encoding="utf-8") as fh:
        assert fh.read() == textmate.render(), "regenerate it: python -m steerc.highlight.textmate"


def _scopes_in(node) -> set[str]:
    found = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "name" and isinstance(value, str):
                found.add(value)
            else:
                found |= _scopes_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _scopes_in(item)
    return found


def test_every_scope_is_a_class_or_a_region():
    known = {c.scope for c in W.CLASSES.values()} | set(textmate.INNER_SCOPES)
    used = _scopes_in(textmate.grammar()["repository"])
    assert {s for s in used if not s.startswith("meta.")} <= known
    assert all(s.endswith(".steer") for s in used)


# ------------------------------------------------------------ the real engine


@pytest.fixture(scope="module")
def tokenize():
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the TextMate grammar is not run through vscode-textmate")
    missing = [p for p in ("vscode-textmate", "vscode-oniguruma")
               if not os.path.isdir(os.path.join(VSCODE, "node_modules", p))]
    if missing:
        pytest.skip(f"npm packages {', '.join(missing)} missing: run `npm install` in editors/vscode")

    def run(texts: list[str]) -> list[list[list]]:
        proc = subprocess.run([node, os.path.join(VSCODE, "test", "tokenize.js"), GRAMMAR],
                              input=json.dumps({"texts": texts}), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["regexErrors"] == []
        return out["results"]

    return run


def char_scopes(text: str, lines: list[list], with_bounds: bool = False):
    """The scopes of each character of ``text`` (None for a newline or a line's dropped ``\\r``).

    With ``with_bounds``, also the (starts, ends) of the engine's tokens, as character offsets.
    """
    scopes: list[list[str] | None] = [None] * len(text)
    starts, ends = set(), set()
    pos = 0
    for raw, tokens in zip(text.split("\n"), lines):
        line_text = raw[:-1] if raw.endswith("\r") else raw
        index_of = []  # UTF-16 offset (the engine's) -> character offset
        for i, ch in enumerate(line_text):
            index_of.extend([i] * (2 if ord(ch) > 0xFFFF else 1))
        index_of.append(len(line_text))
        for start, end, token_scopes in tokens:
            first, last = index_of[start], index_of[min(end, len(index_of) - 1)]
            scopes[pos + first:pos + last] = [token_scopes] * (last - first)
            starts.add(pos + first)
            ends.add(pos + last)
        pos += len(raw) + 1
    return (scopes, (starts, ends)) if with_bounds else scopes


def innermost(scopes: list[str]) -> str:
    for s in reversed(scopes):
        if s.startswith(("string.", "comment.")):
            return s.split(".")[0]
    inner = [s for s in scopes if s != "source.steer" and not s.startswith("meta.")]
    return inner[-1] if inner else "space"


_NAME_SCOPES = {W.CLASSES[r].scope: r for r in H.NAME_ROLES}


def agrees(cls: str, scopes: list[str] | None, word: str) -> bool:
    if scopes is None:
        return cls == "space"
    if scopes is LINE_END_IN_STRING:
        return cls in ("space", "string")
    got = innermost(scopes)
    if cls in ("space", "string", "comment"):
        return got == cls
    if cls == "number":
        return got.startswith("constant.numeric.")
    if cls == "name":
        return got in _NAME_SCOPES and H.may_colour_name(_NAME_SCOPES[got], word)
    return got == W.CLASSES[cls].scope


def assert_agrees(text: str, lines: list[list], where: str = "") -> int:
    scopes, bounds = char_scopes(text, lines, with_bounds=True)
    return H.assert_agrees(text, _across_line_ends(scopes), agrees, "TextMate", bounds, where)


def _across_line_ends(scopes: list) -> list:
    """TextMate scopes lines, not their ends, so a line end inside a string that spans lines
    (``\"\"\"...\"\"\"``) has no scope. Where the characters on both sides of a line end are strings to
    TextMate, the line end is marked :data:`LINE_END_IN_STRING`: it may be steerc's string there (or its
    space, as any other line end must be: two strings on adjacent lines)."""
    out = list(scopes)
    for i, here in enumerate(scopes):
        before = scopes[i - 1] if i > 0 else None
        after = scopes[i + 1] if i + 1 < len(scopes) else None
        if here is None and before and after and innermost(before) == innermost(after) == "string":
            out[i] = LINE_END_IN_STRING
    return out


LINE_END_IN_STRING = ("line end between string characters",)


def test_every_steer_file_tokenizes_as_steerc_lexes_it(tokenize):
    files = H.steer_files()
    texts = [H.read(p) for p in files]
    for path, text, lines in zip(files, texts, tokenize(texts)):
        checked = assert_agrees(text, lines, H.file_id(path))
        assert checked == len(text) or not H.lark_tokens(text)[1]


def test_keywords_where_they_stand_as_names(tokenize):
    for text, lines in zip(H.KEYWORDS_AS_NAMES, tokenize(H.KEYWORDS_AS_NAMES)):
        assert assert_agrees(text, lines) == len(text)


def test_random_programs_tokenize_as_steerc_lexes_them(tokenize):
    from steerc.frontend.fmt import format_program

    texts: list[str] = []

    @settings(max_examples=100 * SCALE, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def draw(data):
        texts.append(data.draw(commented(format_program(data.draw(programs(with_loads=True)))))[0])

    draw()
    for text, lines in zip(texts, tokenize(texts)):
        assert assert_agrees(text, lines, "random program") == len(text), text


def test_probe_tokens_get_their_scopes(tokenize, examples_dir):
    text = H.read(os.path.join(examples_dir, "03_cast_gate.steer"))
    scopes = char_scopes(text, tokenize([text])[0])

    def scope_of(needle: str) -> list[str]:
        return scopes[re.search(r"(?<![A-Za-z0-9_])" + re.escape(needle), text).start()]

    for needle, scope in [
        ("steer", "keyword.control.directive.steer"), ("model", "storage.type.steer"),
        ("family", "variable.other.property.steer"), ('"llama"', "string.quoted.double.steer"),
        ("llama", "string.quoted.double.steer"), ("6.0", "constant.numeric.float.steer"),
        ("# CAST", "comment.line.number-sign.steer"), ("CAST", "comment.line.number-sign.steer"),
        ("probe", "storage.type.steer"), ("harmful", "entity.name.function.steer"),
        ("projected_cosine", "support.function.readout.steer"), ("prompt.mean", "support.constant.pool.steer"),
        ("mean\n", "support.constant.pool.steer"), ("resid_pre", "support.type.site.steer"),
        ("2:", "constant.numeric.integer.steer"), ("tokens", "keyword.control.steer"),
        ("generated", "constant.language.scope.steer"), ("when", "keyword.control.steer"),
        (">", "keyword.operator.comparison.steer"), ("load", "support.function.builtin.steer"),
        ("key", "variable.parameter.steer"),
    ]:
        assert scope in scope_of(needle), (needle, scope_of(needle))
    text = 'steer 1\nintervention t {\n  rotate in (a, b) to 120deg\n  when not p > 1 and q < 2\n}\n' \
           'constrain regex "a\\\\.\\q"\n'
    scopes = char_scopes(text, tokenize([text])[0])
    for needle, scope in [("deg", "keyword.other.unit.steer"), ("120", "constant.numeric.integer.steer"),
                          ("not", "keyword.operator.logical.steer"), ("and", "keyword.operator.logical.steer"),
                          ("regex", "support.type.constraint.steer"), ("\\\\", "constant.character.escape.steer"),
                          ("\\q", "invalid.illegal.escape.steer"), (" to ", "keyword.other.steer")]:
        at = text.index(needle) + (1 if needle.startswith(" ") else 0)
        assert scope in scopes[at], (needle, scopes[at])


def test_an_unclosed_block_ends_at_the_next_statement(tokenize):
    text = 'steer 1\nintervention a {\n  at resid_post[1]\n  add load("x\n\nvector w = [1.0]\n'
    scopes = char_scopes(text, tokenize([text])[0])
    assert innermost(scopes[text.index("vector")]) == "storage.type.steer"
    assert "meta.block.steer" not in scopes[text.index("vector")]
