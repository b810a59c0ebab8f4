"""The IR's frozen records: attrs' ``frozen`` classes sharing one ``__repr__``.

attrs compiles a ``__repr__``, an ``__eq__`` and a ``__hash__`` for every class it builds;
``steerc check`` imports about seventy IR classes, and compiling those methods was half of building
them (measured 2026-12-05 on 57 frozen classes: 21 ms with them, 11 ms without the repr, 7 ms without
the comparison either). Here one function of each kind reads the class's fields instead, with attrs'
meaning: ``__repr__`` writes ``Name(field=value, ...)`` for the fields attrs would show; ``__eq__``
compares the fields with ``eq`` of an object of the very same class (else ``NotImplemented``), in
order; ``__hash__`` hashes the class and those fields.

>>> from attrs import field
>>> @frozen
... class Pair:
...     a: int
...     b: str = field(repr=False)
...     c: tuple = ()
>>> Pair(1, "x", (2,))
Pair(a=1, c=(2,))
>>> Pair(1, "x") == Pair(1, "x"), Pair(1, "x") == Pair(2, "x"), Pair(1, "x") != Pair(1, "x")
(True, False, False)
>>> hash(Pair(1, "x")) == hash(Pair(1, "x")), len({Pair(1, "x"), Pair(1, "x"), Pair(3, "x")})
(True, 2)
"""

from __future__ import annotations

from attrs import NOTHING
from attrs import frozen as _frozen


def _repr(self) -> str:
    parts = []
    for a in type(self).__attrs_attrs__:
        if a.repr is False:
            continue
        value = getattr(self, a.name) if a.init else getattr(self, a.name, NOTHING)
        parts.append(f"{a.name}={repr(value) if a.repr is True else a.repr(value)}")
    return f"{type(self).__qualname__.rsplit('>.', 1)[-1]}({', '.join(parts)})"


def _compared(cls) -> tuple[str, ...]:
    names = cls.__dict__.get("_record_eq")
    if names is None:  # the fields attrs compares: eq=True ones, in order
        names = tuple(a.name for a in cls.__attrs_attrs__ if a.eq)
        cls._record_eq = names
    return names


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return all(getattr(self, n) == getattr(other, n) for n in _compared(self.__class__))


def _ne(self, other):
    result = _eq(self, other)
    return result if result is NotImplemented else not result


def _hash(self) -> int:
    return hash((self.__class__.__qualname__, *(getattr(self, n) for n in _compared(self.__class__))))


def frozen(maybe_cls=None, **options):
    """``attrs.frozen`` with the shared ``__repr__``, ``__eq__`` and ``__hash__`` (a class that writes its
    own keeps it; ``eq=False`` keeps identity, as attrs does)."""

    def wrap(cls):
        compare = options.get("eq", True)
        rest = {k: v for k, v in options.items() if k != "eq"}
        if any(m in cls.__dict__ for m in ("__repr__", "__eq__", "__hash__")):  # rare: attrs sees it all
            return _frozen(cls, **options)
        built = _frozen(cls, repr=False, eq=False, **rest)
        built.__repr__ = _repr
        if compare:
            built.__eq__, built.__ne__, built.__hash__ = _eq, _ne, _hash
        return built

    return wrap if maybe_cls is None else wrap(maybe_cls)
