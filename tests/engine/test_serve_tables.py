"""The serve plugin with its plan tables alone (``per_request`` off, ``--steer-per-request off``), compiled.

The tables are traced into the graph at every provisioned site, and no steerc op is (no steer point):
ten plans of every kernel kind the tables hold (adds, an ablation, a clamp, rotations, a head, a
schedule, ``preserve norm``, two kernels at one site, a gate on a per-token probe, a gate on a
prompt-pooled probe), distinct and batched together with a plain request under chunked prefill, each
equal to the HF target running it alone; a profiler over the model's forward sees no steerc Python; a plan
past the tables' rank fails alone, and the engine goes on.
"""

from __future__ import annotations

import os

import pytest
from harness import checked_plan, compare, hf_model, hf_run, model_folder, require_vllm
from hf_util import vec

require_vllm()

PROMPTS = [[5, 17, 42, 9, 300, 12, 7], [7, 8, 9, 10], [20, 21, 22], [30, 31, 32, 33, 34], [40, 41],
           [50, 51, 52, 53, 54, 55], [60, 61, 62], [70, 71, 72, 73], [90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100],
           [110, 111, 112, 113, 114, 115, 116, 117, 118], [120, 121, 122, 123, 124, 125, 126], [80, 81, 82]]
PLANS = 11  # plan 10 is plan 9 again, on another prompt (twins); the last prompt is the plain request's
NEW = 6


def _texts(width: int, head_dim: int, threshold: float) -> list[str]:
    v, u, w = vec(width, 1), vec(width, 2), vec(width, 3)
    h = vec(head_dim, 4)
    return [
        f"intervention a {{\n  at resid_post[1]\n  add 6.0 * {v}\n}}\n",
        f"intervention a {{\n  at resid_pre[*]\n  ablate {u}\n}}\n",
        f"intervention a {{\n  at mlp_out[1]\n  clamp {v} to 2.0\n  tokens generated\n}}\n",
        f"intervention a {{\n  at attn_out[2]\n  rotate in ({v}, {w}) by 30deg\n}}\n",
        f"intervention a {{\n  at resid_post[2]\n  rotate in ({u}, {w}) to 60deg\n  tokens prompt[-2:], generated\n}}\n",
        f"intervention a {{\n  at head[1, 0]\n  add 4.0 * {h}\n}}\n",
        f"intervention a {{\n  at resid_post[0]\n  add 5.0 * ramp(3) * {w}\n  tokens generated\n}}\n",
        f"intervention a {{\n  at resid_post[2]\n  ablate {w}\n}}\nintervention b {{\n  at resid_post[2]\n"
        f"  add 3.0 * {u}\n  preserve norm\n}}\n",
        # gates: a per-token probe read before the kernel's point, a prompt-pooled one (decided once per request)
        f"probe p {{\n  at resid_pre[1]\n  read dot({w})\n  pool token\n}}\n"
        f"intervention a {{\n  at resid_post[2]\n  add 6.0 * {v}\n  when p > 0 or p < -3\n}}\n",
        f"probe p {{\n  at resid_post[1]\n  read cosine({u})\n  pool prompt.mean\n}}\n"
        f"intervention a {{\n  at resid_post[2]\n  add 6.0 * {w}\n  tokens generated\n  when not p > {threshold!r}\n}}\n",
    ]


def _pooled_cosine(folder: str, prompt, width: int) -> float:
    """The pooled probe's value for a prompt, on HF: the cosine of resid_post[1]'s prompt mean with u."""
    import torch

    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        hidden = hf_model(folder)(input_ids=ids, output_hidden_states=True).hidden_states[2][0]
    u = torch.tensor(eval(vec(width, 2)), dtype=hidden.dtype)  # noqa: S307 - our own literal
    return float(torch.nn.functional.cosine_similarity(hidden.mean(0), u, dim=0))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.loader import register_loader
    from steerc.serve_client import offline_request
    from steerc.targets.serve.emit import emit

    register_loader()
    folder = model_folder("tiny-llama")
    facts = facts_from_model(hf_model(folder))
    tmp = tmp_path_factory.mktemp("tables")
    plans, extras = [], []
    wide = ", ".join(vec(facts.hidden, 10 + i) for i in range(5))
    too_wide = f"intervention a {{\n  at resid_post[2]\n  ablate {wide}\n}}\n"  # rank 5: over the tables' 4
    # the pooled gate's threshold between the twins' values: it opens for one and stays shut for the other
    low, high = sorted(_pooled_cosine(folder, PROMPTS[i], facts.hidden) for i in (9, 10))
    assert high - low > 1e-3, (low, high)
    texts = _texts(facts.hidden, facts.head_dim, round((low + high) / 2, 6))
    texts += [texts[-1], too_wide]
    for i, body in enumerate(texts):
        plan = checked_plan(folder, "steer 1\n" + body)
        emit(plan, facts, str(tmp / f"p{i}"))
        plans.append(plan)
        extras.append(offline_request(str(tmp / f"p{i}"), PROMPTS[i])[1])
    insecure = os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the profiler below is a callable sent to the worker
    engine = vllm.LLM(model=folder, dtype="float32", max_model_len=256, max_num_seqs=16, skip_tokenizer_init=True,
                      load_format="steerc", logprobs_mode="raw_logits", max_logprobs=5, max_num_batched_tokens=32,
                      additional_config={"steerc": {"mode": "serve", "per_request": False, "probes": 2}},
                      logits_processors=["steerc.runtime.serve:SteercGuard"],
                      worker_extension_cls="steerc.runtime.serve.SteercServeExtension")
    try:
        from test_vllm_compiled import _forward_profile

        def generate(requests):
            params = [SamplingParams(max_tokens=NEW, temperature=0.0, detokenize=False, extra_args=x, logprobs=5)
                      for _, x in requests]
            outs = engine.generate([TokensPrompt(prompt_token_ids=p) for p, _ in requests], params, use_tqdm=False)
            return [(list(o.outputs[0].token_ids), [{int(t): float(lp.logprob) for t, lp in step.items()}
                                                    for step in o.outputs[0].logprobs]) for o in outs]

        engine.collective_rpc(_forward_profile, args=("start",))
        batch = generate([(PROMPTS[i], extras[i]) for i in range(PLANS)] + [(PROMPTS[PLANS], None)])
        (profile,) = engine.collective_rpc(_forward_profile, args=("stop",))
        refused = generate([(PROMPTS[0], extras[PLANS]), (PROMPTS[1], extras[0])])
        (status,) = engine.collective_rpc("steerc_requests")
    finally:
        engine.llm_engine.engine_core.shutdown()
        if insecure is None:
            os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
        else:
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = insecure
    return {"folder": folder, "plans": plans, "texts": texts, "batch": batch, "profile": profile, "refused": refused,
            "status": status}


def test_every_tabled_kind_in_one_batch_equals_hf_alone(runs):
    folder = runs["folder"]
    for i in range(PLANS):
        compare(hf_run(folder, runs["plans"][i], [PROMPTS[i]], NEW), [runs["batch"][i]], what=f"plan {i}")
    compare(hf_run(folder, None, [PROMPTS[PLANS]], NEW), [runs["batch"][PLANS]], what="plain")
    plain = hf_run(folder, None, [PROMPTS[0]], NEW)[0][0]
    assert runs["batch"][0][0] != plain, "the steering shows"


def test_no_steer_point_and_no_steerc_python_in_the_forward(runs):
    status, seen = runs["status"], runs["profile"]
    assert status["tables"]["per_request"] is False and status["outside_forward"] is True, status
    assert seen["forwards"] >= 2 and seen["calls"] > 0, seen
    assert seen["steerc"] == [], seen["steerc"]


def test_the_test_gates_open_and_shut(runs):
    """The gates matter (so equal to HF above means each was decided as HF decides it): the per-token gate
    steers some tokens and not others; the pooled one, one plan in one slot, opens for one twin only."""
    import torch

    folder, texts = runs["folder"], runs["texts"]

    def logits(i, plan):
        return hf_run(folder, plan, [PROMPTS[i]], NEW)[0][1]

    ungated = [checked_plan(folder, "steer 1\n" + texts[i].split("  when ")[0] + "}\n") for i in (8, 9)]
    gated, plain, always = (logits(8, plan) for plan in (runs["plans"][8], None, ungated[0]))
    assert not torch.allclose(gated, plain, atol=1e-3), "the per-token gate never opened"
    assert not torch.allclose(gated, always, atol=1e-3), "the per-token gate never shut"
    opened = []
    for i in (9, 10):
        gated, plain, always = (logits(i, plan) for plan in (runs["plans"][i], None, ungated[1]))
        assert torch.allclose(gated, plain, atol=1e-5) != torch.allclose(gated, always, atol=1e-5)
        opened.append(torch.allclose(gated, always, atol=1e-5))
    assert sorted(opened) == [False, True], opened


def test_a_plan_the_tables_cannot_hold_fails_alone(runs):
    refused, served = runs["refused"]
    assert refused[0] == [2], "ended at once: never run unsteered, never half-steered"
    compare(hf_run(runs["folder"], runs["plans"][0], [PROMPTS[1]], NEW), [served], what="beside it")
    assert runs["status"]["failures"] == 1
