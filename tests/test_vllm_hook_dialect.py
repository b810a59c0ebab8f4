"""The vLLM-Hook dialect (``--target serve --dialect vllm-hook``): IBM vLLM-Hook's G3 intervention spec.

What is checked here, without vLLM:

* every shared example either lowers cleanly to a spec that validates against
  ``spec/vllm_hook.schema.json`` and fits vLLM-Hook's 64 KiB cap, or is refused
  with ``unsupported-by-target`` (the expected outcome is listed per example);
* the canonical JSON, artifact bytes, spec hash and request salt reproduce the
  golden values recorded from vLLM-Hook's ``core/canonical.py`` (notes §4.1);
* artifacts re-hash to their ids, and the output is deterministic;
* the lowered ops, run through a numpy transcription of vLLM-Hook's transform,
  scope and gate semantics, compute what ``steerc.ir.interpret`` computes;
* every refused construct is reported at the right line, with a reason and a help.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import zlib

import numpy as np
import pytest
from support import REPO, examples_path, needs_constraints, uses_constraint

from steerc.api import check_file
from steerc.facts import facts_from_config, load_facts
from steerc.ir.interpret import apply_kernel
from steerc.targets.hooks import scope_item
from steerc.targets.vllm_hook.emit import emit_vllm_hook
from steerc.targets.vllm_hook.format import (
    MAX_SPEC_BYTES,
    artifact_bytes,
    canonical_bytes,
    spec_hash,
)
from steerc.targets.vllm_hook.format import registry_id as artifact_id
from steerc.targets.vllm_hook.format import spec_salt as request_salt
from steerc.targets.vllm_hook.lower import check_vllm_hook, lower_vllm_hook

SCHEMA_PATH = os.path.join(REPO, "spec", "vllm_hook.schema.json")
SUPPORTED, REFUSED = "lowers", "unsupported-by-target"

# The expected outcome per shared example, and for the refused ones, a fragment of
# each error message with the intervention (or statement) it must point at.
EXAMPLES = {
    "01_add.steer": (SUPPORTED, ()),
    "02_abliterate.steer": (REFUSED, (("the embeddings at resid_pre[0]", "intervention abliterate"),)),
    "03_cast_gate.steer": (REFUSED, (("strict comparison `harmful > 0.2`", "intervention refuse_when_harmful"),)),
    "04_bank.steer": (SUPPORTED, ()),
    "05_ops_and_scopes.steer": (REFUSED, (("the embeddings", "intervention damp_early"),
                                          ("`scale 0.5`", "intervention damp_early"),
                                          ("token scope `[0, 1]`", "intervention damp_early"),
                                          ("`clamp formal to 3.0`", "intervention pin_formality"),
                                          ("token scope `prompt[-3:]`", "intervention pin_formality"),
                                          ("site kind `mlp_out`", "intervention no_sarcasm"),
                                          ('token scope `after "Answer:"`', "intervention no_sarcasm"),
                                          ("site kind `attn_out`", "intervention overwrite"),
                                          ("`set 0.1 * normalize(joy + formal)`", "intervention overwrite"),
                                          ("token scope `generated[:8]`", "intervention overwrite"),
                                          ("site kind `mlp_out`", "intervention silence"),
                                          ("`suppress`", "intervention silence"),
                                          ("token scope `prompt`", "intervention silence"))),
    "06_heads.steer": (REFUSED, (("`scale 0.0` at head[1, 0], head[1, 1]", "intervention knockout"),
                                 ("`scale 2.0` at head[3, 3]", "intervention boost"))),
    "07_json.steer": (REFUSED, (("`preserve norm`", "intervention businesslike"),
                                ("`json_schema` output constraint", "constrain"))),
    "08_choice.steer": (REFUSED, (("`choice` output constraint", "constrain"),)),
    "09_grammar.steer": (REFUSED, (("`grammar` output constraint", "constrain"),)),
    "10_regex_inline_schema.steer": (REFUSED, (("`regex` output constraint", "constrain"),)),
    "11_rotate.steer": (SUPPORTED, ()),
    "12_per_token_gate.steer": (REFUSED, (("compound gate", "intervention counter_sarcasm"),)),
}

# vLLM-Hook's kinds.ARTIFACT_TENSORS (G3).
ARTIFACT_TENSORS = {"additive": ("vector",), "projection": ("vector",), "rotation": ("basis",),
                    "head_additive": ("vector",), "affine": ("weights",), "cosine": ("directions",),
                    "projected_cosine": ("directions",)}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def facts():
    path = os.path.join(examples_path(), "models", "tiny-llama")
    if not os.path.isdir(path):
        pytest.skip(f"{path} not found")
    return load_facts(path)


@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip("jsonschema")
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        schema = json.load(fh)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _check_example(name: str, facts):
    path = os.path.join(examples_path(), name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} not found")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if uses_constraint(text):
        needs_constraints()
    result = check_file(path, facts=facts)
    assert result.ok and result.plan is not None, result.render()
    return result, text


def _line_of(text: str, anchor: str) -> int:
    """The 1-based line of ``intervention NAME {`` (anchor "intervention NAME") or of ``constrain``."""
    pattern = r"^\s*constrain\b" if anchor == "constrain" else rf"^\s*{re.escape(anchor)}\s*\{{"
    (line,) = [i for i, t in enumerate(text.splitlines(), 1) if re.search(pattern, t)]
    return line


def _check_spec(spec: dict, artifacts: dict, validator, facts) -> None:
    """What vLLM-Hook's parse_intervention_spec and worker staging would check."""
    errors = sorted(validator.iter_errors(spec), key=str)
    assert not errors, errors[0]
    data = canonical_bytes(spec)
    assert len(data) <= MAX_SPEC_BYTES
    assert json.loads(data) == spec
    referenced = set()
    for op in spec["ops"]:
        assert set(op) == {"layers", "transform", "scope", "gate"}  # gate always written (null or a gate)
        assert op["transform"]["modifiers"] == []
        for layer in op["layers"] + (op["gate"]["layers"] if op["gate"] else []):
            assert type(layer) is int and 0 <= layer < facts.layers  # JSON integers, in range (E_LAYER_RANGE)
        for key in ("strength", "angle"):
            if key in op["transform"]:
                assert type(op["transform"][key]) is float
        kinds = [(op["transform"]["kind"], op["transform"]["artifact"])]
        if op["gate"]:
            assert type(op["gate"]["rule"]["threshold"]) is float
            kinds.append((op["gate"]["readout"]["kind"], op["gate"]["readout"]["artifact"]))
        for kind, aid in kinds:
            referenced.add(aid)
            tensors = _load(artifacts[aid], aid)
            for name in ARTIFACT_TENSORS[kind]:
                assert name in tensors
            t = tensors[ARTIFACT_TENSORS[kind][0]]
            d = facts.hidden
            expected = {"additive": (d,), "projection": (d,), "rotation": (2, d), "affine": (1, d), "cosine": (1, d),
                        "projected_cosine": (1, d), "head_additive": (facts.heads, facts.head_dim)}[kind]
            assert t.shape == expected
            if kind == "rotation":
                b1, b2 = t.astype(np.float64)
                assert abs(b1 @ b2) / (np.linalg.norm(b1) * np.linalg.norm(b2)) <= 1 - 1e-6
            if kind in ("projection", "cosine", "projected_cosine"):
                assert np.linalg.norm(t) > 0
    assert referenced == set(artifacts)


def _load(data: bytes, aid: str) -> dict:
    from safetensors.numpy import load

    assert artifact_id(data) == aid, "an artifact must re-hash to its id"
    tensors = load(data)
    assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in tensors.values())
    assert artifact_bytes(tensors) == data, "artifact bytes must already be canonical (vLLM-Hook re-serialises on PUT)"
    (header_len,) = np.frombuffer(data[:8], dtype="<u8")
    assert "__metadata__" not in json.loads(data[8:8 + int(header_len)])
    return tensors


# ------------------------------------------------------------------ the shared examples


def test_every_example_is_listed():
    names = {os.path.basename(p) for p in glob.glob(os.path.join(examples_path(), "*.steer"))}
    if not names:
        pytest.skip("shared examples not found")
    assert names == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_lowers_or_is_refused(name, facts, validator):
    result, text = _check_example(name, facts)
    spec, artifacts, diagnostics = lower_vllm_hook(result.plan, facts)
    outcome, expected = EXAMPLES[name]
    errors = [d for d in diagnostics if d.is_error]
    if outcome == SUPPORTED:
        assert not errors, [d.message for d in errors]
        assert spec is not None and spec["ops"]
        _check_spec(spec, artifacts, validator, facts)
        return
    assert spec is None and artifacts == {}
    assert errors and all(d.code == "unsupported-by-target" for d in errors)
    for d in errors:
        assert d.span is not None and d.span.file.endswith(name) and d.help, d
        assert d.message.startswith("the vllm-hook target cannot express ")
    for fragment, anchor in expected:
        owner = anchor.replace("intervention ", "(intervention `") + "`)" if anchor != "constrain" else ""
        hits = [d for d in errors if fragment in d.message and owner in d.message]
        assert len(hits) == 1, f"{fragment!r} {owner!r}: {[d.message for d in errors]}"
        assert hits[0].span.line == _line_of(text, anchor), (fragment, hits)
    assert len(errors) == len(expected), [d.message for d in errors]


def test_supported_examples_shapes(facts):
    """Spot checks of what the supported examples lower to."""
    spec, _, _ = lower_vllm_hook(_check_example("01_add.steer", facts)[0].plan, facts)
    assert [(op["layers"], op["transform"]["kind"], op["scope"]) for op in spec["ops"]] == [
        ([1], "additive", {"kind": "after_prompt"}), ([2], "additive", {"kind": "after_prompt"})]
    spec, _, _ = lower_vllm_hook(_check_example("04_bank.steer", facts)[0].plan, facts)
    assert [(op["layers"][0], op["scope"]) for op in spec["ops"]] == [
        (0, {"kind": "all"}), (1, {"kind": "all"}), (1, {"kind": "last_k", "k": 1}),
        (2, {"kind": "all"}), (2, {"kind": "last_k", "k": 1}), (3, {"kind": "all"})]
    spec, _, _ = lower_vllm_hook(_check_example("11_rotate.steer", facts)[0].plan, facts)
    assert [(op["layers"][0], op["transform"]["mode"], op["transform"]["angle"]) for op in spec["ops"]] == [
        (0, "offset", np.deg2rad(15.0)), (1, "target", np.deg2rad(120.0)),
        (2, "target", np.deg2rad(120.0)), (3, "target", np.deg2rad(120.0))]
    assert b'"strength":1.0' in canonical_bytes(lower_vllm_hook(
        _check_example("01_add.steer", facts)[0].plan, facts)[0])


# ------------------------------------------------------------------ canonical bytes (notes §4.1)

GOLDEN_ID = "sha256:252dfc17e4cf1f0419d9e5328822c9798a93df6436cc16589f41c6d0783700da"
GOLDEN_SPEC = (b'{"ops":[{"gate":null,"layers":[3],"scope":{"kind":"after_prompt"},"transform":{"artifact":'
               b'"sha256:252dfc17e4cf1f0419d9e5328822c9798a93df6436cc16589f41c6d0783700da","kind":"additive",'
               b'"modifiers":[],"strength":2.0}}]}')
GOLDEN_HASH = "sha256:5f0b7d62875d778f55ea726f525264b94a5b344e4f86ffcf7be0816cd3c9756c"
GOLDEN_SALT = "f3acc012180c0bddc85047de0f0ee8ba6aba3ec6d8a693bac5ddc5efd24e3c6d"


def _e0(n: int = 8) -> np.ndarray:
    v = np.zeros(n, dtype=np.float32)
    v[0] = 1.0
    return v


def test_golden_canonical_spec_hash_and_salt():
    data = artifact_bytes({"vector": _e0()})
    assert len(data) == 104
    aid = artifact_id(data)
    assert aid == GOLDEN_ID
    spec = {"ops": [{"layers": [3], "transform": {"kind": "additive", "strength": 2.0, "artifact": aid,
                                                  "modifiers": []},
                     "scope": {"kind": "after_prompt"}, "gate": None}]}
    assert canonical_bytes(spec) == GOLDEN_SPEC
    assert spec_hash(spec) == GOLDEN_HASH == "sha256:" + hashlib.sha256(GOLDEN_SPEC).hexdigest()
    assert request_salt(spec, [aid]) == GOLDEN_SALT
    assert request_salt(spec, {aid}) == GOLDEN_SALT
    assert re.fullmatch(r"[0-9a-f]{64}", GOLDEN_SALT)


def test_canonical_bytes_rules():
    assert canonical_bytes({"b": 1, "a": [2.0, -0.0, 1e-05, 1e+20]}) == b'{"a":[2.0,-0.0,1e-05,1e+20],"b":1}'
    assert canonical_bytes({"s": "\u00e9"}) == b'{"s":"\\u00e9"}'  # ensure_ascii left on
    assert canonical_bytes({"x": 2}) != canonical_bytes({"x": 2.0})
    assert canonical_bytes({"gate": None}) != canonical_bytes({})
    # the salt covers the artifacts, order-free
    spec = {"ops": []}
    assert request_salt(spec, ["sha256:" + "b" * 64, "sha256:" + "a" * 64]) == \
        request_salt(spec, ["sha256:" + "a" * 64, "sha256:" + "b" * 64]) != request_salt(spec, [])


def test_artifact_bytes_are_canonical():
    basis = np.arange(8, dtype=np.float64).reshape(2, 4)[:, ::-1]  # float64, not contiguous
    a = artifact_bytes({"vector": np.ones(4), "basis": basis})
    b = artifact_bytes({"basis": np.ascontiguousarray(basis, dtype="<f4"), "vector": np.ones(4, dtype=">f4")})
    assert a == b
    header = a[8:8 + int(np.frombuffer(a[:8], dtype="<u8")[0])]
    assert header.startswith(b'{"basis":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]},'
                             b'"vector":{"dtype":"F32","shape":[4],"data_offsets":[32,48]}}')
    assert len(header) % 8 == 0 and header.rstrip(b" ") != header


def _toy_facts(hidden=8, layers=4, heads=2):
    return facts_from_config({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
                              "num_attention_heads": heads, "num_key_value_heads": heads,
                              "intermediate_size": 4 * hidden, "vocab_size": 32})


def test_a_lowered_program_matches_the_golden_shape(tmp_path):
    """`add e0` at resid_post[3] over generated tokens is the golden spec with strength 1.0."""
    facts = _toy_facts()
    prog = tmp_path / "golden.steer"
    prog.write_text("steer 1\n\nvector e0 = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]\n\n"
                    "intervention push {\n  at     resid_post[3]\n  add    e0\n  tokens generated\n}\n")
    result = check_file(str(prog), facts=facts)
    assert result.ok, result.render()
    spec, artifacts, diagnostics = lower_vllm_hook(result.plan, facts)
    assert not diagnostics
    assert list(artifacts) == [GOLDEN_ID]
    assert canonical_bytes(spec) == GOLDEN_SPEC.replace(b'"strength":2.0', b'"strength":1.0')


# ------------------------------------------------------------------ emitting, determinism


def test_emit_writes_spec_request_and_artifacts(tmp_path, facts, validator):
    plan = _check_example("04_bank.steer", facts)[0].plan
    out1, out2 = tmp_path / "a", tmp_path / "b"
    written = emit_vllm_hook(plan, facts, str(out1))
    again = emit_vllm_hook(_check_example("04_bank.steer", facts)[0].plan, facts, str(out2))
    assert written == again and written[:2] == ["intervention_spec.json", "request.json"]
    for name in written:
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), f"{name} is not deterministic"
    spec_bytes = (out1 / "intervention_spec.json").read_bytes()
    spec = json.loads(spec_bytes)
    assert canonical_bytes(spec) == spec_bytes
    artifacts = {}
    for name in written[2:]:
        assert re.fullmatch(r"artifacts/[0-9a-f]{64}\.safetensors", name.replace(os.sep, "/"))
        aid = "sha256:" + os.path.basename(name).split(".")[0]
        artifacts[aid] = (out1 / name).read_bytes()
    _check_spec(spec, artifacts, validator, facts)
    request = json.loads((out1 / "request.json").read_text(encoding="utf-8"))
    assert set(request) == {"extra_args", "vllm_xargs", "cache_salt"}
    assert request["extra_args"] == {"intervention_spec": spec}
    assert request["vllm_xargs"] == {"intervention_spec": spec_bytes.decode("ascii")}
    assert request["cache_salt"] == request_salt(spec, artifacts)
    lowered, lowered_artifacts, _ = lower_vllm_hook(plan, facts)
    assert lowered == spec and lowered_artifacts == artifacts


def test_lowering_is_deterministic(facts):
    for name in ("01_add.steer", "04_bank.steer", "11_rotate.steer"):
        a = lower_vllm_hook(_check_example(name, facts)[0].plan, facts)
        b = lower_vllm_hook(_check_example(name, facts)[0].plan, facts)
        assert canonical_bytes(a[0]) == canonical_bytes(b[0]) and a[1] == b[1]


def test_check_vllm_hook_reports_before_emitting(facts):
    result, _ = _check_example("06_heads.steer", facts)
    assert result.ok
    check_vllm_hook(result)
    check_vllm_hook(result)  # idempotent
    assert not result.ok and len(result.errors) == 2
    assert all(d.code == "unsupported-by-target" for d in result.errors)
    result, _ = _check_example("01_add.steer", facts)
    check_vllm_hook(result)
    assert result.ok


def test_emit_refuses_what_it_cannot_express(tmp_path, facts):
    plan = _check_example("06_heads.steer", facts)[0].plan
    with pytest.raises(ValueError, match="unsupported|cannot express") as info:
        emit_vllm_hook(plan, facts, str(tmp_path / "out"))
    assert all(d.code == "unsupported-by-target" for d in info.value.diagnostics)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ numerics: vLLM-Hook's semantics in numpy


def hook_transform(transform: dict, tensors: dict, rows: np.ndarray) -> np.ndarray:
    """vLLM-Hook's core/interpreter/transforms.py (notes §5.3), in float64."""
    kind = transform["kind"]
    if kind == "additive":
        return rows + transform["strength"] * tensors["vector"].astype(np.float64)
    if kind == "projection":
        v = tensors["vector"].astype(np.float64)
        v = v / np.linalg.norm(v)
        return rows - np.outer(rows @ v, v)
    if kind == "rotation":
        basis = tensors["basis"].astype(np.float64)
        b1 = basis[0] / (np.linalg.norm(basis[0]) + 1e-8)
        b2 = basis[1] - (basis[1] @ b1) * b1
        b2 = b2 / (np.linalg.norm(b2) + 1e-8)
        c1, c2 = rows @ b1, rows @ b2
        delta = transform["angle"] - np.arctan2(c2, c1) if transform["mode"] == "target" else transform["angle"]
        n1 = np.cos(delta) * c1 - np.sin(delta) * c2
        n2 = np.sin(delta) * c1 + np.cos(delta) * c2
        return rows + np.outer(n1 - c1, b1) + np.outer(n2 - c2, b2)
    if kind == "head_additive":  # rows: [n, heads, head_dim]
        return rows + transform["strength"] * tensors["vector"].astype(np.float64)
    raise AssertionError(kind)


def hook_scope_rows(scope: dict, positions: np.ndarray, prompt_len: int) -> np.ndarray:
    """vLLM-Hook's core/interpreter/scopes.py (notes §5.5): absolute positions."""
    kind = scope["kind"]
    if kind == "all":
        return np.ones_like(positions, dtype=bool)
    if kind == "after_prompt":
        return positions >= prompt_len
    if kind == "last_k":
        return positions >= prompt_len - scope["k"]
    return positions >= scope["position"]


def hook_gate(gate: dict, tensors: dict, prompt_rows: np.ndarray) -> bool:
    """vLLM-Hook's GateState frozen over the prompt rows of its one condition layer (notes §5.6)."""
    pooled = prompt_rows.mean(axis=0) if gate["pooling"] == "mean" else prompt_rows[-1]
    readout = gate["readout"]["kind"]
    if readout == "affine":
        value = tensors["weights"][0].astype(np.float64) @ pooled
    elif readout == "projected_cosine":  # gates.py: P = d dᵀ / (d·d + eps); cos(p, tanh(p P)) + eps
        d = tensors["directions"][0].astype(np.float64)
        projected = np.tanh(pooled @ (np.outer(d, d) / (d @ d + 1e-8)))
        value = (pooled @ projected) / (np.linalg.norm(pooled) * np.linalg.norm(projected) + 1e-8)
    else:
        d = tensors["directions"][0].astype(np.float64)
        value = (pooled @ d) / (np.linalg.norm(pooled) * np.linalg.norm(d) + 1e-8)
    rule = gate["rule"]
    assert rule["kind"] == "per_key_threshold" and rule["aggregate"] in ("any", "all")
    return value >= rule["threshold"] if rule["comparator"] == "ge" else value <= rule["threshold"]


def steerc_mask(scopes, positions: np.ndarray, prompt_len: int) -> np.ndarray:
    """steerc's scope semantics (spec/language.md §10), as runtime/_support.position_mask computes them."""
    mask = np.zeros_like(positions, dtype=bool)
    for s in scopes:
        item = scope_item(s)
        if item[0] == "all":
            mask |= True
        elif item[0] == "prompt":
            mask |= np.isin(positions, np.arange(prompt_len)[slice(item[1], item[2])])
        elif item[0] == "generated":
            g = positions - prompt_len
            mask |= (g >= (item[1] or 0)) & ((g < item[2]) if item[2] is not None else True)
        else:
            raise AssertionError(item)
    return mask


def steerc_gate(gate, plan, prompt_rows: np.ndarray) -> bool:
    probe = plan.probe(gate.probe)
    pooled = prompt_rows.mean(axis=0) if probe.pool == "prompt.mean" else prompt_rows[-1]
    v = probe.vectors[0].array.astype(np.float64)
    if probe.kind == "dot":
        value = pooled @ v + probe.bias
    elif probe.kind == "projected_cosine":  # CAST: cos(h, tanh(P h)), P = v vᵀ / (v·v)
        projected = np.tanh(np.outer(v, v) @ pooled / (v @ v))
        value = pooled @ projected / (np.linalg.norm(pooled) * np.linalg.norm(projected))
    else:
        denom = np.linalg.norm(pooled) * np.linalg.norm(v)
        value = pooled @ v / denom if denom > 0 else 0.0
    return {">=": value >= gate.threshold, "<=": value <= gate.threshold,
            ">": value > gate.threshold, "<": value < gate.threshold}[gate.op]


VECTORS_SEED = 20260501


def _write_vectors(folder, facts) -> dict:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(VECTORS_SEED)
    vecs = {k: rng.normal(size=facts.hidden).astype(np.float32) for k in ("a", "b", "c", "w")}
    vecs["hv"] = rng.normal(size=facts.head_dim).astype(np.float32)
    vecs["hu"] = rng.normal(size=facts.head_dim).astype(np.float32)
    save_file(vecs, str(folder / "v.safetensors"))
    return vecs


HEADER = """steer 1

vector a  = load("v.safetensors", key="a")
vector b  = load("v.safetensors", key="b")
vector c  = load("v.safetensors", key="c")
vector w  = load("v.safetensors", key="w")
vector hv = load("v.safetensors", key="hv")
vector hu = load("v.safetensors", key="hu")
"""

NUMERIC_PROGRAMS = {
    "add": """
intervention push { at resid_post[1:3]  add 2.5 * a  tokens generated }
intervention lift { at resid_pre[1]      add -0.5 * b }
intervention tail { at resid_post[3]     add c  tokens prompt[-2:], generated }
""",
    "ablate_rank2": """
intervention abl { at resid_post[0:2]  ablate a, b }
""",
    "rotate": """
intervention to   { at resid_post[1]  rotate in (a, b) to 120deg  tokens generated }
intervention by   { at resid_post[2]  rotate in (b, c) by -0.7 }
intervention zero { at resid_post[3]  rotate in (c, a) to 3.0  tokens prompt[-1], generated }
""",
    "heads": """
intervention h1 { at head[1, 0:2]  add hv }
intervention h2 { at head[2, 3]    add 0.5 * hu  tokens generated }
intervention h3 { at head[2, 1]    add hu  tokens prompt[-3:], generated }
""",
    "mixed_site": """
intervention first  { at resid_post[1]  add a }
intervention second { at resid_post[1]  ablate b, c  tokens generated }
intervention third  { at resid_post[1]  rotate in (a, w) by 0.3  tokens prompt[-4:], generated }
intervention fourth { at resid_post[1]  add 3 * w  tokens generated }
""",
}


def _blocks(text: str) -> str:
    """Expand one-line blocks ``name { line  line }`` (fields two spaces apart) into Steer's block layout."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"(\w.*?)\{\s*(.*?)\s*\}\s*", line)
        if m:
            out.append(m.group(1).rstrip() + " {")
            out.extend("  " + field for field in re.split(r"\s{2,}", m.group(2)))
            out.append("}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _compile(tmp_path, body: str, facts, name: str = "p.steer"):
    _write_vectors(tmp_path, facts)
    prog = tmp_path / name
    prog.write_text(_blocks(HEADER + body), encoding="utf-8")
    result = check_file(str(prog), facts=facts)
    assert result.ok, result.render()
    return result


@pytest.mark.parametrize("prompt_len", [1, 3, 6])
@pytest.mark.parametrize("program", sorted(NUMERIC_PROGRAMS))
def test_lowered_ops_compute_what_the_plan_computes(program, prompt_len, tmp_path, facts, validator):
    result = _compile(tmp_path, NUMERIC_PROGRAMS[program], facts)
    plan = result.plan
    spec, artifacts, diagnostics = lower_vllm_hook(plan, facts)
    assert not diagnostics, [d.message for d in diagnostics]
    _check_spec(spec, artifacts, validator, facts)
    tensors = {aid: _load(data, aid) for aid, data in artifacts.items()}
    rng = np.random.default_rng(zlib.crc32(f"{program}/{prompt_len}".encode()))
    n = prompt_len + 4
    positions = np.arange(n)
    checked_sites = 0
    for layer in range(facts.layers):
        # the residual stream leaving layer `layer`
        h = rng.normal(scale=3.0, size=(n, facts.hidden))
        ours = h.copy()
        sp = plan.site(_site("resid_post", layer))
        for k in sp.kernels if sp else ():
            ours = apply_kernel(k, ours, steerc_mask(k.scope, positions, prompt_len))
        theirs = h.copy()
        for op in spec["ops"]:
            if op["layers"] == [layer] and op["transform"]["kind"] != "head_additive":
                rows = hook_scope_rows(op["scope"], positions, prompt_len)
                theirs[rows] = hook_transform(op["transform"], tensors[op["transform"]["artifact"]], theirs[rows])
        np.testing.assert_allclose(theirs, ours, rtol=1e-6, atol=1e-5)
        # the heads entering o_proj in layer `layer`
        x = rng.normal(size=(n, facts.heads, facts.head_dim))
        ours_x = x.copy()
        for head in range(facts.heads):
            sp = plan.site(_site("head", layer, head))
            for k in sp.kernels if sp else ():
                ours_x[:, head] = apply_kernel(k, ours_x[:, head], steerc_mask(k.scope, positions, prompt_len))
        theirs_x = x.copy()
        for op in spec["ops"]:
            if op["layers"] == [layer] and op["transform"]["kind"] == "head_additive":
                rows = hook_scope_rows(op["scope"], positions, prompt_len)
                theirs_x[rows] = hook_transform(op["transform"], tensors[op["transform"]["artifact"]], theirs_x[rows])
        np.testing.assert_allclose(theirs_x, ours_x, rtol=1e-6, atol=1e-5)
        checked_sites += bool(not np.array_equal(ours, h)) + bool(not np.array_equal(ours_x, x))
    assert checked_sites, "the program must change something"


def _site(kind, layer, head=None):
    from steerc.ir.plan import Site

    return Site(kind, layer, head)


GATED = {
    "dot_mean_ge": ("""
probe p { at resid_post[0]  read dot(w) + 0.25  pool prompt.mean }
intervention g { at resid_post[2]  add a  tokens generated  when p >= THRESHOLD }
""", 1, "mean", "affine", "ge"),
    "cosine_last_le": ("""
probe p { at resid_pre[0]  read cosine(b)  pool prompt.last }
intervention g { at resid_post[1]  add a  tokens generated  when p <= THRESHOLD }
""", 0, "last", "cosine", "le"),
    "dot_last_flipped": ("""
probe p { at resid_pre[2]  read dot(c) - 1.5  pool prompt.last }
intervention g { at resid_post[0]  ablate a  tokens generated  when THRESHOLD >= p }
""", 2, "last", "affine", "le"),
    "projected_cosine_mean_ge": ("""
probe p { at resid_pre[1]  read projected_cosine(b)  pool prompt.mean }
intervention g { at resid_post[2]  add a  tokens generated  when p >= THRESHOLD }
""", 1, "mean", "projected_cosine", "ge"),
}


@pytest.mark.parametrize("case", sorted(GATED))
def test_gates_decide_as_the_plan_does(case, tmp_path, facts, validator):
    body, condition_layer, pooling, readout, comparator = GATED[case]
    rng = np.random.default_rng(7)
    decisions = set()
    for trial in range(6):
        threshold = [-0.4, 0.0, 0.1, 0.3, -2.0, 2.0][trial]
        result = _compile(tmp_path, body.replace("THRESHOLD", repr(threshold)), facts, f"g{trial}.steer")
        plan = result.plan
        spec, artifacts, diagnostics = lower_vllm_hook(plan, facts)
        assert not diagnostics, [d.message for d in diagnostics]
        _check_spec(spec, artifacts, validator, facts)
        tensors = {aid: _load(data, aid) for aid, data in artifacts.items()}
        (op,) = spec["ops"][:1]
        gate = op["gate"]
        assert gate["layers"] == [condition_layer] and gate["pooling"] == pooling
        assert gate["readout"]["kind"] == readout and gate["rule"]["comparator"] == comparator
        assert op["scope"] == {"kind": "after_prompt"}
        kernel = next(k for sp in plan.sites for k in sp.kernels)
        for _ in range(40):
            prompt_rows = rng.normal(loc=rng.normal(scale=0.3, size=facts.hidden), size=(5, facts.hidden))
            ours = steerc_gate(kernel.gate, plan, prompt_rows)
            theirs = hook_gate(gate, tensors[gate["readout"]["artifact"]], prompt_rows)
            assert bool(ours) == bool(theirs)
            decisions.add(bool(ours))
    assert decisions == {True, False}, "the thresholds should exercise both outcomes"


def test_a_gate_reads_its_probe_site_before_the_kernels_there(tmp_path, facts):
    """vLLM-Hook reads layer l+1's input after layer l's ops; steerc's probe at resid_post[l] reads before them."""
    body = """
probe p { at resid_post[0]  read dot(w)  pool prompt.mean }
intervention early { at resid_post[0]  add b }
intervention g     { at resid_post[2]  add a  tokens generated  when p >= 0.5 }
"""
    result = _compile(tmp_path, body, facts)
    _, _, diagnostics = lower_vllm_hook(result.plan, facts)
    (d,) = diagnostics
    assert d.code == "unsupported-by-target" and "`early` also steers prompt positions" in d.message
    text = (tmp_path / "p.steer").read_text()
    assert d.span.line == _line_of(text, "intervention g")
    assert any(n.span is not None and n.span.line == _line_of(text, "intervention early") for n in d.notes)
    # restricted to generated tokens, `early` never touches the gate's evidence
    result = _compile(tmp_path, body.replace("add b }", "add b  tokens generated }"), facts, "q.steer")
    spec, _, diagnostics = lower_vllm_hook(result.plan, facts)
    assert not diagnostics and spec["ops"][1]["gate"]["layers"] == [1]


# ------------------------------------------------------------------ each refused construct, at its line

REFUSALS = {
    "embeddings": ("intervention x { at resid_pre[0]  add a }", "the embeddings at resid_pre[0]"),
    "attn_out": ("intervention x { at attn_out[1]  add a }", "the site kind `attn_out`"),
    "mlp_out": ("intervention x { at mlp_out[2]  add a }", "the site kind `mlp_out`"),
    "scale": ("intervention x { at resid_post[1]  scale 2.0 }", "`scale 2.0`"),
    "scale_vector": ("intervention x { at resid_post[1]  scale a }", "`scale a`"),
    "scale_then_add": ("intervention x { at resid_post[1]  scale 0.5 }\n"
                       "intervention y { at resid_post[1]  add a }", "`scale 0.5` then `add a`"),
    "set": ("intervention x { at resid_post[1]  set a }", "`set a`"),
    "suppress": ("intervention x { at resid_post[1]  suppress }", "`suppress`"),
    "clamp": ("intervention x { at resid_post[1]  clamp a to 2.0 }", "`clamp a to 2.0`"),
    "head_scale": ("intervention x { at head[1, 2]  scale 0.0 }", "`scale 0.0` at head[1, 2]"),
    "head_ablate": ("intervention x { at head[1, 2]  ablate hv }", "`ablate hv` at head[1, 2]"),
    "preserve_norm": ("intervention x { at resid_post[1]  add a  preserve norm }", "`preserve norm`"),
    "preserve_norm_rotate": ("intervention x { at resid_post[1]  rotate in (a, b) by 0.5  preserve norm }",
                             "`preserve norm`"),
    "scope_prompt": ("intervention x { at resid_post[1]  add a  tokens prompt }", "token scope `prompt`"),
    "scope_prompt_slice": ("intervention x { at resid_post[1]  add a  tokens prompt[-2:] }",
                           "token scope `prompt[-2:]`"),
    "scope_prompt_head": ("intervention x { at resid_post[1]  add a  tokens prompt[2:], generated }",
                          "token scope `prompt[2:], generated`"),
    "scope_generated_slice": ("intervention x { at resid_post[1]  add a  tokens generated[2:] }",
                              "token scope `generated[2:]`"),
    "scope_positions": ("intervention x { at resid_post[1]  add a  tokens [0, 1, 2] }", "token scope `[0, 1, 2]`"),
    "scope_after": ('intervention x { at resid_post[1]  add a  tokens after "Q:" }', 'token scope `after "Q:"`'),
    "gate_strict": ("probe p { at resid_post[0]  read dot(w)  pool prompt.mean }\n"
                    "intervention x { at resid_post[1]  add a  tokens generated  when p > 0.5 }",
                    "strict comparison `p > 0.5`"),
    "gate_strict_lt": ("probe p { at resid_post[0]  read dot(w)  pool prompt.mean }\n"
                       "intervention x { at resid_post[1]  add a  tokens generated  when p < 0.5 }",
                       "strict comparison `p < 0.5`"),
    "gate_compound": ("probe p { at resid_post[0]  read dot(w)  pool prompt.mean }\n"
                      "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 and p <= 2.0 }",
                      "compound gate"),
    "gate_not": ("probe p { at resid_post[0]  read dot(w)  pool prompt.mean }\n"
                 "intervention x { at resid_post[1]  add a  tokens generated  when not (p >= 0.5) }",
                 "compound gate"),
    "gate_token": ("probe p { at resid_post[0]  read dot(w)  pool token }\n"
                   "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                   "the `token` pool of probe `p`"),
    "gate_projected_cosine_two": ("probe p { at resid_post[0]  read projected_cosine(w, a)  pool prompt.mean }\n"
                                  "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                                  "`projected_cosine` readout of probe `p` over 2 directions"),
    "gate_subspace_cosine": ("probe p { at resid_post[0]  read subspace_cosine(w)  pool prompt.mean }\n"
                             "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                             "`subspace_cosine` readout of probe `p`"),
    "gate_norm": ("probe p { at resid_post[0]  read norm  pool prompt.last }\n"
                  "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                  "`norm` readout of probe `p`"),
    "gate_last_layer": ("probe p { at resid_post[3]  read dot(w)  pool prompt.last }\n"
                        "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                        "a gate on probe `p` (read at resid_post[3])"),
    "gate_mlp_probe": ("probe p { at mlp_out[0]  read dot(w)  pool prompt.last }\n"
                       "intervention x { at resid_post[1]  add a  tokens generated  when p >= 0.5 }",
                       "a gate on probe `p` (read at mlp_out[0])"),
    "constraint": ('intervention x { at resid_post[1]  add a }\nconstrain regex "(yes|no)"',
                   "the `regex` output constraint"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refused_construct_is_reported_at_its_line(case, tmp_path, facts):
    body, fragment = REFUSALS[case]
    if "constrain" in body:
        needs_constraints()
    result = _compile(tmp_path, "\n# refused: " + case + "\n" + body + "\n", facts)
    spec, artifacts, diagnostics = lower_vllm_hook(result.plan, facts)
    assert spec is None and artifacts == {}
    hits = [d for d in diagnostics if fragment in d.message]
    assert len(hits) == 1, (fragment, [d.message for d in diagnostics])
    (d,) = hits
    assert d.code == "unsupported-by-target" and d.is_error and d.help
    assert d.message.startswith("the vllm-hook target cannot express ")
    text = (tmp_path / "p.steer").read_text()
    anchor = "constrain" if case == "constraint" else "intervention x"
    assert d.span is not None and d.span.line == _line_of(text, anchor)
    if case.startswith("gate_strict"):
        assert d.help == "use >= or <="
    # nothing else is reported for a single refused construct (bar the gate's own probe problems)
    assert all(x.code == "unsupported-by-target" for x in diagnostics)


def test_the_spec_size_cap(tmp_path):
    """A program whose canonical spec passes 64 KiB is refused (vLLM-Hook's E_SPEC_TOO_LARGE)."""
    facts = _toy_facts(hidden=8, layers=600)
    prog = tmp_path / "big.steer"
    prog.write_text("steer 1\n\nvector v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]\n\n"
                    "intervention everywhere {\n  at  resid_post[*]\n  add v\n}\n")
    result = check_file(str(prog), facts=facts)
    assert result.ok, result.render()
    spec, artifacts, diagnostics = lower_vllm_hook(result.plan, facts)
    assert spec is None and artifacts == {}
    (d,) = diagnostics
    assert d.code == "unsupported-by-target" and "E_SPEC_TOO_LARGE" in d.message and d.span.line == 5
    assert "600 ops" in d.message and d.help
    # at 300 layers it fits
    facts = _toy_facts(hidden=8, layers=300)
    spec, _, diagnostics = lower_vllm_hook(check_file(str(prog), facts=facts).plan, facts)
    assert not diagnostics and len(canonical_bytes(spec)) <= MAX_SPEC_BYTES


def test_capabilities_match_the_lowering():
    """The vllm-hook row of the capability matrix says what lower_vllm_hook does."""
    from steerc.targets import TARGETS

    t = TARGETS["vllm-hook"]
    yes = {"op:add", "op:ablate", "op:rotate", "site:resid_pre", "site:resid_post", "site:head", "scope:all",
           "scope:generated", "scope:prompt-slice", "scope:union", "gate:prompt.mean", "gate:prompt.last",
           "readout:cosine", "readout:dot", "readout:projected_cosine"}
    no = {"op:scale", "op:scale-vector", "op:set", "op:suppress", "op:clamp", "op:preserve-norm", "site:attn_out",
          "site:mlp_out", "scope:prompt", "scope:generated-slice", "scope:positions", "scope:after", "gate:token",
          "readout:subspace_cosine", "readout:norm", "constraint:json_schema", "constraint:regex",
          "constraint:grammar", "constraint:choice"}
    assert {k for k in yes if t.supports(k)} == yes
    assert {k for k in no if not t.supports(k)} == no
