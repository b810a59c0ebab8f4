"""A small JSON Schema checker for steerc's own formats (no dependencies).

steerc's wire formats are described by JSON Schemas in ``spec/`` (for users,
and for their tools) and read back by servers that must refuse anything
malformed with the field at fault. This module checks a decoded document
against such a schema using the subset of 2020-12 keywords those schemas
use — ``type``, ``const``, ``enum``, ``properties``, ``required``,
``additionalProperties: false``, ``items``, ``minItems``, ``maxItems``,
``uniqueItems``, ``prefixItems`` (with ``items: false``), ``minimum``, ``exclusiveMinimum``,
``maximum``, ``pattern``, ``minLength``, ``maxLength``, ``oneOf``, ``not``,
``$ref`` (local) — so that the schema stays the one description of the
format, plus one type of steerc's own, ``bytes`` (msgpack's binary type). Numbers must be finite (JSON has no NaN; Python's ``json``
reads one anyway), integers are not booleans, and nesting is bounded.

>>> schema = {"type": "object", "required": ["n"], "additionalProperties": False,
...           "properties": {"n": {"type": "integer", "minimum": 0}}}
>>> check({"n": 3}, schema)
>>> check({"n": -1}, schema, "doc")
Traceback (most recent call last):
...
steerc.core.format_schema.SchemaError: doc.n: -1 is below the minimum 0
"""

from __future__ import annotations

import math
import re

from steerc.core.errors import FieldError

MAX_DEPTH = 64


class SchemaError(FieldError):
    """A document that does not match its schema; ``field`` is the path of the fault."""

    def __init__(self, field: str, message: str, depth: int = 0):
        super().__init__(field, message)
        self.depth = depth


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "bytes": lambda v: isinstance(v, (bytes, bytearray)),  # steerc's extension, for msgpack's binary type
}


def _kind(value) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "bytes", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__


def check(doc, schema: dict, field: str = "$", root: dict | None = None) -> None:
    """Raise :class:`SchemaError` naming the first field of ``doc`` that ``schema`` refuses."""
    _check(doc, schema, field, root or schema, 0)


def _fail(field: str, message: str, depth: int):
    raise SchemaError(field, message, depth)


def _check(value, schema, field: str, root: dict, depth: int) -> None:  # noqa: C901 - one keyword per branch
    if depth > MAX_DEPTH:
        _fail(field, f"nested deeper than {MAX_DEPTH} levels", depth)
    if schema is True:
        return
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        _check(value, target, field, root, depth)
    if "oneOf" in schema:
        errors = []
        passed = 0
        for option in schema["oneOf"]:
            try:
                _check(value, option, field, root, depth)
                passed += 1
            except SchemaError as exc:
                errors.append(exc)
        if passed != 1:
            if passed == 0:
                raise max(errors, key=_rank)
            _fail(field, "matches more than one form", depth)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            _fail(field, f"expected {' or '.join(types)}, got {_kind(value)}", depth)
    if isinstance(value, float) and not math.isfinite(value):
        _fail(field, f"{value} is not a finite number", depth)
    if "const" in schema and value != schema["const"]:
        _fail(field, f"expected {schema['const']!r}, got {_short(value)}", depth + 1)
    if "enum" in schema and value not in schema["enum"]:
        _fail(field, f"expected one of {', '.join(map(repr, schema['enum']))}, got {_short(value)}", depth + 1)
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            _fail(field, f"{value} is below the minimum {schema['minimum']}", depth + 1)
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            _fail(field, f"{value} is not above {schema['exclusiveMinimum']}", depth + 1)
        if "maximum" in schema and value > schema["maximum"]:
            _fail(field, f"{value} is above the maximum {schema['maximum']}", depth + 1)
    if "not" in schema:
        try:
            _check(value, schema["not"], field, root, depth)
        except SchemaError:
            pass
        else:
            keys = schema["not"].get("required")
            _fail(field, f"cannot have all of {', '.join(keys)}" if keys else "has a form that is not allowed",
                  depth + 1)
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            _fail(field, f"shorter than {schema['minLength']} characters", depth + 1)
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            _fail(field, f"longer than {schema['maxLength']} characters", depth + 1)
        if "pattern" in schema and not re.search(schema["pattern"], value):
            _fail(field, f"{_short(value)} does not match {schema['pattern']}", depth + 1)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                _fail(f"{field}.{key}", "missing", depth + 1)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{field}.{key}", root, depth + 1)
            elif schema.get("additionalProperties") is False:
                _fail(f"{field}.{_short_key(key)}", "unknown key", depth + 1)
            elif isinstance(schema.get("additionalProperties"), dict):
                _check(item, schema["additionalProperties"], f"{field}.{_short_key(key)}", root, depth + 1)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            _fail(field, f"expected at least {schema['minItems']} items", depth + 1)
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            _fail(field, f"expected at most {schema['maxItems']} items", depth + 1)
        if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
            _fail(field, "items repeat", depth + 1)
        prefix = schema.get("prefixItems", ())
        for i, item in enumerate(value[: len(prefix)]):
            _check(item, prefix[i], f"{field}[{i}]", root, depth + 1)
        if schema.get("items") is False and len(value) > len(prefix):
            _fail(field, f"expected at most {len(prefix)} items", depth + 1)
        elif isinstance(schema.get("items"), dict):
            for i, item in enumerate(value[len(prefix):], start=len(prefix)):
                _check(item, schema["items"], f"{field}[{i}]", root, depth + 1)


def _rank(err: SchemaError) -> tuple:
    """Which failing ``oneOf`` branch to report: the one that matched deepest, and there a wrong value
    over a missing or unknown key (the branch whose shape the document has)."""
    structural = err.message in ("missing", "unknown key") or err.message.startswith("expected")
    return err.depth, not structural, len(err.field)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _short_key(key) -> str:
    text = str(key)
    return text if len(text) <= 40 else text[:37] + "..."
