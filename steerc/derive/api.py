"""``steerc derive`` from Python: steering vectors from pairs of texts, on a model you have loaded.

For users coming from repeng (``ControlVector.train``) and steering-vectors
(``train_steering_vector``): the same job, the same methods, and the bank
that ``steerc derive -o`` writes::

    from steerc.derive import derive
    from steerc.runtime.models import load_model

    model, tokenizer = load_model("smollm2")
    result = derive(model, tokenizer, "examples/smollm2/joy.jsonl", at="resid_post[*]", method="mean_diff")
    result["mean_diff.8"]          # a numpy float32 row of 576 numbers
    result.save("joy.safetensors")  # load("joy.safetensors", key="mean_diff.8") in a .steer file

The command line runs the same code (:func:`read_pairs`, :func:`steerc.derive.fit`,
:func:`steerc.derive.heldout_scores`), so the rows are equal on the same
model and data. Unlike the command line, nothing is cached and nothing is
printed. Mistakes raise :class:`DeriveError`, whose ``render()`` gives the
diagnostics as ``steerc derive`` prints them.
"""

from __future__ import annotations

import json
import os

import numpy as np

from steerc.core.limits import context_of, text_tokens_limit
from steerc.core.record import define, field
from steerc.derive import activations as A
from steerc.derive import bank, fit, heldout_scores
from steerc.derive import data as D
from steerc.derive.methods import METHODS
from steerc.diagnostics import Refusal
from steerc.diagnostics.codes import EMPTY_DATA, INVALID_DATA, INVALID_VALUE
from steerc.runtime.capture import encode, positions, too_many_tokens


class DeriveError(Refusal):
    """Arguments or data ``derive`` cannot use: ``diagnostics`` (each with a code, and a span into
    ``sources`` where there is one) say why."""


def _error(code: str, message: str, help: str | None = None) -> DeriveError:
    from steerc.diagnostics import Diagnostic

    return DeriveError([Diagnostic.error(code, message, None, help=help)])


@define
class Derived:
    """What :func:`derive` found: the bank's rows, the held-out scores, and the provenance ``save`` records."""

    vectors: dict  # "mean_diff.8" -> float32 [d]; "logistic_bias.8" -> float32 [1]
    scores: dict  # {method: {layer (str): held-out AUROC}}; empty when heldout=0
    heldout_pairs: int
    methods: list
    layers: list
    info: dict = field(factory=dict)  # the provenance bank.write records (spec/derive.md)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.vectors[key]

    def keys(self):
        return self.vectors.keys()

    def best_layer(self, method: str | None = None) -> int:
        """The layer whose held-out AUROC is highest for ``method`` (default the first), as the command
        line's ``use it:`` line picks it; the middle layer without scores."""
        from steerc.derive.report import best_layer

        method = method or self.methods[0]
        return best_layer(self.scores[method], self.layers) if self.scores else self.layers[len(self.layers) // 2]

    def save(self, path: str) -> None:
        """Write the bank as ``steerc derive -o`` does: safetensors, one row per method and layer, the
        provenance in its metadata (so ``steerc check`` warns on another model or site)."""
        bank.write(os.fspath(path), self.vectors, self.info)


def methods_of(method) -> list[str]:
    """The method names of ``method`` (a name, ``"all"``, a comma-separated string, or a list of these)."""
    items = [method] if isinstance(method, str) else list(method or ["mean_diff"])
    names = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip()
            if name == "all":
                names.extend(METHODS)
            elif name in METHODS:
                names.append(name)
            else:
                from steerc.diagnostics.suggest import did_you_mean

                raise _error(INVALID_VALUE, f"method {name!r}: not a method ({', '.join(METHODS)}, or all)",
                             help=did_you_mean(name, METHODS + ("all",)))
    return list(dict.fromkeys(names))


def sites_of(at: str, facts, label: str = "at", one_per_layer: bool = True) -> list:
    """The concrete sites of a selector such as ``resid_post[25%:75%]`` (:func:`steerc.runtime.capture.sites_of`;
    raises DeriveError whose diagnostics point into the selector, shown as a one-line program named ``label``).
    A bank holds one row per layer (``one_per_layer``); ``steerc capture`` reads several heads of one layer too."""
    from steerc.runtime.capture import CaptureError
    from steerc.runtime.capture import sites_of as concrete

    try:
        return concrete(at, facts, label=label, one_per_layer=one_per_layer)
    except CaptureError as exc:
        raise DeriveError(exc.diagnostics, exc.sources) from None


def dataset_of(pairs) -> D.Dataset:
    """A Dataset from a JSONL path, or from pairs in memory: ``(positive, negative)``, ``(positive, negative,
    prompt)``, ``{"positive": ..., "negative": ..., "prompt": ...}`` or :class:`~steerc.derive.data.Pair`.
    In-memory pairs are checked as the lines of a JSONL file named ``<pairs>`` would be."""
    from steerc.core.source import Source

    if isinstance(pairs, (str, os.PathLike)):
        path = os.fspath(pairs)
        try:
            return D.parse_pairs(D.read_source(path))
        except D.DataError as exc:
            raise DeriveError(exc.diagnostics, exc.sources) from None
        except OSError as exc:
            raise _error(INVALID_DATA, f"cannot read {path} ({exc.strerror or exc})") from None
    lines = []
    for i, p in enumerate(pairs):
        if isinstance(p, D.Pair):
            row = {"positive": p.positive, "negative": p.negative, "prompt": p.prompt}
        elif isinstance(p, dict):
            row = dict(p)
        elif isinstance(p, (tuple, list)) and len(p) in (2, 3):
            row = dict(zip(("positive", "negative", "prompt"), p))
        else:
            raise _error(INVALID_DATA, f"pair {i} is a {type(p).__name__}: give (positive, negative), "
                         "(positive, negative, prompt) or a dict with those keys")
        if row.get("prompt", 0) is None:
            del row["prompt"]
        lines.append(json.dumps(row, ensure_ascii=False))
    try:
        return D.parse_pairs(Source("<pairs>", "".join(line + "\n" for line in lines)))
    except D.DataError as exc:
        raise DeriveError(exc.diagnostics, exc.sources) from None


def check_request(dataset: D.Dataset, methods: list[str], read: str) -> None:
    """What the data must have for ``methods`` and ``read`` (raises DeriveError)."""
    if read not in A.READS:
        raise _error(INVALID_VALUE, f"read {read!r}: one of {', '.join(A.READS)}")
    if read == "completion" and not all(p.prompt is not None for p in dataset.pairs):
        raise _error(INVALID_DATA, "read completion averages over the completion of a prompt, and this data "
                     "has pairs without a \"prompt\"", help='give every pair a "prompt", or read last or mean')
    if len(dataset.pairs) < 2 and any(m in methods for m in ("pca_diff", "pca_center", "logistic")):
        raise _error(EMPTY_DATA, f"{len(dataset.pairs)} pair: a principal component or a regression needs "
                     "at least 2", help="add pairs, or use the method mean_diff")


def read_pairs(model, tokenizer, facts, dataset: D.Dataset, sites, reading: A.Reading, *, batch_size: int = 8,
               label: str | None = None, reader=None, context: int | None = None) -> dict:
    """{site: (positive [n, d], negative [n, d])}: every text of ``dataset`` read at ``sites`` as
    ``reading`` says (the positive texts, then the negative ones, in batches of ``batch_size``).

    ``reader(items, sites)`` reads through another engine (``derive --engine vllm``:
    :func:`steerc.runtime.vllm.capture`); without it, the HF model's hooks (``model``).

    Every text is tokenized before the first forward, and one longer than the model's ``context`` (by default
    its config's ``max_position_embeddings`` or equivalent) or MAX_TEXT_TOKENS raises DataError at the
    text's key or line in its data file."""
    if context is None and model is not None:
        context = context_of(getattr(model, "config", None) or {})
    limit = text_tokens_limit(context)
    items = []
    for side in ("positive", "negative"):
        for pair in dataset.pairs:
            ids, start = encode(tokenizer, getattr(pair, side), pair.prompt, reading.chat)
            if len(ids) > limit:
                span = pair.spans.get(side)
                raise D.DataError([too_many_tokens(len(ids), context, span, f"a {side} text")],
                                  dataset.sources if span is not None else {})
            a, b = positions(len(ids), start, reading.read)
            if b <= a:
                raise _error(INVALID_DATA, f"a {side} completion has no tokens to read (read completion)")
            items.append((ids, a, b))
    many = "s" if len(sites) > 1 else ""
    if reader is not None:
        read = reader(items, sites)
    else:
        read = A.read(model, tokenizer, facts, items, sites, batch_size=batch_size,
                      label=label or f"reading {len(items)} texts at {len(sites)} site{many}")
    n = len(dataset.pairs)
    return {s: (v[:n], v[n:]) for s, v in read.items()}


def provenance(facts, sites, methods, reading, normalize: bool, dataset: D.Dataset, heldout: float, seed: int,
               held: int, scores: dict, biases: dict, model_name: str, weights_sha256: str | None,
               engine: str = "hf") -> dict:
    """The provenance a bank records (spec/derive.md, "The bank"); ``engine`` only when it is not ``hf``."""
    from steerc import __version__

    return {
        "steerc": __version__,
        **({"engine": engine} if engine != "hf" else {}),
        "model": {"fingerprint": facts.fingerprint, "family": facts.family, "layers": facts.layers,
                  "hidden": facts.hidden, "weights_sha256": weights_sha256, "name": model_name},
        "site": sites[0].kind,
        "layers": [s.layer for s in sites],
        "head": sites[0].head,
        "methods": methods,
        "reading": reading.to_json(),
        "normalized": bool(normalize),
        "dataset": {"sha256": dataset.sha256, "pairs": len(dataset.pairs),
                    "files": [os.path.basename(f) for f in dataset.files]},
        "heldout": {"fraction": heldout, "seed": seed, "pairs": held},
        "scores": scores,
        "logistic_bias": biases.get("logistic", {}),
    }


def derive(model, tokenizer, pairs, *, at: str, method="mean_diff", read: str = "last", chat: bool = False,
           normalize: bool = False, heldout: float = 0.25, seed: int = 0, batch_size: int = 8) -> Derived:
    """Steering vectors for ``model`` (a transformers causal LM) from ``pairs``, as ``steerc derive`` makes them.

    ``pairs``: a JSONL path, or pairs in memory (see :func:`dataset_of`). ``at``: the sites, in steerc's
    selector syntax (``"resid_post[*]"``, ``"resid_pre[4:8]"``, ``"head[10, 3]"``). ``method``:
    ``mean_diff`` (default), ``pca_diff``, ``pca_center``, ``logistic``, ``"all"``, or a list. ``read``:
    ``last`` token (default, as repeng and steering-vectors), ``mean`` over the text's tokens, or
    ``completion`` (pairs with a prompt). ``chat``: wrap each text in the chat template. ``heldout``: the
    share of pairs held out to score each layer (0: no scores). Raises :class:`DeriveError`.
    """
    from steerc.runtime.hf import facts_from_model

    if not isinstance(batch_size, int) or batch_size < 1:
        raise _error(INVALID_VALUE, f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    if not 0 <= heldout < 1:
        raise _error(INVALID_VALUE, f"heldout is a fraction from 0 (no scores) up to, not including, 1, "
                     f"got {heldout!r}")
    methods = methods_of(method)
    dataset = dataset_of(pairs)
    check_request(dataset, methods, read)
    facts = facts_from_model(model)
    sites = sites_of(at, facts)
    reading = A.Reading(bool(chat), read)
    try:
        acts = read_pairs(model, tokenizer, facts, dataset, sites, reading, batch_size=batch_size)
    except D.DataError as exc:
        raise DeriveError(exc.diagnostics, exc.sources) from None
    rows, biases = fit(acts, methods, normalize=normalize)
    scores, held = heldout_scores(acts, methods, heldout, seed) if heldout else ({}, 0)
    name = os.path.basename(str(getattr(getattr(model, "config", None), "_name_or_path", "") or "").rstrip("/"))
    info = provenance(facts, sites, methods, reading, normalize, dataset, heldout, seed, held, scores, biases,
                      name or "model", None)
    return Derived(rows, scores, held, methods, [s.layer for s in sites], info)


__all__ = ["DeriveError", "Derived", "derive"]
