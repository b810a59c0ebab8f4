"""What each gate of an installed plan decided, per batch row, read from the HF runtime itself.

``steerc run --show-gates`` wraps generation in a :class:`GateTrace`: after
every forward pass of the model it reads the runtime's own context (the
pooled probe values it holds, the per-token values of that pass, the
positions) and evaluates each gate, and each comparison in it, with the
runtime's own ``gate_mask``: the decisions are the ones the kernels saw.

Use::

    with install(model, plan, tokenizer) as handle, GateTrace(model, handle, plan) as trace:
        model.generate(**inputs, max_new_tokens=20)
    for row in trace.report():       # one entry per batch row
        ...
"""

from __future__ import annotations

import math

from steerc.ir import checked as ck
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


class GateTrace:
    """Records, per batch row, where each gate held and the probe values that decided it (see module doc)."""

    def __init__(self, model, handle, plan, params=None):
        self.plan = rebind(plan, params)
        self.gates = plan_gates(self.plan)
        self.context = handle.context
        self.rows: list[dict] | None = None
        self._hook = model.register_forward_hook(self._after)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self) -> None:
        self._hook.remove()

    def _after(self, module, args, output) -> None:
        ctx = self.context
        if ctx.pos is None:
            return
        real, pos = ctx.real.cpu(), ctx.pos.cpu()
        if self.rows is None or len(self.rows) != real.shape[0]:
            self.rows = [{"seen": [], "held": {}, "masks": {}, "values": {}} for _ in range(real.shape[0])]
        masks = {}
        for g in self.gates:
            masks[g["data"]] = ctx.gate_mask(g["data"]).cpu()
            for scope in g["scopes"].values():
                masks.setdefault(scope, ctx.scope_mask(scope).cpu())
            for leaf in g["leaves"]:
                key = gate_data(leaf)
                masks.setdefault(key, ctx.gate_mask(key).cpu())
        for b, row in enumerate(self.rows):
            at = pos[b][real[b]].tolist()
            row["seen"].extend(at)
            for key, mask in masks.items():
                row["masks"].setdefault(key, []).extend(p for p, m in zip(at, mask[b][real[b]].tolist()) if m)
            for name, values in ctx.values.items():
                row["values"].setdefault(name, []).extend(zip(at, values[b][real[b]].double().cpu().tolist()))
            for name, held in ctx.held.items():
                row["held"][name] = float(held[b])

    def report(self) -> list[dict]:
        """Per batch row: ``{"positions": n, "gates": [...]}``, each gate with its interventions, its
        condition, whether it opened, the positions where it held, the positions each of its interventions
        steered (where the gate held and the scope selects), and per comparison the probe's value
        (pooled: the held value; per token: min, max and the positions where the comparison held)."""
        return [self._row(row) for row in (self.rows or [])]

    def _row(self, row: dict) -> dict:
        gates = []
        for g in self.gates:
            held = sorted(set(row["masks"].get(g["data"], ())))
            comparisons = [self._comparison(leaf, row) for leaf in g["leaves"]]
            pooled = all(self.plan.probe(leaf.probe).pool != "token" for leaf in g["leaves"])
            steered = {name: sorted(set(held) & set(row["masks"].get(scope, ())))
                       for name, scope in g["scopes"].items()}
            gates.append({"interventions": list(g["interventions"]), "gate": g["gate"],
                          "decided": "once per sequence" if pooled else "per position",
                          "opened": bool(held), "positions": held, "steered": steered, "comparisons": comparisons})
        return {"positions": len(set(row["seen"])), "gates": gates}

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
