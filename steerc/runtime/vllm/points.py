"""Steer points: the serve plugin's way into a compiled graph.

A compiled vLLM model is traced once, at its first forward, so whatever
steering the graph will ever run must be in it by then; but the serve plugin's
plans arrive with requests, each with its own structure. Most plans are held
by the plan tables (:mod:`.tables`): traced code at each provisioned site,
reading fixed buffers, no Python per step. The rest (plans beyond the
tables' bounds) take the per-request path. A steer point is an
opaque PyTorch operator, ``steerc::point`` (``steerc::point_pair`` for the
(hidden, residual) pair of fused layers), called by a hook on every site the
server provisions (``--steer-sites``), installed before compilation:

* torch.compile traces the hook and records the op; Inductor compiles the
  model around it and calls it, in Python, every step;
* under CUDA graphs the ops are among vLLM's splitting ops (PIECEWISE mode):
  the graph pieces between them replay, and the op runs between them;
* the op's body is the eager plugin's dispatch (:mod:`.serve`): each steered
  request's kernels on that request's token rows only, written into the
  hooked tensor in place; rows of other requests, and every row when no
  request is steered there, are not written at all.

The op mutates its input (its schema says so, as vLLM's own attention op writes
its output): compiled, functionalization records the write and Inductor
lets it happen in place where nothing else reads the tensor after it (a
post-hook's output, a pre-hook's input: the hook hands the same tensor on),
so an idle point costs one call and writes nothing. (An op that returned a
new tensor could not return its input, so an idle point copied its tensor
once per step.)

Each worker process has one model, so the points of a process live in one
table: point ``i`` is its body (held weakly, :func:`register`); an op call names ``i``.
"""

from __future__ import annotations

import weakref

import torch

# index -> a weak reference to fn(x) or fn(hidden, residual), which steers its tensors in place. The hook holds the
# body; the table only finds it for the op's index, and keeps no model alive after its engine is gone (engines
# come and go in one process where vLLM runs its engine in the caller's: VLLM_ENABLE_V1_MULTIPROCESSING=0).
_POINTS: list = []

# The ops are defined on a torch.library.Library with a Python kernel, not with torch.library.custom_op: the
# dispatcher calls the kernel directly, about 3 us a call here, where custom_op's own Python layers (its
# autograd and mutation wrappers) cost 24-42 us, paid at every provisioned site every step (121 on SmolLM2).
# The schemas declare the mutation (``Tensor(a!)``), as custom_op's ``mutates_args`` would, so that
# functionalization records the write and Inductor lets it happen in place.
_LIB = torch.library.Library("steerc", "DEF")
_LIB.define("point(Tensor(a!) x, int index) -> ()")
_LIB.define("point_pair(Tensor(a!) hidden, Tensor(b!) residual, int index) -> ()")


def point(x: torch.Tensor, index: int) -> None:
    """The steering of point ``index``, written into ``x`` in place (nothing written where nothing steers)."""
    body = _POINTS[index]()
    if x.is_contiguous():
        body(x)
        return
    y = x.contiguous()  # the bodies write rows of [tokens, width] views
    body(y)
    x.copy_(y)


def point_pair(hidden: torch.Tensor, residual: torch.Tensor, index: int) -> None:
    """The steering of point ``index`` on a fused layer's (hidden, residual) pair, written into both in place."""
    body = _POINTS[index]()
    if hidden.is_contiguous() and residual.is_contiguous():
        body(hidden, residual)
        return
    h, r = hidden.contiguous(), residual.contiguous()
    body(h, r)
    hidden.copy_(h)
    residual.copy_(r)


def _writes_nothing_new(*args) -> None:  # the fake kernel (tracing): the ops return nothing
    return None


for _name, _kernel in (("point", point), ("point_pair", point_pair)):
    _LIB.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"steerc::{_name}", _writes_nothing_new, lib=_LIB)


# The names vLLM's compilation config takes in splitting_ops, for PIECEWISE CUDA graphs.
SPLITTING_OPS = ("steerc::point", "steerc::point_pair")


def register(body) -> int:
    """The index the ops name ``body`` by. The table holds it weakly: the caller keeps it alive (a hook does)."""
    _POINTS.append(weakref.ref(body))
    return len(_POINTS) - 1


def install(module, kind: str, tensor: str, body, tables=None) -> object:
    """A hook on ``module`` for one provisioned site; its handle.

    ``tables(x)`` (``tables(hidden, residual)`` for ``tensor == "fused_pair"``), when given, is traced
    tensor code run first: the plan tables (:mod:`.tables`), inside the graph. ``body``, when given, runs
    after it through a new steer point (an opaque op, Python each step): the per-request path. ``body(x)``
    steers ``x`` (contiguous) in place, writing only the rows it steers; for a fused pair,
    ``body(hidden, residual)`` steers both in place.
    """
    index = register(body) if body is not None else None

    def one(x):
        if tables is not None:
            x = tables(x)
        if index is not None:
            torch.ops.steerc.point(x, index)
        return x

    one.body = body  # the hooks hold the body (the table holds it weakly)

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
                torch.ops.steerc.point_pair(hidden, residual, index)
            return (hidden, residual) + tuple(output[2:])
        if isinstance(output, tuple):
            return (one(output[0]),) + tuple(output[1:])
        return one(output)

    return module.register_forward_hook(post, prepend=True)
