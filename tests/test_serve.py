"""The serve target: plan.json format, artifacts, admission, and per-request isolation."""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os

import pytest
from strategies_plan import relist
from support import examples_path

from steerc.api import check_file
from steerc.facts import load_facts
from steerc.serve_client import ARTIFACTS_KEY, PLAN_KEY, extra_args, offline_request, request_fields
from steerc.targets.serve.emit import emit
from steerc.targets.serve.format import artifact_id, dumps, from_serve, read_artifact, to_serve

EXAMPLES = examples_path()
SCHEMA = os.path.join(os.path.dirname(__file__), "..", "steerc", "targets", "serve", "serve.schema.json")
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


# ------------------------------------------------------------ the format is data, and loading it runs none


def _leaves(value, path=()):
    """(path, value) of every JSON value under ``value``, containers included."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))


def _safetensors_header(data: bytes) -> dict:
    """The JSON header of a safetensors file (8 bytes of length, then the header)."""
    import struct

    (length,) = struct.unpack("<Q", data[:8])
    assert 8 + length <= len(data)
    return json.loads(data[8:8 + length])


@pytest.mark.parametrize("path", PROGRAMS, ids=os.path.basename)
def test_the_format_is_data_only(path, facts, tmp_path):
    """plan.json is strict JSON (steerc's reader: no NaN, no duplicate keys) whose every value is a string,
    number, boolean, null, list or object, and whose keys are strings; the folder holds plan.json and
    artifacts/*.safetensors only, each one float32 tensor named `value` with no metadata. (Once a grep for
    "lambda" in plan.json, which no format could fail: issue 32.)"""
    from steerc.core.jsonio import loads

    _, out = _compiled(path, facts, tmp_path)
    doc = loads((out / "plan.json").read_bytes(), unique_keys=True)
    for where, value in _leaves(doc):
        assert type(value) in (str, int, float, bool, type(None), list, dict), (where, type(value))
        if isinstance(value, dict):
            assert all(type(k) is str for k in value), where
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == sorted(["plan.json", *(f"artifacts/{k}.safetensors" for k in doc["artifacts"])])
    for key in doc["artifacts"]:
        data = (out / "artifacts" / f"{key}.safetensors").read_bytes()
        header = _safetensors_header(data)
        assert list(header) == ["value"] and header["value"]["dtype"] == "F32", header


# What a loader that evaluated, imported or unpickled its input would do with these strings; the audit hook
# below sees any of it. The module name is one nothing imports.
CANARY_MODULE = "steerc_issue32_canary"
RISKY_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "subprocess.Popen",
                "pickle.find_class", "marshal.load", "marshal.loads", "ctypes.dlopen", "ctypes.dlsym"}
_WATCH: dict = {"on": False, "canary": None, "seen": []}


def _audit(event, args):
    """Records, while a hostile load runs, anything that would run the payload (an audit hook stays for the
    process: it does nothing while ``_WATCH['on']`` is off)."""
    if not _WATCH["on"]:
        return
    if event in RISKY_EVENTS:
        _WATCH["seen"].append((event, str(args)[:200]))
    elif event == "compile" and isinstance(args[0], (str, bytes)) and CANARY_MODULE in (
            args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace")):
        _WATCH["seen"].append((event, "compiled the payload"))
    elif event == "import" and args[0] == CANARY_MODULE:
        _WATCH["seen"].append((event, args[0]))
    elif event == "open" and str(args[0]) == _WATCH["canary"]:
        _WATCH["seen"].append((event, str(args[0])))


@contextlib.contextmanager
def _watching(canary):
    """``with _watching(path) as seen:``: what the audit hook saw in the block (``path``: the canary file)."""
    import sys

    if not _WATCH.get("hooked"):
        sys.addaudithook(_audit)
        _WATCH["hooked"] = True
    _WATCH.update(on=True, canary=str(canary), seen=[])
    try:
        yield _WATCH["seen"]
    finally:
        _WATCH["on"] = False


def _payload(canary) -> str:
    return (f"__import__('{CANARY_MODULE}') or __import__('os').system('touch {canary}') "
            f"or exec(open('{canary}').read()) or eval('1+1')")


def _hostile_inputs(facts, tmp_path, name):
    if name == "per-request params":
        return _per_request_doc(facts)
    return _admission_inputs(facts, tmp_path, name)


def _admit_or_refuse(args, facts):
    """The Admitted request, or None when admission refuses it (a RequestError naming a field)."""
    from steerc.targets.serve.admission import RequestError, admit

    try:
        return admit(args, facts)
    except RequestError as exc:
        assert exc.field.startswith(("steerc_plan", "steerc_artifacts")), exc
        return None


@pytest.mark.parametrize("name", ["12_per_token_gate.steer", "07_json.steer", "09_grammar.steer",
                                  "10_regex_inline_schema.steer", "per-request params"])
def test_code_in_any_string_of_a_plan_is_refused_or_inert(facts, tmp_path, name):
    """Each string of a plan in turn (names, provenance, constraint schemas, grammars and regexes, kinds,
    hashes) replaced by Python that imports, shells out and evals, re-salted: admission refuses it naming a
    field, or admits it with the string as data in the plan. Either way nothing compiles, imports, opens,
    runs or unpickles it (a Python audit hook watches), and the canary file is never made (issue 32)."""
    doc, arts = _hostile_inputs(facts, tmp_path, name)
    canary = tmp_path / "canary"
    payload = _payload(canary)
    strings = [where for where, value in _leaves(doc) if isinstance(value, str)]
    assert len(strings) > 10
    admitted = refused = 0
    with _watching(canary) as seen:
        for where in strings:
            hostile = json.loads(json.dumps(doc))
            *parent, last = where
            node = hostile
            for step in parent:
                node = node[step]
            node[last] = payload
            if where != ("cache_salt",):
                _resalted(hostile)
            request = _admit_or_refuse(extra_args(hostile, arts), facts)
            if request is None:
                refused += 1
                continue
            admitted += 1
            node = request.doc
            for step in where:
                node = node[step]
            assert node == payload, where  # kept as the string it was, and nothing more
    assert seen == [] and not canary.exists(), seen
    assert refused and (admitted or name == "per-request params"), (admitted, refused)


def _pickle_of_a_shell_command(canary) -> bytes:
    """Protocol-0 pickle bytes that call os.system when unpickled (written by hand: steerc has no pickle)."""
    return f"cos\nsystem\n(S'touch {canary}'\ntR.".encode()


def test_an_artifact_that_is_a_pickle_or_carries_code_in_its_metadata_runs_nothing(facts, tmp_path):
    """An artifact replaced by a pickle that shells out (rehashed, re-listed, re-salted) is refused at its
    field and never unpickled; a well-formed safetensors artifact whose metadata holds code is read as its
    tensor alone, the metadata never looked at (issue 32)."""
    import numpy as np
    from safetensors.numpy import save

    canary = tmp_path / "canary"
    for make in (lambda: _pickle_of_a_shell_command(canary),
                 lambda: save({"value": np.full(64, 0.5, dtype=np.float32)}, metadata={"code": _payload(canary)})):
        doc, arts = _admission_inputs(facts, tmp_path, "01_add.steer")
        data = make()
        old, new = doc["artifacts"][0], artifact_id(data)
        text = json.dumps(doc).replace(old, new)
        doc.clear()
        doc.update(json.loads(text))
        doc["artifacts"] = sorted(doc["artifacts"])
        arts = {**{k: v for k, v in arts.items() if k != old}, new: data}
        _resalted(doc)
        with _watching(canary) as seen:
            request = _admit_or_refuse(extra_args(doc, arts), facts)
        assert seen == [] and not canary.exists(), seen
        assert (request is None) == data.startswith(b"cos"), request


def test_the_serve_loader_has_no_way_to_run_what_it_reads():
    """Every steerc module that loading a serve plan imports (admission, the format, the JSON reader, the
    schema checker, the verifier, the vllm program builder and all they import), read as source: no eval,
    exec, compile or __import__, no importlib.import_module, no pickle, marshal, shelve or dill, no
    torch.load without weights_only=True, no np.load that allows pickles (issue 32)."""
    import ast
    import subprocess
    import sys

    code = ("import json, sys; import steerc.targets.serve.admission, steerc.serve_client; "
            "print(json.dumps({m: getattr(v, '__file__', None) for m, v in sys.modules.items() "
            "if m == 'steerc' or m.startswith('steerc.')}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(proc.stdout)
    assert "steerc.targets.serve.format" in modules and "steerc.core.jsonio" in modules
    found = []
    for module, path in sorted(modules.items()):
        if path:
            with open(path, encoding="utf-8") as fh:
                found += [f"{module}:{line}: {what}" for line, what in _ways_to_run_text(ast.parse(fh.read()))]
    assert found == [], "\n".join(found)


def _ways_to_run_text(tree):
    """(line, what) for each call or import in ``tree`` that could run data as code or unpickle it."""
    import ast

    unsafe_modules = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in unsafe_modules:
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in unsafe_modules:
            yield node.lineno, f"from {node.module} import"
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            owner = ast.unparse(fn.value) if isinstance(fn, ast.Attribute) else ""
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
            runs = (isinstance(fn, ast.Name) and name in ("eval", "exec", "compile", "__import__", "breakpoint")
                    or name == "import_module"
                    or owner == "torch" and name == "load" and keywords.get("weights_only") != "True"
                    or owner in ("np", "numpy") and name == "load" and keywords.get("allow_pickle") != "False")
            if runs:
                yield node.lineno, ast.unparse(node)[:80]


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
    # a prompt-pooled gate: every call gets a salt of its own (never a prefix-cache hit)
    again, _ = offline_request(str(out), "hello")
    assert prompt["prompt"] == "hello" and prompt["cache_salt"].startswith(plan["cache_salt"] + "-once-")
    assert again["cache_salt"] != prompt["cache_salt"]
    _, plain = _compiled(os.path.join(EXAMPLES, "02_abliterate.steer"), facts, tmp_path)
    assert offline_request(str(plain), "hi")[0]["cache_salt"] == json.loads((plain / "plan.json").read_text())[
        "cache_salt"], "a plan that steers every position alike keeps the plan's salt"


def test_cache_salt_changes_with_the_plan(facts):
    text_a = "steer 1\nvector v = [" + ", ".join(["0.5"] * 64) + "]\nintervention x {\n  at resid_post[1]\n  add v\n}\n"
    text_b = text_a.replace("add v", "add 2 * v")
    from steerc.api import check_source

    salts = [to_serve(check_source(t, facts=facts).plan, facts.to_json())[0]["cache_salt"] for t in (text_a, text_b)]
    assert salts[0] != salts[1]


# ------------------------------------------------------------------ admission


def _admission_inputs(facts, tmp_path, name="12_per_token_gate.steer"):
    _, out = _compiled(os.path.join(EXAMPLES, name), facts, tmp_path)
    doc = json.loads((out / "plan.json").read_text())
    arts = {k: (out / "artifacts" / f"{k}.safetensors").read_bytes() for k in doc["artifacts"]}
    return doc, arts


def test_admission_checks_and_stages_artifacts(facts, tmp_path):
    from steerc.runtime.vllm.serve import ArtifactStore
    from steerc.targets.serve.admission import admit

    doc, arts = _admission_inputs(facts, tmp_path)
    store = ArtifactStore(str(tmp_path / "store"))
    admitted = admit(extra_args(doc, arts), facts, store=store, salt=doc["cache_salt"])
    assert admitted.plan.kernel_count == 1 and sorted(admitted.artifacts) == doc["artifacts"]
    for key, data in admitted.artifacts.items():
        store.put(data, expected=key)
    assert admit(extra_args(doc, arts, inline=False), facts, store=store) is not None  # staged already
    assert admit({}, facts) is None and admit(None, facts) is None


def _resalted(doc):
    from steerc.targets.serve.format import cache_salt

    doc["cache_salt"] = cache_salt(doc)


def _swap_artifact(doc, arts, array):
    """Replace the plan's first artifact with a well-formed one (rehashed, re-listed, re-salted)."""
    import numpy as np

    from steerc.targets.serve.format import artifact_bytes

    data = artifact_bytes(np.asarray(array, dtype=np.float32))
    new = artifact_id(data)
    old = doc["artifacts"][0]
    text = json.dumps(doc).replace(old, new)
    doc.clear()
    doc.update(json.loads(text))
    doc["artifacts"] = sorted(doc["artifacts"])
    arts.pop(old)
    arts[new] = data
    _resalted(doc)


def _first_kernel(doc):
    return doc["sites"][0]["kernels"][0]


FAULTS = {
    # what the request carries is tampered or incomplete
    "tampered inline": ("steerc_artifacts", None),
    "missing artifact": ("does not carry", None),
    "another model": ("model.fingerprint", lambda d, a: d["model"].__setitem__("fingerprint", "0" * 64)),
    "facts beside the fingerprint": ("model.facts.tied_embeddings", lambda d, a: (
        d["model"]["facts"].__setitem__("tied_embeddings", not d["model"]["facts"]["tied_embeddings"]),
        _resalted(d))),
    "1 for true": ("model.facts.tied_embeddings", lambda d, a: (
        d["model"]["facts"].__setitem__("tied_embeddings", int(d["model"]["facts"]["tied_embeddings"])),
        _resalted(d))),
    "another family": ("model.family", lambda d, a: (d["model"].__setitem__("family", "qwen2"), _resalted(d))),
    "not json": ("steerc_plan", None),
    "deep json": ("steerc_plan", None),
    "wrong format": ("steerc_plan.format", lambda d, a: d.__setitem__("format", "steerc.serve/0")),
    "bad base64": ("steerc_artifacts", None),
    # what would crash or silently misbehave in the worker
    "width 65, rehashed": ("op.bias", lambda d, a: _swap_artifact(d, a, [0.5] * 65)),
    "scope index 10**30": ("scope", lambda d, a: _first_kernel(d)["scope"].__setitem__(
        0, {"kind": "generated", "start": 10 ** 30, "stop": None})),
    # NaN and Infinity are not JSON: the reader refuses them before the schema sees a field
    "NaN threshold": ("NaN", lambda d, a: _first_kernel(d)["gate"]["all"][0].__setitem__("threshold",
                                                                                        float("nan"))),
    "NaN scale": ("Infinity", lambda d, a: _first_kernel(d)["op"].__setitem__("scale", {"value": float("inf")})),
    "layer 999": ("layer", lambda d, a: (d["sites"][0]["site"].__setitem__("layer", 999), _resalted(d))),
    "head 99": ("head", lambda d, a: d["sites"][0]["site"].update(kind="head", head=99)),
    "unknown key": ("surprise", lambda d, a: d.__setitem__("surprise", True)),
    "unknown kernel key": ("kernels[0].extra", lambda d, a: _first_kernel(d).__setitem__("extra", 1)),
    "stale cache salt": ("cache_salt", lambda d, a: d.__setitem__("cache_salt", "steerc-" + "0" * 32)),
    "unused artifact listed": ("artifacts", lambda d, a: (d["artifacts"].append("f" * 64),
                                                         d["artifacts"].sort())),
    "gate on an unknown probe": ("no probe named 'nope'", lambda d, a: _first_kernel(d)["gate"]["all"][0]
                                 .__setitem__("probe", "nope")),
    "after scope": ("scope", lambda d, a: _first_kernel(d)["scope"].__setitem__(0, {"kind": "after", "text": "x"})),
    "huge layer number": ("layer", lambda d, a: d["sites"][0]["site"].__setitem__("layer", 10 ** 30)),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_admission_refuses_what_the_worker_could_not_run(facts, tmp_path, fault):
    from steerc.targets.serve.admission import RequestError, admit

    doc, arts = _admission_inputs(facts, tmp_path)
    field, edit = FAULTS[fault]
    if edit is not None:
        edit(doc, arts)
    args = extra_args(doc, arts)
    key = doc["artifacts"][0]
    if fault == "tampered inline":
        bad = dict(json.loads(args[ARTIFACTS_KEY]))
        raw = bytearray(base64.b64decode(bad[key]))
        raw[-1] ^= 1
        bad[key] = base64.b64encode(bytes(raw)).decode()
        args[ARTIFACTS_KEY] = json.dumps(bad)
    elif fault == "missing artifact":
        args = extra_args(doc, arts, inline=False)
    elif fault == "not json":
        args[PLAN_KEY] = "{not json"
    elif fault == "deep json":
        args[PLAN_KEY] = "[" * 100_000 + "]" * 100_000
    elif fault == "bad base64":
        args[ARTIFACTS_KEY] = json.dumps({key: "***"})
    with pytest.raises(RequestError) as err:
        admit(args, facts, salt=None)
    assert field in str(err.value), str(err.value)


@pytest.mark.parametrize("where, value", [("threshold", float("nan")), ("scale", float("inf"))])
def test_non_finite_numbers_in_a_decoded_plan_are_refused_at_their_field(facts, tmp_path, where, value):
    from steerc.targets.serve.admission import RequestError, check_document

    doc, arts = _admission_inputs(facts, tmp_path)
    if where == "threshold":
        _first_kernel(doc)["gate"]["all"][0]["threshold"] = value
    else:
        _first_kernel(doc)["op"]["scale"] = {"value": value}
    with pytest.raises(RequestError) as err:
        check_document(doc, facts, arts)
    assert where in err.value.field and "finite" in str(err.value)


def test_admission_refuses_a_stored_artifact_tampered_on_disk(facts, tmp_path):
    from steerc.runtime.vllm.serve import ArtifactStore
    from steerc.targets.serve.admission import RequestError, admit

    doc, arts = _admission_inputs(facts, tmp_path)
    store = ArtifactStore(str(tmp_path / "store"))
    for k, v in arts.items():
        store.put(v, expected=k)
    path = store.path(doc["artifacts"][0])
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(RequestError, match="tampered"):
        admit(extra_args(doc, arts, inline=False), facts, store=ArtifactStore(str(tmp_path / "store")))


def test_admission_refuses_a_request_salt_that_is_not_the_plans(facts, tmp_path):
    from steerc.targets.serve.admission import RequestError, admit

    doc, arts = _admission_inputs(facts, tmp_path)
    with pytest.raises(RequestError, match="cache_salt"):
        admit(extra_args(doc, arts), facts, salt="steerc-" + "1" * 32)


def test_every_example_plan_is_admitted(facts, tmp_path):
    from steerc.targets import check_target
    from steerc.targets.serve.admission import admit

    admitted = 0
    for path in PROGRAMS:
        result = check_file(path, facts=facts)
        check_target(result, "serve")
        if not result.ok:
            assert "unsupported-by-target" in result.render(), path
            continue
        out = tmp_path / ("adm-" + os.path.basename(path))
        emit(result.plan, facts, str(out))
        doc = json.loads((out / "plan.json").read_text())
        arts = {k: (out / "artifacts" / f"{k}.safetensors").read_bytes() for k in doc["artifacts"]}
        assert admit(extra_args(doc, arts), facts, salt=doc["cache_salt"]) is not None, path
        admitted += 1
    assert admitted >= 10


def test_store_caps_size_with_lru_eviction(tmp_path):
    import numpy as np

    from steerc.runtime.vllm.serve import ArtifactStore
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


def test_the_spec_carries_the_schema_the_server_checks():
    with open(os.path.join(os.path.dirname(__file__), "..", "spec", "serve.schema.json"), "rb") as fh:
        spec = fh.read()
    with open(SCHEMA, "rb") as fh:
        assert fh.read() == spec, "copy steerc/targets/serve/serve.schema.json to spec/serve.schema.json"


def test_a_server_with_a_key_admits_only_plans_signed_with_it(facts, tmp_path):
    from steerc.api import check_file
    from steerc.targets.serve.admission import RequestError, admit

    key = b"a serving key of more than 16 bytes"
    result = check_file(os.path.join(EXAMPLES, "01_add.steer"), facts=facts)
    signed, arts = to_serve(result.plan, facts.to_json(), key)
    plain, _ = to_serve(result.plan, facts.to_json())
    assert signed["cache_salt"] == plain["cache_salt"], "signing does not change the salt"
    assert admit(extra_args(signed, arts), facts, key=key) is not None
    with pytest.raises(RequestError, match="hmac"):
        admit(extra_args(plain, arts), facts, key=key)
    tampered = json.loads(json.dumps(signed))
    tampered["sites"][0]["kernels"][0]["op"]["scale"] = {"value": 9.0}
    from steerc.targets.serve.format import cache_salt

    tampered["cache_salt"] = cache_salt(tampered)
    with pytest.raises(RequestError, match="hmac"):
        admit(extra_args(tampered, arts), facts, key=key)


# ------------------------------------------------ tampered plans: the compiler's verifier runs at admission


def _tamper_artifact(doc, arts, ref: dict, fn):
    """Replace the artifact ``ref`` names by ``fn(its tensor)`` (rehashed, re-listed, re-salted)."""
    import numpy as np

    from steerc.targets.serve.format import artifact_bytes

    old = ref["artifact"]
    data = artifact_bytes(np.asarray(fn(read_artifact(arts[old], old)), dtype=np.float32))
    new = artifact_id(data)
    ref["artifact"] = new
    arts[new] = data
    relist(doc, arts)


def _probe_after(d, a):
    d["probes"][0]["site"]["layer"] = 3  # sarcastic (pool token) now reads after resid_post[2], the kernel it gates


TAMPERED = {
    # (example, where the refusal points, edit)
    "a site listed twice": ("01_add.steer", "sites[1].site", lambda d, a: d["sites"].insert(
        1, json.loads(json.dumps(d["sites"][0]).replace('"value":1.0', '"value":0.5')))),
    "a per-token probe after the kernel it gates": ("12_per_token_gate.steer", "sites[0].kernels[0].gate",
                                                    _probe_after),
    "a prompt.mean gate widened to all tokens": ("03_cast_gate.steer", "kernels[0].scope[0]", lambda d, a: [
        k.__setitem__("scope", [{"kind": "all"}]) for s in d["sites"] for k in s["kernels"]]),
    "an ablation basis scaled by 10": ("02_abliterate.steer", "sites[0].kernels[0].op.basis", lambda d, a: (
        _tamper_artifact(d, a, _first_kernel(d)["op"]["basis"], lambda q: 10 * q))),
    "a rotation plane scaled by 10": ("11_rotate.steer", "kernels[0].op.e1", lambda d, a: (
        _tamper_artifact(d, a, _first_kernel(d)["op"]["e1"], lambda q: 10 * q))),
    "a projected_cosine basis scaled by 10": ("03_cast_gate.steer", "probes[0].vectors", lambda d, a: (
        _tamper_artifact(d, a, d["probes"][0]["vectors"], lambda q: 10 * q))),
    "an angle past float32": ("11_rotate.steer", "op.angle", lambda d, a: _first_kernel(d)["op"].__setitem__(
        "angle", 3.5e38)),
    "a scale past float32": ("02_abliterate.steer", "op.target", lambda d, a: _first_kernel(d)["op"].__setitem__(
        "target", [3.5e38])),
    "a probe bias past float32": ("03_cast_gate.steer", "probes[0].bias", lambda d, a: d["probes"][0].__setitem__(
        "bias", 3.5e38)),
    "a gate threshold past float32": ("03_cast_gate.steer", "gate.threshold", lambda d, a: _first_kernel(d)[
        "gate"].__setitem__("threshold", -3.5e38)),
    "an affine scale past float32": ("01_add.steer", "op.scale", lambda d, a: _first_kernel(d)["op"].__setitem__(
        "scale", {"value": 3.5e38})),
    "resid_pre above layer 0": ("01_add.steer", "sites[0].site.kind", lambda d, a: d["sites"][0]["site"].update(
        kind="resid_pre")),
    "a probe at resid_pre above layer 0": ("12_per_token_gate.steer", "probes[1].site.kind", lambda d, a: d[
        "probes"][1]["site"].update(kind="resid_pre", layer=2)),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_admission_refuses_a_plan_the_compiler_would_never_produce(facts, tmp_path, case):
    """Well-formed, rehashed and re-salted, yet breaking an invariant of plans: the compiler's verifier
    (steerc.passes.plan_pipeline.verify) refuses it at admission, naming where."""
    from steerc.targets.serve.admission import RequestError, admit

    example, field, edit = TAMPERED[case]
    doc, arts = _admission_inputs(facts, tmp_path, example)
    assert admit(extra_args(doc, arts), facts) is not None
    edit(doc, arts)
    _resalted(doc)
    with pytest.raises(RequestError) as err:
        admit(extra_args(doc, arts), facts, salt=doc["cache_salt"])
    assert err.value.field.startswith("steerc_plan.") and field in err.value.field, str(err.value)


# ---------------------------------------------------- malformed requests: a RequestError, never a crash


PER_REQUEST = ("steer 1\nparam s = 1 in [0, 4] per request\nintervention x {\n  at resid_post[1]\n  scale s\n}\n")


def _per_request_doc(facts):
    from steerc.api import check_source

    return to_serve(check_source(PER_REQUEST, facts=facts).plan, facts.to_json())


def _malformed(facts, tmp_path, case):
    doc, arts = _admission_inputs(facts, tmp_path)
    if case == "binding coefficient past float32":
        doc, arts = _per_request_doc(facts)
        _first_kernel(doc)["bindings"][0]["coefficient"] = {"value": 3.5e38}
        _resalted(doc)
        return extra_args(doc, arts), "bindings[0].coefficient"
    if case == "binding coefficient past float32 with its value":
        doc, arts = _per_request_doc(facts)
        _first_kernel(doc)["bindings"][0]["coefficient"] = {"value": 3.5e38}
        _first_kernel(doc)["op"]["scale"] = {"value": 3.5e38}
        _resalted(doc)
        return extra_args(doc, arts), "op.scale"
    if case == "a lone surrogate in a dict plan":
        doc["source"]["name"] = "x\ud800"
        return dict(extra_args(doc, arts), steerc_plan=doc), "steerc_plan"
    if case == "NaN in a dict plan's constraint":
        doc["constraint"] = {"kind": "json_schema", "schema": {"minimum": float("nan")}}
        return dict(extra_args(doc, arts), steerc_plan=doc), "steerc_plan"
    if case == "artifacts: 5":
        doc["artifacts"] = 5
        return extra_args(doc, arts, inline=False), "steerc_plan.artifacts"
    if case == "steerc_plans (a typo)":
        args = extra_args(doc, arts)
        return {"steerc_plans": args.pop(PLAN_KEY), **args}, "steerc_plans"
    if case.startswith("extra_args "):
        return {"list": [PLAN_KEY], "string": PLAN_KEY, "number": 5, "tuple": (PLAN_KEY,)}[case.split()[1]], \
            "extra_args"
    raise AssertionError(case)


MALFORMED = ["binding coefficient past float32", "binding coefficient past float32 with its value",
             "a lone surrogate in a dict plan", "NaN in a dict plan's constraint", "artifacts: 5",
             "steerc_plans (a typo)", "extra_args list", "extra_args string", "extra_args number", "extra_args tuple"]


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_requests_are_refused_naming_the_field(facts, tmp_path, case):
    from steerc.runtime.vllm.serve import ArtifactStore
    from steerc.targets.serve.admission import RequestError, admit

    args, field = _malformed(facts, tmp_path, case)
    with pytest.raises(RequestError) as err:
        admit(args, facts, store=ArtifactStore(str(tmp_path / "store")))
    assert field in err.value.field, str(err.value)


# ------------------------------------------------------------ the HTTP middleware: every POST is admitted


class _App:
    """The ASGI app behind the middleware: records what reached it."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.calls.append((scope, body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _vllm_config(prefix_caching=True):
    from types import SimpleNamespace

    from steerc.runtime.vllm.engine import CONFIG_KEY, LOAD_FORMAT

    with open(os.path.join(EXAMPLES, "models", "tiny-llama", "config.json")) as fh:
        hf = json.load(fh)
    return SimpleNamespace(
        load_config=SimpleNamespace(load_format=LOAD_FORMAT), additional_config={CONFIG_KEY: {"mode": "serve"}},
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: dict(hf))))


def _post(middleware, chunks, headers):
    import asyncio
    from types import SimpleNamespace

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers,
             "app": SimpleNamespace(state=SimpleNamespace(vllm_config=_vllm_config()))}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def _steered_body(facts, tmp_path, example="12_per_token_gate.steer", **edit):
    doc, arts = _admission_inputs(facts, tmp_path, example)
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2, "vllm_xargs": extra_args(doc, arts),
            "cache_salt": doc["cache_salt"]}
    body["vllm_xargs"].update(edit)
    return body, doc


def _encodings():
    import gzip
    import zlib

    utf8 = lambda b: json.dumps(b).encode()  # noqa: E731
    return {
        "no content type": ([], lambda b: [utf8(b)]),
        "text/plain": ([(b"content-type", b"text/plain")], lambda b: [utf8(b)]),
        "json with a charset": ([(b"content-type", b"application/json; charset=utf-8")], lambda b: [utf8(b)]),
        "chunked": ([(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
                    lambda b: [utf8(b)[i:i + 7] for i in range(0, len(utf8(b)), 7)]),
        "utf-16": ([(b"content-type", b"application/json")], lambda b: [json.dumps(b).encode("utf-16")]),
        "utf-32-le": ([], lambda b: [json.dumps(b).encode("utf-32-le")]),
        "a utf-8 BOM": ([(b"content-type", b"application/json")], lambda b: [b"\xef\xbb\xbf" + utf8(b)]),
        "gzip": ([(b"content-type", b"application/json"), (b"content-encoding", b"gzip")],
                 lambda b: [gzip.compress(utf8(b))]),
        "deflate": ([(b"content-encoding", b"deflate")], lambda b: [zlib.compress(utf8(b))]),
    }


@pytest.mark.parametrize("how", sorted(_encodings()))
def test_the_middleware_admits_a_steered_post_whatever_its_headers(facts, tmp_path, monkeypatch, how):
    from steerc.runtime.serve_http import SteercAdmission

    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    headers, encode = _encodings()[how]
    good, doc = _steered_body(facts, tmp_path)
    bad, _ = _steered_body(facts, tmp_path, steerc_plan="{not json")
    app = _App()
    middleware = SteercAdmission(app)
    status, reply = _post(middleware, encode(bad), headers)
    assert status == 400 and reply["error"]["param"] == "steerc_plan" and not app.calls, reply
    status, reply = _post(middleware, encode(good), headers)
    assert status == 200 and len(app.calls) == 1, reply
    scope, forwarded = app.calls[0]
    sent = json.loads(forwarded)  # what vLLM reads: plain UTF-8 JSON, uncompressed, its length declared
    assert sent["vllm_xargs"][PLAN_KEY] == good["vllm_xargs"][PLAN_KEY]
    names = dict(scope["headers"])
    assert names[b"content-length"] == str(len(forwarded)).encode() and b"content-encoding" not in names


UNREADABLE = {
    "not JSON but steerc fields": (b'{"vllm_xargs": {"steerc_plan": ', [], "body"),
    "latin-1 bytes": ('{"vllm_xargs": {"steerc_plan": "\xe9"}'.encode("latin-1"), [], "body"),
    "utf-16 without a BOM, broken": ('{"vllm_xargs": {"steerc_plan"'.encode("utf-16-le"), [], "body"),
    "a broken gzip stream": (b"\x1f\x8b\x08\x00steerc_plan", [(b"content-encoding", b"gzip")], "content-encoding"),
    "brotli": (b'{"vllm_xargs": {"steerc_plan": "x"}}', [(b"content-encoding", b"br")], "content-encoding"),
    "steerc fields outside vllm_xargs": (b'{"prompt": "hi", "steerc_plan": "{}"}', [], "steerc_plan"),
    "a steerc key spelt with escapes": (b'{"vllm_xargs": {"steerc\\u005fplans": "{}"}}', [], "steerc_plans"),
    "vllm_xargs a list naming steerc": (b'{"vllm_xargs": ["steerc_plan"]}', [], "vllm_xargs"),
    "steerc_plans (a typo)": (b'{"vllm_xargs": {"steerc_plans": "{}"}}', [], "steerc_plans"),
    "only artifacts": (b'{"vllm_xargs": {"steerc_artifacts": "{}"}}', [], "steerc_artifacts"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_the_middleware_refuses_what_it_cannot_admit_rather_than_forward_it(tmp_path, monkeypatch, case):
    from steerc.runtime.serve_http import SteercAdmission

    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    body, headers, field = UNREADABLE[case]
    app = _App()
    status, reply = _post(SteercAdmission(app), [body], headers)
    assert status == 400 and not app.calls, reply
    assert reply["error"]["param"] == field, reply


@pytest.mark.parametrize("body, headers", [
    (b'{"model": "m", "prompt": "hi", "vllm_xargs": {"other": "1"}}', []),
    (b"not json at all", [(b"content-type", b"text/plain")]),
    (b"\x1f\x8b\x08\x00 not gzip", [(b"content-encoding", b"gzip")]),
])
def test_the_middleware_forwards_plain_posts_byte_for_byte(tmp_path, monkeypatch, body, headers):
    from steerc.runtime.serve_http import SteercAdmission

    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    app = _App()
    status, _ = _post(SteercAdmission(app), [body[:5], body[5:]], headers)
    assert status == 200 and app.calls[0][1] == body and app.calls[0][0]["headers"] == headers


def test_a_plan_that_reads_every_prompt_token_gets_a_salt_per_request(facts, tmp_path, monkeypatch):
    """Prompt-pooled probes and prompt-relative scopes (prefix_cache_safe false): each request is forwarded
    with a cache_salt of its own, so vLLM never serves it KV another request computed; a plan that steers
    every position alike keeps the plan's salt (and the prefix cache)."""
    from steerc.runtime.serve_http import SteercAdmission

    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    app = _App()
    middleware = SteercAdmission(app)
    for example, shared in (("03_cast_gate.steer", False), ("01_add.steer", False), ("02_abliterate.steer", True)):
        body, doc = _steered_body(facts, tmp_path, example)
        salts = []
        for _ in range(2):
            status, reply = _post(middleware, [json.dumps(body).encode()], [])
            assert status == 200, reply
            salts.append(json.loads(app.calls[-1][1])["cache_salt"])
        if shared:
            assert salts == [doc["cache_salt"]] * 2, example
        else:
            assert salts[0] != salts[1] and all(s.startswith(doc["cache_salt"]) for s in salts), example
