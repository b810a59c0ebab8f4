"""The Lark LALR parser for Steer, built once and cached.

:func:`parse_tree` turns source text into a Lark parse tree (the AST that
``steerc parse --emit ast`` prints) and the comments it met on the way, or
raises :class:`SyntaxDiagnostic` carrying a ``syntax-error`` diagnostic that
says, in words, what the parser expected.

>>> from steerc.source import Source
>>> tree, comments = parse_tree(Source("a.steer", "steer 1  # hi\\n"))
>>> tree.data, [c[2] for c in comments]
('start', ['# hi'])
"""

from __future__ import annotations

import contextvars
import functools
import os

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lark import PostLex

from steerc.diagnostics import Diagnostic, Note
from steerc.source import Source

GRAMMAR_PATH = os.path.join(os.path.dirname(__file__), "steer.lark")

_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB"}
_STATEMENT_STARTS = {"MODEL", "PARAM", "VECTOR", "PROBE", "INTERVENTION", "CONSTRAIN", "$END", "STEER"}
_CLOSERS = {"RPAR", "RSQB"}


class _ParseState:
    """What the post-lexer learns during one parse."""

    __slots__ = ("comments", "braces", "brackets", "last_token")

    def __init__(self) -> None:
        self.comments: list[tuple[int, int, str]] = []
        self.braces: list[Token] = []  # open `{` tokens, innermost last
        self.brackets: list[Token] = []  # open `(` and `[` tokens, innermost last
        self.last_token: Token | None = None


_state: contextvars.ContextVar[_ParseState] = contextvars.ContextVar("steerc_parse_state")


class _Layout(PostLex):
    """Newlines end lines, except inside ( ) and [ ]; runs of them collapse.

    Comments ride on newline tokens (``# ...\\n``); they are recorded for the
    formatter and otherwise dropped.
    """

    always_accept = ("_NL",)

    def process(self, stream):
        # Tokens are passed on at once: the contextual lexer picks the next
        # token's terminals from the parser state, so nothing may be held back.
        state = _state.get()
        depth = 0
        after_newline = True  # also drops newlines at the start of the file
        for tok in stream:
            kind = tok.type
            if kind == "_NL":
                if len(tok.value) > 1:
                    state.comments.append((tok.line, tok.column, tok.value.rstrip("\r\n")))
                if depth == 0 and not after_newline:
                    after_newline = True
                    yield tok
                continue
            after_newline = False
            if kind in _OPENERS:
                depth += 1
                state.brackets.append(tok)
            elif kind in _CLOSERS:
                depth = max(depth - 1, 0)
                if state.brackets:
                    state.brackets.pop()
            elif kind == "LBRACE":
                state.braces.append(tok)
            elif kind == "RBRACE" and state.braces:
                state.braces.pop()
            state.last_token = tok
            yield tok


@functools.lru_cache(maxsize=1)
def get_parser() -> Lark:
    """The one parser instance, from the precomputed tables (see :mod:`steerc.frontend.tables`)."""
    from steerc.frontend.tables import load

    return load(_Layout())


class SyntaxDiagnostic(Exception):
    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def parse_tree(source: Source) -> tuple[Tree, list[tuple[int, int, str]]]:
    """Parse ``source``; return the tree and the comments as (line, column, text)."""
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    state = _ParseState()
    token = _state.set(state)
    try:
        tree = get_parser().parse(text)
    except UnexpectedInput as exc:
        raise SyntaxDiagnostic(syntax_diagnostic(exc, source, state)) from None
    finally:
        _state.reset(token)
    return tree, state.comments


# ------------------------------------------------------------ error messages

_FRIENDLY = {
    "NAME": "a name",
    "INT": "a whole number",
    "SIGNED_INT": "a whole number",
    "NUMBER": "a number",
    "PERCENT": "a percentage",
    "STRING": "a string",
    "LONG_STRING": "a string",
    "COMPARE_OP": "a comparison (`<`, `<=`, `>`, `>=`)",
    "TRUE": "`true`",
    "FALSE": "`false`",
    "_NL": "a new line",
    "$END": "the end of the file",
}


def _describe_terminal(name: str) -> str:
    if name in _FRIENDLY:
        return _FRIENDLY[name]
    term = next((t for t in get_parser().terminals if t.name == name), None)
    if term is not None and term.pattern.type == "str":
        return f"`{term.pattern.value}`"
    return name.lower()


def _describe_token(tok: Token) -> str:
    """What follows "unexpected": ``end of file``, ``number `3.0```, ```joy```."""
    if tok.type == "$END":
        return "end of file"
    if tok.type == "_NL":
        return "end of line"
    if tok.type in ("STRING", "LONG_STRING"):
        return "string"
    if tok.type == "PERCENT":
        return f"percentage `{tok.value}`"
    if tok.type in ("NUMBER", "INT", "SIGNED_INT"):
        return f"number `{tok.value}`"
    return f"`{tok.value}`"


def _expected_phrase(expected: set[str]) -> str:
    words = sorted({_describe_terminal(n) for n in expected})
    if not words:
        return ""
    if len(words) == 1:
        return words[0]
    if len(words) > 8:
        return ", ".join(words[:8]) + ", ..."
    return ", ".join(words[:-1]) + " or " + words[-1]


def _token_span(source: Source, tok: Token):
    start = tok.start_pos if tok.start_pos is not None else len(source.text)
    start = min(start, len(source.text))
    end = tok.end_pos if tok.end_pos is not None else start
    if tok.type == "_NL":
        return source.span(start, start)  # the end of the line itself, not the start of the next one
    if end <= start:
        end = start + 1
    return source.span(start, min(end, max(len(source.text), start + 1)))


def syntax_diagnostic(exc: UnexpectedInput, source: Source, state: _ParseState) -> Diagnostic:
    """Turn a Lark failure into a ``syntax-error`` a newcomer can act on."""
    notes: list[Note] = []
    help_line = None
    if isinstance(exc, UnexpectedCharacters):
        pos = min(exc.pos_in_stream, len(source.text))
        char = source.text[pos : pos + 1]
        span = source.span(pos, pos + 1)
        if char == '"':
            message = "unterminated string"
            help_line = "close the string with `\"` on the same line, or use `\"\"\"...\"\"\"` for text over several lines"
        elif char in "\t\n ":
            message = "unexpected end of line"
        else:
            message = f"unexpected character `{char}`"
            expected = _expected_phrase(set(exc.allowed or ()))
            if expected:
                message += f"; expected {expected}"
        return Diagnostic.error("syntax-error", message, span, help=help_line)

    if isinstance(exc, UnexpectedEOF):
        tok = Token("$END", "", len(source.text), *source.position(len(source.text)))
        expected = set(exc.expected)
    else:
        assert isinstance(exc, UnexpectedToken)
        tok = exc.token
        expected = set(exc.expected)
        if tok.type == "$END":
            tok = Token("$END", "", len(source.text), *source.position(len(source.text)))
    span = _token_span(source, tok)
    message = f"unexpected {_describe_token(tok)}"
    opener = state.brackets[-1] if state.brackets else None
    if opener is not None and (tok.type == "$END" or (tok.line or 0) > opener.line):
        close = ")" if opener.type == "LPAR" else "]"
        message += f"; expected `{close}` to close the `{opener.value}` opened on line {opener.line}"
        return Diagnostic.error(
            "syntax-error", message, span,
            notes=(Note("opened here", source.span(opener.start_pos, opener.end_pos)),),
            help=f"close it with `{close}` (new lines inside brackets do not end a line)",
        )
    starts_statement = tok.type in _STATEMENT_STARTS
    same_line = state.last_token is not None and state.last_token.line == tok.line
    if state.braces and same_line and not starts_statement and tok.type != "$END":
        from steerc.frontend.syntax_help import block_line_help

        found = block_line_help(source.text, state.braces[-1].end_pos, tok, expected, state.last_token)
        if found is not None:
            needs, help_line = found
            return Diagnostic.error("syntax-error", f"{message}; {needs}", span, help=help_line)
    if "RBRACE" in expected and len(expected) > 2 and state.braces:
        rest = _expected_phrase(expected - {"RBRACE", "_NL"})
        message += f"; expected `}}` or a line of the block ({rest.replace(' or ', ', ')})"
    elif expected:
        message += f"; expected {_expected_phrase(expected)}"
    if "RBRACE" in expected and state.braces and starts_statement:
        brace = state.braces[-1]
        notes.append(Note("this block is not closed", source.span(brace.start_pos, brace.end_pos)))
        help_line = "add `}` to close the block before this line"
    elif "RBRACE" in expected and state.braces and state.last_token is not None and \
            state.last_token.line == tok.line:
        help_line = "each line of a block goes on its own line"
    elif expected == {"INT"} or (tok.line == 1 and "STEER" in expected):
        help_line = "a program starts with the header `steer 1`"
    return Diagnostic.error("syntax-error", message, span, notes=tuple(notes), help=help_line)
