"""``steerc import`` of EasySteer SteeringSpec JSON (issue 37). EasySteer does not run here: these tests check the
mapping against EasySteer's documented v2 schema (spec/formats.md, "EasySteer") with vectors written as its GGUF
export writes them (``direction.<layer>``), and that malformed or unsayable specs are diagnostics."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import examples_path

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.formats import FORMATS, ForeignFileError
from steerc.formats.easysteer import convert
from steerc.io.controlvector import control_vector_bytes


@pytest.fixture(scope="module")
def facts():
    return load_facts(os.path.join(examples_path(), "models", "tiny-llama"))


def _spec(tmp_path, spec: dict, layers=(1, 2)):
    rng = np.random.default_rng(37)
    dirs = {layer: rng.normal(size=64).astype(np.float32) for layer in layers}
    (tmp_path / "happy.gguf").write_bytes(control_vector_bytes(dirs, "llama"))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path, dirs


def _program(tmp_path, spec, facts, layers=(1, 2)):
    path, dirs = _spec(tmp_path, spec, layers)
    imported = convert(str(path), "imp")
    for name, data in imported.files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "imp.steer").write_text(imported.text)
    result = check_file(str(tmp_path / "imp.steer"), facts=facts)
    assert result.ok, result.render() + imported.text
    return result, imported.text, dirs


def test_direct_vector_maps_to_adds_at_each_layer(tmp_path, facts):
    """issue 37: direction.L at resid_post[L], scale as the add's factor, apply as the scope, normalize as
    preserve norm."""
    spec = {"vectors": [{"source": "happy.gguf", "scale": 2.0, "layers": [2], "normalize": True,
                         "apply": {"prompt_positions": [-1], "generation_window": [0, 8]}}]}
    result, text, dirs = _program(tmp_path, spec, facts)
    assert "tokens prompt[-1], generated[0:8]" in text and "preserve norm" in text
    (sp,) = result.plan.sites
    assert sp.site.text == "resid_post[2]"
    (k,) = sp.kernels
    np.testing.assert_array_equal(k.op.bias.array, np.float32(2.0) * dirs[2])
    assert k.preserve_norm


def test_layers_null_takes_every_direction_and_all_phases_is_all(tmp_path, facts):
    spec = {"vectors": [{"source": "happy.gguf", "apply": {"prompt": "all", "generation": "all"}}]}
    result, text, _ = _program(tmp_path, spec, facts)
    assert [sp.site.text for sp in result.plan.sites] == ["resid_post[1]", "resid_post[2]"]
    assert "tokens" not in text.split("steer 1")[1]


def test_sequential_stacks_vectors_at_one_layer(tmp_path, facts):
    apply = {"generation": "all"}
    spec = {"conflict": "sequential", "vectors": [{"source": "happy.gguf", "layers": [1], "scale": 1.5,
                                                   "apply": apply},
                                                  {"source": "happy.gguf", "layers": [1], "scale": -0.8,
                                                   "apply": apply}]}
    result, _, _ = _program(tmp_path, spec, facts)
    assert [sp.site.text for sp in result.plan.sites] == ["resid_post[1]"]


@pytest.mark.parametrize("vector, words", [
    ({"algorithm": "loreft"}, "algorithm"),
    ({"source": "happy.pt"}, "pickle"),
    ({"apply": {"prompt_tokens": [5]}}, "prompt_tokens"),
    ({"apply": {"prompt": "all", "exclude_prompt_positions": [0]}}, "exclude_prompt_positions"),
])
def test_refusals_say_why(tmp_path, vector, words):
    base = {"source": "happy.gguf", "apply": {"prompt": "all"}}
    path, _ = _spec(tmp_path, {"vectors": [{**base, **vector}]})
    with pytest.raises(ForeignFileError) as info:
        convert(str(path), "x")
    assert info.value.code == "unsupported-by-target" and words in info.value.message
    assert "steerc cannot express" in info.value.message


def test_priority_conflict_at_one_layer_is_refused(tmp_path):
    v = {"source": "happy.gguf", "layers": [1], "apply": {"prompt": "all"}}
    path, _ = _spec(tmp_path, {"vectors": [v, v]})
    with pytest.raises(ForeignFileError) as info:
        convert(str(path), "x")
    assert "priority" in info.value.message


@pytest.mark.parametrize("spec, words", [
    ({"vectors": []}, "non-empty"),
    ({"vectors": [{"source": "happy.gguf"}]}, "has no `apply`"),
    ({"vectors": [{"source": "happy.gguf", "apply": {}}]}, "selects nothing"),
    ({"vectors": [{"source": "../x.gguf", "apply": {"prompt": "all"}}]}, "outside"),
    ({"vectors": [{"source": "happy.gguf", "layers": [9], "apply": {"prompt": "all"}}]}, "direction.9"),
    ({"vectors": [{"source": "happy.safetensors", "apply": {"prompt": "all"}}]}, "only .gguf"),
    ({"vectors": [{"source": "happy.gguf", "apply": {"prompt": "all"}}], "debug": True}, "unknown field"),
])
def test_malformed_specs_are_diagnostics(tmp_path, spec, words):
    path, _ = _spec(tmp_path, spec)
    with pytest.raises(ForeignFileError) as info:
        convert(str(path), "x")
    assert info.value.code == "invalid-foreign-file" and words in info.value.message
    assert info.value.span is not None


def test_the_seat_names_it():
    assert FORMATS["easysteer"].name == "easysteer"


_LEAF = st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.sampled_from(
    ["all", "happy.gguf", "direct", "sequential", "x.pt"])
_JSON = st.recursive(_LEAF, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(
    ["vectors", "source", "apply", "prompt", "generation", "layers", "scale", "prompt_window", "generation_positions",
     "normalize", "conflict", "algorithm"]), kids, max_size=4), max_leaves=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_JSON)
def test_fuzzed_specs_are_diagnostics_never_tracebacks(tmp_path, doc):
    """issue 37: any JSON is a program or a ForeignFileError with a code."""
    path, _ = _spec(tmp_path, {})
    path.write_text(json.dumps(doc))
    try:
        convert(str(path), "x")
    except ForeignFileError as exc:
        assert exc.code in ("invalid-foreign-file", "unsupported-by-target")
