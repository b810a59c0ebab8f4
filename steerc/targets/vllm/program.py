"""Lowering a plan to the vLLM buffer normal form: ``boot`` (structure) + tensors (values).

Every number a user can change — vectors, scales, angles, clamp targets,
probe biases, gate thresholds — is a buffer, so a new plan with the same
structure updates a running engine in place.

>>> from steerc.ir import nodes as ir
>>> from steerc.ir.checked import GateCompare
>>> numbered_gate(("cmp", "p", ">", 0.5), [])
['cmp', 'p', '>', 0]
"""

from __future__ import annotations

import numpy as np

from steerc import __version__
from steerc.facts.sites import VLLM_BAND, VLLM_READ_FROM
from steerc.ir.checked import gate_probes  # of a boot section's gate too (runtime.vllm.parallel reads it here)
from steerc.targets.constraints import constraint_json
from steerc.targets.hooks import HookProgram, KernelCall, lower_hooks
from steerc.targets.vllm.wire import FORMAT, boot_sha256, tensor_wire


def numbered_gate(gate, thresholds: list) -> list:
    """A gate with each comparison's threshold replaced by its index in ``thresholds``."""
    kind = gate[0]
    if kind == "cmp":
        thresholds.append(float(gate[3]))
        return ["cmp", gate[1], gate[2], len(thresholds) - 1]
    if kind == "not":
        return ["not", numbered_gate(gate[1], thresholds)]
    return [kind, [numbered_gate(g, thresholds) for g in gate[1]]]


def split_gates(boot: dict, stages) -> str | None:
    """Under pipeline parallelism (``stages``: each stage's first layer), the first gate whose probe runs
    on another stage than the kernel it gates, as a sentence; None if every gate stays on its stage."""
    import bisect

    def stage(layer: int) -> int:
        return bisect.bisect_right(list(stages), layer) - 1

    layers = {p["name"]: p["layer"] for p in boot["probes"]}
    for hook in boot["hooks"]:
        for site in hook["sites"]:
            for k in site["kernels"]:
                for name in gate_probes(boot["gates"][k["gate"]]) if k["gate"] is not None else ():
                    if stage(layers[name]) != stage(hook["layer"]):
                        return (f"probe `{name}` (layer {layers[name]}) runs on pipeline stage "
                                f"{stage(layers[name])}, the kernel it gates at {site['site']} on stage "
                                f"{stage(hook['layer'])}; probe values do not cross stages")
    return None


def _kernel(k: KernelCall, prefix: str, tensors: dict, scopes: list, gates: list, thresholds: list,
            bindings: list, coefficients: dict) -> dict:
    named = dict(k.tensors)
    for role, value in k.numbers:  # every number is a buffer, so a new value needs no new graph
        tensors[f"{prefix}.{role}"] = np.asarray([value], dtype=np.float32)
        named[role] = f"{prefix}.{role}"
    scope = list(map(list, k.scope))
    if scope not in scopes:
        scopes.append(scope)
    gate = None
    if k.gate is not None:
        first = len(thresholds)
        gates.append(numbered_gate(k.gate, thresholds))
        gate = len(gates) - 1
        for j, bound in enumerate(k.gate_params):
            if bound is not None:
                coefficients[first + j] = bound[1]
                bindings.append({"param": bound[0], "buffer": "gates.thresholds", "index": first + j,
                                 "coefficient": "gates.coefficients"})
    for role, param, coefficient in k.bindings:
        buffer = named[role]
        name = f"{buffer}_coefficient"
        tensors[name] = np.asarray(coefficient, dtype=np.float32).reshape(np.shape(tensors[buffer]))
        bindings.append({"param": param, "buffer": buffer, "index": None, "coefficient": name})
    extra = {"schedule": list(k.schedule)} if k.schedule else {}
    return {
        **extra,
        "kind": k.kind,
        "tensors": {role: named[role] for role in sorted(named)},
        "mode": k.mode,
        "scope": scopes.index(scope),
        "gate": gate,
        "preserve_norm": k.preserve_norm,
        "label": k.label,
    }


def build(plan, facts) -> tuple[dict, dict]:
    """(boot, {buffer name: float32 array}) for ``plan`` on ``facts``."""
    program: HookProgram = lower_hooks(plan, facts, "vllm")
    tensors = dict(program.tensors)
    scopes: list = []
    gates: list = []
    thresholds: list = []
    bindings: list = []
    coefficients: dict = {}  # threshold index -> coefficient of its per-request param
    hooks = []
    probes = []
    for h in program.hooks:
        sites = []
        for sc in h.sites:
            probe_rows = []
            for p in sc.probes:
                bias_name = f"{h.name}.probe.{p.name}.bias"
                tensors[bias_name] = np.asarray([p.bias], dtype=np.float32)
                row = {"name": p.name, "kind": p.kind, "pool": p.pool, "tensor": p.tensor, "bias": bias_name}
                if p.kind == "sae_feature":  # its JumpReLU threshold, a buffer as the bias is
                    row["threshold"] = f"{h.name}.probe.{p.name}.threshold"
                    tensors[row["threshold"]] = np.asarray([p.threshold], dtype=np.float32)
                probe_rows.append(row)
                probes.append({"name": p.name, "pool": p.pool, "layer": sc.site.layer, "site": sc.site.text})
            prefix = f"{h.name}.h{sc.site.head}" if sc.site.head is not None else h.name
            kernels = [_kernel(k, f"{prefix}.k{i}", tensors, scopes, gates, thresholds, bindings, coefficients)
                       for i, k in enumerate(sc.kernels)]
            sites.append({"site": sc.site.text, "layer": sc.site.layer, "head": sc.site.head,
                          "columns": list(sc.columns) if sc.columns else None,
                          "probes": probe_rows, "kernels": kernels})
        hooks.append({"name": h.name, "module": h.module, "kind": h.kind, "tensor": h.tensor,
                      "layer": h.sites[0].site.layer, "sites": sites})
    tensors["gates.thresholds"] = np.asarray(thresholds or [0.0], dtype=np.float32)
    if coefficients:
        tensors["gates.coefficients"] = np.asarray([coefficients.get(i, 0.0) for i in range(len(thresholds))],
                                                   dtype=np.float32)
    # per-request params: buffer (or buffer[index]) = coefficient * value (see set_params); the params
    # themselves (defaults, ranges) are values, in the header
    boot = {
        **({"bindings": bindings} if plan.params else {}),
        "hooks": hooks,
        "scopes": scopes,
        "gates": gates,
        "probes": probes,
        "buffers": {name: {"shape": list(np.shape(a)), "dtype": "float32"} for name, a in sorted(tensors.items())},
    }
    return boot, tensors


def plan_document(plan, facts) -> dict:
    boot, tensors = build(plan, facts)
    header = {
        "steerc_version": __version__,
        "source_name": program_name(plan.source_name),
        "source_sha256": plan.source_sha256,
        "facts": {k: v for k, v in facts.to_json().items() if k != "fingerprint"},
        "facts_fingerprint": facts.fingerprint,
        "family": facts.family,
        "vllm": {"read_from": VLLM_READ_FROM, "band": VLLM_BAND},
        "boot_sha256": boot_sha256(boot),
        "constraint": constraint_json(plan.constraint),
    }
    if plan.params:
        header["params"] = [{"name": p.name, "default": p.default, "min": p.low, "max": p.high}
                            for p in plan.params]
    return {
        "format": FORMAT,
        "header": header,
        "boot": boot,
        "state": {"tensors": {name: tensor_wire(a) for name, a in tensors.items()}},
    }


def program_name(path: str) -> str:
    import os

    return os.path.basename(path)


def prefix_cache_safe(boot: dict) -> bool:
    """Whether a token's steering depends only on its own position and prefix (so cached KV stays right).

    Scopes relative to the prompt length, and prompt-pooled probes, make the
    same prefix steer differently in different requests: such plans run with
    prefix caching off.
    """
    pooled = any(p["pool"] != "token" for p in boot["probes"])
    relative = any(item[0] not in ("all", "positions") for scope in boot["scopes"] for item in scope)
    return not (pooled or relative)
