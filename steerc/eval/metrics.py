"""The numbers `steerc eval` reports, from per-item scores, with percentile bootstrap intervals (numpy only).

Every metric is a function of a set of items; its interval resamples the
items with replacement ``resamples`` times from a generator seeded with
``seed`` (numpy's PCG64), recomputes the metric on each resample, and takes
the 2.5th and 97.5th percentiles (spec/eval.md, *Intervals*). The same seed,
items and scores give the same bytes.

>>> e = estimate(lambda rows: rows[:, 0].mean(), [[1.0], [2.0], [3.0]], resamples=200, seed=0)
>>> e["mean"], e["n"], e["low"] <= 2.0 <= e["high"]
(2.0, 3, True)
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
PICKS_PER_DRAW = 1 << 20  # item indices drawn at a time (8 MiB): resamples x items may be 10^10

# name -> what it is (spec/eval.md defines each; `steerc tune` rules name them)
METRICS = {
    "behavior": "mean behaviour score, log p(positive) - log p(negative) (nats), steered",
    "behavior_change": "mean change of the behaviour score, steered - unsteered (nats)",
    "win_rate": "fraction of behaviour items where the positive completion wins (ties count half), steered",
    "kl": "mean per-token KL(p_unsteered || p_steered) over the cost texts (nats)",
    "perplexity": "perplexity of the cost texts, steered",
    "perplexity_ratio": "steered perplexity / unsteered perplexity of the cost texts",
}
UNSTEERED = ("behavior", "win_rate", "perplexity")


def estimate(metric, rows, *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """``{"mean", "low", "high", "n"}`` of ``metric(rows)`` (rows: items × columns) and its bootstrap interval."""
    data = np.asarray(rows, dtype=np.float64)
    n = int(data.shape[0])
    value = float(metric(data))
    if n < 2:
        return {"mean": value, "low": value, "high": value, "n": n}
    rng = np.random.Generator(np.random.PCG64(seed))
    values = np.empty(resamples, dtype=np.float64)
    per_draw = max(1, PICKS_PER_DRAW // n)  # resamples drawn at once: memory stays bounded whatever the counts
    for start in range(0, resamples, per_draw):
        picks = rng.integers(0, n, size=(min(per_draw, resamples - start), n))  # the same stream as one draw
        values[start:start + len(picks)] = [metric(data[p]) for p in picks]
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return {"mean": value, "low": float(low), "high": float(high), "n": n}


def _win(scores) -> np.ndarray:
    """1 where the positive completion wins, 0.5 on a tie, 0 where it loses; NaN where the score is not a number
    (an overflowed point): never a loss that a table would show as a finite 0."""
    return np.where(np.isnan(scores), np.nan, np.where(scores > 0, 1.0, np.where(scores == 0, 0.5, 0.0)))


def _ppl(rows) -> float:
    """Corpus perplexity of rows (nll sum, tokens)."""
    return math.exp(rows[:, 0].sum() / max(rows[:, 1].sum(), 1.0))


def point_metrics(behavior: list[tuple[float, float]], cost: list[tuple[float, float, float, float]], *,
                  resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """The steered metrics of one point.

    ``behavior``: (steered score, unsteered score) per behaviour item.
    ``cost``: (mean KL, steered NLL sum, unsteered NLL sum, scored tokens) per cost item.
    A metric whose items are absent is left out.
    """
    out = {}
    opts = {"resamples": resamples, "seed": seed}
    if behavior:
        b = np.asarray(behavior, dtype=np.float64)
        out["behavior"] = estimate(lambda r: r[:, 0].mean(), b, **opts)
        out["behavior_change"] = estimate(lambda r: (r[:, 0] - r[:, 1]).mean(), b, **opts)
        out["win_rate"] = estimate(lambda r: _win(r[:, 0]).mean(), b, **opts)
    if cost:
        c = np.asarray(cost, dtype=np.float64)
        out["kl"] = estimate(lambda r: r[:, 0].mean(), c, **opts)
        out["perplexity"] = estimate(lambda r: _ppl(r[:, [1, 3]]), c, **opts)
        out["perplexity_ratio"] = estimate(lambda r: _ppl(r[:, [1, 3]]) / _ppl(r[:, [2, 3]]), c, **opts)
    return out


def unsteered_metrics(behavior: list[float], cost: list[tuple[float, float]], *, resamples: int = RESAMPLES,
                      seed: int = 0) -> dict:
    """The unsteered model's behaviour, win rate and perplexity (``cost``: (NLL sum, tokens) per item)."""
    out = {}
    opts = {"resamples": resamples, "seed": seed}
    if behavior:
        b = np.asarray(behavior, dtype=np.float64).reshape(-1, 1)
        out["behavior"] = estimate(lambda r: r[:, 0].mean(), b, **opts)
        out["win_rate"] = estimate(lambda r: _win(r[:, 0]).mean(), b, **opts)
    if cost:
        out["perplexity"] = estimate(_ppl, np.asarray(cost, dtype=np.float64), **opts)
    return out
