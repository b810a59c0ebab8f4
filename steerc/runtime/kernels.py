"""What a steering hook computes, on both engines: positions, scopes, probe readouts, gates, the kernel dispatch.

This module imports only torch. It is the bottom of both runtimes: the HF
runtime (:mod:`steerc.runtime.hf`, installing with :mod:`steerc.runtime.hooks`)
and the vLLM one (:mod:`steerc.runtime.vllm.steer`) compute with it, and
``steerc compile --target hf`` copies it verbatim next to the generated hook
code as ``_support.py``, so an emitted package runs without steerc installed
and computes with the very same functions.

It is the one seat of the steering arithmetic around the kernels: the one
dispatch of a kernel (:func:`steer`, which runs a kernel kind's maths from
:mod:`steerc.ir.kernels`: the package carries their source in its
``__init__.py``), the probe readouts (:func:`readout`) and the gate
evaluator (:func:`evaluate_gate`) are written here once, and each runtime
(and a vLLM request's receipt) keeps only where its probe values and
positions live.

Positions count per sequence from its first real token (left padding is
never a position and is never modified). ``P`` is a row's prompt length: the
real tokens of the first forward inside ``generate``; outside generation,
every real token of the forward. Positions come from the attention mask, so
they are the same with and without a KV cache and in any batch.
"""

from __future__ import annotations

import inspect
import math  # noqa: F401 - S.math, for the kernels' maths

import torch

# ----------------------------------------------------------------- kernels
# h is [..., width]; parameters are already on h's device in the compute dtype.


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision activations are steered in float32, then cast back."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def schedule_factor(kinds, params, pos, plen):
    """A schedule's value at each position: the product of its factors at step ``n = pos - (plen - 1)``.

    ``kinds`` names the factors; ``params`` ([m, 2], the compute dtype) holds their numbers:
    ramp (n, -): min(1, (step + 1) / n); decay (r, -): r ** step; window (a, b): 1 for a <= step < b.
    Steps before 0 count as 0 (a schedule never steers them: the checker makes sure).
    """
    steps = (pos - plen + 1).clamp_min(0).to(params.dtype)
    out = torch.ones_like(steps)
    for i, kind in enumerate(kinds):
        a, b = params[i, 0], params[i, 1]
        if kind == "ramp":
            out = out * torch.clamp((steps + 1.0) / a, max=1.0)
        elif kind == "decay":
            out = out * torch.pow(a, steps)
        else:
            out = out * ((steps >= a) & (steps < b)).to(params.dtype)
    return out


def steer(kernel, x, operands, mode, mask, keep_norm: bool = False):
    """One kernel on ``x`` where ``mask`` holds: the one dispatch of every runtime and the emitted package.

    ``kernel`` is a kernel kind's maths (``steerc.ir.kernels``: ``kernel(S, x, operands, mode)``, with this
    module as ``S``); ``operands`` its values by role on ``x``'s device and dtype (numbers stay numbers),
    with ``factor`` when a schedule scales it; ``keep_norm`` rescales the result to ``x``'s norm
    (``preserve norm``).
    """
    new = kernel(_SELF, x, operands, mode)
    if keep_norm:
        new = preserve_norm(x, new)
    return select(mask, new, x)


_SELF = inspect.getmodule(compute_dtype)  # this module: what a kernel's maths calls S


def preserve_norm(before, after):
    """Rescale ``after`` to the norm of ``before`` at each position (zero stays zero)."""
    n_after = after.norm(dim=-1, keepdim=True)
    n_before = before.norm(dim=-1, keepdim=True)
    factor = torch.where(n_after > 0, n_before / torch.where(n_after > 0, n_after, 1.0), 1.0)
    return after * factor


class Tensors:
    """Named float32 tensors, cast on first use to each device and dtype they meet."""

    def __init__(self, tensors: dict):
        self._base = {k: v.float() for k, v in tensors.items()}
        self._cache: dict = {}

    def get(self, name: str, like):
        key = (name, like.device, like.dtype)
        t = self._cache.get(key)
        if t is None:
            t = self._base[name].to(device=like.device, dtype=like.dtype)
            self._cache[key] = t
        return t

    def names(self):
        return sorted(self._base)

    def raw(self, name: str):
        """The tensor as stored (float32, on the CPU)."""
        return self._base[name]


def bind(tensors: Tensors, rows, values) -> tuple[dict, Tensors]:
    """The emitted package's per-request operands at ``values`` (``install(params=...)``): per row
    ``(slot, param, coefficient, shape)``, ``coefficient * value`` as ``steerc.ir.plan.rebind`` computes it:
    a number times the value (a scalar slot when ``shape`` is None, else a float32 tensor of that shape),
    or a stored float32 coefficient tensor (``coefficient`` its name) times the value in float64, then
    float32. Returns (scalars by slot, the tensors by slot)."""
    scalars, bound = {}, {}
    for slot, param, coefficient, shape in rows:
        value = values[param]
        if isinstance(coefficient, str):
            bound[slot] = (tensors.raw(coefficient).double() * value).float()
        elif shape is None:
            scalars[slot] = coefficient * value
        else:
            bound[slot] = torch.full(shape, coefficient * value, dtype=torch.float32)
    return scalars, Tensors(bound)


def select(mask, new, old):
    """``new`` where ``mask`` ([B, T]) is set, else ``old``."""
    return torch.where(mask.unsqueeze(-1), new, old)


# ------------------------------------------------------------------ readouts


def readout(kind: str, h, vector, bias: float, threshold: float = 0.0):
    """A probe's value for each row of ``h`` ([..., d] -> [...]).

    ``vector`` is the probe's vector ([d]) for ``dot`` and ``cosine``, the
    orthonormal basis ``Q`` ([k, d]) for ``projected_cosine`` and
    ``subspace_cosine``, None for ``norm``. With ``P = Qᵀ Q`` the projector
    onto the basis' span: ``projected_cosine`` is CAST's condition,
    ``cos(h, tanh(P h))``; ``subspace_cosine`` is ``cos(h, P h)``.
    ``sae_feature`` is an SAE feature's activation, ``vector`` the rows
    ``[W_enc[:, i], b_dec]``, ``bias`` ``b_enc[i]``: ``relu(pre) * [pre >
    threshold]`` with ``pre = (h - b_dec) . W_enc[:, i] + b_enc[i]``, as
    ``clamp feature`` computes ``f_i`` (a standard SAE's threshold is 0).
    """
    if kind == "norm":
        return h.norm(dim=-1)
    if kind == "dot":
        return h @ vector + bias
    if kind == "sae_feature":
        pre = (h - vector[1]) @ vector[0] + bias
        return torch.relu(pre) * (pre > threshold).to(pre.dtype)
    if kind == "cosine":
        return (h @ vector) / (h.norm(dim=-1) * vector.norm()).clamp_min(1e-30)
    ph = (h @ vector.T) @ vector
    if kind == "projected_cosine":
        ph = torch.tanh(ph)
    return (h * ph).sum(-1) / (h.norm(dim=-1) * ph.norm(dim=-1)).clamp_min(1e-30)


# The readouts in one batched form, for tables holding a probe per row (the vLLM serve plugin's plan tables):
# a row is (U [d, r], off, p, code), and every row of a batch may read another kind.
READOUT_CODES = {"dot": 0, "cosine": 1, "norm": 2, "sae_feature": 3, "subspace_cosine": 4, "projected_cosine": 5}


def readout_row(kind: str, vector, bias: float, threshold: float = 0.0) -> dict:
    """A probe as a row for :func:`readout_rows` (``vector`` as :func:`readout` takes it, None for ``norm``):
    dot ``U = v``, value ``c0 + off``; cosine ``U = v``, ``p = |v|``; SAE feature ``U = W_enc[:, i]``, ``off =
    b_enc[i] - b_dec . W_enc[:, i]``, ``p`` its threshold; subspace and projected cosine ``U = Qᵀ``."""
    row = {"code": READOUT_CODES[kind], "off": float(bias), "p": 0.0}
    if kind == "norm":
        row["U"] = torch.zeros(1, 1)
    elif kind in ("dot", "cosine"):
        row["U"] = vector.reshape(-1, 1)
        row["p"] = float(vector.norm()) if kind == "cosine" else 0.0
    elif kind == "sae_feature":
        row["U"] = vector[0].reshape(-1, 1)
        row["off"], row["p"] = float(bias) - float(vector[1] @ vector[0]), float(threshold)
    else:
        row["U"] = vector.T
    return row


def readout_rows(h, U, off, p, code, codes=None):
    """Each row of ``h`` ([n, d]) read by its own probe row (``U`` [n, d, r], ``off``, ``p``, ``code`` [n]):
    :func:`readout`'s values, batched. ``c = h U``; dot ``c0 + off``; cosine ``c0 / (|h| p)``; norm ``|h|``;
    SAE feature ``relu(c0 + off) [c0 + off > p]``; subspace / projected cosine ``cos(h, c Uᵀ)``, ``tanh`` of
    ``c Uᵀ`` for projected. ``codes`` (a set of :data:`READOUT_CODES` values; None: every one) the host knows
    the rows hold: only those readouts are computed (a row with another code gets some other readout)."""
    def need(*which):
        return codes is None or any(k in codes for k in which)

    subspace = need(4, 5)
    c = (h.unsqueeze(-1) * (U if subspace else U[:, :, :1])).sum(1)  # the others read the first column only
    norm = h.norm(dim=-1) if need(1, 2, 4, 5) else None
    pre = c[:, 0] + off
    out = None
    if subspace:
        ph = (c.unsqueeze(1) * U).sum(-1)
        ph = torch.where((code == READOUT_CODES["projected_cosine"]).unsqueeze(-1), torch.tanh(ph), ph)
        out = (h * ph).sum(-1) / (norm * ph.norm(dim=-1)).clamp_min(1e-30)
    readouts = {0: lambda: pre, 1: lambda: c[:, 0] / (norm * p).clamp_min(1e-30), 2: lambda: norm,
                3: lambda: torch.relu(pre) * (pre > p).to(pre.dtype)}
    for k in (3, 2, 1, 0):  # innermost first: where(code == 0, dot, where(code == 1, cosine, ...))
        if need(k):
            out = readouts[k]() if out is None else torch.where(code == k, readouts[k](), out)
    return out


# ------------------------------------------------------------------ positions


def position_mask(item: tuple, pos, plen):
    """Which positions a scope item selects: ``pos`` and ``plen`` broadcast together.

    Items: ("all",), ("prompt", start, stop), ("generated", start, stop) with
    Python slice rules over the prompt and over the generated positions,
    ("positions", (i, ...)). ``plen`` is each position's prompt length.
    """
    kind = item[0]
    if kind == "all":
        return torch.ones_like(pos, dtype=torch.bool)
    if kind == "prompt":
        start, stop = item[1], item[2]
        if start is None:
            lo = torch.zeros_like(plen)
        elif start < 0:
            lo = (plen + start).clamp_min(0)
        else:
            lo = torch.full_like(plen, start)
        if stop is None:
            hi = plen
        elif stop < 0:
            hi = (plen + stop).clamp_min(0)
        else:
            hi = torch.minimum(torch.full_like(plen, stop), plen)
        return (pos >= lo) & (pos < hi)
    if kind == "generated":
        g = pos - plen
        start, stop = item[1] or 0, item[2]
        inside = g >= start
        return inside if stop is None else inside & (g < stop)
    if kind == "positions":
        return torch.isin(pos, torch.tensor(item[1], device=pos.device))
    raise ValueError(f"unknown scope {kind}")


# ---------------------------------------------------------------------- gates


def compare(values, op: str, threshold):
    """``values OP threshold``; NaN (a probe not decided yet) compares false."""
    if op == "<":
        out = values < threshold
    elif op == "<=":
        out = values <= threshold
    elif op == ">":
        out = values > threshold
    else:
        out = values >= threshold
    return out & ~torch.isnan(values)


COMPARE_OPS = ("<", "<=", ">", ">=")


def compare_rows(values, op, threshold, ops=None):
    """:func:`compare` with an operator per element (``op``: an index into :data:`COMPARE_OPS`); ``ops``, the
    codes the host knows ``op`` holds where it matters (None: any; an element with another code gets one of
    ``ops``'s, as a gate's unused comparisons do: its truth table ignores them)."""
    codes = range(len(COMPARE_OPS)) if ops is None else sorted(ops)
    out = None
    for code in codes:
        held = compare(values, COMPARE_OPS[code], threshold)
        out = held if out is None else torch.where(op == code, held, out)
    return out


def gate_rows(values, q, op, threshold, truth, ops=None):
    """Each row's gate from a table (the vLLM serve plugin's): its comparisons (probe ``q``, ``op``,
    ``threshold``, [n, c]) on the probe values ([n, probes]), then its truth table ([n, 2 ** c], the gate's
    value for each pattern of its comparisons, written by the host from the gate's expression) at the pattern
    they make. Any ``and``/``or``/``not`` costs one lookup. ``ops``: as :func:`compare_rows`'s."""
    held = compare_rows(values.gather(1, q), op, threshold, ops)
    weights = torch.pow(2, torch.arange(q.shape[1], device=q.device))
    return truth.gather(1, (held.long() * weights).sum(1, keepdim=True)).squeeze(1)


def evaluate_gate(gate, value, threshold=None):
    """Where a gate holds: the one gate evaluator of every runtime (the HF context, the emitted package,
    the vLLM buffers and a vLLM request's receipt), so they cannot decide a gate differently.

    ``gate`` is data: ``("cmp", probe, op, x)``, ``("and"|"or", parts)``, ``("not", g)`` (tuples or
    lists). The caller supplies what it holds: ``value(probe)``, the probe's values at the positions
    asked about (per token, or a pooled value already spread over its sequence's positions; NaN where
    it is not decided yet), and ``threshold(x)``, a comparison's threshold from its ``x`` (None: ``x``
    itself, a number; the vLLM buffers hold an index into their thresholds). Returns a bool tensor of the
    probe values' shape (``and``/``or`` broadcast their parts together).
    """
    kind = gate[0]
    if kind == "cmp":
        return compare(value(gate[1]), gate[2], gate[3] if threshold is None else threshold(gate[3]))
    if kind == "not":
        return ~evaluate_gate(gate[1], value, threshold)
    parts = [evaluate_gate(g, value, threshold) for g in gate[1]]
    out = parts[0]
    for p in parts[1:]:
        out = out & p if kind == "and" else out | p
    return out
