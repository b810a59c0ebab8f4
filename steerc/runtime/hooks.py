"""The HF hook runtime: a forward's context, hook registration, ``generate`` wrapping, constraints.

This module imports torch and :mod:`steerc.runtime.kernels` only. The HF runtime
(:mod:`steerc.runtime.hf`) installs with it, and ``steerc compile --target hf`` copies it next to the
generated hook code as ``_hooks.py`` (this one import line rewritten to the package's ``_support``), so
an emitted package runs without steerc installed and installs exactly as the runtime does. What the
hooks compute per step (positions, scopes, probe readouts, gates, the kernel dispatch) is
:mod:`steerc.runtime.kernels`, which the vLLM runtime shares; this module is what only a transformers
model needs around it: positions from attention masks, prompt lengths held across ``generate``, the
check that every planned hook ran, and ``torch.compile`` guards.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from steerc.runtime import kernels as S  # steerc:support (the emitted package's `from . import _support as S`)

# -------------------------------------------------------------------- context


class Context:
    """What one forward pass knows about its tokens, plus state held across a generation."""

    def __init__(self, tokenizer=None, after_texts=(), constraint=None):
        self.tokenizer = tokenizer
        self.after_texts = tuple(after_texts)
        self.constraint = constraint  # a factory of logits processors, or None
        self.generating = False
        self.expect_prompt = False
        self.prompt_len = None  # [B] held during generate
        self.forced_prompt_len = None  # [B] under Handle.teacher_forced: where each row's prompt ends
        self.after_start: dict[str, torch.Tensor] = {}
        self.pending_after: dict[str, torch.Tensor] | None = None  # found by generate's wrapper, outside any graph
        self.held: dict[str, torch.Tensor] = {}  # pooled probe values, [B]
        self.carried_held: dict | None = None  # pooled values a new forward starts from (the export target's buffers)
        self.values: dict[str, torch.Tensor] = {}  # per-token probe values this forward, [B, T]
        self.pos = self.real = self.plen = None
        self._masks: dict = {}
        # the emitted package's per-request operands (S.bind) and gates with bound thresholds, by name
        self.bound: dict = {}
        self.bound_tensors = S.Tensors({})

    # called by the base model's pre-hook
    def begin_forward(self, input_ids, embeds, attention_mask, past_len: int = 0, position_ids=None) -> None:
        """Positions and padding of this forward's tokens.

        From a 2-D mask ``[batch, length]`` (ones for real tokens; the past's columns first, or none),
        positions are the real tokens counted. With a static cache transformers hands a 4-D mask
        ``[batch, 1, queries, keys]`` (or one per attention type) instead, and ``position_ids``: then
        positions are ``position_ids`` (transformers counts them the same way, from the 2-D mask) and a
        token is real when its query row attends to any key. Neither path reads the cache's length.
        """
        ref = input_ids if input_ids is not None else embeds
        batch, length = ref.shape[0], ref.shape[1]
        device = ref.device
        if isinstance(attention_mask, dict):  # one mask per attention type: the full one sees every key
            attention_mask = attention_mask.get("full_attention", next(iter(attention_mask.values()), None))
        if attention_mask is not None and not torch.is_tensor(attention_mask):
            raise ValueError(f"steerc reads the attention mask as a tensor, got {type(attention_mask).__name__}")
        if position_ids is not None and (attention_mask is None or attention_mask.dim() == 4):
            pos = position_ids.to(device=device, dtype=torch.long)
            if pos.dim() == 3:  # multimodal rotary sections: the text positions are the first
                pos = pos[0]
            pos = pos.reshape(-1, length).expand(batch, length).clamp_min(0)
            if attention_mask is None:
                real = torch.ones(batch, length, dtype=torch.bool, device=device)
            else:
                visible = attention_mask if attention_mask.dtype == torch.bool else \
                    attention_mask > torch.finfo(attention_mask.dtype).min / 2
                real = visible[:, 0].any(dim=-1).expand(batch, length)
            total = torch.where(real, pos + 1, torch.zeros_like(pos)).amax(dim=1)  # real tokens up to here
            self._start(input_ids, pos, real, total)
            return
        if attention_mask is None:
            mask = torch.ones(batch, past_len + length, dtype=torch.long, device=device)
        else:
            mask = attention_mask.to(device=device, dtype=torch.long)
            if mask.dim() != 2:
                raise ValueError("steerc needs a 2-D attention mask [batch, length] to count positions, or "
                                 "position_ids beside a 4-D one")
            if mask.shape[1] < past_len + length:
                pad = torch.ones(batch, past_len + length - mask.shape[1], dtype=torch.long, device=device)
                mask = torch.cat([pad, mask], dim=1)
        counts = mask.cumsum(dim=1)
        self._start(input_ids, (counts[:, -length:] - 1).clamp_min(0), mask[:, -length:].bool(), counts[:, -1])

    def _start(self, input_ids, pos, real, total) -> None:
        """This forward's positions ``pos`` and real tokens ``real`` ([B, T]); ``total`` ([B]) counts the
        real tokens up to its last, the prompt's length when this forward is a prompt."""
        batch = pos.shape[0]
        self.pos, self.real = pos, real
        new_prompt = not self.generating or self.expect_prompt or self.prompt_len is None
        if new_prompt:
            forced = self.forced_prompt_len
            if forced is not None and forced.shape[0] != batch:
                raise ValueError(f"teacher_forced() was given {forced.shape[0]} prompt lengths for a batch of {batch}")
            self.prompt_len = total.clone() if forced is None else forced.to(pos.device)
            self.held = dict(self.carried_held) if self.carried_held is not None else {}
            pending, self.pending_after = self.pending_after, None
            if pending is not None and all(v.shape[0] == batch for v in pending.values()):
                self.after_start = pending
            else:
                in_prompt = real if forced is None else real & (pos < self.prompt_len.unsqueeze(1))
                self._find_after(input_ids, in_prompt.long())
            self.expect_prompt = False
        elif self.prompt_len.shape[0] != batch:
            raise ValueError("the batch changed size during generation; steerc cannot follow rows")
        self.plen = self.prompt_len.unsqueeze(1)
        self.values = {}
        self._masks = {}

    def _find_after(self, input_ids, mask) -> None:
        self.after_start = {}
        if not self.after_texts:
            return
        if self.tokenizer is None or input_ids is None:
            raise ValueError("`tokens after \"...\"` needs the tokenizer: install(model, tokenizer)")
        for text in self.after_texts:
            starts = [_after_position(self.tokenizer, row[m.bool()].tolist(), text)
                      for row, m in zip(input_ids, mask)]
            self.after_start[text] = torch.tensor(starts, device=input_ids.device).unsqueeze(1)

    # scopes ---------------------------------------------------------------
    def scope_mask(self, scope: tuple):
        """[B, T] bool mask of a scope: a tuple of items (see steerc.targets.hooks.scope_data)."""
        mask = self._masks.get(scope)
        if mask is None:
            mask = torch.zeros_like(self.real)
            for item in scope:
                mask = mask | self._item_mask(item)
            mask = mask & self.real
            self._masks[scope] = mask
        return mask

    def _item_mask(self, item):
        if item[0] == "after":
            return self.pos >= self.after_start[item[1]]
        return S.position_mask(item, self.pos, self.plen)

    # probes and gates -----------------------------------------------------
    def record_probe(self, name: str, pool: str, kind: str, h, vector, bias: float, threshold: float = 0.0) -> None:
        """Read a probe at its site: per token, or on the hidden state pooled over the prompt.

        A pooled probe is decided by the forward pass whose chunk holds the
        prompt's last position (HF processes the whole prompt in that pass),
        then held for the rest of the sequence.
        """
        if pool == "token":
            self.values[name] = S.readout(kind, h, vector, bias, threshold)
            return
        in_prompt = self.real & (self.pos < self.plen)
        last = in_prompt & (self.pos == self.plen - 1)
        if pool == "prompt.last":
            pooled = (h * last.unsqueeze(-1)).sum(dim=1)
        else:
            count = in_prompt.sum(dim=1, keepdim=True).clamp_min(1)
            pooled = (h * in_prompt.unsqueeze(-1)).sum(dim=1) / count
        value = S.readout(kind, pooled, vector, bias, threshold)
        prev = self.held.get(name)
        if prev is None:
            prev = torch.full_like(value, float("nan"))
        self.held[name] = torch.where(last.any(dim=1), value, prev)

    def probe_value(self, name: str):
        """[B, T] values of a probe for gating: per token, or the held pooled value."""
        if name in self.values:
            return self.values[name]
        held = self.held.get(name)
        if held is None:
            return torch.full(self.pos.shape, float("nan"), device=self.pos.device)
        return held.unsqueeze(1).expand(self.pos.shape)

    def gate_mask(self, gate):
        """[B, T] bool of a gate expression (:func:`evaluate_gate` over this forward's probe values)."""
        return S.evaluate_gate(gate, self.probe_value)


def _after_position(tokenizer, ids: list[int], text: str) -> int:
    """First position after the token where the first occurrence of ``text`` ends."""
    if text not in tokenizer.decode(ids):
        return 1 << 60
    lo, hi = 1, len(ids)
    while lo < hi:  # smallest k with text in decode(ids[:k])
        mid = (lo + hi) // 2
        if text in tokenizer.decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


# ----------------------------------------------------------------------- facts

_CONFIG_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


def check_facts(model, facts: dict, model_types: tuple) -> None:
    """Refuse a model whose layout differs from the one the hooks were compiled for."""
    config = model.config
    if getattr(config, "model_type", None) not in model_types and getattr(config, "text_config", None) is not None:
        config = config.text_config
    problems = []
    model_type = getattr(config, "model_type", None)
    if model_type not in model_types:
        problems.append(f"family {model_type!r}, expected one of {model_types}")
    for fact, keys in _CONFIG_KEYS.items():
        value = next((getattr(config, k) for k in keys if getattr(config, k, None) is not None), None)
        if value != facts[fact]:
            problems.append(f"{fact} {value}, expected {facts[fact]}")
    if problems:
        raise RuntimeError("these steering hooks were compiled for another model: " + "; ".join(problems))


# ----------------------------------------------------------------------- hooks


def _past_length(kwargs) -> int:
    for key in ("cache", "past_key_values"):
        cache = kwargs.get(key)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
        if isinstance(cache, (tuple, list)) and cache and cache[0] is not None:
            return int(cache[0][0].shape[-2])
    cache_position = kwargs.get("cache_position")
    if cache_position is not None and cache_position.numel():
        return int(cache_position.reshape(-1)[0])
    return 0


def site_tensor(kind: str, tensor: str, args, kwargs, output):
    if kind == "pre":
        if tensor == "input1":
            return args[1] if len(args) > 1 else kwargs["hidden_states"]
        return args[0] if args else kwargs["hidden_states"]
    return output[0] if isinstance(output, tuple) else output


def _replace(kind: str, tensor: str, args, kwargs, output, new):
    if kind == "pre":
        key = 1 if tensor == "input1" else 0
        if len(args) > key:
            args = args[:key] + (new,) + args[key + 1 :]
        else:
            kwargs = dict(kwargs, hidden_states=new)
        return args, kwargs
    if isinstance(output, tuple):
        return (new,) + tuple(output[1:])
    return new


_ABSENT = object()  # no instance attribute


class Handle:
    """Installed steering: ``remove()`` it (idempotent) or use it as a context manager."""

    def __init__(self, model, context: Context):
        self.model = model
        self.context = context
        self._hooks = []
        self._generate = self._before = None  # install's wrapper, and the instance's own generate before it
        self.removed = False
        self.verified = False  # True once a forward has run every planned hook
        self._warm_up = None

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._generate is not None and vars(self.model).get("generate") is self._generate:
            if self._before is _ABSENT:
                del self.model.generate
            else:  # a wrapper that was there before install: put it back
                self.model.generate = self._before
        self._generate = self._before = None
        self.context.generating = False
        self.removed = True

    def warm_up(self) -> None:
        """Check, with one eager forward of one token, that every planned hook runs (raises
        :class:`HookNeverRan` naming those that do not). Eager forwards check themselves until one ran every
        hook; a compiled forward cannot (the check is Python state outside the graph), so ``generate`` calls
        this before its first call when the model's forward is compiled (``model.forward =
        torch.compile(model.forward)``, ``model.compile()``), and a compiled forward that meets an unchecked
        plan calls it from outside its graph (one graph break and one recompile, the first time only). Call it
        before compiling to have neither."""
        if not self.verified and self._warm_up is not None:
            self._warm_up()

    @contextlib.contextmanager
    def teacher_forced(self, prompt_lengths):
        """Forwards of whole sequences, prompt then completion, seen as ``generate`` sees them.

        Inside, each forward is a fresh sequence whose row ``i`` has its
        prompt in its first ``prompt_lengths[i]`` real tokens: the positions
        after them are generated tokens (scopes, schedules and per-token gates
        see them as such), pooled probes are decided on the prompt alone, and
        ``after "..."`` texts are looked for in the prompt alone. One forward
        then gives each completion token's logits as generating it would
        (``steerc eval`` scores completions this way; spec/eval.md).
        """
        if self.context.generating:
            raise RuntimeError("teacher_forced() inside generate()")
        self.context.forced_prompt_len = torch.as_tensor(prompt_lengths, dtype=torch.long).reshape(-1)
        try:
            yield self
        finally:
            self.context.forced_prompt_len = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def forget_compiled(model) -> None:
    """Make torch.compile see hooks that are added or removed.

    Dynamo does not guard on module hooks by default (``skip_nnmodule_hook_guards``), so a graph traced
    before ``install`` would run unsteered and one traced before ``remove`` would go on steering, silently;
    and two models of one class compiled with different hooks would share a graph. So the guards are turned
    on, once, and the compiled code traced without them (of the model's forwards, and of
    ``nn.Module.__call__``, which ``torch.compile(model)`` compiles) is dropped. From then on the guards
    see every change of hooks: the next compiled call traces the hooks as they are, and graphs of other
    models stay.
    """
    try:
        import torch._dynamo as dynamo
    except ImportError:
        return
    if not getattr(dynamo.config, "skip_nnmodule_hook_guards", False):
        return
    dynamo.config.skip_nnmodule_hook_guards = False
    reset = getattr(dynamo, "reset_code", None)
    if reset is None:
        return
    codes = {torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__}
    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        if getattr(forward, "__code__", None) is not None:
            codes.add(forward.__code__)
        original = getattr(vars(module).get("forward"), "_torchdynamo_orig_callable", None)
        if getattr(original, "__code__", None) is not None:
            codes.add(original.__code__)
    for code in codes:
        reset(code)


class HookNeverRan(RuntimeError):
    """A forward after ``install`` did not go through a module the plan hooks: steering would silently not
    apply, so the forward is refused instead."""


def install(model, base_path: str, hooks, context: Context, family: str = "?") -> Handle:
    """Register ``hooks`` ([(module path, kind, tensor, fn(h, ctx) -> h)]) and the context hook.

    Steering hooks are prepended so transformers' own output capturing (and
    ``output_hidden_states``) sees the steered values.

    No silent no-op: until one forward of the model has run every hook, each
    forward checks at its end that all of them ran, and raises
    :class:`HookNeverRan` naming the modules that were skipped, the family and
    the transformers version (a module the model's forward no longer goes
    through, as when a transformers release reroutes a layer). Once a forward
    has run them all, the check is removed.
    """
    handle = Handle(model, context)
    ran = [False] * len(hooks)
    forget_compiled(model)
    try:
        base = model.get_submodule(base_path)
        params = list(inspect.signature(base.forward).parameters)

        def begin(module, args, kwargs):
            bound = dict(zip(params, args))
            bound.update(kwargs)
            mask, position_ids = bound.get("attention_mask"), bound.get("position_ids")
            tensors = position_ids is not None and not (torch.is_tensor(mask) and mask.dim() == 2)
            if not handle.verified:
                if torch.compiler.is_compiling():  # the check is Python state: it runs eagerly, outside the graph
                    torch.compiler.disable(handle.warm_up)()
                else:
                    ran[:] = [False] * len(ran)
            context.begin_forward(bound.get("input_ids"), bound.get("inputs_embeds"), mask,
                                  0 if tensors else _past_length(bound), position_ids)

        handle._hooks.append(base.register_forward_pre_hook(begin, with_kwargs=True, prepend=True))
        for i, (path, kind, tensor, fn) in enumerate(hooks):
            module = model.get_submodule(path)
            handle._hooks.append(_register(module, kind, tensor, _counted(fn, ran, i), context))
        outer = base if all(_inside(path, base_path) for path, *_ in hooks) else model
        checker = []

        def end(module, args, output):
            missing = [(path, kind) for (path, kind, *_), done in zip(hooks, ran) if not done]
            if missing:
                raise HookNeverRan(_never_ran(missing, family))
            handle.verified = True
            checker[0].remove()

        checker.append(outer.register_forward_hook(end))
        handle._hooks.append(checker[0])

        def warm_up():
            # the outer module's own forward through its hooks; a compiled forward set on the instance
            # (model.forward = torch.compile(model.forward)) or by model.compile() is stepped around
            device = next(iter(model.parameters())).device
            override = vars(outer).pop("forward", None)
            try:
                with torch.no_grad():
                    torch.nn.Module._call_impl(outer, input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
                                               use_cache=False)
            finally:
                if override is not None:
                    outer.forward = override

        handle._warm_up = warm_up
        _wrap_generate(model, handle)
    except Exception:
        handle.remove()
        raise
    return handle


def _counted(fn, ran: list, i: int):
    def counted(h, ctx):
        if not torch.compiler.is_compiling():  # the check runs eagerly (Handle.warm_up): no Python state in a graph
            ran[i] = True
        return fn(h, ctx)

    return counted


def _inside(path: str, base_path: str) -> bool:
    return not base_path or path == base_path or path.startswith(base_path + ".")


def _never_ran(missing, family: str) -> str:
    try:
        import transformers

        version = transformers.__version__
    except ImportError:
        version = "?"
    where = ", ".join(f"{path} ({'forward pre-hook' if kind == 'pre' else 'forward hook'})"
                      for path, kind in missing[:6])
    more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
    return (f"steerc: {len(missing)} planned hook(s) never ran in this forward of the {family!r} model "
            f"(transformers {version}): {where}{more}. The model's forward does not go through these modules, "
            "so the steering would silently not apply; nothing was generated with it. Check the module paths "
            "with `steerc facts MODEL --backend hf` against the model (print(model)), and report the family and "
            "the transformers version")


def _register(module, kind: str, tensor: str, fn, context: Context):
    if kind == "pre":
        def pre(mod, args, kwargs):
            h = site_tensor(kind, tensor, args, kwargs, None)
            return _replace(kind, tensor, args, kwargs, None, fn(h, context))

        return module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)

    def post(mod, args, output):
        h = site_tensor(kind, tensor, args, None, output)
        return _replace(kind, tensor, args, None, output, fn(h, context))

    return module.register_forward_hook(post, prepend=True)


# ---------------------------------------------------------------- constraints


def choice_grammar(options) -> str:
    import json

    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options) + "\n"


def constraint_factory(tokenizer, vocab_size: int, constraint: tuple):
    """A function making a fresh xgrammar logits processor for each ``generate`` call.

    ``constraint`` is (kind, value): ("json_schema", schema JSON text), ("regex",
    pattern), ("grammar", EBNF) or ("choice", options). JSON comes out compact
    (no free whitespace), as on every steerc target.
    """
    try:
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor
    except ImportError:
        raise ImportError("this steering constrains its output: install xgrammar (pip install 'steerc[guided]')") \
            from None
    if tokenizer is None:
        raise ValueError("an output constraint needs the tokenizer: install(model, tokenizer)")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info)
    kind, value = constraint
    if kind == "json_schema":
        compiled = compiler.compile_json_schema(value, any_whitespace=False, separators=(",", ":"))
    elif kind == "regex":
        compiled = compiler.compile_regex(value)
    elif kind == "grammar":
        compiled = compiler.compile_grammar(value)
    else:
        compiled = compiler.compile_grammar(choice_grammar(value))
    return lambda: LogitsProcessor(compiled)


def _with_processor(kwargs: dict, processor) -> dict:
    existing = kwargs.get("logits_processor")
    if existing is None:
        from transformers import LogitsProcessorList

        existing = LogitsProcessorList()
    merged = type(existing)(list(existing) + [processor])
    return dict(kwargs, logits_processor=merged)


def _wrap_generate(model, handle: Handle) -> None:
    original = model.generate
    context = handle.context

    def generate(*args, **kwargs):
        if not handle.verified and ("forward" in vars(model) or getattr(model, "_compiled_call_impl", None)):
            handle.warm_up()  # a forward compiled by the user: the check runs before it, eagerly
        if context.constraint is not None:
            kwargs = _with_processor(kwargs, context.constraint())
        ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
        if context.after_texts and torch.is_tensor(ids) and ids.dim() == 2:  # outside the graph: decoding is Python
            mask = kwargs.get("attention_mask")
            real = mask.to(ids.device).long() if torch.is_tensor(mask) and mask.shape == ids.shape else \
                torch.ones_like(ids)
            context._find_after(ids, real)
            context.pending_after = context.after_start
        context.generating = True
        context.expect_prompt = True
        try:
            return original(*args, **kwargs)
        finally:
            context.generating = False
            context.prompt_len = None
            context.pending_after = None

    generate.__doc__ = original.__doc__
    handle._before = vars(model).get("generate", _ABSENT)
    handle._generate = generate
    model.generate = generate
