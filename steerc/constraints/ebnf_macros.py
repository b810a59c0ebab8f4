"""Arguments of xgrammar's EBNF macros, and the checks for the text-level ones.

Arguments are ``value`` or ``name = value``; a value is a string, a
non-negative integer, ``true``/``false``, a rule name, or a tuple
``(v, ...)`` (a trailing comma is allowed in tuples only). The checks mirror
xgrammar 0.2.9's ``TagDispatch``, ``Regex`` and ``Substring``.

>>> from steerc.constraints.ebnf import check_grammar
>>> check_grammar('root ::= TagDispatch(("<a>", a), loop_after_dispatch=false)\\na ::= "x"')
[]
>>> check_grammar('root ::= Regex("[a-z]+", flags="q")')[0].message
'`Regex` flags may only use `i`, `s` and `u`, not `q`'
"""

from __future__ import annotations

from steerc.constraints._common import show
from steerc.constraints.ebnf_lex import Token, fail
from steerc.core.record import frozen


@frozen
class Value:
    """One macro argument: ``kind`` is string, int, bool, name or tuple."""

    kind: str
    value: object
    start: Token
    end: Token


def parse_arguments(parser) -> tuple[list[Value], dict[str, Value], Token]:
    """Parse ``( ... )`` after a macro name; return positional and named arguments and the ``)``.

    Called by the grammar parser with the ``(`` as its next token:

    >>> from steerc.constraints.ebnf import _Parser
    >>> from steerc.constraints.ebnf_lex import tokenize
    >>> tokens, _ = tokenize('("a", (b, 1,), flag=true)')
    >>> positional, named, closing = parse_arguments(_Parser("", tokens, []))
    >>> [v.kind for v in positional], named["flag"].value, closing.kind
    (['string', 'tuple'], True, 'RPAREN')
    """
    parser.take()  # (
    positional: list[Value] = []
    named: dict[str, Value] = {}
    if parser.peek().kind == "RPAREN":
        return positional, named, parser.take()
    while True:
        if parser.peek().kind == "NAME" and parser.peek(1).kind == "EQUAL":
            key = parser.take()
            parser.take()
            if key.value in named:
                parser.note(f"the argument {show(key.value)} is given twice", key)
            named[key.value] = _value(parser)
        else:
            positional.append(_value(parser))
        token = parser.take()
        if token.kind == "RPAREN":
            return positional, named, token
        if token.kind != "COMMA":
            fail(f"expected `,` or `)` in the macro arguments, found {parser.describe(token)}", token.start, token.end)


def _value(parser) -> Value:
    token = parser.take()
    kinds = {"STRING": "string", "INT": "int"}
    if token.kind in kinds:
        return Value(kinds[token.kind], token.value, token, token)
    if token.kind == "NAME":
        if token.value in ("true", "false"):
            return Value("bool", token.value == "true", token, token)
        return Value("name", token.value, token, token)
    if token.kind == "LPAREN":
        return _tuple(parser, token)
    fail(f"expected a string, number, boolean, rule name or tuple, found {parser.describe(token)}",
         token.start, token.end)


def _tuple(parser, opening: Token) -> Value:
    items: list[Value] = []
    while parser.peek().kind != "RPAREN":
        items.append(_value(parser))
        token = parser.peek()
        if token.kind == "COMMA":
            parser.take()
        elif token.kind != "RPAREN":
            fail(f"expected `,` or `)` in a tuple, found {parser.describe(token)}", token.start, token.end)
    return Value("tuple", items, opening, parser.take())


def check_macro(parser, name: Token, positional: list[Value], named: dict[str, Value]) -> None:
    """Check the arguments of ``TagDispatch``, ``Regex`` or ``Substring``.

    >>> from steerc.constraints.ebnf import check_grammar
    >>> check_grammar('root ::= Substring(x)')[0].message
    '`Substring` arguments must be strings'
    """
    {"TagDispatch": _tag_dispatch, "Regex": _regex, "Substring": _substring}[name.value](
        parser, name, positional, named)


def _bad(parser, value: Value, message: str) -> None:
    parser.note(message, value.start, value.end)


def _unknown_named(parser, macro: str, named: dict[str, Value], allowed: tuple[str, ...]) -> None:
    for key, value in named.items():
        if key not in allowed:
            choices = ", ".join(f"`{a}`" for a in allowed) or "none"
            _bad(parser, value, f"`{macro}` has no argument {show(key)} (it takes: {choices})")


def _tag_dispatch(parser, name: Token, positional: list[Value], named: dict[str, Value]) -> None:
    _unknown_named(parser, "TagDispatch", named, ("loop_after_dispatch", "excludes"))
    triggers = []
    for pair in positional:
        if pair.kind != "tuple" or len(pair.value) != 2:
            _bad(parser, pair, 'each `TagDispatch` entry must be a pair `("tag", rule)`')
            continue
        tag, rule = pair.value
        if tag.kind != "string" or tag.value == "":
            _bad(parser, tag, "a `TagDispatch` tag must be a non-empty string")
        else:
            triggers.append(tag.value)
        if rule.kind != "name":
            _bad(parser, rule, "a `TagDispatch` target must be a rule name")
        else:
            parser.refs.append(rule.start)
    loop = named.get("loop_after_dispatch")
    if loop is not None and loop.kind != "bool":
        _bad(parser, loop, "`loop_after_dispatch` must be `true` or `false`")
    excludes = named.get("excludes")
    if excludes is not None and excludes.kind != "tuple":
        _bad(parser, excludes, 'excludes must be a tuple of strings, like `("</a>",)`')
    for item in excludes.value if excludes is not None and excludes.kind == "tuple" else ():
        if item.kind != "string" or item.value == "":
            _bad(parser, item, "each exclude must be a non-empty string")
        elif any(t.startswith(item.value) for t in triggers):
            _bad(parser, item, f"the exclude {show(item.value)} is a prefix of a tag, so that tag could never fire")


def _regex(parser, name: Token, positional: list[Value], named: dict[str, Value]) -> None:
    _unknown_named(parser, "Regex", named, ("json_string", "flags"))
    if len(positional) != 1 or positional[0].kind != "string":
        parser.note('`Regex` takes exactly one string, the pattern: `Regex("[a-z]+")`', name)
    else:
        parser.check_embedded_regex(positional[0].start)
    flag = named.get("json_string")
    if flag is not None and flag.kind != "bool":
        _bad(parser, flag, "`json_string` must be `true` or `false`")
    flags = named.get("flags")
    if flags is not None and flags.kind != "string":
        _bad(parser, flags, '`flags` must be a string such as `"i"`')
    elif flags is not None and set(str(flags.value)) - set("isu"):
        wrong = "".join(sorted(set(str(flags.value)) - set("isu")))
        _bad(parser, flags, f"`Regex` flags may only use `i`, `s` and `u`, not {show(wrong)}")


def _substring(parser, name: Token, positional: list[Value], named: dict[str, Value]) -> None:
    _unknown_named(parser, "Substring", named, ())
    for value in positional:
        if value.kind != "string":
            _bad(parser, value, "`Substring` arguments must be strings")
