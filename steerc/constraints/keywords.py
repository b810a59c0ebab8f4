"""What xgrammar's JSON-schema conversion does with each keyword: the tables every schema check reads.

>>> XGRAMMAR_SUPPORT["uniqueItems"][0], "date" in SUPPORTED_FORMATS, DISPATCH_ORDER[0]
('ignored', True, '$ref')
"""

from __future__ import annotations

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


__all__ = ["DISPATCH_ORDER", "KEYWORDS_BY_TYPE", "SUPPORTED_FORMATS", "XGRAMMAR_SUPPORT", "XGRAMMAR_VERSION"]
