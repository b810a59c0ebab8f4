"""Activations read from a transformers model at steerc sites (torch): the HF engine of a capture
(:mod:`steerc.runtime.capture`; spec/derive.md, *Capture*).

Use::

    from steerc.runtime.hf import capture
    acts = capture(model, tokenizer, ["I love it", "I hate it"], "resid_post[0:30]", read="mean")
    acts["resid_post[8]"]          # float32 [2, 576]

A site is read where the HF target steers it (the ``hf`` site table, the same hooks):
``resid_post[l]`` is decoder layer ``l``'s output (the last layer's before the final norm),
``resid_pre[l]`` its input, ``attn_out``/``mlp_out`` those modules' outputs, ``head[l, h]`` head
``h``'s columns of the attention output projection's input. Texts run in batches padded on the right,
which leaves every real token's positions and attention as without padding; padding rows are never read.
A plan installed on the model (:func:`steerc.runtime.hf.install`) steers what is read: the capture's
hooks run after the plan's.
"""

from __future__ import annotations

import numpy as np

from steerc.diagnostics.codes import INVALID_VALUE
from steerc.runtime import capture as C


def read_items(model, tokenizer, facts, items, sites, *, batch_size: int = 8, per_position: bool = False,
         progress=None) -> dict:
    """{site: [len(items), width] float32}: each item ``(ids, a, b)`` read at its tokens ``[a, b)``, their
    mean (float64 sums); with ``per_position``, every position kept, ``[sum of (b - a), width]``, the
    items' rows one after the other. ``progress(n)`` is called after each batch of ``n`` items."""
    import torch

    from steerc.facts.sites import site_table
    from steerc.passes.lower_plan import canonical_site
    from steerc.runtime.hooks import site_tensor

    table = site_table(facts.family, "hf")
    hooks: dict[tuple, list] = {}
    for site in sites:
        c = canonical_site(site.kind, site.layer, site.head)
        h = table.hook(c.kind, c.layer)
        cols = (site.head * facts.head_dim, (site.head + 1) * facts.head_dim) if site.head is not None else None
        hooks.setdefault((h.module, h.kind, h.tensor), []).append((site, cols))
    rows = sum(b - a for _, a, b in items) if per_position else len(items)
    out = {site: np.zeros((rows, facts.width(site.kind)), dtype=np.float32) for site in sites}
    seen: dict = {}
    handles = []

    def reader(key):
        module, kind, tensor = key

        def pre(mod, args, kwargs):
            seen[key] = site_tensor(kind, tensor, args, kwargs, None)

        def post(mod, args, output):
            seen[key] = site_tensor(kind, tensor, args, None, output)

        return pre, post

    try:
        for key in hooks:
            pre, post = reader(key)
            m = model.get_submodule(key[0])
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True) if key[1] == "pre"
                           else m.register_forward_hook(post))
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = 0 if pad is None else pad  # padding is never read
        at = 0  # per_position: the next row to write
        for start in range(0, len(items), batch_size):
            batch = items[start:start + batch_size]
            length = max(len(ids) for ids, _, _ in batch)
            input_ids = torch.full((len(batch), length), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), length), dtype=torch.long)
            for i, (ids, _, _) in enumerate(batch):
                input_ids[i, :len(ids)] = torch.tensor(ids)
                mask[i, :len(ids)] = 1
            seen.clear()
            with torch.no_grad():
                model(input_ids=input_ids, attention_mask=mask, use_cache=False)
            for key, entries in hooks.items():
                value = seen[key].float()
                for site, cols in entries:
                    v = value[..., cols[0]:cols[1]] if cols else value
                    row = at
                    for i, (_, a, b) in enumerate(batch):
                        if per_position:
                            out[site][row:row + b - a] = v[i, a:b].numpy()
                            row += b - a
                        else:
                            out[site][start + i] = v[i, a:b].double().mean(dim=0).float().numpy()
            if per_position:
                at += sum(b - a for _, a, b in batch)
            if progress is not None:
                progress(len(batch))
    finally:
        for h in handles:
            h.remove()
    return out


def capture(model, tokenizer, texts, sites, *, read: str = "last", chat: bool = False,
            batch_size: int = 8) -> C.Captured:
    """Activations of ``texts`` at ``sites`` (a selector such as ``"resid_post[0:30]"``, or a list of them),
    read as ``read`` says: ``last``, ``mean``, ``completion`` or ``all`` (:mod:`steerc.runtime.capture`).
    Raises :class:`~steerc.runtime.capture.CaptureError` before any forward for a site the model lacks
    or texts it cannot read."""
    from steerc.runtime.hf.install import facts_from_model

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise C.error(INVALID_VALUE, f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    facts = facts_from_model(model)
    wanted = C.as_sites(sites, facts)
    items = C.items_of(tokenizer, texts, read, chat)
    C.check_size(items, wanted, facts, read)
    arrays = read_items(model, tokenizer, facts, items, wanted, batch_size=batch_size, per_position=read == "all")
    return C.captured(arrays, wanted, items, read)
