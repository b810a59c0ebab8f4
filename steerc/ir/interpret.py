"""Reference semantics of plan kernels and gates, in numpy float64.

This is the definition every runtime is tested against: the HF hooks, the
emitted package and the vLLM buffers must compute what these functions
compute. ``h`` is ``[positions, width]``; ``mask`` says which positions a
kernel's scope and gate select.

>>> import numpy as np
>>> from steerc.ir.plan import Affine, Kernel
>>> from steerc.ir.values import Vec
>>> k = Kernel(Affine(2.0, Vec([1.0, 1.0])), scope=())
>>> apply_kernel(k, np.array([[1.0, 0.0], [5.0, 5.0]]), np.array([True, False]))
array([[3., 1.],
       [5., 5.]])
"""

from __future__ import annotations

import numpy as np

from steerc.ir.checked import GateAll, GateCompare, GateNegate
from steerc.ir.kernels.loreft import LoReFT
from steerc.ir.kernels.sae_clamp import SaeClamp
from steerc.ir.plan import Affine, Kernel, Project, Rotate


def _arr(v) -> np.ndarray:
    return v.array.astype(np.float64)


def schedule_factor(schedule, steps) -> np.ndarray:
    """The product of a schedule's factors at generation steps ``steps`` (``n = p - (P - 1)``).

    ``ramp(n)``: min(1, (step + 1) / n); ``decay(r)``: r ** step; ``window(a, b)``: 1 for a <= step < b.
    Steps before 0 (prompt positions a schedule never steers) count as step 0.

    >>> schedule_factor((("decay", 0.5, 0.0), ("ramp", 2.0, 0.0)), np.array([0, 1, 2]))
    array([0.5 , 0.5 , 0.25])
    """
    steps = np.maximum(np.asarray(steps, dtype=np.float64), 0.0)
    out = np.ones_like(steps)
    for kind, a, b in schedule:
        if kind == "ramp":
            out = out * np.minimum((steps + 1.0) / a, 1.0)
        elif kind == "decay":
            out = out * np.power(a, steps)
        else:
            out = out * ((steps >= a) & (steps < b))
    return out


def apply_op(op, h: np.ndarray, steps=None) -> np.ndarray:
    """``op`` on the rows of ``h``; ``steps`` (per row) for an affine kernel with a schedule."""
    if isinstance(op, Affine):
        scale = _arr(op.scale) if not isinstance(op.scale, float) else op.scale
        out = h * scale
        if op.bias is None:
            return out
        bias = _arr(op.bias)
        if op.schedule:
            return out + schedule_factor(op.schedule, steps)[:, None] * bias
        return out + bias
    if isinstance(op, Project):
        if not op.basis:
            return h.copy()
        q = np.stack([_arr(b) for b in op.basis])  # [k, d]
        coeff = h @ q.T  # [n, k]
        if op.target is not None:
            coeff = coeff - np.asarray(op.target, dtype=np.float64)
        return h - coeff @ q
    if isinstance(op, Rotate):
        e1, e2 = _arr(op.e1), _arr(op.e2)
        a, b = h @ e1, h @ e2
        if op.mode == "to":
            rho = np.sqrt(a * a + b * b)
            a2, b2 = rho * np.cos(op.angle), rho * np.sin(op.angle)
        else:
            c, s = np.cos(op.angle), np.sin(op.angle)
            a2, b2 = a * c - b * s, a * s + b * c
        return h + np.outer(a2 - a, e1) + np.outer(b2 - b, e2)
    if isinstance(op, LoReFT):
        # pyreft's LoReFT, as the paper writes it: h + Rᵀ (W h + b − R h), one position at a time.
        r = np.stack([_arr(v) for v in op.R])  # [k, d]
        w = np.stack([_arr(v) for v in op.W])  # [k, d]
        b = _arr(op.b)  # [k]
        return np.stack([row + r.T @ (w @ row + b - r @ row) for row in h]) if len(h) else h.copy()
    if isinstance(op, SaeClamp):
        # SAELens's encoder for one feature, then the splice with the error term reduced to feature i:
        # f = act((h - b_dec) . W_enc[:, i] + b_enc[i]); h + (c - f) W_dec[i].
        pre = (h - _arr(op.b_dec)) @ _arr(op.enc) + float(op.b_enc)
        f = np.maximum(pre, 0.0)
        if op.mode == "jumprelu":
            f = np.where(pre > float(op.threshold), f, 0.0)
        return h + np.outer(float(op.target) - f, _arr(op.dec))
    raise TypeError(op)


def preserve_norm(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Rescale each row of ``after`` to the norm of ``before`` (zero rows stay zero)."""
    n_after = np.linalg.norm(after, axis=-1, keepdims=True)
    n_before = np.linalg.norm(before, axis=-1, keepdims=True)
    factor = np.divide(n_before, n_after, out=np.ones_like(n_after), where=n_after > 0)
    return after * factor


def apply_kernel(kernel: Kernel, h: np.ndarray, mask: np.ndarray, steps=None) -> np.ndarray:
    out = apply_op(kernel.op, h, steps)
    if kernel.preserve_norm:
        out = preserve_norm(h, out)
    return np.where(mask[:, None], out, h)


def run_kernels(kernels, h: np.ndarray, mask_of, steps=None) -> np.ndarray:
    """Apply kernels in order; ``mask_of(kernel)`` gives each one's position mask."""
    for k in kernels:
        h = apply_kernel(k, h, mask_of(k), steps)
    return h


_COMPARISONS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def gate_holds(gate, values) -> np.ndarray:
    """Where a checked gate holds (spec/language.md §11.2), from its probes' values: ``values[name]``, one
    array per probe, all of one shape (per position; a pooled probe's value repeated over its sequence),
    NaN where the probe is not decided yet, which no comparison passes.

    >>> g = GateAll((GateCompare("p", ">", 0.5), GateNegate(GateCompare("q", "<=", 0.0))))
    >>> gate_holds(g, {"p": np.array([1.0, 1.0, 0.0, np.nan]), "q": np.array([1.0, -1.0, 1.0, 1.0])})
    array([ True, False, False, False])
    """
    if isinstance(gate, GateCompare):
        with np.errstate(invalid="ignore"):
            return _COMPARISONS[gate.op](np.asarray(values[gate.probe], dtype=np.float64), gate.threshold)
    if isinstance(gate, GateNegate):
        return ~gate_holds(gate.operand, values)
    parts = [gate_holds(p, values) for p in gate.parts]
    return np.logical_and.reduce(parts) if isinstance(gate, GateAll) else np.logical_or.reduce(parts)
