"""The Lark LALR parser for Steer, built once and cached.

:func:`parse_tree` turns source text into a Lark parse tree (the AST that
``steerc parse --emit ast`` prints) and the comments it met on the way, or
raises :class:`SyntaxDiagnostic` carrying a ``syntax-error`` diagnostic that
says, in words, what the parser expected.

>>> from steerc.core.source import Source
>>> tree, comments = parse_tree(Source("a.steer", "steer 1  # hi\\n"))
>>> tree.data, [c[2] for c in comments]
('start', ['# hi'])
"""

from __future__ import annotations

import contextvars
import functools
import os
import re

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lark import PostLex

from steerc.core.limits import (
    MAX_LIST_ITEMS,
    MAX_NAME_CHARS,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    MAX_SOURCE_BYTES,
    MAX_STRING_CHARS,
    human,
)
from steerc.core.source import Source
from steerc.diagnostics import Diagnostic, Note
from steerc.diagnostics.codes import LIMIT_EXCEEDED, SYNTAX_ERROR
from steerc.diagnostics.suggest import did_you_mean
from steerc.frontend.syntax_help import block_line_help
from steerc.frontend.tables import load

GRAMMAR_PATH = os.path.join(os.path.dirname(__file__), "steer.lark")

_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB"}
_STATEMENT_STARTS = {"MODEL", "PARAM", "VECTOR", "MATRIX", "SAE", "PROBE", "INTERVENTION", "CONSTRAIN", "$END", "STEER"}
_CLOSERS = {"RPAR", "RSQB"}

# The literal policy: token type -> (most characters, what it is, how many quote characters it carries).
_LENGTH_LIMITS = {
    "NUMBER": (MAX_NUMBER_CHARS, "number", 0),
    "INT": (MAX_NUMBER_CHARS, "whole number", 0),
    "SIGNED_INT": (MAX_NUMBER_CHARS, "whole number", 0),
    "PERCENT": (MAX_NUMBER_CHARS, "percentage", 0),
    "NAME": (MAX_NAME_CHARS, "name", 0),
    "STRING": (MAX_STRING_CHARS, "string", 2),
    "LONG_STRING": (MAX_STRING_CHARS, "string", 6),
}

# Parse-tree nodes that open a nesting level (see MAX_NESTING); parentheses make no node.
NESTING_RULES = frozenset(
    {"add", "sub", "mul", "div", "neg", "call", "vector_literal", "compare", "gate_and", "gate_or", "gate_not"}
)


class _ParseState:
    """What the post-lexer learns during one parse."""

    __slots__ = ("braces", "brackets", "comments", "items", "last_token", "source")

    def __init__(self, source: Source) -> None:
        self.source = source
        self.comments: list[tuple[int, int, str]] = []
        self.braces: list[Token] = []  # open `{` tokens, innermost last
        self.brackets: list[Token] = []  # open `(` and `[` tokens, innermost last
        self.items: list[int] = [0]  # commas seen in the current line, then in each open bracket
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
        items = state.items
        depth = 0
        after_newline = True  # also drops newlines at the start of the file
        for tok in stream:
            kind = tok.type
            if kind == "_NL":
                if len(tok.value) > 1:
                    state.comments.append((tok.line, tok.column, tok.value.rstrip("\r\n")))
                if depth == 0 and not after_newline:
                    after_newline = True
                    items[0] = 0
                    yield tok
                continue
            after_newline = False
            limit = _LENGTH_LIMITS.get(kind)
            if limit is not None and len(tok.value) - limit[2] > limit[0]:
                raise SyntaxDiagnostic(_too_long(state.source, tok, *limit))
            if kind == "COMMA":
                items[-1] += 1
                if items[-1] >= MAX_LIST_ITEMS:
                    raise SyntaxDiagnostic(_too_many_items(state, tok))
            elif kind in _OPENERS:
                depth += 1
                state.brackets.append(tok)
                items.append(0)
            elif kind in _CLOSERS:
                depth = max(depth - 1, 0)
                if state.brackets:
                    state.brackets.pop()
                    items.pop()
            elif kind == "LBRACE":
                state.braces.append(tok)
            elif kind == "RBRACE" and state.braces:
                state.braces.pop()
            state.last_token = tok
            yield tok


@functools.lru_cache(maxsize=1)
def get_parser() -> Lark:
    """The one parser instance, from the precomputed tables (see :mod:`steerc.frontend.tables`)."""

    return load(_Layout())


class SyntaxDiagnostic(Exception):
    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def parse_tree(source: Source) -> tuple[Tree, list[tuple[int, int, str]]]:
    """Parse ``source``; return the tree and the comments as (line, column, text).

    Raises :class:`SyntaxDiagnostic` for a text that is not a program, and for
    one beyond the limits of :mod:`steerc.core.limits` (size, literal lengths, list
    lengths, nesting), before any work proportional to the excess is done.
    """
    check_text(source)
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    state = _ParseState(source)
    token = _state.set(state)
    try:
        tree = get_parser().parse(text)
    except UnexpectedInput as exc:
        raise SyntaxDiagnostic(syntax_diagnostic(exc, source, state)) from None
    finally:
        _state.reset(token)
    check_nesting(tree, source)
    return tree, state.comments


# ------------------------------------------------------------------ limits


def limit_diagnostic(message: str, span, help: str | None = None) -> Diagnostic:
    return Diagnostic.error(LIMIT_EXCEEDED, message, span, help=help)


def check_text(source: Source) -> None:
    """The text is at most MAX_SOURCE_BYTES of UTF-8, and holds only characters (no lone surrogates)."""
    text = source.text
    ascii_only = text.isascii()
    if len(text) > MAX_SOURCE_BYTES or (
        not ascii_only and len(text) * 4 > MAX_SOURCE_BYTES
        and len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES
    ):
        # The first character past the limit (only the limit's worth of text is encoded to find it).
        cut = len(text[:MAX_SOURCE_BYTES].encode("utf-8", "surrogatepass")[:MAX_SOURCE_BYTES].decode("utf-8", "ignore"))
        raise SyntaxDiagnostic(limit_diagnostic(
            f"this program is larger than {human(MAX_SOURCE_BYTES, 'bytes')} ({MAX_SOURCE_BYTES:,} bytes), "
            "the most steerc reads",
            source.span(cut, cut + 1),
            help="split it into several programs, or load large vectors from files",
        ))
    if ascii_only:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SyntaxDiagnostic(Diagnostic.error(
            SYNTAX_ERROR,
            f"the text holds a lone surrogate (U+{ord(text[exc.start]):04X}), which is not a character",
            source.span(exc.start, exc.start + 1),
            help="a program is UTF-8 text; remove the code point or write the character it stands for",
        )) from None


def _too_long(source: Source, tok: Token, most: int, what: str, quotes: int) -> Diagnostic:
    length = len(tok.value) - quotes
    hint = {
        "number": "write it with an exponent (`1.5e-30`)",
        "whole number": "no version, layer, head or position needs that many digits",
        "percentage": "write fewer digits",
        "name": "use a shorter name",
        "string": "put long schemas and grammars in a file: `constrain json_schema from \"schema.json\"`",
    }[what]
    return limit_diagnostic(
        f"this {what} is {length:,} characters long; steerc reads {what}s of at most {most:,}",
        source.span(tok.start_pos, tok.end_pos),
        help=hint,
    )


def _too_many_items(state: _ParseState, tok: Token) -> Diagnostic:
    opener = state.brackets[-1] if state.brackets else None
    where = f"the `{opener.value}` on line {opener.line}" if opener is not None else "this line"
    return limit_diagnostic(
        f"the list opened by {where} has more than {MAX_LIST_ITEMS:,} items, the most steerc reads",
        state.source.span(tok.start_pos, tok.end_pos),
        help="no model is wider than that; load long vectors from a file",
    )


def check_nesting(tree: Tree, source: Source) -> None:
    """No expression or condition nests deeper than MAX_NESTING (walked without recursion)."""
    stack = [(tree, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node, level = pop()
        for child in node.children:
            if isinstance(child, Tree):
                deeper = level + 1 if child.data in NESTING_RULES else level
                if deeper > MAX_NESTING:
                    meta = child.meta
                    raise SyntaxDiagnostic(limit_diagnostic(
                        f"this expression nests more than {MAX_NESTING} levels deep",
                        source.span(meta.start_pos, meta.end_pos),
                        help="name its parts (`param`, `vector`) and combine those; every operator, "
                        "call and `[...]` opens a level, so `a + b + c + ...` nests one level per `+`",
                    ))
                push((child, deeper))


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
            if _letter_like(char):
                message, help_line = _non_ascii_name(source.text, pos, char)
        return Diagnostic.error(SYNTAX_ERROR, message, span, help=help_line)

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
            SYNTAX_ERROR, message, span,
            notes=(Note("opened here", source.span(opener.start_pos, opener.end_pos)),),
            help=f"close it with `{close}` (new lines inside brackets do not end a line)",
        )
    starts_statement = tok.type in _STATEMENT_STARTS
    same_line = state.last_token is not None and state.last_token.line == tok.line
    if state.braces and same_line and not starts_statement and tok.type != "$END":
        found = block_line_help(source.text, state.braces[-1].end_pos, tok, expected, state.last_token)
        if found is not None:
            needs, help_line = found
            return Diagnostic.error(SYNTAX_ERROR, f"{message}; {needs}", span, help=help_line)
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
    elif expected == {"INT"} or "STEER" in expected:  # only the header may come first, after comments
        help_line = "a program starts with the header `steer 1` (only comments and blank lines before it)"
    suggestion = _keyword_suggestion(tok, expected)
    if suggestion is not None and (help_line is None or not starts_statement):
        help_line = suggestion
    return Diagnostic.error(SYNTAX_ERROR, message, span, notes=tuple(notes), help=help_line)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _keyword_suggestion(tok: Token, expected: set[str]) -> str | None:
    """``did you mean `add`?`` for a word where keywords were expected (``ad`` in a block), as for names."""

    value = str(tok.value)
    if tok.type in ("$END", "_NL") or not _WORD.match(value):
        return None
    keywords = {w for w in (_keyword_of(n) for n in expected) if w and w != value}
    return did_you_mean(value, sorted(keywords)) if keywords else None


def _keyword_of(terminal: str) -> str | None:
    """The word a terminal matches when it is a keyword (``ADD`` -> ``add``), else None."""
    term = next((t for t in get_parser().terminals if t.name == terminal), None)
    if term is None or term.pattern.type != "str":
        return None
    value = term.pattern.value
    return value if _WORD.match(value) else None


def _letter_like(char: str) -> bool:
    """A character that is part of a word in some script (``ë``, ``ж``, a combining accent), not ASCII."""
    import unicodedata

    return not char.isascii() and unicodedata.category(char)[0] in "LMN"


def _non_ascii_name(text: str, pos: int, char: str) -> tuple[str, str]:
    """(message, help) for a name with a character outside ASCII: what a name may hold, and an ASCII
    spelling when dropping accents gives one (``joië`` -> ``joie``)."""
    import unicodedata

    start, end = pos, pos + 1
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_" or _letter_like(text[start - 1])):
        start -= 1
    while end < len(text) and (text[end].isalnum() or text[end] == "_" or _letter_like(text[end])):
        end += 1
    word = text[start:end]
    plain = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    message = (f"unexpected character `{char}` in `{word}`: a name holds ASCII letters (a-z, A-Z), digits and "
               "`_`, and does not start with a digit")
    if _WORD.match(plain) and plain.isascii():
        return message, f"write `{plain}`"
    return message, "rename it with ASCII letters, digits and `_` (text in strings may use any character)"
