"""Generic traversal of IR nodes.

>>> from steerc.ir import nodes as ir
>>> e = ir.BinOp("*", ir.Number(2), ir.Name("joy"))
>>> [type(n).__name__ for n in walk(e)]
['BinOp', 'Number', 'Name']
"""

from __future__ import annotations

from steerc.core import record

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_SKIP = {"span", "name_span", "func_span", "version_span", "range_span", "text", "comments", "long"}


def _child_fields(cls: type) -> tuple[str, ...]:
    names = _CHILD_FIELDS.get(cls)
    if names is None:
        names = tuple(f.name for f in record.fields(cls) if f.name not in _SKIP)
        _CHILD_FIELDS[cls] = names
    return names


def children(node):
    """The IR nodes directly inside ``node``."""
    for fname in _child_fields(type(node)):
        value = getattr(node, fname)
        if isinstance(value, tuple):
            for v in value:
                if record.has(type(v)):
                    yield v
        elif value is not None and record.has(type(value)):
            yield value


def walk(node):
    """``node`` and everything inside it, depth first, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(children(n))))
