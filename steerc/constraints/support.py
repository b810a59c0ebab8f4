"""Walk the subschemas structured decoding compiles, applying :data:`.keywords.XGRAMMAR_SUPPORT`.

xgrammar 0.2.9 compiles a schema object by the first of ``$ref``, ``const``,
``enum``, ``anyOf``, ``oneOf``, ``allOf`` it has (the keywords beside it are
ignored), else by its ``type``. Without a ``type`` it infers ``object`` from
``properties``/``additionalProperties``/``unevaluatedProperties`` and
``array`` from ``items``/``prefixItems``/``unevaluatedItems``; otherwise any
value is accepted and the type-specific keywords are ignored. Each dropped
keyword becomes an ``unsupported-schema-keyword`` warning; what xgrammar
refuses to compile (``false`` subschemas, empty ranges) becomes an error.

>>> from steerc.constraints.schema import check_json_schema
>>> [p.message for p in check_json_schema('{"minLength": 2}')[1]]
['`minLength` is ignored by structured decoding because the schema has no `type`']
"""

from __future__ import annotations

import math

from steerc.constraints._common import did_you_mean, show
from steerc.constraints.context import Context
from steerc.constraints.jsonpos import pointer
from steerc.constraints.keywords import DISPATCH_ORDER, KEYWORDS_BY_TYPE, SUPPORTED_FORMATS, XGRAMMAR_SUPPORT
from steerc.constraints.metaschema import TYPES
from steerc.constraints.refs import local_ref_targets
from steerc.constraints.regex import check_regex
from steerc.constraints.strict import strict_array, strict_object

_BESIDE_HELP = {
    "$ref": "structured decoding only follows the `$ref`; move the keyword into the referenced schema",
    "const": "the `const` value alone decides what is allowed",
    "enum": "the `enum` values alone decide what is allowed",
    "anyOf": "repeat the keyword inside each branch",
    "oneOf": "repeat the keyword inside each branch",
    "allOf": "move the keyword into the `allOf` schema",
}
_PAIRS = (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
          ("minProperties", "maxProperties", "object"), ("minimum", "maximum", "number"))
_TYPE_OF = {kw: t for t, kws in KEYWORDS_BY_TYPE.items() for kw in kws}
_ROUND = {"minimum": math.ceil, "exclusiveMinimum": math.floor, "maximum": math.floor, "exclusiveMaximum": math.ceil}


def walk(ctx: Context, node: object, ptr: str, default_type: str | None) -> None:
    """Check the schema at ``ptr`` and every subschema xgrammar would compile from it.

    >>> from steerc.constraints.jsonpos import parse_json
    >>> text = '{"type": "array", "items": {"not": {}}}'
    >>> ctx = Context(parse_json(text)[0], text)
    >>> walk(ctx, ctx.doc.value, "", None)
    >>> [(p.severity, text[p.offset:p.end]) for p in ctx.problems]
    [('warning', '"not"')]
    """
    _Walker(ctx).schema(node, ptr, default_type)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _applies(group: str, types: set[str]) -> bool:
    return group in types or (group == "number" and "integer" in types)


def _json_type(value: object) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number", "integer"} if value.is_integer() else {"number"}
    return {{str: "string", list: "array", dict: "object"}.get(type(value), "null")}


def anchored(pattern: str) -> bool:
    """Whether a pattern means the same searched (JSON Schema) and fully matched (xgrammar).

    >>> anchored("^[a-z]+$"), anchored("[a-z]+")
    (True, False)
    """
    return pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")


class _Walker:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.targets = local_ref_targets(ctx.doc.value)

    def schema(self, node: object, ptr: str, default_type: str | None) -> None:
        if node is False:
            self.false_schema(ptr)
        if not isinstance(node, dict):
            return
        self.defs(node, ptr)
        dispatch = next((k for k in DISPATCH_ORDER if k in node), None)
        if dispatch is not None:
            self.dispatched(node, ptr, dispatch)
            return
        types = self.types(node, default_type)
        for key, value in node.items():
            self.keyword(key, value, pointer(ptr, key), types)
        self.consistency(node, ptr, types)
        if _applies("object", types):
            strict_object(self.ctx, node, ptr)
        if _applies("array", types):
            strict_array(self.ctx, node, ptr)
        self.children(node, ptr, types)

    def false_schema(self, ptr: str) -> None:
        parent = ptr.rsplit("/", 2)[-2] if ptr.count("/") >= 2 else ""
        help = ("to forbid the property, leave it out of `properties` and set `\"additionalProperties\": false`"
                if parent == "properties" else None)
        where = "" if ptr == "" else " here"
        self.ctx.error(ptr, f"structured decoding cannot compile the schema `false`{where} (it accepts nothing)",
                       help=help)

    def defs(self, node: dict, ptr: str) -> None:
        """Walk the ``$defs`` some local ``$ref`` uses (the others are never compiled)."""
        for container in ("$defs", "definitions"):
            defs = node.get(container)
            for name, sub in defs.items() if isinstance(defs, dict) else ():
                here = pointer(pointer(ptr, container), name)
                used = any(t == here or t.startswith(here + "/") for t in self.targets)
                if used and isinstance(sub, dict):
                    self.schema(sub, here, None)

    def dispatched(self, node: dict, ptr: str, dispatch: str) -> None:
        for key, value in node.items():
            status = XGRAMMAR_SUPPORT.get(key, ("annotation", ""))[0]
            if key == dispatch or status == "annotation" or key in ("$defs", "definitions"):
                continue
            if key == "type" and dispatch in ("const", "enum") and self.values_fit_type(node, dispatch, value):
                continue
            self.ctx.warn(pointer(ptr, key), f"`{key}` beside `{dispatch}` is ignored by structured decoding",
                          help=_BESIDE_HELP[dispatch])
        branches = node[dispatch]
        if dispatch in ("anyOf", "oneOf") and isinstance(branches, list):
            for index, sub in enumerate(branches):
                self.schema(sub, pointer(pointer(ptr, dispatch), index), None)
        elif dispatch == "allOf" and isinstance(branches, list):
            if len(branches) == 1:
                self.schema(branches[0], pointer(pointer(ptr, "allOf"), 0), None)
            elif len(branches) > 1:
                self.ctx.warn(pointer(ptr, "allOf"), "`allOf` with more than one schema is ignored by structured "
                              "decoding: the value is left unconstrained", help="merge the schemas into one")
                self.errors_only(branches, pointer(ptr, "allOf"))

    def errors_only(self, branches: list, ptr: str) -> None:
        """xgrammar still compiles every ``allOf`` branch it then ignores: keep their errors, not warnings."""
        inner = _Walker(Context(self.ctx.doc, self.ctx.text))
        for index, sub in enumerate(branches):
            inner.schema(sub, pointer(ptr, index), None)
        self.ctx.problems.extend(p for p in inner.ctx.problems if p.severity == "error")

    @staticmethod
    def values_fit_type(node: dict, dispatch: str, declared: object) -> bool:
        """Whether every ``const``/``enum`` value has the declared type (then `type` loses nothing)."""
        values = [node["const"]] if dispatch == "const" else node["enum"]
        listed = declared if isinstance(declared, list) else [declared]
        allowed = {t for t in listed if isinstance(t, str)}
        return isinstance(values, list) and all(_json_type(v) & allowed for v in values)

    @staticmethod
    def types(node: dict, default_type: str | None) -> set[str]:
        declared = node.get("type")
        if "type" in node:  # a malformed `type` is an error already: assume any type, warn no further
            listed = declared if isinstance(declared, list) else [declared]
            return {t for t in listed if isinstance(t, str) and t in TYPES} or set(TYPES)
        if default_type is not None:
            return {default_type}
        if any(k in node for k in ("properties", "additionalProperties", "unevaluatedProperties")):
            return {"object"}
        if any(k in node for k in ("items", "prefixItems", "unevaluatedItems")):
            return {"array"}
        return set()

    def keyword(self, key: str, value: object, ptr: str, types: set[str]) -> None:
        status, note = XGRAMMAR_SUPPORT.get(key, ("annotation", ""))
        group = _TYPE_OF.get(key)
        if group is not None and not _applies(group, types):
            if not types:
                self.ctx.warn(ptr, f"`{key}` is ignored by structured decoding because the schema has no `type`",
                              help=f'add `"type": "{group}"`')
            return
        if status == "ignored":
            self.ctx.warn(ptr, f"`{key}` is ignored by structured decoding: {note}")
        elif key == "multipleOf" and _is_number(value) and not (
                types == {"integer"} and float(value).is_integer()):
            self.ctx.warn(ptr, "`multipleOf` is ignored by structured decoding unless the type is `integer` "
                               "and the divisor a whole number")
        elif key == "format" and isinstance(value, str) and value not in SUPPORTED_FORMATS:
            self.ctx.warn(ptr, f"format {show(value)} is not enforced by structured decoding",
                          help=did_you_mean(value, SUPPORTED_FORMATS)
                          or "enforced: " + ", ".join(sorted(SUPPORTED_FORMATS)))
        elif key == "pattern" and isinstance(value, str):
            self.pattern_semantics(value, ptr)

    def pattern_semantics(self, pattern: str, ptr: str) -> None:
        if anchored(pattern) or check_regex(pattern):
            return
        self.ctx.warn(ptr, "structured decoding matches this pattern against the whole string, while JSON "
                           "Schema only searches for it", help=f"write `^{pattern}$` if that is what you mean, "
                           "or wrap it as `^.*(...).*$` to search")

    def consistency(self, node: dict, ptr: str, types: set[str]) -> None:
        """Errors for ranges xgrammar refuses: min above max, fractional integer bounds."""
        for low, high, group in _PAIRS:
            a, b = node.get(low), node.get(high)
            if _applies(group, types) and _is_number(a) and _is_number(b) and a > b:
                self.ctx.error(pointer(ptr, low), f"`{low}` ({a}) is greater than `{high}` ({b}), so no value "
                                                  "can match")
        for key, rounding in _ROUND.items():
            value = node.get(key)
            if "integer" in types and isinstance(value, float) and math.isfinite(value) and not value.is_integer():
                self.ctx.error(pointer(ptr, key), f"structured decoding needs a whole-number `{key}` for an "
                                                  f"`integer`, not {value}", help=f"write `{rounding(value)}`")
        names = node.get("propertyNames")
        if _applies("object", types) and isinstance(names, bool):
            self.ctx.error(pointer(ptr, "propertyNames"), f"structured decoding needs `propertyNames` as an object "
                                                          f"schema, not `{str(names).lower()}`",
                           help="remove it: `true` allows any name" if names else "use `\"maxProperties\": 0`")
        if _applies("object", types) and isinstance(names, dict) and names.get("type", "string") != "string":
            self.ctx.error(pointer(pointer(ptr, "propertyNames"), "type"),
                           "`propertyNames` must describe strings: property names are always strings")

    def children(self, node: dict, ptr: str, types: set[str]) -> None:
        if _applies("object", types):
            for name in ("properties", "patternProperties"):
                subs = node.get(name)
                for key, sub in subs.items() if isinstance(subs, dict) else ():
                    here = pointer(pointer(ptr, name), key)
                    if name == "patternProperties" and not anchored(key) and not check_regex(key):
                        self.ctx.warn(here, "structured decoding matches `patternProperties` keys against the "
                                            "whole property name, while JSON Schema only searches",
                                      help=f"write `^{key}$` if that is what you mean")
                    self.schema(sub, here, None)
            for name, default in (("additionalProperties", None), ("unevaluatedProperties", None),
                                  ("propertyNames", "string")):
                if isinstance(node.get(name), dict):
                    self.schema(node[name], pointer(ptr, name), default)
        if _applies("array", types):
            prefix = node.get("prefixItems")
            for index, sub in enumerate(prefix) if isinstance(prefix, list) else ():
                self.schema(sub, pointer(pointer(ptr, "prefixItems"), index), None)
            for name in ("items", "unevaluatedItems"):
                if isinstance(node.get(name), dict):
                    self.schema(node[name], pointer(ptr, name), None)


__all__ = ["anchored", "walk"]
