"""Plan tables: the serve plugin's steering inside the graph, every plan of a step in one batched pass.

A served plan arrives with its request, after the graph was traced; so the
graph cannot hold a plan's kernels, only tables a plan is written into.
:class:`SteerTables` holds them, fixed at boot (their addresses never change,
so a compiled graph and a CUDA graph replay read whatever is written there):

* for every steer point (``--steer-sites``), ``kernels`` stages, each with a
  row per plan slot (``plans`` slots, and row 0, the identity). A row is a
  kernel in its kind's batched form (:attr:`steerc.ir.kernels.base.Kind.batched`):
  ``x * scale + factor * bias + g(x @ A + a0) @ B`` with ``A`` and ``B`` of
  rank at most ``rank``, the ``g`` its code names, and whether it keeps the
  norm (``preserve norm``). A plan's kernels at a point fill its stages in
  the plan's order; the stages it does not use stay the identity;
* per token, written before each step outside the model
  (:meth:`write_step`): its plan slot (0: none), and per point and stage
  whether the kernel's scope selects it and its schedule's factor. Scopes and
  schedules depend on positions only, so the host computes them with the
  graph's own :func:`steerc.runtime.kernels.position_mask` and
  :func:`~steerc.runtime.kernels.schedule_factor`.

:meth:`apply` is fixed-shape tensor code (gathers by slot, elementwise
maths, reductions over the rank), traced into the compiled graph at each
point: no Python runs there per step, and its cost does not grow with the
number of plans in a batch. Rows of tokens without a plan at a point, and
every row outside a kernel's scope, are returned bit for bit.

Sizes: the tables of one point hold ``kernels * (plans + 1) * width * (2 +
2 * rank)`` numbers (:meth:`bytes`); README gives them for SmolLM2.
"""

from __future__ import annotations

import numpy as np
import torch

from steerc.ir.kernels.base import JUMP, NORM_TO
from steerc.runtime import kernels as S
from steerc.targets.serve.capacity import Capacity, tableable

__all__ = ["SteerTables", "TableFull", "stage_masks", "tableable"]
DEFAULT = Capacity()


class TableFull(Exception):
    """No free plan slot: every slot holds a live plan."""


class SteerTables(torch.nn.Module):
    """Every steer point's plan tables and this step's per-token arrays (registered buffers)."""

    def __init__(self, widths: dict, *, plans: int = DEFAULT.plans, rank: int = DEFAULT.rank,
                 kernels: int = DEFAULT.kernels, max_tokens: int, dtype, device):
        super().__init__()
        self.plans, self.rank, self.kernels, self.max_tokens = plans, rank, kernels, max_tokens
        self.dtype = dtype
        self.where: dict[tuple, tuple[int, int]] = {}  # point key -> (width, index among that width's points)
        self.widths = sorted(set(widths.values()))
        self.counts: dict[int, int] = {}  # width -> its points
        for w in self.widths:
            for key in [k for k, v in widths.items() if v == w]:
                self.where[key] = (w, self.counts.get(w, 0))
                self.counts[w] = self.counts.get(w, 0) + 1
        kw = dict(dtype=dtype, device=device)
        rows = plans + 1
        for w in self.widths:
            n = self.counts[w]
            self.register_buffer(f"scale{w}", torch.ones(n, kernels, rows, w, **kw), persistent=False)
            self.register_buffer(f"bias{w}", torch.zeros(n, kernels, rows, w, **kw), persistent=False)
            self.register_buffer(f"A{w}", torch.zeros(n, kernels, rows, w, rank, **kw), persistent=False)
            self.register_buffer(f"a0{w}", torch.zeros(n, kernels, rows, rank, **kw), persistent=False)
            self.register_buffer(f"B{w}", torch.zeros(n, kernels, rows, rank, w, **kw), persistent=False)
            self.register_buffer(f"code{w}", torch.zeros(n, kernels, rows, dtype=torch.long, device=device),
                                 persistent=False)
            self.register_buffer(f"p{w}", torch.zeros(n, kernels, rows, 2, **kw), persistent=False)
            self.register_buffer(f"keep{w}", torch.zeros(n, kernels, rows, dtype=torch.bool, device=device),
                                 persistent=False)
            self.register_buffer(f"member{w}", torch.zeros(n, rows, dtype=torch.bool, device=device),
                                 persistent=False)
            # per token: [point, token, stage], so that a step's rows [:n] are a contiguous view whatever n is
            self.register_buffer(f"mask{w}", torch.zeros(n, max_tokens, kernels, dtype=torch.bool, device=device),
                                 persistent=False)
            self.register_buffer(f"factor{w}", torch.ones(n, max_tokens, kernels, **kw), persistent=False)
        self.register_buffer("slot", torch.zeros(max_tokens, dtype=torch.long, device=device), persistent=False)
        self._full = _region(kernels, rank)  # what a graph runs at each point
        self.held: dict[str, list] = {}  # plan id -> [slot, requests holding it]
        self.row_use: dict[tuple, dict] = {}  # point key -> {slot: (stages, rank, keeps norm, nonlinear g)}
        self.step_use: dict[tuple, tuple] = {}  # point key -> what this step's plans use there
        self.free = list(range(1, rows))

    # -------------------------------------------------------------- plans
    def acquire(self, plan_id: str, rows: dict) -> int:
        """The slot of a plan, its rows written on first use. ``rows``: point key -> [(row, keep, columns)] in
        order (:meth:`steerc.runtime.vllm.request.RequestSteer.table_rows`). Raises :class:`TableFull` when no slot is free."""
        held = self.held.get(plan_id)
        if held is not None:
            held[1] += 1
            return held[0]
        if not self.free:
            raise TableFull(f"all {self.plans} plan slots hold live plans")
        slot = self.free.pop(0)
        self.held[plan_id] = [slot, 1]
        for key, stages in rows.items():
            self._write(key, slot, stages)
        return slot

    def release(self, plan_id: str) -> None:
        held = self.held.get(plan_id)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del self.held[plan_id]
            self._clear(held[0])
            self.free.append(held[0])
            self.free.sort()

    @torch.no_grad()
    def _write(self, key, slot: int, stages: list) -> None:
        w, j = self.where[key]
        self._buf("member", w)[j, slot] = True
        ranks = [row["A"].shape[1] for row, _, _ in stages if "A" in row]
        self.row_use.setdefault(key, {})[slot] = (len(stages), max(ranks, default=0),
                                                  any(keep for _, keep, _ in stages),
                                                  any(int(row.get("code", 0)) for row, _, _ in stages))
        for k, (row, keep, cols) in enumerate(stages):
            a, b = cols if cols else (0, w)
            self._buf("scale", w)[j, k, slot, a:b] = _as(row.get("scale", 1.0), b - a)
            self._buf("bias", w)[j, k, slot, a:b] = _as(row.get("bias", 0.0), b - a)
            if "A" in row:
                r = row["A"].shape[1]
                self._buf("A", w)[j, k, slot, a:b, :r] = row["A"]
                self._buf("B", w)[j, k, slot, :r, a:b] = row["B"]
                if "a0" in row:
                    self._buf("a0", w)[j, k, slot, :r] = row["a0"]
            self._buf("code", w)[j, k, slot] = int(row.get("code", 0))
            if "p" in row:
                self._buf("p", w)[j, k, slot] = row["p"]
            self._buf("keep", w)[j, k, slot] = bool(keep)

    @torch.no_grad()
    def _clear(self, slot: int) -> None:
        for uses in self.row_use.values():
            uses.pop(slot, None)
        for w in self.widths:
            self._buf("scale", w)[:, :, slot] = 1
            self._buf("member", w)[:, slot] = False
            for name in ("bias", "A", "a0", "B", "code", "p", "keep"):
                self._buf(name, w)[:, :, slot] = 0

    def _buf(self, name: str, w: int):
        return getattr(self, f"{name}{w}")

    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    # -------------------------------------------------------------- steps
    @torch.no_grad()
    def write_step(self, n: int, slots: np.ndarray, rows: dict) -> None:
        """This step's per-token arrays: ``slots`` ([n]) each token's plan slot, ``rows`` point key ->
        [(stage, a, b, mask over a:b, factor over a:b or None)]."""
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens in one step is over the {self.max_tokens} steerc was sized for")
        self.slot[:n].copy_(torch.from_numpy(np.asarray(slots, dtype=np.int64)), non_blocking=True)
        self.slot[n:].fill_(0)
        self.step_use = {}
        for key, items in rows.items():
            uses = [self.row_use[key][int(slots[a])] for _, a, _, _, _ in items]
            self.step_use[key] = (max(u[0] for u in uses), max(u[1] for u in uses), any(u[2] for u in uses),
                                  any(u[3] for u in uses))
        for w in self.widths:
            count = self.counts[w]
            mask = np.zeros((count, n, self.kernels), dtype=bool)
            factor = np.ones((count, n, self.kernels), dtype=np.float32)
            for key, items in rows.items():
                kw, j = self.where[key]
                if kw != w:
                    continue
                for k, a, b, m, f in items:
                    mask[j, a:b, k] = m
                    if f is not None:
                        factor[j, a:b, k] = f
            self._buf("mask", w)[:, :n].copy_(torch.from_numpy(mask), non_blocking=True)
            self._buf("mask", w)[:, n:].fill_(False)
            self._buf("factor", w)[:, :n].copy_(torch.from_numpy(factor), non_blocking=True)

    # ------------------------------------------------------- applying them
    def used(self, key) -> tuple | None:
        """What this step's plans use of the tables at point ``key`` (None: no tabled plan steers there):
        ``(stages, rank, keeps norm, a nonlinear g)``, known on the host from the rows they wrote."""
        return self.step_use.get(key)

    def apply(self, key, x, use: tuple | None = None):
        """Every plan's kernels at point ``key`` on ``x`` ([tokens, width], the model's dtype): a new tensor.

        ``use`` (:meth:`used`) trims the work to what this step's plans use (the steer point's body, in
        Python, knows it); None runs every stage at the full rank (traced into a graph, which must serve any
        step)."""
        w, j = self.where[key]
        out, member = self._stages(w, j, x.to(self.dtype), x.shape[0], use)
        return torch.where(member.unsqueeze(-1), out.to(x.dtype), x)

    def apply_pair(self, key, hidden, residual, use: tuple | None = None):
        """The same on a fused layer's (hidden, residual) pair: the rows of plans that steer here become (steered
        sum, 0), as on the per-request path; the others stay as they are."""
        w, j = self.where[key]
        total = hidden.to(self.dtype) + residual.to(self.dtype)
        out, member = self._stages(w, j, total, hidden.shape[0], use)
        rows = member.unsqueeze(-1)
        return torch.where(rows, out.to(hidden.dtype), hidden), torch.where(rows, torch.zeros_like(residual), residual)

    def _stages(self, w: int, j: int, x, n: int, use):
        b = [self._buf(name, w)[j] for name in ("scale", "bias", "A", "a0", "B", "code", "p", "keep")]
        tensors = (x, self.slot[:n], self._buf("mask", w)[j, :n], self._buf("factor", w)[j, :n],
                   self._buf("member", w)[j], *b)
        if use is None:
            return self._full(*tensors)
        stages, rank, keep, nonlinear = use
        return _stages(*tensors, stages=stages, rank=rank, keep=keep, nonlinear=nonlinear)


def _stages(x, slot, masks, factors, member, scale, bias, A, a0, B, code, p, keeps, *, stages: int, rank: int,
            keep: bool, nonlinear: bool):
    """The tables' maths at one point: ``stages`` stages, coefficients up to ``rank``, ``preserve norm`` and
    the nonlinear ``g`` only where asked (the host knows what a step uses; a graph asks for everything)."""
    for k in range(stages):
        new = x * scale[k][slot] + factors[:, k].unsqueeze(-1) * bias[k][slot]
        if rank:
            c = (x.unsqueeze(-1) * A[k, :, :, :rank][slot]).sum(1) + a0[k, :, :rank][slot]
            if nonlinear:
                c = _g(c, code[k][slot], p[k][slot])
            new = new + (c.unsqueeze(-1) * B[k, :, :rank][slot]).sum(1)
        if keep:
            new = torch.where(keeps[k][slot].unsqueeze(-1), S.preserve_norm(x, new), new)
        x = torch.where(masks[:, k].unsqueeze(-1), new, x)
    return x, member[slot]  # member: the rows of plans that steer at this point


def _region(stages: int, rank: int):
    """The tables' full maths as one nested compile region: compiled once, called at every point of a graph
    (without it, compile time grows with every provisioned point). Made before tracing, never during."""
    def run(*tensors):
        return _stages(*tensors, stages=stages, rank=rank, keep=True, nonlinear=True)

    region = getattr(getattr(torch, "compiler", None), "nested_compile_region", None)
    return region(run) if region is not None else run


def _g(c, code, p):
    """A row's ``g`` on its coefficients ([n, r]): LINEAR, JUMP or NORM_TO (``steerc.ir.kernels.base``)."""
    c0 = c[:, :1]
    jump = p[:, 1:2] - torch.relu(c0) * (c0 > p[:, :1]).to(c.dtype)
    jumped = torch.cat([jump, torch.zeros_like(c[:, 1:])], 1)
    if c.shape[1] >= 2:
        rho = torch.sqrt(c[:, :1] * c[:, :1] + c[:, 1:2] * c[:, 1:2])
        turned = torch.cat([rho * p[:, :1] - c[:, :1], rho * p[:, 1:2] - c[:, 1:2], torch.zeros_like(c[:, 2:])], 1)
    else:
        turned = c
    code = code.unsqueeze(-1)
    return torch.where(code == JUMP, jumped, torch.where(code == NORM_TO, turned, c))


def _as(value, width: int):
    """A row operand (a number, a 0-d or [width] tensor) as [width]."""
    t = torch.as_tensor(value)
    return t.reshape(-1).expand(width) if t.numel() == 1 else t.reshape(width)


# ------------------------------------------------------------------- plans into rows


def stage_masks(state, hook: dict, pos, plen, memo: dict | None = None) -> list:
    """Each stage's (scope mask, schedule factor or None) over a request's rows, on the host. ``memo`` (one
    dict for one request's step) keeps each distinct scope and schedule's answer across its hooks: a plan's
    kernels at many sites mostly share one."""
    memo = {} if memo is None else memo
    out = []
    for site in hook["sites"]:
        for k in site["kernels"]:
            tag = (k["scope"], k["tensors"].get("schedule") if k.get("schedule") else None)
            if tag not in memo:
                memo[tag] = _stage_mask(state, k, pos, plen, memo)
            out.append(memo[tag])
    return out


def _stage_mask(state, k: dict, pos, plen, memo: dict) -> tuple:
    scope = state.boot["scopes"][k["scope"]]
    if not k.get("schedule") and any(tuple(item) == ("all",) for item in scope):
        return np.ones(len(pos), dtype=bool), None  # every row: no torch call per step
    if "rows" not in memo:
        memo["rows"] = (torch.from_numpy(np.asarray(pos, dtype=np.int64)),
                        torch.from_numpy(np.asarray(plen, dtype=np.int64)))
    p, q = memo["rows"]
    mask = torch.zeros(len(pos), dtype=torch.bool)
    for item in scope:
        mask = mask | S.position_mask(tuple(item), p, q)
    factor = None
    if k.get("schedule"):
        factor = S.schedule_factor(k["schedule"], state.buffer(k["tensors"]["schedule"]).float().cpu(), p, q).numpy()
    return mask.numpy(), factor
