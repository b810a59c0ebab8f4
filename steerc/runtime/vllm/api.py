"""The vllm target's driver: start a steered ``vllm.LLM`` and change its steering while it runs.

Use::

    from steerc.runtime.vllm import load, swap
    llm = load("path/to/model", "out/plan.msgpack")   # a steered vllm.LLM
    llm.generate(prompts, params)
    swap(llm, "out2/plan.msgpack")   # same structure, new values: written in place

:func:`load` starts the engine with ``load_format="steerc"`` (:mod:`.loader`), mode ``"plan"``
(:mod:`.plan`); the other functions call the workers' ``steerc_*`` RPCs on every rank (:func:`call`).
Pipeline parallel: each rank hooks only the layers it owns, and :func:`check_coverage` checks that every
hook of the plan landed on some rank, and that each one ran in the compile warm-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import tempfile

from steerc.core.paths import temp_folder
from steerc.runtime.vllm.engine import CONFIG_KEY, LOAD_FORMAT, EngineError, hooks_never_ran
from steerc.runtime.vllm.loader import register_loader
from steerc.targets.constraints import constraint_from_json, structured_outputs
from steerc.targets.vllm.program import prefix_cache_safe
from steerc.targets.vllm.wire import PlanError, boot_sha256, unpack, validate_plan

EXTENSION = "steerc.runtime.vllm.plan.SteercWorkerExtension"


def _vllm():
    try:
        import vllm
    except ImportError:
        raise ImportError("steerc's vLLM runtime needs vLLM: pip install 'steerc[vllm]' (a CUDA machine)") from None
    return vllm


def read_plan(plan) -> bytes:
    """Plan bytes from a path, a compile output folder, or bytes."""
    if isinstance(plan, (bytes, bytearray)):
        return bytes(plan)
    path = os.path.join(plan, "plan.msgpack") if os.path.isdir(plan) else plan
    with open(path, "rb") as fh:
        return fh.read()


def check_coverage(statuses: list[dict], boot: dict) -> None:
    """Every hook of the plan landed on some rank (pipeline stages split the layers), and — where the
    engine already ran a forward (compile warm-up) — every registered hook ran in it."""
    landed = {name for s in statuses for name in s.get("hooks", [])}
    missing = [h["name"] for h in boot["hooks"] if h["name"] not in landed]
    if missing:
        raise PlanError("plan.boot.hooks", f"hooks not installed on any rank: {', '.join(missing[:8])}")
    modules = {h["name"]: h["module"] for h in boot["hooks"]}
    silent = [f"{name} ({modules[name]})" for s in statuses if s.get("forwards")
              for name, count in (s.get("fired") or {}).items() if count == 0]
    if silent:
        raise EngineError(hooks_never_ran(sorted(set(silent)), statuses[0].get("family", "?")))


def plan_file(data: bytes) -> str:
    """A content-addressed copy of the plan for the workers (same plan, same path: vLLM's compile cache
    is keyed on it)."""
    explicit = os.environ.get("STEERC_CACHE")
    folder = os.path.join(explicit, "plans") if explicit else temp_folder("plans")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(data).hexdigest() + ".msgpack")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".incoming-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return path


def load(model: str, plan, *, hmac_key_file: str | None = None, capture=None, **engine_kwargs):
    """A ``vllm.LLM`` for ``model`` with ``plan`` installed on every worker before compilation.

    ``engine_kwargs`` go to ``vllm.LLM``; a ``load_format`` is the one steerc's
    loader delegates to. With ``hmac_key_file``, the workers accept only plans
    signed with that key (this one, and every later ``swap``). Prefix caching is on only for plans it cannot
    change (see :func:`prefix_cache_safe`); vLLM's CUDA graph mode is left as it is (its default replays
    full graphs for decode batches: steerc writes each step's metadata around the runner's model call, outside
    the graph, :func:`~steerc.runtime.vllm.engine.attach_step_calls`);
    JSON-schema constraints come out compact (``structured_outputs_config``
    ``disable_any_whitespace``, which vLLM's xgrammar backend reads per engine).

    ``capture``: sites (a selector such as ``"resid_post[0:30]"``, or a list) that :func:`capture` will read
    on a compiled engine. Each gets a tap traced into the graph, a fixed ``[max_num_batched_tokens,
    width]`` buffer per site its graph copies the site into on every step (an eager engine reads any
    site without them). Checked against the plan's model before the engine starts.
    """
    vllm = _vllm()
    register_loader()
    data = read_plan(plan)
    obj = unpack(data)
    validate_plan(obj)
    safe = prefix_cache_safe(obj["boot"])
    if engine_kwargs.get("enable_prefix_caching") and not safe:
        raise PlanError("enable_prefix_caching", "this plan steers a prefix differently depending on the "
                                                 "prompt's length or on prompt-pooled probes; cached KV from "
                                                 "another request would be wrong (leave prefix caching off)")
    engine_kwargs.setdefault("enable_prefix_caching", safe)
    # JSON comes out compact on every backend; vLLM's xgrammar backend reads this per engine, not per request.
    engine_kwargs.setdefault("structured_outputs_config", {"backend": "xgrammar", "disable_any_whitespace": True})
    extra = dict(engine_kwargs.pop("additional_config", None) or {})
    extra[CONFIG_KEY] = {"mode": "plan", "plan": plan_file(data), "boot_sha256": boot_sha256(obj["boot"]),
                         "load_format": engine_kwargs.pop("load_format", "auto")}
    if hmac_key_file:
        extra[CONFIG_KEY]["hmac_key_file"] = os.path.abspath(hmac_key_file)
    if capture is not None:
        from steerc.facts import ModelFacts
        from steerc.runtime.capture import as_sites

        facts = ModelFacts(**obj["header"]["facts"])
        extra[CONFIG_KEY]["capture"] = capture_spec(as_sites(capture, facts), facts, [])["sites"]
    llm = vllm.LLM(model=model, load_format=LOAD_FORMAT, worker_extension_cls=EXTENSION, additional_config=extra,
                   **engine_kwargs)
    try:
        statuses = call(llm, "steerc_status")
        for s in statuses:
            s.setdefault("family", obj["header"]["family"])
        check_coverage(statuses, obj["boot"])
    except Exception:
        llm.llm_engine.engine_core.shutdown()  # a plan that would not apply: no engine is left running
        raise
    return llm


def checkpoint_dtype(folder: str) -> str:
    """The dtype a model folder's config gives (vLLM's ``auto`` would run a float32 checkpoint in 16 bits,
    where transformers loads it as stored): what steerc's own engines start vLLM with, so that they compute
    what the HF path computes."""
    import json

    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return "auto"
    value = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return value if value in ("float32", "float16", "bfloat16") else "auto"


def logs_to_stderr() -> None:
    """vLLM logs to standard output by default; steerc's commands keep it for their tables and documents.
    The engine's processes read ``VLLM_LOGGING_STREAM`` when they start; this process's vLLM handlers,
    already configured, are pointed at standard error."""
    import logging
    import sys

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    for handler in logging.getLogger("vllm").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)


def sampling_params(plan, **kwargs):
    """``vllm.SamplingParams`` carrying the plan's output constraint (compact JSON for schemas).

    Uses ``StructuredOutputsParams`` (vLLM >= 0.11), or the older
    ``GuidedDecodingParams`` where that is what the installed vLLM has.
    """
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


def call(llm, method: str, *args) -> list[dict]:
    """Call a ``steerc_*`` RPC on every rank: their statuses, or PlanError if any rank refused."""
    statuses = llm.collective_rpc(method, args=args)
    for rank, s in enumerate(statuses):
        if not s.get("ok", False):
            err = s.get("error") or {}
            raise PlanError(err.get("field", "plan"), f"rank {rank}: {err.get('message', 'refused')}")
    return statuses


def _changed(llm, statuses: list[dict]) -> list[dict]:
    """After the steering changed: cached prefixes were computed under the old steering, so they go."""
    reset = getattr(llm, "reset_prefix_cache", None)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    caching = getattr(getattr(config, "cache_config", None), "enable_prefix_caching", True)
    if reset is not None and caching:
        reset()
    return statuses


def swap(llm, plan) -> list[dict]:
    """Write a new plan's values into a running engine (same structure), in place (and drop cached
    prefixes, which hold KV steered by the old values)."""
    return _changed(llm, call(llm, "steerc_update", read_plan(plan)))


def install(llm, plan) -> list[dict]:
    """Replace the installed plan's structure (eager engines only; a refused plan changes nothing)."""
    return _changed(llm, call(llm, "steerc_install", read_plan(plan)))


def set_params(llm, values: dict) -> list[dict]:
    """Give the installed plan's per-request params these values (the others: their defaults), in place.

    The same kernels as a plan compiled with ``--set`` to those values; no
    recompilation. A name the plan does not declare, or a value outside its
    range, is refused by every rank (PlanError naming ``params.<name>``) and
    changes nothing.
    """
    return _changed(llm, call(llm, "steerc_set_params", dict(values)))


def enable(llm, flag: bool) -> list[dict]:
    """Turn steering on or off for every request (the buffers and graph stay as they are)."""
    return _changed(llm, call(llm, "steerc_enable", flag))


def status(llm) -> list[dict]:
    return call(llm, "steerc_status")


def capture_spec(sites, facts, ranges) -> dict:
    """The workers' capture spec (:mod:`.activations`) for ``sites`` (objects with ``kind``, ``layer``, ``head``
    and ``key``, as :class:`steerc.derive.activations.Site`) on ``facts``, reading row ``i`` at ``ranges[i]``."""
    from steerc.facts.sites import site_table
    from steerc.passes.lower_plan import canonical_site

    table = site_table(facts.family, "vllm")
    out = []
    for site in sites:
        if not 0 <= site.layer < facts.layers or (site.head is not None and not 0 <= site.head < facts.heads):
            raise PlanError("capture.sites", f"{site.text} is not a site of this {facts.layers}-layer model with "
                                             f"{facts.heads} heads")
        c = canonical_site(site.kind, site.layer, site.head)
        hook = table.hook(c.kind, c.layer)
        out.append({"key": site.key, "module": hook.module, "kind": hook.kind, "tensor": hook.tensor,
                    "head": site.head, "columns": None, "width": facts.hidden})
    return {"sites": out, "rows": [[int(a), int(b)] for a, b in ranges]}


def capture(llm, texts, sites, *, read: str = "last", chat: bool = False, batch_size: int = 256):
    """Activations of ``texts`` at ``sites`` (a selector such as ``"resid_post[0:30]"``, or a list of them),
    read inside the engine as ``read`` says (``last``, ``mean``, ``completion`` or ``all``): the same
    :class:`~steerc.runtime.capture.Captured` arrays :func:`steerc.runtime.hf.capture` gives
    (spec/derive.md, *Capture*). Tokenized with the engine's tokenizer; with the plan's steering on, what
    is read is the steered stream. Raises :class:`~steerc.runtime.capture.CaptureError` before any forward
    for a site the model lacks or texts it cannot read, PlanError for one the engine cannot serve (a
    compiled engine without a tap there)."""
    from steerc.runtime import capture as C
    from steerc.runtime.vllm.engine import facts_of

    facts = facts_of(llm.llm_engine.vllm_config)
    wanted = C.as_sites(sites, facts)
    items = C.items_of(llm.get_tokenizer(), texts, read, chat)
    C.check_size(items, wanted, facts, read)
    arrays = capture_items(llm, items, wanted, facts, batch_size=batch_size, per_position=read == "all")
    return C.captured(arrays, wanted, items, read)


def capture_items(llm, items, sites, facts, *, batch_size: int = 256, per_position: bool = False) -> dict:
    """{site: [len(items), width] float32}: each item ``(token ids, a, b)`` read at its positions ``[a, b)``
    (their mean) through the engine's own forwards (spec/derive.md, *Capture*); with ``per_position``,
    every position kept instead, ``[sum of (b - a), width]``, the items' positions one after the other.

    Every item is one request of one sampled token, with a fresh random ``cache_salt``, so no cached
    prefix answers for a position the capture reads. With the plan's steering on, what is read is the
    steered stream (the hooks run after the plan's); with it off (:func:`enable`), the model's own. A
    per-position capture runs as several, each within what a worker keeps at once.
    """
    import numpy as np

    from steerc.runtime.vllm.activations import MAX_POSITIONS

    if not items:
        return {site: np.zeros((0, facts.width(site.kind)), dtype=np.float32) for site in sites}
    groups, size = [[]], 0
    for item in items:
        n = item[2] - item[1] if per_position else 0
        if n > MAX_POSITIONS:
            raise PlanError("capture", f"a text of {n} positions is over the {MAX_POSITIONS} a capture keeps")
        if groups[-1] and size + n > MAX_POSITIONS:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    parts = [_capture_group(llm, group, sites, facts, batch_size, per_position) for group in groups]
    return {site: np.concatenate([p[site] for p in parts]) for site in sites}


def _capture_group(llm, items, sites, facts, batch_size: int, per_position: bool) -> dict:
    vllm = _vllm()
    from vllm.inputs import TokensPrompt

    from steerc.runtime.vllm.activations import CAPTURE_KEY

    spec = dict(capture_spec(sites, facts, [(a, b) for _, a, b in items]), per_position=per_position)

    def batches():
        salt = secrets.token_hex(16)
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            yield ([TokensPrompt(prompt_token_ids=list(ids), cache_salt=salt) for ids, _, _ in chunk],
                   [vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                        extra_args={CAPTURE_KEY: start + i}) for i in range(len(chunk))])

    _, answers = captured(llm, spec, batches())
    return {site: answer_array(answers, site.key, site.text) for site in sites}


def probe_values(llm, texts, name: str, *, batch_size: int = 256):
    """float64 ``[len(texts)]``: the installed plan's probe ``name`` on each text (token ids), as its gates
    read it once the text has passed as a prompt: a per-token probe at the last token, a pooled probe's
    held value (CAST's condition, what ``steerc derive --calibrate --engine vllm`` searches a threshold on).
    Every text is one request of one sampled token with a fresh ``cache_salt``."""
    import numpy as np

    vllm = _vllm()
    from vllm.inputs import TokensPrompt

    from steerc.runtime.vllm.activations import CAPTURE_KEY

    if not texts:
        return np.zeros(0)
    key = f"probe.{name}"
    spec = {"sites": [{"key": key, "kind": "probe", "name": name}],
            "rows": [[len(ids) - 1, len(ids)] for ids in texts]}
    salt = secrets.token_hex(16)
    batches = (([TokensPrompt(prompt_token_ids=list(ids), cache_salt=salt) for ids in texts[i:i + batch_size]],
                [vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args={CAPTURE_KEY: i + j})
                 for j in range(len(texts[i:i + batch_size]))]) for i in range(0, len(texts), batch_size))
    _, answers = captured(llm, spec, batches)
    return answer_array(answers, key, f"probe {name}")[:, 0].astype(np.float64)


def captured(llm, spec: dict, batches) -> tuple[list, list[dict]]:
    """Run ``batches`` ((prompts, sampling params) pairs; a request read by the capture carries
    ``extra_args["steerc_capture"]``, its row) inside one capture: (the outputs, in order; every rank's
    answer). A row the engine never read is an :class:`EngineError`."""
    call(llm, "steerc_capture_begin", spec)
    outputs = []
    try:
        for prompts, params in batches:
            outputs += llm.generate(prompts, params, use_tqdm=False)
    finally:
        answers = call(llm, "steerc_capture_end")
    missing = answers[0].get("missing") or []
    if missing:
        raise EngineError(f"capture: {len(missing)} texts were never read (first: {missing[0]}); steerc misreads "
                          "this runner's batch layout")
    return outputs, answers


def answer_array(answers: list[dict], key: str, label: str):
    """One site's array from the ranks' answers (exactly one rank answers for each site)."""
    import numpy as np

    found = [a["sites"][key] for a in answers if key in a.get("sites", {})]
    if len(found) != 1:
        raise EngineError(f"capture: {len(found)} ranks answered for {label}, expected one")
    return np.frombuffer(found[0]["data"], dtype=np.float32).reshape(tuple(found[0]["shape"])).copy()
