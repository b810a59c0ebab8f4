"""Pass `types`: every expression is a scalar, a vector or a probe, as needed.

Types are syntactic (no values yet): numbers and params are scalars; loaded
vectors, literals and ``normalize`` are vectors; a ``matrix`` declaration's
``load`` and a matrix's name are matrices, which take part in no arithmetic
and are operands of ``loreft`` only; a ``sae`` declaration's ``sae(...)``
and an SAE's name are SAEs, used only as ``s[i]``: feature ``i``, a vector
(its decoder row) and the operand of ``clamp feature``; vectors add to vectors and
multiply or divide by scalars. ``ramp(n)``, ``decay(r)`` and ``window(a, b)``
are schedules: scalars that vary with the generation step; they combine
with scalars and each other by products only, and a schedule times a vector
is a scheduled vector, which only `add` takes. Each operation, readout and
gate checks its operands. Reports ``type-error`` with what was expected
where.
"""

from __future__ import annotations

from steerc.diagnostics.codes import DUPLICATE_FIELD, INVALID_VALUE, TYPE_ERROR
from steerc.diagnostics.suggest import did_you_mean
from steerc.ir import nodes as ir
from steerc.ir.builtins import BUILTINS, SAE_FN, SCHEDULE_FN, SOURCE, VECTOR_FN
from steerc.passes.context import CheckContext

name = "types"

SCALAR, VECTOR, MATRIX, PROBE, STRING, BOOL = "scalar", "vector", "matrix", "probe", "string", "bool"
SAE = "sae"
SCHEDULE, SCHEDULED = "schedule", "scheduled vector"
_ARTICLE = {SCALAR: "a scalar", VECTOR: "a vector", MATRIX: "a matrix", PROBE: "a probe", STRING: "a string",
            BOOL: "a boolean", SCHEDULE: "a schedule", SCHEDULED: "a scheduled vector", SAE: "an SAE"}
# name -> how many scalar arguments (the values are checked by `fold`)
SCHEDULES = {b.name: len(b.params) for b in BUILTINS.values() if b.kind == SCHEDULE_FN}
_ONLY_ADD = "schedules vary with the generation step and scale the vector of an `add` only"
_ONLY_LOREFT = "a matrix is an operand of `loreft` only (`loreft R, W, b`)"
_DECLARE_MATRIX = 'declare the 2-D tensor with `matrix R = load("reft.safetensors", key="R")` and use its name here'
_LOREFT = "`loreft R, W, b` takes the matrices R and W ([r, d]) and the vector b ([r])"
_ONLY_FEATURES = "an SAE is used by its features: `s[i]` is feature i (its decoder row, a vector)"
_DECLARE_SAE = 'declare the SAE folder with `sae s = sae("saes/my-sae")` and use a feature of it, `s[0]`'
_CLAMP_FEATURE = "`clamp feature s[i] to c` sets the activation of feature i of the SAE `s` to c"
LOAD_KEYWORDS = dict(BUILTINS["load"].keywords)  # {"key": STRING, "per_layer": BOOL}


def run(ctx: CheckContext) -> None:
    for stmt in ctx.program.statements:
        if getattr(stmt, "name", None) in ctx.poisoned:
            continue
        if isinstance(stmt, ir.ParamDecl):
            ok = expect(ctx, stmt.value, SCALAR, "a param is a number")
            for bound in stmt.range or ():
                ok &= expect(ctx, bound, SCALAR, "the bounds of a param's range are numbers")
            _poison_if(ctx, stmt, ok)
        elif isinstance(stmt, ir.VectorDecl):
            _poison_if(ctx, stmt, expect(ctx, stmt.value, VECTOR, "a vector declaration needs a vector value"))
        elif isinstance(stmt, ir.MatrixDecl):
            _poison_if(ctx, stmt, _matrix_decl(ctx, stmt))
        elif isinstance(stmt, ir.SaeDecl):
            _poison_if(ctx, stmt, _sae_decl(ctx, stmt))
        elif isinstance(stmt, ir.ProbeDecl):
            _readout(ctx, stmt)
        elif isinstance(stmt, ir.InterventionDecl):
            _intervention(ctx, stmt)


def _poison_if(ctx: CheckContext, stmt, ok: bool) -> None:
    if not ok:
        ctx.poisoned.add(stmt.name)


def _matrix_decl(ctx: CheckContext, stmt: ir.MatrixDecl) -> bool:
    """A matrix is a ``load(...)`` of a 2-D tensor, or another matrix's name."""
    value = stmt.value
    if isinstance(value, ir.Call) and value.func in BUILTINS and BUILTINS[value.func].kind == SOURCE:
        t = ctx.types[id(value)] = _load(ctx, value, MATRIX)
        return t is not None
    return expect(ctx, value, MATRIX, "a matrix declaration needs a matrix value", help=_DECLARE_MATRIX)


def _sae_decl(ctx: CheckContext, stmt: ir.SaeDecl) -> bool:
    """An SAE is ``sae("folder")``, or another SAE's name."""
    value = stmt.value
    if isinstance(value, ir.Call) and value.func == "sae":
        return type_of(ctx, value) == SAE
    return expect(ctx, value, SAE, "a `sae` declaration names an SAE folder", help=_DECLARE_SAE)


def _readout(ctx: CheckContext, probe: ir.ProbeDecl) -> None:
    r = probe.readout
    ok = True
    if isinstance(r, ir.Cosine):
        ok = expect(ctx, r.vector, VECTOR, "`cosine` compares the hidden state with a vector")
    elif isinstance(r, (ir.ProjectedCosine, ir.SubspaceCosine)):
        name = "projected_cosine" if isinstance(r, ir.ProjectedCosine) else "subspace_cosine"
        ok = all(expect(ctx, v, VECTOR, f"`{name}` projects onto vectors") for v in r.vectors)
    elif isinstance(r, ir.Dot):
        ok = expect(ctx, r.vector, VECTOR, "`dot(w)` needs a weight vector")
        ok &= all(expect(ctx, o.value, SCALAR, "the bias of `dot(w) + b` is a number") for o in r.offsets)
    elif isinstance(r, ir.FeatureReadout):
        ok = type_of(ctx, r.feature) is not None  # `s[i]`: `s` an SAE (an Index's type checks its base)
    _poison_if(ctx, probe, ok)


def _intervention(ctx: CheckContext, iv: ir.InterventionDecl) -> None:
    op = iv.op
    ok = True
    if isinstance(op, ir.Add):
        t = type_of(ctx, op.vector)
        ok = t in (VECTOR, SCHEDULED) or (t is not None and expect(ctx, op.vector, VECTOR, "`add` adds a vector"))
    elif isinstance(op, ir.Set):
        ok = expect(ctx, op.vector, VECTOR, "`set` replaces the hidden state with a vector")
    elif isinstance(op, ir.Scale):
        t = type_of(ctx, op.factor)
        if t not in (SCALAR, VECTOR, None):
            ctx.error(TYPE_ERROR, f"`scale` takes a number or a vector, found {_ARTICLE[t]}", op.factor.span)
            ok = False
        ok &= t is not None
    elif isinstance(op, ir.Ablate):
        ok = all(expect(ctx, d, VECTOR, "`ablate` removes vector directions") for d in op.directions)
    elif isinstance(op, ir.Clamp):
        ok = expect(ctx, op.direction, VECTOR, "`clamp` pins the component along a vector")
        ok &= expect(
            ctx, op.value, SCALAR, "`clamp u to c` pins the component along `u` to the number `c`",
            help="write a number or a param after `to`, e.g. `clamp formal to 3.0`",
        )
    elif isinstance(op, ir.Rotate):
        ok = expect(ctx, op.first, VECTOR, "`rotate in (b1, b2)` spans a plane with two vectors")
        ok &= expect(ctx, op.second, VECTOR, "`rotate in (b1, b2)` spans a plane with two vectors")
        ok &= expect(ctx, op.angle, SCALAR, "a rotation angle is a number (radians, or with `deg`)")
    elif isinstance(op, ir.ClampFeature):
        ok = _feature(ctx, op.feature)
        ok &= expect(ctx, op.value, SCALAR, "`clamp feature s[i] to c` sets the feature's activation to the number c",
                     help="write a number or a param after `to`, e.g. `clamp feature s[0] to 40`")
    elif isinstance(op, ir.LoReFT):
        ok = expect(ctx, op.rotation, MATRIX, _LOREFT, help=_DECLARE_MATRIX)
        ok &= expect(ctx, op.weight, MATRIX, _LOREFT, help=_DECLARE_MATRIX)
        ok &= expect(ctx, op.bias, VECTOR, _LOREFT)
    if iv.gate is not None:
        ok &= _gate(ctx, iv.gate)
    _poison_if(ctx, iv, ok)


def _feature(ctx: CheckContext, e) -> bool:
    """The operand of ``clamp feature``: an SAE's feature ``s[i]`` as written (not a vector made from one)."""
    if isinstance(e, ir.Index):
        return type_of(ctx, e) is not None
    t = type_of(ctx, e)
    if t is not None:
        ctx.error(TYPE_ERROR, f"expected an SAE's feature `s[i]`, found {_ARTICLE[t]}: {_CLAMP_FEATURE}", e.span,
                  help="to pin the component of h along a vector write `clamp v to c` (without `feature`)"
                  if t == VECTOR else _DECLARE_SAE)
    return False


def _gate(ctx: CheckContext, g) -> bool:
    if isinstance(g, ir.Compare):
        left, right = type_of(ctx, g.left), type_of(ctx, g.right)
        if left is None or right is None:
            return False
        if sorted((left, right)) == [PROBE, SCALAR]:
            return True
        if PROBE in (left, right) and {VECTOR, MATRIX, SAE} & {left, right}:  # noqa: SIM114
            other = right if left == PROBE else left
            ctx.error(TYPE_ERROR, f"compare a probe with a number, not with {_ARTICLE[other]}", g.span,
                      help="a probe is one number per sequence (or per token); compare it with a threshold")
        elif PROBE not in (left, right):
            ctx.error(
                TYPE_ERROR,
                f"a condition compares a probe with a number; this compares {_ARTICLE[left]} with {_ARTICLE[right]}",
                g.span,
                help="declare a `probe` that reads a site, and compare it: `when my_probe > 0.2`",
            )
        else:
            ctx.error(TYPE_ERROR, "compare a probe with a number, not with another probe", g.span)
        return False
    if isinstance(g, ir.GateNot):
        return _gate(ctx, g.operand)
    return _gate(ctx, g.left) & _gate(ctx, g.right)


def expect(ctx: CheckContext, expr, want: str, why: str, help: str | None = None) -> bool:
    t = type_of(ctx, expr)
    if t is None:
        return False
    if t != want:
        if t in (SCHEDULE, SCHEDULED) and help is None:
            help = _ONLY_ADD + ": `add strength * decay(0.9) * v`"
        elif t == MATRIX and help is None:
            help = _ONLY_LOREFT
        elif t == SAE and help is None:
            help = _ONLY_FEATURES
        ctx.error(TYPE_ERROR, f"expected {_ARTICLE[want]}, found {_ARTICLE[t]}: {why}", expr.span, help=help)
        return False
    return True


def type_of(ctx: CheckContext, e) -> str | None:
    """The type of ``e``, reporting faults inside it; ``None`` once reported."""
    key = id(e)
    if key in ctx.types:
        return ctx.types[key]
    t = _infer(ctx, e)
    ctx.types[key] = t
    return t


def _infer(ctx: CheckContext, e) -> str | None:
    if isinstance(e, (ir.Number, ir.Degrees)):
        return SCALAR
    if isinstance(e, ir.Str):
        return STRING
    if isinstance(e, ir.Bool):
        return BOOL
    if isinstance(e, ir.Name):
        sym = ctx.symbols.get(e.id)
        if sym is None or sym.name in ctx.poisoned:
            return None
        if sym.kind == "intervention":
            ctx.error(TYPE_ERROR, f"`{e.id}` is an intervention, not a value", e.span)
            return None
        return {"param": SCALAR, "vector": VECTOR, "matrix": MATRIX, "sae": SAE, "probe": PROBE}[sym.kind]
    if isinstance(e, ir.Neg):
        t = type_of(ctx, e.operand)
        if t == PROBE:
            ctx.error(TYPE_ERROR, "a probe can only be compared in `when`", e.span)
            return None
        if t == MATRIX:
            ctx.error(TYPE_ERROR, "a matrix takes part in no arithmetic", e.span, help=_ONLY_LOREFT)
            return None
        if t == SAE:
            ctx.error(TYPE_ERROR, "an SAE takes part in no arithmetic", e.span, help=_ONLY_FEATURES)
            return None
        return t
    if isinstance(e, ir.Index):
        return _index(ctx, e)
    if isinstance(e, ir.BinOp):
        return _binop(ctx, e)
    if isinstance(e, ir.VectorLit):
        if not e.items:
            ctx.error(INVALID_VALUE, "an empty vector literal", e.span)
            return None
        ok = all(expect(ctx, i, SCALAR, "vector literal entries are numbers") for i in e.items)
        return VECTOR if ok else None
    if isinstance(e, ir.Call):
        return _call(ctx, e)
    raise TypeError(f"not an expression: {e!r}")


def _binop(ctx: CheckContext, e: ir.BinOp) -> str | None:
    left, right = type_of(ctx, e.left), type_of(ctx, e.right)
    if left is None or right is None:
        return None
    if PROBE in (left, right):
        ctx.error(TYPE_ERROR, "a probe can only be compared in `when`, not used in arithmetic", e.span)
        return None
    if STRING in (left, right) or BOOL in (left, right):
        ctx.error(TYPE_ERROR, "strings and booleans take no part in arithmetic", e.span)
        return None
    if MATRIX in (left, right):
        ctx.error(TYPE_ERROR, "a matrix takes part in no arithmetic", e.span, help=_ONLY_LOREFT)
        return None
    if SAE in (left, right):
        ctx.error(TYPE_ERROR, "an SAE takes part in no arithmetic", e.span, help=_ONLY_FEATURES)
        return None
    timed = {SCHEDULE, SCHEDULED} & {left, right}
    if timed:
        return _timed(ctx, e, left, right)
    if e.op in "+-":
        if left == right:
            return left
        ctx.error(
            TYPE_ERROR,
            f"cannot {'add' if e.op == '+' else 'subtract'} a scalar and a vector",
            e.span,
            help="vectors add to vectors; to scale a vector multiply it by a number",
        )
        return None
    if e.op == "*":
        if VECTOR in (left, right) and left == right:
            ctx.error(
                TYPE_ERROR,
                "a vector can only be multiplied by a number",
                e.span,
                help="for an element-wise product on the hidden state use the operation `scale v`",
            )
            return None
        return VECTOR if VECTOR in (left, right) else SCALAR
    if right == VECTOR:
        ctx.error(TYPE_ERROR, "cannot divide by a vector", e.right.span)
        return None
    return left


def _index(ctx: CheckContext, e: ir.Index) -> str | None:
    """``s[i]``: ``s`` an SAE and ``i`` a number (the fold pass checks it is a whole feature index)."""
    base = type_of(ctx, e.base)
    if base is None:
        type_of(ctx, e.index)
        return None
    if base != SAE:
        ctx.error(TYPE_ERROR, f"`{e.base.id}[...]` picks a feature of an SAE, but `{e.base.id}` is "
                  f"{_ARTICLE[base]}", e.base.span,
                  help=_DECLARE_SAE if base in (VECTOR, MATRIX) else None)
        type_of(ctx, e.index)
        return None
    ok = expect(ctx, e.index, SCALAR, "an SAE's feature index is a whole number",
                help=f"write `{e.base.id}[0]` for the SAE's first feature")
    return VECTOR if ok else None


def _timed(ctx: CheckContext, e: ir.BinOp, left: str, right: str) -> str | None:
    """Arithmetic with a schedule: products (and division by a scalar) only."""
    if e.op == "*":
        kinds = sorted((left, right))
        if kinds in ([SCALAR, SCHEDULE], [SCHEDULE, SCHEDULE]):
            return SCHEDULE
        if kinds in ([SCHEDULE, VECTOR], [SCALAR, SCHEDULED], [SCHEDULE, SCHEDULED]):
            return SCHEDULED
        ctx.error(TYPE_ERROR, f"cannot multiply {_ARTICLE[left]} by {_ARTICLE[right]}", e.span,
                  help="a schedule multiplies one vector: `strength * decay(0.9) * v`")
        return None
    if e.op == "/" and right == SCALAR:
        return left
    what = "add to or subtract from" if e.op in "+-" else "divide by"
    ctx.error(TYPE_ERROR, f"cannot {what} a schedule", e.span,
              help="schedules combine by products (`ramp(8) * decay(0.9)`) and scale a vector")
    return None


def _call(ctx: CheckContext, e: ir.Call) -> str | None:
    if e.func in SCHEDULES:
        n = SCHEDULES[e.func]
        if len(e.args) != n or e.kwargs:
            ctx.error(TYPE_ERROR, f"`{e.func}` takes {n} number{'s' if n > 1 else ''}", e.span,
                      help=f"{BUILTINS[e.func].signature}: {BUILTINS[e.func].doc}")
            return None
        ok = all(expect(ctx, a, SCALAR, f"the arguments of `{e.func}` are numbers") for a in e.args)
        return SCHEDULE if ok else None
    kind = BUILTINS[e.func].kind if e.func in BUILTINS else None
    if kind == VECTOR_FN:
        if len(e.args) != 1 or e.kwargs:
            ctx.error(TYPE_ERROR, "`normalize` takes exactly one vector", e.span)
            return None
        return VECTOR if expect(ctx, e.args[0], VECTOR, "`normalize` scales a vector to length 1") else None
    if kind == SOURCE:
        return _load(ctx, e)
    if kind == SAE_FN:
        return _sae_call(ctx, e)
    return None  # unknown functions were reported by `names`


def _sae_call(ctx: CheckContext, e: ir.Call) -> str | None:
    """``sae("folder")``: one string, the folder, and only as the value of a ``sae`` declaration (the
    declaration is checked first, so the call's type is known by then)."""
    if len(e.args) != 1 or e.kwargs or not isinstance(e.args[0], ir.Str):
        ctx.error(TYPE_ERROR, "`sae` takes one string, the SAE's folder", e.span,
                  help='write sae("saes/my-sae"): a folder holding cfg.json and sae_weights.safetensors')
        return None
    return SAE


def _load(ctx: CheckContext, e: ir.Call, result: str = VECTOR) -> str | None:
    """The type of a ``load(...)``: ``result`` (a vector; a matrix in a ``matrix`` declaration) once its
    arguments are right."""
    ok = True
    if len(e.args) != 1:
        ctx.error(
            TYPE_ERROR,
            f"`load` takes one path, found {len(e.args)} positional argument(s)",
            e.span,
            help='write load("vectors/file.safetensors", key="name")',
        )
        ok = False
    elif not isinstance(e.args[0], ir.Str):
        ctx.error(TYPE_ERROR, "the path given to `load` must be a string", e.args[0].span)
        ok = False
    seen = set()
    for kw in e.kwargs:
        want = LOAD_KEYWORDS.get(kw.name)
        if want is None:
            ctx.error(
                TYPE_ERROR,
                f"`load` has no argument `{kw.name}`",
                kw.span,
                help=did_you_mean(kw.name, LOAD_KEYWORDS) or "its arguments are `key` and `per_layer`",
            )
            ok = False
        elif kw.name in seen:
            ctx.error(DUPLICATE_FIELD, f"`{kw.name}` is given twice", kw.span)
            ok = False
        elif result == MATRIX and kw.name == "per_layer":
            ctx.error(TYPE_ERROR, "`per_layer` loads one vector per layer; a matrix is one 2-D tensor", kw.span,
                      help="drop `per_layer`: a matrix declaration loads the tensor `key` names as it is")
            ok = False
        elif type_of(ctx, kw.value) != want:
            ctx.error(TYPE_ERROR, f"`{kw.name}` must be {_ARTICLE[want]}", kw.value.span)
            ok = False
        seen.add(kw.name)
    return result if ok else None
