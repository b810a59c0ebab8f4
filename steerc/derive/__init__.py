"""`steerc derive`: steering vectors and probe thresholds from data.

The pipeline, one module per step:

1. :mod:`~steerc.derive.data` — the examples (JSONL pairs or two text
   files), read with diagnostics that point into the files;
2. :mod:`~steerc.derive.activations` — one vector per text at each site,
   read where the HF target steers (torch, batched, cached on disk by model
   and data hash);
3. :mod:`~steerc.derive.methods` — directions from activations (mean
   difference, repeng's two PCAs, logistic regression) and how well they
   separate held-out pairs (AUROC), numpy only;
4. :mod:`~steerc.derive.bank` — the per-layer bank written as safetensors,
   with its provenance in the metadata;
5. :mod:`~steerc.derive.report` — the table and the plot.

:func:`fit` and :func:`heldout_scores` are steps 3's use on read
activations; :func:`derive` (:mod:`~steerc.derive.api`) is the whole
pipeline from Python, on a model already loaded, and the command line,
:mod:`steerc.cli.derive`, runs the same code.
"""

from __future__ import annotations

import numpy as np

from steerc.derive import methods as M


def fit(acts: dict, method_names, normalize: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """({tensor name: row}, {method: {layer: bias}}) from ``acts`` {site: (pos, neg)} over all pairs."""
    rows, biases = {}, {}
    for site, (pos, neg) in acts.items():
        for method in method_names:
            vector, bias = M.direction(method, pos, neg)
            if normalize:
                norm = float(np.linalg.norm(vector))
                if norm > 0:
                    vector = vector / norm
                    bias = None if bias is None else bias / norm
            rows[f"{method}.{site.layer}"] = vector.astype(np.float32)
            if bias is not None:
                rows[f"{method}_bias.{site.layer}"] = np.asarray([bias], dtype=np.float32)
                biases.setdefault(method, {})[str(site.layer)] = float(np.float32(bias))
    return rows, biases


def heldout_scores(acts: dict, method_names, heldout: float, seed: int) -> tuple[dict, int]:
    """({method: {layer: AUROC}}, held-out pair count): each method fitted on the training pairs, its
    held-out positive and negative examples scored on the direction (``dot``, plus the bias for
    ``logistic``); an AUROC of 1 separates them perfectly, 0.5 is chance."""
    n = len(next(iter(acts.values()))[0])
    train, held = M.split(n, heldout, seed)
    if not len(held) or not len(train):
        return {}, 0
    out: dict = {}
    for site, (pos, neg) in acts.items():
        for method in method_names:
            vector, bias = M.direction(method, pos[train], neg[train])
            score = M.auroc(M.scores(method, vector, bias, pos[held]), M.scores(method, vector, bias, neg[held]))
            out.setdefault(method, {})[str(site.layer)] = round(score, 6)
    return out, len(held)


from steerc.derive.api import Derived, DeriveError, derive  # noqa: E402 - the entry point, built on fit above

__all__ = ["Derived", "DeriveError", "derive", "fit", "heldout_scores"]
