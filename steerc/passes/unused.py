"""Pass `unused`: params, vectors, matrices, SAEs and probes declared but never used (warnings).

Runs last, so a declaration whose own error was reported (a vector whose
file is missing, say) does not also draw an ``unused-name`` warning.
"""

from __future__ import annotations

from steerc.diagnostics.codes import UNUSED_NAME
from steerc.ir import nodes as ir
from steerc.passes.context import CheckContext

name = "unused"

_KINDS = {ir.ParamDecl: "param", ir.VectorDecl: "vector", ir.MatrixDecl: "matrix", ir.SaeDecl: "sae",
          ir.ProbeDecl: "probe"}


def run(ctx: CheckContext) -> None:
    for stmt in ctx.program.statements:
        kind = _KINDS.get(type(stmt))
        if kind is None or stmt.name in ctx.poisoned:
            continue
        sym = ctx.symbols.get(stmt.name)
        if sym is not None and sym.decl is stmt and not sym.used:
            ctx.warning(
                UNUSED_NAME,
                f"{kind} `{stmt.name}` is never used",
                stmt.name_span,
                help="remove it, or use it in an intervention",
            )
