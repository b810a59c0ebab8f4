"""plan.msgpack validation: every field a worker reads is checked, and a bad one is refused by name.

Each case takes a valid plan, breaks one thing, and re-seals it where the breakage would otherwise be
caught only by the content hash — so that the check under test is the one that fires. Nothing may
escape as anything but a PlanError (no TypeError, KeyError, RecursionError, MemoryError).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from support import examples_path  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from steerc.runtime.hf import facts_from_model  # noqa: E402
from steerc.targets.vllm.emit import plan_bytes  # noqa: E402
from steerc.targets.vllm.wire import PlanError, boot_sha256, seal, unpack, validate_plan  # noqa: E402

TEXT = ("steer 1\n"
        f"probe p {{\n  at resid_pre[1]\n  read projected_cosine({vec(64, 1)}, {vec(64, 2)})\n  pool prompt.mean\n}}\n"
        f"probe q {{\n  at resid_pre[1]\n  read dot({vec(64, 1)}) + 0.5\n  pool token\n}}\n"
        f"intervention x {{\n  at head[1, 2]\n  rotate in ({vec(16, 3)}, {vec(16, 4)}) to 30deg\n"
        "  tokens generated[:3]\n  when not (p > 0.1 and q < 0.9)\n}\n"
        f"intervention y {{\n  at resid_post[2]\n  clamp {vec(64, 5)} to 1.0\n  preserve norm\n"
        "  tokens prompt[-2:], [0, 3]\n}\n"
        f"intervention z {{\n  at mlp_out[0]\n  scale {vec(64, 6)}\n}}\n")
KEY = b"a test key of more than 16 bytes"


@pytest.fixture(scope="module")
def base():
    model = tiny_model("llama")
    facts = facts_from_model(model)
    return unpack(plan_bytes(plan_for(model, TEXT), facts)), facts.fingerprint


def hooks(o):
    return o["boot"]["hooks"]


def kernel(o, hook_name):
    return next(h for h in hooks(o) if h["name"] == hook_name)["sites"][0]["kernels"][0]


def restruct(o):
    """Re-hash the boot section and re-seal: the breakage itself must be what is refused."""
    o["header"]["boot_sha256"] = boot_sha256(o["boot"])
    seal(o)


CASES = {
    "shape None": (lambda o: o["boot"]["buffers"]["gates.thresholds"].__setitem__("shape", None),
                   "plan.boot.buffers.gates.thresholds.shape"),
    "buffer spec not a map": (lambda o: o["boot"]["buffers"].__setitem__("gates.thresholds", 3),
                              "plan.boot.buffers.gates.thresholds"),
    "hooks an int": (lambda o: o["boot"].__setitem__("hooks", 7), "plan.boot.hooks"),
    "hook on another module": (lambda o: hooks(o)[0].__setitem__("module", "model.embed_tokens"), "module"),
    "hook on a layer the model lacks": (lambda o: hooks(o)[0].update(layer=99), "layer"),
    "head out of range": (lambda o: next(h for h in hooks(o) if h["tensor"] == "heads")["sites"][0]
                          .update(head=9, columns=[144, 160]), "head"),
    "head columns moved": (lambda o: next(h for h in hooks(o) if h["tensor"] == "heads")["sites"][0]
                           .__setitem__("columns", [0, 16]), "columns"),
    "scope index past the scopes": (lambda o: kernel(o, "mlp_out_0").__setitem__("scope", 40), "scope"),
    "gate index past the gates": (lambda o: kernel(o, "mlp_out_0").__setitem__("gate", 3), "gate"),
    "gate on an unknown probe": (lambda o: o["boot"]["gates"][0][1][1][0].__setitem__(1, "nope"), "gates[0]"),
    "threshold index past the thresholds": (lambda o: o["boot"]["gates"][0][1][1][0].__setitem__(3, 9),
                                            "gates[0]"),
    "kernel tensor unknown": (lambda o: kernel(o, "mlp_out_0")["tensors"].__setitem__("scale", "missing"),
                              "tensors.scale"),
    "kernel role of another kind": (lambda o: kernel(o, "mlp_out_0")["tensors"].__setitem__(
        "basis", "mlp_out_0.k0.scale"), "tensors"),
    "rotation without a mode": (lambda o: kernel(o, "heads_1").__setitem__("mode", None), "mode"),
    "scope slice of 2**40": (lambda o: o["boot"]["scopes"][1][0].__setitem__(2, 2 ** 40), "scopes[1]"),
    "positions negative": (lambda o: o["boot"]["scopes"].append([["positions", [-1]]]), "scopes[3]"),
    "deeply nested gate": (lambda o: o["boot"]["gates"].__setitem__(0, _deep_gate(200)), "nested deeper"),
    "unused buffer": (lambda o: (o["boot"]["buffers"].__setitem__("spare", {"shape": [3], "dtype": "float32"}),
                                 o["state"]["tensors"].__setitem__("spare", {"dtype": "float32", "shape": [3],
                                                                             "data": b"\0" * 12})), "spare"),
    "buffer of a billion floats": (lambda o: o["boot"]["buffers"]["gates.thresholds"].__setitem__(
        "shape", [1048576, 1024]), "plan.boot.buffers"),
}


def _deep_gate(n):
    gate = ["cmp", "q", "<", 0]
    for _ in range(n):
        gate = ["not", gate]
    return gate


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_structure_is_refused_by_field(base, case):
    obj, fingerprint = copy.deepcopy(base[0]), base[1]
    edit, field = CASES[case]
    edit(obj)
    restruct(obj)
    with pytest.raises(PlanError) as err:
        validate_plan(obj, fingerprint=fingerprint)
    assert field in str(err.value), str(err.value)


HEADER = {
    "facts that do not hash to the fingerprint": (lambda h: h["facts"].__setitem__("layers", 3), "plan.header.facts"),
    "family not the facts'": (lambda h: h.__setitem__("family", "qwen2"), "plan.header.family"),
    "facts not a map": (lambda h: h.__setitem__("facts", ["llama"]), "plan.header.facts"),
    "constraint unreadable": (lambda h: h.__setitem__("constraint", {"kind": "regex", "value": 3}),
                              "plan.header.constraint"),
    "vllm band not text": (lambda h: h["vllm"].__setitem__("band", 3), "plan.header.vllm.band"),
    "unknown header key": (lambda h: h.__setitem__("extra", 1), "plan.header.extra"),
}


@pytest.mark.parametrize("case", sorted(HEADER))
def test_every_header_field_is_validated(base, case):
    obj = copy.deepcopy(base[0])
    edit, field = HEADER[case]
    edit(obj["header"])
    seal(obj)
    with pytest.raises(PlanError) as err:
        validate_plan(obj)
    assert field in str(err.value), str(err.value)


def test_content_hash_covers_header_boot_and_state(base):
    for edit in (lambda o: o["header"].__setitem__("source_name", "other.steer"),
                 lambda o: kernel(o, "mlp_out_0").__setitem__("label", "edited"),
                 lambda o: o["state"]["tensors"]["gates.thresholds"].__setitem__(
                     "data", np.asarray([0.2, 0.3], dtype="<f4").tobytes())):
        obj = copy.deepcopy(base[0])
        edit(obj)
        with pytest.raises(PlanError, match="content_sha256"):
            validate_plan(obj)


def test_hmac_is_required_and_checked_where_the_engine_has_a_key(base):
    obj = copy.deepcopy(base[0])
    with pytest.raises(PlanError, match="plan.header.hmac"):
        validate_plan(obj, key=KEY)  # unsigned
    seal(obj, KEY)
    assert validate_plan(obj, key=KEY)
    with pytest.raises(PlanError, match="plan.header.hmac"):
        validate_plan(obj, key=b"another key of more than 16 bytes")
    forged = copy.deepcopy(obj)
    forged["state"]["tensors"]["gates.thresholds"]["data"] = np.asarray([9, 9], dtype="<f4").tobytes()
    seal(forged)  # a new content hash, but the attacker has no key for the hmac
    forged["header"]["hmac"] = obj["header"]["hmac"]
    with pytest.raises(PlanError, match="plan.header.hmac"):
        validate_plan(forged, key=KEY)


def test_valid_plan_passes_and_refusals_never_escape_as_other_errors(base):
    assert validate_plan(copy.deepcopy(base[0]), fingerprint=base[1])
    for junk in (None, 3, "plan", [], {"format": "steerc.vllm/1"}, {"format": "steerc.vllm/1", "header": 3}):
        with pytest.raises(PlanError):
            validate_plan(junk)


def test_the_spec_carries_the_schema_the_workers_check():
    import os

    here = os.path.dirname(__file__)
    with open(os.path.join(here, "..", "spec", "vllm_plan.schema.json"), "rb") as fh:
        spec = fh.read()
    with open(os.path.join(here, "..", "steerc", "targets", "vllm", "plan.schema.json"), "rb") as fh:
        assert fh.read() == spec, "copy steerc/targets/vllm/plan.schema.json to spec/vllm_plan.schema.json"


def test_compile_signs_plans_with_a_key_file(tmp_path):
    from support import run_cli

    key = tmp_path / "key"
    key.write_bytes(KEY)
    prog = tmp_path / "p.steer"
    prog.write_text(f"steer 1\nintervention x {{\n  at resid_post[1]\n  add {vec(64, 1)}\n}}\n")
    import os

    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, out, err = run_cli(["compile", str(prog), "--model", model, "--target", "vllm", "-o", str(tmp_path / "o"),
                              "--hmac-key-file", str(key)])
    assert code == 0, err
    obj = unpack((tmp_path / "o" / "plan.msgpack").read_bytes())
    assert obj["header"]["hmac"].startswith("hmac-sha256:") and validate_plan(obj, key=KEY)
    short = tmp_path / "short"
    short.write_bytes(b"too short")
    code, _, err = run_cli(["compile", str(prog), "--model", model, "--target", "vllm", "-o", str(tmp_path / "p"),
                            "--hmac-key-file", str(short)])
    assert code == 2 and "16 bytes" in err
