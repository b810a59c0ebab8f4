"""Steer points: the serve plugin's way into a compiled graph.

A compiled vLLM model is traced once, at its first forward, so whatever
steering the graph will ever run must be in it by then; but the serve plugin's
plans arrive with requests, each with its own structure. Most plans are held
by the plan tables (:mod:`.tables`): traced code at each provisioned site,
reading fixed buffers, no Python per step. The rest (plans beyond the
tables' bounds) take the per-request path. A steer point is an
opaque PyTorch custom op, ``steerc::point`` (``steerc::point_pair`` for the
(hidden, residual) pair of fused layers), called by a hook on every site the
server provisions (``--steer-sites``), installed before compilation:

* torch.compile traces the hook and records the op; Inductor compiles the
  model around it and calls it, in Python, every step;
* under CUDA graphs the ops are among vLLM's splitting ops (PIECEWISE mode):
  the graph pieces between them replay, and the op runs between them;
* the op's body is the eager plugin's dispatch (:mod:`.serve`): each steered
  request's kernels on that request's token rows only; rows of other
  requests, and every row when no request is steered there, are copied
  bit for bit.

An op cannot return its input (compiled graphs forbid aliasing outputs of
custom ops), so an idle point returns a copy: one copy of the hooked tensor
per provisioned site per step (measured by benchmarks/vllm_cpu.py --serve).

Each worker process has one model, so the points of a process live in one
table: point ``i`` is ``(body, key)``; an op call names ``i``.
"""

from __future__ import annotations

import torch

_POINTS: list = []  # index -> fn(x) -> x or fn(hidden, residual) -> (hidden, residual)


@torch.library.custom_op("steerc::point", mutates_args=())
def point(x: torch.Tensor, index: int) -> torch.Tensor:
    """The steering of point ``index`` on ``x`` (a new tensor, never ``x`` itself)."""
    out = _POINTS[index](x)
    return x.clone() if out is None else out


@point.register_fake
def _(x, index):
    return torch.empty_like(x)


@torch.library.custom_op("steerc::point_pair", mutates_args=())
def point_pair(hidden: torch.Tensor, residual: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The steering of point ``index`` on a fused layer's (hidden, residual) pair (new tensors)."""
    out = _POINTS[index](hidden, residual)
    return (hidden.clone(), residual.clone()) if out is None else out


@point_pair.register_fake
def _(hidden, residual, index):
    return torch.empty_like(hidden), torch.empty_like(residual)


# The names vLLM's compilation config takes in splitting_ops, for PIECEWISE CUDA graphs.
SPLITTING_OPS = ("steerc::point", "steerc::point_pair")


def install(module, kind: str, tensor: str, body, tables=None) -> object:
    """A hook on ``module`` for one provisioned site; its handle.

    ``tables(x)`` (``tables(hidden, residual)`` for ``tensor == "fused_pair"``), when given, is traced
    tensor code run first: the plan tables (:mod:`.tables`), inside the graph. ``body``, when given, runs
    after it through a new steer point (an opaque op, Python each step): the per-request path. ``body(x)``
    returns the steered tensor or None (untouched); for a fused pair, ``body(hidden, residual)`` returns the
    steered pair or None.
    """
    index = None
    if body is not None:
        _POINTS.append(body)
        index = len(_POINTS) - 1

    def one(x):
        if tables is not None:
            x = tables(x)
        return x if index is None else torch.ops.steerc.point(x, index)

    if kind == "pre":
        at = 1 if tensor == "input1" else 0

        def pre(mod, args, kwargs):
            if len(args) > at:
                return args[:at] + (one(args[at]),) + args[at + 1:], kwargs
            return args, dict(kwargs, hidden_states=one(kwargs["hidden_states"]))

        return module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)

    def post(mod, args, output):
        if tensor == "fused_pair":
            hidden, residual = output[0], output[1]
            if tables is not None:
                hidden, residual = tables(hidden, residual)
            if index is not None:
                hidden, residual = torch.ops.steerc.point_pair(hidden, residual, index)
            return (hidden, residual) + tuple(output[2:])
        if isinstance(output, tuple):
            return (one(output[0]),) + tuple(output[1:])
        return one(output)

    return module.register_forward_hook(post, prepend=True)
