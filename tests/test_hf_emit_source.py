"""The emitted HF package's source holds every outside text as a safe literal or a one-line comment.

A ``.steer`` file's name, a vector key (raw ``\"\"\"`` strings keep their line breaks, safetensors keys may
hold any text), an ``after`` text, a facts value: none can end a string or a comment of ``__init__.py``, so
importing the package runs the emitter's code only, and the package still steers.
"""

from __future__ import annotations

import ast
import builtins
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from hf_util import load_emitted  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from tiny_models import CharTokenizer, tiny_model  # noqa: E402

from steerc.api import Options, check_source  # noqa: E402
from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.targets.hf.emit import emit  # noqa: E402
from steerc.targets.hf.pysource import comment, docstring, literal  # noqa: E402
from steerc.targets.hooks import lower_hf  # noqa: E402

SENTINEL = "STEERC_EMIT_SENTINEL"
# Each would run `builtins.STEERC_EMIT_SENTINEL = 1` on import if it ended the comment or string it is in.
PAYLOAD = f"import builtins; builtins.{SENTINEL} = 1"
HOSTILE = [
    f"\n{PAYLOAD}\n#",
    f"\r{PAYLOAD}\r#",
    f"'''\"\"\"; {PAYLOAD}; '''\"\"\"",
    f"x'; {PAYLOAD}; '",
    f'x"; {PAYLOAD}; "',
    "back\\slash\\",
    "\\N{LATIN SMALL LETTER A}\\x\\u12",
    "nul\x00byte",
    "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029" + PAYLOAD,
    "\u202eright-to-left\u200f",
    "caf\u00e9 \U0001f600",
    "lone \ud800 surrogate \udfff",
]


def raw_key(text: str) -> str:
    """``text`` as a key that a raw (triple-quoted) steer string and a safetensors file both hold."""
    text = text.replace('"' * 3, "'" * 3).replace("\x00", "0").replace("\r\n", "\n").replace("\r", "\n")
    return "k" + characters(text) + "k"


def characters(text: str) -> str:
    """``text`` without lone surrogates (a steer string cannot hold one; a file name can)."""
    return "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)


def _program(key: str, after: str, names=("v", "p", "x")) -> str:
    vector, probe, intervention = names
    return ("steer 1\n"
            f"vector {vector} = load(\"v.safetensors\", key=\"\"\"{key}\"\"\")\n"
            f"probe {probe} {{\n  at resid_post[0]\n  read dot({vector})\n  pool token\n}}\n"
            f"intervention {intervention} {{\n  at resid_post[1]\n"
            f"  add 4.0 * load(\"v.safetensors\", key=\"\"\"{key}\"\"\")\n"
            f"  tokens after {_steer_string(after)}\n"
            f"  when {probe} > -1000.0\n}}\n")


def _steer_string(text: str) -> str:
    """``text`` as a steer ``"..."`` string (the escapes of spec/grammar.md)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) > 0xFFFF:
            v = ord(ch) - 0x10000
            out.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return '"' + "".join(out) + '"'


def emit_package(tmp, model, name: str, key: str, after: str = "c", command: str = "test", names=("v", "p", "x")):
    """Check, lower and emit the program with that file name, vector key and after text: (package folder, plan)."""
    os.makedirs(tmp, exist_ok=True)
    save_file({key: np.linspace(-1.0, 1.0, 64, dtype=np.float32)}, os.path.join(tmp, "v.safetensors"))
    result = check_source(_program(key, after, names), name, options=Options(base_dir=str(tmp), root=str(tmp)),
                          facts=facts_from_model(model))
    assert result.ok, result.render()
    out = os.path.join(tmp, "pkg")
    emit(lower_hf(result.plan, result.facts), out, command)
    return out, result.plan


def shape(source: str) -> str:
    """The module's AST with every string constant blanked: what the emitter's own code looks like."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def strings(source: str) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


PROMPT = [[5, 2, 7, 8, 9, 10, 2, 11]]  # token 2 decodes to "c", the benign after text


def logits(model, package=None, plan=None) -> torch.Tensor:
    """The model's logits with the package installed (or, with ``plan``, steerc's in-process runtime)."""
    ids = torch.tensor(PROMPT)
    with (install(model, plan, CharTokenizer()) if plan is not None else package.install(model, CharTokenizer())):
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def benign(llama, tmp_path_factory):
    out, plan = emit_package(str(tmp_path_factory.mktemp("benign")), llama, "benign.steer", "joy")
    with open(os.path.join(out, "__init__.py"), encoding="ascii") as fh:
        source = fh.read()
    steered = logits(llama, load_emitted(out, "steer_pkg_benign"))
    assert not torch.equal(steered, llama(input_ids=torch.tensor(PROMPT)).logits)  # the program steers
    assert torch.equal(steered, logits(llama, plan=plan))
    return source


def check_package(out: str, plan, model, benign_source: str, module: str):
    """The package is printable ASCII, has the benign package's code, runs nothing else, and steers as steerc does."""
    with open(os.path.join(out, "__init__.py"), "rb") as fh:
        raw = fh.read()
    assert raw.isascii()
    source = raw.decode("ascii")
    assert shape(source) == shape(benign_source)
    assert not hasattr(builtins, SENTINEL)
    package = load_emitted(out, module)
    assert not hasattr(builtins, SENTINEL)
    assert torch.equal(logits(model, package), logits(model, plan=plan))
    return package, source


@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_a_hostile_file_name_after_text_and_key_stay_data(i, llama, benign, tmp_path):
    text = HOSTILE[i]
    out, plan = emit_package(str(tmp_path), llama, text + ".steer", raw_key(text), after="c" + characters(text),
                             command="steerc compile " + text)
    package, source = check_package(out, plan, llama, benign, f"steer_pkg_hostile_{i}")
    assert package.AFTER_TEXTS == ("c" + characters(text),)
    assert f"Source: {text}.steer (sha256" in package.__doc__
    assert f"Made by: steerc compile {text}" in package.__doc__
    assert "k" + raw_key(text)[1:-1] + "k" in comments(source)


def comments(source: str) -> str:
    """The comment text of ``source``, unescaped."""
    import io
    import tokenize

    found = [t.string[2:] for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return "\n".join(ast.literal_eval('"' + c.replace('"', '\\"') + '"') for c in found)


@pytest.mark.parametrize("text", HOSTILE)
def test_pysource_helpers_quote_any_text(text):
    assert ast.literal_eval(literal(text)) == text
    assert ast.literal_eval(literal((text, [text], {text: 1.5}))) == (text, [text], {text: 1.5})
    line = comment(text)
    assert line.isascii() and len(line.splitlines()) == 1 and "\x00" not in line and "\r" not in line
    assert ast.parse(f"x = 1  {line}\n").body[0].value.value == 1
    doc = docstring(["head", text, "", text], indent="    ")
    assert doc.isascii() and ast.literal_eval(doc) == "head\n    " + text + "\n\n    " + text


def test_pysource_literal_of_infinities_and_refusals():
    assert ast.literal_eval(literal((float("inf"), -float("inf"), 0.1))) == (float("inf"), -float("inf"), 0.1)
    with pytest.raises(ValueError):
        literal(float("nan"))
    with pytest.raises(TypeError):
        literal(object())


def test_compile_cli_with_a_hostile_file_name(tmp_path):
    """End to end: a file named with quotes, a backslash and a statement compiles to a package that imports."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "steer.toml").write_text("")
    save_file({"joy": np.ones(64, dtype=np.float32)}, str(root / "v.safetensors"))
    name = f"q'\"\"\"; {PAYLOAD}; \"\"\"\\N{{x}}\\.steer"
    (root / name).write_text('steer 1\nintervention x {\n  at resid_post[1]\n'
                             '  add 4.0 * load("v.safetensors", key="joy")\n}\n')
    model = os.path.join(os.path.dirname(__file__), "fixtures", "examples", "models", "tiny-llama")
    run = subprocess.run([sys.executable, "-m", "steerc", "compile", name, "--model", model, "--target", "hf",
                          "-o", "out"], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    check = (f"import builtins, importlib.util, sys; s = importlib.util.spec_from_file_location('p', 'out/__init__.py',"
             f" submodule_search_locations=['out']); m = importlib.util.module_from_spec(s); sys.modules['p'] = m;"
             f" s.loader.exec_module(m); assert not hasattr(builtins, {SENTINEL!r}); print(m.__doc__)")
    imported = subprocess.run([sys.executable, "-c", check], cwd=root, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert f"Source: {name} (sha256" in imported.stdout


def test_facts_and_module_paths_from_a_facts_file_stay_data(llama, tmp_path):
    """A facts file (for a family steerc has no table for) names the modules and adds values: the package
    writes them as literals, whatever they hold, infinities included."""
    from steerc.core import record
    from steerc.targets.hf.emit import render_init
    from steerc.targets.hooks import HookProgram

    out, plan = emit_package(str(tmp_path), llama, "a.steer", "joy")
    program = lower_hf(plan, facts_from_model(llama))
    hostile = "model.layers.1\n" + PAYLOAD + "\n#'\"\"\"\\\u2028\ud800"
    facts = {**program.facts, "note": hostile, "rope_theta": float("inf"), "nested": [hostile, {"k": -float("inf")}]}
    hooks = tuple(record.evolve(h, module=hostile) for h in program.hooks)
    evil = HookProgram(**{**{f.name: getattr(program, f.name) for f in record.fields(HookProgram)},
                          "facts": facts, "hooks": hooks, "base_path": hostile, "source_name": hostile})
    from steerc.targets.hf.emit import _Bound

    source = render_init(evil, hostile, _Bound(evil.tensors))
    assert source.isascii()
    tree = ast.parse(source)
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body
              if isinstance(t, ast.Assign) and t.targets[0].id in ("FACTS", "BASE_MODEL")}
    assert values["FACTS"]["note"] == hostile and values["FACTS"]["rope_theta"] == float("inf")
    assert values["FACTS"]["nested"] == [hostile, {"k": -float("inf")}] and values["BASE_MODEL"] == hostile
    hooks_value = next(t.value for t in tree.body if isinstance(t, ast.Assign) and t.targets[0].id == "HOOKS")
    assert all(ast.literal_eval(row.elts[0]) == hostile for row in hooks_value.elts)
    benign = render_init(program, "test", _Bound(program.tensors))
    assert shape(source).count("Expr(") == shape(benign).count("Expr(")  # no statement more
    assert [type(n).__name__ for n in tree.body] == [type(n).__name__ for n in ast.parse(benign).body]
