"""Fuzzing: whatever the input, steerc answers with diagnostics, never with a traceback.

Inputs are the shared examples after random edits, random text, and random
well-formed programs. The checker (``check_source``) must return; the
command line (run in-process) must exit 0 or 1 and print no traceback.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import traceback

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from steerc.api import check_source
from steerc.facts import facts_from_config, load_facts
from steerc.frontend.fmt import format_program
from strategies import mutated, programs, random_text
from support import examples_path, run_cli, uses_constraint

# STEERC_FUZZ_SCALE=20 pytest tests/test_fuzz.py fuzzes twenty times longer.
SCALE = max(1, int(os.environ.get("STEERC_FUZZ_SCALE", "1")))


def fuzz(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


FUZZ = fuzz(300)

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

# A model whose hidden size and head size are 4, the width of the random programs' vectors.
NARROW = facts_from_config({"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 4, "num_attention_heads": 1,
                            "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 16}, origin="narrow")


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
    result.render()
    json.dumps(result.to_json())


# ------------------------------------------------------------------ checker


@pytest.mark.skipif(not SOURCES, reason="shared examples not found")
@FUZZ
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), with_model=st.booleans())
def test_mutated_examples_only_give_diagnostics(rel, data, with_model, tiny_llama, examples_dir):
    text = data.draw(mutated(SOURCES[rel]))
    result = checks_quietly(text, rel, os.path.join(examples_dir, rel), tiny_llama if with_model else None)
    if result is not None:
        assert_well_formed(result)


@FUZZ
@given(random_text())
def test_random_text_only_gives_diagnostics(text):
    result = checks_quietly(text, "random.steer", None, None)
    if result is not None:
        assert_well_formed(result)
        if not text.lstrip().startswith("steer"):
            assert not result.ok


MALFORMED = {"syntax-error", "undefined-name", "duplicate-name", "type-error", "missing-field", "duplicate-field",
             "unknown-site", "unknown-field", "multiple-constraints"}


@fuzz(200)
@given(programs(with_constraint=HAS_CONSTRAINTS, with_loads=True), st.sampled_from([None, NARROW]))
def test_well_formed_programs_check_as_well_formed(p, facts):
    """Random well-formed programs meet only value- and layout-level complaints, deterministically."""
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
    """A copy of the examples, where mutated programs can be written next to the originals."""
    root = tmp_path_factory.mktemp("fuzz") / "examples"
    shutil.copytree(examples_dir, root)
    return root


COMMANDS = [
    ["check"],
    ["check", "--format", "json"],
    ["check", "--model", "models/tiny-llama"],
    ["check", "--model", "models/tiny-gpt2", "--format", "json", "--set", "strength=2"],
    ["fmt", "--check"],
    ["parse", "--emit", "ast"],
    ["parse", "--emit", "ir"],
]


@pytest.mark.skipif(not SOURCES, reason="shared examples not found")
@fuzz(200)
@given(rel=st.sampled_from(sorted(SOURCES)), data=st.data(), command=st.sampled_from(COMMANDS))
def test_the_command_line_never_prints_a_traceback(rel, data, command, workdir, monkeypatch):
    text = data.draw(mutated(SOURCES[rel]))
    if not HAS_CONSTRAINTS:
        assume(not uses_constraint(text))
    target = workdir / os.path.dirname(rel) / "fuzzed.steer"
    target.write_text(text, encoding="utf-8", errors="surrogatepass")
    monkeypatch.chdir(workdir)
    argv = [*command[:1], os.path.relpath(target, workdir), *command[1:]]
    try:
        code, out, err = run_cli(argv)
    except Exception as exc:  # noqa: BLE001 - main() let an exception through
        if known_crash(exc):
            event("known crash")
            return
        raise
    assert "Traceback" not in out + err
    assert code in (0, 1), (code, err)
    if "--format" in command and out:
        data = json.loads(out)
        assert isinstance(data["diagnostics"], list)
    if code == 1 and command[0] == "check" and "--format" not in command:
        assert "error[" in out + err


@FUZZ
@given(random_text())
def test_stdin_never_prints_a_traceback(text):
    if not HAS_CONSTRAINTS:
        assume(not uses_constraint(text))
    for argv in (["check", "-"], ["fmt", "-"], ["parse", "-", "--emit", "ast"]):
        try:
            code, out, err = run_cli(argv, stdin=text)
        except Exception as exc:  # noqa: BLE001
            if known_crash(exc):
                return
            raise
        assert "Traceback" not in out + err and code in (0, 1)
