"""The serve plugin through vLLM's offline API, and a request that fails inside the worker.

``vllm.LLM`` started as ``steerc serve`` starts a server (steerc's loader in serve mode, eager, the
SteercGuard logits processor). The guard's ``validate_params`` admits requests in the front end,
which does not hold the model: a plan compiled for another model passes there and is refused by
the worker. That request — and only it — ends at once without a steered or unsteered token, while
the steered and plain requests batched with it come out exactly as the HF target gives them, and
the engine goes on serving.
"""

from __future__ import annotations

import pytest
from harness import checked_plan, hf_run, model_folder, require_vllm
from hf_util import vec

require_vllm()

PROMPTS = [[5, 17, 42, 9, 300, 12, 7], [7, 8, 9, 10], [20, 21, 22]]
NEW = 6


def _serve_plan(folder: str, text: str, out) -> tuple[object, str]:
    from harness import hf_model

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.emit import emit

    plan = checked_plan(folder, text)
    emit(plan, facts_from_model(hf_model(folder)), str(out))
    return plan, str(out)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import vllm

    from steerc.runtime.vllm.loader import register_loader

    register_loader()
    folder = model_folder("tiny-llama")
    engine = vllm.LLM(model=folder, dtype="float32", max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
                      enforce_eager=True, load_format="steerc",
                      # one plan slot: a second distinct plan live at once takes the per-request path
                      additional_config={"steerc": {"mode": "serve", "plans": 1}},
                      logprobs_mode="raw_logits", max_logprobs=5, max_num_batched_tokens=16,
                      logits_processors=["steerc.runtime.serve:SteercGuard"],
                      worker_extension_cls="steerc.runtime.serve.SteercServeExtension")
    yield folder, engine
    engine.llm_engine.engine_core.shutdown()


def _outputs(engine, requests):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, params = [], []
    for tokens, extra in requests:
        prompts.append(TokensPrompt(prompt_token_ids=tokens))
        params.append(SamplingParams(max_tokens=NEW, temperature=0.0, detokenize=False, extra_args=extra,
                                     logprobs=5))
    return [o.outputs[0] for o in engine.generate(prompts, params, use_tqdm=False)]


def _generate(engine, requests):
    return [list(o.token_ids) for o in _outputs(engine, requests)]


def _logits(output):
    return [{int(t): float(lp.logprob) for t, lp in step.items()} for step in output.logprobs]


def test_a_request_refused_in_the_worker_fails_alone(llm, tmp_path):
    from steerc.serve_client import offline_request

    folder, engine = llm
    text = f"steer 1\nintervention x {{\n  at resid_post[1]\n  add 6.0 * {vec(128, 1)}\n}}\n"
    plan, out = _serve_plan(folder, text, tmp_path / "good")
    _, other = _serve_plan(model_folder("tiny-qwen2"), text, tmp_path / "other-model")
    good = offline_request(out, PROMPTS[0])[1]
    wrong = offline_request(other, PROMPTS[1])[1]
    got = _generate(engine, [(PROMPTS[0], good), (PROMPTS[1], wrong), (PROMPTS[2], None)])
    assert got[0] == hf_run(folder, plan, [PROMPTS[0]], NEW)[0][0]
    assert got[1] == [2], "ended at once with the end-of-sequence token: never run unsteered"
    assert got[2] == hf_run(folder, None, [PROMPTS[2]], NEW)[0][0]
    (status,) = engine.collective_rpc("steerc_requests")
    assert status["failures"] == 1
    again = _generate(engine, [(PROMPTS[1], good)])
    assert again[0] == hf_run(folder, plan, [PROMPTS[1]], NEW)[0][0], "the engine goes on serving"


def test_front_end_refuses_what_it_can_check(llm):
    import json

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    _, engine = llm
    bad = {"steerc_plan": json.dumps({"format": "steerc.serve/1", "surprise": 1})}
    with pytest.raises(Exception, match="steerc_plan"):
        engine.generate([TokensPrompt(prompt_token_ids=PROMPTS[0])],
                        SamplingParams(max_tokens=2, extra_args=bad, detokenize=False), use_tqdm=False)
    assert _generate(engine, [(PROMPTS[2], None)])[0] == hf_run(model_folder("tiny-llama"), None,
                                                                 [PROMPTS[2]], NEW)[0][0]


def test_plain_rows_are_bit_identical_to_an_engine_without_steerc(llm, tmp_path):
    """Three steered requests (two plans) and a plain one, submitted together so that both engines form
    the same batches (chunked prefill included): the plain request's tokens and raw logits equal, bit for
    bit, those of the same four prompts on an engine started without steerc. The engine has one plan slot:
    the first plan takes it, the second runs per request, and each equals HF alone."""
    import vllm

    from steerc.serve_client import offline_request

    folder, engine = llm
    a = f"steer 1\nintervention x {{\n  at resid_post[1]\n  add 6.0 * {vec(128, 1)}\n}}\n"
    b = f"steer 1\nintervention y {{\n  at attn_out[*]\n  ablate {vec(128, 4)}\n}}\n"
    plan_a, out_a = _serve_plan(folder, a, tmp_path / "a")
    plan_b, out_b = _serve_plan(folder, b, tmp_path / "b")
    steered = [(PROMPTS[0], offline_request(out_a, PROMPTS[0])[1]), (PROMPTS[1], offline_request(out_b, PROMPTS[1])[1]),
               (PROMPTS[2], offline_request(out_a, PROMPTS[2])[1]), (PROMPTS[0] + PROMPTS[2], None)]
    mixed = _outputs(engine, steered)
    plain_engine = vllm.LLM(model=folder, dtype="float32", max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
                            enforce_eager=True, logprobs_mode="raw_logits", max_logprobs=5, max_num_batched_tokens=16)
    try:
        alone = _outputs(plain_engine, [(tokens, None) for tokens, _ in steered])
    finally:
        plain_engine.llm_engine.engine_core.shutdown()
    assert list(mixed[3].token_ids) == list(alone[3].token_ids)
    assert _logits(mixed[3]) == _logits(alone[3]), "raw logits, bit for bit"
    assert _logits(mixed[0]) != _logits(alone[0]), "the steered rows did change"
    for i, plan in ((0, plan_a), (1, plan_b), (2, plan_a)):  # in the table, per request, in the table
        assert list(mixed[i].token_ids) == hf_run(folder, plan, [steered[i][0]], NEW)[0][0], i
