"""Checking per-request param values: what a compiled plan takes after compilation.

Plain Python (no steerc import, no numpy, no torch), so that the emitted HF
package carries this very file as ``_params.py`` and refuses exactly what
``steerc.runtime.hf.install(..., params=...)``, the vllm target's
``set_params`` and the serve plugin refuse.

>>> declared = [Declared("strength", 1.0, 0.0, 4.0)]
>>> check_values(declared, {"strength": 2})
{'strength': 2.0}
>>> check_values(declared, {"strength": 9})
Traceback (most recent call last):
    ...
steerc.ir.param_values.ParamError: strength: 9 is outside its declared range [0, 4]
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Mapping

FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max (steerc.core.limits holds the same)

# A per-request param as data: its default (the compiled value) and its declared range, if any.
Declared = namedtuple("Declared", "name default low high")


class ParamError(ValueError):
    """A per-request value a plan refuses; ``field`` is the param's name."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_values(declared, values: Mapping | None, coefficients=()) -> dict[str, float]:
    """Every declared param's value: ``values`` checked, defaults for the rest.

    ``declared``: objects with ``name``, ``default``, ``low`` and ``high``;
    ``coefficients``: (param, largest |coefficient| of an operand it scales)
    pairs. Raises :class:`ParamError` naming the param: one not declared, a
    value that is not a finite number (booleans are not numbers here), one
    outside the declared range, or one that would push a steered value past
    float32.
    """
    declared = {p.name: p for p in declared}
    out = {name: p.default for name, p in declared.items()}
    if values is not None and not isinstance(values, Mapping):
        raise ParamError("params", f"expected a map of param name to number, got {type(values).__name__}")
    for name, value in (values or {}).items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ParamError(str(name)[:64], f"this plan has no per-request param of that name (its params: {known})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(name, f"expected a number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ParamError(name, "expected a finite number")
        p = declared[name]
        if (p.low is not None and value < p.low) or (p.high is not None and value > p.high):
            raise ParamError(name, f"{value:g} is outside its declared range [{p.low:g}, {p.high:g}]")
        out[name] = value
    for name, coefficient in coefficients:
        if coefficient * abs(out[name]) > FLOAT32_MAX:
            raise ParamError(name, f"{out[name]:g} makes a steered value overflow float32")
    return out


def bound_gate(gate: tuple, bound: tuple, values: Mapping) -> tuple:
    """A gate as data (``("cmp", probe, op, threshold)``, ``("and"|"or", parts)``, ``("not", g)``) with the
    thresholds of its bound comparisons at ``values``: ``bound`` holds, per comparison depth first,
    ``(param, coefficient)`` or None (a fixed threshold).

    >>> bound_gate(("and", (("cmp", "a", "<", 0.5), ("cmp", "b", ">", 1.0))), (None, ("t", 2.0)), {"t": 0.25})
    ('and', (('cmp', 'a', '<', 0.5), ('cmp', 'b', '>', 0.5)))
    """
    left = iter(bound)

    def walk(g):
        if g[0] == "cmp":
            b = next(left)
            return g if b is None else (*g[:3], b[1] * values[b[0]])
        if g[0] == "not":
            return ("not", walk(g[1]))
        return (g[0], tuple(walk(p) for p in g[1]))

    return walk(gate)
