"""steerc on vLLM: a worker extension reached by name, and the driver-side helpers.

Use::

    from steerc.runtime.vllm import load, swap
    llm = load("HuggingFaceTB/SmolLM2-135M-Instruct", "out/plan.msgpack")   # a steered vllm.LLM
    llm.generate(prompts, params)
    swap(llm, "out2/plan.msgpack")   # same structure, new values: written in place

How it stays exact and keeps CUDA graphs: :func:`load` passes the plan to
every worker through ``additional_config`` and names
:class:`SteercWorkerExtension` as ``worker_extension_cls``. The extension
wraps the model runner's ``load_model`` so the hooks go in right after the
weights load — before torch.compile traces the model and before CUDA graphs
are captured — and its ``prepare_inputs`` so that each step's per-token
metadata (position, prompt length, request slot) is written into fixed
buffers outside the graph. Everything else happens through ``steerc_*``
methods called by name with ``LLM.collective_rpc`` and msgpack-safe
arguments (plan bytes): never pickle.

Tensor parallel: ``head[l, h]`` is applied on the rank holding head ``h``
(query heads are split in contiguous blocks); residual, attention-output and
MLP-output kernels run on every rank on identical, already-reduced tensors.
Pipeline parallel: each rank hooks only the layers it owns, and the driver
checks that every hook of the plan landed on some rank.
"""

from __future__ import annotations

import os

import numpy as np

from steerc.targets.vllm.wire import PlanError, boot_sha256, unpack, validate_plan

EXTENSION = "steerc.runtime.vllm.SteercWorkerExtension"
CONFIG_KEY = "steerc"


def _vllm():
    try:
        import vllm
    except ImportError:
        raise ImportError("steerc's vLLM runtime needs vLLM: pip install 'steerc[vllm]' (a CUDA machine)") from None
    return vllm


# --------------------------------------------------------------------- worker


def _parallel(worker) -> tuple[int, int]:
    """(tensor-parallel rank, size) of this worker."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 - not inside vLLM: the worker says (stand-ins, tests)
        pc = worker.vllm_config.parallel_config
        return getattr(worker, "tp_rank", 0), getattr(pc, "tensor_parallel_size", 1)


def _owns(model, module_path: str) -> bool:
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        return False
    return type(module).__name__ != "PPMissingLayer"


def _layer_path(module_path: str) -> str:
    parts = module_path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return module_path


def _localise(hook: dict, heads: int, tp_rank: int, tp_size: int, head_dim: int) -> dict | None:
    """This rank's share of a hook: head sites keep the heads it holds, with local columns."""
    local = heads // tp_size
    sites = []
    for site in hook["sites"]:
        if site["head"] is None:
            sites.append(dict(site, local_columns=None))
            continue
        h = site["head"]
        if h // local != tp_rank:
            continue
        if site["probes"] and tp_size > 1:
            raise PlanError("plan.boot.hooks", f"probe at {site['site']}: a head probe cannot be shared across "
                                              "tensor-parallel ranks; read it at a residual site instead")
        j = h % local
        sites.append(dict(site, local_columns=[j * head_dim, (j + 1) * head_dim]))
    return dict(hook, sites=sites) if sites else None


class InstalledPlan:
    """The hooks, buffers and structure installed on one worker's model."""

    def __init__(self, model, obj: dict, tensors: dict, *, tp_rank: int, tp_size: int, max_tokens: int,
                 max_slots: int):
        from steerc.runtime import _support as S
        from steerc.runtime.vllm_steer import SteerState, register, site_function

        facts = obj["header"]["facts"]
        param = next(model.parameters())
        self.boot = obj["boot"]
        self.header = obj["header"]
        self.state = SteerState(self.boot, tensors, max_tokens=max_tokens, max_slots=max_slots,
                                width=max(facts["hidden"], facts["head_dim"]),
                                dtype=S.compute_dtype(param.dtype), device=param.device)
        if hasattr(model, "steerc"):
            raise PlanError("plan", "this model already has steerc installed")
        model.add_module("steerc", self.state)
        self.handles = []
        self.installed: list[str] = []
        self.skipped: list[str] = []
        probe_layers = {p["name"]: p["layer"] for p in self.boot["probes"]}
        try:
            for hook in self.boot["hooks"]:
                if not _owns(model, _layer_path(hook["module"])):
                    self.skipped.append(hook["name"])
                    continue
                local = _localise(hook, facts["heads"], tp_rank, tp_size, facts["head_dim"])
                if local is None:
                    self.installed.append(hook["name"])  # no head of this rank: nothing to do here
                    continue
                self._check_probes_here(model, local, probe_layers)
                module = model.get_submodule(hook["module"])
                self.handles.append(register(module, hook, site_function(self.state, local["sites"])))
                self.installed.append(hook["name"])
        except Exception:
            self.remove(model)
            raise

    def _check_probes_here(self, model, hook: dict, probe_layers: dict) -> None:
        """A gate's probes must run on this pipeline stage (their values do not cross stages)."""
        gates = self.boot["gates"]
        for site in hook["sites"]:
            for k in site["kernels"]:
                if k["gate"] is None:
                    continue
                root = _layer_path(hook["module"]).rsplit(".", 1)[0]
                for name in _gate_probes(gates[k["gate"]]):
                    if not _owns(model, f"{root}.{probe_layers[name]}"):
                        raise PlanError("plan.boot.gates", f"probe `{name}` sits on another pipeline stage than "
                                                           f"the kernel it gates at {site['site']}")

    def remove(self, model) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        if getattr(model, "steerc", None) is self.state:
            del model._modules["steerc"]


def _gate_probes(gate) -> list[str]:
    if gate[0] == "cmp":
        return [gate[1]]
    if gate[0] == "not":
        return _gate_probes(gate[1])
    return [n for g in gate[1] for n in _gate_probes(g)]


def batch_metadata(runner, batch) -> tuple:
    """(pos, plen, slot, valid, {slot: req_id}) per token of a vLLM V2 ``InputBatch``."""
    n_req = batch.num_reqs
    qsl = np.asarray(batch.query_start_loc_np[: n_req + 1], dtype=np.int64)
    counts = np.diff(qsl)
    slots = np.asarray(batch.idx_mapping_np[:n_req], dtype=np.int64)
    total = int(batch.num_tokens_after_padding)
    n = int(qsl[-1])
    first = np.asarray(batch.num_computed_tokens_np[:n_req], dtype=np.int64)
    offsets = np.arange(n, dtype=np.int64) - np.repeat(qsl[:-1], counts)
    pos = np.zeros(total, dtype=np.int64)
    plen = np.zeros(total, dtype=np.int64)
    slot = np.full(total, -1, dtype=np.int64)
    valid = np.zeros(total, dtype=bool)
    pos[:n] = np.repeat(first, counts) + offsets
    plen[:n] = np.repeat(np.asarray(runner.req_states.prompt_len.np, dtype=np.int64)[slots], counts)
    slot[:n] = np.repeat(slots, counts)
    valid[:n] = True
    owners = {int(s): batch.req_ids[i] for i, s in enumerate(slots)}
    return pos, plen, slot, valid, owners


class SteercWorkerExtension:
    """Mixed into vLLM's Worker (``worker_extension_cls``); methods are reached by name.

    RPCs (``llm.collective_rpc("steerc_...", args=(...))``, msgpack-safe arguments):
    ``steerc_install(plan_bytes)`` (eager engines, or before the first forward),
    ``steerc_update(plan_bytes)`` (new values for the installed structure),
    ``steerc_enable(flag)``, ``steerc_status()``.
    """

    # -- lifecycle ---------------------------------------------------------
    def init_worker_extension(self) -> None:
        self._steerc = None
        self._steerc_owners: dict[int, str] = {}
        runner = self.model_runner
        original_load = runner.load_model

        def load_model_then_steer(*args, **kwargs):
            result = original_load(*args, **kwargs)
            config = getattr(self.vllm_config, "additional_config", None) or {}
            path = (config.get(CONFIG_KEY) or {}).get("plan")
            if path:
                with open(path, "rb") as fh:
                    self.steerc_install(fh.read())
            return result

        runner.load_model = load_model_then_steer
        original_prepare = runner.prepare_inputs

        def prepare_inputs_then_feed(*args, **kwargs):
            batch = original_prepare(*args, **kwargs)
            if self._steerc is not None:
                self._steerc_feed(batch)
            return batch

        runner.prepare_inputs = prepare_inputs_then_feed

    def _steerc_model(self):
        return self.model_runner.get_model()

    def _steerc_feed(self, batch) -> None:
        pos, plen, slot, valid, owners = batch_metadata(self.model_runner, batch)
        state = self._steerc.state
        slot = np.where(slot < 0, state.max_slots, slot)
        fresh = [s for s, rid in owners.items() if self._steerc_owners.get(s) != rid]
        self._steerc_owners.update(owners)
        state.reset_slots(fresh)
        state.write_metadata(pos, plen, slot, valid)

    # -- RPCs ----------------------------------------------------------------
    def steerc_install(self, payload: bytes) -> dict:
        if self._steerc is not None:
            raise PlanError("plan", "a plan is installed already; use steerc_update for new values")
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=self._steerc_fingerprint())
        tp_rank, tp_size = _parallel(self)
        sched = self.vllm_config.scheduler_config
        self._steerc = InstalledPlan(self._steerc_model(), obj, tensors, tp_rank=tp_rank, tp_size=tp_size,
                                     max_tokens=int(sched.max_num_batched_tokens),
                                     max_slots=int(sched.max_num_seqs))
        return self.steerc_status()

    def steerc_update(self, payload: bytes) -> dict:
        if self._steerc is None:
            raise PlanError("plan", "no plan is installed on this worker")
        obj = unpack(payload)
        tensors = validate_plan(obj, fingerprint=self._steerc_fingerprint(), boot=self._steerc.boot)
        self._steerc.state.write_state(tensors)
        self._steerc.header = obj["header"]
        return self.steerc_status()

    def steerc_enable(self, flag: bool) -> dict:
        if not isinstance(flag, bool):
            raise PlanError("flag", f"expected true or false, got {type(flag).__name__}")
        if self._steerc is None:
            raise PlanError("plan", "no plan is installed on this worker")
        self._steerc.state.enabled.fill_(flag)
        return self.steerc_status()

    def steerc_status(self) -> dict:
        if self._steerc is None:
            return {"installed": False, "hooks": [], "skipped": []}
        inst = self._steerc
        return {
            "installed": True,
            "source_sha256": inst.header["source_sha256"],
            "boot_sha256": inst.header["boot_sha256"],
            "hooks": list(inst.installed),
            "skipped": list(inst.skipped),
            "enabled": bool(inst.state.enabled.item()),
        }

    def _steerc_fingerprint(self) -> str:
        from steerc.facts import facts_from_config

        hf_config = self.vllm_config.model_config.hf_config
        config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
        return facts_from_config(config).fingerprint


# --------------------------------------------------------------------- driver


def read_plan(plan) -> bytes:
    """Plan bytes from a path, a compile output folder, or bytes."""
    if isinstance(plan, (bytes, bytearray)):
        return bytes(plan)
    path = os.path.join(plan, "plan.msgpack") if os.path.isdir(plan) else plan
    with open(path, "rb") as fh:
        return fh.read()


def check_coverage(statuses: list[dict], boot: dict) -> None:
    """Every hook of the plan must have landed on some rank (pipeline stages split the layers)."""
    landed = {name for s in statuses for name in s.get("hooks", [])}
    missing = [h["name"] for h in boot["hooks"] if h["name"] not in landed]
    if missing:
        raise PlanError("plan.boot.hooks", f"hooks not installed on any rank: {', '.join(missing[:8])}")


def load(model: str, plan, **engine_kwargs):
    """A ``vllm.LLM`` for ``model`` with ``plan`` installed on every worker before compilation."""
    vllm = _vllm()
    data = read_plan(plan)
    obj = unpack(data)
    validate_plan(obj)
    if any(p["pool"] != "token" for p in obj["boot"]["probes"]) and engine_kwargs.get("enable_prefix_caching"):
        raise PlanError("enable_prefix_caching", "prompt-pooled probes must see every prompt token; prefix "
                                                 "caching would skip cached ones (leave it off for this plan)")
    engine_kwargs.setdefault("enable_prefix_caching", False)
    import tempfile

    fd, path = tempfile.mkstemp(prefix="steerc-", suffix=".msgpack")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    extra = dict(engine_kwargs.pop("additional_config", None) or {})
    extra[CONFIG_KEY] = {"plan": path, "boot_sha256": boot_sha256(obj["boot"])}  # also salts the compile cache
    llm = vllm.LLM(model=model, worker_extension_cls=EXTENSION, additional_config=extra, **engine_kwargs)
    check_coverage(llm.collective_rpc("steerc_status"), obj["boot"])
    return llm


def sampling_params(plan, **kwargs):
    """``vllm.SamplingParams`` carrying the plan's output constraint (compact JSON for schemas).

    Uses ``StructuredOutputsParams`` (vLLM >= 0.11), or the older
    ``GuidedDecodingParams`` where that is what the installed vLLM has.
    """
    import dataclasses

    from steerc.targets.constraints import constraint_from_json, structured_outputs

    vllm = _vllm()
    constraint = unpack(read_plan(plan))["header"].get("constraint")
    if constraint is None:
        return vllm.SamplingParams(**kwargs)
    fields = structured_outputs(constraint_from_json(constraint))
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return vllm.SamplingParams(structured_outputs=StructuredOutputsParams(**fields), **kwargs)
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        known = {f.name for f in dataclasses.fields(GuidedDecodingParams)}
        return vllm.SamplingParams(guided_decoding=GuidedDecodingParams(
            **{k: v for k, v in fields.items() if k in known}), **kwargs)


def swap(llm, plan) -> list[dict]:
    """Write a new plan's values into a running engine (same structure), in place."""
    return llm.collective_rpc("steerc_update", args=(read_plan(plan),))
