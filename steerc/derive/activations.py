"""derive's activations: read at steerc sites (:func:`steerc.runtime.hf.capture.read_items`, or through
vLLM), cached on disk.

A site is read where the HF target steers it (spec/derive.md, *Capture*: the
same meaning on every engine). Each text gives one vector per site:

* ``last`` — the last token (for a prompt and a completion: the
  completion's last token);
* ``mean`` — the mean over all tokens of the text (the chat template's
  tokens included, when ``--chat``);
* ``completion`` — the mean over the completion's tokens (pairs with a
  ``prompt`` only).

Texts are tokenized one by one (prompt and completion separately, then
joined, so no token straddles the boundary: :func:`steerc.runtime.capture.encode`).

The cache: activations are kept under ``<steerc cache>/derive/`` in one
safetensors file per site, keyed by the model's weights (sha256), the data
(sha256), the reading options and this module's format version. A rerun
with the same data and options reads them back without loading the model;
a rerun at more layers computes only the missing sites.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import TYPE_CHECKING

import numpy as np

from steerc.core.jsonio import canonical
from steerc.core.record import frozen
from steerc.derive.data import Dataset

if TYPE_CHECKING:
    from steerc.runtime.capture import Site

FORMAT = "steerc.activations/1"
READS = ("last", "mean", "completion")


@frozen
class Reading:
    chat: bool
    read: str  # last | mean | completion

    def to_json(self) -> dict:
        return {"chat": self.chat, "read": self.read}


def model_sha256(path: str) -> str:
    """The sha256 of a model's weights: a .gguf file's bytes, or a folder's weight files and config
    (each hashed once and remembered by size and modification time, see :mod:`steerc.core.cache`)."""
    from steerc.core.cache import file_sha256

    if os.path.isfile(path):
        return file_sha256(path)
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name == "config.json" or name.endswith((".safetensors", ".bin", ".gguf")):
            digest.update(name.encode("utf-8") + b"\0" + file_sha256(os.path.join(path, name)).encode("ascii"))
    return digest.hexdigest()


def cache_key(model_hash: str, dataset: Dataset, reading: Reading, side: str = "pairs", engine: str = "hf") -> str:
    """The activations' cache key: the model's weights, the data, the reading, and (past ``hf``) the engine
    that computed them, whose rounding differs."""
    body = {"format": FORMAT, "model": model_hash, "data": list(dataset.file_sha256s) or dataset.sha256,
            "reading": reading.to_json(),
            "side": side, **({"engine": engine} if engine != "hf" else {})}
    return hashlib.sha256(canonical(body).encode("ascii")).hexdigest()


def _cache_path(key: str, site: Site) -> str:
    from steerc.core.cache import cache_root

    return os.path.join(cache_root(), "derive", key[:32], f"{site.key}.safetensors")


def cached(key: str, sites) -> dict:
    """{site: (pos [n, d], neg [n, d])} for the sites whose activations are in the cache."""
    from safetensors.numpy import load_file

    out = {}
    for site in sites:
        path = _cache_path(key, site)
        try:
            t = load_file(path)
            out[site] = (t["pos"], t["neg"])
        except Exception:  # noqa: BLE001 - a missing or damaged entry is recomputed
            continue
    return out


def store(key: str, acts: dict) -> None:
    """Write each site's activations to the cache (atomically; silently skipped when it is not writable)."""
    import tempfile

    from safetensors.numpy import save_file

    for site, (pos, neg) in acts.items():
        path = _cache_path(key, site)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
            os.close(fd)
            save_file({"pos": np.ascontiguousarray(pos), "neg": np.ascontiguousarray(neg)}, tmp)
            os.replace(tmp, path)
        except OSError:
            return


# ------------------------------------------------------------------------- model


class _Progress:
    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.tty = sys.stderr.isatty()

    def step(self, n: int) -> None:
        self.done += n
        if self.tty:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            print(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)
        else:
            print(f"{self.label}: {self.done}/{self.total} texts", file=sys.stderr)


def read(model, tokenizer, facts, items: list[tuple[list[int], int, int]], sites, *, batch_size: int = 8,
         per_position: bool = False, label: str = "reading activations") -> dict:
    """{site: [len(items), d] float32}: each item ``(ids, a, b)`` read at its tokens ``[a, b)``, averaged
    (:func:`steerc.runtime.hf.capture.read_items`), with a progress line on stderr."""
    from steerc.runtime.hf.capture import read_items

    progress = _Progress(label, len(items))
    out = read_items(model, tokenizer, facts, items, sites, batch_size=batch_size, per_position=per_position,
                     progress=progress.step)
    progress.close()
    return out
