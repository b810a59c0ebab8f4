"""The JSON Schema draft 2020-12 meta-schema, checked by hand, with positions.

Each keyword of the core, applicator, unevaluated, validation, meta-data,
format-annotation and content vocabularies has a checker for the shape of its
value; :func:`check_schema` walks a schema and its subschemas. Unknown
keywords become ``unsupported-schema-keyword`` warnings with a suggestion.

>>> from steerc.constraints.jsonpos import parse_json
>>> doc, _ = parse_json('{"type": "object", "required": ["a", "a"]}')
>>> ctx = Context(doc, "")
>>> check_schema(ctx, doc.value, "")
>>> [(p.message, p.offset) for p in ctx.problems]
[('`required` lists `a` twice', 37)]
"""

from __future__ import annotations

import math
import re

from steerc.constraints._common import did_you_mean, show
from steerc.constraints.context import Context, kind
from steerc.constraints.jsonpos import pointer
from steerc.constraints.refs import check_pattern, check_ref

TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_TYPE_ALIASES = {"int": "integer", "float": "number", "double": "number", "str": "string", "bool": "boolean",
                 "dict": "object", "list": "array", "none": "null", "map": "object"}
INT32_MAX = 2**31 - 1
_LEGACY = {
    "definitions": "`definitions` is the draft-07 name; draft 2020-12 uses `$defs`",
    "dependencies": "draft 2020-12 splits `dependencies` into `dependentRequired` and `dependentSchemas`",
    "nullable": 'JSON Schema has no `nullable`; write `"type": ["string", "null"]`',
    "additionalItems": "draft 2020-12 replaced `additionalItems` with `items` (next to `prefixItems`)",
    "$recursiveRef": "draft 2020-12 replaced `$recursiveRef` with `$dynamicRef`",
}


def name_of(ptr: str) -> str:
    """The last reference token of a pointer, unescaped.

    >>> name_of("/properties/a~1b")
    'a/b'
    """
    return ptr.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")


def check_schema(ctx: Context, value: object, ptr: str) -> None:
    """Check that ``value`` (at ``ptr``) is a schema, then each of its keywords.

    >>> from steerc.constraints.jsonpos import parse_json
    >>> doc, _ = parse_json('{"items": {"minItems": -1}}')
    >>> ctx = Context(doc, "")
    >>> check_schema(ctx, doc.value, "")
    >>> ctx.problems[0].message
    '`minItems` must be a non-negative integer, not -1'
    """
    if isinstance(value, bool):
        return
    if not isinstance(value, dict):
        where = f"`{name_of(ptr)}`" if ptr else "the document"
        ctx.error(ptr, f"{where} must be a schema (an object or a boolean), not {kind(value)}")
        return
    for key, sub in value.items():
        here = pointer(ptr, key)
        checker = KEYWORDS.get(key)
        if checker is not None:
            checker(ctx, sub, here)
        elif key in _LEGACY:
            ctx.warn(here, f"`{key}` is not a draft 2020-12 keyword; structured decoding ignores it",
                     help=_LEGACY[key])
            if key == "definitions" and isinstance(sub, dict):
                _schema_map(ctx, sub, here)
        else:
            ctx.warn(here, f"unknown keyword {show(key)}; structured decoding ignores it",
                     help=did_you_mean(key, KEYWORDS))


# ------------------------------------------------------------- value shapes


def _expect(ctx: Context, value: object, ptr: str, ok: bool, what: str, help: str | None = None) -> bool:
    if not ok:
        ctx.error(ptr, f"`{name_of(ptr)}` must be {what}, not {kind(value)}", help=help)
    return ok


def _string(ctx, value, ptr):
    _expect(ctx, value, ptr, isinstance(value, str), "a string")


def _boolean(ctx, value, ptr):
    _expect(ctx, value, ptr, isinstance(value, bool), "a boolean")


def _number(ctx, value, ptr) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    help = None
    if isinstance(value, bool) and ptr.endswith(("/exclusiveMinimum", "/exclusiveMaximum")):
        help = f"draft 2020-12 takes the bound itself, e.g. `\"{name_of(ptr)}\": 0`"
    return _expect(ctx, value, ptr, ok, "a number", help)


def _anything(ctx, value, ptr):
    """``const``, ``default``: any JSON value."""


def _array(ctx, value, ptr):
    _expect(ctx, value, ptr, isinstance(value, list), "an array")


def _enum(ctx, value, ptr):
    if _expect(ctx, value, ptr, isinstance(value, list), "an array of the allowed values") and not value:
        ctx.error(ptr, "`enum` is empty, so no value could match", help="list at least one value")


def _count(ctx, value, ptr):
    """A non-negative integer small enough for structured decoding."""
    if not _number(ctx, value, ptr):
        return
    if value < 0:
        ctx.error(ptr, f"`{name_of(ptr)}` must be a non-negative integer, not {value}")
    elif isinstance(value, float) and not value.is_integer():
        ctx.error(ptr, f"`{name_of(ptr)}` must be a whole number, not {value}")
    elif isinstance(value, float):
        ctx.error(ptr, f"write `{name_of(ptr)}` as an integer: structured decoding rejects `{value}`",
                  help=f"write `{int(value)}`")
    elif value > INT32_MAX:
        ctx.error(ptr, f"`{name_of(ptr)}` is too large for structured decoding (at most {INT32_MAX})")


def _positive(ctx, value, ptr):
    """``multipleOf``: a number greater than zero."""
    if _number(ctx, value, ptr) and not (value > 0 and math.isfinite(value)):
        ctx.error(ptr, f"`multipleOf` must be greater than 0, not {value}")


def _unique_strings(ctx, value, ptr):
    """``required`` and the lists in ``dependentRequired``."""
    if not _expect(ctx, value, ptr, isinstance(value, list), "an array of strings"):
        return
    seen = set()
    for index, item in enumerate(value):
        here = pointer(ptr, index)
        if not isinstance(item, str):
            ctx.error(here, f"`{name_of(ptr)}` must list strings; item {index} is {kind(item)}")
        elif item in seen:
            ctx.error(here, f"`{name_of(ptr)}` lists {show(item)} twice")
        else:
            seen.add(item)


def _type_keyword(ctx, value, ptr):
    if isinstance(value, str):
        _type_name(ctx, value, ptr)
    elif isinstance(value, list):
        if not value:
            ctx.error(ptr, "`type` must not be an empty array", help=f"use one of {_type_list()}")
        for index, item in enumerate(value):
            here = pointer(ptr, index)
            if not isinstance(item, str):
                ctx.error(here, f"`type` entries must be strings, not {kind(item)}")
            elif item in value[:index]:
                ctx.error(here, f"`type` lists `{item}` twice")
            else:
                _type_name(ctx, item, here)
    else:
        ctx.error(ptr, f"`type` must be a type name or an array of them, not {kind(value)}",
                  help=f"use one of {_type_list()}")


def _type_name(ctx, name: str, ptr: str) -> None:
    if name in TYPES:
        return
    alias = _TYPE_ALIASES.get(name.casefold())
    help = f"did you mean `{alias}`?" if alias else did_you_mean(name, TYPES)
    ctx.error(ptr, f"`type` must be one of {_type_list()}, not {show(name)}", help=help)


def _type_list() -> str:
    return ", ".join(f"`{t}`" for t in TYPES)


def _schema(ctx, value, ptr):
    check_schema(ctx, value, ptr)


def _schema_map(ctx, value, ptr):
    """``properties``, ``$defs``, ``dependentSchemas``: an object whose values are schemas."""
    if _expect(ctx, value, ptr, isinstance(value, dict), "an object mapping names to schemas"):
        for key, sub in value.items():
            check_schema(ctx, sub, pointer(ptr, key))


def _schema_list(ctx, value, ptr):
    """``allOf``/``anyOf``/``oneOf``/``prefixItems``: a non-empty array of schemas."""
    if not _expect(ctx, value, ptr, isinstance(value, list), "a non-empty array of schemas"):
        return
    if not value:
        ctx.error(ptr, f"`{name_of(ptr)}` must not be empty")
    for index, sub in enumerate(value):
        check_schema(ctx, sub, pointer(ptr, index))


def _items(ctx, value, ptr):
    help = "draft 2020-12 uses `prefixItems` for a list of per-position schemas" if isinstance(value, list) else None
    if _expect(ctx, value, ptr, isinstance(value, (dict, bool)), "a schema (an object or a boolean)", help):
        check_schema(ctx, value, ptr)


def _dependent_required(ctx, value, ptr):
    if _expect(ctx, value, ptr, isinstance(value, dict), "an object mapping names to arrays of names"):
        for key, sub in value.items():
            _unique_strings(ctx, sub, pointer(ptr, key))


def _vocabulary(ctx, value, ptr):
    if _expect(ctx, value, ptr, isinstance(value, dict), "an object mapping URIs to booleans"):
        for key, sub in value.items():
            _boolean(ctx, sub, pointer(ptr, key))


def _anchor(ctx, value, ptr):
    if _expect(ctx, value, ptr, isinstance(value, str), "a string") and not re.fullmatch(
            r"[A-Za-z_][-A-Za-z0-9._]*", value):
        ctx.error(ptr, f"`{name_of(ptr)}` must be a plain name like `node`, not {show(value)}")


def _pattern(ctx, value, ptr):

    if _expect(ctx, value, ptr, isinstance(value, str), "a string holding a regular expression"):
        check_pattern(ctx, value, ptr, key=False)


def _pattern_properties(ctx, value, ptr):

    if _expect(ctx, value, ptr, isinstance(value, dict), "an object mapping regexes to schemas"):
        for key, sub in value.items():
            check_pattern(ctx, key, pointer(ptr, key), key=True)
            check_schema(ctx, sub, pointer(ptr, key))


def _ref(ctx, value, ptr):

    if _expect(ctx, value, ptr, isinstance(value, str), "a string"):
        check_ref(ctx, value, ptr)


KEYWORDS = {
    # core
    "$schema": _string, "$id": _string, "$ref": _ref, "$anchor": _anchor, "$dynamicRef": _string,
    "$dynamicAnchor": _anchor, "$vocabulary": _vocabulary, "$comment": _string, "$defs": _schema_map,
    # applicator
    "prefixItems": _schema_list, "items": _items, "contains": _schema, "additionalProperties": _schema,
    "properties": _schema_map, "patternProperties": _pattern_properties, "dependentSchemas": _schema_map,
    "propertyNames": _schema, "if": _schema, "then": _schema, "else": _schema,
    "allOf": _schema_list, "anyOf": _schema_list, "oneOf": _schema_list, "not": _schema,
    # unevaluated
    "unevaluatedItems": _schema, "unevaluatedProperties": _schema,
    # validation
    "type": _type_keyword, "const": _anything, "enum": _enum, "multipleOf": _positive,
    "maximum": _number, "exclusiveMaximum": _number, "minimum": _number, "exclusiveMinimum": _number,
    "maxLength": _count, "minLength": _count, "pattern": _pattern,
    "maxItems": _count, "minItems": _count, "uniqueItems": _boolean, "maxContains": _count, "minContains": _count,
    "maxProperties": _count, "minProperties": _count, "required": _unique_strings,
    "dependentRequired": _dependent_required,
    # meta-data
    "title": _string, "description": _string, "default": _anything, "deprecated": _boolean,
    "readOnly": _boolean, "writeOnly": _boolean, "examples": _array,
    # format-annotation
    "format": _string,
    # content
    "contentEncoding": _string, "contentMediaType": _string, "contentSchema": _schema,
}
