"""The vllm target on SmolLM2-135M-Instruct (float32, eager): steering and an output constraint
together, through ``steerc.runtime.vllm.sampling_params``, against the HF target with the same
plan, tokenizer and constraint (xgrammar on both)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from harness import TIE, Engine, checked_plan, hf_model, model_folder, require_vllm, vllm_bytes

require_vllm()

REGEX = "[a-z ]{1,40}[.]"


@pytest.fixture(scope="module")
def folder():
    return model_folder("smollm2")


def test_steering_with_a_regex_constraint_matches_hf(folder, tmp_path):
    import torch
    from transformers import AutoTokenizer

    from steerc.runtime.hf import install
    from steerc.runtime.vllm import sampling_params

    np.save(tmp_path / "v.npy", np.random.default_rng(1).normal(0, 1, 576).astype(np.float32))
    text = ('steer 1\nvector v = load("v.npy")\n'
            "intervention x {\n  at resid_post[4:8]\n  add 1.5 * v\n  tokens generated\n}\n"
            f'constrain regex "{REGEX}"\n')
    plan = checked_plan(folder, text, root=str(tmp_path))
    data = vllm_bytes(folder, plan)
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "Write one sentence about cats."}],
                                          add_generation_prompt=True, return_dict=True)["input_ids"])
    eng = Engine(folder, data, enforce_eager=True)
    try:
        from vllm.inputs import TokensPrompt

        params = sampling_params(data, max_tokens=40, temperature=0.0)
        out = eng.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
    finally:
        eng.close()
    assert re.fullmatch(REGEX, out.text), out.text
    model = hf_model(folder)
    ids = torch.tensor([prompt])
    with torch.no_grad(), install(model, plan, tok):
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                            output_logits=True, return_dict_in_generate=True)
    want = hf.sequences[0, len(prompt):].tolist()
    got = list(out.token_ids)
    for t, (a, b) in enumerate(zip(want, got)):
        if a != b:
            top = hf.logits[t][0].topk(2).values
            assert float(top[0] - top[1]) < TIE, f"step {t}: HF {a}, vLLM {b}, no tie"
            break
    else:
        eos = set(np.atleast_1d(model.generation_config.eos_token_id).tolist())
        assert [t for t in want if t not in eos] == [t for t in got if t not in eos]
