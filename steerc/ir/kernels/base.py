"""What a kernel kind declares: the record every kernel module fills in (see :mod:`steerc.ir.kernels`).

A kind is data and small functions, so that each engine, format and view reads the one declaration:

* ``operands``: the roles of its values, each with its shape (``d`` the site's width, ``k`` a count the
  first operand that has it fixes, ``1`` one number) and whether it may be a plain number, is optional,
  or may be set by a per-request param;
* ``operands_of(op)``: the op's values by role (floats, or float32/float64 arrays), as the hook lowering
  stores them; ``bind(op, role, value)``: the op with one operand replaced (per-request params);
* ``to_serve`` / ``from_serve`` / ``check_serve`` / ``serve_schema``: its ``op`` object in the serve
  format (``steerc.serve/1``), whose published JSON Schema is generated from these fragments;
* ``verify(op, width, where, field, v)``: the plan verifier's invariants of the op (``v`` gives
  ``check(cond, message, field)``, ``f32(x)`` and ``unit_rows(vectors, width, where, field)``);
* ``explain(op)``: what ``steerc explain`` shows;
* ``batched``: the kernel as one row of the serve plugin's in-graph tables (:mod:`steerc.runtime.vllm.tables`),
  ``batched(S, o, mode) -> dict`` (``S`` and ``o`` as for ``maths``), or None when the kind has no such form
  (its requests then take the per-request path). The row computes ``x * scale + factor * bias + g(c) @ B``
  with ``c = x @ A + a0`` (``A`` [d, r], ``a0`` [r], ``B`` [r, d]) and ``g`` chosen by ``code``: ``LINEAR``
  (``g(c) = c``), ``JUMP`` (``g_0 = p_1 - relu(c_0) * [c_0 > p_0]``: an SAE feature set to ``p_1``) or
  ``NORM_TO`` (``g = rho * (p_0, p_1) - (c_0, c_1)``, ``rho = |(c_0, c_1)|``: a rotation to an angle). Keys
  it leaves out are the identity (``scale`` 1, ``bias`` 0, rank 0). The same maths, one row per plan, so a
  batch of plans runs as one gather; not bitwise the same sums as ``maths`` (float32 rounding);
* ``maths``: the torch function ``maths(S, x, o, mode) -> new x`` every runtime runs (the HF hooks, the
  vLLM buffers and serve plugin, receipts and the emitted HF package, which carries its source). ``S`` is
  the support module (:mod:`steerc.runtime.kernels`: ``S.torch``, ``S.math``); ``o`` the operands by
  role, on ``x``'s device in the compute dtype (numbers stay numbers), plus ``factor`` (the schedule's
  value per row) when the kernel is scheduled; ``mode`` the kind's variant (a string or None). The
  function must be self-contained: the emitted package runs its source where steerc is not installed.

No torch or numpy is imported here or by a kind's module at import time.
"""

from __future__ import annotations

from collections.abc import Callable

from steerc.core.record import evolve, frozen


@frozen
class Operand:
    role: str
    shape: str  # "d", "k,d", "k", "1", or "1|d" (one number, or one per component)
    optional: bool = False
    number: bool = False  # may be a plain number (in the hook program; a [1] buffer in the vllm plan)
    bindable: bool = False  # a per-request param may set it


def _replace(op, role: str, value):
    return evolve(op, **{role: value})


@frozen
class Kind:
    name: str
    op: type
    operands: tuple[Operand, ...]
    operands_of: Callable
    maths: Callable
    verify: Callable
    explain: Callable
    to_serve: Callable
    from_serve: Callable
    check_serve: Callable
    serve_schema: dict
    modes: tuple[str, ...] = ()  # the variants of the kind (a rotation's "to" and "by"); () when none
    mode_of: Callable = lambda op: None
    bind: Callable = _replace
    batched: Callable | None = None  # the in-graph table row (see above); None: per-request only
    rank: Callable = lambda shapes: 0  # the row's rank r, from the operands' shapes by role (pure Python)
    schedulable: bool = False  # whether a schedule may scale it (its "bias" operand)
    note: str = ""  # one line for spec tables and errors

    def operand(self, role: str) -> Operand | None:
        return next((o for o in self.operands if o.role == role), None)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(o.role for o in self.operands)

    @property
    def bindable(self) -> tuple[str, ...]:
        return tuple(o.role for o in self.operands if o.bindable)


# the g of a batched row (see ``batched`` above)
LINEAR, JUMP, NORM_TO = 0, 1, 2

REF = {"$ref": "#/$defs/ref"}
NULL_OR_REF = {"oneOf": [{"type": "null"}, REF]}
