"""``steerc explain``: golden output for every shared example, and what it must say.

The goldens are ``steerc explain FILE --model models/tiny-llama`` (text and
``--format json``) run in-process from the examples folder, so every path
in the output is the relative one the user typed. ``pytest --update-golden``
rewrites them.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from support import GOLDEN, compare_golden, examples_path, needs_constraints, run_cli, uses_constraint

from steerc.explain.plan import positions_of
from steerc.ir import nodes as ir

EXAMPLES = sorted(os.path.basename(f) for f in glob.glob(os.path.join(examples_path(), "*.steer")))
MODEL = "models/tiny-llama"


def explain(examples_dir, monkeypatch, name, *extra, model=MODEL):
    with open(os.path.join(examples_dir, name), encoding="utf-8") as fh:
        if uses_constraint(fh.read()):
            needs_constraints()
    monkeypatch.chdir(examples_dir)
    args = ["explain", name, *extra] + (["--model", model] if model else [])
    code, out, err = run_cli(args)
    return code, _stable(out, examples_dir), err


def _stable(text: str, examples_dir: str) -> str:
    """Absolute paths (should one appear) become placeholders."""
    text = text.replace(os.path.realpath(examples_dir), "<examples>").replace(examples_dir, "<examples>")
    return text.replace(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "<repo>")


def test_there_are_examples():
    assert len(EXAMPLES) >= 12


@pytest.mark.parametrize("name", EXAMPLES)
def test_explain_text_golden(name, examples_dir, monkeypatch, update_golden):
    code, out, err = explain(examples_dir, monkeypatch, name)
    assert code == 0, err
    assert "<examples>" not in out and "<repo>" not in out, "explain printed an absolute path"
    compare_golden(os.path.join(GOLDEN, "explain", name.replace(".steer", ".txt")), out, update_golden)


@pytest.mark.parametrize("name", EXAMPLES)
def test_explain_json_golden(name, examples_dir, monkeypatch, update_golden):
    code, out, err = explain(examples_dir, monkeypatch, name, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "steerc.explain/1" and doc["file"] == name and doc["target"] == "hf"
    assert doc["model"]["family"] == "llama"
    compare_golden(os.path.join(GOLDEN, "explain", name.replace(".steer", ".json")), out, update_golden)


@pytest.mark.parametrize("name", EXAMPLES)
def test_text_and_json_agree(name, examples_dir, monkeypatch):
    from steerc.explain.plan import render

    _, text, _ = explain(examples_dir, monkeypatch, name)
    _, out, _ = explain(examples_dir, monkeypatch, name, "--format", "json")
    assert render(json.loads(out)) == text


# ---------------------------------------------------------------- content


def _kernels(doc):
    return [(s["site"], k) for s in doc["sites"] for k in s["kernels"]]


def test_generated_scope_gets_the_p_minus_1_note(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "01_add.steer")
    assert out.count("note: does not steer position P-1, which predicts the first generated token") == 2
    _, out, _ = explain(examples_dir, monkeypatch, "01_add.steer", "--format", "json")
    for _, k in _kernels(json.loads(out)):
        assert k["scope"] == "generated" and k["covers_last_prompt"] is False and "P-1" in k["note"]


def test_scopes_that_cover_p_minus_1_get_no_note(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "04_bank.steer", "--format", "json")
    for _, k in _kernels(json.loads(out)):
        assert k["covers_last_prompt"] is True and k["note"] is None  # `all`, `prompt[-1:], generated`


def test_after_scope_is_described(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "05_ops_and_scopes.steer")
    assert 'tokens after "Answer:": positions after the first "Answer:" in the prompt (found with the tokenizer)' in out
    assert "tokens prompt[-3:]: prompt positions P-3 .. P-1" in out
    assert "tokens generated[:8]: generated positions P .. P+7" in out
    assert "tokens [0, 1]: absolute positions 0, 1" in out


def test_gate_timing_prompt_pooled(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "03_cast_gate.steer")
    # the probe is written at resid_pre[1], which is the canonical resid_post[0]
    assert "when harmful > 0.2 (per sequence)" in out
    assert "harmful: once per sequence, when the whole prompt has passed resid_post[0]; then held" in out
    assert "harmful: projected_cosine at resid_post[0], pool prompt.mean (once the prompt has passed the site)" in out


def test_gate_timing_per_token_and_mixed(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "12_per_token_gate.steer")
    assert "when (sarcastic > 0.5 and not (loud >= 40)) (per sequence)" in out
    assert "sarcastic: per position, read at resid_post[0] before its kernels" in out
    assert "loud: once per sequence, when the whole prompt has passed resid_post[1]; then held" in out
    _, out, _ = explain(examples_dir, monkeypatch, "12_per_token_gate.steer", "--format", "json")
    probes = {p["name"]: p for p in json.loads(out)["probes"]}
    assert probes["sarcastic"]["decided"] == "per position" and probes["sarcastic"]["pool"] == "token"
    assert probes["loud"]["pool"] == "prompt.last"


def test_residual_aliases_and_heads(examples_dir, monkeypatch):
    _, out, _ = explain(examples_dir, monkeypatch, "04_bank.steer")
    assert "resid_post[1]  (= resid_pre[2])" in out and "resid_post[3]  (= before the final norm)" in out
    _, out, _ = explain(examples_dir, monkeypatch, "06_heads.steer")
    assert "pre-hook on model.layers.1.self_attn.o_proj (heads, columns 16:32)" in out


def test_optimisations_are_listed(examples_dir, monkeypatch, tmp_path):
    prog = tmp_path / "fuse.steer"
    prog.write_text("steer 1\nvector v = [1" + ", 0" * 15 + "]\n"
                    "intervention a {\n  at head[0, 0]\n  add v\n}\n"
                    "intervention b {\n  at head[0, 0]\n  add v\n}\n"
                    "intervention c {\n  at head[0, 1]\n  scale 1\n}\n", encoding="utf-8")
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(["explain", str(prog), "--model", MODEL])
    assert code == 0
    assert "optimisations" in out
    assert "head[0, 0]: fused 2 affine kernels into one (a, b)" in out
    assert "head[0, 1]: dropped a kernel that changes nothing (c)" in out
    assert "warning[no-effect]" in err


# ------------------------------------------------------------------ targets


def test_target_vllm_shows_vllm_modules(examples_dir, monkeypatch):
    _, hf, _ = explain(examples_dir, monkeypatch, "02_abliterate.steer")
    code, out, _ = explain(examples_dir, monkeypatch, "02_abliterate.steer", "--target", "vllm")
    assert code == 0 and out != hf
    assert "for target vllm" in out
    assert "pre-hook on model.layers.0 (input1)" in out
    assert "post-hook on model.layers.0 (fused_pair)" in out
    code, serve, _ = explain(examples_dir, monkeypatch, "02_abliterate.steer", "--target", "serve")
    assert code == 0 and serve.replace("target serve", "target vllm") == out


@pytest.mark.parametrize("target,module", [("hf", "gpt_neox.layers.1.attention.dense"),
                                           ("vllm", "model.layers.1.attention.dense")])
def test_target_picks_the_backend_module_names(examples_dir, monkeypatch, target, module):
    code, out, err = explain(examples_dir, monkeypatch, "06_heads.steer", "--target", target,
                             model="models/real/pythia-160m")
    assert code == 0, err
    assert f"pre-hook on {module} (heads, columns 0:64)" in out


def test_vllm_target_refuses_after(examples_dir, monkeypatch):
    code, out, err = explain(examples_dir, monkeypatch, "05_ops_and_scopes.steer", "--target", "vllm")
    assert code == 1 and "unsupported-by-target" in err and out == ""


def test_gpt2_module_names(examples_dir, monkeypatch):
    code, out, _ = explain(examples_dir, monkeypatch, "01_add.steer", model="models/tiny-gpt2")
    assert code == 0 and "post-hook on transformer.h.1 (output)" in out


# ------------------------------------------------------------------ errors


def test_explain_without_model_is_a_usage_error(examples_dir, monkeypatch):
    code, out, err = explain(examples_dir, monkeypatch, "01_add.steer", model=None)
    assert code == 2 and out == ""
    assert "--model is required" in err and "steer.toml" in err


def test_explain_of_a_bad_program_exits_1(examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    code, out, err = run_cli(["explain", "bad/unknown_site.steer", "--model", MODEL])
    assert code == 1 and out == "" and "error[unknown-site]" in err


def test_explain_of_a_missing_file_exits_2(examples_dir, monkeypatch):
    monkeypatch.chdir(examples_dir)
    assert run_cli(["explain", "nope.steer", "--model", MODEL])[0] == 2


# ------------------------------------------------------------------ P-1 edge cases


def test_positions_of_scope_items():
    gen = ir.ScopeGenerated()
    assert positions_of((gen,))["covers_last_prompt"] is False
    assert positions_of((ir.ScopePrompt(ir.PosSlice(None, -1)),))["covers_last_prompt"] is False
    assert positions_of((ir.ScopePrompt(ir.PosSlice(None, 3)),))["covers_last_prompt"] is None
    assert positions_of((ir.ScopePrompt(ir.PosSlice(-3, None)),))["covers_last_prompt"] is True
    assert positions_of((ir.ScopePositions((0, 2)),))["covers_last_prompt"] is None
    assert positions_of((ir.ScopePrompt(ir.PosSlice(-1, None)), gen))["covers_last_prompt"] is True


def test_prompt_slice_from_a_positive_start_covers_p_minus_1_only_for_long_prompts():
    assert positions_of((ir.ScopePrompt(ir.PosSlice(5, None)),))["covers_last_prompt"] is None


def test_after_covers_p_minus_1_only_when_the_text_ends_before_the_prompt_does():
    scope = ir.ScopeAfter(ir.Str("Answer:"))
    assert positions_of((scope,))["covers_last_prompt"] is None
