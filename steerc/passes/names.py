"""Pass `names`: declarations and the names that refer to them.

All declared names (params, vectors, probes, interventions) share one
namespace; a name is visible from its declaration on. Reports
``duplicate-name`` (at the second declaration), ``undefined-name`` (with a
suggestion, or a note when the name is declared further down) and unknown
functions. Unused names are reported last (:mod:`steerc.passes.unused`).
"""

from __future__ import annotations

from steerc.diagnostics import Note
from steerc.ir import nodes as ir
from steerc.ir.walk import walk
from steerc.passes.context import CheckContext, Symbol, did_you_mean, one_of

name = "names"

FUNCTIONS = ("load", "normalize")

_KINDS = {
    ir.ParamDecl: "param",
    ir.VectorDecl: "vector",
    ir.ProbeDecl: "probe",
    ir.InterventionDecl: "intervention",
}


def run(ctx: CheckContext) -> None:
    statements = ctx.program.statements
    declared: dict[str, tuple[int, object]] = {}
    for order, stmt in enumerate(statements):
        kind = _KINDS.get(type(stmt))
        if kind is None:
            continue
        if stmt.name in declared:
            _, first = declared[stmt.name]
            ctx.error(
                "duplicate-name",
                f"`{stmt.name}` is already declared",
                stmt.name_span,
                notes=(Note(f"first declared here ({_KINDS[type(first)]})", first.name_span),),
                help="give the second one another name",
            )
            ctx.poisoned.add(stmt.name)
            continue
        declared[stmt.name] = (order, stmt)

    symbols = ctx.symbols
    for order, stmt in enumerate(statements):
        for node in walk(stmt):
            if isinstance(node, ir.Name):
                _resolve(ctx, node, order, declared, stmt)
            elif isinstance(node, ir.Call) and node.func not in FUNCTIONS:
                ctx.error(
                    "undefined-name",
                    f"unknown function `{node.func}`",
                    node.func_span,
                    help=did_you_mean(node.func, FUNCTIONS) or f"functions are {one_of(FUNCTIONS)}",
                )
                _poison(ctx, stmt)
        kind = _KINDS.get(type(stmt))
        if kind is not None and declared.get(stmt.name, (None, None))[1] is stmt:
            symbols[stmt.name] = Symbol(stmt.name, kind, stmt, order)


def _poison(ctx: CheckContext, stmt) -> None:
    if hasattr(stmt, "name"):
        ctx.poisoned.add(stmt.name)


def _resolve(ctx: CheckContext, node: ir.Name, order: int, declared, stmt) -> None:
    entry = declared.get(node.id)
    if entry is not None and entry[0] < order:
        sym = ctx.symbols.get(node.id)
        if sym is not None:
            sym.used = True
        return
    _poison(ctx, stmt)
    if entry is not None:
        later = entry[1]
        what = "itself" if later is stmt else "a name declared further down"
        ctx.error(
            "undefined-name",
            f"`{node.id}` is used before it is declared" if later is not stmt else f"`{node.id}` refers to {what}",
            node.span,
            notes=(Note("declared here", later.name_span),) if later is not stmt else (),
            help="a name is visible from its declaration on; move the declaration above this line"
            if later is not stmt
            else "a declaration cannot use the name it declares",
        )
        return
    ctx.error(
        "undefined-name",
        f"undefined name `{node.id}`",
        node.span,
        help=ctx.suggest(node.id, lambda: [n for n, (o, _) in declared.items() if o < order])
        or _declare_hint(node.id),
    )


def _declare_hint(ident: str) -> str:
    return (
        f"declare it before this line, e.g. `vector {ident} = load(\"...\", key=\"{ident}\")` "
        f"or `param {ident} = 1.0`"
    )
