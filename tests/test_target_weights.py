"""``--target weights`` (issue 36): a program folded into a checkpoint that plain transformers loads and that
gives the HF target's logits (1e-4 relative) and greedy tokens; what it refuses before any weight is read; the
same bytes twice; untouched tensors copied bit for bit; the output folder's rules."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hf_util import plan_for, vec
from support import run_cli
from tiny_models import BASE, SHARED, config, from_config

from steerc.targets.weights.tensors import Reader

FAMILIES = ("llama", "qwen2", "mistral", "qwen3")
PROMPT = [[3, 14, 15, 92, 65, 35, 89, 79]]
D, HD = 64, 16


def _config(family: str, tied: bool):
    from transformers import AutoConfig

    cfg = config(family) if family in SHARED else AutoConfig.for_model(family, **BASE, head_dim=HD)
    cfg.tie_word_embeddings = tied
    return cfg


def model_folder(root, family: str = "llama", tied: bool = False) -> str:
    """A seeded tiny float32 model of ``family`` with a small byte-BPE tokenizer, saved at ``root/model``."""
    from tokenizer_util import byte_bpe

    path = root / "model"
    torch.manual_seed(0)
    model = from_config(_config(family, tied), torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model.save_pretrained(path)
    byte_bpe(512).save_pretrained(path)
    return str(path)


def compile_weights(root, text: str, out: str = "out", model: str = "model"):
    (root / "p.steer").write_text(text)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return run_cli(["compile", "p.steer", "--model", model, "--target", "weights", "-o", out])
    finally:
        os.chdir(cwd)


def logits_and_tokens(model, steps: int = 8):
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                                pad_token_id=0)[0, ids.shape[1]:]
    return logits, tokens.tolist()


def hf_target(path: str, text: str, base_dir: str):
    """The HF target's logits and greedy tokens for ``text`` on the model at ``path``."""
    from transformers import AutoModelForCausalLM

    from steerc.runtime.hf import install

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with install(model, plan_for(model, text, base_dir=base_dir)):
        return logits_and_tokens(model)


def folded(path: str):
    from transformers import AutoModelForCausalLM

    return logits_and_tokens(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


def assert_same_as_hf_target(root, text: str, out: str = "out"):
    want, want_tokens = hf_target(str(root / "model"), text, str(root))
    got, got_tokens = folded(str(root / out))
    plain, _ = folded(str(root / "model"))
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * scale, (got - want).abs().max().item()
    assert got_tokens == want_tokens
    assert (plain - want).abs().max().item() > 1e-2 * scale  # the program does change the model
    return got


LINEAR = f"""steer 1
vector u = {vec(D, 1)}
intervention s {{
  at attn_out[1]
  scale 1.7
}}
intervention a {{
  at mlp_out[0:2]
  ablate u
}}
intervention r {{
  at head[2, 1]
  rotate in ({vec(HD, 2)}, {vec(HD, 3)}) by 50deg
}}
intervention h {{
  at head[2, 3]
  scale {vec(HD, 4)}
}}
intervention o {{
  at attn_out[2]
  ablate u
}}
intervention z {{
  at head[3, 0]
  suppress
}}
intervention v {{
  at mlp_out[3]
  scale {vec(D, 5)}
}}
intervention e {{
  at resid_pre[0]
  add {vec(D, 6, 0.5)}
}}
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_linear_folds_equal_the_hf_target(tmp_path, family):
    """scale, ablate, rotate by, scale by a vector and suppress at attn_out, mlp_out and head, and an add at
    the embeddings, on a tiny model of each family the target folds into: no bias is needed, none is written."""
    model_folder(tmp_path, family)
    code, out, err = compile_weights(tmp_path, LINEAR)
    assert code == 0, err
    assert_same_as_hf_target(tmp_path, LINEAR)
    doc = json.loads((tmp_path / "out" / "steerc.json").read_text())
    assert doc["config_changes"] == {}
    assert {f["matrix"] for f in doc["folds"]} == {
        "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.self_attn.o_proj.weight", "model.layers.2.self_attn.o_proj.weight",
        "model.layers.3.self_attn.o_proj.weight", "model.layers.3.mlp.down_proj.weight"}


AFFINE = f"""steer 1
vector u = {vec(D, 7)}
intervention a {{
  at attn_out[1]
  add 0.8 * u
}}
intervention s {{
  at head[0, 2]
  set {vec(HD, 8, 0.3)}
}}
intervention c {{
  at mlp_out[2]
  clamp u to 1.5
}}
intervention m {{
  at mlp_out[0]
  scale 0.5
}}
intervention n {{
  at mlp_out[0]
  add {vec(D, 9, 0.4)}
}}
"""


def test_affine_folds_into_llama_biases(tmp_path):
    """add, set and clamp need a bias: Llama's attention_bias and mlp_bias switch them on, and the other
    projections' biases are written as zeros, in every layer."""
    model_folder(tmp_path)
    code, _, err = compile_weights(tmp_path, AFFINE)
    assert code == 0, err
    assert_same_as_hf_target(tmp_path, AFFINE)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["attention_bias"] is True and cfg["mlp_bias"] is True
    names = Reader(str(tmp_path / "out")).entries
    assert {f"model.layers.{n}.self_attn.{p}.bias" for n in range(4) for p in ("q_proj", "k_proj", "v_proj")} <= \
        set(names)
    zero = Reader(str(tmp_path / "out")).tensor("model.layers.3.mlp.gate_proj.bias")
    assert zero.shape == (128,) and not zero.any()


def test_directional_ablation_folds_and_unties_lm_head(tmp_path):
    """Ablating u from everything that writes the stream (resid_pre[0], every attn_out and mlp_out) folds into
    orthogonalised weights: no hidden state has a component along u, and a tied lm_head keeps the original
    embedding rows (untied in config.json)."""
    from transformers import AutoModelForCausalLM

    model_folder(tmp_path, tied=True)
    u = vec(D, 10)
    text = f"""steer 1
vector u = {u}
intervention embed {{
  at resid_pre[0]
  ablate u
}}
intervention attn {{
  at attn_out[*]
  ablate u
}}
intervention mlp {{
  at mlp_out[*]
  ablate u
}}
"""
    code, _, err = compile_weights(tmp_path, text)
    assert code == 0, err
    assert_same_as_hf_target(tmp_path, text)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        states = model(input_ids=torch.tensor(PROMPT), output_hidden_states=True).hidden_states
    direction = torch.tensor(json.loads(u))
    direction = direction / direction.norm()
    for h in states[:-1]:  # the last is after the final norm
        assert (h[0] @ direction).abs().max().item() < 1e-4 * h.abs().max().item()
    src, out = Reader(str(tmp_path / "model")), Reader(str(tmp_path / "out"))
    assert "lm_head.weight" not in src.entries
    assert torch.equal(out.tensor("lm_head.weight"), src.tensor("model.embed_tokens.weight"))


# ------------------------------------------------------------------------------------------ refusals

GATED = f"""steer 1
probe p {{
  at   resid_post[1]
  read cosine({vec(D, 11)})
  pool prompt.mean
}}
intervention g {{
  at attn_out[2]
  scale 2
  when p > 0.1
}}
"""
GENERATED = """steer 1
intervention g {
  at attn_out[2]
  scale 2
  tokens generated
}
"""
STREAM = f"""steer 1
vector u = {vec(D, 12)}
intervention refusal {{
  at resid_post[*]
  ablate u
}}
"""
ADD_ATTN = f"""steer 1
intervention plus {{
  at attn_out[1]
  add {vec(D, 13)}
}}
"""
ROTATE_TO = f"""steer 1
intervention turn {{
  at mlp_out[1]
  rotate in ({vec(D, 2)}, {vec(D, 3)}) to 30deg
}}
"""


@pytest.mark.parametrize("text,family,says", [
    (GATED, "llama", "gate"),
    (GENERATED, "llama", "token scope `generated`"),
    (STREAM, "llama", "which no one matrix writes (`refusal` ablates it there)"),
    (ADD_ATTN, "qwen2", "the `qwen2` family cannot carry one there"),
    (ADD_ATTN, "mistral", "the `mistral` family cannot carry one there"),
    (ROTATE_TO, "llama", "rotation *to* an angle"),
], ids=["gated", "generated", "ablate-resid-post", "add-qwen2", "add-mistral", "rotate-to"])
def test_refusals_write_nothing(tmp_path, text, family, says):
    """Each refusal is an unsupported-by-target diagnostic with a caret, exit 1, and no output folder."""
    model_folder(tmp_path, family)
    code, out, err = compile_weights(tmp_path, text)
    assert code == 1, err
    assert "unsupported-by-target" in err and says in err and "^" in err
    assert not (tmp_path / "out").exists() and out == ""


def test_ablate_at_the_stream_shows_the_program_that_folds(tmp_path):
    """The ablate-at-resid_post refusal shows a program; that program compiles, and its checkpoint gives the HF
    target's logits for it."""
    model_folder(tmp_path)
    code, _, err = compile_weights(tmp_path, STREAM)
    assert code == 1
    notes = [line.split("= note: ", 1)[1] for line in err.splitlines() if "= note: " in line]
    assert notes[0].startswith("the program that folds")
    program = "\n".join(notes[1:])
    assert "at resid_pre[0]" in program and "at attn_out[*]" in program and "at mlp_out[*]" in program
    text = STREAM.split("intervention")[0] + program + "\n"
    code, _, err = compile_weights(tmp_path, text)
    assert code == 0, err + text
    assert_same_as_hf_target(tmp_path, text)


def test_a_family_without_a_layout_is_refused(tmp_path):
    from tokenizer_util import byte_bpe

    torch.manual_seed(0)
    from_config(config("gpt2"), torch.float32).save_pretrained(tmp_path / "model")
    byte_bpe(512).save_pretrained(tmp_path / "model")
    code, _, err = compile_weights(tmp_path, "steer 1\nintervention s {\n  at mlp_out[0]\n  scale 2\n}\n")
    assert code == 1 and "cannot fold into the `gpt2` family" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ the files


def test_same_bytes_twice_and_untouched_tensors_bit_identical(tmp_path):
    model_folder(tmp_path)
    assert compile_weights(tmp_path, AFFINE, "one")[0] == 0
    assert compile_weights(tmp_path, AFFINE, "two")[0] == 0
    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(os.listdir(one)) == sorted(os.listdir(two))
    for name in os.listdir(one):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    folded_names = {f["matrix"] for f in json.loads((one / "steerc.json").read_text())["folds"]}
    folded_names |= {f["bias"] for f in json.loads((one / "steerc.json").read_text())["folds"] if f["bias"]}
    src, out = Reader(str(tmp_path / "model")), Reader(str(one))
    untouched = [n for n in src.entries if n not in folded_names]
    assert len(untouched) > 30
    for name in untouched:
        a, b = src.entries[name], out.entries[name]
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        with open(a.path, "rb") as fa, open(b.path, "rb") as fb:
            fa.seek(a.begin)
            fb.seek(b.begin)
            assert fa.read(a.nbytes) == fb.read(b.nbytes), name
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (one / name).read_bytes() == (tmp_path / "model" / name).read_bytes()


def test_shards_past_the_size(tmp_path, monkeypatch):
    """Past MAX_SHARD_BYTES the weights are shards with transformers' index, and load the same."""
    from steerc.targets.weights import emit

    monkeypatch.setattr(emit, "MAX_SHARD_BYTES", 200_000)
    model_folder(tmp_path)
    code, out, err = compile_weights(tmp_path, AFFINE)
    assert code == 0, err
    names = sorted(os.listdir(tmp_path / "out"))
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) >= 3 and "model.safetensors.index.json" in names and "model.safetensors" not in names
    assert all(n.endswith(f"-of-{len(shards):05d}.safetensors") for n in shards)
    assert_same_as_hf_target(tmp_path, AFFINE)


def test_output_folder_of_the_user_is_refused_and_kept(tmp_path):
    """A folder holding the user's files is refused before anything is read; a folder an earlier compile wrote
    is replaced, keeping what the user changed or added there."""
    model_folder(tmp_path)
    theirs = tmp_path / "out" / "notes.txt"
    theirs.parent.mkdir()
    theirs.write_bytes(b"mine\r\n")
    code, _, err = compile_weights(tmp_path, LINEAR)
    assert code != 0 and "steerc did not write" in err
    assert sorted(os.listdir(tmp_path / "out")) == ["notes.txt"] and theirs.read_bytes() == b"mine\r\n"

    assert compile_weights(tmp_path, LINEAR, "again")[0] == 0
    mine = tmp_path / "again" / "README.md"
    mine.write_text("my model card\n")
    code, _, err = compile_weights(tmp_path, AFFINE, "again")
    assert code == 0, err
    assert mine.read_text() == "my model card\n"
    assert json.loads((tmp_path / "again" / "config.json").read_text())["attention_bias"] is True

    changed = tmp_path / "again" / "generation_config.json"
    changed.write_text("{}\n")  # changed by the user since: theirs, never replaced
    code, _, err = compile_weights(tmp_path, LINEAR, "again")
    assert code == 1 and "error[invalid-value]" in err and "generation_config.json" in err and "move it away" in err
    assert changed.read_text() == "{}\n" and mine.read_text() == "my model card\n"
    assert not any(n.endswith(".safetensors") for n in os.listdir(tmp_path / "again"))


def test_no_safetensors_is_a_usage_error_and_leaves_nothing(tmp_path):
    """A folder of pickled weights: steerc reads no pickle; a model-without-weights diagnostic, exit 1, no
    weights written."""
    model_folder(tmp_path)
    src = tmp_path / "model"
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    code, _, err = compile_weights(tmp_path, LINEAR)
    assert code == 1 and "error[model-without-weights]" in err and "no safetensors" in err
    assert "Traceback" not in err
    assert not any(n.endswith(".safetensors") for n in os.listdir(tmp_path / "out")) if (tmp_path / "out").exists() \
        else True


def test_embedding_rows_each_map_to_f_of_the_row(tmp_path):
    """resid_pre[0]: every row e of the embedding becomes f(e), computed in float64 (the spec's maths)."""
    model_folder(tmp_path)
    u = np.array(json.loads(vec(D, 14)))
    text = f"steer 1\nintervention c {{\n  at resid_pre[0]\n  clamp {vec(D, 14)} to 2\n}}\n"
    assert compile_weights(tmp_path, text)[0] == 0
    e = Reader(str(tmp_path / "model")).tensor("model.embed_tokens.weight").double().numpy()
    got = Reader(str(tmp_path / "out")).tensor("model.embed_tokens.weight").double().numpy()
    q = u.astype(np.float32).astype(np.float64)
    q = q / np.linalg.norm(q)
    want = e + np.outer(2.0 - e @ q, q)
    assert np.abs(got - want).max() < 1e-6


# ------------------------------------------------------------------------------------------ SmolLM2


@pytest.mark.smollm
@pytest.mark.slow
def test_smollm2_abliterated_and_steered_equals_the_hf_target(tmp_path):
    """SmolLM2-135M-Instruct (`--model smollm2`, its GGUF dequantized by steerc): a direction ablated from
    every writer of the stream (the tied lm_head untied) and an add at attn_out[10] folded into o_proj's new
    bias; transformers loads the folder and gives the HF target's logits (1e-4 relative) and greedy tokens."""
    from own_env import smollm2
    from transformers import AutoModelForCausalLM

    from steerc.runtime.hf import install

    _, model, tokenizer = smollm2()
    d = model.config.hidden_size
    text = f"""steer 1
vector u = normalize({vec(d, 21)})
intervention embed {{
  at resid_pre[0]
  ablate u
}}
intervention attn {{
  at attn_out[*]
  ablate u
}}
intervention mlp {{
  at mlp_out[*]
  ablate u
}}
intervention push {{
  at attn_out[10]
  add 4 * normalize({vec(d, 22)})
}}
"""
    (tmp_path / "p.steer").write_text(text)
    code, _, err = compile_weights(tmp_path, text, model="smollm2")
    assert code == 0, err
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with install(model, plan_for(model, text, base_dir=str(tmp_path))), torch.no_grad():
        want = model(input_ids=ids).logits[0]
        want_tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                     do_sample=False)[0].tolist()
    baked = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        got = baked(input_ids=ids).logits[0]
        got_tokens = baked.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                    do_sample=False)[0].tolist()
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
    assert got_tokens == want_tokens
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is True


def test_explain_shows_the_matrix_each_site_folds_into(tmp_path, monkeypatch):
    """`steerc explain --target weights` names, per site, the matrix (and any bias) its kernels fold into,
    the same ones the compiled folder's steerc.json records."""
    model_folder(tmp_path)
    (tmp_path / "p.steer").write_text(AFFINE)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["explain", "p.steer", "--model", "model", "--target", "weights", "--format", "json"])
    assert code == 0, err
    folds = {s["site"]: s["folds_into"] for s in json.loads(out)["sites"]}
    assert folds["attn_out[1]"]["matrix"] == "model.layers.1.self_attn.o_proj.weight"
    assert folds["attn_out[1]"]["bias"] == "model.layers.1.self_attn.o_proj.bias"
    assert folds["head[0, 2]"]["matrix"] == "model.layers.0.self_attn.o_proj.weight"
    assert "columns 32:48" in folds["head[0, 2]"]["how"]
    assert folds["mlp_out[2]"]["matrix"] == "model.layers.2.mlp.down_proj.weight"
    code, text, _ = run_cli(["explain", "p.steer", "--model", "model", "--target", "weights"])
    assert code == 0 and "folds into model.layers.0.mlp.down_proj.weight and model.layers.0.mlp.down_proj.bias" in text
    assert compile_weights(tmp_path, AFFINE)[0] == 0
    recorded = {s["site"]: f["matrix"] for f in json.loads((tmp_path / "out" / "steerc.json").read_text())["folds"]
                for s in f["sites"]}
    assert recorded == {site: f["matrix"] for site, f in folds.items()}
