"""``steerc import`` of vLLM-Hook intervention specs (issue 37): export -> import -> the same plan; malformed and
refused input as diagnostics.

The round trip takes the exporter's own test programs (tests/test_vllm_hook_dialect.py: NUMERIC_PROGRAMS and
GATED, and the shared examples it lowers), writes them with ``--dialect vllm-hook``, imports the spec and checks
the imported program against the same model: its plan has the same sites, kernels, scopes and gates, values equal
to float32, and its own export is the same spec.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import examples_path
from test_vllm_hook_dialect import EXAMPLES, GATED, HEADER, NUMERIC_PROGRAMS, SUPPORTED, _blocks, _write_vectors

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.formats import FORMATS, ForeignFileError, format_for
from steerc.formats.vllm_hook import convert
from steerc.ir.plan import Affine, Project, Rotate
from steerc.targets.vllm_hook.emit import emit_vllm_hook
from steerc.targets.vllm_hook.lower import lower_vllm_hook


@pytest.fixture(scope="module")
def facts():
    path = os.path.join(examples_path(), "models", "tiny-llama")
    if not os.path.isdir(path):
        pytest.skip(f"{path} not found")
    return load_facts(path)


def _import(spec_path: str, out_dir, stem: str = "imported"):
    """The importer's program and files written into ``out_dir`` (as ``steerc import`` writes them)."""
    imported = convert(str(spec_path), stem)
    for name, data in imported.files.items():
        (out_dir / name).write_bytes(data)
    prog = out_dir / f"{stem}.steer"
    prog.write_text(imported.text, encoding="utf-8")
    return prog, imported


def _round_trip(tmp_path, original, facts):
    """Export ``original`` (a CheckResult), import it, check it: (imported result, its text)."""
    export = tmp_path / "export"
    emit_vllm_hook(original.plan, facts, str(export))
    back = tmp_path / "back"
    back.mkdir()
    prog, imported = _import(export / "intervention_spec.json", back)
    result = check_file(str(prog), facts=facts)
    assert result.ok and result.plan is not None, result.render() + "\n" + imported.text
    return result, imported.text


def _same_op(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, Affine):
        assert a.scale == b.scale and (a.bias is None) == (b.bias is None)
        if a.bias is not None:
            np.testing.assert_array_equal(np.float32(a.bias.array), np.float32(b.bias.array))
    elif isinstance(a, Project):
        assert a.target is None and b.target is None and len(a.basis) == len(b.basis)
        for p, q in zip(a.basis, b.basis):
            np.testing.assert_allclose(p.array, q.array, rtol=0, atol=1e-6)
    elif isinstance(a, Rotate):
        assert a.mode == b.mode and a.angle == pytest.approx(b.angle, rel=1e-12)
        for p, q in ((a.e1, b.e1), (a.e2, b.e2)):
            np.testing.assert_allclose(p.array, q.array, rtol=0, atol=1e-6)


def _same_plan(original, back, facts) -> None:
    """Same sites, kernels (op, values to float32), scopes and gates; the same exported spec."""
    from steerc.targets.hooks import scope_item

    def scopes(k):
        out = set()
        for s in k.scope:
            item = scope_item(s)
            out.add(("generated", None, item[2]) if item[0] == "generated" and item[1] == 0 else item)
        return out

    assert [sp.site for sp in original.plan.sites] == [sp.site for sp in back.plan.sites]
    for sa, sb in zip(original.plan.sites, back.plan.sites):
        assert len(sa.kernels) == len(sb.kernels), sa.site
        for ka, kb in zip(sa.kernels, sb.kernels):
            _same_op(ka.op, kb.op)
            assert scopes(ka) == scopes(kb)
            assert (ka.gate is None) == (kb.gate is None) and ka.preserve_norm == kb.preserve_norm
    spec_a, arts_a, _ = lower_vllm_hook(original.plan, facts)
    spec_b, arts_b, _ = lower_vllm_hook(back.plan, facts)
    assert _without_ids(spec_a) == _without_ids(spec_b)  # gates: same layers, pooling, readout, rule and threshold
    assert len(arts_a) == len(arts_b)


def _without_ids(spec: dict) -> dict:
    text = json.dumps(spec, sort_keys=True)
    import re

    text = re.sub(r'"sha256:[0-9a-f]{64}"', '"A"', text)
    spec = json.loads(text)
    for op in spec["ops"]:
        if op.get("gate"):
            op["gate"]["rule"]["threshold"] = round(op["gate"]["rule"]["threshold"], 6)
    return spec


def _check(tmp_path, body: str, facts):
    _write_vectors(tmp_path, facts)
    prog = tmp_path / "p.steer"
    prog.write_text(_blocks(HEADER + body), encoding="utf-8")
    result = check_file(str(prog), facts=facts)
    assert result.ok, result.render()
    return result


@pytest.mark.parametrize("program", sorted(NUMERIC_PROGRAMS))
def test_round_trip_of_the_exporters_programs(program, tmp_path, facts):
    """issue 37: export -> import -> check gives the same plan for every program the exporter's tests lower."""
    original = _check(tmp_path, NUMERIC_PROGRAMS[program], facts)
    back, _ = _round_trip(tmp_path, original, facts)
    _same_plan(original, back, facts)


@pytest.mark.parametrize("case", sorted(GATED))
def test_round_trip_of_gates(case, tmp_path, facts):
    """issue 37: a gate comes back as a probe at its condition layer's input with the same threshold rule."""
    original = _check(tmp_path, GATED[case][0].replace("THRESHOLD", "0.125"), facts)
    back, text = _round_trip(tmp_path, original, facts)
    assert "probe op0_gate" in text and "when op0_gate" in text
    _same_plan(original, back, facts)


@pytest.mark.parametrize("name", sorted(n for n, (outcome, _) in EXAMPLES.items() if outcome == SUPPORTED))
def test_round_trip_of_the_shared_examples(name, tmp_path, facts):
    original = check_file(os.path.join(examples_path(), name), facts=facts)
    assert original.ok, original.render()
    back, _ = _round_trip(tmp_path, original, facts)
    _same_plan(original, back, facts)


def test_the_seat_finds_it_and_the_command_writes_a_checked_program(tmp_path, facts):
    """``steerc import intervention_spec.json -o x.steer --model M`` through the command line."""
    from steerc.cli import main

    original = _check(tmp_path, NUMERIC_PROGRAMS["mixed_site"], facts)
    emit_vllm_hook(original.plan, facts, str(tmp_path / "export"))
    spec = tmp_path / "export" / "intervention_spec.json"
    assert format_for(str(spec), spec.read_bytes()[:64]) is FORMATS["vllm-hook"]
    assert format_for(str(tmp_path / "export" / "request.json"),
                      (tmp_path / "export" / "request.json").read_bytes()[:64]) is FORMATS["vllm-hook"]
    out = tmp_path / "out"
    out.mkdir()
    model = os.path.join(examples_path(), "models", "tiny-llama")
    assert main(["import", str(spec), "-o", str(out / "hook.steer"), "--model", model]) == 0
    assert sorted(os.listdir(out)) == ["hook.safetensors", "hook.steer"]
    # a request.json holds the same spec under extra_args
    assert main(["import", str(tmp_path / "export" / "request.json"), "-o", str(out / "req.steer")]) == 0
    assert (out / "req.steer").read_text().split("steer 1", 1)[1] == \
        (out / "hook.steer").read_text().split("steer 1", 1)[1].replace("hook.safetensors", "req.safetensors")


# ------------------------------------------------------------------ malformed and refused


def _spec_dir(tmp_path, facts, body=NUMERIC_PROGRAMS["add"]):
    original = _check(tmp_path, body, facts)
    emit_vllm_hook(original.plan, facts, str(tmp_path / "export"))
    return tmp_path / "export"


def _fails(path, *words, code="invalid-foreign-file"):
    with pytest.raises(ForeignFileError) as info:
        convert(str(path), "x")
    exc = info.value
    assert exc.code == code, exc.message
    for w in words:
        assert w in exc.message, exc.message
    return exc


def _edit(folder, fn):
    path = folder / "intervention_spec.json"
    spec = json.loads(path.read_text())
    fn(spec)
    path.write_text(json.dumps(spec))
    return path


def test_a_tampered_or_missing_artifact_is_refused(tmp_path, facts):
    """issue 37: every artifact's bytes must have the sha256 its name says; none is looked for elsewhere."""
    folder = _spec_dir(tmp_path, facts)
    art = sorted((folder / "artifacts").iterdir())[0]
    data = bytearray(art.read_bytes())
    data[-1] ^= 1
    art.write_bytes(bytes(data))
    exc = _fails(folder / "intervention_spec.json", "E_ARTIFACT_HASH")
    assert exc.span is not None and exc.source is not None
    art.unlink()
    _fails(folder / "intervention_spec.json", "E_ARTIFACT_MISSING")


def test_an_artifact_name_cannot_escape(tmp_path, facts):
    folder = _spec_dir(tmp_path, facts)

    def escape(spec):
        spec["ops"][0]["transform"]["artifact"] = "sha256:../../" + "0" * 58
    _fails(_edit(folder, escape), "64 lowercase hex")


@pytest.mark.parametrize("edit, words", [
    (lambda s: s.update(extra=1), "unknown field `extra`"),
    (lambda s: s["ops"][0].update(layers=[]), "non-empty list"),
    (lambda s: s["ops"][0].update(layers=[1, 1]), "twice"),
    (lambda s: s["ops"][0].update(layers=[-1]), "integer"),
    (lambda s: s["ops"][0]["transform"].update(kind="scale"), "E_UNKNOWN_KIND"),
    (lambda s: s["ops"][0]["transform"].update(strength="2"), "finite number"),
    (lambda s: s["ops"][0]["scope"].update(kind="window"), "unknown scope"),
    (lambda s: s["ops"][0].update(scope={"kind": "last_k", "k": 0}), "at least 1"),
    (lambda s: s["ops"][0].pop("scope"), "has no `scope`"),
    (lambda s: s.update(ops={}), "must be a list"),
])
def test_malformed_fields_are_diagnostics_with_a_place(tmp_path, facts, edit, words):
    """issue 37: each malformed field is invalid-foreign-file under a caret at that field."""
    exc = _fails(_edit(_spec_dir(tmp_path, facts), edit), words)
    assert exc.source is not None and exc.span is not None


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["ops"][0]["transform"].update(modifiers=[{"kind": "norm_preserving"}]), "norm_preserving"),
    (lambda s: s["ops"][0].update(scope={"kind": "from_position", "position": 3}), "from_position 3"),
    (lambda s: s["ops"][0].update(gate={"layers": [1], "pooling": "mean", "rule": {"kind": "sum_threshold",
                                        "bias": 0.0}, "readout": {"kind": "affine", "artifact": "sha256:" + "0" * 64}}),
     "sum_threshold"),
])
def test_what_steerc_cannot_say_is_refused_with_the_reason(tmp_path, facts, edit, words):
    exc = _fails(_edit(_spec_dir(tmp_path, facts), edit), words, code="unsupported-by-target")
    assert "steerc cannot express" in exc.message and ":" in exc.message


def test_not_json_and_too_large(tmp_path):
    bad = tmp_path / "s.json"
    bad.write_text('{"ops": [')
    _fails(bad, "not JSON")
    bad.write_bytes(b"\xff\xfe")
    _fails(bad, "UTF-8")
    bad.write_text(" " * (1024 * 1024 + 1))
    _fails(bad, "over")


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) |
                     st.sampled_from(["all", "additive", "projection", "rotation", "last_k", "ge", "mean",
                                      "sha256:" + "0" * 64]),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
                         st.sampled_from(["ops", "layers", "transform", "scope", "gate", "kind", "k", "strength",
                                          "artifact", "modifiers", "angle", "mode", "rule", "readout", "pooling"]),
                         kids, max_size=4), max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(st.just("ops"), st.lists(_JSON, max_size=3), min_size=1) | _JSON)
def test_fuzzed_specs_are_diagnostics_never_tracebacks(tmp_path, doc):
    """issue 37: whatever the JSON, the importer makes a program or a ForeignFileError with a code."""
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc))
    try:
        imported = convert(str(path), "x")
    except ForeignFileError as exc:
        assert exc.code in ("invalid-foreign-file", "unsupported-by-target") and exc.message
    else:
        assert imported.text.startswith("#")
