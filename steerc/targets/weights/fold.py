"""The maths of a fold, in float64: a site's kernels as one affine map ``f(y) = L y + c``, carried into the
matrix that writes the site (spec/targets.md, "`weights`").

Each kernel kind that folds is affine in the site's value ``y`` (rows of ``Y`` here):

* affine: ``L y = s * y`` (``s`` a number or one factor per component), ``c = b``;
* project: ``L y = y - Q^T (Q y)``, ``c = Q^T t`` (``t``: a clamp's targets; none for ``ablate``);
* rotate *by* ``a`` in the plane ``(e1, e2)``: ``L`` turns the plane's component by ``a``, ``c = 0``.

Kernels at one site run in order, so the site's map is their composition; each is applied in turn, never
formed as a matrix (a projection is a rank-k update, never a d x d matrix). Where ``y = W x + b`` (a
linear layer's output): ``W' = L W`` and ``b' = f(b)``. Where ``y`` is a head's slice ``x_h`` of a linear
layer's *input*: ``W'[:, h] = W[:, h] L`` and ``b' = b + W[:, h] c``. Where ``y`` is an embedding row:
``e' = f(e)``.

>>> import torch
>>> from steerc.ir.kernels import Affine
>>> from steerc.ir.values import Vec
>>> ops = (Affine(2.0, Vec([1.0, 0.0])),)
>>> apply(ops, torch.tensor([[1.0, 1.0]], dtype=torch.float64), offset=True).tolist()
[[3.0, 2.0]]
>>> apply(ops, torch.tensor([[1.0, 1.0]], dtype=torch.float64), offset=False).tolist()
[[2.0, 2.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from steerc.core.record import frozen

CHUNK_ELEMENTS = 1 << 22  # float64 elements in flight per block of a fold (32 MiB)


def _t(array):
    import torch

    return torch.from_numpy(np.asarray(array, dtype=np.float64))


def _affine(op, Y, offset: bool, transposed: bool):
    """``s * y (+ b)``: diagonal, its own transpose."""
    s = op.scale if isinstance(op.scale, float) else _t(op.scale.array)
    out = Y * s
    return out + _t(op.bias.array) if offset and op.bias is not None else out


def _project(op, Y, offset: bool, transposed: bool):
    """``y - Q^T (Q y - t)``: ``L = I - Q^T Q`` is symmetric."""
    Q = _t(np.stack([b.array for b in op.basis]))
    coeff = Y @ Q.T
    if offset and op.target is not None:
        coeff = coeff - _t(op.target)
    return Y - coeff @ Q


def _rotate(op, Y, offset: bool, transposed: bool):
    """The plane's component turned by the angle (``L^T``: by minus the angle)."""
    angle = -op.angle if transposed else op.angle
    e1, e2 = _t(op.e1.array), _t(op.e2.array)
    a, b = Y @ e1, Y @ e2
    c, s = math.cos(angle), math.sin(angle)
    return Y + (a * c - b * s - a).unsqueeze(-1) * e1 + (a * s + b * c - b).unsqueeze(-1) * e2


@frozen
class Fold:
    """How one kernel kind folds: its map on rows, why an op of it does not fold ("" when it does), and
    whether the op has a constant part ``c = f(0) != 0``."""

    maths: Callable  # maths(op, Y, offset, transposed) -> Y
    refuses: Callable  # refuses(op) -> str
    offset: Callable  # offset(op) -> bool


# The kinds that fold, by name (the kernel seat's dispatch: a kind not here does not fold).
FOLDS = {
    "affine": Fold(_affine, lambda op: "a schedule changes with the generation step" if op.schedule else "",
                   lambda op: op.bias is not None),
    "project": Fold(_project, lambda op: "",
                    lambda op: op.target is not None and any(t != 0.0 for t in op.target)),
    "rotate": Fold(_rotate, lambda op: "" if op.mode == "by" else
                   "a rotation *to* an angle depends on where the hidden state points, so no matrix holds it; a "
                   "rotation *by* an angle folds (`rotate in (a, b) by 30deg`)", lambda op: False),
}


def _fold_of(op) -> Fold | None:
    from steerc.ir.kernels import kind_of

    kind = kind_of(op)
    return FOLDS.get(kind.name) if kind is not None else None


def why_not_affine(op) -> str:
    """Why the kernel is not a fixed affine map ``L y + c`` of the site's value ("" when it is)."""
    fold = _fold_of(op)
    return "it is not a fixed affine map of the site's value" if fold is None else fold.refuses(op)


def has_offset(op) -> bool:
    """Whether the kernel's map has a constant part ``c = f(0) != 0`` (an add, set, a clamp's target)."""
    fold = _fold_of(op)
    return fold is not None and fold.offset(op)


def _one(op, Y, offset: bool, transposed: bool = False):
    """``Y`` (rows) under one kernel: ``f`` (offset) or ``L`` (no offset); ``L^T`` when transposed."""
    fold = _fold_of(op)
    if fold is None or fold.refuses(op):
        raise ValueError(f"{type(op).__name__} does not fold (the check should have refused it)")
    return fold.maths(op, Y, offset, transposed)


def apply(ops, Y, offset: bool):
    """The rows of ``Y`` under the kernels ``ops`` in order: ``f`` with ``offset``, else the linear part ``L``."""
    for op in ops:
        Y = _one(op, Y, offset)
    return Y


def apply_transposed(ops, Y):
    """The rows of ``Y`` times ``L`` (each row ``w`` becomes ``w L``, i.e. ``L^T w``): the transposes in reverse."""
    for op in reversed(ops):
        Y = _one(op, Y, offset=False, transposed=True)
    return Y


def offset_of(ops, width: int):
    """``c = f(0)``, the map's constant part (float64, [width])."""
    import torch

    return apply(ops, torch.zeros((1, width), dtype=torch.float64), offset=True)[0]


def _block(total: int, width: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, width)) if total else 1


def output_side(weight, ops):
    """``L W`` for a linear layer's weight ``[out = site width, in]``, in its own dtype, a block of columns at
    a time (each column is a vector of the site)."""
    import torch

    out = torch.empty_like(weight)
    n = weight.shape[1]
    step = _block(n, weight.shape[0])
    for j in range(0, n, step):
        cols = weight[:, j:j + step].to(torch.float64).T
        out[:, j:j + step] = apply(ops, cols, offset=False).T.to(weight.dtype)
    return out


def rows(weight, ops, offset: bool = True):
    """``f(e)`` for every row ``e`` of an embedding ``[vocab, site width]``, a block of rows at a time."""
    import torch

    out = torch.empty_like(weight)
    n = weight.shape[0]
    step = _block(n, weight.shape[1])
    for i in range(0, n, step):
        out[i:i + step] = apply(ops, weight[i:i + step].to(torch.float64), offset).to(weight.dtype)
    return out


def head_columns(weight, lo: int, hi: int, ops):
    """(the weight with columns ``lo:hi`` replaced by ``W[:, lo:hi] L``, ``W[:, lo:hi] c`` in float64)."""
    import torch

    part = weight[:, lo:hi].to(torch.float64)
    added = part @ offset_of(ops, hi - lo)
    out = weight.clone()
    out[:, lo:hi] = apply_transposed(ops, part).to(weight.dtype)
    return out, added


def fold_linear(weight, bias, site_plans, head_dim: int):
    """(W', b') of a linear layer ``y = W x + b`` whose input heads and output the site plans steer (heads
    first, in forward order); ``bias`` None where the layer has none, and b' None where it still needs none."""
    import torch

    b = None if bias is None else bias.to(torch.float64)
    for sp in site_plans:
        ops = [k.op for k in sp.kernels]
        if sp.site.kind == "head":
            lo = sp.site.head * head_dim
            weight, added = head_columns(weight, lo, lo + head_dim, ops)
            if torch.any(added != 0):
                b = added if b is None else b + added
        else:
            weight = output_side(weight, ops)
            if b is not None or any(has_offset(op) for op in ops):
                base = b if b is not None else torch.zeros(weight.shape[0], dtype=torch.float64)
                b = apply(ops, base.unsqueeze(0), offset=True)[0]
    out_bias = None if b is None else b.to(bias.dtype if bias is not None else weight.dtype)
    return weight, out_bias
