"""Vectors of float64 without numpy: a tensor's bytes decoded, and the few operations folding needs.

``steerc check`` folds the vectors of a program to report what they mean
(a zero direction, an entry past float32, two parallel vectors). Importing
numpy takes about as long as importing the parser, so a check that only
reports diagnostics folds small vectors in plain Python instead
(:data:`PYTHON_MAX` entries in all; past that numpy pays for itself and is
used, see :mod:`steerc.passes.foldvec`). The values are the same: a tensor
is read as float32 and widened, and every entry-wise operation is one IEEE
float64 operation either way. Only a norm is summed in another order than
numpy's, which can move it by a few units in the last place.

:class:`Floats` is an ``array.array`` of ``'d'`` that answers ``shape`` and
``size`` as a 1-D numpy array does, and refuses ``+`` and ``*`` (an array's
concatenation and repetition): arithmetic goes through the functions here.

>>> v = decode(b"\\x00\\x00\\x80\\x3f\\x00\\x00\\x00\\xc0", "<f4")
>>> v.shape, list(v), list(times(v, 3.0)), norm(plus(v, v)) == norm(v) * 2
((2,), [1.0, -2.0], [3.0, -6.0], True)
>>> max_abs(decode(b"\\x80\\x3f\\x00\\xc1", "bf16")), nonzero(Floats([0.0, -0.0]))
(8.0, False)
"""

from __future__ import annotations

import math
import operator
import struct
import sys
from array import array

# What folding may compute in plain Python: past this many vector entries in one check, numpy is
# imported and does the rest (a Python loop costs about 50 ns an entry, numpy's import some 50 ms).
PYTHON_MAX = 1 << 16

# The byte formats a reader may hand over: numpy's names, and bfloat16 (the top half of a float32).
FORMATS = ("<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "bf16")


class Floats(array):
    """A 1-D float64 vector; ``shape`` and ``size`` as numpy has them."""

    __slots__ = ()

    def __new__(cls, values=()):
        return super().__new__(cls, "d", values)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def size(self) -> int:
        return len(self)

    def __add__(self, other):  # not concatenation: a vector sum goes through plus()
        return NotImplemented

    __radd__ = __iadd__ = __mul__ = __rmul__ = __imul__ = __add__

    def __repr__(self) -> str:  # a vector may be 65,536 entries long: its length and first few
        head = ", ".join(f"{x:.4g}" for x in self[:4])
        return f"Floats[{len(self)}]({head}{', ...' if len(self) > 4 else ''})"


def decode(raw: bytes, fmt: str) -> Floats:
    """The values of a tensor's bytes (one of :data:`FORMATS`), rounded to float32 as every reader reads them.

    >>> list(decode(b"\\x00\\x3c\\x00\\xc0", "<f2")), list(decode(struct.pack("<d", 1e300), "<f8"))
    ([1.0, -2.0], [inf])
    """
    if fmt == "bf16":
        halves = _native(array("H", raw), "<")
        single = array("f", array("I", [h << 16 for h in halves]).tobytes())
    elif fmt[1:] == "f2":
        n = len(raw) // 2
        single = array("f", struct.unpack(f"{fmt[0]}{n}e", raw[:2 * n]))
    elif fmt[1:] == "f4":
        single = _native(array("f", raw), fmt[0])
    elif fmt[1:] == "f8":
        single = array("f", _native(array("d", raw), fmt[0]))  # rounds, to inf past float32
    else:
        raise ValueError(f"unknown float format {fmt!r}")
    return Floats(single)


def _native(values: array, order: str) -> array:
    if (order == "<") != (sys.byteorder == "little"):
        values.byteswap()
    return values


def as_floats(v) -> Floats:
    """``v`` as Floats: itself, or a copy of a numpy array's values (exact), or of any sequence of floats."""
    if isinstance(v, Floats):
        return v
    if hasattr(v, "dtype"):  # a numpy array: its bytes, not one Python float at a time
        import numpy as np

        out = Floats()
        out.frombytes(np.ascontiguousarray(v, dtype="=f8").reshape(-1).tobytes())
        return out
    return Floats(v)


def literal(values) -> Floats:
    """A vector of the given numbers."""
    return Floats(values)


def finite(v) -> bool:
    return all(map(math.isfinite, v))


def negative(v) -> Floats:
    return Floats(map(operator.neg, as_floats(v)))


def times(v, s: float) -> Floats:
    """Each entry times ``s`` (an overflow gives inf, as numpy's does)."""
    return Floats(map(float(s).__mul__, as_floats(v)))


def divided(v, s: float) -> Floats:
    """Each entry divided by ``s`` (not zero)."""
    return Floats(map(float(s).__rtruediv__, as_floats(v)))


def plus(a, b) -> Floats:
    return Floats(map(operator.add, as_floats(a), as_floats(b)))


def minus(a, b) -> Floats:
    return Floats(map(operator.sub, as_floats(a), as_floats(b)))


def dot(a, b) -> float:
    return sum(map(operator.mul, as_floats(a), as_floats(b)))


def norm(v) -> float:
    """The Euclidean norm: inf when the sum of squares overflows, as numpy's is."""
    v = as_floats(v)
    return math.sqrt(dot(v, v))


def max_abs(v) -> float:
    """The largest magnitude (0.0 for no entries; NaN when an entry is NaN, as numpy's max is)."""
    v = as_floats(v)
    if not finite(v) and any(map(math.isnan, v)):
        return math.nan
    return max(map(abs, v), default=0.0)


def nonzero(v) -> bool:
    """Whether any entry is not zero (NaN counts, as in numpy's ``any``)."""
    return any(as_floats(v))


def rows(flat, count: int, width: int) -> list[Floats]:
    """The ``count`` rows of a ``[count, width]`` tensor that was read as one vector of its entries."""
    flat = as_floats(flat)
    return [Floats(flat[i * width:(i + 1) * width]) for i in range(count)]
