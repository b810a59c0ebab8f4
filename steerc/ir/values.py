"""Folded vector values.

A :class:`Vec` wraps a read-only float32 numpy array and compares by content,
so IR nodes holding vectors can be frozen records (steerc.core.record) that compare by
meaning. A :class:`PerLayer` holds one row per layer, as loaded from an
``[L, d]`` tensor or from keys ``<key>.<i>``.

>>> import numpy as np
>>> Vec(np.array([1.0, 2.0])) == Vec(np.array([1.0, 2.0], dtype=np.float32))
True
"""

from __future__ import annotations

import hashlib


class Vec:
    """A vector value: float32, 1-D, immutable, compared by content."""

    __slots__ = ("array", "_digest")

    def __init__(self, array):
        import numpy as np

        arr = np.array(array, dtype=np.float32, copy=True).reshape(-1)
        arr.setflags(write=False)
        self.array = arr
        self._digest = None

    @property
    def width(self) -> int:
        return int(self.array.shape[0])

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.array.tobytes()).hexdigest()
        return self._digest

    def __eq__(self, other) -> bool:
        return isinstance(other, Vec) and self.width == other.width and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        head = ", ".join(f"{x:.4g}" for x in self.array[:4])
        more = ", ..." if self.width > 4 else ""
        return f"Vec[{self.width}]({head}{more})"


class PerLayer:
    """One row per layer. ``rows`` maps layer index to a float64 row.

    ``n_rows`` is the first dimension of an ``[L, d]`` tensor, or ``None``
    when rows came from keys ``<key>.<i>`` (then any missing layer is a
    missing key, not a short tensor).
    """

    __slots__ = ("rows", "n_rows", "label")

    def __init__(self, rows: dict, n_rows: int | None, label: str):
        self.rows = rows
        self.n_rows = n_rows
        self.label = label

    @property
    def width(self) -> int | None:
        for row in self.rows.values():
            return int(row.shape[0])
        return None

    def map(self, fn) -> PerLayer:
        return PerLayer({i: fn(r) for i, r in self.rows.items()}, self.n_rows, self.label)

    def row(self, layer: int):
        return self.rows.get(layer)

    def __repr__(self) -> str:
        return f"PerLayer({self.label}, rows={sorted(self.rows)}, width={self.width})"
