"""The serve target: plan.json format, artifacts, admission, and per-request isolation."""

from __future__ import annotations

import base64
import glob
import json
import os

import pytest

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.serve_client import ARTIFACTS_KEY, PLAN_KEY, extra_args, offline_request, request_fields
from steerc.targets.serve.emit import emit
from steerc.targets.serve.format import artifact_id, dumps, from_serve, read_artifact, to_serve

EXAMPLES = os.environ.get("STEERC_EXAMPLES", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "examples"))
SCHEMA = os.path.join(os.path.dirname(__file__), "..", "spec", "serve.schema.json")
PROGRAMS = sorted(glob.glob(os.path.join(EXAMPLES, "*.steer")))


@pytest.fixture(scope="module")
def facts():
    return load_facts(os.path.join(EXAMPLES, "models", "tiny-llama"))


@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip("jsonschema")
    with open(SCHEMA, encoding="utf-8") as fh:
        schema = json.load(fh)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _compiled(path, facts, tmp_path):
    result = check_file(path, facts=facts)
    assert result.ok, result.render()
    out = tmp_path / os.path.basename(path)
    emit(result.plan, facts, str(out))
    return result, out


@pytest.mark.parametrize("path", PROGRAMS, ids=os.path.basename)
def test_every_example_compiles_to_a_schema_valid_plan(path, facts, validator, tmp_path):
    result, out = _compiled(path, facts, tmp_path)
    doc = json.loads((out / "plan.json").read_text())
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, errors[0]
    # artifacts re-hash to their names, and nothing else is there
    names = sorted(p.name[: -len(".safetensors")] for p in (out / "artifacts").iterdir())
    assert names == doc["artifacts"]
    for key in names:
        data = (out / "artifacts" / f"{key}.safetensors").read_bytes()
        assert artifact_id(data) == key
        read_artifact(data, key)
    # plan -> IR -> plan: equal, and byte-identical JSON
    load = lambda k: (out / "artifacts" / f"{k}.safetensors").read_bytes()  # noqa: E731
    again = from_serve(doc, load)
    assert again == result.plan
    assert dumps(to_serve(again, facts.to_json())[0]) + "\n" == (out / "plan.json").read_text()


def test_plan_is_deterministic_and_small(facts, tmp_path):
    path = os.path.join(EXAMPLES, "04_bank.steer")
    _, a = _compiled(path, facts, tmp_path / "a")
    _, b = _compiled(path, facts, tmp_path / "b")
    assert (a / "plan.json").read_bytes() == (b / "plan.json").read_bytes()
    assert len((a / "plan.json").read_bytes()) < 8192  # tensors never inline


def test_nothing_in_the_format_is_executable(facts, tmp_path):
    _, out = _compiled(os.path.join(EXAMPLES, "12_per_token_gate.steer"), facts, tmp_path)
    text = (out / "plan.json").read_text()
    for word in ("lambda", "import", "pickle", "__"):
        assert word not in text


def test_constraint_becomes_request_fields(facts, tmp_path):
    _, out = _compiled(os.path.join(EXAMPLES, "07_json.steer"), facts, tmp_path)
    fields = request_fields(str(out))
    assert fields["response_format"]["type"] == "json_schema"
    assert fields["extra_body"]["structured_outputs"]["disable_any_whitespace"] is True
    _, out = _compiled(os.path.join(EXAMPLES, "08_choice.steer"), facts, tmp_path)
    assert request_fields(str(out))["extra_body"]["structured_outputs"] == {"choice": ["yes", "no", "maybe"]}


def test_client_fields_carry_plan_artifacts_and_salt(facts, tmp_path):
    _, out = _compiled(os.path.join(EXAMPLES, "03_cast_gate.steer"), facts, tmp_path)
    fields = request_fields(str(out))
    body = fields["extra_body"]
    plan = json.loads(body["vllm_xargs"][PLAN_KEY])
    assert body["cache_salt"] == plan["cache_salt"]
    inline = json.loads(body["vllm_xargs"][ARTIFACTS_KEY])
    assert sorted(inline) == plan["artifacts"]
    assert all(isinstance(v, str) for v in body["vllm_xargs"].values())  # vllm_xargs takes no maps
    prompt, extra = offline_request(str(out), "hello")
    assert prompt == {"prompt": "hello", "cache_salt": plan["cache_salt"]}


def test_cache_salt_changes_with_the_plan(facts):
    text_a = "steer 1\nvector v = [" + ", ".join(["0.5"] * 64) + "]\nintervention x {\n  at resid_post[1]\n  add v\n}\n"
    text_b = text_a.replace("add v", "add 2 * v")
    from steerc.api import check_source

    salts = [to_serve(check_source(t, facts=facts).plan, facts.to_json())[0]["cache_salt"] for t in (text_a, text_b)]
    assert salts[0] != salts[1]


# ------------------------------------------------------------------ admission


def _admission_inputs(facts, tmp_path):
    _, out = _compiled(os.path.join(EXAMPLES, "12_per_token_gate.steer"), facts, tmp_path)
    doc = json.loads((out / "plan.json").read_text())
    arts = {k: (out / "artifacts" / f"{k}.safetensors").read_bytes() for k in doc["artifacts"]}
    return doc, arts


def test_admission_stages_verified_artifacts(facts, tmp_path):
    from steerc.runtime.serve import ArtifactStore, admit

    doc, arts = _admission_inputs(facts, tmp_path)
    store = ArtifactStore(str(tmp_path / "store"))
    plan = admit(extra_args(doc, arts), store, facts.fingerprint)
    assert plan is not None and plan.kernel_count == 1
    assert all(store.has(k) for k in arts)
    assert admit(extra_args(doc, arts, inline=False), store, facts.fingerprint) is not None  # staged already
    assert admit({}, store) is None and admit(None, store) is None


@pytest.mark.parametrize("fault", ["tampered inline", "missing", "tampered in store", "another model",
                                   "not json", "wrong format", "bad base64"])
def test_admission_refuses_bad_requests(facts, tmp_path, fault):
    from steerc.runtime.serve import ArtifactStore, RequestError, admit

    doc, arts = _admission_inputs(facts, tmp_path)
    store = ArtifactStore(str(tmp_path / "store"))
    args = extra_args(doc, arts)
    key = doc["artifacts"][0]
    if fault == "tampered inline":
        bad = dict(json.loads(args[ARTIFACTS_KEY]))
        raw = bytearray(base64.b64decode(bad[key]))
        raw[-1] ^= 1
        bad[key] = base64.b64encode(bytes(raw)).decode()
        args[ARTIFACTS_KEY] = json.dumps(bad)
    elif fault == "missing":
        args = extra_args(doc, arts, inline=False)
    elif fault == "tampered in store":
        admit(args, ArtifactStore(str(tmp_path / "store")), facts.fingerprint)
        path = store.path(key)
        data = bytearray(open(path, "rb").read())
        data[-1] ^= 1
        open(path, "wb").write(bytes(data))
        store = ArtifactStore(str(tmp_path / "store"))  # a fresh process: nothing verified yet
        args = extra_args(doc, arts, inline=False)
    elif fault == "another model":
        fp = "0" * 64
        with pytest.raises(RequestError, match="fingerprint"):
            admit(args, store, fp)
        return
    elif fault == "not json":
        args[PLAN_KEY] = "{not json"
    elif fault == "wrong format":
        args[PLAN_KEY] = json.dumps(dict(doc, format="steerc.serve/0"))
    elif fault == "bad base64":
        args[ARTIFACTS_KEY] = json.dumps({key: "***"})
    with pytest.raises(RequestError):
        admit(args, store, facts.fingerprint)


def test_store_caps_size_with_lru_eviction(tmp_path):
    import numpy as np

    from steerc.runtime.serve import ArtifactStore
    from steerc.targets.serve.format import artifact_bytes

    blobs = [artifact_bytes(np.full(1024, i, dtype=np.float32)) for i in range(5)]
    store = ArtifactStore(str(tmp_path / "s"), cap_bytes=3 * len(blobs[0]))
    keys = []
    for b in blobs:
        keys.append(store.put(b))
        os.utime(store.path(keys[-1]), (len(keys), len(keys)))  # distinct, increasing mtimes
    store.evict()
    present = [store.has(k) for k in keys]
    assert present == [False, False, True, True, True]
    assert not [p for p in os.listdir(store.root) if p.startswith(".incoming")]
