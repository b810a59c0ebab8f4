"""``project``: ``h -> h - Q (Q^T h) + Q t`` with ``Q`` orthonormal rows.

``ablate`` is ``t = 0`` (no target); ``clamp u to c`` is ``Q = [u/|u|]``, ``t = [c]``.
"""

from __future__ import annotations

from steerc.core.record import evolve, frozen
from steerc.ir.kernels.base import REF, Kind, Operand
from steerc.ir.values import Vec


@frozen
class Project:
    basis: tuple[Vec, ...]  # orthonormal rows
    target: tuple[float, ...] | None = None  # None: ablate (all zeros)


def project(S, x, o, mode):
    """``x - Q (Q^T x) + Q t`` with ``Q`` the rows of ``basis`` ([k, d])."""
    basis, target = o["basis"], o.get("target")
    coeff = x @ basis.T
    if target is not None:
        coeff = coeff - target
    return x - coeff @ basis


def batched(S, o, mode):
    """The table row: ``c = x Q^T - t``, ``x + c (-Q)``."""
    basis, target = o["basis"], o.get("target")
    row = {"A": basis.T, "B": -basis}
    if target is not None:
        row["a0"] = -target
    return row


def _operands(op: Project):
    import numpy as np

    yield "basis", np.stack([b.array for b in op.basis])
    if op.target is not None:
        yield "target", np.asarray(op.target, dtype=np.float32)


def _bind(op: Project, role: str, value) -> Project:
    return evolve(op, target=(value,))  # the one role a param sets: a clamp's target


def _verify(op: Project, width: int, where: str, field: str, v) -> None:
    v.check(0 < len(op.basis) <= width, f"{where}: basis empty or larger than the width", f"{field}.basis")
    v.unit_rows(op.basis, width, where, f"{field}.basis")
    v.check(op.target is None or len(op.target) == len(op.basis), f"{where}: targets do not match basis",
            f"{field}.target")
    v.check(op.target is None or all(v.f32(t) for t in op.target),
            f"{where}: a target is not a finite float32 number", f"{field}.target")


def _explain(op: Project, fmt) -> dict:
    k = len(op.basis)
    if op.target is None:
        return {"kind": "project", "form": "h - Q Q^T h", "rank": k}
    return {"kind": "project", "form": "h - Q Q^T h + Q t", "rank": k, "targets": [fmt(t) for t in op.target]}


def _to_serve(op: Project, put) -> dict:
    import numpy as np

    return {"kind": "project", "basis": put(np.stack([b.array for b in op.basis])),
            "target": list(op.target) if op.target is not None else None}


def _from_serve(d: dict, read) -> Project:
    rows = read(d["basis"])
    target = tuple(float(t) for t in d["target"]) if d["target"] is not None else None
    return Project(tuple(Vec(r) for r in rows), target)


def _check_serve(field: str, d: dict, tensor, width: int, fail) -> None:
    basis = tensor(f"{field}.basis", d["basis"], (1, width), width)
    if d["target"] is not None and len(d["target"]) != basis.shape[0]:
        fail(f"{field}.target", f"{len(d['target'])} targets for {basis.shape[0]} directions")


SERVE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "basis", "target"],
    "properties": {
        "kind": {"const": "project"},
        "basis": REF,
        "target": {"oneOf": [{"type": "null"}, {"type": "array", "minItems": 1, "items": {"type": "number"}}]},
    },
}

KIND = Kind(
    name="project", op=Project,
    operands=(Operand("basis", "k,d"), Operand("target", "k", optional=True, bindable=True)),
    operands_of=_operands, maths=project, batched=batched, rank=lambda shapes: shapes["basis"][0], verify=_verify, explain=_explain, bind=_bind,
    to_serve=_to_serve, from_serve=_from_serve, check_serve=_check_serve, serve_schema=SERVE_SCHEMA,
    note="h -> h - Q Q^T h + Q t: ablate (no target), clamp (one row, one target)",
)
