"""``steerc fmt``: one canonical layout for Steer programs.

The layout: the header, then statements separated by a blank line wherever
a block is involved, the kind of statement changes or the author left one;
block lines indented two spaces in a fixed order (``at``, the operation,
``tokens``, ``when``, ``preserve norm``; ``at``, ``read``, ``pool``) with
their values aligned; runs of ``param``/``vector``/``matrix``/``sae`` lines with aligned ``=``;
one space around binary operators; long vector literals wrapped at 100
columns. Numbers keep the spelling the author chose. Comments stay with the
line they lead or trail.

Formatting is idempotent, and parsing the output gives an IR equal to the
input's (both are property-tested).

>>> from steerc.frontend import parse_source
>>> program, _ = parse_source("steer 1\\nparam  g=2\\nintervention x{at resid_pre[0]\\nscale g}\\n")
>>> print(format_program(program), end="")
steer 1
<BLANKLINE>
param g = 2
<BLANKLINE>
intervention x {
  at    resid_pre[0]
  scale g
}
"""

from __future__ import annotations

import bisect

from steerc.core.source import Source
from steerc.diagnostics import Diagnostics
from steerc.frontend import parse
from steerc.ir import nodes as ir

WIDTH = 100
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


# ---------------------------------------------------------------- expressions


def expr(e) -> str:
    return _expr(e, 0)


def _expr(e, ctx: int) -> str:
    if isinstance(e, ir.Number):
        return e.text or _number_text(e.value)
    if isinstance(e, ir.Degrees):
        return (e.text or _number_text(e.value)) + "deg"
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.Str):
        return string(e)
    if isinstance(e, ir.Bool):
        return "true" if e.value else "false"
    if isinstance(e, ir.Neg):
        return "-" + _expr(e.operand, 3)
    if isinstance(e, ir.BinOp):
        prec = _PREC[e.op]
        text = f"{_expr(e.left, prec)} {e.op} {_expr(e.right, prec + 1)}"
        return f"({text})" if prec < ctx else text
    if isinstance(e, ir.Call):
        args = [_arg(a) for a in e.args] + [f"{k.name}={_arg(k.value)}" for k in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    if isinstance(e, ir.VectorLit):
        return "[" + ", ".join(expr(i) for i in e.items) + "]"
    if isinstance(e, ir.Index):
        return f"{e.base.id}[{expr(e.index)}]"
    raise TypeError(f"not an expression: {e!r}")


# Words the lexer reads as a keyword, not a name, where an argument starts.
_ARG_KEYWORDS = frozenset({"true", "false"})


def _leading_word(e) -> str | None:
    """The name or function name an expression's text starts with, if any."""
    while isinstance(e, ir.BinOp):
        e = e.left
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.Call):
        return e.func
    return None


def _arg(e) -> str:
    """An argument: a name `true` or `false` in front would read as a boolean, so it keeps parentheses."""
    text = expr(e)
    return f"({text})" if _leading_word(e) in _ARG_KEYWORDS else text


def _number_text(value) -> str:
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    return text


def string(s: ir.Str) -> str:
    if s.long:
        return f'"""{s.value}"""'
    out = ['"']
    for ch in s.value:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _wrapped_literal(prefix: str, lit: ir.VectorLit) -> str:
    """``prefix`` followed by a vector literal, wrapped to WIDTH columns."""
    items = [expr(i) for i in lit.items]
    one_line = prefix + "[" + ", ".join(items) + "]"
    if len(one_line) <= WIDTH or len(items) < 2:
        return one_line
    indent = " " * (len(prefix) + 1)
    lines, current = [], prefix + "["
    for n, item in enumerate(items):
        piece = item + ("," if n < len(items) - 1 else "]")
        if current.strip() not in ("", prefix.strip() + "[") and len(current) + 1 + len(piece) > WIDTH:
            lines.append(current.rstrip())
            current = indent + piece
        else:
            sep = "" if current.endswith("[") else " "
            current += sep + piece
    lines.append(current)
    return "\n".join(lines)


# --------------------------------------------------------------------- sites


def _bound(b) -> str:
    if b is None:
        return ""
    if isinstance(b, ir.SelPercent):
        return b.text or f"{_number_text(b.percent)}%"
    return str(b.index)


def selector_source(item) -> str:
    if isinstance(item, ir.SelAll):
        return "*"
    if isinstance(item, ir.SelSlice):
        return f"{_bound(item.start)}:{_bound(item.stop)}"
    if isinstance(item, ir.SelGroup):
        return "(" + ", ".join(selector_source(i) for i in item.items) + ")"
    return _bound(item)


def site(s: ir.SiteRef) -> str:
    return f"{s.name}[{', '.join(selector_source(i) for i in s.items)}]"


# -------------------------------------------------------------------- scopes


def _position_sel(sel) -> str:
    if sel is None:
        return ""
    if isinstance(sel, ir.PosIndex):
        return f"[{sel.index}]"
    start = "" if sel.start is None else str(sel.start)
    stop = "" if sel.stop is None else str(sel.stop)
    return f"[{start}:{stop}]"


def scope(s) -> str:
    if isinstance(s, ir.ScopeAll):
        return "all"
    if isinstance(s, ir.ScopePrompt):
        return "prompt" + _position_sel(s.sel)
    if isinstance(s, ir.ScopeGenerated):
        return "generated" + _position_sel(s.sel)
    if isinstance(s, ir.ScopePositions):
        return "[" + ", ".join(str(p) for p in s.positions) + "]"
    if isinstance(s, ir.ScopeAfter):
        return "after " + string(s.text)
    raise TypeError(f"not a scope: {s!r}")


# --------------------------------------------------------------------- gates

_GATE_PREC = {ir.GateOr: 1, ir.GateAnd: 2, ir.GateNot: 3, ir.Compare: 4}


def gate(g, ctx: int = 0) -> str:
    prec = _GATE_PREC[type(g)]
    if isinstance(g, ir.Compare):
        text = f"{expr(g.left)} {g.op} {expr(g.right)}"
        return f"({text})" if ctx == 3 else text
    if isinstance(g, ir.GateNot):
        text = "not " + gate(g.operand, 3)
    elif isinstance(g, ir.GateAnd):
        text = f"{gate(g.left, 2)} and {gate(g.right, 2.5)}"
    else:
        text = f"{gate(g.left, 1)} or {gate(g.right, 1.5)}"
    return f"({text})" if prec < ctx else text


# ------------------------------------------------------------------ readouts


def readout(r) -> str:
    if isinstance(r, ir.Cosine):
        return f"cosine({expr(r.vector)})"
    if isinstance(r, (ir.ProjectedCosine, ir.SubspaceCosine)):
        name = "projected_cosine" if isinstance(r, ir.ProjectedCosine) else "subspace_cosine"
        return name + "(" + ", ".join(expr(v) for v in r.vectors) + ")"
    if isinstance(r, ir.Dot):
        text = f"dot({expr(r.vector)})"
        for off in r.offsets:
            text += f" {off.sign} {_expr(off.value, 2)}"
        return text
    if isinstance(r, ir.FeatureReadout):
        return expr(r.feature)
    return "norm"


def op(o) -> tuple[str, str]:
    """(keyword, rest) of an operation line."""
    if isinstance(o, ir.Add):
        return "add", expr(o.vector)
    if isinstance(o, ir.Scale):
        return "scale", expr(o.factor)
    if isinstance(o, ir.Set):
        return "set", expr(o.vector)
    if isinstance(o, ir.Suppress):
        return "suppress", ""
    if isinstance(o, ir.Ablate):
        return "ablate", ", ".join(expr(d) for d in o.directions)
    if isinstance(o, ir.Clamp):  # a direction led by a name `feature` keeps parentheses (`clamp feature` is the SAE's)
        direction = expr(o.direction)
        return "clamp", f"({direction}) to {expr(o.value)}" if _leading_word(o.direction) == "feature" else \
            f"{direction} to {expr(o.value)}"
    if isinstance(o, ir.Rotate):
        return "rotate", f"in ({expr(o.first)}, {expr(o.second)}) {o.mode} {expr(o.angle)}"
    if isinstance(o, ir.ClampFeature):
        return "clamp", f"feature {expr(o.feature)} to {expr(o.value)}"
    if isinstance(o, ir.LoReFT):
        return "loreft", f"{expr(o.rotation)}, {expr(o.weight)}, {expr(o.bias)}"
    raise TypeError(f"not an operation: {o!r}")


# ------------------------------------------------------------------- layout


class _Comments:
    """Assigns each comment to the line it leads or trails.

    ``regions`` are (start line, end line, anchor line, depth): statements
    (depth 0) and, inside blocks, block lines and closing braces (depth 1). A
    comment at the end of a line trails the innermost region holding that
    line (so it stays with a statement even when fmt joins its lines); a
    comment on a line of its own leads the statement it sits inside, or else
    the next anchor.
    """

    def __init__(self, comments, regions: list[tuple[int, int, int, int]]):
        self.leading: dict[int, list[str]] = {}
        self.trailing: dict[int, str] = {}
        self.tail: list[str] = []
        anchors = sorted({r[2] for r in regions})
        for c in comments:
            inside = [r for r in regions if r[0] <= c.line <= r[1]]
            if not c.own_line and inside:
                anchor = max(inside, key=lambda r: (r[3], r[0]))[2]
                prev = self.trailing.get(anchor)
                self.trailing[anchor] = c.text if prev is None else f"{prev}  {c.text}"
                continue
            within = [r for r in inside if r[3] == 0 and r[0] < c.line and r[1] > r[0]]
            if within and not any(r[3] == 1 for r in regions if r[0] <= c.line <= r[1]) and \
                    not self._in_block(within[0], regions):
                self.leading.setdefault(within[0][2], []).append(c.text)
                continue
            i = bisect.bisect_right(anchors, c.line)
            if i < len(anchors):
                self.leading.setdefault(anchors[i], []).append(c.text)
            else:
                self.tail.append(c.text)

    @staticmethod
    def _in_block(stmt_region, regions) -> bool:
        start, end = stmt_region[0], stmt_region[1]
        return any(r[3] == 1 and start <= r[0] <= end for r in regions)


class _Printer:
    def __init__(self, program: ir.Program, source: Source | None):
        self.program = program
        self.source = source
        self.out: list[str] = []
        self.comments = _Comments(program.comments, self._regions()) if program.comments else None

    # Regions comments can attach to: statements, block lines and closing
    # braces (only known when the program came from text).
    def _regions(self) -> list[tuple[int, int, int, int]]:
        regions = []
        if self.program.version_span:
            line = self.program.version_span.line
            regions.append((line, line, line, 0))
        for stmt in self.program.statements:
            if stmt.span is None:
                continue
            start, end = stmt.span.line, stmt.span.end_line
            if isinstance(stmt, (ir.ProbeDecl, ir.InterventionDecl, ir.ModelBlock)):
                regions.append((start, start, start, 0))
                regions.extend((a, b, a, 1) for a, b in self._block_line_spans(stmt))
                regions.append((end, end, end, 1))
            else:
                regions.append((start, end, start, 0))
        return regions

    def _block_line_spans(self, stmt) -> list[tuple[int, int]]:
        if isinstance(stmt, ir.ModelBlock):
            nodes = [[f] for f in stmt.fields]
        else:
            nodes = [[stmt.site]]
            if isinstance(stmt, ir.ProbeDecl):
                nodes += [[stmt.readout], [stmt.pool]]
            else:
                nodes += [[stmt.op], list(stmt.scopes or ()), [stmt.gate], [stmt.preserve]]
        spans = []
        for group in nodes:
            group = [n for n in group if n is not None and n.span is not None]
            if group:
                spans.append((group[0].span.line, max(n.span.end_line for n in group)))
        return spans

    def emit(self, text: str, line: int | None, indent: str = "") -> None:
        if self.comments and line is not None:
            for c in self.comments.leading.pop(line, []):
                self.out.append(indent + c)
        trailing = self.comments.trailing.pop(line, None) if self.comments and line else None
        first, *rest = text.split("\n")
        self.out.append(indent + first)
        # Continuation lines come from multi-line strings (or wrapped top-level
        # literals, which carry their own indent): never re-indent them.
        self.out.extend(rest)
        if trailing:
            self.out[-1] += f"  {trailing}"

    def blank(self) -> None:
        if self.out and self.out[-1] != "":
            self.out.append("")

    def _had_blank(self, prev, stmt) -> bool:
        if self.source is None or prev.span is None or stmt.span is None:
            return False
        comment_lines = {c.line for c in self.program.comments if c.own_line}
        return any(
            not self.source.line_text(n).strip()
            for n in range(prev.span.end_line + 1, stmt.span.line)
            if n not in comment_lines
        )

    # ------------------------------------------------------------ statements

    def run(self) -> str:
        p = self.program
        self.emit(f"steer {p.version}", p.version_span.line if p.version_span else None)
        prev = None
        runs = _alignment_runs(p.statements)
        for stmt in p.statements:
            if prev is None or _needs_blank(prev, stmt) or self._had_blank(prev, stmt):
                self.blank()
            self.statement(stmt, runs.get(id(stmt), 0))
            prev = stmt
        if self.comments:
            leftovers = [c for lines in self.comments.leading.values() for c in lines] + self.comments.tail
            if leftovers:
                self.blank()
                self.out.extend(leftovers)
        return "\n".join(self.out) + "\n"

    def statement(self, stmt, name_width: int) -> None:
        line = stmt.span.line if stmt.span else None
        if isinstance(stmt, ir.ParamDecl):
            text = _wrap_decl("param", stmt.name, name_width, stmt.value)
            if stmt.range is not None:
                text += f" in [{expr(stmt.range[0])}, {expr(stmt.range[1])}]"
            if stmt.per_request:
                text += " per request"
            self.emit(text, line)
        elif isinstance(stmt, ir.VectorDecl):
            self.emit(_wrap_decl("vector", stmt.name, name_width, stmt.value), line)
        elif isinstance(stmt, ir.MatrixDecl):
            self.emit(_wrap_decl("matrix", stmt.name, name_width, stmt.value), line)
        elif isinstance(stmt, ir.SaeDecl):
            self.emit(_wrap_decl("sae", stmt.name, name_width, stmt.value), line)
        elif isinstance(stmt, ir.ConstrainText):
            src = "from " if stmt.from_file else ""
            self.emit(f"constrain {stmt.kind} {src}{string(stmt.value)}", line)
        elif isinstance(stmt, ir.ConstrainChoice):
            self.emit("constrain choice [" + ", ".join(string(o) for o in stmt.options) + "]", line)
        else:
            self.block(stmt, line)

    def _block_lines(self, stmt) -> list[tuple[int | None, tuple[str, str]]]:
        def at(node):
            return node.span.line if node is not None and node.span else None

        if isinstance(stmt, ir.ModelBlock):
            width = max((len(f.key) for f in stmt.fields), default=0)
            return [(at(f), (f.key.ljust(width), "= " + expr(f.value))) for f in stmt.fields]
        rows = [(at(stmt.site), ("at", site(stmt.site)))] if stmt.site else []
        if isinstance(stmt, ir.ProbeDecl):
            if stmt.readout:
                rows.append((at(stmt.readout), ("read", readout(stmt.readout))))
            if stmt.pool:
                rows.append((at(stmt.pool), ("pool", stmt.pool.kind)))
            return rows
        if stmt.op:
            rows.append((at(stmt.op), op(stmt.op)))
        if stmt.scopes:
            rows.append((at(stmt.scopes[0]), ("tokens", ", ".join(scope(s) for s in stmt.scopes))))
        if stmt.gate:
            rows.append((at(stmt.gate), ("when", gate(stmt.gate))))
        if stmt.preserve:
            rows.append((at(stmt.preserve), ("preserve", "norm")))
        return rows

    def block(self, stmt, line) -> None:
        if isinstance(stmt, ir.ModelBlock):
            head = "model {"
        else:
            kind = "probe" if isinstance(stmt, ir.ProbeDecl) else "intervention"
            head = f"{kind} {stmt.name} {{"
        self.emit(head, line)
        rows = self._block_lines(stmt)
        width = max((len(k) for _, (k, v) in rows if v and k != "preserve"), default=0)
        for row_line, (key, value) in rows:
            if not value:
                text = key
            elif key == "preserve" or isinstance(stmt, ir.ModelBlock):
                text = f"{key} {value}"
            else:
                text = f"{key.ljust(width)} {value}"
            self.emit(text, row_line, "  ")
        close = stmt.span.end_line if stmt.span else None
        if self.comments and close is not None:
            for c in self.comments.leading.pop(close, []):
                self.out.append("  " + c)
        self.emit("}", close)


def _wrap_decl(kind: str, name: str, width: int, value) -> str:
    prefix = f"{kind} {name.ljust(width)} = "
    if isinstance(value, ir.VectorLit):
        return _wrapped_literal(prefix, value)
    return prefix + expr(value)


def _kind(stmt) -> str:
    return type(stmt).__name__


def _needs_blank(prev, stmt) -> bool:
    one_liners = (ir.ParamDecl, ir.VectorDecl, ir.MatrixDecl, ir.SaeDecl, ir.ConstrainText, ir.ConstrainChoice)
    if not isinstance(prev, one_liners) or not isinstance(stmt, one_liners):
        return True
    return _kind(prev) != _kind(stmt)


def _alignment_runs(statements) -> dict[int, int]:
    """Name width for each param/vector/matrix/sae, aligned within runs of one kind."""
    widths: dict[int, int] = {}
    run: list = []

    def flush():
        width = max((len(s.name) for s in run), default=0)
        for s in run:
            widths[id(s)] = width
        run.clear()

    for stmt in statements:
        if run and (type(stmt) is not type(run[0]) or _broken(run[-1], stmt)):
            flush()
        if isinstance(stmt, (ir.ParamDecl, ir.VectorDecl, ir.MatrixDecl, ir.SaeDecl)):
            run.append(stmt)
        else:
            flush()
    flush()
    return widths


def _broken(prev, stmt) -> bool:
    # A run continues only over adjacent lines (a blank line or comment ends it).
    if prev.span is None or stmt.span is None:
        return False
    return stmt.span.line > prev.span.end_line + 1


def format_program(program: ir.Program, source: Source | None = None) -> str:
    """The canonical text of ``program`` (``source`` lets blank lines survive)."""
    return _Printer(program, source).run()


class MeaningChanged(Exception):
    """Formatting would change what the program means (a bug in the formatter)."""


def format_source(source: Source) -> tuple[str | None, list]:
    """(the canonical text, the parser's diagnostics); the text is None when the program has errors.

    Raises :class:`MeaningChanged` when the formatted text would not parse to the same program.

    >>> format_source(Source("a.steer", "steer 1\\nparam  g=2\\n"))
    ('steer 1\\n\\nparam g = 2\\n', [])
    >>> text, diagnostics = format_source(Source("a.steer", "steer 1\\nparam g =\\n"))
    >>> text, [d.code for d in diagnostics]
    (None, ['syntax-error'])
    """

    diagnostics = Diagnostics()
    program = parse(source, diagnostics)
    if program is None or diagnostics.has_errors:
        return None, diagnostics.items
    formatted = format_program(program, source)
    again = Diagnostics()
    if parse(Source(source.name, formatted), again) != program or again.has_errors:
        raise MeaningChanged(source.name)
    return formatted, diagnostics.items
