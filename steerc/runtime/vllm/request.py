"""One steered request in a serve worker: its buffers, its function at each module, its plan slot.

:class:`RequestSteer` is built from a request's admitted plan with the vllm
target's machinery (:mod:`steerc.runtime.vllm.steer`: the same kernels,
probes and gates), cut to this worker's share (:mod:`.parallel`: its
tensor-parallel rank, its pipeline stage). A hook whose kernels the plan
tables hold (:func:`~steerc.targets.serve.capacity.table_refusals`: within
the boot's bounds; a plan's probes and gates all or none) is written into a
plan slot (:mod:`.tables`) and runs in the graph with every other plan; the
rest run per request. The router (:mod:`.router`) decides which rows each request
owns in a step; this module holds only what one request needs.
"""

from __future__ import annotations

import numpy as np

from steerc.ir.kernels import KINDS
from steerc.runtime import kernels as S
from steerc.runtime.vllm.parallel import check_gates_on_stage, layer_path, localise, owns
from steerc.runtime.vllm.receipt import Receipt
from steerc.runtime.vllm.steer import SteerState, operands, site_function
from steerc.runtime.vllm.tables import DEFAULT, POOLS, every_row, gate_row, probe_row, stage_masks
from steerc.targets.serve.capacity import Capacity, table_refusals
from steerc.targets.vllm.program import build, prefix_cache_safe


class RequestSteer:
    """One request's steering: its buffers (vLLM buffer form) and per-module functions.

    ``built``: the plan's ``(boot, tensors)`` when the caller holds them already (the router passes the
    admitted plan's, built once per process: :meth:`steerc.targets.serve.admission.Admitted.built`); they
    are only read, never changed. Without it the plan is built here.
    """

    def __init__(self, plan, facts, *, max_tokens: int, dtype, device, tp_rank: int, tp_size: int,
                 slot_id: str = "", receipt: bool = False, model=None, built: tuple[dict, dict] | None = None,
                 table_bounds: Capacity | None = DEFAULT):
        boot, tensors = built if built is not None else build(plan, facts)
        self.cacheable = prefix_cache_safe(boot)  # may it reuse KV that other requests computed?
        # Pipeline stages: this worker's hooks only (model None: every hook, as in the tests without an engine).
        here = (lambda path: True) if model is None else (lambda path: owns(model, layer_path(path)))
        hooks = {}
        for hook in boot["hooks"]:
            local = localise(hook, facts.heads, tp_rank, tp_size, facts.head_dim, facts.family)
            if local is not None and here(hook["module"]):
                if model is not None:
                    check_gates_on_stage(model, boot, local)
                hooks[(hook["module"], hook["kind"], hook["tensor"])] = local
        # Which stage answers for the receipt: the one holding the plan's probes (gate values stay on their
        # stage), else the first; probes on two stages leave no stage able to.
        root = layer_path(boot["hooks"][0]["module"]).rsplit(".", 1)[0] if boot["hooks"] else "model.layers"
        probes = [here(f"{root}.{p['layer']}") for p in boot["probes"]]
        self.receipt_here = probes[0] if probes else here(f"{root}.0")
        self.receipt_split = not all(probes)
        receipt = receipt and self.receipt_here
        # Which hooks the plan tables hold (table_bounds: the boot's capacity; None: no tables).
        if table_bounds is None:
            self.why_not = {key: "this server has no plan tables" for key in hooks}
        else:
            self.why_not = table_refusals(hooks, lambda name: np.shape(tensors[name]), table_bounds, boot)
        self.hooks = hooks
        self.tabled = {key for key, why in self.why_not.items() if why is None}
        self.probe_index = {p["name"]: q for q, p in enumerate(boot["probes"])}
        tabled_probes = [p for key in self.tabled for site in hooks[key]["sites"] for p in site["probes"]]
        self.reading = sorted(key for key in self.tabled if any(site["probes"] for site in hooks[key]["sites"]))
        self.pools = any(p["pool"] != "token" for p in tabled_probes)  # needs a request row in the tables
        self.rslot: int | None = None
        # Only tabled kernels and no receipt: nothing reads this request's own step metadata.
        self.needs_metadata = receipt or len(self.tabled) < len(hooks)
        self.state = SteerState(boot, tensors, max_tokens=max_tokens if self.needs_metadata else 1, max_slots=1,
                                width=max(facts.hidden, facts.head_dim), dtype=dtype, device=device)
        self.fns = {key: site_function(self.state, local["sites"]) for key, local in hooks.items()}
        # Row counts -> stage masks, when every tabled stage steers every row (decode steps repeat one count).
        self._every_row = {} if all(every_row(self.state, hooks[key]) for key in self.tabled) else None
        self.slot_id, self.slot = slot_id, 0
        self.started = False
        self.receipt: Receipt | None = None

    def table_rows(self) -> dict:
        """The plan as plan-table rows (:meth:`steerc.runtime.vllm.tables.SteerTables.acquire`), from the
        operands the per-request path reads (this request's own buffers, its params bound): per tabled hook
        its stages, [(row, keep, local columns or None, gate row or None)] in the plan's order, each kernel
        in its kind's batched form, and the probes it reads; and each probe's row, by its index."""
        state, gates = self.state, self.state.boot["gates"]
        thresholds = state.buffer("gates.thresholds").float().cpu()
        probes: list = [None] * len(self.probe_index)
        points = {}
        for key in sorted(self.tabled):
            stages, reads = [], []
            for site in self.hooks[key]["sites"]:
                for p in site["probes"]:
                    q = self.probe_index[p["name"]]
                    reads.append(q)
                    vector = state.buffer(p["tensor"]).float().cpu() if p["tensor"] is not None else None
                    threshold = float(state.buffer(p["threshold"])[0]) if "threshold" in p else 0.0
                    probes[q] = dict(probe_row(p["kind"], vector, float(state.buffer(p["bias"])[0]), threshold),
                                     pool=POOLS[p["pool"]])
                for k in site["kernels"]:
                    gate = gate_row(gates[k["gate"]], self.probe_index, thresholds) if k["gate"] is not None else None
                    stages.append((KINDS[k["kind"]].batched(S, operands(state, k), k["mode"]), k["preserve_norm"],
                                   site.get("local_columns"), gate))
            points[key] = {"stages": stages, "probes": reads}
        return {"points": points, "probes": probes}

    def pull_probes(self, tables, a: int, b: int) -> None:
        """Copy the values the tables hold for this request's probes (rows ``a:b`` of the step) into its own
        state, where its receipt reads them."""
        if not self.reading:
            return
        for name in self.state.per_token:
            getattr(self.state, f"tok_{name}")[:b - a].copy_(tables.pv[a:b, self.probe_index[name]])
        for name in self.state.pooled:
            if self.rslot is not None:
                getattr(self.state, f"held_{name}")[0] = tables.pheld[self.probe_index[name], self.rslot]

    def stage_masks(self, pos, plen) -> dict:
        """Each tabled hook's per-stage (scope mask, schedule factor) over this step's rows of the request (the
        same arrays each step of as many rows, when every stage steers every row: read, never written)."""
        if self._every_row is not None:
            masks = self._every_row.get(len(pos))
            if masks is None:
                if len(self._every_row) >= 4:
                    self._every_row.clear()
                masks = self._every_row[len(pos)] = self._stage_masks(pos, plen)
            return masks
        return self._stage_masks(pos, plen)

    def _stage_masks(self, pos, plen) -> dict:
        memo: dict = {}  # one answer per distinct scope and schedule, whatever the number of hooks sharing it
        return {key: stage_masks(self.state, self.hooks[key], pos, plen, memo) for key in self.tabled}

    def feed(self, pos, plen, restart: bool, tables=None) -> None:
        """A step's rows of this request: its own metadata where something reads it; ``restart``: the step
        starts at its first token, so a request that ran before was recomputed (after preemption) and pools
        afresh, in its own state and in its request row of the ``tables``."""
        if restart and self.started:
            self.state.reset_slots([0])
            if self.rslot is not None and tables is not None:
                tables.reset_request(self.rslot)
            if self.receipt is not None:
                self.receipt.restart()
        self.started = True
        if self.needs_metadata:
            n = len(pos)
            self.state.write_metadata(pos, plen, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
