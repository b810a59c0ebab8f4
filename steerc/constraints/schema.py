"""Check a ``constrain json_schema`` text: JSON syntax, the 2020-12 meta-schema, and xgrammar support.

:func:`check_json_schema` parses with positions (:mod:`.jsonpos`), checks
every keyword's shape (:mod:`.metaschema`), then walks the subschemas that
structured decoding actually compiles and warns (``unsupported-schema-keyword``)
about keywords xgrammar ignores, per :data:`XGRAMMAR_SUPPORT`.

>>> schema, problems = check_json_schema('{"type": "array", "items": {}, "uniqueItems": true}')
>>> [(p.severity, p.message) for p in problems]
[('warning', '`uniqueItems` is ignored by structured decoding: duplicate items are not prevented')]
"""

from __future__ import annotations

import urllib.parse

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import did_you_mean, show, xgrammar_error, xgrammar_problem
from steerc.constraints.jsonpos import char_offsets, parse_json, pointer
from steerc.constraints.metaschema import Context, check_schema, kind
from steerc.constraints.regex import check_regex

# How xgrammar's JSON-schema-to-grammar conversion treats each draft 2020-12 keyword.
#
# Determined for xgrammar 0.2.9 (the CPU wheel in steerc's venv). The wheel
# ships no C++ source, so the upstream json_schema_converter.cc was read for
# the structure (dispatch order, type inference, annotation keys), and every
# verdict was then settled by experiment on the installed 0.2.9: for each
# keyword, a schema using it plus one instance the keyword must reject and one
# it must accept were given to ``xgrammar.Grammar.from_json_schema`` (default
# options: any_whitespace, strict_mode) and matched with
# ``xgrammar.testing._is_grammar_accept_string``. A keyword is "ignored" when
# the instance it must reject is still accepted. The same experiments showed
# what 0.2.9 refuses outright (a ``false`` subschema under properties,
# patternProperties, prefixItems or anyOf/oneOf; min above max; fractional
# bounds for ``integer``; counts written as 2.0; an unresolvable local $ref);
# support.py reports those as errors; strict.py covers what the default
# strict_mode (undeclared properties/items not allowed) does to a schema.
# tests/constraints/test_constraints_xgrammar.py
# (test_support_table_matches_xgrammar) re-runs the experiments.
#
#   enforced   - compiled into the grammar
#   partial    - enforced only in some forms (see the note; the walk checks the form)
#   ignored    - silently dropped: a warning
#   annotation - dropped, as draft 2020-12 allows for annotations: no warning
XGRAMMAR_VERSION = "0.2.9"
XGRAMMAR_SUPPORT: dict[str, tuple[str, str]] = {
    "type": ("enforced", "also a type array"),
    "const": ("enforced", "every other keyword beside it is ignored"),
    "enum": ("enforced", "every other keyword beside it except `const` is ignored"),
    "$ref": ("partial", "only `#` and `#/...` pointers; anchors and other documents match anything; "
                        "keywords beside `$ref` are ignored"),
    "$defs": ("enforced", "as `$ref` targets (`definitions` too)"),
    "anyOf": ("enforced", "keywords beside it are ignored"),
    "oneOf": ("partial", "treated as `anyOf` unless the branches are provably disjoint"),
    "allOf": ("partial", "a single subschema only; with several, the value is left unconstrained"),
    "multipleOf": ("partial", "only for `integer` with a whole-number divisor"),
    "minimum": ("enforced", ""), "maximum": ("enforced", ""),
    "exclusiveMinimum": ("enforced", ""), "exclusiveMaximum": ("enforced", ""),
    "minLength": ("enforced", ""), "maxLength": ("enforced", ""),
    "pattern": ("partial", "matched against the whole string, not searched for"),
    "format": ("partial", "only the formats in SUPPORTED_FORMATS"),
    "items": ("enforced", "absent means no items beyond `prefixItems` (strict mode)"), "prefixItems": ("enforced", ""), "unevaluatedItems": ("enforced", ""),
    "minItems": ("enforced", ""), "maxItems": ("enforced", ""),
    "properties": ("enforced", ""), "required": ("enforced", "only names declared in `properties` (strict mode)"),
    "additionalProperties": ("enforced", "absent means no others are allowed (strict mode)"),
    "patternProperties": ("partial", "keys must match the whole pattern"),
    "propertyNames": ("enforced", "must describe strings"),
    "minProperties": ("enforced", ""), "maxProperties": ("enforced", ""), "unevaluatedProperties": ("enforced", ""),
    "uniqueItems": ("ignored", "duplicate items are not prevented"),
    "contains": ("ignored", "arrays need not contain a matching item"),
    "minContains": ("ignored", "the count of matching items is not checked"),
    "maxContains": ("ignored", "the count of matching items is not checked"),
    "dependentRequired": ("ignored", "dependent properties are not required"),
    "dependentSchemas": ("ignored", "dependent schemas are not applied"),
    "not": ("ignored", "the excluded values are still allowed"),
    "if": ("ignored", "conditionals are not applied"),
    "then": ("ignored", "conditionals are not applied"),
    "else": ("ignored", "conditionals are not applied"),
    "$dynamicRef": ("ignored", "the value is left unconstrained"),
    **{k: ("annotation", "") for k in (
        "$schema", "$id", "$anchor", "$dynamicAnchor", "$vocabulary", "$comment", "title", "description",
        "default", "deprecated", "readOnly", "writeOnly", "examples",
        "contentEncoding", "contentMediaType", "contentSchema")},
}
SUPPORTED_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
    "uuid", "uri-template", "json-pointer", "relative-json-pointer"})  # not: idn-*, iri*, regex
# A schema object is compiled by the first of these it has; the keywords beside it are ignored.
DISPATCH_ORDER = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
# Otherwise by its `type`; these keywords only count for their type. Without a `type`, xgrammar
# infers `object` from properties/additionalProperties/unevaluatedProperties and `array` from
# items/prefixItems/unevaluatedItems, and ignores the rest.
KEYWORDS_BY_TYPE = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "unevaluatedItems", "minItems", "maxItems", "uniqueItems",
              "contains", "minContains", "maxContains"),
    "object": ("properties", "additionalProperties", "unevaluatedProperties", "patternProperties",
               "propertyNames", "required", "minProperties", "maxProperties", "dependentRequired",
               "dependentSchemas"),
}


def check_json_schema(text: str, use_xgrammar: bool = False) -> tuple[dict | bool | None, list[Problem]]:
    """Check a JSON Schema text; return ``(schema or None, problems)``.

    The schema is ``None`` when the text is not JSON. With ``use_xgrammar=True``
    and no errors of its own, also run ``xgrammar.Grammar.from_json_schema``.

    >>> check_json_schema('{"type": "object", "properties": {"a": {"type": "strin"}')[1][0].message
    'unexpected end of text — 2 `{` still open'
    >>> [(p.offset, p.help) for p in check_json_schema('{"type": "strin"}')[1]]
    [(9, 'did you mean `string`?')]
    """
    doc, problems = parse_json(text)
    if doc is None:
        return None, problems
    ctx = Context(doc, text, problems)
    try:
        check_schema(ctx, doc.value, "")
        from steerc.constraints.support import walk  # noqa: PLC0415  (support imports this module)

        walk(ctx, doc.value, "", None)
    except RecursionError:
        ctx.problems.append(Problem(INVALID, "the schema is nested too deeply to check", None))
    if use_xgrammar and not any(p.severity == "error" for p in ctx.problems):
        message = xgrammar_error(lambda xgr: xgr.Grammar.from_json_schema(text), key="json_schema:" + text)
        if message is not None:
            ctx.problems.append(xgrammar_problem(message, None))
    ctx.problems.sort(key=lambda p: (p.offset is None, p.offset or 0))
    value = doc.value if isinstance(doc.value, (dict, bool)) else None
    return value, ctx.problems


def check_pattern(ctx: Context, pattern: str, ptr: str, key: bool) -> None:
    """Report the regex problems of a ``pattern`` value or ``patternProperties`` key at their offsets.

    >>> from steerc.constraints.jsonpos import parse_json
    >>> text = '{"pattern": "ab)"}'
    >>> ctx = Context(parse_json(text)[0], text)
    >>> check_pattern(ctx, "ab)", "/pattern", key=False)
    >>> [(p.message, p.offset) for p in ctx.problems]
    [('in `pattern`: unmatched `)`', 15)]
    """
    start, _ = ctx.span(ptr, key)
    where = "`patternProperties` key" if key else "`pattern`"
    offsets = char_offsets(ctx.text, start) if start is not None else None
    for p in check_regex(pattern):
        ctx.problems.append(Problem(p.code, f"in {where}: {p.message}", _at(offsets, p.offset),
                                    _at(offsets, p.end), p.help))


def _at(offsets: list[int] | None, index: int | None) -> int | None:
    if offsets is None or index is None:
        return None
    return offsets[min(index, len(offsets) - 1)]


def check_ref(ctx: Context, ref: str, ptr: str) -> None:
    """A ``$ref`` must resolve when it is local; other forms structured decoding cannot follow.

    >>> from steerc.constraints.jsonpos import parse_json
    >>> text = '{"$ref": "#/$defs/b", "$defs": {"a": {}}}'
    >>> ctx = Context(parse_json(text)[0], text)
    >>> check_ref(ctx, "#/$defs/b", "/$ref")
    >>> ctx.problems[0].message
    '`$ref` `#/$defs/b` does not resolve: there is no `b` in `#/$defs`'
    """
    if ref == "#" or ref.startswith("#/"):
        _check_local_ref(ctx, ref, ptr)
    elif ref.startswith("#"):
        if _find_anchor(ctx.doc.value, ref[1:]):
            ctx.warn(ptr, f"`$ref` to the anchor {show(ref)} is not followed by structured decoding: "
                          "the value is left unconstrained", help="refer to it by pointer, like `#/$defs/name`")
        else:
            ctx.error(ptr, f"`$ref` {show(ref)} does not resolve: no `$anchor` is named {show(ref[1:])}")
    else:
        ctx.warn(ptr, f"`$ref` to another document ({show(ref)}) is not followed by structured decoding: "
                      "the value is left unconstrained", help="copy the schema into `$defs` and use `#/$defs/...`")


def _check_local_ref(ctx: Context, ref: str, ptr: str) -> None:
    target = resolve(ctx.doc.value, ref)
    if isinstance(target, _Missing):
        ctx.error(ptr, f"`$ref` {show(ref)} does not resolve: there is no {show(target.token)} in "
                       f"{show(target.parent)}", help=did_you_mean(target.token, target.choices))
    elif target is False:
        ctx.error(ptr, f"`$ref` {show(ref)} points at the schema `false`, which structured decoding "
                       "cannot compile")
    elif not isinstance(target, (dict, bool)):
        ctx.error(ptr, f"`$ref` {show(ref)} points at {kind(target)}, not a schema")
    elif _ref_cycle(ctx.doc.value, ptr.rsplit("/", 1)[0], target):
        ctx.error(ptr, f"`$ref` {show(ref)} only leads back to itself through other `$ref`s, so there is no "
                       "schema to follow", help="point it at a schema with content")


def _ref_cycle(root: object, here: str, target: object) -> bool:
    """Whether following ``$ref`` from the schema at ``here`` only ever meets more ``$ref``s and comes back."""
    seen = {here}
    while isinstance(target, dict) and isinstance(target.get("$ref"), str):
        ref = target["$ref"]
        if not (ref == "#" or ref.startswith("#/")):
            return False
        place = _as_pointer(ref)
        if place in seen:
            return True
        seen.add(place)
        target = resolve(root, ref)
    return False


def _as_pointer(ref: str) -> str:
    """A local ``$ref`` as the JSON pointer of what it names (``#/$defs/a%20b`` -> ``/$defs/a b``)."""
    if ref == "#":
        return ""
    tokens = [urllib.parse.unquote(t).replace("~1", "/").replace("~0", "~") for t in ref[2:].split("/")]
    return "".join(pointer("", t) for t in tokens)


class _Missing:
    def __init__(self, parent: str, token: str, choices: list[str]):
        self.parent, self.token, self.choices = parent, token, choices


def resolve(root: object, ref: str) -> object:
    """The value a local ``$ref`` (``#`` or ``#/...``) points at, or a ``_Missing``.

    >>> resolve({"$defs": {"a b": 1}}, "#/$defs/a%20b")
    1
    """
    node, walked = root, "#"
    for raw in ref[2:].split("/") if ref != "#" else []:
        token = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isascii() and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _Missing(walked, token, list(node) if isinstance(node, dict) else [])
        walked = walked + "/" + raw
    return node


def _find_anchor(node: object, name: str) -> bool:
    if isinstance(node, dict):
        if node.get("$anchor") == name or node.get("$dynamicAnchor") == name:
            return True
        return any(_find_anchor(v, name) for v in node.values())
    if isinstance(node, list):
        return any(_find_anchor(v, name) for v in node)
    return False


def local_ref_targets(node: object, out: set[str] | None = None) -> set[str]:
    """Every local ``$ref`` in the document, as a JSON pointer (``#/$defs/a`` -> ``/$defs/a``).

    >>> sorted(local_ref_targets({"a": {"$ref": "#/$defs/x"}, "$ref": "#"}))
    ['', '/$defs/x']
    """
    out = set() if out is None else out
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            out.add(_as_pointer(ref))
        for value in node.values():
            local_ref_targets(value, out)
    elif isinstance(node, list):
        for value in node:
            local_ref_targets(value, out)
    return out


__all__ = ["DISPATCH_ORDER", "KEYWORDS_BY_TYPE", "SUPPORTED_FORMATS", "XGRAMMAR_SUPPORT", "XGRAMMAR_VERSION",
           "check_json_schema"]
