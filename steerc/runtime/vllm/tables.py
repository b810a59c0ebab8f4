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

from typing import NamedTuple

import numpy as np
import torch

from steerc.ir.checked import gate_leaves, gate_truth
from steerc.ir.kernels.base import JUMP, NORM_TO
from steerc.runtime import kernels as S
from steerc.targets.serve.capacity import Capacity, tableable

__all__ = ["SteerTables", "TableFull", "Use", "every_row", "gate_row", "probe_row", "stage_masks", "tableable"]
DEFAULT = Capacity()
# A probe row's pool (its readout: steerc.runtime.kernels.readout_row, the one seat of the readouts).
POOLS = {"token": 0, "prompt.mean": 1, "prompt.last": 2}
probe_row = S.readout_row


class Use(NamedTuple):
    """What a step's plans use of the tables at one point: kernel stages, rank, ``preserve norm``, the nonlinear
    ``g`` codes, the probes read there (``probes``: per token, ``pooled``: prompt-pooled, each a set of (probe
    index, readout code)), the comparisons of gated stages (their operator codes), a scale other than 1, a bias
    other than 0, a coefficient offset (``a0``) other than 0. The host trims the eager maths to it; a graph asks
    for all of it (:attr:`SteerTables.full`)."""

    stages: int
    rank: int
    keep: bool = False
    nonlinear: frozenset = frozenset()
    probes: frozenset = frozenset()
    pooled: frozenset = frozenset()
    gated: frozenset = frozenset()
    scaled: bool = False
    biased: bool = False
    shifted: bool = False

    def join(self, other: "Use") -> "Use":
        return Use(max(self.stages, other.stages), max(self.rank, other.rank),
                   *(a | b for a, b in zip(self[2:], other[2:])))


_IDLE = Use(0, 0)
_EVERY_OP = frozenset(range(len(S.COMPARE_OPS)))
# A point's operands in the order _stages takes them, then its per-token mask and factor.
_OPERANDS = ("member", "scale", "bias", "A", "a0", "B", "code", "p", "keep", "mask", "factor")
_GATE = ("gq", "gop", "gthr", "truth")  # a gated stage's operands
# An eager step of at most GATHER_TOKENS tokens keeps each point's gathered operands while its slots repeat
# (decode steps), within GATHER_BYTES in all.
GATHER_TOKENS, GATHER_BYTES = 512, 64 << 20


class TableFull(Exception):
    """No free plan slot: every slot holds a live plan."""


class SteerTables(torch.nn.Module):
    """Every steer point's plan tables and this step's per-token arrays (registered buffers)."""

    def __init__(self, widths: dict, *, plans: int = DEFAULT.plans, rank: int = DEFAULT.rank,
                 kernels: int = DEFAULT.kernels, probes: int = DEFAULT.probes, conditions: int = DEFAULT.conditions,
                 requests: int = 1, hidden: int | None = None, max_tokens: int, dtype, device):
        super().__init__()
        self.plans, self.rank, self.kernels, self.max_tokens = plans, rank, kernels, max_tokens
        self.probes, self.conditions, self.requests = probes, conditions, requests
        self.hidden = hidden if hidden is not None else max(widths.values(), default=0)
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
            # A is kept transposed, [rank, width] as B: a step at a lower rank reads whole contiguous rows
            self.register_buffer(f"A{w}", torch.zeros(n, kernels, rows, rank, w, **kw), persistent=False)
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
            if probes:  # each stage's gate: its comparisons (probe, op, threshold) and truth table
                c = conditions
                self.register_buffer(f"gq{w}", torch.zeros(n, kernels, rows, c, dtype=torch.long, device=device),
                                     persistent=False)
                self.register_buffer(f"gop{w}", torch.zeros(n, kernels, rows, c, dtype=torch.long, device=device),
                                     persistent=False)
                self.register_buffer(f"gthr{w}", torch.zeros(n, kernels, rows, c, **kw), persistent=False)
                self.register_buffer(f"truth{w}", torch.ones(n, kernels, rows, 2 ** c, dtype=torch.bool,
                                                             device=device), persistent=False)
        long = dict(dtype=torch.long, device=device)
        self.register_buffer("slot", torch.zeros(max_tokens, **long), persistent=False)
        if probes:
            # Probes: a row per (probe of a plan, slot), read at the points `reads` marks; per-token values (`pv`)
            # and, per request row (`rslot`; row `requests` takes the others' writes), pooled state.
            pr, h = max(rank, 1), self.hidden
            self.register_buffer("pU", torch.zeros(probes, rows, h, pr, **kw), persistent=False)
            self.register_buffer("poff", torch.zeros(probes, rows, **kw), persistent=False)
            self.register_buffer("pp", torch.zeros(probes, rows, **kw), persistent=False)
            self.register_buffer("pcode", torch.zeros(probes, rows, **long), persistent=False)
            self.register_buffer("ppool", torch.zeros(probes, rows, **long), persistent=False)
            self.register_buffer("reads", torch.zeros(self.counts.get(h, 0), probes, rows, dtype=torch.bool,
                                                      device=device), persistent=False)
            # [token, probe]: a step's rows [:n] are a contiguous view whatever n is (no guard on n in a graph)
            self.register_buffer("pv", torch.zeros(max_tokens, probes, **kw), persistent=False)
            self.register_buffer("pheld", torch.full((probes, requests + 1), float("nan"), **kw), persistent=False)
            self.register_buffer("acc", torch.zeros(probes, requests + 1, h, **kw), persistent=False)
            self.register_buffer("cnt", torch.zeros(probes, requests + 1, **kw), persistent=False)
            self.register_buffer("rslot", torch.full((max_tokens,), requests, **long), persistent=False)
            self.register_buffer("pos", torch.zeros(max_tokens, **long), persistent=False)
            self.register_buffer("plen", torch.zeros(max_tokens, **long), persistent=False)
        every = frozenset((q, code) for q in range(probes) for code in S.READOUT_CODES.values())
        self.full = Use(kernels, rank, True, frozenset((JUMP, NORM_TO)), every, every,
                        _EVERY_OP if probes else frozenset(), True, True, True)
        self._full = _region(self.full)  # what a graph runs at each point
        self._probe_rows = _compile_region(_probe_rows)
        self._pooled = _compile_region(lambda *tensors: _pooled(*tensors, dump=requests))
        self.held: dict[str, list] = {}  # plan id -> [slot, requests holding it]
        self.row_use: dict[int, dict] = {}  # slot -> {point key: Use}, what its plan uses at each point
        self.step_use: dict[tuple, Use] = {}  # point key -> what this step's plans use there
        self.free = list(range(1, rows))
        self.free_requests = list(range(requests))
        self._views: dict[tuple, list] = {}  # (width, point index) -> its buffers' views (eager)
        self._use_memo: dict[tuple, dict] = {}  # (a step's slots, prompt tokens or not) -> its use per point
        # Eager: each point's operands gathered by the step's per-token slots, kept while the same slots come
        # back (decode steps repeat them) and the tables' rows stay; bounded in bytes (GATHER_BYTES).
        self._gathers: dict = {}
        self._gather_bytes = 0
        self._step_key: tuple | None = None

    # -------------------------------------------------------------- plans
    def acquire(self, plan_id: str, rows: dict) -> int:
        """The slot of a plan, its rows written on first use. ``rows``: ``{"points": point key -> {"stages":
        [(row, keep, columns, gate row or None)] in order, "probes": [probe index read there]}, "probes":
        [probe row]}`` (:meth:`steerc.runtime.vllm.request.RequestSteer.table_rows`). Raises
        :class:`TableFull` when no slot is free."""
        held = self.held.get(plan_id)
        if held is not None:
            held[1] += 1
            return held[0]
        if not self.free:
            raise TableFull(f"all {self.plans} plan slots hold live plans")
        slot = self.free.pop(0)
        self.held[plan_id] = [slot, 1]
        self._forget()
        probes = {q: row for q, row in enumerate(rows.get("probes", ())) if row is not None}  # None: not tabled
        for q, row in probes.items():
            self._write_probe(q, slot, row)
        pooled = {q for q, row in probes.items() if row["pool"]}
        for key, point in rows["points"].items():
            self._write(key, slot, point["stages"], point.get("probes", ()), pooled)
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
    def _write_probe(self, q: int, slot: int, row: dict) -> None:
        r = row["U"].shape[1]
        self.pU[q, slot, :, :r] = row["U"]
        self.poff[q, slot], self.pp[q, slot] = row["off"], row["p"]
        self.pcode[q, slot], self.ppool[q, slot] = row["code"], row["pool"]

    @torch.no_grad()
    def _write(self, key, slot: int, stages: list, probes=(), pooled=frozenset()) -> None:
        w, j = self.where[key]
        if stages:
            self._buf("member", w)[j, slot] = True
        for q in probes:
            self.reads[j, q, slot] = True
        ranks = [row["A"].shape[1] for row, _, _, _ in stages if "A" in row]
        read = {(q, int(self.pcode[q, slot])) for q in probes}
        self.row_use.setdefault(slot, {})[key] = Use(
            len(stages), max(ranks, default=0), any(keep for _, keep, _, _ in stages),
            frozenset(int(row.get("code", 0)) for row, _, _, _ in stages) - {0},
            frozenset(r for r in read if r[0] not in pooled), frozenset(r for r in read if r[0] in pooled),
            frozenset(op for _, _, _, gate in stages if gate is not None for op in gate["op"]),
            any(bool(torch.as_tensor(row.get("scale", 1.0)).ne(1).any()) for row, _, _, _ in stages),
            any(bool(torch.as_tensor(row.get("bias", 0.0)).ne(0).any()) for row, _, _, _ in stages),
            any(bool(torch.as_tensor(row.get("a0", 0.0)).ne(0).any()) for row, _, _, _ in stages))
        for k, (row, keep, cols, gate) in enumerate(stages):
            if gate is not None:
                c = len(gate["q"])
                self._buf("gq", w)[j, k, slot, :c] = torch.tensor(gate["q"])
                self._buf("gop", w)[j, k, slot, :c] = torch.tensor(gate["op"])
                self._buf("gthr", w)[j, k, slot, :c] = torch.tensor(gate["threshold"])
                self._buf("truth", w)[j, k, slot] = torch.tensor(
                    [gate_truth(gate["gate"], bits) for bits in range(2 ** self.conditions)])
            a, b = cols if cols else (0, w)
            self._buf("scale", w)[j, k, slot, a:b] = _as(row.get("scale", 1.0), b - a)
            self._buf("bias", w)[j, k, slot, a:b] = _as(row.get("bias", 0.0), b - a)
            if "A" in row:
                r = row["A"].shape[1]
                self._buf("A", w)[j, k, slot, :r, a:b] = row["A"].T
                self._buf("B", w)[j, k, slot, :r, a:b] = row["B"]
                if "a0" in row:
                    self._buf("a0", w)[j, k, slot, :r] = row["a0"]
            self._buf("code", w)[j, k, slot] = int(row.get("code", 0))
            if "p" in row:
                self._buf("p", w)[j, k, slot] = row["p"]
            self._buf("keep", w)[j, k, slot] = bool(keep)

    @torch.no_grad()
    def _clear(self, slot: int) -> None:
        self.row_use.pop(slot, None)
        self._forget()
        for w in self.widths:
            self._buf("scale", w)[:, :, slot] = 1
            self._buf("member", w)[:, slot] = False
            for name in ("bias", "A", "a0", "B", "code", "p", "keep"):
                self._buf(name, w)[:, :, slot] = 0
            if self.probes:
                for name in ("gq", "gop", "gthr"):
                    self._buf(name, w)[:, :, slot] = 0
                self._buf("truth", w)[:, :, slot] = True
        if self.probes:
            self.reads[:, :, slot] = False
            for name in ("pU", "poff", "pp", "pcode", "ppool"):
                getattr(self, name)[:, slot] = 0

    def _forget(self) -> None:
        """A slot's rows changed: what was worked out from the rows (each step's use, gathered operands) goes."""
        self._use_memo.clear()
        self._gathers.clear()
        self._gather_bytes = 0

    # -------------------------------------------------------------- requests (pooled probes)
    def take_request(self) -> int:
        """A request row for a request whose plan pools a probe, its state fresh (NaN: not decided)."""
        if not self.free_requests:
            raise TableFull(f"all {self.requests} request rows hold live requests")
        r = self.free_requests.pop(0)
        self.reset_request(r)
        return r

    def drop_request(self, r: int) -> None:
        if r not in self.free_requests:
            self.free_requests.append(r)
            self.free_requests.sort()

    @torch.no_grad()
    def reset_request(self, r: int) -> None:
        """Forget a request row's pooled state (a new request, or one recomputed after preemption)."""
        self.pheld[:, r] = float("nan")
        self.acc[:, r] = 0
        self.cnt[:, r] = 0

    def _buf(self, name: str, w: int):
        return getattr(self, f"{name}{w}")

    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    # -------------------------------------------------------------- steps
    @torch.no_grad()
    def write_step(self, n: int, slots: np.ndarray, rows: dict, rslots=None, pos=None, plen=None) -> None:
        """This step's per-token arrays: ``slots`` ([n]) each token's plan slot, ``rows`` point key ->
        [(stage, a, b, mask over a:b, factor over a:b or None)]; for pooled probes ``rslots`` ([n]) each
        token's request row, ``pos`` and ``plen`` its position and prompt length. What the step uses at each
        point (:meth:`used`) is what the rows of its slots wrote there."""
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens in one step is over the {self.max_tokens} steerc was sized for")
        slots = np.asarray(slots, dtype=np.int64)
        self.slot[:n].copy_(torch.from_numpy(slots), non_blocking=True)
        self.slot[n:].fill_(0)
        self._step_key = (n, slots[:n].tobytes()) if n <= GATHER_TOKENS else None
        prompt = pos is not None and bool((np.asarray(pos)[:n] < np.asarray(plen)[:n]).any())
        self.step_use = self._step_use(tuple(np.unique(slots[:n]).tolist()), prompt)
        if self.probes:
            for name, values, fill in (("rslot", rslots, self.requests), ("pos", pos, 0), ("plen", plen, 0)):
                buf = getattr(self, name)
                if values is None:
                    buf[:n].fill_(fill)
                else:
                    buf[:n].copy_(torch.from_numpy(np.asarray(values, dtype=np.int64)), non_blocking=True)
                buf[n:].fill_(fill)
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

    def _step_use(self, slots: tuple, prompt: bool) -> dict:
        """What a step whose tokens hold ``slots`` uses at each point; ``prompt``: some token is in its prompt
        (without one, a pooled probe neither sums nor decides: decode steps read what it holds). Kept while the
        slots' plans stay (decode steps repeat the same slots)."""
        memo = self._use_memo.get((slots, prompt))
        if memo is not None:
            return memo
        use_at: dict = {}
        for slot in slots:
            for key, use in self.row_use.get(slot, {}).items():
                old = use_at.get(key)
                use_at[key] = use if old is None else old.join(use)
        if not prompt:
            for key, use in list(use_at.items()):
                if use.pooled:
                    use = use_at[key] = use._replace(pooled=frozenset())
                    if use == _IDLE:
                        del use_at[key]
        if len(self._use_memo) >= 64:
            self._use_memo.clear()
        self._use_memo[(slots, prompt)] = use_at
        return use_at

    # ------------------------------------------------------- applying them
    def used(self, key) -> Use | None:
        """What this step's plans use of the tables at point ``key`` (None: no tabled plan steers or reads a
        probe there), known on the host from the rows they wrote."""
        return self.step_use.get(key)

    def apply(self, key, x, use: Use | None = None):
        """Every plan's kernels at point ``key`` on ``x`` ([tokens, width], the model's dtype): a new tensor.

        ``use`` (:meth:`used`) trims the work to what this step's plans use (the steer point's body, in
        Python, knows it; it steers in place, :meth:`steer_`); None runs every stage at the full rank (traced
        into a graph, which must serve any step)."""
        if use is not None:
            out = x.clone()
            self.steer_(key, out, use)
            return out
        w, j = self.where[key]
        out, member = self._stages(w, j, x.to(self.dtype), x.shape[0], self.full)
        return torch.where(member.unsqueeze(-1), out.to(x.dtype), x)

    def steer_(self, key, x, use: Use) -> None:
        """Eager, in place: the step's plans at point ``key`` written into ``x`` ([tokens, width], contiguous),
        trimmed to ``use``. A row no plan steers here is outside every stage's mask: it is written with its own
        value, or not at all (a point where the step's plans only read a probe writes nothing)."""
        w, j = self.where[key]
        same = x.dtype == self.dtype
        out, _ = self._stages(w, j, x.to(self.dtype), x.shape[0], use, into=x if same else None)
        if out is not x:
            x.copy_(out)

    def apply_pair(self, key, hidden, residual, use: Use | None = None):
        """The same on a fused layer's (hidden, residual) pair: the rows of plans that steer here become (steered
        sum, 0), as on the per-request path; the others stay as they are. A new pair of tensors."""
        if use is not None:
            pair = hidden.clone(), residual.clone()
            self.steer_pair_(key, *pair, use)
            return pair
        w, j = self.where[key]
        total = hidden.to(self.dtype) + residual.to(self.dtype)
        out, member = self._stages(w, j, total, hidden.shape[0], self.full)
        rows = member.unsqueeze(-1)
        return torch.where(rows, out.to(hidden.dtype), hidden), residual.masked_fill(rows, 0)

    def steer_pair_(self, key, hidden, residual, use: Use) -> None:
        """Eager, in place: :meth:`apply_pair`'s rows written into ``hidden`` and ``residual``, trimmed to
        ``use``; the other rows are written with their own values (hidden) or not at all (residual)."""
        w, j = self.where[key]
        total = hidden.to(self.dtype) + residual.to(self.dtype)
        out, member = self._stages(w, j, total, hidden.shape[0], use, into=total)
        rows = member.unsqueeze(-1)
        torch.where(rows, out.to(hidden.dtype), hidden, out=hidden)
        residual.masked_fill_(rows, 0)

    def _stages(self, w: int, j: int, x, n: int, use: Use, into=None):
        """(``x`` steered by the step's plans at point ``(w, j)``, the rows whose plans steer there). Eager
        (``use`` other than :attr:`full`): the operands gathered by slot are kept while the step's slots
        repeat, and the last stage writes into ``into`` when given."""
        slot = self.slot[:n]
        if (use.probes or use.pooled) and w == self.hidden:
            self._read_probes(j, x, slot, n, use)
        if use == self.full:  # traced: read from the buffers themselves, gather in the graph
            b = [self._buf(name, w)[j] for name in _OPERANDS]
            tensors = [x, self._buf("mask", w)[j, :n], self._buf("factor", w)[j, :n], slot, *b[:9]]
            if use.gated:
                tensors += [self._values(slot, n), *(self._buf(name, w)[j] for name in _GATE)]
            return self._full(*tensors)
        b = self._views.get((w, j))  # eager, every step: the point's views, made once
        if b is None:
            b = self._views[(w, j)] = [self._buf(name, w)[j] for name in _OPERANDS + (_GATE if self.probes else ())]
        rows, ops = self._memo(("stages", w, j, use), lambda: _gather(slot, *b[:9], *b[11:], use=use))
        values = self._values(slot, n) if use.gated else None
        return _stages(x, b[9][:n], b[10][:n], ops, values, use=use, into=into), rows

    def _values(self, slot, n: int):
        """Every probe's value for every row: per token, or its request's pooled value ([n, probes])."""
        pooled = self._memo(("pooled",), lambda: self.ppool[:, slot].T != 0)
        return torch.where(pooled, self.pheld[:, self.rslot[:n]].T, self.pv[:n])

    def _memo(self, tag: tuple, make):
        """``make()``, kept for this step's slots (a step of at most GATHER_TOKENS tokens, within GATHER_BYTES)
        until a slot's rows change: it must depend on the slots and the tables' rows only."""
        if self._step_key is None:
            return make()
        key = (self._step_key, tag)
        got = self._gathers.get(key)
        if got is None:
            got = make()
            size = sum(t.numel() * t.element_size() for t in _tensors(got))
            if self._gather_bytes + size > GATHER_BYTES:
                self._gathers.clear()
                self._gather_bytes = 0
            self._gathers[key] = got
            self._gather_bytes += size
        return got

    def _read_probes(self, j: int, x, slot, n: int, use: Use) -> None:
        """Every probe the rows' plans read at this point, in place: a per-token probe's values into ``pv``; a
        pooled one's prompt sum into its request row, and its value, once the prompt's last position passes,
        into ``pheld`` (as :meth:`steerc.runtime.vllm.steer.SteerState.record_probe`, per request row). The
        readouts are pure functions (one nested compile region each, traced); here only the few writes. Eager,
        only the readouts ``use`` names are computed."""
        traced = use == self.full
        rows = (self.ppool, self.pU, self.poff, self.pp, self.pcode)
        pos, plen, rslot = self.pos[:n], self.plen[:n], self.rslot[:n]
        if traced:
            values, weights = self._probe_rows(x, slot, self.reads[j], *rows, pos, plen, self.pv[:n])
        else:
            codes = _codes(use.probes, self.probes)
            gathered = self._memo(("probes", j, use.probes), lambda: _probe_gather(slot, self.reads[j], *rows, codes))
            values, weights = _probe_values(x, *gathered, pos, plen, self.pv[:n], codes)
        if use.probes:
            self.pv[:n].copy_(values)
        if not use.pooled:
            return
        q, r = self.probes, self.requests + 1
        index = (torch.arange(q, device=x.device).unsqueeze(1) * r + rslot).reshape(-1)  # [q * n] into [q * r]
        self.acc.view(q * r, -1).index_add_(0, index, (weights.T.unsqueeze(-1) * x).reshape(q * n, -1))
        self.cnt.view(-1).index_add_(0, index, weights.T.reshape(-1))
        tensors = (x, slot, *rows, self.acc[:, rslot], self.cnt[:, rslot], weights, pos, plen, rslot)
        if traced:
            held, target = self._pooled(*tensors)
        else:
            held, target = _pooled(*tensors, dump=self.requests, codes=_codes(use.pooled, self.probes))
        self.pheld.scatter_(1, target, held)


def _codes(read: frozenset, probes: int) -> list:
    """Per probe index, the readout codes ``read`` ((probe, code) pairs) names."""
    return [frozenset(code for p, code in read if p == q) for q in range(probes)]


def _probe_rows(x, slot, reads, ppool, pU, poff, pp, pcode, pos, plen, pv, codes=None):
    """Every probe's per-token value where a row's plan reads it here (``pv`` elsewhere), and each row's weight
    in its request's prompt sum of each pooled probe read here: ([n, probes], [n, probes]). ``codes``: per
    probe, the readouts its per-token rows use (None: any; an empty set: none is read per token here)."""
    return _probe_values(x, *_probe_gather(slot, reads, ppool, pU, poff, pp, pcode, codes), pos, plen, pv, codes)


def _probe_gather(slot, reads, ppool, pU, poff, pp, pcode, codes=None):
    """What :func:`_probe_rows` reads by slot: the rows reading each probe per token, the rows pooling it, and
    per probe its rows' (U, offset, parameter, readout code), None for a probe not read per token here.
    Depends on the slots and the tables' rows only."""
    read, pool = reads[:, slot].T, ppool[:, slot].T
    rows = [None if codes is not None and not codes[q] else (pU[q][slot], poff[q][slot], pp[q][slot], pcode[q][slot])
            for q in range(pU.shape[0])]
    return read & (pool == 0), read & (pool != 0), rows


def _probe_values(x, token, pooling, rows, pos, plen, pv, codes=None):
    values = torch.stack([pv[:, q] if row is None else S.readout_rows(x, *row, None if codes is None else codes[q])
                          for q, row in enumerate(rows)], 1)
    weights = (pooling & (pos < plen).unsqueeze(1)).to(x.dtype)
    return torch.where(token, values, pv), weights


def _pooled(x, slot, ppool, pU, poff, pp, pcode, acc, cnt, weights, pos, plen, rslot, *, dump: int, codes=None):
    """Each pooled probe's value per row from its request's prompt sum so far (``acc``, ``cnt``: [probes, n, ..]
    gathered by request row; the mean's readout for ``prompt.mean``, the row's own for ``prompt.last``), and
    where it goes: its request row at the prompt's last position, row ``dump`` elsewhere ([probes, n] each).
    ``codes`` as :func:`_probe_rows`'s, for the pooled rows."""
    held = []
    for q in range(pU.shape[0]):
        if codes is not None and not codes[q]:  # not pooled here: its weights are 0, its values go to the dump
            held.append(torch.zeros_like(x[:, 0]))
            continue
        mean = acc[q] / cnt[q].clamp_min(1.0).unsqueeze(-1)
        pooled = torch.where((ppool[q][slot] == 1).unsqueeze(-1), mean, x)
        held.append(S.readout_rows(pooled, pU[q][slot], poff[q][slot], pp[q][slot], pcode[q][slot],
                                   None if codes is None else codes[q]))
    last = (weights > 0) & (pos == plen - 1).unsqueeze(1)
    return torch.stack(held), torch.where(last, rslot.unsqueeze(1), torch.full_like(last, dump, dtype=rslot.dtype)).T


def _gather(slot, member, scale, bias, A, a0, B, code, p, keeps, gq=None, gop=None, gthr=None, truth=None, *,
            use: Use):
    """The rows whose plans steer at a point (``member`` by slot), and each of ``use.stages`` stages' operands
    for each row, gathered by its slot: (scale, bias, A, a0, g code, g parameters, B, keep, gate), None where
    ``use`` does not ask for it. Depends on the slots and the tables' rows only."""
    rank = use.rank
    ops = []
    for k in range(use.stages):
        ops.append((scale[k][slot] if use.scaled else None,
                    bias[k][slot] if use.biased else None,
                    A[k, :, :rank][slot] if rank else None,
                    a0[k, :, :rank][slot] if rank and use.shifted else None,
                    code[k][slot] if rank and use.nonlinear else None,
                    p[k][slot] if rank and use.nonlinear else None,
                    B[k, :, :rank][slot] if rank else None,
                    keeps[k][slot] if use.keep else None,
                    (gq[k][slot], gop[k][slot], gthr[k][slot], truth[k][slot]) if use.gated else None))
    return member[slot], ops


def _stages(x, masks, factors, ops, values=None, *, use: Use, into=None):
    """The tables' maths at one point, stage by stage over the gathered operands (:func:`_gather`): ``preserve
    norm``, the nonlinear ``g`` and gates only where asked (the host knows what a step uses; a graph asks for
    everything). ``values``: [n, probes] each row's probe values, for the gates. ``into``: where the last stage
    writes (eager), else a new tensor."""
    for k, (scale, bias, A, a0, code, p, B, keeps, gate) in enumerate(ops):
        new = x * scale if scale is not None else x  # (exact: x * 1 is x, and x + 0 is x)
        if bias is not None:
            new = new + factors[:, k].unsqueeze(-1) * bias
        if A is not None:
            c = (x.unsqueeze(1) * A).sum(-1)
            if a0 is not None:
                c = c + a0
            if code is not None:
                c = _g(c, code, p, use.nonlinear)
            new = new + (c.unsqueeze(-1) * B).sum(1)
        if keeps is not None:
            new = torch.where(keeps.unsqueeze(-1), S.preserve_norm(x, new), new)
        mask = masks[:, k]
        if gate is not None:
            mask = mask & S.gate_rows(values, *gate, None if use.gated == _EVERY_OP else use.gated)
        if into is not None and k == len(ops) - 1:
            x = torch.where(mask.unsqueeze(-1), new, x, out=into)
        else:
            x = torch.where(mask.unsqueeze(-1), new, x)
    return x


def _tensors(value):
    """The tensors in a nest of tuples and lists."""
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def gate_row(gate, probes: dict, thresholds) -> dict:
    """A data gate (``("cmp", probe, op, threshold index)`` leaves: a vLLM boot gate) as a table row: its
    comparisons' probe indices (``probes``: name -> index), ops and thresholds (from ``thresholds``), and
    the gate, whose truth table (:func:`steerc.ir.checked.gate_truth`) the tables write at their size."""
    leaves = gate_leaves(gate)
    ops = {name: code for code, name in enumerate(S.COMPARE_OPS)}
    return {"q": [probes[leaf[1]] for leaf in leaves], "op": [ops.get(leaf[2], ops[">="]) for leaf in leaves],
            "threshold": [float(thresholds[leaf[3]]) for leaf in leaves], "gate": gate}


def _region(use: Use):
    """The tables' full maths as one nested compile region (:func:`_compile_region`): (x, masks, factors, slot,
    member, the stage operands, then for gates the values and gate operands) -> (x steered, the steered rows)."""
    def run(x, masks, factors, slot, *operands):
        gates = operands[9:]
        rows, ops = _gather(slot, *operands[:9], *gates[1:], use=use)
        return _stages(x, masks, factors, ops, gates[0] if gates else None, use=use), rows

    return _compile_region(run)


def _compile_region(fn):
    """``fn`` as a nested compile region: compiled once, called at every point of a graph (without it, compile
    time grows with every provisioned point: the tables' maths inlined at 121 points took minutes). A region
    must be pure, so the tables' writes stay outside. Made before tracing, never during."""
    region = getattr(getattr(torch, "compiler", None), "nested_compile_region", None)
    return region(fn) if region is not None else fn


def _g(c, code, p, codes=frozenset((JUMP, NORM_TO))):
    """A row's ``g`` on its coefficients ([n, r]): LINEAR, JUMP or NORM_TO (``steerc.ir.kernels.base``); only
    the ``codes`` the rows hold besides LINEAR."""
    code = code.unsqueeze(-1)
    if NORM_TO in codes and c.shape[1] >= 2:
        rho = torch.sqrt(c[:, :1] * c[:, :1] + c[:, 1:2] * c[:, 1:2])
        turned = torch.cat([rho * p[:, :1] - c[:, :1], rho * p[:, 1:2] - c[:, 1:2], torch.zeros_like(c[:, 2:])], 1)
        c = torch.where(code == NORM_TO, turned, c)
    if JUMP in codes:
        c0 = c[:, :1]
        jump = p[:, 1:2] - torch.relu(c0) * (c0 > p[:, :1]).to(c.dtype)
        c = torch.where(code == JUMP, torch.cat([jump, torch.zeros_like(c[:, 1:])], 1), c)
    return c


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


def every_row(state, hook: dict) -> bool:
    """Whether each stage of ``hook`` steers every row it is given (its scope holds ``all``, no schedule): its
    masks depend on the number of rows only."""
    return all(_every_row(state, k) for site in hook["sites"] for k in site["kernels"])


def _every_row(state, k: dict) -> bool:
    return not k.get("schedule") and any(tuple(item) == ("all",) for item in state.boot["scopes"][k["scope"]])


def _stage_mask(state, k: dict, pos, plen, memo: dict) -> tuple:
    if _every_row(state, k):
        return np.ones(len(pos), dtype=bool), None  # every row: no torch call per step
    scope = state.boot["scopes"][k["scope"]]
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
