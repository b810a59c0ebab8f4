"""Traps of xgrammar's default ``strict_mode``: closed objects and arrays.

``xgrammar.Grammar.from_json_schema`` runs with ``strict_mode=True`` unless
told otherwise: once an object schema has any object keyword, properties it
does not declare are not allowed unless ``additionalProperties`` (or
``unevaluatedProperties``) says so; once an array schema has any array
keyword, items beyond ``prefixItems`` are not allowed unless ``items`` (or
``unevaluatedItems``) says so. That is usually what a constraint wants, but
it turns a few schemas into something else (xgrammar 0.2.9, by experiment):

* a ``required`` name missing from ``properties`` can never appear
  (``{}`` is accepted, ``{"a": 1}`` is not): a warning;
* ``{"type": "array", "maxItems": 3}`` accepts only ``[]`` (and the object
  twin only ``{}``): a warning;
* ``minItems`` above the ``prefixItems`` count (``minProperties`` above the
  declared properties), or ``maxItems`` below the ``prefixItems`` count:
  xgrammar refuses to compile, so an error.

>>> from steerc.constraints.schema import check_json_schema
>>> [p.message for p in check_json_schema('{"type": "array", "minItems": 1, "items": {}}')[1]]
[]
>>> check_json_schema('{"type": "array", "minItems": 1}')[1][0].severity
'error'
"""

from __future__ import annotations

import re

from steerc.constraints import UNSUPPORTED
from steerc.constraints._common import show
from steerc.constraints.context import Context
from steerc.constraints.jsonpos import pointer
from steerc.constraints.keywords import KEYWORDS_BY_TYPE

_STRICT = "structured decoding (xgrammar's default strict mode)"
_OBJECT_OPENERS = ("additionalProperties", "unevaluatedProperties", "propertyNames")
_ARRAY_OPENERS = ("items", "unevaluatedItems")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _may_match(pattern: str, name: str) -> bool:
    """Whether a ``patternProperties`` key could match ``name`` (True when unsure)."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError, OverflowError):
        return True


def strict_object(ctx: Context, node: dict, ptr: str) -> None:
    """Report what strict mode does to an object schema.

    >>> from steerc.constraints.schema import check_json_schema
    >>> text = '{"type": "object", "properties": {"a": {}}, "required": ["b"]}'
    >>> [(p.severity, text[p.offset:p.end]) for p in check_json_schema(text)[1]]
    [('warning', '"b"')]
    """
    extra = node.get("additionalProperties", node.get("unevaluatedProperties", False))
    if extra is not False:
        return
    declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    patterns = list(node["patternProperties"]) if isinstance(node.get("patternProperties"), dict) else []
    required = node.get("required") if isinstance(node.get("required"), list) else []
    for index, name in enumerate(required):
        if isinstance(name, str) and name not in declared and not any(_may_match(p, name) for p in patterns):
            ctx.report(UNSUPPORTED, pointer(pointer(ptr, "required"), index),
                       f"{show(name)} is required but not declared in `properties`, and {_STRICT} allows no "
                       "undeclared property: the output can never contain it",
                       help=f"declare {show(name)} in `properties`")
    least = node.get("minProperties")
    if _number(least) and not patterns and least > len(declared):
        ctx.error(pointer(ptr, "minProperties"), f"`minProperties` ({least}) is more than the {len(declared)} "
                  f"declared properties, and {_STRICT} allows no others", help="add `additionalProperties`")
    elif not declared and not patterns and not required and "additionalProperties" not in node:
        _only_empty(ctx, node, ptr, "object", _OBJECT_OPENERS, "add `\"additionalProperties\": {}` to allow any")


def strict_array(ctx: Context, node: dict, ptr: str) -> None:
    """Report what strict mode does to an array schema.

    >>> from steerc.constraints.schema import check_json_schema
    >>> text = '{"type": "array", "maxItems": 3}'
    >>> [(p.severity, text[p.offset:p.end]) for p in check_json_schema(text)[1]]
    [('warning', '"maxItems"')]
    """
    prefix = len(node["prefixItems"]) if isinstance(node.get("prefixItems"), list) else 0
    most, least = node.get("maxItems"), node.get("minItems")
    if _number(most) and most < prefix:
        ctx.error(pointer(ptr, "maxItems"), f"`maxItems` ({most}) is less than the {prefix} schemas in "
                                            "`prefixItems`, which structured decoding cannot compile")
    if node.get("items", node.get("unevaluatedItems", False)) is not False:
        return
    if _number(least) and least > prefix:
        ctx.error(pointer(ptr, "minItems"), f"`minItems` ({least}) asks for more than the {prefix} items in "
                  f"`prefixItems`, and without `items` {_STRICT} allows no others",
                  help="add `items` to say what the other items are")
    elif prefix == 0 and "items" not in node:
        _only_empty(ctx, node, ptr, "array", _ARRAY_OPENERS, "add `\"items\": {}` to allow any items")


def _only_empty(ctx: Context, node: dict, ptr: str, kind: str, openers: tuple[str, ...], help: str) -> None:
    """Warn at the first keyword that closes an object/array that declares nothing it may hold."""
    closing = [k for k in node if k in KEYWORDS_BY_TYPE[kind] and k not in openers]
    if closing:
        empty = "{}" if kind == "object" else "[]"
        ctx.warn(pointer(ptr, closing[0]), f"with `{closing[0]}` but nothing declared, {_STRICT} accepts only "
                                          f"the empty {kind} `{empty}` here", help=help)
