"""``clamp feature s[i] to c`` on the serve plugin (issue 34), against the HF target running the same plan.

The serve plugin (``vllm.LLM`` started as ``steerc serve`` starts it) runs a program of three SAE clamps on
SAELens folders the test writes (``tests/test_sae_steer.py``'s ``write_sae``), compiled ``--target serve``,
with the first clamp's target a per-request param, and gates that read SAE features (``read s[i]``, per token
and pooled over the prompt), and a LoReFT (``loreft R, W, b``): two requests with two values, and a plain one,
batched together, each give the HF target's tokens for its own value. (The compiled vllm target runs the same
clamps beside LoReFTs in one engine: ``test_loreft_vllm.py``.)
"""

from __future__ import annotations

import os
import sys

import pytest
from harness import checked_plan, hf_run, model_folder, require_vllm

require_vllm()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_loreft_vllm import _reft  # noqa: E402
from test_sae_steer import write_sae  # noqa: E402

W = 128

TEXT = (
    "steer 1\n"
    'sae s = sae("saes/s")\nsae m = sae("saes/m")\n'
    "probe tok {\n  at   resid_post[0]\n  read norm\n  pool token\n}\n"
    "probe feat {\n  at   resid_post[1]\n  read s[3]\n  pool token\n}\n"
    "probe fp {\n  at   resid_post[1]\n  read s[5]\n  pool prompt.mean\n}\n"
    "intervention a {\n  at     resid_post[1]\n  clamp feature s[3] to 6\n  tokens prompt[1:], generated\n}\n"
    "intervention b {\n  at     mlp_out[2]\n  clamp feature m[1] to 0\n}\n"
    "intervention g {\n  at     resid_post[3]\n  clamp feature s[7] to 4\n  when   tok > 12.0 and feat > 0\n}\n"
    "intervention r {\n  at     resid_post[2]\n  add    2 * s[5]\n  tokens generated\n  when   fp > 0\n}\n"
    # and a LoReFT, served per request as the clamps are
    'matrix R = load("reft.safetensors", key="R")\nmatrix W = load("reft.safetensors", key="W")\n'
    'vector lb = load("reft.safetensors", key="b")\n'
    "intervention l {\n  at     mlp_out[1]\n  loreft R, W, lb\n  tokens prompt[1:], generated\n}\n"
)


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


SERVED = TEXT.replace("clamp feature s[3] to 6", "clamp feature s[3] to 2 * c").replace(
    'sae m = sae("saes/m")\n', 'sae m = sae("saes/m")\nparam c = 3 in [0, 10] per request\n')
PROMPTS = [[5, 17, 42, 9, 300, 12, 7], [7, 8, 9, 10], [20, 21, 22]]


@pytest.fixture(scope="module")
def served(folder, tmp_path_factory):
    import vllm
    from harness import hf_model
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.loader import register_loader
    from steerc.serve_client import offline_request
    from steerc.targets.serve.emit import emit

    root = tmp_path_factory.mktemp("sae-serve")
    (root / "steer.toml").write_text("")
    write_sae(root, "s", d_in=W, d_sae=16, hook="blocks.1.hook_resid_post", seed=1)
    write_sae(root, "m", d_in=W, d_sae=8, architecture="standard", hook="blocks.2.hook_mlp_out", seed=2)
    _reft(root, "reft.safetensors", 3)
    plan = checked_plan(folder, SERVED, root=str(root))
    assert {type(k.op).__name__ for site in plan.sites for k in site.kernels} == {"SaeClamp", "Affine", "LoReFT"}
    emit(plan, facts_from_model(hf_model(folder)), str(root / "out"))
    register_loader()
    engine = vllm.LLM(model=folder, dtype="float32", max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
                      enforce_eager=True, load_format="steerc", additional_config={"steerc": {"mode": "serve"}},
                      max_num_batched_tokens=16, logits_processors=["steerc.runtime.serve:SteercGuard"],
                      worker_extension_cls="steerc.runtime.serve.SteercServeExtension")
    try:
        requests = [(PROMPTS[0], {"c": 1.0}), (PROMPTS[1], {"c": 4.5}), (PROMPTS[2], None)]
        prompts, params = [], []
        for tokens, values in requests:
            prompts.append(TokensPrompt(prompt_token_ids=tokens))
            extra = offline_request(str(root / "out"), tokens, params=values)[1] if values is not None else None
            params.append(SamplingParams(max_tokens=6, temperature=0.0, detokenize=False, extra_args=extra))
        got = [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params, use_tqdm=False)]
    finally:
        engine.llm_engine.engine_core.shutdown()
    return root, requests, got


def test_the_serve_plugin_equals_the_hf_target_per_request(served, folder):
    root, requests, got = served
    for (tokens, values), tokens_out in zip(requests, got):
        plan = checked_plan(folder, SERVED, root=str(root), params=values) if values is not None else None
        assert tokens_out == hf_run(folder, plan, [tokens], 6)[0][0], values
    plain = hf_run(folder, None, [requests[0][0]], 6)[0][0]
    steered = [hf_run(folder, checked_plan(folder, SERVED, root=str(root), params=v), [requests[0][0]], 6)[0][0]
               for v in ({"c": 1.0}, {"c": 4.5})]
    assert steered[0] != plain or steered[1] != plain, "the clamps change the tokens"
