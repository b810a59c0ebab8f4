"""``loreft``: pyreft's LoReFT, ``h -> h + Rᵀ (W h + b - R h)``.

``R`` ([r, d]) has orthonormal rows: they span the r-dimensional subspace the edit works in. ``W`` ([r, d])
and ``b`` ([r]) are the learned map whose values replace ``R h``, the coordinates of ``h`` in that subspace:
afterwards ``R h' = W h + b``, and the part of ``h`` orthogonal to the subspace is kept. This is
``LoreftIntervention.forward`` of pyreft (``pyreft/interventions.py``), whose ``rotate_layer.weight`` is
``Rᵀ`` ([d, r]) and whose ``learned_source`` is the linear layer ``(W, b)``.
"""

from __future__ import annotations

from steerc.core.limits import MAX_LOREFT_RANK
from steerc.core.record import frozen
from steerc.ir.kernels.base import REF, Kind, Operand
from steerc.ir.values import Vec

# How far R Rᵀ may be from the identity (the largest entry of the difference, in float64): the checker
# refuses a matrix past it, and the plan verifier holds every plan to it.
ORTHONORMAL_TOLERANCE = 1e-4


@frozen
class LoReFT:
    R: tuple[Vec, ...]  # [r, d], orthonormal rows
    W: tuple[Vec, ...]  # [r, d]
    b: Vec  # [r]

    @property
    def rank(self) -> int:
        return len(self.R)


def loreft(S, x, o, mode):
    """``x + ((x W^T + b) - x R^T) R``: pyreft's ``base + (learned_source(base) - rotate_layer(base)) R``
    (its ``rotate_layer.weight`` is ``R^T``). The emitted HF package carries this source: plain ASCII."""
    rotation = o["R"]
    return x + ((x @ o["W"].T + o["b"]) - x @ rotation.T) @ rotation


def batched(S, o, mode):
    """The table row: ``c = x (W - R)^T + b``, ``x + c R``."""
    rotation = o["R"]
    return {"A": (o["W"] - rotation).T, "a0": o["b"], "B": rotation}


def orthonormal_error(rows) -> float:
    """The largest entry of ``|R Rᵀ - I|`` in float64 (``rows``: an [r, d] array, or r Vecs); inf when
    ``R`` holds a value that is not finite."""
    import numpy as np

    if isinstance(rows, (tuple, list)):
        rows = [v.array if isinstance(v, Vec) else v for v in rows]
    q = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(q).all():
        return float("inf")
    with np.errstate(over="ignore", invalid="ignore"):
        error = np.abs(q @ q.T - np.eye(q.shape[0])).max(initial=0.0)
    return float(error) if np.isfinite(error) else float("inf")


def _stack(rows):
    import numpy as np

    return np.stack([v.array for v in rows])


def _operands(op: LoReFT):
    yield "R", _stack(op.R)
    yield "W", _stack(op.W)
    yield "b", op.b.array


_CHECKED: dict[tuple[str, ...], bool] = {}  # R's rows' digests -> orthonormal (at most 64 kept)


def _orthonormal(op: LoReFT) -> bool:
    """Whether R's rows are orthonormal, computed once per R (by its rows' digests, so nothing large is kept):
    the verifier meets one LoReFT at every site an intervention reaches, and a served plan per request."""
    key = tuple(v.digest for v in op.R)
    ok = _CHECKED.get(key)
    if ok is None:
        ok = orthonormal_error(op.R) <= ORTHONORMAL_TOLERANCE
        if len(_CHECKED) >= 64:
            _CHECKED.clear()
        _CHECKED[key] = ok
    return ok


def _verify(op: LoReFT, width: int, where: str, field: str, v) -> None:
    r = len(op.R)
    most = min(width, MAX_LOREFT_RANK)
    v.check(0 < r <= most, f"{where}: R has {r} rows, LoReFT needs 1 to {most}", f"{field}.R")
    v.check(len(op.W) == r, f"{where}: W has {len(op.W)} rows, R has {r}", f"{field}.W")
    for role, rows in (("R", op.R), ("W", op.W)):
        v.check(all(v.finite_vector(row, width) for row in rows), f"{where}: bad LoReFT matrix", f"{field}.{role}")
    v.check(v.finite_vector(op.b, r), f"{where}: b is not {r} finite numbers", f"{field}.b")
    v.check(_orthonormal(op), f"{where}: the rows of R are not orthonormal", f"{field}.R")


def _explain(op: LoReFT, fmt) -> dict:
    import numpy as np

    return {"kind": "loreft", "form": "h + R^T (W h + b - R h)", "rank": op.rank,
            "bias_norm": round(float(np.linalg.norm(op.b.array.astype(np.float64))), 6)}


# ------------------------------------------------------------------- the serve format


def _to_serve(op: LoReFT, put) -> dict:
    return {"kind": "loreft", "R": put(_stack(op.R)), "W": put(_stack(op.W)), "b": put(op.b.array)}


def _from_serve(d: dict, read) -> LoReFT:
    return LoReFT(tuple(Vec(r) for r in read(d["R"])), tuple(Vec(r) for r in read(d["W"])), Vec(read(d["b"])))


def _check_serve(field: str, d: dict, tensor, width: int, fail) -> None:
    rows = tensor(f"{field}.R", d["R"], (1, min(width, MAX_LOREFT_RANK)), width).shape[0]
    tensor(f"{field}.W", d["W"], (rows, rows), width)
    tensor(f"{field}.b", d["b"], None, rows)


SERVE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "R", "W", "b"],
    "description": "pyreft's LoReFT, h + R^T (W h + b - R h): R and W [r, width] (R's rows orthonormal), b [r]",
    "properties": {"kind": {"const": "loreft"}, "R": REF, "W": REF, "b": REF},
}

KIND = Kind(
    name="loreft", op=LoReFT,
    operands=(Operand("R", "k,d"), Operand("W", "k,d"), Operand("b", "k")),
    operands_of=_operands, maths=loreft, batched=batched, rank=lambda shapes: shapes["R"][0], verify=_verify, explain=_explain,
    to_serve=_to_serve, from_serve=_from_serve, check_serve=_check_serve, serve_schema=SERVE_SCHEMA,
    note="pyreft's LoReFT: h -> h + R^T (W h + b - R h), R's rows orthonormal",
)
