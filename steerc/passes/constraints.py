"""Pass `constraints`: the output constraint is well formed.

Reads a ``from "..."`` file under the path policy, then checks a JSON
Schema against the draft 2020-12 meta-schema (and flags keywords structured
decoding ignores), a regex against the dialect structured decoding
enforces, a grammar as xgrammar EBNF, a choice list for emptiness and
repeats. Errors are reported at the ``constrain`` statement with a note at
the exact place inside the schema, grammar or string. xgrammar itself is
consulted only when ``Options.use_xgrammar`` is set (it imports torch).
"""

from __future__ import annotations

from steerc.core.jsonio import canonical
from steerc.core.limits import MAX_SOURCE_BYTES, human
from steerc.core.source import Source
from steerc.diagnostics import Note
from steerc.diagnostics.codes import INVALID_CONSTRAINT, LIMIT_EXCEEDED
from steerc.frontend.lower import is_hex, low_surrogate
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.passes.context import CheckContext, Fault
from steerc.passes.files import resolve_path
from steerc.passes.fold import with_constraint

name = "constraints"


def run(ctx: CheckContext) -> None:
    stmt = next((s for s in ctx.program.statements if isinstance(s, (ir.ConstrainText, ir.ConstrainChoice))), None)
    if stmt is None or ctx.checked is None:
        return
    try:
        constraint = _check(ctx, stmt)
    except Fault:
        return
    if constraint is not None:
        with_constraint(ctx, constraint)


def _check(ctx: CheckContext, stmt) -> ck.Constraint | None:
    from steerc import constraints as cons  # a program with a `constrain` only: a check without one stays quick

    use_xgr = ctx.options.use_xgrammar
    if isinstance(stmt, ir.ConstrainChoice):
        options = [o.value for o in stmt.options]
        problems = cons.check_choice(options)
        _report(ctx, stmt, problems, None)
        return None if _has_errors(problems) else ck.Constraint("choice", tuple(options), span=stmt.span)

    text, text_source, origin = _text_of(ctx, stmt)
    if stmt.kind == "json_schema":
        schema, problems = cons.check_json_schema(text, use_xgrammar=use_xgr)
        value = schema
    elif stmt.kind == "regex":
        problems = cons.check_regex(text, use_xgrammar=use_xgr)
        value = text
    else:
        problems = cons.check_grammar(text, use_xgrammar=use_xgr)
        value = text
    _report(ctx, stmt, problems, text_source)
    if _has_errors(problems):
        return None
    if stmt.kind == "json_schema":
        text = canonical(value)
    return ck.Constraint(stmt.kind, value, text=text, origin=origin, span=stmt.span)


def _has_errors(problems) -> bool:
    return any(p.severity == "error" for p in problems)


class _Located:
    """Maps offsets in the checked text back to a source and position."""

    def __init__(self, source: Source, base: int, index: list[int] | None):
        self.source = source
        self.base = base
        self.index = index  # text offset -> raw offset (escaped strings), None if 1:1

    def span(self, offset: int, end: int | None):
        def raw(o):
            if self.index is None:
                return self.base + o
            return self.base + self.index[min(max(o, 0), len(self.index) - 1)]

        start = raw(offset)
        stop = raw(end) if end is not None and end > offset else start + 1
        return self.source.span(start, max(stop, start + 1))


def _text_of(ctx: CheckContext, stmt: ir.ConstrainText):
    if stmt.from_file:
        path = resolve_path(ctx, stmt.value, f"{stmt.kind.replace('_', ' ')} file")
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_SOURCE_BYTES + 1)
            if len(data) > MAX_SOURCE_BYTES:
                ctx.error(LIMIT_EXCEEDED, f"`{stmt.value.value}` is larger than "
                          f"{human(MAX_SOURCE_BYTES, 'bytes')}, the most steerc reads", stmt.value.span)
                raise Fault
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
        except (OSError, UnicodeDecodeError) as exc:
            ctx.error(INVALID_CONSTRAINT, f"cannot read `{stmt.value.value}` as UTF-8 text ({exc})",
                      stmt.value.span)
            raise Fault from None
        src = Source(stmt.value.value, text, path)
        ctx.extra_sources[src.name] = src
        return text, _Located(src, 0, None), stmt.value.value
    s = stmt.value
    if s.span is None:
        return s.value, None, None
    if s.long:
        return s.value, _Located(ctx.source, s.span.start + 3, None), None
    raw = ctx.source.text[s.span.start + 1 : s.span.end - 1]
    return s.value, _Located(ctx.source, s.span.start + 1, _unescape_index(raw)), None


def _unescape_index(raw: str) -> list[int]:
    """For each character of the unescaped string, its offset in ``raw``."""

    index = []
    i = 0
    while i < len(raw):
        index.append(i)
        if raw[i] == "\\":
            if raw[i + 1 : i + 2] == "u":
                high = raw[i + 2 : i + 6]
                pair = is_hex(high) and 0xD800 <= int(high, 16) <= 0xDBFF and low_surrogate(raw, i + 6)
                i += 12 if pair else 6
            else:
                i += 2
        else:
            i += 1
    index.append(len(raw))
    return index


def _report(ctx: CheckContext, stmt, problems, located: _Located | None) -> None:
    what = {"json_schema": "JSON Schema", "regex": "regex", "grammar": "grammar"}.get(
        getattr(stmt, "kind", "choice"), "choice list"
    )
    for p in problems:
        notes = ()
        if located is not None and p.offset is not None:
            notes = (Note("here", located.span(p.offset, p.end)),)
        diag_kw = dict(notes=notes, help=p.help)
        message = f"invalid {what}: {p.message}" if p.severity == "error" else f"{what}: {p.message}"
        if p.severity == "error":
            ctx.error(p.code, message, stmt.span, **diag_kw)
        else:
            ctx.warning(p.code, message, stmt.span, **diag_kw)
