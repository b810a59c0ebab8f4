"""Neuronpedia steering requests into steerc (issue 37): ``steerc import request.json --sae-root DIR`` on
requests this test writes, with SAELens folders whose cfg.json names their Neuronpedia id (the SmolLM2 fixture,
copied and renamed). Neuronpedia's inference server does not run here (it needs its own package, TransformerLens
and the hub), so its steering hook's arithmetic is written out below from its source
(``neuronpedia_inference/endpoints/steer/completion.py``: one hook per feature at that feature's SAE hook, each
adding ``strength_multiplier * strength * W_dec[index]`` of every feature) and compared with the plan's kernels;
every refusal is a diagnostic with a code and a caret, and a fuzz of the JSON never gives a traceback."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_cli

from steerc.api import Options, check_source
from steerc.formats import FORMATS, ForeignFileError, format_for
from steerc.formats.neuronpedia import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
SMOLLM2 = os.path.join(REPO, "tests", "fixtures", "examples", "models", "real", "smollm2-135m-instruct")
MODEL = "smollm2-135m-instruct"


def _sae(root, name: str, npid: str, hook: str = "blocks.8.hook_resid_post"):
    folder = root / "saes" / name
    shutil.copytree(SAE, folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["metadata"].update(neuronpedia_id=npid, hook_name=hook)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def project(tmp_path):
    (tmp_path / "steer.toml").write_text("")
    _sae(tmp_path, "l8", f"{MODEL}/8-res")
    _sae(tmp_path, "l4", f"{MODEL}/4-res", hook="blocks.4.hook_resid_post")
    return tmp_path


def _request(folder, body: dict, name: str = "request.json") -> str:
    path = folder / name
    path.write_text(json.dumps(body))
    return str(path)


def _feature(layer: str, index: int, strength: float, public: bool = True) -> dict:
    if public:
        return {"modelId": MODEL, "layer": layer, "index": index, "strength": strength}
    return {"model": MODEL, "source": layer, "index": index, "strength": strength}


def _plan(project, body: dict, **kw):
    """The imported program's text and its plan against SmolLM2's layout."""
    from steerc.facts import load_facts

    made = convert(_request(project, body), "imp", sae_root=str(project / "saes"), out_dir=str(project), **kw)
    for name, data in made.files.items():
        (project / name).write_bytes(data)
    result = check_source(made.text, "imp.steer", path=str(project / "imp.steer"), facts=load_facts(SMOLLM2),
                          options=Options(base_dir=str(project), root=str(project)))
    assert result.ok, result.render()
    return made.text, result.plan


def _neuronpedia(features: list[dict], multiplier: float, normalize: bool, rows: dict) -> dict:
    """What Neuronpedia's server adds at each SAE hook, from its steering_hook: one hook per feature, each
    adding every feature's scaled (and, with normalize_steering, unit) decoder row. ``rows``: (source, index)
    -> W_dec[index]. Returns hook layer -> the float64 vector added there in all."""
    added: dict[int, np.ndarray] = {}
    total = 0.0
    for f in features:
        v = rows[(f["layer"], f["index"])].astype(np.float64)
        total = total + multiplier * f["strength"] * (v / np.linalg.norm(v) if normalize else v)
    for f in features:
        layer = int(f["layer"].split("-")[0])
        added[layer] = added.get(layer, 0.0) + total
    return added


def _rows(project):
    from steerc.io.sae import read_sae

    saes = {"8-res": read_sae(str(project / "saes" / "l8")), "4-res": read_sae(str(project / "saes" / "l4"))}
    return lambda key: saes[key[0]].decoder_row(key[1])


@pytest.mark.parametrize("features, multiplier, normalize", [
    ([("8-res", 3, 2.0)], 4.0, False),
    ([("8-res", 3, 2.0), ("8-res", 7, -1.5)], 1.0, False),
    ([("8-res", 3, 2.0), ("4-res", 9, 5.0)], 2.5, True),
])
def test_the_plan_adds_what_neuronpedias_server_adds(project, features, multiplier, normalize):
    feats = [_feature(layer, index, strength, public=i % 2 == 0) for i, (layer, index, strength) in
             enumerate(features)]
    text, plan = _plan(project, {"modelId": MODEL, "prompt": "Hi", "features": feats,
                                 "strength_multiplier": multiplier, "steer_method": "SIMPLE_ADDITIVE",
                                 "normalize_steering": normalize})
    rows = _rows(project)
    want = _neuronpedia([{"layer": lay, "index": i, "strength": s} for lay, i, s in features], multiplier, normalize,
                        {(lay, i): rows((lay, i)) for lay, i, _ in features})
    got = {sp.site.layer: sum(k.op.bias.array.astype(np.float64) for k in sp.kernels) for sp in plan.sites}
    assert sorted(got) == sorted(want)
    for layer, vector in want.items():
        np.testing.assert_allclose(got[layer], vector, rtol=1e-6, atol=1e-6 * np.abs(vector).max())
    assert all(sp.site.kind == "resid_post" for sp in plan.sites)
    assert "tokens all" in text and ("normalize(" in text) == normalize
    assert ("each adding all of them" in text) == (len(features) > 1)
    assert "its generation settings: modelId = smollm2-135m-instruct, prompt = Hi" in text


def test_raw_vectors_at_hooks(project):
    v = np.linspace(-1, 1, 576)
    text, plan = _plan(project, {"vectors": [{"steering_vector": v.tolist(), "strength": 3.0,
                                              "hook": "blocks.2.hook_mlp_out"}], "strength_multiplier": 2.0})
    (sp,) = plan.sites
    assert (sp.site.kind, sp.site.layer) == ("mlp_out", 2)
    np.testing.assert_allclose(sp.kernels[0].op.bias.array, 6.0 * v.astype(np.float32), rtol=1e-6)
    assert 'load("imp.safetensors", key="v0")' in text


def test_the_command_line_imports_and_checks(project, monkeypatch):
    monkeypatch.chdir(project)
    path = _request(project, {"features": [_feature("8-res", 3, 2.0)], "strength_multiplier": 4})
    assert format_for(path, open(path, "rb").read(64)) is FORMATS["neuronpedia"]
    code, _, err = run_cli(["import", path, "-o", "out/np.steer", "--sae-root", "saes", "--root", ".",
                            "--model", SMOLLM2])
    assert code == 0, err
    text = (project / "out" / "np.steer").read_text()
    assert 'sae s0 = sae("../saes/l8")' in text and "add    8.0 * s0[3]" in text


@pytest.mark.parametrize("body, at, words", [
    ({"features": [_feature("8-res", 3, 1.0)], "steer_method": "ORTHOGONAL_DECOMP"}, '"ORTHOGONAL_DECOMP"',
     "not an addition"),
    ({"features": [_feature("8-res", 3, 1.0)], "steer_method": "PROJECTION_CAP"}, '"PROJECTION_CAP"', "caps"),
    ({"features": [_feature("8-res", 3, 1.0)], "steer_method": "MAGIC"}, '"MAGIC"', "must be one of"),
    ({"steer_method": []}, "[]", "must be one of"),  # found by the fuzz below: a list is no method name
    ({"features": [_feature("8-res", 3, 1.0)], "strength_multiplier": "4"}, '"4"', "finite number"),
    ({"features": [_feature("8-res", 3, 1.0)], "normalize_steering": 1}, "1", "true or false"),
    ({"features": [_feature("8-res", 3, 1.0)], "wat": 1}, '"wat"', "unknown field `wat`"),
    ({"features": []}, "[]", "non-empty list"),
    ({"prompt": "x"}, None, "exactly one of them"),
    ({"features": [_feature("8-res", 3, 1.0)], "vectors": []}, None, "exactly one of them"),
    ({"features": [_feature("8-res", 64, 1.0)]}, "64", "d_sae = 64"),
    ({"features": [_feature("8-res", -1, 1.0)]}, "-1", "feature number"),
    ({"features": [_feature("9-res", 3, 1.0)]}, '"9-res"', "no SAELens folder"),
    ({"features": [{"modelId": MODEL, "layer": "8-res", "index": 3}]}, None, "has no `strength`"),
    ({"features": [{**_feature("8-res", 3, 1.0), "steering_vector": [1.0]}]}, "[1.0]", "own steering vector"),
    ({"vectors": [{"steering_vector": [1.0], "strength": 1.0, "hook": "blocks.8.hook_resid_mid"}]},
     '"blocks.8.hook_resid_mid"', "steerc cannot express"),
    ({"vectors": [{"steering_vector": [1.0, "x"], "strength": 1.0, "hook": "blocks.8.hook_resid_post"}]}, '"x"',
     "finite number"),
])
def test_every_refusal_is_a_diagnostic_at_its_field(project, body, at, words):
    path = _request(project, body)
    with pytest.raises(ForeignFileError) as info:
        convert(path, "imp", sae_root=str(project / "saes"), out_dir=str(project))
    exc = info.value
    assert words in exc.message, exc.message
    assert exc.code in ("invalid-foreign-file", "unsupported-by-target", "file-not-found")
    if at is not None:
        assert exc.source.text[exc.span.start:exc.span.end] == at


def test_without_sae_root_it_says_where_to_put_the_sae(project, monkeypatch):
    monkeypatch.chdir(project)
    path = _request(project, {"features": [_feature("8-res", 3, 1.0)]})
    code, out, err = run_cli(["import", path, "-o", "np.steer"])
    assert code == 1 and "error[file-not-found]" in err + out and "--sae-root" in err + out
    assert "Traceback" not in err and not (project / "np.steer").exists()


def test_two_folders_with_one_id_are_ambiguous(project):
    _sae(project, "again", f"{MODEL}/8-res")
    with pytest.raises(ForeignFileError, match="2 folders"):
        convert(_request(project, {"features": [_feature("8-res", 3, 1.0)]}), "imp",
                sae_root=str(project / "saes"), out_dir=str(project))


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.floats(allow_nan=True) |
                     st.sampled_from(["8-res", "4-res", MODEL, "SIMPLE_ADDITIVE", "blocks.8.hook_resid_post", ""]),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["features", "vectors", "modelId", "layer", "index", "strength", "model",
                                          "source", "hook", "steering_vector", "strength_multiplier",
                                          "steer_method", "normalize_steering", "prompt"]), inner, max_size=5),
                     max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_JSON)
def test_fuzzed_requests_are_programs_or_diagnostics(project, body):
    path = project / "fuzz.json"
    path.write_text(json.dumps(body))
    try:
        made = convert(str(path), "imp", sae_root=str(project / "saes"), out_dir=str(project))
    except ForeignFileError as exc:
        assert exc.code and exc.message
    else:
        assert made.text.startswith("# imported from fuzz.json")
