"""steerc's records: small classes declared by their annotated fields, frozen or not.

The IR, the diagnostics, the plans and the facts are all such records. They were attrs classes; this
module keeps the part of attrs' meaning that steerc uses and nothing else, because importing attrs and
letting it compile an ``__init__``, ``__repr__``, ``__eq__`` and ``__hash__`` for each of the ~85
classes that ``steerc check`` imports was a third of the command's cold start (issue 33, measured
2026-12-05: ``import lark, attrs`` 84 ms against 70 ms for lark alone, and ~10 ms more to build the
classes). Here:

- ``@frozen`` / ``@define`` read the class's annotations in order (``ClassVar`` ones excepted), the
  fields of record base classes first, and make a slotted class of the same name;
- a class's ``__init__`` is one function over its fields' specs (nothing is compiled: attrs compiled each
  class's methods from generated source, which also cost start-up time); it takes the fields positionally
  in order, ``kw_only`` ones by keyword, applies each ``converter`` and ``factory``, then calls
  ``__post_init__`` where the class has one;
- one shared ``__repr__`` (``Name(field=value, ...)``, ``repr=False`` fields left out), one ``__eq__``
  (the same class, the ``eq=True`` fields equal in order, else ``NotImplemented``) and one ``__hash__``
  (the class's name and those fields) serve every class; ``eq=False`` keeps identity; a mutable
  (``define``) class with ``eq`` is unhashable, as attrs makes it; a class that writes one of these
  methods itself keeps its own;
- a frozen instance refuses ``setattr`` and ``delattr`` with :class:`FrozenInstanceError`;
- :func:`evolve`, :func:`fields` and :func:`has` as attrs has them.

>>> @frozen
... class Pair:
...     a: int
...     b: str = field(repr=False)
...     c: tuple = ()
...     n: int = field(default=0, kw_only=True)
>>> Pair(1, "x", (2,))
Pair(a=1, c=(2,), n=0)
>>> Pair(1, "x") == Pair(1, "x"), Pair(1, "x") == Pair(2, "x"), Pair(1, "x") != Pair(1, "x")
(True, False, False)
>>> len({Pair(1, "x"), Pair(1, "x"), Pair(3, "x")}), evolve(Pair(1, "x"), a=5, n=2)
(2, Pair(a=5, c=(), n=2))
>>> Pair(1, "x").a = 2
Traceback (most recent call last):
...
steerc.core.record.FrozenInstanceError: can't set attribute 'a' of Pair
>>> Pair(1)
Traceback (most recent call last):
...
TypeError: Pair.__init__() missing 1 required positional argument: 'b'
"""

from __future__ import annotations

__all__ = ["NOTHING", "Field", "FrozenInstanceError", "define", "evolve", "field", "fields", "frozen", "has"]


class _Nothing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTHING"

    def __bool__(self) -> bool:
        return False


NOTHING = _Nothing()
"""A field without a default."""


class FrozenInstanceError(AttributeError):
    """A frozen record was assigned to (as attrs' error of the same name)."""


class Field:
    """One field of a record: what :func:`field` declares, with its ``name`` once the class is built."""

    __slots__ = ("name", "default", "factory", "converter", "eq", "repr", "kw_only", "init")

    def __init__(self, default=NOTHING, factory=None, converter=None, eq=True, repr=True, kw_only=False,
                 init=True, name=""):
        if factory is not None and default is not NOTHING:
            raise ValueError("a field takes a default or a factory, not both")
        self.name, self.default, self.factory, self.converter = name, default, factory, converter
        self.eq, self.repr, self.kw_only, self.init = eq, repr, kw_only, init

    def named(self, name: str) -> Field:
        return Field(self.default, self.factory, self.converter, self.eq, self.repr, self.kw_only, self.init,
                     name)

    @property
    def has_default(self) -> bool:
        return self.default is not NOTHING or self.factory is not None

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, kw_only={self.kw_only})"


def field(*, default=NOTHING, factory=None, converter=None, eq=True, repr=True, kw_only=False,
          init=True) -> Field:
    """A field with options (``default`` or ``factory``, ``converter``, ``eq``, ``repr``, ``kw_only``)."""
    return Field(default, factory, converter, eq, repr, kw_only, init)


_FIELDS = "__record_fields__"
_CLASSVAR = ("ClassVar", "typing.ClassVar", "t.ClassVar", "typing_extensions.ClassVar")


def has(cls) -> bool:
    """Whether ``cls`` is a record class."""
    return isinstance(cls, type) and _FIELDS in getattr(cls, "__dict__", ())


def fields(cls) -> tuple[Field, ...]:
    """The fields of record class ``cls``, in ``__init__``'s order of declaration."""
    got = cls.__dict__.get(_FIELDS) if isinstance(cls, type) else None
    if got is None:
        raise TypeError(f"{cls!r} is not a record class")
    return got


def evolve(inst, **changes):
    """A copy of record ``inst`` with ``changes`` (by field name) made."""
    cls = type(inst)
    for f in fields(cls):
        if f.init and f.name not in changes:
            changes[f.name] = getattr(inst, f.name)
    return cls(**changes)


def _is_classvar(annotation) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__origin__", annotation)
    if isinstance(text, str):
        return text.split("[", 1)[0].strip() in _CLASSVAR
    import typing

    return text is typing.ClassVar


def _collect(cls) -> tuple[tuple[Field, ...], dict]:
    """The record fields of ``cls`` (bases' first) and the class namespace without the field defaults."""
    inherited: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get(_FIELDS, ()):
            inherited[f.name] = f
    own: dict[str, Field] = {}
    namespace = dict(cls.__dict__)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = namespace.pop(name, NOTHING)
        own[name] = value.named(name) if isinstance(value, Field) else Field(default=value, name=name)
        inherited.pop(name, None)
    for name, value in namespace.items():
        if isinstance(value, Field):
            raise TypeError(f"{cls.__qualname__}.{name} is a field() without an annotation")
    every = (*inherited.values(), *own.values())
    seen_default = False
    for f in every:
        if f.kw_only or not f.init:
            continue
        if seen_default and not f.has_default:
            raise ValueError(f"{cls.__qualname__}: field {f.name!r} without a default follows one with a default")
        seen_default = seen_default or f.has_default
    return every, namespace


def _make_init(cls, every: tuple[Field, ...]):
    """``__init__`` for ``cls``: one function over the fields' specs, no generated source (a module that loads a
    serve plan may not compile or exec anything: ``tests/test_serve.py``). It takes the fields positionally in
    order, ``kw_only`` ones by keyword, applies each ``factory`` and ``converter``, then ``__post_init__``."""
    qual = f"{cls.__qualname__}.__init__()"
    spec = lambda f: (f.name, f.default, f.factory, f.converter)  # noqa: E731
    pos = tuple(spec(f) for f in every if f.init and not f.kw_only)
    kws = tuple(spec(f) for f in every if f.init and f.kw_only)
    rest = tuple(spec(f) for f in every if not f.init and f.has_default)
    npos, names = len(pos), frozenset(f.name for f in every if f.init)
    post = "__post_init__" in dir(cls)
    put = object.__setattr__

    def fill(self, specs, kwargs, missing):
        for name, default, factory, converter in specs:
            value = kwargs.pop(name, NOTHING) if kwargs else NOTHING
            if value is NOTHING:
                if factory is not None:
                    value = factory()
                elif default is not NOTHING:
                    value = default
                else:
                    missing.append(name)
                    continue
            put(self, name, value if converter is None else converter(value))

    def __init__(self, *args, **kwargs):
        if len(args) > npos:
            raise TypeError(f"{qual} takes {npos + 1} positional arguments but {len(args) + 1} were given")
        for (name, _, _, converter), value in zip(pos, args):
            if kwargs and name in kwargs:
                raise TypeError(f"{qual} got multiple values for argument {name!r}")
            put(self, name, value if converter is None else converter(value))
        missing: list[str] = []
        fill(self, pos[len(args):], kwargs, missing)
        if missing:
            raise TypeError(f"{qual} missing {len(missing)} required positional argument"
                            f"{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}")
        if kws:
            fill(self, kws, kwargs, missing)
            if missing:
                raise TypeError(f"{qual} missing {len(missing)} required keyword-only argument"
                                f"{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}")
        if kwargs:
            wrong = next(iter(kwargs))
            raise TypeError(f"{qual} got an unexpected keyword argument {wrong!r}" if wrong not in names else
                            f"{qual} got multiple values for argument {wrong!r}")
        if rest:
            fill(self, rest, None, missing)
        if post:
            self.__post_init__()

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    return __init__


def _repr(self) -> str:
    parts = [f"{f.name}={getattr(self, f.name, NOTHING)!r}" for f in type(self).__dict__[_FIELDS] if f.repr]
    return f"{type(self).__qualname__.rsplit('>.', 1)[-1]}({', '.join(parts)})"


def _compared(cls) -> tuple[str, ...]:
    names = cls.__dict__.get("__record_eq__")
    if names is None:
        names = tuple(f.name for f in cls.__dict__[_FIELDS] if f.eq)
        type.__setattr__(cls, "__record_eq__", names)
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


def _frozen_setattr(self, name, value):
    raise FrozenInstanceError(f"can't set attribute {name!r} of {type(self).__qualname__}")


def _frozen_delattr(self, name):
    raise FrozenInstanceError(f"can't delete attribute {name!r} of {type(self).__qualname__}")


def _getstate(self) -> dict:
    return {f.name: getattr(self, f.name) for f in type(self).__dict__[_FIELDS] if hasattr(self, f.name)}


def _setstate(self, state: dict) -> None:
    for name, value in state.items():
        object.__setattr__(self, name, value)


def _build(cls, is_frozen: bool, eq: bool):
    every, namespace = _collect(cls)
    own = {name for name in ("__repr__", "__eq__", "__hash__") if name in cls.__dict__}
    base_slots = {s for base in cls.__mro__[1:] for s in base.__dict__.get("__slots__", ())}
    namespace["__slots__"] = tuple(f.name for f in every if f.name not in base_slots)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace[_FIELDS] = every
    namespace["__record_frozen__"] = is_frozen
    namespace["__match_args__"] = tuple(f.name for f in every if f.init and not f.kw_only)
    if "__init__" not in cls.__dict__:
        namespace["__init__"] = _make_init(cls, every)
    if "__repr__" not in own:
        namespace["__repr__"] = _repr
    if eq and "__eq__" not in own:
        namespace["__eq__"], namespace["__ne__"] = _eq, _ne
        if "__hash__" not in own or cls.__dict__["__hash__"] is None:
            namespace["__hash__"] = _hash if is_frozen else None
    if is_frozen:
        namespace["__setattr__"], namespace["__delattr__"] = _frozen_setattr, _frozen_delattr
    namespace["__getstate__"], namespace["__setstate__"] = _getstate, _setstate
    built = type(cls)(cls.__name__, cls.__bases__, namespace)
    built.__qualname__ = cls.__qualname__
    return built


def _decorator(maybe_cls, is_frozen: bool, eq: bool):
    def wrap(cls):
        return _build(cls, is_frozen, eq)

    return wrap if maybe_cls is None else wrap(maybe_cls)


def frozen(maybe_cls=None, *, eq: bool = True, order: bool = False):
    """A frozen, slotted record class (attrs' ``frozen``); ``eq=False`` keeps identity."""
    if order:
        raise TypeError("records are not ordered")
    return _decorator(maybe_cls, True, eq)


def define(maybe_cls=None, *, frozen: bool = False, eq: bool = True):
    """A slotted record class, mutable unless ``frozen`` (attrs' ``define``)."""
    return _decorator(maybe_cls, frozen, eq)
