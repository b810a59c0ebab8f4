"""``steerc derive --engine vllm`` on the real engine: the README's derive (SmolLM2, the joy pairs, every
layer, mean of the tokens, every method, normalized) gives the bank ``--engine hf`` gives, to 1e-4
relative, sign included, and its metadata names the engine. Each command boots what it needs (the vLLM
one: one eager engine steering nothing, read through ``steerc.runtime.vllm.capture``)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from harness import in_folder, require_vllm

require_vllm()

# the logistic fit's intercept: activations that differ by float32 rounding move it most (measured: the print)
LOGISTIC_BIAS_REL = 1e-2
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _derive(folder, engine: str) -> dict:
    return in_folder(folder, ["derive", "--model", "smollm2", "--data", "joy.jsonl", "--at", "resid_post[*]",
                              "--read", "mean", "--method", "all", "--normalize", "--no-cache", "--engine", engine,
                              "-o", f"{engine}.safetensors", "--format", "json"])


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("derive_vllm")
    shutil.copy(os.path.join(REPO, "examples", "smollm2", "joy.jsonl"), folder / "joy.jsonl")
    (folder / "steer.toml").write_text("")
    return folder, _derive(folder, "hf"), _derive(folder, "vllm")


def test_the_bank_equals_the_hf_engine_s_sign_included(banks):
    from safetensors.numpy import load_file

    folder, hf, vl = banks
    a, b = load_file(str(folder / "hf.safetensors")), load_file(str(folder / "vllm.safetensors"))
    assert sorted(a) == sorted(b) and len(a) >= 4 * 30
    worst: dict[str, float] = {}
    for key in a:
        method = key.rsplit(".", 1)[0]
        rel = float(np.abs(a[key] - b[key]).max() / max(np.abs(a[key]).max(), 1e-12))
        worst[method] = max(worst.get(method, 0.0), rel)
        if a[key].size > 1:  # a direction, not a bias: the same sign
            assert float(np.dot(a[key].ravel(), b[key].ravel())) > 0, key
    print("\nderive --engine vllm against --engine hf, largest relative difference per method: "
          + ", ".join(f"{m} {v:.3g}" for m, v in sorted(worst.items())))
    for method in ("mean_diff", "pca_diff", "pca_center", "logistic"):  # every direction, as the issue asks
        assert worst[method] <= 1e-4, method
    # the logistic fit's intercept, one number near 0 measured relative to itself (7.4e-4 here)
    assert worst["logistic_bias"] <= LOGISTIC_BIAS_REL
    assert vl["engine"] == "vllm" and "engine" not in hf
    assert vl["scores"].keys() == hf["scores"].keys()


def test_calibrate_through_vllm_is_refused_with_the_reason(tmp_path):
    from support import run_cli

    shutil.copy(os.path.join(REPO, "examples", "smollm2", "joy.jsonl"), tmp_path / "joy.jsonl")
    code, _, err = run_cli(["derive", "--model", "smollm2", "--data", str(tmp_path / "joy.jsonl"), "--engine",
                            "vllm", "--calibrate", "x.steer", "--probe", "p"])
    assert code != 0 and "--engine hf" in err
