"""The vllm target on SmolLM2-135M-Instruct (float32, eager): steering with each kind of output
constraint, through ``steerc.runtime.vllm.sampling_params``, against the HF target with the same plan,
tokenizer and constraint (xgrammar on both). One engine: the constraint is a sampling parameter, so
plans that differ only in it share the installed structure."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from harness import TIE, Engine, checked_plan, hf_model, model_folder, require_vllm, vllm_bytes

require_vllm()

STEER = ('steer 1\nvector v = load("v.npy")\n'
         "intervention x {\n  at resid_post[4:8]\n  add 1.5 * v\n  tokens generated\n}\n")
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 24}}, "required": ["answer"],
          "additionalProperties": False}
GRAMMAR = 'root ::= colour ", " colour "."\ncolour ::= "red" | "green" | "blue"\n'
CONSTRAINTS = {
    "regex": ('constrain regex "[a-z ]{1,40}[.]"\n', lambda t: re.fullmatch(r"[a-z ]{1,40}[.]", t)),
    "choice": ('constrain choice ["yes", "no", "maybe"]\n', lambda t: t in ("yes", "no", "maybe")),
    "grammar": ('constrain grammar from "g.ebnf"\n', lambda t: re.fullmatch(r"(red|green|blue), (red|green|blue)\.", t)),
    "json_schema": ('constrain json_schema from "s.json"\n', lambda t: _valid_json(t)),
}
QUESTIONS = {"regex": "Write one sentence about cats.", "choice": "Is the sky green?",
             "grammar": "Name two colours.", "json_schema": "What is the capital of France? Answer in JSON."}


def _valid_json(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def folder():
    return model_folder("smollm2")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("constraints")
    np.save(path / "v.npy", np.random.default_rng(1).normal(0, 1, 576).astype(np.float32))
    (path / "g.ebnf").write_text(GRAMMAR)
    (path / "s.json").write_text(json.dumps(SCHEMA))
    (path / "steer.toml").write_text("")
    return path


@pytest.fixture(scope="module")
def engine(folder, root):
    eng = Engine(folder, vllm_bytes(folder, checked_plan(folder, STEER, root=str(root))), enforce_eager=True)
    yield eng
    eng.close()


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_steering_with_each_constraint_matches_hf(engine, folder, root, kind):
    import torch
    from transformers import AutoTokenizer
    from vllm.inputs import TokensPrompt

    from steerc.runtime.hf import install
    from steerc.runtime.vllm import sampling_params

    text, valid = CONSTRAINTS[kind]
    plan = checked_plan(folder, STEER + text, root=str(root))
    data = vllm_bytes(folder, plan)
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[kind]}], add_generation_prompt=True,
                                          return_dict=True)["input_ids"])
    params = sampling_params(data, max_tokens=48, temperature=0.0)
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
    assert valid(out.text), (kind, out.text, out.finish_reason)
    model = hf_model(folder)
    ids = torch.tensor([prompt])
    with torch.no_grad(), install(model, plan, tok):
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                            output_scores=True, return_dict_in_generate=True)
    want = hf.sequences[0, len(prompt):].tolist()
    got = list(out.token_ids)
    eos = set(np.atleast_1d(model.generation_config.eos_token_id).tolist())
    for t, (a, b) in enumerate(zip(want, got)):
        if a != b:
            top = hf.scores[t][0].topk(2).values  # after the constraint's mask: what greedy chose from
            assert float(top[0] - top[1]) < TIE, f"{kind} step {t}: HF {a}, vLLM {b}, no tie"
            return
    assert [t for t in want if t not in eos] == [t for t in got if t not in eos], kind
