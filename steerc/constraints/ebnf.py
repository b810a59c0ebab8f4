"""Validate a ``constrain grammar`` text in xgrammar's EBNF (GBNF-style) dialect.

Accepted: rules ``name ::= expr`` (a rule starts on its own line and may span
lines), ``|``, sequences, ``( )`` and the empty group ``()``, quantifiers
``* + ?``, ``{m}``, ``{m,}``, ``{m,n}``, string literals, character classes
``[...]``/``[^...]`` with ranges and escapes, rule references, ``#``
comments; xgrammar's lookahead assertion ``(= ...)`` at the very end of a
rule; and its text-level macros ``TagDispatch(...)``, ``Regex("...")`` (the
pattern is checked by :func:`~steerc.constraints.regex.check_regex`) and
``Substring(...)``.

Rejected although xgrammar 0.2.9 parses them: the token-id macros ``Token``,
``ExcludeToken`` and ``TokenTagDispatch`` (they depend on one tokenizer's
vocabulary) and rule attributes such as ``root[max_tokens=8] ::=`` (runtime
controls, not part of the language a constraint describes).

>>> check_grammar('root ::= "a" | b')[0].message
'rule `b` is not defined'
>>> check_grammar('root ::= "a"\\nitem ::= [0-9]+ ("," item)*')
[]
"""

from __future__ import annotations

import re

from steerc.constraints import INVALID, Problem
from steerc.constraints._common import closest, did_you_mean, line_col_to_offset, show, xgrammar_error, xgrammar_problem
from steerc.constraints.ebnf_lex import Fail, Token, fail, tokenize
from steerc.constraints.ebnf_macros import check_macro, parse_arguments
from steerc.constraints.regex import check_regex

MAX_NESTING = 64
TEXT_MACROS = ("TagDispatch", "Regex", "Substring")
TOKEN_MACROS = ("Token", "ExcludeToken", "TokenTagDispatch")
_QUANTIFIERS = ("STAR", "PLUS", "QUEST", "LBRACE")
_ELEMENT = "an element (a string, a character class, a rule name or `(`)"


def check_grammar(text: str, use_xgrammar: bool = False) -> list[Problem]:
    """Check an EBNF grammar; return its problems (offsets index into ``text``).

    With ``use_xgrammar=True`` and no problems of its own, also run
    ``xgrammar.Grammar.from_ebnf`` and report its error at the right offset.

    >>> [(p.message, p.offset) for p in check_grammar('root ::= "a" (')]
    [('`(` is never closed', 13)]
    >>> check_grammar('rot ::= "a"')[0].help
    'rename `rot` to `root`'
    """
    problems: list[Problem] = []
    try:
        tokens, problems = tokenize(text)
        parser = _Parser(text, tokens, problems)
        parser.grammar()
        parser.resolve()
    except Fail as failure:
        problems.extend(failure.earlier)
        problems.append(failure.problem)
    except RecursionError:
        problems.append(Problem(INVALID, "the grammar is nested too deeply to check", None))
    if use_xgrammar and not problems:
        problems.extend(_xgrammar_problems(text))
    return problems


def _xgrammar_problems(text: str) -> list[Problem]:
    """What ``xgrammar.Grammar.from_ebnf`` says about ``text``."""
    message = xgrammar_error(lambda xgr: xgr.Grammar.from_ebnf(text), key="ebnf:" + text)
    if message is None:
        return []
    m = re.search(r"at line (\d+), column (\d+)", message)
    offset = line_col_to_offset(text, int(m.group(1)), int(m.group(2))) if m else None
    return [xgrammar_problem(message, offset)]


class _Parser:
    def __init__(self, text: str, tokens: list[Token], problems: list[Problem]):
        self.text = text
        self.tokens = tokens
        self.k = 0
        self.depth = 0
        self.problems = problems
        self.rules: dict[str, Token] = {}
        self.refs: list[Token] = []

    def note(self, message: str, token: Token, end: Token | None = None, help: str | None = None) -> None:
        self.problems.append(Problem(INVALID, message, token.start, (end or token).end, help))

    def peek(self, delta: int = 0) -> Token:
        return self.tokens[min(self.k + delta, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.k += 1
        return token

    def describe(self, token: Token) -> str:
        return "the end of the grammar" if token.kind == "EOF" else show(self.text[token.start:token.end])

    # -- rules ------------------------------------------------------------

    def grammar(self) -> None:
        for token in self.tokens:
            if token.kind == "RULE":
                if token.value in self.rules:
                    self.note(f"rule {show(token.value)} is defined twice", token,
                              help=f"the first definition is at offset {self.rules[token.value].start}")
                else:
                    self.rules[token.value] = token
        while self.peek().kind != "EOF":
            self.rule()

    def rule(self) -> None:
        token = self.take()
        if token.kind != "RULE":
            what = "unmatched `)`" if token.kind == "RPAREN" else f"expected a rule like `name ::= ...`, " \
                                                                  f"found {self.describe(token)}"
            fail(what, token.start, token.end)
        self.take()  # ::=, guaranteed by the lexer
        self.choices()
        if self.peek().kind == "LOOK":
            self.group(lookahead=True)
            if self.peek().kind not in ("RULE", "EOF"):
                token = self.peek()
                fail("a lookahead assertion `(= ...)` must end its rule", token.start, token.end)

    def resolve(self) -> None:
        """Undefined references and the missing ``root``."""
        for ref in self.refs:
            if ref.value not in self.rules:
                self.note(f"rule {show(ref.value)} is not defined", ref, help=did_you_mean(ref.value, self.rules))
        if not self.rules:
            self.problems.append(Problem(INVALID, "the grammar has no rules", None, help="start with `root ::= ...`"))
        elif "root" not in self.rules:
            near = closest("root", self.rules)
            help = f"rename {show(near)} to `root`" if near else "add a rule `root ::= ...`"
            self.problems.append(Problem(INVALID, "the grammar has no `root` rule, where structured decoding "
                                                  "starts", None, help=help))

    # -- expressions --------------------------------------------------------

    def choices(self) -> None:
        self.sequence(self.tokens[self.k - 1])
        while self.peek().kind == "PIPE":
            self.sequence(self.take())

    def sequence(self, before: Token) -> None:
        """One or more elements; ``before`` is the ``::=``, ``|`` or ``(`` in front of them."""
        first = True
        while first or self.peek().kind not in ("PIPE", "RPAREN", "LOOK", "RULE", "EOF"):
            self.element(before if first else None)
            first = False

    def element(self, before: Token | None) -> None:
        token = self.peek()
        if token.kind in _QUANTIFIERS:
            fail(f"{self.describe(token)} has nothing to repeat", token.start, token.end)
        if token.kind == "LOOK":
            fail("a lookahead assertion `(= ...)` may only come at the very end of a rule", token.start, token.end)
        if token.kind in ("PIPE", "RPAREN", "RULE", "EOF") and before is not None:
            help = 'write `""` for an empty alternative' if token.kind != "RPAREN" or before.kind == "PIPE" else None
            fail(f"expected {_ELEMENT} after {self.describe(before)}", before.start, before.end, help=help)
        self.primary()
        if self.peek().kind in _QUANTIFIERS:
            self.quantifier()
            if self.peek().kind in _QUANTIFIERS:
                token = self.peek()
                fail("a quantifier cannot follow another quantifier", token.start, token.end,
                     help="wrap the repeated part in `( )` first")

    def primary(self) -> None:
        token = self.peek()
        if token.kind == "LPAREN":
            self.group(lookahead=False)
        elif token.kind in ("STRING", "CLASS"):
            self.take()
        elif token.kind == "NAME":
            self.name()
        else:
            fail(f"expected {_ELEMENT}, found {self.describe(token)}", token.start, token.end)

    def group(self, lookahead: bool) -> None:
        opening = self.take()
        if self.depth >= MAX_NESTING:
            fail(f"parentheses are nested more than {MAX_NESTING} deep", opening.start, opening.end)
        if self.peek().kind == "RPAREN" and not lookahead:
            self.take()
            return
        if self.peek().kind in ("EOF", "RULE"):
            fail(f"`{self.text[opening.start:opening.end]}` is never closed", opening.start, opening.end,
                 help="add a `)`")
        self.depth += 1
        self.choices()
        self.depth -= 1
        closing = self.take()
        if closing.kind == "LOOK":
            fail("a lookahead assertion `(= ...)` may only come at the very end of a rule", closing.start, closing.end)
        if closing.kind != "RPAREN":
            fail(f"`{self.text[opening.start:opening.end]}` is never closed", opening.start, opening.end,
                 help="add a `)`")

    def quantifier(self) -> None:
        opening = self.take()
        if opening.kind != "LBRACE":
            return
        low = self.expect_int("after `{`")
        high = low
        if self.peek().kind == "COMMA":
            self.take()
            high = None if self.peek().kind == "RBRACE" else self.expect_int("after `,`")
        closing = self.take()
        if closing.kind != "RBRACE":
            fail("expected `}` to close the repetition range", closing.start, closing.end)
        if high is not None and low is not None and low > high:
            self.note(f"repetition range {show(self.text[opening.start:closing.end])} has its minimum above its "
                      "maximum", opening, closing)

    def expect_int(self, where: str) -> int | None:
        token = self.take()
        if token.kind != "INT":
            negative = token.kind == "NAME" and str(token.value).startswith("-")
            fail(f"expected a {'non-negative ' if negative else ''}number {where}, found {self.describe(token)}",
                 token.start, token.end)
        return token.value

    def name(self) -> None:
        token = self.take()
        if token.value in TEXT_MACROS + TOKEN_MACROS:
            self.macro(token)
        elif token.value in ("true", "false"):
            fail(f"`{token.value}` is a reserved word and cannot name a rule", token.start, token.end)
        else:
            self.refs.append(token)

    # -- macros ---------------------------------------------------------------

    def macro(self, name: Token) -> None:
        if self.peek().kind != "LPAREN":
            fail(f"`{name.value}` is a built-in macro and needs its arguments in `( )`", name.start, name.end)
        positional, named, closing = parse_arguments(self)
        if name.value in TOKEN_MACROS:
            self.note(f"`{name.value}(...)` matches tokenizer token ids, which depend on one model's vocabulary; "
                      "steerc accepts text-level grammars only", name, closing,
                      help="write the text itself as a string literal")
            return
        check_macro(self, name, positional, named)

    def check_embedded_regex(self, token: Token) -> None:
        """Report the problems of a ``Regex("...")`` pattern at their place in the grammar.

        The pattern is checked like ``constrain regex``, except that a leading
        ``(?i)`` is allowed: xgrammar's ``Regex`` macro applies that one flag.
        """
        pattern = str(token.value)
        skip = 4 if pattern.startswith("(?i)") else 0
        for p in check_regex(pattern[skip:]):
            at = [token.chars[min(i + skip, len(token.chars) - 1)] if i is not None else None
                  for i in (p.offset, p.end)]
            self.problems.append(Problem(p.code, f"in `Regex`: {p.message}", at[0], at[1], p.help))
