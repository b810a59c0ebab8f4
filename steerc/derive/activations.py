"""Reading activations at steerc sites from a transformers model, batched, cached on disk (torch).

A site is read where the HF target steers it (the ``hf`` site table, the
same hooks): ``resid_post[l]`` is decoder layer ``l``'s output,
``resid_pre[l]`` its input, ``attn_out``/``mlp_out`` those modules'
outputs, ``head[l, h]`` head ``h``'s columns of the attention output
projection's input. Each text gives one vector per site:

* ``last`` — the last token (for a prompt and a completion: the
  completion's last token);
* ``mean`` — the mean over all tokens of the text (the chat template's
  tokens included, when ``--chat``);
* ``completion`` — the mean over the completion's tokens (pairs with a
  ``prompt`` only).

Texts are tokenized one by one (prompt and completion separately, then
joined, so no token straddles the boundary) and run in batches padded on the
right, which leaves every real token's positions and attention as without
padding.

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

import numpy as np
from attrs import frozen

from steerc.core.jsonio import canonical
from steerc.derive.data import Dataset

FORMAT = "steerc.activations/1"
READS = ("last", "mean", "completion")


@frozen
class Site:
    kind: str
    layer: int  # as written (the bank row)
    head: int | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}.{self.layer}" + (f".{self.head}" if self.head is not None else "")

    @property
    def text(self) -> str:
        return f"head[{self.layer}, {self.head}]" if self.kind == "head" else f"{self.kind}[{self.layer}]"


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


# ------------------------------------------------------------------------ tokens


def encode(tokenizer, text: str, prompt: str | None, chat: bool) -> tuple[list[int], int]:
    """(token ids, where the completion starts: 0 without a prompt)."""
    templated = chat and getattr(tokenizer, "chat_template", None)
    if prompt is None:
        if templated:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
        else:
            ids = tokenizer(text)["input_ids"]
        return list(_ids(ids)), 0
    if templated:
        head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=True)
    else:
        head = tokenizer(prompt)["input_ids"]
    head = list(_ids(head))
    tail = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return head + tail, len(head)


def _ids(value):
    """Token ids from what a tokenizer call returned (a list, or a mapping with ``input_ids``)."""
    if isinstance(value, dict) or hasattr(value, "keys"):
        value = value["input_ids"]
    return value


def positions(n: int, start: int, read: str) -> tuple[int, int]:
    """[a, b) of the tokens a text is read at."""
    if read == "last":
        return n - 1, n
    if read == "completion":
        return start, n
    return 0, n


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
         label: str = "reading activations") -> dict:
    """{site: [len(items), d] float32}: each item ``(ids, a, b)`` is read at its tokens ``[a, b)``,
    averaged (one token for ``last``)."""
    import torch

    from steerc.facts.sites import site_table
    from steerc.passes.lower_plan import canonical_site
    from steerc.runtime.kernels import site_tensor

    table = site_table(facts.family, "hf")
    hooks: dict[tuple, list] = {}
    for site in sites:
        c = canonical_site(site.kind, site.layer, site.head)
        h = table.hook(c.kind, c.layer)
        cols = (site.head * facts.head_dim, (site.head + 1) * facts.head_dim) if site.head is not None else None
        hooks.setdefault((h.module, h.kind, h.tensor), []).append((site, cols))
    out = {site: np.zeros((len(items), facts.width(site.kind)), dtype=np.float32) for site in sites}
    captured: dict = {}
    handles = []

    def capture(key):
        module, kind, tensor = key

        def pre(mod, args, kwargs):
            captured[key] = site_tensor(kind, tensor, args, kwargs, None)

        def post(mod, args, output):
            captured[key] = site_tensor(kind, tensor, args, None, output)

        return pre, post

    try:
        for key in hooks:
            pre, post = capture(key)
            m = model.get_submodule(key[0])
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True) if key[1] == "pre"
                           else m.register_forward_hook(post))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        progress = _Progress(label, len(items))
        for start in range(0, len(items), batch_size):
            batch = items[start:start + batch_size]
            length = max(len(ids) for ids, _, _ in batch)
            input_ids = torch.full((len(batch), length), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), length), dtype=torch.long)
            for i, (ids, _, _) in enumerate(batch):
                input_ids[i, :len(ids)] = torch.tensor(ids)
                mask[i, :len(ids)] = 1
            captured.clear()
            with torch.no_grad():
                model(input_ids=input_ids, attention_mask=mask, use_cache=False)
            for key, entries in hooks.items():
                value = captured[key].float()
                for site, cols in entries:
                    v = value[..., cols[0]:cols[1]] if cols else value
                    for i, (_, a, b) in enumerate(batch):
                        out[site][start + i] = v[i, a:b].double().mean(dim=0).float().numpy()
            progress.step(len(batch))
        progress.close()
    finally:
        for h in handles:
            h.remove()
    return out
