"""One steered request in a serve worker: its buffers, its function at each module, its plan slot.

:class:`RequestSteer` is built from a request's admitted plan with the vllm
target's machinery (:mod:`steerc.runtime.vllm.steer`: the same kernels,
probes and gates), cut to this worker's share (:mod:`.parallel`: its
tensor-parallel rank, its pipeline stage). A hook whose kernels the plan
tables hold (:func:`~.tables.tableable`: no probe, no gate, within the boot's
rank and kernel bounds) is written into a plan slot (:mod:`.tables`) and runs
in the graph with every other plan; the rest run per request. The router (:mod:`.router`) decides which rows each request
owns in a step; this module holds only what one request needs.
"""

from __future__ import annotations

import numpy as np

from steerc.ir.kernels import KINDS
from steerc.runtime import kernels as S
from steerc.runtime.vllm.parallel import check_gates_on_stage, layer_path, localise, owns
from steerc.runtime.vllm.receipt import Receipt
from steerc.runtime.vllm.steer import SteerState, operands, site_function
from steerc.runtime.vllm.tables import DEFAULT, stage_masks, tableable
from steerc.targets.vllm.program import build, prefix_cache_safe


class RequestSteer:
    """One request's steering: its buffers (vLLM buffer form) and per-module functions.

    ``built``: the plan's ``(boot, tensors)`` when the caller holds them already (the router passes the
    admitted plan's, built once per process: :meth:`steerc.targets.serve.admission.Admitted.built`); they
    are only read, never changed. Without it the plan is built here.
    """

    def __init__(self, plan, facts, *, max_tokens: int, dtype, device, tp_rank: int, tp_size: int,
                 slot_id: str = "", receipt: bool = False, model=None, built: tuple[dict, dict] | None = None,
                 table_bounds: tuple[int, int] | None = (DEFAULT.rank, DEFAULT.kernels)):
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
        # Which hooks the plan tables hold (table_bounds: the boot's (rank, kernels); None: no tables).
        self.why_not = {key: ("this server has no plan tables" if table_bounds is None else
                              tableable(local, lambda name: np.shape(tensors[name]), *table_bounds))
                        for key, local in hooks.items()}
        self.hooks = hooks
        self.tabled = {key for key, why in self.why_not.items() if why is None}
        # Only tabled kernels and no receipt: nothing reads this request's own step metadata.
        self.needs_metadata = receipt or len(self.tabled) < len(hooks)
        self.state = SteerState(boot, tensors, max_tokens=max_tokens if self.needs_metadata else 1, max_slots=1,
                                width=max(facts.hidden, facts.head_dim), dtype=dtype, device=device)
        self.fns = {key: site_function(self.state, local["sites"]) for key, local in hooks.items()}
        self.slot_id, self.slot = slot_id, 0
        self.started = False
        self.receipt: Receipt | None = None

    def table_rows(self) -> dict:
        """Each tabled hook's stages as plan-table rows, [(row, keep, local columns or None)] in the plan's
        order: each kernel in its kind's batched form, from the operands the per-request path reads (this
        request's own buffers, its params bound)."""
        out = {}
        for key in sorted(self.tabled):
            out[key] = [(KINDS[k["kind"]].batched(S, operands(self.state, k), k["mode"]), k["preserve_norm"],
                         site.get("local_columns")) for site in self.hooks[key]["sites"] for k in site["kernels"]]
        return out

    def stage_masks(self, pos, plen) -> dict:
        """Each tabled hook's per-stage (scope mask, schedule factor) over this step's rows of the request."""
        memo: dict = {}  # one answer per distinct scope and schedule, whatever the number of hooks sharing it
        return {key: stage_masks(self.state, self.hooks[key], pos, plen, memo) for key in self.tabled}

    def feed(self, pos, plen, restart: bool) -> None:
        if restart and self.started:  # recomputed from its first token (after preemption): pool afresh
            self.state.reset_slots([0])
            if self.receipt is not None:
                self.receipt.restart()
        self.started = True
        n = len(pos)
        self.state.write_metadata(pos, plen, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))
