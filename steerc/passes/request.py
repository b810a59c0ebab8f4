"""Pass `request`: where a per-request param may go, and what each use scales.

A `param ... per request` is a value a serve request (or ``install(...,
params=...)``, or the vllm target's ``set_params``) may change after the
program is compiled. The compiled kernels stay right for every value only
where the param enters them linearly, as one factor of a value the runtime
holds in a buffer:

* the vector of an `add` or `set` (`add strength * decay(0.9) * joy`),
* the factor of a `scale`, the target of a `clamp` or `clamp feature`, the angle of a `rotate`,
* the threshold of a gate comparison (`when topic > limit`),

each time as a factor of the whole operand: the param appears once, on a
chain of products (and divisions by other numbers) from the operand's root.
Anywhere else — a sum (`(strength + 1) * v`), a divisor, `normalize`, a
schedule's argument, a vector or param declaration, a probe readout, the
`model` block — the compiled values would depend on it in a way the
runtimes cannot replay, and it is a ``per-request-param`` error at the use.

For each allowed use the pass records the operand's *coefficient*, its value
with the param at 1, so that a runtime rebuilds the operand as
``coefficient * value`` (:func:`steerc.ir.plan.rebind`).
"""

from __future__ import annotations

from steerc.core.record import evolve
from steerc.diagnostics.codes import PER_REQUEST_PARAM
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.builtins import is_schedule
from steerc.ir.walk import children, walk
from steerc.passes import types as ty
from steerc.passes.context import CheckContext, Fault
from steerc.passes.fold import Evaluator

name = "request"

ROLES = {ir.Add: ("vector", "bias"), ir.Set: ("vector", "bias"), ir.Scale: ("factor", "scale"),
         ir.Clamp: ("value", "target"), ir.ClampFeature: ("value", "target"), ir.Rotate: ("angle", "angle")}


def run(ctx: CheckContext) -> None:
    checked = ctx.checked
    if checked is None or not checked.request_params:
        return
    names = set(checked.request_params)
    allowed: set[int] = set()  # ids of the Name nodes used where they may be
    uses: dict[str, list] = {}  # intervention -> [(role, operand, Name node)]
    by_name = {iv.name: iv for iv in checked.interventions}
    for stmt in ctx.program.statements:
        if not isinstance(stmt, ir.InterventionDecl) or stmt.name not in by_name:
            continue
        for operand, role in _operands(stmt):
            found = [n for n in walk(operand) if isinstance(n, ir.Name) and n.id in names]
            node = _on_product_chain(operand, names) if len(found) == 1 else None
            if node is not None:
                allowed.add(id(node))
                uses.setdefault(stmt.name, []).append((role, operand, node))
    bad = False
    for stmt in ctx.program.statements:
        if isinstance(stmt, ir.InterventionDecl) and stmt.name not in by_name:
            continue  # it has errors of its own (an undefined name, say): no uses to judge yet
        reported: set = set()  # one error per param and operand (or declaration): the first misuse
        parents = _Parents(stmt)
        for node in walk(stmt):
            if isinstance(node, ir.Name) and node.id in names and id(node) not in allowed:
                if isinstance(stmt, ir.ParamDecl) and stmt.name == node.id:
                    continue
                operand = parents.operand(node, stmt)
                if (node.id, id(operand)) not in reported:
                    reported.add((node.id, id(operand)))
                    _misuse(ctx, node, stmt, operand, parents)
                bad = True
    if bad:
        return
    interventions = []
    for iv in checked.interventions:
        try:
            interventions.append(_bind(ctx, iv, uses[iv.name]) if iv.name in uses else iv)
        except Fault:
            return
    ctx.checked = evolve(checked, interventions=tuple(interventions))


def _operands(stmt: ir.InterventionDecl):
    """(operand, role) of an intervention: its op's scalar or vector operand, and gate thresholds."""
    spec = ROLES.get(type(stmt.op))
    if spec is not None:
        yield getattr(stmt.op, spec[0]), spec[1]
    if stmt.gate is not None:
        for node in walk(stmt.gate):
            if isinstance(node, ir.Compare):
                yield node.left, "threshold"
                yield node.right, "threshold"


def _on_product_chain(e, names: set[str]):
    """The param's Name when ``e`` is a product with it as one factor (through *, /-numerator, -)."""
    if isinstance(e, ir.Name):
        return e if e.id in names else None
    if isinstance(e, ir.Neg):
        return _on_product_chain(e.operand, names)
    if isinstance(e, ir.BinOp) and e.op == "*":
        return _on_product_chain(e.left, names) or _on_product_chain(e.right, names)
    if isinstance(e, ir.BinOp) and e.op == "/":
        return _on_product_chain(e.left, names)
    return None


class _Parents:
    """Each node's parent in one statement, so a misuse finds its operand and path in linear time."""

    def __init__(self, stmt):
        self.parent: dict[int, object] = {}
        self.operands = {id(o) for o, _ in _operands(stmt)} if isinstance(stmt, ir.InterventionDecl) else set()
        for n in walk(stmt):
            for c in children(n):
                self.parent[id(c)] = n

    def path(self, node):
        """``node``'s ancestors up to its operand (innermost first), and the operand (None: not in one)."""
        out, e = [], node
        while id(e) not in self.operands:
            e = self.parent.get(id(e))
            if e is None:
                return out, None
            out.append(e)
        return out, e

    def operand(self, node, stmt):
        return self.path(node)[1] or stmt


def _misuse(ctx: CheckContext, node: ir.Name, stmt, operand, parents: _Parents) -> None:
    where = {ir.ParamDecl: "a param declaration (declare it `per request` too, or use the param itself)",
             ir.VectorDecl: "a vector declaration (vectors are folded when the program is compiled)",
             ir.ProbeDecl: "a probe (readouts are fixed; compare the probe with the param in `when` instead)",
             ir.ModelBlock: "the model block"}.get(type(stmt))
    reason = (f"`{node.id}` is set per request, so it may appear only as one factor of the vector of an add or "
              "set, of a scale factor, a clamp target, a rotation angle or a gate threshold")
    if where is None and _in_index(operand, node.id):
        where = ("in an SAE's feature index (`s[...]`): the feature, its decoder row and encoder column, is picked "
                 "when the program is compiled")
        node = _in_index(operand, node.id)  # the caret at the use inside the index
    elif where is None and operand is stmt and isinstance(getattr(stmt, "op", None), ir.LoReFT):
        where = "in `loreft R, W, b`, whose values are compiled in (a LoReFT takes no per-request value)"
    elif where is None:
        where = _why(operand, node, parents) if operand is not stmt else "not one of those operands"
    ctx.error(PER_REQUEST_PARAM, f"{reason}; here it is {where}", node.span,
              help="write it as one factor: `add strength * joy`, `scale strength`, `when p > limit`; "
                   "for other uses drop `per request` and compile a plan per value with --set")


def _in_index(node, param: str) -> ir.Name | None:
    """The first use of ``param`` inside the index of an ``s[i]`` in ``node``, or None."""
    return next((m for n in walk(node) if isinstance(n, ir.Index)
                 for m in walk(n.index) if isinstance(m, ir.Name) and m.id == param), None)


def _why(operand, node: ir.Name, parents: _Parents) -> str:
    """Why ``node`` inside ``operand`` cannot be rebound: the outermost construct on its path that is not a
    product with it as one factor."""
    path, _ = parents.path(node)
    below = [node] + path[:-1]  # the child of each ancestor on the path
    for e, child in reversed(list(zip(path, below))):
        if isinstance(e, ir.Call):
            if e.func == "normalize":
                return "inside `normalize(...)`, which rescales to unit length whatever the value"
            if is_schedule(e.func):
                return f"an argument of the schedule `{e.func}`, which would change its shape, not its scale"
            return f"an argument of `{e.func}(...)`"
        if isinstance(e, ir.BinOp) and e.op in "+-":
            return (f"in a {'sum' if e.op == '+' else 'difference'}: the operand would not be a multiple "
                    "of one fixed value")
        if isinstance(e, ir.BinOp) and e.op == "/" and child is e.right:
            return "in a divisor: 1 / value is not a multiple of one fixed value"
    uses = sum(1 for n in walk(operand) if isinstance(n, ir.Name) and n.id == node.id)
    if uses > 1:
        return f"used {uses} times in one operand: the operand would grow like a power of the value"
    return "not on a chain of products from the operand"


def _bind(ctx: CheckContext, iv: ck.Intervention, uses) -> ck.Intervention:
    """The intervention with each use's coefficient (the operand with its param at 1) recorded."""

    bindings = []
    gate = iv.gate
    for role, operand, node in uses:
        env = dict(ctx.values or {})
        env[node.id] = 1.0
        ev = Evaluator(ctx, env)
        if role == "threshold":
            coefficient = ev.operand(operand)
            gate = _bind_gate(gate, node.id, coefficient, operand)
            continue
        if role == "bias" and ctx.types.get(id(operand)) == ty.SCHEDULED:
            coefficient, _ = ev.scheduled(operand)
        elif role == "bias" or (role == "scale" and ctx.types.get(id(operand)) == ty.VECTOR):
            coefficient = ev.vector(operand)
        else:
            coefficient = ev.operand(operand)
        bindings.append((role, node.id, coefficient))
    return evolve(iv, gate=gate, bindings=tuple(bindings))


def _bind_gate(g, param: str, coefficient: float, operand):
    """The gate with the comparison whose threshold is ``operand`` bound to ``param``."""
    if isinstance(g, ck.GateCompare):
        if g.span is not None and operand.span is not None and g.span.start <= operand.span.start \
                and operand.span.end <= g.span.end and g.param is None:
            return evolve(g, param=param, coefficient=coefficient)
        return g
    if isinstance(g, ck.GateNegate):
        return evolve(g, operand=_bind_gate(g.operand, param, coefficient, operand))
    return evolve(g, parts=tuple(_bind_gate(p, param, coefficient, operand) for p in g.parts))
