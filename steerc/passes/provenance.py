"""Pass `provenance` (with a model): vectors `steerc derive` made, used with another model or at another site.

A bank written by ``steerc derive`` records the model it was read from
(the layout fingerprint) and the site (kind, layers, head) in its metadata
(:mod:`steerc.derive.bank`). Loading it is never an error — a direction can
be worth trying elsewhere — but it is a warning, at the ``load``:

* ``vector-model-mismatch`` — the recorded fingerprint is not ``--model``'s;
* ``vector-site-mismatch`` — an intervention or probe that uses it steers or
  reads another kind of site (the residual stream counts as one kind,
  ``resid_pre[l+1]`` being ``resid_post[l]``), another head, or a per-layer
  bank read at ``resid_post`` is used at ``resid_pre`` (or the other way):
  its row ``l`` would then be one layer off.

Files without the metadata (vectors from elsewhere) are not judged, except
llama.cpp control vectors (``.gguf``): they are banks for ``resid_post``
(:mod:`steerc.io.controlvector`), judged for the site only.
"""

from __future__ import annotations

from steerc.diagnostics.codes import VECTOR_MODEL_MISMATCH, VECTOR_SITE_MISMATCH
from steerc.ir import nodes as ir
from steerc.ir.builtins import reads_vectors
from steerc.ir.walk import walk
from steerc.passes.context import CheckContext
from steerc.passes.layers import expand

name = "provenance"

RESID = ("resid_pre", "resid_post")


def run(ctx: CheckContext) -> None:
    if not ctx.origins or ctx.checked is None or ctx.facts is None:
        return
    loads_of: dict[str, list] = {}  # vector name -> its load calls (through other vectors too)
    for stmt in ctx.program.statements:
        if isinstance(stmt, ir.VectorDecl):
            loads_of[stmt.name] = _loads(stmt.value, loads_of)
    warned_model: set[int] = set()
    warned_site: set[tuple] = set()
    checked_sites = {iv.name: iv.site for iv in ctx.checked.interventions}
    checked_sites.update({p.name: p.site for p in ctx.checked.probes.values()})
    for stmt in ctx.program.statements:
        if isinstance(stmt, ir.VectorDecl):
            for call in loads_of[stmt.name]:
                _model(ctx, call, warned_model)
            continue
        if not isinstance(stmt, (ir.InterventionDecl, ir.ProbeDecl)) or stmt.name not in checked_sites:
            continue
        site = checked_sites[stmt.name]
        used = [n for n in walk(stmt.op if isinstance(stmt, ir.InterventionDecl) else stmt.readout)] \
            if (stmt.op if isinstance(stmt, ir.InterventionDecl) else stmt.readout) is not None else []
        for call in _loads_in(used, loads_of):
            _model(ctx, call, warned_model)
            _site(ctx, call, site, stmt, warned_site)


def _loads(expr, loads_of) -> list:
    return _loads_in(list(walk(expr)), loads_of)


def _loads_in(nodes, loads_of) -> list:
    out = []
    for n in nodes:
        if isinstance(n, ir.Call) and reads_vectors(n.func):
            out.append(n)
        elif isinstance(n, ir.Name) and n.id in loads_of:
            out.extend(loads_of[n.id])
    return list({id(c): c for c in out}.values())


def _model(ctx: CheckContext, call: ir.Call, warned: set) -> None:
    origin = ctx.origins.get(id(call))
    if origin is None or "model" not in origin or id(call) in warned:
        return
    warned.add(id(call))
    model = origin.get("model") or {}
    if model.get("fingerprint") != ctx.facts.fingerprint:
        facts = ctx.facts
        ctx.warning(VECTOR_MODEL_MISMATCH,
                    f"this file was derived from another model ({model.get('name', '?')}: {model.get('family', '?')}, "
                    f"{model.get('layers', '?')} layers, hidden {model.get('hidden', '?')}); --model is "
                    f"{facts.family} with {facts.layers} layers, hidden {facts.hidden}",
                    call.span, help="derive the vector on this model (steerc derive --model ...), or check that "
                                    "the two models share their residual stream")


def _site(ctx: CheckContext, call: ir.Call, site, stmt, warned: set) -> None:
    origin = ctx.origins.get(id(call))
    if origin is None or (id(call), stmt.name) in warned:
        return
    derived, used = origin.get("site"), site.kind
    per_layer = origin.get("per_layer") or any(k.name == "per_layer" and getattr(k.value, "value", False)
                                               for k in call.kwargs)
    why = None
    if (derived in RESID) != (used in RESID) or (derived not in RESID and derived != used):
        why = f"it was read at {derived} sites, and `{stmt.name}` uses it at {used}"
    elif per_layer and derived in RESID and derived != used:
        same = "resid_pre[l+1]" if derived == "resid_post" else "resid_post[l-1]"
        lands = "a layer earlier" if used == "resid_pre" else "a layer later"
        why = (f"its rows are {derived}[l], and `{stmt.name}` uses the bank at {used}[l], so row l lands "
               f"{lands} in the forward pass than it was read ({same} is the point {derived}[l] is)")
    elif derived == "head" and used == "head" and site.heads is not None:
        head = origin.get("head")
        heads = set(expand(site.heads, ctx.facts.heads).indices)
        if head is not None and heads and heads != {head}:
            why = f"it was read at head {head}, and `{stmt.name}` uses it at head {', '.join(map(str, sorted(heads)))}"
    if why is None:
        return
    warned.add((id(call), stmt.name))
    ctx.warning(VECTOR_SITE_MISMATCH, f"this vector was derived at another site: {why}", call.span,
                help=f"use it at {derived}, or derive it where it is used (steerc derive --at ...)")
