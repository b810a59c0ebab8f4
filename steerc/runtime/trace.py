"""What each gate of a plan decided, and where each intervention steered, read from a runtime's own state.

Both runtimes keep a context with the same face: ``pos`` and ``real``
([rows, tokens]: positions, and which tokens are real), ``values`` (per-token
probe values of the last pass, [rows, tokens]), ``held`` (pooled probe values,
[rows]), and ``gate_mask(gate_data)`` / ``scope_mask(scope_data)`` with the
masks the kernels saw. After every forward pass a :class:`GateRecorder` reads
it (``record``); ``report()`` says, per row, which positions passed, where
each gate held, and where each gated intervention steered:

* on HF, ``steerc run --show-gates`` (:class:`steerc.runtime.hf.gates.GateTrace`);
* on a vLLM server, a steered response's receipt (:mod:`steerc.runtime.vllm.receipt`),

so the two report the same numbers for the same plan and prompt.
"""

from __future__ import annotations

import math

from steerc.ir import checked as ck
from steerc.ir.checked import gate_text
from steerc.ir.plan import rebind
from steerc.targets.hooks import gate_data, scope_data


def _leaves(g):
    if isinstance(g, ck.GateCompare):
        return [g]
    if isinstance(g, ck.GateNegate):
        return _leaves(g.operand)
    return [leaf for p in g.parts for leaf in _leaves(p)]


def plan_gates(plan) -> list[dict]:
    """Each distinct gate of ``plan`` once: its checked form, its comparisons, and the interventions it gates
    with the runtime's scope data of each (``scopes``: name -> scope)."""
    found: dict = {}
    for sp in plan.sites:
        for k in sp.kernels:
            if k.gate is None:
                continue
            entry = found.setdefault(gate_data(k.gate), {"gate": k.gate, "interventions": [], "scopes": {}})
            for name in k.names:
                if name not in entry["interventions"]:
                    entry["interventions"].append(name)
                    entry["scopes"][name] = scope_data(k.scope)
    return [{"data": data, **entry, "leaves": _leaves(entry["gate"])} for data, entry in found.items()]


class GateRecorder:
    """Records, per row, where each gate held and the probe values that decided it (see module doc)."""

    def __init__(self, plan, params=None):
        self.plan = rebind(plan, params)
        self.gates = plan_gates(self.plan)
        for g in self.gates:
            g["pooled"] = all(self.plan.probe(leaf.probe).pool != "token" for leaf in g["leaves"])
        # intervention -> the (gate data or None, scope data) of each of its kernels
        self.steering: dict[str, list] = {}
        for sp in self.plan.sites:
            for k in sp.kernels:
                pair = (None if k.gate is None else gate_data(k.gate), scope_data(k.scope))
                for name in k.names:
                    if pair not in self.steering.setdefault(name, []):
                        self.steering[name].append(pair)
        self.rows: list[dict] | None = None

    def record(self, ctx) -> None:
        """Read one forward pass from a runtime context (after the pass)."""
        if ctx.pos is None:
            return
        real, pos = ctx.real.cpu(), ctx.pos.cpu()
        if self.rows is None or len(self.rows) != real.shape[0]:
            self.rows = [{"seen": [], "held": {}, "masks": {}, "values": {}, "steered": {}, "plen": None}
                         for _ in range(real.shape[0])]
        masks = {}
        steered = {}
        for name, pairs in self.steering.items():
            mask = None
            for gate, scope in pairs:
                m = ctx.scope_mask(scope) if gate is None else ctx.scope_mask(scope) & ctx.gate_mask(gate)
                mask = m if mask is None else mask | m
            steered[name] = mask.cpu()
        # A pooled decision exists from the prompt's last position on (where it is taken): earlier positions
        # may be computed before the whole prompt has passed (an engine that splits a prompt into chunks).
        decided = (ctx.pos >= ctx.plen - 1).cpu()
        for g in self.gates:
            mask = ctx.gate_mask(g["data"]).cpu()
            masks[g["data"]] = mask & decided if g["pooled"] else mask
            for scope in g["scopes"].values():
                masks.setdefault(scope, ctx.scope_mask(scope).cpu())
            for leaf in g["leaves"]:
                key = gate_data(leaf)
                mask = ctx.gate_mask(key).cpu()
                masks.setdefault(key, mask & decided if self.plan.probe(leaf.probe).pool != "token" else mask)
        for b, row in enumerate(self.rows):
            at = pos[b][real[b]].tolist()
            row["seen"].extend(at)
            row["plen"] = int(ctx.plen.reshape(len(self.rows), -1)[b, 0])
            for name, mask in steered.items():
                row["steered"].setdefault(name, set()).update(
                    p for p, m in zip(at, mask[b][real[b]].tolist()) if m)
            for key, mask in masks.items():
                row["masks"].setdefault(key, []).extend(p for p, m in zip(at, mask[b][real[b]].tolist()) if m)
            for name, values in ctx.values.items():
                row["values"].setdefault(name, []).extend(zip(at, values[b][real[b]].double().cpu().tolist()))
            for name, held in ctx.held.items():
                row["held"][name] = float(held[b])

    def report(self) -> list[dict]:
        """Per batch row: ``{"positions": n, "gates": [...], "interventions": [...]}``; each intervention with
        the prompt and generated tokens it steered (where its scope selects and its gate, if any, held); each
        gate with its interventions, its
        condition, whether it opened, the positions where it held, the positions each of its interventions
        steered (where the gate held and the scope selects), and per comparison the probe's value
        (pooled: the held value; per token: min, max and the positions where the comparison held)."""
        return [self._row(row) for row in (self.rows or [])]

    def _row(self, row: dict) -> dict:
        gates = []
        for g in self.gates:
            held = sorted(set(row["masks"].get(g["data"], ())))
            comparisons = [self._comparison(leaf, row) for leaf in g["leaves"]]
            pooled = g["pooled"]
            steered = {name: sorted(set(held) & set(row["masks"].get(scope, ())))
                       for name, scope in g["scopes"].items()}
            gates.append({"interventions": list(g["interventions"]), "gate": g["gate"],
                          "decided": "once per sequence" if pooled else "per position",
                          "opened": bool(held), "positions": held, "steered": steered, "comparisons": comparisons})
        plen = row["plen"] or 0
        interventions = [{"name": name, "prompt_tokens": sum(1 for p in row["steered"].get(name, ()) if p < plen),
                          "generated_tokens": sum(1 for p in row["steered"].get(name, ()) if p >= plen)}
                         for name in self.steering]
        return {"positions": len(set(row["seen"])), "gates": gates, "interventions": interventions}

    def _comparison(self, leaf, row: dict) -> dict:
        probe = self.plan.probe(leaf.probe)
        out = {"probe": probe.name, "readout": probe.kind, "site": probe.site.text, "pool": probe.pool,
               "op": leaf.op, "threshold": leaf.threshold,
               "positions": sorted(set(row["masks"].get(gate_data(leaf), ())))}
        if probe.pool != "token":
            value = row["held"].get(probe.name, math.nan)
            return {**out, "value": value, "held": bool(out["positions"])}
        seen = row["values"].get(probe.name, [])
        if seen:
            low = min(seen, key=lambda pv: pv[1])
            high = max(seen, key=lambda pv: pv[1])
            out.update(min=low[1], min_at=low[0], max=high[1], max_at=high[0])
        return out


def gates_json(row: dict) -> dict:
    """One row of a report as JSON (spec/json.md): each gate's condition as text with thresholds that read
    back exactly, and a pooled value the row never reached as ``null``."""

    def number(x):
        return None if x is None or math.isnan(x) else float(x)

    gates = []
    for g in row["gates"]:
        comparisons = [{k: number(v) if k in ("threshold", "value", "min", "max") else v for k, v in c.items()}
                       for c in g["comparisons"]]
        gates.append({"interventions": g["interventions"], "condition": gate_text(g["gate"], _exact),
                      "decided": g["decided"], "opened": g["opened"], "positions": g["positions"],
                      "steered": g["steered"], "comparisons": comparisons})
    return {"positions": row["positions"], "gates": gates}


def _exact(x: float) -> str:
    return repr(float(x))
