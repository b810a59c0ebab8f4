"""Pass `names`: declarations and the names that refer to them.

All declared names (params, vectors, matrices, SAEs, probes, interventions) share one
namespace; a name is visible from its declaration on. Reports
``duplicate-name`` (at the second declaration), ``undefined-name`` (with a
suggestion, or a note when the name is declared further down) and unknown
functions. Unused names are reported last (:mod:`steerc.passes.unused`).
"""

from __future__ import annotations

from steerc.diagnostics import Note
from steerc.diagnostics.codes import DUPLICATE_NAME, UNDEFINED_NAME
from steerc.diagnostics.suggest import did_you_mean, one_of
from steerc.ir import nodes as ir
from steerc.ir.builtins import BUILTINS, FUNCTIONS
from steerc.ir.walk import walk
from steerc.passes.context import CheckContext, Symbol

name = "names"

_KINDS = {
    ir.ParamDecl: "param",
    ir.VectorDecl: "vector",
    ir.MatrixDecl: "matrix",
    ir.SaeDecl: "sae",
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
                DUPLICATE_NAME,
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
        in_gate = _gate_names(stmt)
        for node in walk(stmt):
            if isinstance(node, ir.Name):
                _resolve(ctx, node, order, declared, stmt, in_gate.get(id(node)))
            elif isinstance(node, ir.Call) and node.func not in BUILTINS:
                ctx.error(
                    UNDEFINED_NAME,
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


def _gate_names(stmt) -> dict[int, bool]:
    """id of each name in the ``when`` gate of an intervention -> whether it stands alone against a number.

    ``when p > 0.5``: ``p`` can only be a probe (True); ``when p > limit``:
    either side may be the probe and the other a param (False).
    """
    gate = getattr(stmt, "gate", None) if isinstance(stmt, ir.InterventionDecl) else None
    if gate is None:
        return {}
    out: dict[int, bool] = {}
    for node in walk(gate):
        if isinstance(node, ir.Compare):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(side, ir.Name):
                    out[id(side)] = isinstance(other, ir.Number) or isinstance(other, ir.Neg)
        elif isinstance(node, ir.Name):
            out.setdefault(id(node), False)
    return out


def _resolve(ctx: CheckContext, node: ir.Name, order: int, declared, stmt, in_gate: bool | None = None) -> None:
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
            UNDEFINED_NAME,
            f"`{node.id}` is used before it is declared" if later is not stmt else f"`{node.id}` refers to {what}",
            node.span,
            notes=(Note("declared here", later.name_span),) if later is not stmt else (),
            help="a name is visible from its declaration on; move the declaration above this line"
            if later is not stmt
            else "a declaration cannot use the name it declares",
        )
        return
    ctx.error(
        UNDEFINED_NAME,
        f"undefined name `{node.id}`",
        node.span,
        help=ctx.suggest(node.id, lambda: [n for n, (o, s) in declared.items() if o < order
                                           and (in_gate is None or isinstance(s, (ir.ProbeDecl, ir.ParamDecl)))])
        or _declare_hint(node.id, in_gate),
    )


def _declare_hint(ident: str, in_gate: bool | None = None) -> str:
    """What to declare: a probe for a name a gate compares, else a vector or a param."""
    if in_gate is not None:
        probe = (f"a gate compares a probe: declare `probe {ident} {{ ... }}` above this intervention, "
                 "with `at`, `read` and `pool` lines")
        return probe if in_gate else probe + f" (or `param {ident} = ...` for a threshold)"
    return (
        f"declare it before this line, e.g. `vector {ident} = load(\"...\", key=\"{ident}\")` "
        f"or `param {ident} = 1.0`"
    )
