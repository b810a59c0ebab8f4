"""The serve plugin in a worker: each step, every steered request's plan on that request's rows only.

:class:`ServeRouter` is installed on the loaded model by steerc's loader
(mode ``"serve"``, through :func:`steerc.runtime.vllm.serve.attach`). Before
each step it reads each new request's plan from its
``SamplingParams.extra_args``, admits it
(:func:`steerc.targets.serve.admission.admit`), builds its steering
(:class:`~steerc.runtime.vllm.request.RequestSteer`) and hooks the modules
its plan touches (:mod:`.points`). Plans the plan tables can hold
(:mod:`.tables`: within the boot's bounds, gates and probes included) take a
slot there and run inside the graph, all plans of a step in one batched
pass; the others run per request through the steer points, each request's
kernels on its own rows. Rows of other requests stay bit-identical. Pooled
probes keep per-request state across chunked-prefill steps (in the tables, a
request row each). Each step's metadata is
written around the runner's model call, outside the forward
(:func:`~.engine.attach_step_calls`).

Admission here is not a formality: the worker reads what came over the wire
from the front end (another process on a server), and trusts none of it. A
plan this process admitted before, with the same content and on the same
model, is not admitted or built again (admission keeps it, bounded); only
what is the request's own is checked again.

A request refused here fails alone and closed: :data:`~.guard.FAILED_KEY`
in its ``extra_args`` names the fault, and the logits processor
(:class:`~.guard.SteercGuard`) ends it at its next token; the engine and the
other requests go on.

Prefix caching: a steered request carries ``cache_salt`` = the plan's salt
(checked at admission), so KV computed under one plan is never reused by a
request with another plan or none. A plan whose steering depends on tokens
a cache hit skips (:func:`steerc.targets.vllm.program.prefix_cache_safe`:
prompt-pooled probes, scopes relative to the prompt) gets a salt of its own
per request from the HTTP front end; a request of such a plan whose first
step still starts past token 0 (a cache hit) is failed closed here.
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from steerc.runtime.kernels import compute_dtype
from steerc.runtime.vllm import points
from steerc.runtime.vllm.engine import (
    attach_step_calls,
    engine_key,
    facts_of,
    hooks_never_ran,
    is_compiled,
    pipeline_stages,
    served_capacity,
    served_sites,
    token_metadata,
)
from steerc.runtime.vllm.guard import FAILED_KEY
from steerc.runtime.vllm.parallel import layer_path, owns, tensor_parallel
from steerc.runtime.vllm.receipt import Receipt
from steerc.runtime.vllm.request import RequestSteer
from steerc.runtime.vllm.tables import SteerTables, TableFull
from steerc.targets.serve.admission import RequestError, admit
from steerc.targets.serve.capacity import PLANS_FLAG, point_hooks
from steerc.targets.serve.request import RECEIPT_KEY

log = logging.getLogger("steerc")
_FAILED = object()


def slot_id(admitted) -> str:
    """Requests share a plan slot when they run the same plan with the same param values."""
    params = json.dumps(admitted.params, sort_keys=True, default=repr)
    return hashlib.sha256(f"{admitted.plan_id}\n{params}".encode()).hexdigest()


def _body(key, router):
    """A steer point's body (the per-request path's servers), steering the point's tensor in place: the plan
    tables where a tabled plan steers here this step (trimmed to what this step's plans use), then each
    per-request plan's function on its own rows; nothing written when nothing steers here this step."""
    tables = router.tables
    if key[2] == "fused_pair":
        def pair(hidden, residual):
            router.ran.add(key)
            active, use = router.rows.get(key, ()), tables.used(key)
            if not active and use is None:
                return
            if use is not None:
                tables.steer_pair_(key, hidden, residual, use)
            for req, a, b in active:
                fn = req.fns[key]
                total = hidden[a:b].to(fn.dtype) + residual[a:b].to(fn.dtype)
                hidden[a:b] = fn(total).to(hidden.dtype)
                residual[a:b] = 0  # the next fused add-norm sums the pair: rows stay exact

        return pair

    def one(x):
        router.ran.add(key)
        active, use = router.rows.get(key, ()), tables.used(key)
        if not active and use is None:
            return
        flat = x.view(-1, x.shape[-1])
        if use is not None:
            tables.steer_(key, flat, use)
        for req, a, b in active:  # rows no tabled plan steers: the tables left them as they were
            flat[a:b] = req.fns[key](flat[a:b])

    return one


def _traced(key, tables):
    """The plan tables at one point as traced code, for servers without the per-request path: every stage at
    the full rank, inside the graph (:meth:`~.tables.SteerTables.apply`)."""
    if key[2] == "fused_pair":
        return lambda hidden, residual: tables.apply_pair(key, hidden, residual)

    def one(x):
        return tables.apply(key, x.reshape(-1, x.shape[-1])).reshape(x.shape)

    return one


class ServeRouter:
    """The worker side of the serve plugin, installed on the model by steerc's loader (mode "serve")."""

    def __init__(self, model, view, vllm_config):
        self.model, self.view = model, view
        self.facts = facts_of(vllm_config)
        self.key = engine_key(vllm_config)
        self.sites = served_sites(vllm_config)
        self.stages = pipeline_stages(vllm_config)
        self.compiled = is_compiled(vllm_config)
        self.max_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        param = next(model.parameters())
        self.dtype, self.device = compute_dtype(param.dtype), param.device
        self.tp_rank, self.tp_size = tensor_parallel()
        self.requests: dict[str, object] = {}   # req id -> RequestSteer, None (unsteered) or _FAILED
        self.rows: dict[tuple, list] = {}
        self.hooks: dict[tuple, object] = {}
        self.capacity = cap = served_capacity(vllm_config)
        self.tables = SteerTables(self._widths(model), plans=cap.plans, rank=cap.rank, kernels=cap.kernels,
                                  probes=cap.probes, conditions=cap.conditions, hidden=self.facts.hidden,
                                  requests=int(getattr(vllm_config.scheduler_config, "max_num_seqs", 0) or
                                               self.max_tokens),  # live requests: one request row each
                                  max_tokens=self.max_tokens, dtype=self.dtype, device=self.device)
        model.add_module("steerc_tables", self.tables)  # its buffers are the model's: traced, fixed addresses
        self.ran: set = set()
        self.fresh: list = []
        self.receipts: list = []
        self.failures = 0
        self.handles, self.outside_forward = attach_step_calls(getattr(view, "runner", None), model, self.before,
                                                               self.after, self.idle)
        if self.compiled:
            # Traced once, at the first forward: every provisioned site has its tables (and, with the per-request
            # path, its steer point) from now on.
            if self.device.type == "cuda" and self.capacity.per_request:
                comp = vllm_config.compilation_config
                comp.splitting_ops = list(comp.splitting_ops or []) + [
                    op for op in points.SPLITTING_OPS if op not in (comp.splitting_ops or [])]
            for key in self.tables.where:
                self._point(key)

    def _widths(self, model) -> dict:
        """Each steer point this worker holds, with the width of its tensor (a head site's: this rank's heads)."""
        widths = {}
        for group in self.sites:
            width = self.facts.hidden
            if group == "head":
                width = self.facts.heads // self.tp_size * self.facts.head_dim
            for key in point_hooks(self.facts, (group,)):
                if key not in widths and owns(model, layer_path(key[0])):
                    widths[key] = width
        return widths

    # -- per step ---------------------------------------------------------
    def before(self, positions) -> None:
        self.rows, self.ran, self.fresh, self.receipts = {}, set(), [], []
        live = self.view.live()
        for gone in [r for r in self.requests if r not in live]:
            self._release(self.requests.pop(gone))
        layout = self.view.layout()
        if layout is None:
            self.idle()
            return
        pos, plen, _ = token_metadata(layout, positions, "serve")
        slots = np.zeros(len(pos), dtype=np.int64)
        rslots = np.full(len(pos), self.tables.requests, dtype=np.int64)
        tabled: dict[tuple, list] = {}
        for i, rid in enumerate(layout.req_ids):
            if rid not in self.requests:
                self.requests[rid] = self._admit(rid)
                steer = self.requests[rid]
                if isinstance(steer, RequestSteer) and not steer.cacheable and int(layout.first[i]) > 0:
                    # Its first step starts past token 0: vLLM served the rest from the prefix cache, computed
                    # without this request's pooled probes or prompt-relative scopes. Never steer half a prompt.
                    self._fail(rid, f"its first {int(layout.first[i])} tokens came from the prefix cache, and its "
                                    "plan depends on every prompt token (a prompt-pooled probe or a scope relative "
                                    "to the prompt): send it with a cache_salt of its own (steerc serve does)")
                elif isinstance(steer, RequestSteer):
                    self.fresh.append(rid)
            steer = self.requests[rid]
            if not isinstance(steer, RequestSteer):
                continue
            a, b = int(layout.starts[i]), int(layout.starts[i + 1])
            steer.feed(pos[a:b], plen[a:b], restart=bool(layout.first[i] == 0), tables=self.tables)
            if steer.receipt is not None:
                self.receipts.append((steer, a, b, pos[a:b], plen[a:b]))
            if steer.slot:
                slots[a:b] = steer.slot
                if steer.rslot is not None:
                    rslots[a:b] = steer.rslot
                for key, stages in steer.stage_masks(pos[a:b], plen[a:b]).items():
                    tabled.setdefault(key, []).extend((k, a, b, m, f) for k, (m, f) in enumerate(stages))
            for key in steer.fns:
                if key not in steer.tabled:
                    self.rows.setdefault(key, []).append((steer, a, b))
        self.tables.write_step(len(pos), slots, tabled, rslots, pos, plen)

    def idle(self) -> None:
        """Ahead of a dummy run (profiling, warm-up, graph capture) and a step with no layout: no row is
        steered."""
        self.rows = {}
        self.tables.write_step(0, np.zeros(0, dtype=np.int64), {})

    def after(self) -> None:
        """A request's first step must have run every hook its plan needs on this rank."""
        for rid in self.fresh:
            steer = self.requests.get(rid)
            missing = [k[0] for k in steer.fns if k not in steer.tabled and k not in self.ran
                       and owns(self.model, layer_path(k[0]))]
            if missing:
                self._fail(rid, hooks_never_ran(missing, self.facts.family))
        for steer, a, b, pos, plen in self.receipts:  # after the pass: what its kernels did, before vLLM sees it
            steer.pull_probes(self.tables, a, b)
            steer.receipt.record(steer.state, pos, plen)

    # -- requests -----------------------------------------------------------
    def _admit(self, rid: str):
        """A new request's steering: None (it asks for none), its RequestSteer, or _FAILED (refused here).

        The request is admitted again although the front end admitted it: on a server the front end is
        another process, and what reaches the worker is bytes it must check itself (a plan for another model
        passes a front end that does not hold the model). Admission keeps what this process admitted and
        built, by content: the same plan again is neither admitted nor built twice.
        """
        params = self.view.sampling_params(rid)
        extra = getattr(params, "extra_args", None)
        steer = None
        try:
            admitted = admit(extra, self.facts, tp_size=self.tp_size, key=self.key, sites=self.sites,
                             stages=self.stages)
            if admitted is None:
                return None
            receipt = extra.get(RECEIPT_KEY) is not None and self.tp_rank == 0
            cap = self.capacity
            kw = dict(max_tokens=self.max_tokens, dtype=self.dtype, device=self.device, tp_rank=self.tp_rank,
                      tp_size=self.tp_size, slot_id=slot_id(admitted), receipt=receipt, model=self.model,
                      built=admitted.built())
            steer = RequestSteer(admitted.plan, self.facts, table_bounds=cap, **kw)
            if steer.tabled and not self._take_slot(steer):
                steer = RequestSteer(admitted.plan, self.facts, table_bounds=None, **kw)  # every hook per request
            untabled = [k for k in steer.fns if k not in steer.tabled]
            if untabled and not cap.per_request:
                raise RequestError("steerc_plan", f"at {untabled[0][0]}: {steer.why_not[untabled[0]]}")
            self._hook(steer)
            if receipt and steer.receipt_here:  # one worker writes it: the first rank of the probes' stage
                steer.receipt = Receipt(extra[RECEIPT_KEY], admitted)
                if steer.receipt_split:
                    steer.receipt.fail("its probes lie on two pipeline stages, and no one stage holds every "
                                       "gate's values; its steering is unaffected")
            return steer
        except Exception as exc:  # noqa: BLE001 - this request fails; the engine and the others go on
            self._release(steer)  # what it took in the tables, if it got that far
            self._fail(rid, str(exc), params)
            return _FAILED

    def _take_slot(self, steer: RequestSteer) -> bool:
        """Write the plan into a table slot (shared with its twins); False when every slot is taken and the
        per-request path may run it instead."""
        try:
            steer.slot = self.tables.acquire(steer.slot_id, steer.table_rows())
            if steer.pools:
                steer.rslot = self.tables.take_request()
            return True
        except TableFull as exc:
            self._release(steer)
            if not self.capacity.per_request:
                raise RequestError("steerc_plan", f"{exc} (this server has no per-request path; {PLANS_FLAG} "
                                                  f"sets how many)") from None
            return False

    def _fail(self, rid: str, message: str, params=None) -> None:
        """Fail one request closed: it is never steered, and SteercGuard ends it at its next token."""
        self.failures += 1
        self._release(self.requests.get(rid))
        self.requests[rid] = _FAILED
        params = params if params is not None else self.view.sampling_params(rid)
        extra = getattr(params, "extra_args", None)
        if isinstance(extra, dict):
            extra[FAILED_KEY] = message[:500]
        log.error("steerc: request %s refused in the worker and ended: %s", rid, message)

    def _release(self, steer) -> None:
        """Give back what a request held in the tables: its plan slot (when its twins are gone too), its
        request row."""
        if not isinstance(steer, RequestSteer):
            return
        if steer.slot:
            self.tables.release(steer.slot_id)
            steer.slot = 0
        if steer.rslot is not None:
            self.tables.drop_request(steer.rslot)
            steer.rslot = None

    def _hook(self, steer: RequestSteer) -> None:
        """Eager: the tables and a steer point at each module a plan needs, the first time one does. Compiled:
        they are all there since boot (admission refused sites without one)."""
        for key in steer.fns:
            if key in self.hooks or not owns(self.model, layer_path(key[0])):
                continue
            if self.compiled:
                raise RequestError("steerc_plan", f"no steer point at {key[0]} on this compiled server")
            self._point(key)

    def _point(self, key) -> None:
        """The hook at one provisioned site: with the per-request path, a steer point running the tables and the
        per-request plans (Python each step, PIECEWISE graphs); without it, the tables traced into the graph."""
        module = self.model.get_submodule(key[0])
        if self.capacity.per_request:
            self.hooks[key] = points.install(module, key[1], key[2], _body(key, self))
        else:
            self.hooks[key] = points.install(module, key[1], key[2], None, tables=_traced(key, self.tables))

    def status(self) -> dict:
        steered = sorted(r for r, s in self.requests.items() if isinstance(s, RequestSteer))
        return {"steered": steered, "hooks": len(self.hooks), "failures": self.failures,
                "plan_slots": len(self.tables.held), "slot_capacity": self.tables.plans,
                "tables": dict(self.capacity.to_json(), free=len(self.tables.free), bytes=self.tables.bytes()),
                "per_request": sorted({key[0] for key, active in self.rows.items() if active}),
                "outside_forward": self.outside_forward,
                "runner": self.view.runner_kind, "compiled": self.compiled, "sites": list(self.sites)}
