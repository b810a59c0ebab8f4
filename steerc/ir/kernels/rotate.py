"""``rotate``: angular steering in the plane ``(e1, e2)``; the rest of ``h`` and its norm are kept.

``to``: the component in the plane is turned to ``angle`` from ``e1`` (its length kept); ``by``: it is
turned by ``angle``. Angles in radians.
"""

from __future__ import annotations

import math

from steerc.core.record import frozen
from steerc.ir.kernels.base import NORM_TO, REF, Kind, Operand
from steerc.ir.values import Vec


@frozen
class Rotate:
    e1: Vec
    e2: Vec  # unit, orthogonal to e1
    angle: float  # radians
    mode: str  # "to" | "by"


def rotate(S, x, o, mode):
    """The rotation; ``angle`` a number, or a 0-d tensor (a buffer that can change without re-tracing a
    compiled graph)."""
    e1, e2, angle = o["e1"], o["e2"], o["angle"]
    a = x @ e1
    b = x @ e2
    if S.torch.is_tensor(angle):
        c, s = S.torch.cos(angle), S.torch.sin(angle)
    else:
        c, s = S.math.cos(angle), S.math.sin(angle)
    if mode == "to":
        rho = S.torch.sqrt(a * a + b * b)
        a2, b2 = rho * c, rho * s
    else:
        a2, b2 = a * c - b * s, a * s + b * c
    return x + (a2 - a).unsqueeze(-1) * e1 + (b2 - b).unsqueeze(-1) * e2


def batched(S, o, mode):
    """The table row: ``c = x [e1 e2]``; by an angle, linear (``B = M [e1; e2]``, M the rotation minus the
    identity, acting on the row vector c); to an angle, ``NORM_TO`` with ``(cos, sin)``."""
    e = S.torch.stack([o["e1"], o["e2"]])
    angle = S.torch.as_tensor(o["angle"], dtype=e.dtype, device=e.device)
    c, s = S.torch.cos(angle), S.torch.sin(angle)
    if mode == "to":
        return {"A": e.T, "B": e, "code": NORM_TO, "p": S.torch.stack([c, s])}
    m = S.torch.stack([S.torch.stack([c - 1, s]), S.torch.stack([-s, c - 1])])
    return {"A": e.T, "B": m @ e}


def _operands(op: Rotate):
    yield "e1", op.e1.array
    yield "e2", op.e2.array
    yield "angle", float(op.angle)


def _verify(op: Rotate, width: int, where: str, field: str, v) -> None:
    v.unit_rows((op.e1, op.e2), width, where, f"{field}.e1")
    v.check(op.mode in ("to", "by"), f"{where}: bad rotation mode", f"{field}.mode")
    v.check(v.f32(op.angle), f"{where}: the angle is not a finite float32 number", f"{field}.angle")


def _explain(op: Rotate, fmt) -> dict:
    return {"kind": "rotate", "form": f"rotate {op.mode} {fmt(math.degrees(op.angle))} deg in plane (e1, e2)"}


def _to_serve(op: Rotate, put) -> dict:
    return {"kind": "rotate", "e1": put(op.e1.array), "e2": put(op.e2.array), "angle": op.angle, "mode": op.mode}


def _from_serve(d: dict, read) -> Rotate:
    return Rotate(Vec(read(d["e1"])), Vec(read(d["e2"])), float(d["angle"]), d["mode"])


def _check_serve(field: str, d: dict, tensor, width: int, fail) -> None:
    tensor(f"{field}.e1", d["e1"], None, width)
    tensor(f"{field}.e2", d["e2"], None, width)


SERVE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "e1", "e2", "angle", "mode"],
    "properties": {"kind": {"const": "rotate"}, "e1": REF, "e2": REF, "angle": {"type": "number"},
                   "mode": {"enum": ["to", "by"]}},
}

KIND = Kind(
    name="rotate", op=Rotate,
    operands=(Operand("e1", "d"), Operand("e2", "d"), Operand("angle", "1", number=True, bindable=True)),
    operands_of=_operands, maths=rotate, batched=batched, rank=lambda shapes: 2, verify=_verify, explain=_explain,
    to_serve=_to_serve, from_serve=_from_serve, check_serve=_check_serve, serve_schema=SERVE_SCHEMA,
    modes=("to", "by"), mode_of=lambda op: op.mode,
    note="angular steering in the plane (e1, e2): rotate to or by an angle, the norm kept",
)
