"""`steerc derive` against the peers themselves, on SmolLM2-135M-Instruct with the same data, layer and positions.

* mean difference — steering-vectors' ``train_steering_vector`` (decoder-block output, last token,
  ``mean_aggregator``) equals ``--method mean_diff --read last`` at ``resid_post[l]``;
* PCA — repeng's ``read_representations`` (``pca_diff`` and ``pca_center``; its layer ``l`` is
  ``hidden_states[l + 1]``, decoder layer ``l``'s output, last token) equals ``--method pca_diff`` and
  ``pca_center`` at ``resid_post[l]``, sign included (repeng's vote; where the vote ties, both keep
  scikit-learn's sign).

Both libraries pin transformers 4.x, so this runs in a second environment, ``.venv-peers``
(``./dev test-peers`` builds it: transformers 4.57, repeng 0.4.0, steering-vectors 0.12.2,
scikit-learn). Elsewhere it skips, saying so; under ``CI=true`` or ``STEERC_PEER_TESTS=1`` a
missing library fails.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))

import own_env  # noqa: E402
from own_env import require  # noqa: E402

DATA = os.path.join(REPO, "examples", "smollm2", "joy.jsonl")
LAYERS = (4, 8, 14)
TOL = 1e-5  # largest entry difference; activations are float32, the vectors' entries up to a few units


require("steering_vectors")
require("repeng")


@pytest.fixture(scope="module")
def pairs():
    with open(DATA, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def smollm2():
    return own_env.smollm2()


@pytest.fixture(scope="module")
def ours(smollm2, tmp_path_factory):
    """steerc derive's bank, through the command line, at the test layers."""
    from safetensors.numpy import load_file
    from support import run_cli

    path, _, _ = smollm2
    out = str(tmp_path_factory.mktemp("derive") / "joy.safetensors")
    at = "resid_post[" + ", ".join(map(str, LAYERS)) + "]"
    code, stdout, err = run_cli(["derive", "--model", path, "--data", DATA, "--at", at, "--read", "last",
                                 "--method", "mean_diff,pca_diff,pca_center", "--batch-size", "4", "-o", out])
    assert code == 0, err
    return load_file(out)


def _report(what: str, diffs: dict) -> None:
    print(f"\n{what}: " + ", ".join(f"layer {k}: {v:.2e}" for k, v in diffs.items()))


def test_mean_diff_equals_steering_vectors(smollm2, ours, pairs):
    from steering_vectors import train_steering_vector

    _, model, tokenizer = smollm2
    sv = train_steering_vector(model, tokenizer, [(p["positive"], p["negative"]) for p in pairs],
                               layers=list(LAYERS), layer_type="decoder_block", read_token_index=-1, batch_size=1)
    diffs = {}
    for layer in LAYERS:
        theirs = sv.layer_activations[layer].detach().float().numpy().reshape(-1)
        mine = ours[f"mean_diff.{layer}"]
        diffs[layer] = float(np.abs(mine - theirs).max())
        assert diffs[layer] < TOL, (layer, diffs[layer], float(np.abs(theirs).max()))
    _report("mean_diff vs steering-vectors, largest entry difference", diffs)


@pytest.mark.parametrize("method", ["pca_diff", "pca_center"])
def test_pca_equals_repeng(smollm2, ours, pairs, method):
    from repeng.extract import DatasetEntry, read_representations

    _, model, tokenizer = smollm2
    dataset = [DatasetEntry(p["positive"], p["negative"]) for p in pairs]
    dirs = read_representations(model, tokenizer, dataset, hidden_layers=list(LAYERS), batch_size=1, method=method)
    diffs, signs = {}, {}
    for layer in LAYERS:
        theirs = np.asarray(dirs[layer], dtype=np.float64)
        mine = ours[f"{method}.{layer}"].astype(np.float64)
        same = float(np.abs(mine - theirs).max())
        flipped = float(np.abs(mine + theirs).max())
        diffs[layer], signs[layer] = min(same, flipped), same <= flipped
        assert diffs[layer] < TOL, (layer, same, flipped)
    _report(f"{method} vs repeng, largest entry difference", diffs)
    # the sign is repeng's: its vote over the pairs, the same computation on the same projections
    assert all(signs.values()), signs
