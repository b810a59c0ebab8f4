"""Fuzzing: whatever the input, steerc answers with diagnostics, never with a traceback.

Inputs are the shared examples after random edits (``strategies.mutated``)
and after hostile ones (``strategies.hostile``: deep nesting, long literals,
big numbers, float32 overflow, lone surrogates, huge indices, ... at and
around each limit), random text, random well-formed programs
(``strategies.programs``, from the grammar's constructs), mutated model
configs and facts JSONs, and mutated safetensors headers. The checker
(``check_source``) must return; every command line (run in-process:
``check``, ``fmt``, ``parse --emit ast|ir``, ``explain``, ``compile --target
hf|vllm|serve``, ``facts``) must exit 0, 1 or 2 with a diagnostic, and print
no traceback.

Every test counts the inputs it ran (``tests/fuzzing.py``); at the end of
the session ``conftest.py`` checks that each ran the number it was given (a
test whose inputs were all filtered out would check nothing).
``STEERC_FUZZ_SCALE=20 pytest tests/test_fuzz*.py`` fuzzes twenty times
longer.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import struct
import traceback

import pytest
from fuzzing import RAN, fuzz
from hypothesis import assume, event, given
from hypothesis import strategies as st
from strategies import hostile, mutated, programs, random_text
from support import examples_path, run_cli, uses_constraint

from steerc.api import check_source
from steerc.facts import facts_from_config, load_facts
from steerc.frontend.fmt import format_program

try:
    import steerc.constraints  # noqa: F401

    HAS_CONSTRAINTS = True
except ImportError:  # being written in parallel
    HAS_CONSTRAINTS = False

# Crashes already covered by a strict xfail test, which the fuzzers step over
# so that they keep looking for new ones (none at present).
KNOWN_CRASHES: set[tuple[str, str]] = set()


def known_crash(exc: BaseException) -> bool:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}steerc{os.sep}" in f.filename]
    return bool(frames) and (type(exc).__name__, frames[-1].name) in KNOWN_CRASHES


def _sources() -> dict[str, str]:
    ex = examples_path()
    files = sorted(glob.glob(os.path.join(ex, "*.steer")) + glob.glob(os.path.join(ex, "bad", "*.steer")))
    out = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out[os.path.relpath(f, ex)] = fh.read()
    return out


SOURCES = _sources()
needs_examples = pytest.mark.skipif(not SOURCES, reason="shared examples not found")

# A model whose hidden size and head size are 4, the width of the random programs' vectors.
NARROW_CONFIG = {"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 4, "num_attention_heads": 1,
                 "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 16}
NARROW = facts_from_config(NARROW_CONFIG, origin="narrow")


@pytest.fixture(scope="module")
def tiny_llama(examples_dir):
    return load_facts(os.path.join(examples_dir, "models", "tiny-llama"))


def checks_quietly(text: str, name: str, path: str | None, facts) -> object:
    """check_source, tolerating only the known crashes; returns the result (or None)."""
    if not HAS_CONSTRAINTS:
        assume(not uses_constraint(text))
    try:
        return check_source(text, name, path=path, facts=facts)
    except Exception as exc:  # noqa: BLE001
        if known_crash(exc):
            event("known crash")
            return None
        raise


def assert_well_formed(result) -> None:
    for d in result.diagnostics:
        assert d.severity in ("error", "warning") and d.message
        if d.span is not None:
            assert 1 <= d.span.line <= d.span.end_line
            assert d.span.line < d.span.end_line or d.span.column <= d.span.end_column
    result.render().encode("utf-8")  # printable: no lone surrogates
    json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")


# ------------------------------------------------------------------ checker


@needs_examples
@fuzz(400, "mutated")
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), with_model=st.booleans())
def test_mutated_examples_only_give_diagnostics(rel, data, with_model, tiny_llama, examples_dir):
    RAN["mutated"] += 1
    text = data.draw(mutated(SOURCES[rel]))
    result = checks_quietly(text, rel, os.path.join(examples_dir, rel), tiny_llama if with_model else None)
    if result is not None:
        assert_well_formed(result)


@needs_examples
@fuzz(500, "hostile")
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), with_model=st.booleans())
def test_hostile_edits_only_give_diagnostics(rel, data, with_model, tiny_llama, examples_dir):
    """Limits and value policies at their bounds: never a traceback, and fmt keeps the meaning."""
    RAN["hostile"] += 1
    text = data.draw(hostile(SOURCES[rel]))
    result = checks_quietly(text, rel, os.path.join(examples_dir, rel), tiny_llama if with_model else None)
    if result is None:
        return
    assert_well_formed(result)
    if result.program is not None and not any(d.code == "syntax-error" for d in result.diagnostics):
        again = check_source(format_program(result.program, result.source), rel,
                             path=os.path.join(examples_dir, rel), facts=tiny_llama if with_model else None)
        assert again.program == result.program
        assert sorted(d.code for d in again.diagnostics) == sorted(d.code for d in result.diagnostics)


@fuzz(300, "random text")
@given(random_text())
def test_random_text_only_gives_diagnostics(text):
    RAN["random text"] += 1
    result = checks_quietly(text, "random.steer", None, None)
    if result is not None:
        assert_well_formed(result)
        if not text.lstrip().startswith("steer"):
            assert not result.ok


@fuzz(100, "api text")
@given(st.text(st.characters(codec=None), max_size=40))
def test_any_python_string_is_checked(text):
    """The API takes any str: lone surrogates included (a UTF-8 file cannot hold them)."""
    RAN["api text"] += 1
    for t in (text, "steer 1\n" + text, "steer 1\nparam p = 1  # " + text + "\n"):
        assert_well_formed(checks_quietly(t, "api.steer", None, None))


MALFORMED = {"syntax-error", "undefined-name", "duplicate-name", "type-error", "missing-field", "duplicate-field",
             "unknown-site", "unknown-field", "multiple-constraints", "limit-exceeded"}


@fuzz(200, "well-formed")
@given(programs(with_constraint=HAS_CONSTRAINTS, with_loads=True), st.sampled_from([None, NARROW]))
def test_well_formed_programs_check_as_well_formed(p, facts):
    """Random well-formed programs meet only value- and layout-level complaints, deterministically."""
    RAN["well-formed"] += 1
    text = format_program(p)
    result = checks_quietly(text, "p.steer", None, facts)
    if result is None:
        return
    assert_well_formed(result)
    assert not {d.code for d in result.diagnostics} & MALFORMED, result.render()
    assert result.program == p
    if result.ok:
        assert result.checked is not None
        if facts is not None:
            from steerc.passes.plan_pipeline import build_plan

            assert result.plan is not None
            build_plan(result.checked, facts, verify_each=True)  # raises PlanError on a broken invariant
    again = check_source(text, "p.steer", facts=facts)
    assert again.render() == result.render()


# -------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, examples_dir):
    """A copy of the examples, where fuzzed programs, models and vector files can be written."""
    root = tmp_path_factory.mktemp("fuzz") / "examples"
    shutil.copytree(examples_dir, root, ignore=shutil.ignore_patterns("real"))
    (root / "models" / "narrow").mkdir()
    (root / "models" / "narrow" / "config.json").write_text(json.dumps(NARROW_CONFIG))
    return root


OUT = "{out}"
re_model = re.compile(r"^models/tiny-\w+$")
COMMANDS = [
    ["check"],
    ["check", "--format", "json"],
    ["check", "--model", "models/tiny-llama"],
    ["check", "--model", "models/tiny-gpt2", "--format", "json", "--set", "strength=2"],
    ["check", "--target", "vllm"],
    ["fmt", "--check"],
    ["fmt", "--diff"],
    ["parse", "--emit", "ast"],
    ["parse", "--emit", "ir"],
    ["explain", "--model", "models/tiny-llama"],
    ["explain", "--model", "models/tiny-qwen2", "--target", "serve", "--format", "json"],
    ["compile", "--model", "models/tiny-llama", "--target", "hf", "-o", OUT],
    ["compile", "--model", "models/tiny-gemma2", "--target", "vllm", "-o", OUT, "--no-xgrammar"],
    ["compile", "--model", "models/tiny-llama", "--target", "serve", "-o", OUT, "--no-xgrammar"],
    ["compile", "--model", "models/tiny-gpt2", "--target", "serve", "--dialect", "vllm-hook", "-o", OUT,
     "--no-xgrammar"],
]


def run_program(workdir, rel: str, text: str, command: list[str], monkeypatch) -> tuple[int, str, str]:
    """Write ``text`` next to ``rel`` and run ``command`` on it; assert diagnostics only."""
    if not HAS_CONSTRAINTS:
        assume(not uses_constraint(text))
    target = workdir / os.path.dirname(rel) / "fuzzed.steer"
    target.write_text(text, encoding="utf-8")
    monkeypatch.chdir(workdir)
    out_dir = str(workdir / "out")
    argv = [command[0], os.path.relpath(target, workdir)] + [a.replace(OUT, out_dir) for a in command[1:]]
    try:
        code, out, err = run_cli(argv)
    except Exception as exc:  # noqa: BLE001 - main() let an exception through
        if known_crash(exc):
            event("known crash")
            return 0, "", ""
        raise
    assert "Traceback" not in out + err, err
    assert code in (0, 1), (argv, code, err)  # 2 would be a usage error: these arguments are all valid
    event(f"{' '.join(command[:1] + [c for c in command[1:] if c.startswith('--') and c != '-o'][:1])}: exit {code}")
    if "--format" in command and out:
        doc = json.loads(out)
        if command[0] == "check":
            assert isinstance(doc["diagnostics"], list)
    elif code == 1 and command[0] in ("check", "explain", "compile"):
        assert "error[" in out + err, (argv, out, err)
    return code, out, err


@needs_examples
@fuzz(500, "cli mutated")
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), command=st.sampled_from(COMMANDS))
def test_the_command_line_never_prints_a_traceback(rel, data, command, workdir, monkeypatch):
    RAN["cli mutated"] += 1
    run_program(workdir, rel, data.draw(mutated(SOURCES[rel])), command, monkeypatch)


@needs_examples
@fuzz(600, "cli hostile")
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), command=st.sampled_from(COMMANDS))
def test_hostile_programs_on_the_command_line(rel, data, command, workdir, monkeypatch):
    RAN["cli hostile"] += 1
    run_program(workdir, rel, data.draw(hostile(SOURCES[rel])), command, monkeypatch)


@needs_examples
@fuzz(300, "cli well-formed")
@given(p=programs(with_constraint=HAS_CONSTRAINTS, with_loads=True), command=st.sampled_from(COMMANDS))
def test_well_formed_programs_on_the_command_line(p, command, workdir, monkeypatch):
    RAN["cli well-formed"] += 1
    command = [re_model.sub("models/narrow", a) for a in command]  # as wide as the programs' vectors
    code, _, err = run_program(workdir, "p.steer", format_program(p), command, monkeypatch)
    if command[0] == "parse" or command == ["fmt", "--check"]:
        assert code == 0, err  # a formatted, well-formed program parses, and is formatted


@fuzz(150, "stdin")
@given(random_text())
def test_stdin_never_prints_a_traceback(text):
    RAN["stdin"] += 1
    if not HAS_CONSTRAINTS:
        assume(not uses_constraint(text))
    for argv in (["check", "-"], ["check", "-", "--format", "json"], ["fmt", "-"], ["parse", "-", "--emit", "ast"],
                 ["parse", "-", "--emit", "ir"]):
        try:
            code, out, err = run_cli(argv, stdin=text)
        except Exception as exc:  # noqa: BLE001
            if known_crash(exc):
                return
            raise
        assert "Traceback" not in out + err and code in (0, 1)


# -------------------------------------------------------------------- models

_CONFIG_KEYS = ["model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "use_parallel_residual",
                "n_layer", "n_embd", "n_head", "n_inner", "text_config", "format", "facts", "fingerprint", "family",
                "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "tied_embeddings",
                "parallel_residual"]
_JSON_SCALARS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 3, 4, 7, 16, 64, 1023, 1024, 1025, 4096, 4097, 65536, 65537, 10**6, 10**30, 2**63]),
    st.booleans(), st.none(), st.sampled_from(["false", "true", "4", "llama", "gpt2", "gemma3", "", "\u00e9"]),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=4),
)
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.sampled_from(_CONFIG_KEYS), inner, max_size=3), max_leaves=6)


@st.composite
def mutated_json(draw, doc: dict) -> str:
    """A JSON document after structured edits (values replaced, keys dropped or added) or text edits."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        holder = doc["facts"] if "facts" in doc and isinstance(doc["facts"], dict) and draw(st.booleans()) else doc
        how = draw(st.sampled_from(["replace", "drop", "add"]))
        keys = sorted(holder)
        if how == "drop" and keys:
            holder.pop(draw(st.sampled_from(keys)))
        elif how == "replace" and keys:
            holder[draw(st.sampled_from(keys))] = draw(_JSON_VALUES)
        else:
            holder[draw(st.sampled_from(_CONFIG_KEYS))] = draw(_JSON_VALUES)
    text = json.dumps(doc)
    if draw(st.integers(0, 4)) == 0:
        text = draw(st.sampled_from([
            text, text[:-1] + ', "x": ' + "[" * 300 + "]" * 300 + "}", text.replace("4", "9" * 5000, 1),
            text.replace("4", "NaN", 1), text.replace('"', '"\\ud800', 1), text + text, text[: len(text) // 2],
        ]))
    elif draw(st.integers(0, 3)) == 0:
        text = draw(mutated(text))
    return text


def _model_docs() -> list[dict]:
    ex = examples_path()
    docs = []
    for name in ("tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma2"):
        path = os.path.join(ex, "models", name, "config.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
            docs.append(config)
            docs.append({"format": "steerc.facts/1", "facts": facts_from_config(config).to_json()})
    return docs


MODEL_DOCS = _model_docs()


@needs_examples
@fuzz(200, "models")
@given(data=st.data(), which=st.integers(0, 7))
def test_mutated_model_descriptions_are_refused_or_read(data, which, workdir, monkeypatch):
    RAN["models"] += 1
    text = data.draw(mutated_json(MODEL_DOCS[which % len(MODEL_DOCS)]))
    path = workdir / "fuzzed-model.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    monkeypatch.chdir(workdir)
    for argv in (["facts", str(path)], ["check", "06_heads.steer", "--model", str(path)],
                 ["explain", "01_add.steer", "--model", str(path), "--target", "vllm"]):
        code, out, err = run_cli(argv)
        assert "Traceback" not in out + err, err
        assert code in (0, 1, 2), (argv, code, err)
        if code == 2:
            assert "error:" in err
        if argv[0] == "facts" and code == 0:  # what it prints is a facts JSON that reads back the same
            again = workdir / "again.json"
            again.write_text(out, encoding="utf-8")
            assert load_facts(str(again)).to_json() == json.loads(out)["facts"]


def _header(path: str) -> tuple[dict, bytes]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        return header, fh.read()


_ST_VALUES = st.one_of(
    st.sampled_from([0, 1, 4, 63, 64, 65, 2**31, 2**62, 10**7, -1, "F32", "F16", "BF16", "I32", "F64", "X", None]),
    st.lists(st.sampled_from([0, 1, 4, 64, 256, 2**31, 2**62, -1, 10**7]), max_size=3),
)


@needs_examples
@fuzz(200, "safetensors")
@given(data=st.data())
def test_mutated_safetensors_headers_give_diagnostics(data, workdir, examples_dir):
    RAN["safetensors"] += 1
    header, body = _header(os.path.join(examples_dir, "vectors", "tiny.safetensors"))
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(sorted(header)))
        entry = header[name]
        how = data.draw(st.sampled_from(["field", "drop", "rename", "metadata", "truncate"]))
        if how == "field" and isinstance(entry, dict):
            entry[data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = data.draw(_ST_VALUES)
        elif how == "drop":
            header.pop(name)
        elif how == "rename":
            header[data.draw(st.sampled_from(["bank.9", "bank." + "9" * 40, "joy", "bank.\u00b2", "x" * 300]))] = \
                header.pop(name)
        elif how == "metadata":
            header["__metadata__"] = data.draw(_JSON_VALUES)
        else:
            body = body[: data.draw(st.integers(0, len(body)))]
        if not header:
            break
    raw = json.dumps(header).encode()
    path = workdir / "vectors" / "fuzzed.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    program = ('steer 1\nvector joy = load("vectors/fuzzed.safetensors", key="joy")\n'
               'vector bank = load("vectors/fuzzed.safetensors", key="bank", per_layer=true)\n'
               "intervention a {\n  at  resid_post[*]\n  add joy + bank\n}\n")
    for facts in (None, load_facts(os.path.join(examples_dir, "models", "tiny-llama"))):
        assert_well_formed(check_source(program, "st.steer", path=str(workdir / "st.steer"), facts=facts))
