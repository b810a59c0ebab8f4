"""A plan grouped by the module hooks that realise it, as data: the shared lowering of hook targets.

For the ``hf`` backend, both the emitter (:mod:`steerc.targets.hf.emit`,
which writes Python) and the in-process runtime (:mod:`steerc.runtime.hf`,
which interprets) start from the same :class:`HookProgram` and compute with
:mod:`steerc.runtime.kernels`, so their outputs are identical. The ``vllm``
backend (:mod:`steerc.targets.vllm`) serialises the same structure, with
vLLM's module names, into ``plan.msgpack``.

>>> from steerc.ir import nodes as ir
>>> scope_data((ir.ScopePrompt(ir.PosSlice(-3, None)), ir.ScopeGenerated()))
(('prompt', -3, None), ('generated', None, None))
"""

from __future__ import annotations

import os

import numpy as np

from steerc.core.jsonio import canonical
from steerc.core.record import field, frozen
from steerc.diagnostics import Refusal
from steerc.facts.sites import site_table
from steerc.ir import checked as ck
from steerc.ir import nodes as ir
from steerc.ir.kernels import Kind, kind_of
from steerc.ir.plan import Plan, Site, coefficient_bounds
from steerc.passes.lower_plan import STACKED_READOUTS
from steerc.targets.seat import kernel_refusal


def scope_item(s) -> tuple:
    if isinstance(s, ir.ScopeAll):
        return ("all",)
    if isinstance(s, (ir.ScopePrompt, ir.ScopeGenerated)):
        kind = "prompt" if isinstance(s, ir.ScopePrompt) else "generated"
        if s.sel is None:
            return (kind, None, None)
        if isinstance(s.sel, ir.PosIndex):
            i = s.sel.index
            return (kind, i, None if i == -1 else i + 1)
        return (kind, s.sel.start, s.sel.stop)
    if isinstance(s, ir.ScopePositions):
        return ("positions", tuple(s.positions))
    return ("after", s.text.value)


def scope_data(scopes) -> tuple:
    return tuple(scope_item(s) for s in scopes)


def gate_params(g) -> tuple:
    """(param, coefficient) or None per comparison of a gate, depth first (the order of gate_data)."""
    if g is None:
        return ()
    if isinstance(g, ck.GateCompare):
        return ((g.param, float(g.coefficient)) if g.param is not None else None,)
    if isinstance(g, ck.GateNegate):
        return gate_params(g.operand)
    return tuple(x for p in g.parts for x in gate_params(p))


def gate_data(g) -> tuple | None:
    if g is None:
        return None
    if isinstance(g, ck.GateCompare):
        return ("cmp", g.probe, g.op, float(g.threshold))
    if isinstance(g, ck.GateNegate):
        return ("not", gate_data(g.operand))
    return ("and" if isinstance(g, ck.GateAll) else "or", tuple(gate_data(p) for p in g.parts))


@frozen
class KernelCall:
    kind: str  # a kernel kind's name (steerc.ir.kernels.KINDS)
    tensors: tuple[tuple[str, str], ...]  # (role, tensor name) in the order the kind gives them, then schedule
    numbers: tuple[tuple[str, float], ...]  # (role, value) of the operands that are plain numbers, sorted by role
    mode: str | None  # the kind's variant (a rotation's to or by), else None
    scope: tuple
    gate: tuple | None
    preserve_norm: bool
    label: str  # "name (file:line): op text"
    schedule: tuple[str, ...] = ()  # a scheduled kernel's factor kinds; their numbers: tensor "schedule" [m, 2]
    # per-request params: (role, param, coefficient: float or float32 array) of the op's operands, and
    # (param, coefficient) or None for each comparison of the gate, in the order gate_data lists them
    bindings: tuple = field(default=(), eq=False)
    gate_params: tuple = ()

    def tensor(self, role: str) -> str | None:
        return dict(self.tensors).get(role)

    def number(self, role: str) -> float | None:
        return dict(self.numbers).get(role)


@frozen
class ProbeCall:
    name: str
    kind: str
    tensor: str | None  # a vector, or [k, d]: a basis for projected_cosine, [W_enc[:, i], b_dec] for sae_feature
    bias: float
    pool: str
    threshold: float = 0.0  # sae_feature's


@frozen
class SiteCode:
    site: Site
    columns: tuple[int, int] | None  # head slice of the hooked tensor
    probes: tuple[ProbeCall, ...]
    kernels: tuple[KernelCall, ...]


@frozen
class HookCode:
    name: str  # a Python identifier, unique in the program
    module: str
    kind: str  # pre | post
    tensor: str
    sites: tuple[SiteCode, ...]


@frozen(eq=False)
class HookProgram:
    hooks: tuple[HookCode, ...]
    tensors: dict  # name -> float32 numpy array
    base_path: str
    after_texts: tuple[str, ...]
    facts: dict
    fingerprint: str
    source_name: str
    source_sha256: str
    constraint: object = None  # steerc.ir.checked.Constraint
    params: tuple = ()  # steerc.ir.plan.Param: the per-request params, at their compiled values
    coefficient_bounds: tuple = ()  # (param, largest |coefficient|) pairs: steerc.ir.plan.coefficient_bounds

    @property
    def constraint_data(self) -> tuple | None:
        """(kind, value) with a schema as compact JSON text: what _support.constraint_factory takes."""
        c = self.constraint
        if c is None:
            return None
        if c.kind == "json_schema":
            return ("json_schema", canonical(c.value))
        return (c.kind, tuple(c.value) if c.kind == "choice" else c.value)


def _base_path(layers_path: str) -> str:
    return layers_path.rsplit(".", 1)[0]


def runs_on_hooks(kind: Kind) -> bool:
    """Whether the hook engines (the HF runtime and package, the vLLM buffers, the serve plugin, export) run
    a kind: every kind with its torch maths does, through the one dispatch (``kind.maths``)."""
    return callable(kind.maths)


def unlowerable(kernel, backend: str) -> Refusal:
    """A plan kernel these hooks have no lowering for, as ``unsupported-by-target`` at the intervention that
    made it (never an assertion: the target's kernel kinds refuse it first, this is the backstop)."""
    return Refusal([kernel_refusal(kernel, f"{backend} hooks", "steerc lowers no such kernel for this engine")])


def _kernel_call(kernel, prefix: str, tensors: dict, backend: str = "hf") -> KernelCall:
    op = kernel.op
    named = []

    def put(role, array):
        name = f"{prefix}.{role}"
        tensors[name] = np.ascontiguousarray(array, dtype=np.float32)
        named.append((role, name))

    kind = kind_of(op)
    if kind is None or not runs_on_hooks(kind):
        raise unlowerable(kernel, backend)
    numbers = []
    for role, value in kind.operands_of(op):
        if isinstance(value, float):
            numbers.append((role, value))
        else:
            put(role, value)
    schedule = getattr(op, "schedule", ())
    if schedule:
        put("schedule", np.asarray([[a, b] for _, a, b in schedule], dtype=np.float64))
    label = "; ".join(
        f"{p.intervention} ({os.path.basename(p.span.file)}:{p.span.line}): {p.note}" if p.span
        else f"{p.intervention}: {p.note}"
        for p in kernel.provenance
    )
    bindings = tuple((b.role, b.param, b.coefficient if isinstance(b.coefficient, float)
                      else np.ascontiguousarray(b.coefficient.array, dtype=np.float32)) for b in kernel.bindings)
    return KernelCall(kind.name, tuple(named), tuple(sorted(numbers)), kind.mode_of(op),
                      scope_data(kernel.scope), gate_data(kernel.gate), kernel.preserve_norm, label,
                      tuple(k for k, _, _ in schedule), bindings, gate_params(kernel.gate))


def _probe_call(p, prefix: str, tensors: dict) -> ProbeCall:
    name = None
    if p.vectors:
        name = f"{prefix}.{p.name}"
        arr = np.stack([v.array for v in p.vectors])
        tensors[name] = arr if p.kind in STACKED_READOUTS else arr[0]
    return ProbeCall(p.name, p.kind, name, float(p.bias), p.pool, float(p.threshold))


def _hook_name(site: Site) -> str:
    return f"heads_{site.layer}" if site.kind == "head" else f"{site.kind}_{site.layer}"


def lower_hf(plan: Plan, facts, table=None) -> HookProgram:
    """The hooks of ``plan`` for a transformers model (``table``: a confirmed site table of a facts file, for
    a family steerc has none for)."""
    return lower_hooks(plan, facts, "hf", table)


def lower_hooks(plan: Plan, facts, backend: str, table=None) -> HookProgram:
    """Group the plan's sites (and probe sites) by the module hook that realises them."""
    table = table if table is not None else site_table(facts.family, backend)
    by_site = {sp.site: sp.kernels for sp in plan.sites}
    probe_sites = {p.site for p in plan.probes}
    all_sites = sorted(set(by_site) | probe_sites, key=lambda s: s.order)
    tensors: dict = {}
    grouped: dict[tuple, list[SiteCode]] = {}
    names: dict[tuple, str] = {}
    for site in all_sites:
        hook = table.hook(site.kind, site.layer)
        key = (hook.module, hook.kind, hook.tensor)
        hook_name = names.setdefault(key, _hook_name(site))
        prefix = f"{hook_name}.h{site.head}" if site.head is not None else hook_name
        columns = None
        if site.head is not None:
            columns = (site.head * facts.head_dim, (site.head + 1) * facts.head_dim)
        probes = tuple(_probe_call(p, f"{prefix}.probe", tensors) for p in plan.probes if p.site == site)
        kernels = tuple(_kernel_call(k, f"{prefix}.k{i}", tensors, backend)
                        for i, k in enumerate(by_site.get(site, ())))
        grouped.setdefault(key, []).append(SiteCode(site, columns, probes, kernels))
    hooks = tuple(
        HookCode(names[key], key[0], key[1], key[2], tuple(sites)) for key, sites in grouped.items()
    )
    after = tuple(sorted({item[1] for h in hooks for s in h.sites for k in s.kernels
                          for item in k.scope if item[0] == "after"}))
    return HookProgram(
        hooks=hooks,
        tensors=tensors,
        base_path=_base_path(table.layers),
        after_texts=after,
        facts=facts.to_json(),
        fingerprint=facts.fingerprint,
        source_name=os.path.basename(plan.source_name),
        source_sha256=plan.source_sha256,
        constraint=plan.constraint,
        params=tuple(plan.params),
        coefficient_bounds=tuple(sorted(set(coefficient_bounds(plan)))),
    )
