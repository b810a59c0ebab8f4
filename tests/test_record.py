"""steerc's records (steerc.core.record) against attrs itself: the same class declared with each behaves
alike — construction (positional, keyword, kw_only, defaults, factories, converters), the errors of a
wrong call, repr, equality and hashing, evolve, frozen assignment, and inheritance (issue 33: steerc
stopped importing attrs for its cold start, and must mean what attrs meant)."""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from steerc.core import record


def _declare(lib, frozen=True, eq=True):
    """The same three classes, declared with ``lib`` (attrs or steerc.core.record)."""
    decorate = lib.frozen(eq=eq) if frozen else lib.define(eq=eq)

    def shout(text):
        return str(text).upper()

    @decorate
    class Base:
        a: int
        b: str = lib.field(default="b", converter=shout)

    @decorate
    class Node(Base):
        c: tuple = ()
        d: list = lib.field(factory=list, eq=False)
        e: int = lib.field(default=0, repr=False)
        k: int = lib.field(default=7, kw_only=True)

    return Base, Node


CALLS = st.tuples(
    st.integers(-3, 3),
    st.one_of(st.none(), st.text("xyZ", max_size=3)),
    st.one_of(st.none(), st.tuples(st.integers(0, 2))),
    st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=2)),
    st.one_of(st.none(), st.integers(0, 2)),
    st.one_of(st.none(), st.integers(0, 9)),
)


def _build(cls, call, by_keyword: bool):
    a, b, c, d, e, k = call
    given_ = {n: v for n, v in zip("bcde", (b, c, d, e)) if v is not None}
    kwargs = {"k": k} if k is not None else {}
    if by_keyword:
        return cls(a=a, **given_, **kwargs)
    positional = [a]
    for name in "bcde":  # positionally up to the first one left out
        if name not in given_:
            break
        positional.append(given_.pop(name))
    return cls(*positional, **given_, **kwargs)


@pytest.mark.parametrize("frozen", [True, False])
@given(one=CALLS, two=CALLS, by_keyword=st.booleans())
def test_records_construct_compare_and_print_as_attrs_does(frozen, one, two, by_keyword):
    ours = _declare(record, frozen)[1]
    theirs = _declare(attrs, frozen)[1]
    x, y = _build(ours, one, by_keyword), _build(ours, two, not by_keyword)
    ax, ay = _build(theirs, one, by_keyword), _build(theirs, two, not by_keyword)
    assert repr(x) == repr(ax) and repr(y) == repr(ay)
    assert (x == y) == (ax == ay) and (x != y) == (ax != ay)
    if frozen:
        assert (hash(x) == hash(y)) or not (x == y)
    else:
        with pytest.raises(TypeError):
            hash(x)
        with pytest.raises(TypeError):
            hash(ax)
    assert repr(record.evolve(x, a=9, k=1)) == repr(attrs.evolve(ax, a=9, k=1))
    assert [f.name for f in record.fields(ours)] == [f.name for f in attrs.fields(theirs)]
    assert [f.kw_only for f in record.fields(ours)] == [f.kw_only for f in attrs.fields(theirs)]


@pytest.mark.parametrize("call", [lambda c: c(), lambda c: c(1, "b", (), [], 0, 7),
                                  lambda c: c(1, z=2), lambda c: c(1, a=2)])
def test_a_wrong_call_is_a_type_error_for_both(call):
    for lib in (record, attrs):
        with pytest.raises(TypeError):
            call(_declare(lib)[1])


def test_frozen_refuses_assignment_and_mutable_allows_it():
    node = _declare(record)[1](1)
    with pytest.raises(record.FrozenInstanceError):
        node.a = 2
    with pytest.raises(AttributeError):  # attrs' error is an AttributeError too
        del node.a
    mutable = _declare(record, frozen=False)[1](1)
    mutable.a = 2
    assert mutable.a == 2
    with pytest.raises(AttributeError):  # slotted: no attribute that is not a field
        mutable.z = 1


def test_eq_false_keeps_identity():
    Node = _declare(record, eq=False)[1]
    x = Node(1)
    assert x != Node(1) and x == x and len({x, Node(1)}) == 2


def test_post_init_runs_after_the_fields_are_set():
    seen = []

    @record.frozen
    class Checked:
        a: int

        def __post_init__(self):
            seen.append(self.a)
            if self.a < 0:
                raise ValueError("negative")

    assert Checked(3).a == 3 and seen == [3]
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_a_class_keeps_the_methods_it_writes():
    @record.frozen
    class Loud:
        a: int

        def __repr__(self):
            return "loud"

        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    assert repr(Loud(1)) == "loud" and Loud(1) == Loud(2)


def test_classvars_are_not_fields_and_order_is_declared():
    @record.frozen
    class WithClassVar:
        KIND: ClassVar[str] = "k"
        a: int

    assert [f.name for f in record.fields(WithClassVar)] == ["a"] and WithClassVar.KIND == "k"
    assert WithClassVar(1).__match_args__ == ("a",)


def test_declaration_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="without a default follows"):
        @record.frozen
        class Bad:
            a: int = 0
            b: int

    with pytest.raises(TypeError, match="not a record"):
        record.fields(int)
    assert not record.has(int) and record.has(_declare(record)[1])


def test_copy_keeps_the_fields():
    node = _declare(record)[1](1, "x", (2,), [3], 4, k=5)
    assert copy.copy(node) == node and copy.deepcopy(node) == node and repr(copy.copy(node)) == repr(node)


def test_no_source_is_compiled_for_a_class():
    """Every record class's ``__init__`` runs one shared function's code (a module that loads a serve plan
    compiles nothing: tests/test_serve.py), and its errors name the class as Python's own do."""
    Base, Node = _declare(record)
    assert Base.__init__.__code__ is Node.__init__.__code__
    with pytest.raises(TypeError, match=r"Node.__init__\(\) missing 1 required positional argument: 'a'"):
        Node()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Node(1, z=2)
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        Node(1, a=2)
