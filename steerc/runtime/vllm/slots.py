"""Plan slots: the serve plugin's batched path for the commonest kernels.

A steer point (:mod:`.points`) runs each steered request's kernels on that
request's rows, one request after another: its cost grows with the number of
distinct plans in a batch. Most served steering is one affine kernel at a
site (``add a * v``, ``scale s``, under a scope, with per-request params).
Those kernels are lowered into *slots* instead:

* each steer point holds a table with one row per live plan slot: the
  kernel's scale (``[slots, width]``) and bias (``[slots, width]``); row 0 is
  the identity (scale 1, bias 0);
* a plan gets a slot when its first request arrives; requests with the
  same plan id (the same plan and param values) share it, counted, and the
  slot is freed, and reused, when the last of them ends;
* before each step, outside the model, the router writes three small
  per-token arrays for every point a slotted plan steers: the token's slot,
  whether its request is slotted there, and whether the kernel's scope
  selects it (scopes depend on positions only: computed on the host from
  the step's metadata, with the same :func:`steerc.runtime.kernels.position_mask`
  the graph would run);
* the point then runs one gather and one fused ``x * scale + bias`` over all
  the step's rows, whatever the number of plans.

The arithmetic per row is the same elementwise operations in the same order
as the per-request kernel (:func:`steerc.runtime.vllm.steer.site_function`),
so a slotted request's values are those of the per-request path, bit for bit,
and rows of other requests are untouched. Anything else (gates, probes,
schedules, heads, projections, rotations, clamps, ``preserve norm``, several
kernels at one site) keeps the per-request path.
"""

from __future__ import annotations

import numpy as np
import torch

from steerc.runtime import kernels as S


def slottable(hook: dict, size, width: int):
    """(scale name, bias name or None, scope index) of a hook that is just one affine kernel on full rows of
    ``width``, or None (the per-request path). ``size(name)`` is the number of values of a plan tensor."""
    sites = hook["sites"]
    if len(sites) != 1:
        return None
    site = sites[0]
    if site.get("columns") or site.get("local_columns") or site["probes"] or len(site["kernels"]) != 1:
        return None
    k = site["kernels"][0]
    if k["kind"] != "affine" or k["gate"] is not None or k.get("schedule") or k["preserve_norm"]:
        return None
    scale, bias = k["tensors"]["scale"], k["tensors"].get("bias")
    if size(scale) not in (1, width) or (bias is not None and size(bias) != width):
        return None
    return scale, bias, k["scope"]


def host_mask(scope, pos: np.ndarray, plen: np.ndarray) -> np.ndarray:
    """A scope's mask over some rows, computed on the host (the graph's own position_mask, on CPU)."""
    p, q = torch.from_numpy(np.asarray(pos, dtype=np.int64)), torch.from_numpy(np.asarray(plen, dtype=np.int64))
    mask = torch.zeros(len(pos), dtype=torch.bool)
    for item in scope:
        mask = mask | S.position_mask(tuple(item), p, q)
    return mask.numpy()


class SlotTables:
    """Every steer point's slot table, the plans that hold slots, and this step's per-token arrays."""

    def __init__(self, width: int, dtype, device, grow: int = 8):
        self.width, self.dtype, self.device, self.grow = width, dtype, device, grow
        self.capacity = 0
        self.plans: dict[str, list] = {}     # plan id -> [slot, requests holding it]
        self.free: list[int] = []
        self.tables: dict[tuple, tuple] = {}  # point key -> (scale [capacity, width], bias [capacity, width])
        self.step: dict[tuple, tuple] = {}    # point key -> (slot, member, mask) per token, on the device

    # -- plans ---------------------------------------------------------------
    def acquire(self, plan_id: str, kernels: dict) -> int:
        """The slot of a plan (``kernels``: point key -> (scale, bias or None)), written on first use."""
        held = self.plans.get(plan_id)
        if held is not None:
            held[1] += 1
            return held[0]
        if not self.free:
            self._grow()
        slot = self.free.pop(0)
        self.plans[plan_id] = [slot, 1]
        for key, (scale, bias) in kernels.items():
            scales, biases = self._table(key)
            scales[slot] = scale.reshape(-1).to(self.dtype)
            biases[slot] = 0 if bias is None else bias.reshape(-1).to(self.dtype)
        return slot

    def release(self, plan_id: str) -> None:
        held = self.plans.get(plan_id)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del self.plans[plan_id]
            for scales, biases in self.tables.values():  # back to the identity
                scales[held[0]] = 1
                biases[held[0]] = 0
            self.free.append(held[0])
            self.free.sort()

    def _grow(self) -> None:
        old, self.capacity = self.capacity, max(self.grow, 2 * self.capacity) if self.capacity else self.grow + 1
        self.free.extend(range(max(1, old), self.capacity))
        for key in list(self.tables):
            self.tables[key] = self._resized(*self.tables[key])

    def _resized(self, scales=None, biases=None):
        kw = dict(dtype=self.dtype, device=self.device)
        new_s = torch.ones(self.capacity, self.width, **kw)
        new_b = torch.zeros(self.capacity, self.width, **kw)
        if scales is not None:
            new_s[: len(scales)] = scales
            new_b[: len(biases)] = biases
        return new_s, new_b

    def _table(self, key):
        if key not in self.tables:
            self.tables[key] = self._resized()
        return self.tables[key]

    def bytes(self) -> int:
        return sum(s.numel() * s.element_size() + b.numel() * b.element_size() for s, b in self.tables.values())

    # -- steps ---------------------------------------------------------------
    def write_step(self, rows: dict, n: int) -> None:
        """This step's per-token arrays: ``rows`` maps a point key to [(slot, a, b, mask over a:b)]."""
        self.step = {}
        if not rows:
            return
        keys = sorted(rows)
        slot = np.zeros((len(keys), n), dtype=np.int64)
        member = np.zeros((len(keys), n), dtype=bool)
        mask = np.zeros((len(keys), n), dtype=bool)
        for i, key in enumerate(keys):
            for s, a, b, m in rows[key]:
                slot[i, a:b] = s
                member[i, a:b] = True
                mask[i, a:b] = m
        dev = dict(device=self.device, non_blocking=True)
        slot_d, member_d, mask_d = (torch.from_numpy(t).to(**dev) for t in (slot, member, mask))
        for i, key in enumerate(keys):
            self.step[key] = (slot_d[i], member_d[i], mask_d[i])

    def apply(self, key, x):
        """The slotted kernels of this step at point ``key`` on ``x`` ([tokens, width], the model's dtype)."""
        slot, member, mask = self._rows(key, x.shape[0])
        scales, biases = self.tables[key]
        xs = x.to(self.dtype)
        new = (xs * scales[slot] + biases[slot]).to(x.dtype)
        return torch.where(mask.unsqueeze(-1), new, x)

    def apply_pair(self, key, hidden, residual):
        """The same on a fused layer's (hidden, residual) pair: member rows become (steered sum, 0)."""
        slot, member, mask = self._rows(key, hidden.shape[0])
        scales, biases = self.tables[key]
        total = hidden.to(self.dtype) + residual.to(self.dtype)
        steered = torch.where(mask.unsqueeze(-1), total * scales[slot] + biases[slot], total).to(hidden.dtype)
        rows = member.unsqueeze(-1)
        return torch.where(rows, steered, hidden), torch.where(rows, torch.zeros_like(residual), residual)

    def _rows(self, key, n: int):
        slot, member, mask = self.step[key]
        if n > len(slot):  # padding rows past the step's tokens: identity, never selected
            pad = n - len(slot)
            slot = torch.cat([slot, slot.new_zeros(pad)])
            member = torch.cat([member, member.new_zeros(pad)])
            mask = torch.cat([mask, mask.new_zeros(pad)])
        return slot[:n], member[:n], mask[:n]
