"""Directions from activations, and how well they separate: numpy only, float64 inside.

Every method takes the activations of the positive and the negative examples
at one site, ``pos`` and ``neg`` of shape ``[n, d]`` (row ``i`` of each is
pair ``i``), and returns a direction ``[d]``:

* ``mean_diff`` — the mean of the paired differences, ``mean(pos - neg)``:
  contrastive activation addition (CAA), the default aggregator of
  steering-vectors (``mean_aggregator``). Not normalised.
* ``pca_diff`` — repeng's default: the first principal component of the
  paired differences ``pos - neg``, the differences **centred** first (as
  scikit-learn's ``PCA`` centres what it is fitted on). Unit norm.
* ``pca_center`` — repeng's other method: each pair is centred on its own
  mean (``pos - m``, ``neg - m`` with ``m = (pos + neg) / 2``), all ``2n``
  rows are stacked, and their first principal component taken. Unit norm.
* ``logistic`` — an L2-regularised logistic regression of positive (1)
  against negative (0) with a bias, fitted by Newton's method: ``(w, b)``
  such that ``sigmoid(w · h + b)`` is the probability of positive — what a
  ``read dot(w) + b`` probe compared with 0 decides.

The sign of a principal component is chosen as repeng chooses it: project
every example onto the direction; if, over the pairs, the positive example
projects below its negative one more often than above, flip. When the vote
ties, the sign is scikit-learn's (``svd_flip`` on the component: its
largest-magnitude entry positive), which repeng then keeps.

>>> import numpy as np
>>> pos = np.array([[2.0, 0.0], [3.0, 1.0]]); neg = np.array([[0.0, 0.0], [1.0, 1.0]])
>>> mean_diff(pos, neg)
array([2., 0.])
>>> auroc(np.array([0.9, 0.8]), np.array([0.1, 0.85]))
0.75
"""

from __future__ import annotations

import numpy as np

METHODS = ("mean_diff", "pca_diff", "pca_center", "logistic")
DEFAULT_L2 = 1.0  # scikit-learn's LogisticRegression default (C = 1): loss = Σ log-loss + ||w||² / 2


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def mean_diff(pos, neg) -> np.ndarray:
    return (_f64(pos) - _f64(neg)).mean(axis=0)


def first_component(train) -> np.ndarray:
    """The first principal component of ``train`` (rows are samples), centred, unit norm, with
    scikit-learn's sign convention (the largest-magnitude entry positive)."""
    x = _f64(train)
    x = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    v = vt[0]
    if v[np.argmax(np.abs(v))] < 0:
        v = -v
    return v


def repeng_sign(direction, pos, neg) -> np.ndarray:
    """``direction``, flipped when more positive examples project below their negatives than above."""
    pp, pn = _f64(pos) @ direction, _f64(neg) @ direction
    smaller, larger = np.mean(pp < pn), np.mean(pp > pn)
    return -direction if smaller > larger else direction


def pca_diff(pos, neg) -> np.ndarray:
    return repeng_sign(first_component(_f64(pos) - _f64(neg)), pos, neg)


def pca_center(pos, neg) -> np.ndarray:
    p, n = _f64(pos), _f64(neg)
    center = (p + n) / 2
    return repeng_sign(first_component(np.concatenate([p - center, n - center])), pos, neg)


def logistic(pos, neg, l2: float = DEFAULT_L2, iterations: int = 100) -> tuple[np.ndarray, float]:
    """(w, b) minimising ``Σ log-loss(y, w·h + b) + l2 ||w||² / 2`` (the bias not penalised).

    Newton's method, each step solved through an ``n × n`` system (``n``
    examples), so a 576-wide model with 16 examples costs a 16×16 solve
    per step. Inputs are centred and scaled by one global factor for
    conditioning; the result is mapped back exactly.
    """
    x = np.concatenate([_f64(pos), _f64(neg)])
    y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    mu = x.mean(axis=0)
    scale = float(np.sqrt(((x - mu) ** 2).sum(axis=1).mean())) or 1.0
    z = (x - mu) / scale
    lam = l2 / (scale * scale)  # ||w||^2 in the original units is ||w_z||^2 / scale^2
    n, d = z.shape
    w, b = np.zeros(d), 0.0
    for _ in range(iterations):
        t = z @ w + b
        p = 1.0 / (1.0 + np.exp(-np.clip(t, -500, 500)))
        s = p * (1 - p) + 1e-12
        gw, gb = z.T @ (p - y) + lam * w, float((p - y).sum())
        # Newton step for [w; b]: Hessian [[A, c], [cᵀ, e]] with A = Zᵀ S Z + λI, c = Zᵀ s, e = Σ s.
        # A⁻¹ through the n×n system (Woodbury), then the bias by its Schur complement: O(n² d) per step.
        kinv = np.linalg.inv(lam * np.diag(1.0 / s) + z @ z.T)

        def ainv(v):
            return (v - z.T @ (kinv @ (z @ v))) / lam

        c = z.T @ s
        a_g, a_c = ainv(gw), ainv(c)
        step_b = (gb - c @ a_g) / (float(s.sum()) - c @ a_c)
        step_w = a_g - a_c * step_b
        w, b = w - step_w, b - float(step_b)
        if max(float(np.abs(step_w).max()), abs(float(step_b))) < 1e-10:
            break
    w_orig = w / scale
    return w_orig, float(b - w_orig @ mu)


def direction(method: str, pos, neg) -> tuple[np.ndarray, float | None]:
    """(direction, bias) for ``method``; the bias only for ``logistic``."""
    if method == "logistic":
        return logistic(pos, neg)
    return {"mean_diff": mean_diff, "pca_diff": pca_diff, "pca_center": pca_center}[method](pos, neg), None


def scores(method: str, vector, bias, h) -> np.ndarray:
    """How a held-out activation scores on a direction: its projection (``dot(v)``), plus the bias for
    ``logistic``. A positive example should score higher than a negative one."""
    out = _f64(h) @ _f64(vector)
    return out + bias if bias is not None else out


def auroc(positive, negative) -> float:
    """The area under the ROC curve of ``positive`` scores against ``negative`` ones (the
    Mann–Whitney U statistic over ``n_pos · n_neg``, ties counting one half)."""
    p, n = _f64(positive), _f64(negative)
    if not len(p) or not len(n):
        return float("nan")
    greater = (p[:, None] > n[None, :]).sum()
    ties = (p[:, None] == n[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(p) * len(n)))


def split(n: int, heldout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) pair indices: a seeded shuffle, ``round(heldout · n)`` held out (at least one
    on each side when ``0 < heldout < 1`` and ``n >= 2``)."""
    order = np.random.default_rng(seed).permutation(n)
    k = int(round(heldout * n))
    if 0 < heldout < 1 and n >= 2:
        k = min(max(k, 1), n - 1)
    return np.sort(order[k:]), np.sort(order[:k])


# ------------------------------------------------------------------ calibrate


def best_threshold(positive, negative) -> tuple[str, float, float, float]:
    """(op, threshold, F1, accuracy) of the comparison ``value op threshold`` that best tells the
    ``positive`` values (the condition should hold) from the ``negative`` ones.

    As CAST's condition search (``find_best_condition_point``), it maximises
    the F1 score of "condition holds" over both directions; unlike its grid
    of thresholds in [0, 1) by 0.01, every distinct cut is tried (midpoints
    between sorted values, and beyond both ends), so any readout range
    works and the best cut is exact. Ties go to the higher accuracy, then
    to ``>``, then to the lower threshold.
    """
    p, n = _f64(positive), _f64(negative)
    values = np.unique(np.concatenate([p, n]))
    mids = (values[:-1] + values[1:]) / 2
    inside = (values[:-1] < mids) & (mids < values[1:])  # adjacent floats have no midpoint between them
    # `x > t` for t just above each value (the split {x > v}); `x < t` just below each value ({x < w})
    above = np.concatenate([[values[0] - 1.0], np.where(inside, mids, values[:-1]), [values[-1]]])
    below = np.concatenate([[values[0]], np.where(inside, mids, values[1:]), [values[-1] + 1.0]])
    best = None
    for op, cuts in ((">", above), ("<", below)):
        for t in cuts:
            tp = (p > t).sum() if op == ">" else (p < t).sum()
            fp = (n > t).sum() if op == ">" else (n < t).sum()
            fn = len(p) - tp
            f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
            acc = (tp + len(n) - fp) / (len(p) + len(n))
            key = (f1, acc, op == ">", -t)
            if best is None or key > best[0]:
                best = (key, op, float(t), float(f1), float(acc))
    return best[1], best[2], best[3], best[4]
