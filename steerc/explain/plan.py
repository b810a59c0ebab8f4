"""``steerc explain``: what a program does to a model, site by site.

:func:`explain` builds a JSON-ready document from a checked program with a
plan; :func:`render` prints it for people. Per site (in forward order): the
hook that realises it on the target's backend, the kernels after fusion,
the token positions each one touches (saying when position ``P-1``, which
predicts the first generated token, is not steered), when its gate is
decided; then the probes, the constraint, and what the optimiser changed.
"""

from __future__ import annotations

import math

import numpy as np

from steerc.facts.sites import site_table
from steerc.frontend.fmt import scope as scope_text
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.checked import gate_text
from steerc.ir.interpret import schedule_factor
from steerc.ir.plan import Kernel, Plan, Site, kind_of

FORMAT = "steerc.explain/1"
BACKEND_OF = {"hf": "hf", "vllm": "vllm", "serve": "vllm", "weights": "hf"}  # weights: the modules it folds into


# ------------------------------------------------------------------ positions


def _positions(scope) -> tuple[str, bool | None]:
    """(what positions a scope item covers, whether it covers P-1: True/False/None=depends)."""
    if isinstance(scope, ir.ScopeAll):
        return "every position", True
    if isinstance(scope, ir.ScopePrompt):
        if scope.sel is None:
            return "prompt positions 0 .. P-1", True
        if isinstance(scope.sel, ir.PosIndex):
            i = scope.sel.index
            covers = True if i == -1 else (False if i < -1 else None)
            return (f"prompt position {i}" if i >= 0 else f"prompt position P{i}"), covers
        a, b = scope.sel.start, scope.sel.stop
        lo = "0" if a is None else (str(a) if a >= 0 else f"P{a}")
        hi = "P-1" if b is None else (f"{b - 1}" if b > 0 else f"P{b - 1}")
        if b is None:
            covers = True if a is None or a < 0 else None  # prompt[5:] misses P-1 when P <= 5
        else:
            covers = False if b <= 0 else None
        return f"prompt positions {lo} .. {hi}", covers
    if isinstance(scope, ir.ScopeGenerated):
        if scope.sel is None:
            return "generated positions P ..", False
        if isinstance(scope.sel, ir.PosIndex):
            return f"generated position P+{scope.sel.index}", False
        a, b = scope.sel.start or 0, scope.sel.stop
        hi = ".." if b is None else f".. P+{b - 1}"
        return f"generated positions P+{a} {hi}".replace("P+0", "P"), False
    if isinstance(scope, ir.ScopePositions):
        return "absolute positions " + ", ".join(map(str, scope.positions)), None
    # P-1 is steered only when the text ends before the prompt's last token.
    return f"positions after the first {scope_text(scope)[6:]} in the prompt (found with the tokenizer)", None


def positions_of(scopes) -> dict:
    parts = [_positions(s) for s in scopes]
    covers = [c for _, c in parts]
    if any(c is True for c in covers):
        last = True
    elif all(c is False for c in covers):
        last = False
    else:
        last = None
    text = "; ".join(p for p, _ in parts)
    note = None
    if last is False:
        note = "does not steer position P-1, which predicts the first generated token"
    elif last is None:
        note = "steers position P-1 (which predicts the first generated token) only for some prompt lengths"
    return {"scope": ", ".join(scope_text(s) for s in scopes), "positions": text, "covers_last_prompt": last,
            "note": note}


# -------------------------------------------------------------------- kernels


def _norm(v) -> float:
    return float(np.linalg.norm(v.array.astype(np.float64)))


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def precise(x: float) -> str:
    """A threshold or probe value to compare by eye: six significant digits (``0.125022``)."""
    return f"{x:.6g}"


SCHEDULE_STEPS = 8


def schedule_text(schedule) -> str:
    parts = []
    for kind, a, b in schedule:
        parts.append(f"ramp({a:g})" if kind == "ramp" else f"decay({a:g})" if kind == "decay"
                     else f"window({a:g}, {b:g})")
    return " * ".join(parts)


def describe_schedule(schedule) -> dict:
    """The schedule as written and its value at the first steps (step 0 is the prompt's last position,
    whose output predicts the first generated token; step 1 is the first generated token's position)."""

    values = schedule_factor(schedule, list(range(SCHEDULE_STEPS)))
    return {"factors": schedule_text(schedule), "steps": [round(float(v), 6) for v in values]}


def describe_op(op) -> dict:
    """What a kernel computes: its kind's own description (steerc.ir.kernels), and its schedule if any."""
    out = kind_of(op).explain(op, _fmt)
    if getattr(op, "schedule", ()):
        out["schedule"] = describe_schedule(op.schedule)
    return out


def _gate(kernel: Kernel, plan: Plan) -> dict | None:
    if kernel.gate is None:
        return None
    timing = []
    for name in ck.gate_probes(kernel.gate):
        p = plan.probe(name)
        if p.pool == "token":
            timing.append(f"{name}: per position, read at {p.site.text} before its kernels")
        else:
            timing.append(f"{name}: once per sequence, when the whole prompt has passed {p.site.text}; then held")
    return {"condition": gate_text(kernel.gate), "decided": timing, "per": "sequence (batch row)"}


def _kernel(kernel: Kernel, plan: Plan) -> dict:
    out = {
        "op": describe_op(kernel.op),
        "interventions": [{"name": p.intervention, "line": p.span.line if p.span else None, "source": p.note}
                          for p in kernel.provenance],
        **positions_of(kernel.scope),
        "gate": _gate(kernel, plan),
        "preserve_norm": kernel.preserve_norm,
    }
    if kernel.bindings:
        out["per_request"] = [_binding(b) for b in kernel.bindings]
    return out


ROLE_TEXT = {"bias": "b", "scale": "s", "target": "t", "angle": "angle"}


def _binding(b) -> dict:
    c = b.coefficient
    text = _fmt(math.degrees(c)) + " deg" if b.role == "angle" else (
        _fmt(c) if isinstance(c, float) else f"a vector of norm {_fmt(_norm(c))}")
    return {"role": b.role, "param": b.param, "coefficient": text,
            "text": f"{ROLE_TEXT[b.role]} = {b.param} * {text}"}


def _aliases(site: Site, layers: int) -> list[str]:
    if site.kind == "resid_post":
        alias = [f"resid_pre[{site.layer + 1}]"] if site.layer + 1 < layers else ["before the final norm"]
        return alias
    return []


def explain(result, target: str = "hf") -> dict:
    """The explain document of a CheckResult that has a plan."""

    plan: Plan = result.plan
    facts = result.facts
    if plan is None or facts is None:
        raise ValueError("explain needs a result checked against a model without errors (check_source(..., facts=...))")
    table = site_table(facts.family, BACKEND_OF[target])
    sites = []
    for sp in plan.sites:
        hook = table.hook(sp.site.kind, sp.site.layer)
        entry = {
            "site": sp.site.text,
            "also": _aliases(sp.site, facts.layers),
            "hook": {**hook.to_json(), **({"head_slice": [sp.site.head * facts.head_dim,
                                                          (sp.site.head + 1) * facts.head_dim]}
                                          if sp.site.head is not None else {})},
            "kernels": [_kernel(k, plan) for k in sp.kernels],
        }
        sites.append(entry)
    if target == "weights":  # which matrix each site's kernels fold into, in place of a hook
        from steerc.targets.weights.layout import describe

        folds = describe(plan, facts)
        for entry in sites:
            entry["folds_into"] = folds[entry["site"]]
    probes = [
        {
            "name": p.name,
            "site": p.site.text,
            "readout": p.kind,
            "pool": p.pool,
            "decided": "per position" if p.pool == "token" else "once the prompt has passed the site",
            **({"feature": p.about, "form": "f_i(h) = relu(pre) [pre > threshold], pre = (h - b_dec) . W_enc[:, i] "
                f"+ b_enc[i], threshold = {precise(p.threshold)}"} if p.kind == "sae_feature" else {}),
        }
        for p in plan.probes
    ]
    constraint = None
    if plan.constraint is not None:
        c = plan.constraint
        constraint = {"kind": c.kind, "origin": c.origin, **_constraint_overlap(plan)}
    return {
        "format": FORMAT,
        "file": plan.source_name,
        "source_sha256": plan.source_sha256,
        "target": target,
        "model": facts.to_json(),
        "sites": sites,
        "probes": probes,
        "constraint": constraint,
        **({"params": [{"name": p.name, "default": p.default, "min": p.low, "max": p.high} for p in plan.params]}
           if plan.params else {}),
        "changes": [
            {"pass": c.pass_name, "site": c.site.text, "what": c.what, "interventions": list(c.interventions)}
            for c in plan.changes
        ],
    }


def _constraint_overlap(plan: Plan) -> dict:
    steered = sorted({p.intervention for sp in plan.sites for k in sp.kernels
                      if positions_of(k.scope)["covers_last_prompt"] is not False or _touches_generated(k)
                      for p in k.provenance})
    return {
        "applies_to": "generated tokens (every sampling step)",
        "overlapping_interventions": steered,
        "note": "these interventions act on positions whose outputs the constraint filters"
        if steered else "no intervention steers a position that predicts a constrained token",
    }


def _touches_generated(k: Kernel) -> bool:
    return any(isinstance(s, (ir.ScopeAll, ir.ScopeGenerated, ir.ScopeAfter)) for s in k.scope)


# -------------------------------------------------------------------- render


def title(doc: dict) -> str:
    """The first line of explain's text: the file, the model's layout and the target."""
    m = doc["model"]
    return (f"{doc['file']} on {m['family']} ({m['layers']} layers, hidden {m['hidden']}, "
            f"{m['heads']} heads of {m['head_dim']}) for target {doc['target']}")


def render(doc: dict) -> str:
    lines = [title(doc)]
    if not doc["sites"]:
        lines.append("\nno kernels: the program does not steer this model")
    for s in doc["sites"]:
        also = f"  (= {', '.join(s['also'])})" if s["also"] else ""
        h = s["hook"]
        where = f"{h['hook']}-hook on {h['module']} ({h['tensor']}"
        where += f", columns {h['head_slice'][0]}:{h['head_slice'][1]})" if "head_slice" in h else ")"
        if "folds_into" in s:
            f = s["folds_into"]
            where = f"folds into {f['matrix']}" + (f" and {f['bias']}" if f["bias"] else "") + f": {f['how']}"
        lines.append(f"\n{s['site']}{also}\n  {where}")
        for n, k in enumerate(s["kernels"], 1):
            names = ", ".join(f"{i['name']}: {i['source']}" for i in k["interventions"])
            op = k["op"]
            extra = f", rank {op['rank']}" if "rank" in op else ""
            extra += f", targets {op['targets']}" if "targets" in op else ""
            extra += f", |b| = {op['bias_norm']}" if "bias_norm" in op else ""
            lines.append(f"  {n}. {op['kind']}: {op['form']}{extra}   [{names}]")
            lines.append(f"     tokens {k['scope']}: {k['positions']}")
            if "schedule" in op:
                sched = op["schedule"]
                shown = ", ".join(f"{v:g}" for v in sched["steps"])
                lines.append(f"     b scaled by {sched['factors']}: steps 0.. {len(sched['steps']) - 1}: {shown} "
                             "(step 0 = position P-1, which predicts the first generated token)")
            for b in k.get("per_request", ()):
                lines.append(f"     per request: {b['text']}")
            if k["note"]:
                lines.append(f"     note: {k['note']}")
            if k["gate"]:
                lines.append(f"     when {k['gate']['condition']} (per sequence)")
                for t in k["gate"]["decided"]:
                    lines.append(f"       {t}")
            if k["preserve_norm"]:
                lines.append("     then rescaled to the norm of its input")
    if doc["probes"]:
        lines.append("\nprobes")
        for p in doc["probes"]:
            lines.append(f"  {p['name']}: {p['readout']} at {p['site']}, pool {p['pool']} ({p['decided']})")
            if "feature" in p:
                lines.append(f"    feature {p['feature']}: {p['form']}")
    if doc["constraint"]:
        c = doc["constraint"]
        origin = f" from {c['origin']}" if c["origin"] else ""
        lines.append(f"\nconstraint: {c['kind']}{origin}, applied to {c['applies_to']}")
        lines.append(f"  {c['note']}" + (f": {', '.join(c['overlapping_interventions'])}"
                                         if c["overlapping_interventions"] else ""))
    if doc.get("params"):
        lines.append("\nper-request params (kernels that use them are kept apart: never fused or dropped)")
        for p in doc["params"]:
            rng = f", in [{p['min']:g}, {p['max']:g}]" if p["min"] is not None else ""
            lines.append(f"  {p['name']}: default {p['default']:g}{rng}")
    if doc["changes"]:
        lines.append("\noptimisations")
        for c in doc["changes"]:
            lines.append(f"  {c['site']}: {c['what']} ({', '.join(c['interventions'])})")
    return "\n".join(lines) + "\n"
