"""The steering computation inside a vLLM worker: buffers and hooks (torch only).

:class:`SteerState` is an ``nn.Module`` attached to the model (as
``model.steerc``), so its buffers are part of the model: torch.compile lifts
them as graph inputs and CUDA graphs capture their fixed addresses. The hooks
compute with fixed-shape tensor operations only (no ``.item()``, no Python
branch on data), reading:

* the plan's buffers (vectors, scales, angles, targets, biases, thresholds);
* per-token metadata written before every step by the worker (outside the
  graph): ``pos`` (position in the sequence), ``plen`` (the request's prompt
  length), ``slot`` (the request's persistent slot), ``valid`` (not padding);
* per-slot probe state for pooled probes (sums over the prompt, held values),
  updated in place with ``index_add_``/``scatter_``, so a prompt split over
  several chunked-prefill steps is pooled whole;
* per-token probe values, written by a probe's hook and read by the gated
  kernels after it in the same forward.

Kernels, probe readouts and the gate evaluator are those of
:mod:`steerc.runtime.kernels`, shared with the HF target, so the two compute
the same values; this module holds only where its values live.
"""

from __future__ import annotations

import torch

from steerc.ir.kernels import KINDS
from steerc.runtime import kernels as S


def buffer_name(name: str) -> str:
    return "p_" + name.replace(".", "__")


class SteerState(torch.nn.Module):
    """Everything the steering hooks read, as registered (non-persistent) buffers."""

    def __init__(self, boot: dict, tensors: dict, *, max_tokens: int, max_slots: int, width: int,
                 dtype: torch.dtype, device):
        super().__init__()
        self.boot = boot
        self.dtype = dtype
        self.max_tokens = max_tokens
        self.max_slots = max_slots
        long = {"dtype": torch.long, "device": device}
        self.register_buffer("pos", torch.zeros(max_tokens, **long), persistent=False)
        self.register_buffer("plen", torch.zeros(max_tokens, **long), persistent=False)
        self.register_buffer("slot", torch.full((max_tokens,), max_slots, **long), persistent=False)
        self.register_buffer("valid", torch.zeros(max_tokens, dtype=torch.bool, device=device), persistent=False)
        self.register_buffer("enabled", torch.ones(1, dtype=torch.bool, device=device), persistent=False)
        # How often each hook ran, counted inside the graph: a hook that never runs is an error.
        self.register_buffer("fired", torch.zeros(max(1, len(boot["hooks"])), dtype=torch.long, device=device),
                             persistent=False)
        for name, value in tensors.items():
            self.register_buffer(buffer_name(name), torch.tensor(value).to(device=device, dtype=dtype),
                                 persistent=False)
        self.pooled = sorted({p["name"] for p in boot["probes"] if p["pool"] != "token"})
        self.per_token = sorted({p["name"] for p in boot["probes"] if p["pool"] == "token"})
        for name in self.pooled:  # one extra slot absorbs writes from padding tokens
            self.register_buffer(f"held_{name}", torch.full((max_slots + 1,), float("nan"), dtype=dtype,
                                                            device=device), persistent=False)
            self.register_buffer(f"acc_{name}", torch.zeros(max_slots + 1, width, dtype=dtype, device=device),
                                 persistent=False)
            self.register_buffer(f"cnt_{name}", torch.zeros(max_slots + 1, dtype=dtype, device=device),
                                 persistent=False)
        for name in self.per_token:
            self.register_buffer(f"tok_{name}", torch.zeros(max_tokens, dtype=dtype, device=device),
                                 persistent=False)

    # -------------------------------------------------------------- host side
    def buffer(self, name: str):
        return getattr(self, buffer_name(name))

    @torch.no_grad()
    def write_state(self, tensors: dict) -> None:
        """Copy new values into the installed buffers, in place (same shapes)."""
        for name, value in tensors.items():
            self.buffer(name).copy_(torch.tensor(value))

    @torch.no_grad()
    def write_metadata(self, pos, plen, slot, valid) -> None:
        n = len(pos)
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens in one step is over the {self.max_tokens} steerc was sized for")
        self.pos[:n].copy_(torch.as_tensor(pos), non_blocking=True)
        self.plen[:n].copy_(torch.as_tensor(plen), non_blocking=True)
        self.slot[:n].copy_(torch.as_tensor(slot), non_blocking=True)
        self.valid[:n].copy_(torch.as_tensor(valid), non_blocking=True)
        self.valid[n:].fill_(False)
        self.slot[n:].fill_(self.max_slots)

    @torch.no_grad()
    def reset_slots(self, slots) -> None:
        """Forget the pooled probe state of slots that now hold new requests."""
        if not len(slots) or not self.pooled:
            return
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.pos.device)
        for name in self.pooled:
            getattr(self, f"held_{name}").index_fill_(0, index, float("nan"))
            getattr(self, f"acc_{name}").index_fill_(0, index, 0.0)
            getattr(self, f"cnt_{name}").index_fill_(0, index, 0.0)

    # ------------------------------------------------------- in the graph
    def scope_mask(self, scope, n: int):
        pos, plen = self.pos[:n], self.plen[:n]
        mask = torch.zeros(n, dtype=torch.bool, device=pos.device)
        for item in scope:
            mask = mask | S.position_mask(tuple(item), pos, plen)
        return mask & self.valid[:n] & self.enabled

    def gate_mask(self, gate, n: int):
        """[n] bool of a boot gate: the shared evaluator (:func:`~steerc.runtime.kernels.evaluate_gate`) over
        this step's probe values, each comparison's threshold an entry of the thresholds buffer."""
        return S.evaluate_gate(gate, lambda name: self.probe_value(name, n),
                               lambda i: self.buffer("gates.thresholds")[i])

    def probe_value(self, name: str, n: int):
        if name in self.per_token:
            return getattr(self, f"tok_{name}")[:n]
        return getattr(self, f"held_{name}")[self.slot[:n]]

    def record_probe(self, probe: dict, x, n: int) -> None:
        vector = self.buffer(probe["tensor"]) if probe["tensor"] is not None else None
        bias = self.buffer(probe["bias"])[0]
        threshold = self.buffer(probe["threshold"])[0] if "threshold" in probe else 0.0
        name = probe["name"]
        if probe["pool"] == "token":
            getattr(self, f"tok_{name}")[:n].copy_(S.readout(probe["kind"], x, vector, bias, threshold))
            return
        pos, plen, slot = self.pos[:n], self.plen[:n], self.slot[:n]
        in_prompt = self.valid[:n] & (pos < plen)
        last = in_prompt & (pos == plen - 1)
        if probe["pool"] == "prompt.last":
            pooled = x
        else:
            acc, cnt = getattr(self, f"acc_{name}"), getattr(self, f"cnt_{name}")
            acc.index_add_(0, slot, x * in_prompt.unsqueeze(-1).to(x.dtype))
            cnt.index_add_(0, slot, in_prompt.to(x.dtype))
            pooled = acc[slot] / cnt[slot].clamp_min(1.0).unsqueeze(-1)
        value = S.readout(probe["kind"], pooled, vector, bias, threshold)
        target = torch.where(last, slot, torch.full_like(slot, self.max_slots))
        getattr(self, f"held_{name}").scatter_(0, target, value)


def operands(state: SteerState, k: dict) -> dict:
    """A kernel's operands by role, read from the state's buffers (what its kind's maths takes)."""
    kind = KINDS[k["kind"]]
    o = {}
    for role, name in k["tensors"].items():
        if role != "schedule":  # a one-number operand is a [1] buffer: its value is the buffer's element
            o[role] = state.buffer(name)[0] if kind.operand(role).shape == "1" else state.buffer(name)
    return o


def _kernel(state: SteerState, k: dict, x, n: int):
    kind = KINDS[k["kind"]]
    mask = state.scope_mask(state.boot["scopes"][k["scope"]], n)
    if k["gate"] is not None:
        mask = mask & state.gate_mask(state.boot["gates"][k["gate"]], n)
    o = operands(state, k)
    if k.get("schedule"):
        o["factor"] = S.schedule_factor(k["schedule"], state.buffer(k["tensors"]["schedule"]), state.pos[:n],
                                        state.plen[:n])
    return S.steer(kind.maths, x, o, k["mode"], mask, k["preserve_norm"])


def site_function(state: SteerState, sites: list[dict], index: int | None = None):
    """``fn(h) -> h``: the probes and kernels of one hook, on a [tokens, width] view.

    With ``index``, each call also counts itself in ``state.fired[index]``.
    """

    def fn(h):
        if index is not None:
            state.fired[index] += 1
        shape = h.shape
        x = h.reshape(-1, shape[-1]).to(state.dtype, copy=True)
        n = x.shape[0]
        for site in sites:
            cols = site.get("local_columns")
            part = x[:, cols[0]:cols[1]] if cols else x
            for probe in site["probes"]:
                state.record_probe(probe, part, n)
            for k in site["kernels"]:
                part = _kernel(state, k, part, n)
            if cols:
                x[:, cols[0]:cols[1]] = part
            else:
                x = part
        return x.to(h.dtype).reshape(shape)

    fn.dtype = state.dtype
    return fn


def register(module, hook: dict, fn):
    """Register ``fn`` on ``module`` per the hook's kind and tensor (vLLM call forms)."""
    kind, tensor = hook["kind"], hook["tensor"]
    if kind == "pre":
        index = 1 if tensor == "input1" else 0

        def pre(mod, args, kwargs):
            if len(args) > index:
                return args[:index] + (fn(args[index]),) + args[index + 1:], kwargs
            return args, dict(kwargs, hidden_states=fn(kwargs["hidden_states"]))

        return module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)

    def post(mod, args, output):
        if tensor == "fused_pair":
            hidden, residual = output[0], output[1]
            total = hidden.to(fn.dtype) if residual is None else hidden.to(fn.dtype) + residual.to(fn.dtype)
            steered = fn(total).to(hidden.dtype)
            # The next layer's fused add-norm sums the pair: (steered, 0) is the stream, exactly.
            return steered, (torch.zeros_like(residual) if residual is not None else None)
        if isinstance(output, tuple):
            return (fn(output[0]),) + tuple(output[1:])
        return fn(output)

    return module.register_forward_hook(post, prepend=True)
