"""Layer and head selectors: from what was written to concrete indices.

``expand(atoms, n)`` follows Python rules: negatives count from the end,
slices are half-open with open ends allowed, ``*`` is everything, ``p%`` is
``floor(p/100 * n)``. Indices are returned sorted and without repeats.

>>> from steerc.ir import nodes as ir
>>> expand((ir.SelSlice(ir.SelPercent(25.0), ir.SelPercent(75.0)),), 8).indices
(2, 3, 4, 5)
>>> expand((ir.SelIndex(-1),), 4).indices
(3,)
>>> expand((ir.SelIndex(7),), 4).out_of_range[0].index
7
>>> e = expand((ir.SelSlice(ir.SelIndex(2), ir.SelIndex(9)),), 4); e.indices, len(e.clipped)
((2, 3), 1)
>>> static_layers((ir.SelIndex(1), ir.SelSlice(ir.SelIndex(2), ir.SelIndex(4))))
[1, 2, 3]
"""

from __future__ import annotations

import math

from steerc.core.record import frozen
from steerc.ir import nodes as ir


@frozen
class Expansion:
    indices: tuple[int, ...]
    out_of_range: tuple[ir.SelIndex, ...]  # atoms that point past the end
    empty: tuple[ir.SelSlice, ...]  # slices that select nothing
    clipped: tuple[ir.SelSlice, ...] = ()  # slices with an index end past the model (Python clips it)


def _bound(b, n: int) -> int:
    if isinstance(b, ir.SelPercent):
        return math.floor(b.percent / 100.0 * n)
    return b.index


def expand(atoms, n: int) -> Expansion:
    chosen: set[int] = set()
    bad: list = []
    empty: list = []
    clipped: list = []
    for atom in atoms:
        if isinstance(atom, ir.SelAll):
            chosen.update(range(n))
        elif isinstance(atom, ir.SelIndex):
            i = atom.index + n if atom.index < 0 else atom.index
            if 0 <= i < n:
                chosen.add(i)
            else:
                bad.append(atom)
        elif isinstance(atom, ir.SelPercent):
            i = min(math.floor(atom.percent / 100.0 * n), n - 1)
            chosen.add(i)
        else:
            start = None if atom.start is None else _bound(atom.start, n)
            stop = None if atom.stop is None else _bound(atom.stop, n)
            picked = range(n)[slice(start, stop)]  # Python rules: ends are clipped
            if not picked:
                empty.append(atom)
            elif any(isinstance(b, ir.SelIndex) and not -n <= b.index <= n for b in (atom.start, atom.stop)):
                clipped.append(atom)
            chosen.update(picked)
    return Expansion(tuple(sorted(chosen)), tuple(bad), tuple(empty), tuple(clipped))


def static_layers(atoms) -> list[int] | None:
    """The layers a selector picks when that needs no model, else ``None``.

    Non-negative indices and slices with both ends given as non-negative
    indices qualify; ``*``, negatives, percentages and open ends do not.
    """
    out: set[int] = set()
    for atom in atoms:
        if isinstance(atom, ir.SelIndex) and atom.index >= 0:
            out.add(atom.index)
        elif (
            isinstance(atom, ir.SelSlice)
            and isinstance(atom.start, ir.SelIndex)
            and isinstance(atom.stop, ir.SelIndex)
            and atom.start.index >= 0
            and atom.stop.index >= 0
        ):
            out.update(range(atom.start.index, atom.stop.index))
        else:
            return None
    return sorted(out)
