"""Re-parsing only the statements an edit touched.

Parsing is most of the time a check takes (a 1,000-intervention program:
about 0.2 s of 0.25 s). The text is compared with that of the last clean
parse (which stays the base while the user types through syntax errors):
statements before the change, with a line end between them and it in
unchanged text, keep their IR; statements after it, likewise, keep their
IR with spans moved by the change's length and line count; the text in
between is parsed again, laid at its own offsets behind the header and
blanks (so its spans need no arithmetic).

That equals a full parse wherever the text in between parses on its own,
so the parser parses the whole text when it does not: there is no clean
parse yet, the change is on the header's line, or the partial parse
reports anything at all (every error message then comes from the full
parse, as ``steerc check`` gives it). ``tests/test_lsp_reparse.py`` checks
random edits against full parses: same IR, same spans, same diagnostics.

>>> from steerc.core.source import Source
>>> from steerc.diagnostics import Diagnostics
>>> p = Reparser()
>>> one = "steer 1\\nparam a = 1\\nparam b = 2\\nparam c = 3\\n"
>>> p(Source("x", one), Diagnostics()).statements[1].value.value, p.reused
(2, 0)
>>> two = one.replace("b = 2", "b = 20")
>>> p(Source("x", two), Diagnostics()).statements[2].span.start, p.reused
(33, 2)
"""

from __future__ import annotations

from steerc.core import record
from steerc.core.source import Source, Span
from steerc.frontend import parse
from steerc.ir import nodes as ir

_SPAN_FIELDS = ("span", "name_span", "func_span", "range_span", "version_span")
_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


class Reparser:
    """A parser (``parser(source, diagnostics)``, as :func:`steerc.api.check` takes) that remembers the
    last clean parse and starts from it. ``reused``: how many statements the last call kept (0 after a
    full parse)."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.program: ir.Program | None = None
        self.reused = 0

    def __call__(self, source: Source, diagnostics) -> ir.Program | None:
        program = self._partial(source) if self.program is not None else None
        if program is None:
            self.reused = 0
            mark = len(diagnostics)
            program = parse(source, diagnostics)
            if program is not None and len(diagnostics) == mark:
                self.text, self.program = source.text, program
            # else the last clean parse stays the base: the statement being typed is parsed alone again
            # once it is whole
        else:
            self.text, self.program = source.text, program
        return program

    def _partial(self, source: Source) -> ir.Program | None:
        from steerc.diagnostics import Diagnostics
        from steerc.frontend.lower import ToIR
        from steerc.frontend.parser import SyntaxDiagnostic, check_text, parse_tree

        old, new, program = self.text, source.text, self.program
        cut = _cut(old, new, program)
        if cut is None:
            return None
        before, after, start, end = cut
        try:
            check_text(source)
            blank = new[: program.version_span.end] + " " * (start - program.version_span.end)
            tree, _ = parse_tree(Source(source.name, blank + new[start:end]))
        except SyntaxDiagnostic:
            return None
        found = Diagnostics()
        middle = ToIR(source, found).transform(tree)
        if len(found):
            return None
        delta = len(new) - len(old)
        lines = new.count("\n", 0, end) - old.count("\n", 0, end - delta)
        moved = tuple(_moved(s, delta, lines, source) for s in program.statements[after:])
        self.reused = before + len(moved)
        last = program.span.end + delta if moved else middle.span.end
        return record.evolve(program, statements=program.statements[:before] + middle.statements + moved,
                            span=source.span(program.span.start, last), comments=())


def _cut(old: str, new: str, program: ir.Program):
    """(statements kept before, index of the first kept after, start and end of the text to parse) or None.

    The text to parse starts at a newline that ends the last statement kept before (or the header) and
    ends where the first statement kept after starts, each in unchanged text.
    """
    if old == new:
        return None
    prefix = common_prefix(old, new)
    suffix = common_suffix(old, new, min(len(old), len(new)) - prefix)
    old_end, delta = len(old) - suffix, len(new) - len(old)
    statements = program.statements
    if any(s.span is None for s in statements) or program.version_span is None:
        return None
    before, start = 0, old.find("\n", program.version_span.end, prefix)
    if start < 0:
        return None  # the edit is on the header's line
    for s in statements:
        nl = old.find("\n", s.span.end, prefix)
        if nl < 0:
            break
        before, start = before + 1, nl
    after = len(statements)
    for i in range(len(statements) - 1, before - 1, -1):
        s = statements[i]
        if s.span.start < old_end or old.rfind("\n", old_end, s.span.start) < 0:
            break
        after = i
    end = statements[after].span.start + delta if after < len(statements) else len(new)
    return before, after, start, end


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: str, b: str, most: int) -> int:
    if most <= 0:
        return 0
    if a[len(a) - most:] == b[len(b) - most:]:
        return most
    lo, hi = 0, most  # the last lo characters agree, the last hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[len(a) - mid: len(a) - lo] == b[len(b) - mid: len(b) - lo]:
            lo = mid
        else:
            hi = mid
    return lo


def _moved(node, delta: int, lines: int, source: Source):
    """``node`` with every span ``delta`` characters and ``lines`` lines further on (columns stay: a moved
    statement starts on a line after the edit)."""
    if delta == 0 and lines == 0:
        return node
    cls = type(node)
    values = {}
    for name, is_span in _fields(cls):
        value = getattr(node, name)
        if value is None:
            values[name] = None
        elif is_span:
            values[name] = Span(value.file, value.line + lines, value.column, value.end_line + lines,
                                value.end_column, value.start + delta, value.end + delta)
        elif isinstance(value, tuple):
            values[name] = tuple(_moved(v, delta, lines, source) if record.has(type(v)) else v for v in value)
        elif record.has(type(value)):
            values[name] = _moved(value, delta, lines, source)
        else:
            values[name] = value
    return cls(**values)


def _fields(cls: type) -> tuple[tuple[str, bool], ...]:
    got = _FIELDS.get(cls)
    if got is None:
        got = _FIELDS[cls] = tuple((f.name, f.name in _SPAN_FIELDS) for f in record.fields(cls))
    return got
