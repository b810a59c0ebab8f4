"""``affine``: ``h -> s * h + b`` (``add``, ``scale``, ``set``, ``suppress``).

``s`` is a number or one factor per component, ``b`` a vector or absent. The bias may carry a schedule:
factors of the generation step that multiply it (``("ramp", n, 0)``, ``("decay", r, 0)``,
``("window", a, b)``, sorted; see ``schedule_factor`` in :mod:`steerc.ir.interpret`).
"""

from __future__ import annotations

import math

from steerc.core.limits import MAX_SCHEDULE_STEP
from steerc.core.record import frozen
from steerc.ir.kernels.base import NULL_OR_REF, REF, Kind, Operand
from steerc.ir.values import Vec


@frozen
class Affine:
    scale: float | Vec  # a scalar, or one factor per component
    bias: Vec | None = None
    # Factors of the generation step that multiply the bias, sorted (empty: constant).
    # ("ramp", n, 0), ("decay", r, 0), ("window", a, b); see schedule_factor in interpret.
    schedule: tuple[tuple[str, float, float], ...] = ()

    @property
    def kills(self) -> bool:
        """True when the output does not depend on the input (``set``, ``suppress``)."""
        if isinstance(self.scale, Vec):
            return not self.scale.array.any()
        return self.scale == 0.0


def affine(S, x, o, mode):
    """``scale * x + factor * bias`` (``factor``: the schedule's value per row, when scheduled)."""
    scale, bias, factor = o["scale"], o.get("bias"), o.get("factor")
    out = x * scale if not (isinstance(scale, float) and scale == 1.0) else x
    if bias is None:
        return out
    return out + (bias if factor is None else factor.unsqueeze(-1) * bias)


def batched(S, o, mode):
    """The table row: ``scale`` and ``bias`` (a schedule's factor is the table's per-token factor)."""
    out = {"scale": o["scale"]}
    if o.get("bias") is not None:
        out["bias"] = o["bias"]
    return out


def _operands(op: Affine):
    yield "scale", op.scale if isinstance(op.scale, float) else op.scale.array
    if op.bias is not None:
        yield "bias", op.bias.array


def _verify(op: Affine, width: int, where: str, field: str, v) -> None:
    v.check(not op.schedule or op.bias is not None, f"{where}: a schedule without a bias", f"{field}.schedule")
    for n, (kind, a, b) in enumerate(op.schedule):
        at = f"{field}.schedule[{n}]"
        v.check(kind in ("ramp", "decay", "window") and math.isfinite(a) and math.isfinite(b),
                f"{where}: bad schedule {kind}", at)
        steps = (a,) if kind == "ramp" else (a, b) if kind == "window" else ()
        v.check(kind != "decay" or 0.0 < a <= 1.0, f"{where}: a decay rate is in (0, 1], got {a:g}", at)
        v.check(all(x == int(x) and 0 <= x <= MAX_SCHEDULE_STEP for x in steps),
                f"{where}: {kind} counts whole steps up to {MAX_SCHEDULE_STEP}", at)
        v.check(not ((kind == "ramp" and a < 1) or (kind == "window" and a >= b)), f"{where}: an empty {kind}", at)
    for name, value in (("scale", op.scale), ("bias", op.bias)):
        if value is None:
            continue
        if isinstance(value, (int, float)):
            v.check(v.f32(value), f"{where}: the {name} is not a finite float32 number", f"{field}.{name}")
        else:
            v.check(v.finite_vector(value, width), f"{where}: bad affine vector", f"{field}.{name}")


def _explain(op: Affine, fmt) -> dict:
    scalar = isinstance(op.scale, float)
    s = fmt(op.scale) if scalar else "s"
    if scalar and op.scale == 0.0:
        form = "b" if op.bias is not None else "0"
    elif scalar and op.scale == 1.0:
        form = "h + b" if op.bias is not None else "h"
    else:
        form = f"{s} * h" + (" + b" if op.bias is not None else "")
    out = {"kind": "affine", "form": form}
    if not scalar:
        out["scale"] = "per component"
    if op.bias is not None:
        import numpy as np

        out["bias_norm"] = round(float(np.linalg.norm(op.bias.array.astype(np.float64))), 6)
    return out


# ------------------------------------------------------------------- the serve format


def _schedule_json(factor) -> dict:
    kind, a, b = factor
    if kind == "ramp":
        return {"kind": "ramp", "steps": int(a)}
    if kind == "decay":
        return {"kind": "decay", "rate": a}
    return {"kind": "window", "start": int(a), "stop": int(b)}


def _schedule_from(d: dict) -> tuple[str, float, float]:
    if d["kind"] == "ramp":
        return ("ramp", float(d["steps"]), 0.0)
    if d["kind"] == "decay":
        return ("decay", float(d["rate"]), 0.0)
    return ("window", float(d["start"]), float(d["stop"]))


def _to_serve(op: Affine, put) -> dict:
    scale = {"value": op.scale} if isinstance(op.scale, float) else put(op.scale.array)
    out = {"kind": "affine", "scale": scale, "bias": put(op.bias.array) if op.bias is not None else None}
    if op.schedule:
        out["schedule"] = [_schedule_json(f) for f in op.schedule]
    return out


def _from_serve(d: dict, read) -> Affine:
    scale = float(d["scale"]["value"]) if "value" in d["scale"] else Vec(read(d["scale"]))
    schedule = tuple(sorted(_schedule_from(f) for f in d.get("schedule") or ()))
    return Affine(scale, Vec(read(d["bias"])) if d["bias"] is not None else None, schedule)


def _check_serve(field: str, d: dict, tensor, width: int, fail) -> None:
    if "artifact" in d["scale"]:
        tensor(f"{field}.scale", d["scale"], None, width)
    if d["bias"] is not None:
        tensor(f"{field}.bias", d["bias"], None, width)


_STEP = {"type": "integer", "minimum": 0, "maximum": MAX_SCHEDULE_STEP}

SERVE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "scale", "bias"],
    "properties": {
        "kind": {"const": "affine"},
        "scale": {"oneOf": [{"type": "object", "additionalProperties": False, "required": ["value"],
                             "properties": {"value": {"type": "number"}}}, REF]},
        "bias": NULL_OR_REF,
        "schedule": {
            "type": "array", "minItems": 1, "maxItems": 16,
            "description": "factors of the generation step (n = position - (prompt length - 1)) that multiply "
                           "the bias",
            "items": {"oneOf": [
                {"type": "object", "additionalProperties": False, "required": ["kind", "steps"],
                 "properties": {"kind": {"const": "ramp"}, "steps": {**_STEP, "minimum": 1}}},
                {"type": "object", "additionalProperties": False, "required": ["kind", "rate"],
                 "properties": {"kind": {"const": "decay"},
                                "rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}},
                {"type": "object", "additionalProperties": False, "required": ["kind", "start", "stop"],
                 "properties": {"kind": {"const": "window"}, "start": _STEP, "stop": _STEP}},
            ]},
        },
    },
}

KIND = Kind(
    name="affine", op=Affine,
    operands=(Operand("scale", "1|d", number=True, bindable=True), Operand("bias", "d", optional=True, bindable=True)),
    operands_of=_operands, maths=affine, batched=batched, verify=_verify, explain=_explain,
    to_serve=_to_serve, from_serve=_from_serve, check_serve=_check_serve, serve_schema=SERVE_SCHEMA,
    schedulable=True,
    note="h -> s * h + b: add, scale, set, suppress (a bias may carry a schedule)",
)
