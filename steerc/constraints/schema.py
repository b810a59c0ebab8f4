"""Check a ``constrain json_schema`` text: JSON syntax, the 2020-12 meta-schema, and xgrammar support.

:func:`check_json_schema` parses with positions (:mod:`.jsonpos`), checks
every keyword's shape (:mod:`.metaschema`), then walks the subschemas that
structured decoding actually compiles and warns (``unsupported-schema-keyword``)
about keywords xgrammar ignores, per :data:`.keywords.XGRAMMAR_SUPPORT`.

>>> schema, problems = check_json_schema('{"type": "array", "items": {}, "uniqueItems": true}')
>>> [(p.severity, p.message) for p in problems]
[('warning', '`uniqueItems` is ignored by structured decoding: duplicate items are not prevented')]
"""

from __future__ import annotations

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import xgrammar_error, xgrammar_problem
from steerc.constraints.context import Context
from steerc.constraints.jsonpos import parse_json
from steerc.constraints.keywords import (  # noqa: F401  (the tables, where callers have always found them)
    DISPATCH_ORDER,
    KEYWORDS_BY_TYPE,
    SUPPORTED_FORMATS,
    XGRAMMAR_SUPPORT,
    XGRAMMAR_VERSION,
)
from steerc.constraints.metaschema import check_schema
from steerc.constraints.support import walk


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


__all__ = ["DISPATCH_ORDER", "KEYWORDS_BY_TYPE", "SUPPORTED_FORMATS", "XGRAMMAR_SUPPORT", "XGRAMMAR_VERSION",
           "check_json_schema"]
