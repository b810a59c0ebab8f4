"""Vector folding for the `fold` pass.

Values are folded with numpy (float64 arrays, what the plan and the targets
read). A check that wants only its diagnostics (``steerc check`` without a
model) folds its first ``PYTHON_MAX`` entries in plain Python instead
(:mod:`steerc.io.floats`), so that checking a program with a few vectors
never imports numpy; past that bound numpy is imported and folds the rest.
Both do the same float64 operations entry by entry (only a norm's sum may
round differently), so they report the same diagnostics.
"""

from __future__ import annotations

import functools

from steerc.core.limits import FLOAT32_MAX
from steerc.diagnostics.codes import INVALID_VALUE, SHAPE_MISMATCH
from steerc.io import floats
from steerc.ir import nodes as ir
from steerc.ir.builtins import reads_vectors
from steerc.ir.values import PerLayer
from steerc.passes import types as ty
from steerc.passes.loading import load_vector, python_floats


class _Numpy:
    """The operations of :mod:`steerc.io.floats`, on float64 numpy arrays (any vector is taken as one)."""

    def __init__(self):
        import numpy as np

        self.np = np

    def _a(self, v):
        return self.np.asarray(v, dtype=self.np.float64)

    def literal(self, values):
        return self.np.array(values, dtype=self.np.float64)

    def negative(self, v):
        return self.np.negative(self._a(v))

    def times(self, v, s: float):
        with self.np.errstate(over="ignore", invalid="ignore"):
            return self._a(v) * s

    def divided(self, v, s: float):
        with self.np.errstate(over="ignore", invalid="ignore"):
            return self._a(v) / s

    def plus(self, a, b):
        return self.np.add(self._a(a), self._a(b))

    def minus(self, a, b):
        return self.np.subtract(self._a(a), self._a(b))

    def dot(self, a, b) -> float:
        with self.np.errstate(over="ignore"):  # inf, as in plain Python: what it means is judged by the caller
            return float(self._a(a) @ self._a(b))

    def norm(self, v) -> float:
        with self.np.errstate(over="ignore"):
            return float(self.np.linalg.norm(self._a(v)))

    def max_abs(self, v) -> float:
        with self.np.errstate(invalid="ignore"):
            return float(self.np.max(self.np.abs(self._a(v)), initial=0.0))

    def nonzero(self, v) -> bool:
        return bool(self.np.any(self._a(v)))


@functools.cache
def _numpy() -> _Numpy:
    return _Numpy()


class VectorFolder:
    """The vector half of :class:`steerc.passes.fold.Evaluator`."""

    def __init__(self, evaluator):
        self.ev = evaluator

    def _math(self):
        """The operations to fold with now: plain Python's while :func:`python_floats` allows, else numpy's."""
        return floats if python_floats(self.ev.ctx) else _numpy()

    def vector(self, e):
        """A folded vector: float64 values (a numpy array, or Floats), or a PerLayer bank.

        Each new vector is paid for (``CheckContext.spend``) before it is made.
        """
        spend = self.ev.ctx.spend
        if isinstance(e, ir.Name):
            return self.ev._lookup(e)
        if isinstance(e, ir.Index):
            return self.ev.feature_row(e)
        if isinstance(e, ir.VectorLit):
            spend(len(e.items), e.span)
            return self._math().literal([self.ev.operand(i) for i in e.items])
        if isinstance(e, ir.Neg):
            v = self.vector(e.operand)
            spend(_size(v), e.span)
            return _map(v, self._math().negative)
        if isinstance(e, ir.Call):
            if reads_vectors(e.func):
                return load_vector(self.ev.ctx, e)
            v = self.vector(e.args[0])
            spend(_size(v), e.span)
            m = self._math()
            return _map(v, lambda r: self._normalized(m, r, e.span))
        return self._binop(e)

    def _normalized(self, m, row, span):
        n = m.norm(row)
        if n == 0.0:
            self.ev.fail(INVALID_VALUE, "cannot normalize a zero vector", span)
        return m.divided(row, n)

    def _binop(self, e: ir.BinOp):
        types = self.ev.ctx.types
        lt, rt = types.get(id(e.left)), types.get(id(e.right))
        if lt == ty.SCALAR or rt == ty.SCALAR:
            vec = self.vector(e.right if lt == ty.SCALAR else e.left)
            s = self.ev.scalar(e.left if lt == ty.SCALAR else e.right)
            self.ev.ctx.spend(_size(vec), e.span)
            if s == 0 and e.op == "/":
                self.ev.fail(INVALID_VALUE, "division by zero", e.right.span)
            m = self._math()
            scaled = _map(vec, (lambda r: m.times(r, s)) if e.op == "*" else (lambda r: m.divided(r, s)))
            return self._in_range(scaled, e.span)
        a, b = self.vector(e.left), self.vector(e.right)
        self.same_width((a, b), e.span, "vectors added or subtracted")
        self.ev.ctx.spend(max(_size(a), _size(b)), e.span)
        m = self._math()
        return self._in_range(_combine(a, b, m.plus if e.op == "+" else m.minus), e.span)

    def scaled(self, v, s: float, span):
        """``v`` times the number ``s`` (each new vector paid for, every entry fitting float32)."""
        self.ev.ctx.spend(_size(v), span)
        m = self._math()
        return self._in_range(_map(v, lambda r: m.times(r, s)), span)

    def _in_range(self, v, span):
        """``v``, once every entry is known to fit float32 (what steering vectors are stored as)."""
        m = self._math()
        for row in _rows(v):
            big = m.max_abs(row)
            if not big <= FLOAT32_MAX:  # also catches NaN
                self.ev.fail(
                    INVALID_VALUE,
                    f"this vector has an entry of magnitude {big:.6g}, which does not fit float32 "
                    f"(largest {FLOAT32_MAX:.6g})",
                    span,
                    help="steering vectors are float32 on every target; scale it down",
                )
        return v

    def direction(self, e):
        """A vector used as a direction: it must not be zero."""
        v = self.vector(e)
        m = self._math()
        for row in _rows(v):
            if not m.nonzero(row):
                self.ev.fail(INVALID_VALUE, "a direction cannot be the zero vector", e.span)
        return v

    def plane(self, b1, b2, span) -> None:
        m = self._math()
        for r1, r2 in _paired_rows(b1, b2):
            e1 = m.divided(r1, m.norm(r1))
            rest = m.minus(r2, m.times(e1, m.dot(e1, r2)))
            if m.norm(rest) <= 1e-6 * max(m.norm(r2), 1e-30):
                self.ev.fail(
                    INVALID_VALUE,
                    "the two vectors are parallel (or the second is zero): they span no plane to rotate in",
                    span,
                )

    def same_width(self, values, span, what: str) -> None:
        widths = sorted({w for w in (_width(v) for v in values) if w is not None})
        if len(widths) > 1:
            self.ev.fail(
                SHAPE_MISMATCH,
                f"{what} have different lengths ({', '.join(map(str, widths))})",
                span,
            )


def _rows(v):
    return v.rows.values() if isinstance(v, PerLayer) else (v,)


def _paired_rows(a, b):
    if isinstance(a, PerLayer) or isinstance(b, PerLayer):
        keys = (a.rows.keys() if isinstance(a, PerLayer) else None, b.rows.keys() if isinstance(b, PerLayer) else None)
        common = set.intersection(*(set(k) for k in keys if k is not None))
        for i in sorted(common):
            yield (a.rows[i] if isinstance(a, PerLayer) else a), (b.rows[i] if isinstance(b, PerLayer) else b)
    else:
        yield a, b


def _size(v) -> int:
    """How many entries a folded value holds."""
    return sum(int(r.size) for r in v.rows.values()) if isinstance(v, PerLayer) else int(v.size)


def _width(v) -> int | None:
    return v.width if isinstance(v, PerLayer) else int(v.shape[0])


def _map(v, fn):
    return v.map(fn) if isinstance(v, PerLayer) else fn(v)


def _combine(a, b, fn):
    if isinstance(a, PerLayer) and isinstance(b, PerLayer):
        rows = {i: fn(a.rows[i], b.rows[i]) for i in a.rows.keys() & b.rows.keys()}
        n_rows = None if a.n_rows is None or b.n_rows is None else min(a.n_rows, b.n_rows)
        return PerLayer(rows, n_rows, f"{a.label}, {b.label}")
    if isinstance(a, PerLayer):
        return a.map(lambda r: fn(r, b))
    if isinstance(b, PerLayer):
        return b.map(lambda r: fn(a, r))
    return fn(a, b)


