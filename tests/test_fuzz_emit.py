"""Fuzzing what steerc writes: the emitted HF package's source, and every JSON document.

* Any text as the ``.steer`` file's name, a safetensors vector key, an ``after`` text and the command line,
  and any names the grammar allows: the package parses, is printable ASCII with the same AST as a benign
  package's (string constants aside), imports without running anything else (a sentinel never fires),
  steers exactly as steerc's in-process runtime does, and is the same bytes when emitted twice.
* Any number literal (overflowing ones included) in ``parse --emit ir``, and any values (NaN and infinities
  included) through the CLI's JSON writer: strict JSON that steerc's own reader takes back.
"""

from __future__ import annotations

import builtins
import itertools
import json
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fuzzing import RAN, fuzz  # noqa: E402
from hf_util import load_emitted  # noqa: E402
from support import run_cli  # noqa: E402
from test_hf_emit_source import PAYLOAD, SENTINEL, characters, emit_package, logits, raw_key, shape  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from steerc.frontend import parse_source  # noqa: E402
from steerc.ir.serialize import dumps, loads  # noqa: E402

# Pieces that end strings and comments, or that a file cannot hold, or that trip encoders.
FRAGMENTS = ['"', "'", '"""', "'''", "\\", "\\N{BULLET}", "\\x", "\\u12", "{", "}", "#", "%s", "\n", "\r", "\r\n",
             "\x00", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x7f", "\x85", "\u2028", "\u2029", "\ud800",
             "\udfff", "\u202e", "\u200f", "\ufeff", "\U0001f600", "caf\u00e9", PAYLOAD, "\n" + PAYLOAD + "\n#",
             "\n    " + PAYLOAD, "/"]
HOSTILE_TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(codec=None), max_size=4)),
                        min_size=1, max_size=6).map("".join)
# Names the grammar allows ([A-Za-z_][A-Za-z0-9_]*) that mean something to Python or to the package.
NAMES = st.one_of(st.sampled_from(["import", "def", "class", "None", "True", "lambda", "return", "__init__",
                                   "__import__", "os", "S", "P", "_T", "HOOKS", "install", "ctx", "x", "h", "m"]),
                  st.from_regex(r"\A_?[A-Za-z][A-Za-z0-9_]{0,12}\Z"))
_COUNT = itertools.count()


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def benign_shape(llama, tmp_path_factory):
    out, _ = emit_package(str(tmp_path_factory.mktemp("benign")), llama, "benign.steer", "joy")
    with open(os.path.join(out, "__init__.py"), encoding="ascii") as fh:
        return shape(fh.read())


def _read_all(folder: str) -> dict:
    """The files steerc wrote (importing the package may add Python's own __pycache__ beside them)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name == "__pycache__":
            continue
        with open(os.path.join(folder, name), "rb") as fh:
            out[name] = fh.read()
    return out


@fuzz(40, "emit hf source")
@given(name=HOSTILE_TEXT, key=HOSTILE_TEXT, after=HOSTILE_TEXT, command=HOSTILE_TEXT,
       names=st.lists(NAMES, min_size=3, max_size=3, unique=True))
def test_any_text_in_the_emitted_package_stays_data(name, key, after, command, names, llama, benign_shape,
                                                    tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz-emit"))
    out, plan = emit_package(tmp, llama, name + ".steer", raw_key(key), after="c" + characters(after),
                             command=command, names=tuple(names))
    RAN["emit hf source"] += 1
    with open(os.path.join(out, "__init__.py"), "rb") as fh:
        raw = fh.read()
    assert raw.isascii()
    assert shape(raw.decode("ascii")) == benign_shape
    assert not hasattr(builtins, SENTINEL)
    package = load_emitted(out, f"steer_pkg_fuzz_{next(_COUNT)}")
    assert not hasattr(builtins, SENTINEL)
    assert package.AFTER_TEXTS == ("c" + characters(after),)
    assert f"Made by: {command}" in package.__doc__
    assert torch.equal(logits(llama, package), logits(llama, plan=plan))
    first = _read_all(out)
    again, _ = emit_package(os.path.join(tmp, "again"), llama, name + ".steer", raw_key(key),
                            after="c" + characters(after), command=command, names=tuple(names))
    assert _read_all(again) == first


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


NUMBER = st.builds(lambda digits, frac, exp: digits + (f".{frac}" if frac else "") + (f"e{exp}" if exp else ""),
                   st.from_regex(r"\A[1-9][0-9]{0,20}\Z"), st.from_regex(r"\A[0-9]{0,6}\Z"),
                   st.one_of(st.none(), st.integers(-400, 400).map(str), st.integers(300, 999).map(lambda e: f"+{e}")))


@fuzz(150, "emit ir json")
@given(numbers=st.lists(NUMBER, min_size=3, max_size=3), negate=st.booleans())
def test_parse_emit_ir_is_strict_json_that_steerc_reads_back(numbers, negate):
    a, b, c = numbers
    sign = "-" if negate else ""
    text = (f"steer 1\nparam g = {sign}{a}\nvector v = [{b}, {sign}{c}]\n"
            f"intervention x {{\n  at resid_post[1]\n  add {a} * v\n}}\n"
            f"intervention y {{\n  at resid_post[1]\n  rotate in (v, v) by {c}deg\n}}\n")
    code, out, err = run_cli(["parse", "-"], stdin=text)
    assert (code, err) == (0, ""), err
    RAN["emit ir json"] += 1
    _strict(out)
    program = loads(out)
    assert program == parse_source(text, "<stdin>")[0]
    assert dumps(program) == out


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
              st.text(st.characters(codec="utf-8"), max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)


def _same(decoded, original) -> bool:
    from steerc.core.jsonio import decode_float

    decoded = decode_float(decoded)
    if isinstance(original, float):
        return isinstance(decoded, float) and (decoded == original or math.isnan(decoded) and math.isnan(original))
    if isinstance(original, list):
        return isinstance(decoded, list) and len(decoded) == len(original) and all(map(_same, decoded, original))
    if isinstance(original, dict):
        return isinstance(decoded, dict) and decoded.keys() == original.keys() and all(
            _same(decoded[k], original[k]) for k in original)
    return decoded == original


@fuzz(200, "cli json writer")
@given(value=JSON_VALUES)
def test_the_cli_json_writer_writes_strict_json_for_any_value(value):
    import io

    from steerc.cli.common import print_json
    from steerc.core.jsonio import loads as steerc_loads

    RAN["cli json writer"] += 1
    out = io.StringIO()
    print_json(value, out)
    text = out.getvalue()
    assert _strict(text) == steerc_loads(text)
    assert _same(steerc_loads(text), value)
