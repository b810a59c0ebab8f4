"""``pattern`` values and ``$ref``s inside a schema: regex problems at their offsets, and local references
that must resolve (anchors and other documents are warnings: structured decoding does not follow them).
"""

from __future__ import annotations

import urllib.parse

from steerc.constraints import Problem
from steerc.constraints._common import did_you_mean, show
from steerc.constraints.context import Context, kind
from steerc.constraints.jsonpos import char_offsets, pointer
from steerc.constraints.regex import check_regex


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


__all__ = ["check_pattern", "check_ref", "local_ref_targets", "resolve"]
