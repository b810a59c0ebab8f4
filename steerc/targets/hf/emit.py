"""``steerc compile --target hf``: a self-contained Python package of hooks.

The package holds ``__init__.py`` (generated: one function per hooked
module, written out kernel by kernel, plus ``install(model, tokenizer=None)``),
``_support.py`` (copied verbatim from :mod:`steerc.runtime.kernels`),
``_hooks.py`` (:mod:`steerc.runtime.hooks`, its one steerc import made the
package's own) and ``tensors.safetensors``. The maths of each kernel kind it uses is written
into ``__init__.py`` from its source in :mod:`steerc.ir.kernels` (the
functions every runtime runs), so the package cannot compute otherwise. It imports torch and safetensors only.

Why not torch.fx: fx would make the compiler import torch and tie the
emitted bytes to the installed torch version's code printer; steerc's
output must be the same bytes for the same input on any machine. The hook
bodies are short chains of calls into ``_support`` (the same calls the
in-process runtime makes, so the two agree exactly), printed here with
readable names and a comment naming the source line of every kernel.

``__init__.py`` is printable ASCII: every value and text in it that the
emitter does not write itself (file names, vector keys, names, op source
text, facts, the command line) goes through :mod:`steerc.targets.hf.pysource`,
as a literal or a one-line comment with its line breaks escaped.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap

from safetensors.numpy import save as save_safetensors

from steerc import __version__
from steerc.facts.families import FAMILIES
from steerc.ir.kernels import KINDS
from steerc.targets.hf.pysource import comment, docstring, identifier, literal
from steerc.targets.hooks import HookCode, HookProgram, KernelCall, SiteCode

SUPPORT = os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "kernels.py")
HOOKS = os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "hooks.py")
# The one line of runtime/hooks.py that names steerc, and what the package's copy says instead.
HOOKS_IMPORT = (b"from steerc.runtime import kernels as S  # steerc:support (the emitted package's "
                b"`from . import _support as S`)\n", b"from . import _support as S\n")
PARAMS = os.path.join(os.path.dirname(__file__), "..", "..", "ir", "param_values.py")


class _Names:
    """Unique constant names for scopes and gates, in first-use order."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.items: dict[tuple, str] = {}

    def __call__(self, value) -> str:
        if value not in self.items:
            self.items[value] = f"{self.prefix}_{len(self.items)}"
        return self.items[value]


class _Bound:
    """The program's per-request operands and bound gates, as the emitted ``install(params=...)`` binds
    them (``_support.bind``, ``_params.bound_gate``): rows ``(slot, param, coefficient, shape)``, coefficient
    tensors to store, and per bound gate its constant and ``(param, coefficient)`` or None per comparison."""

    def __init__(self, tensors: dict):
        self.tensors = tensors  # the program's tensors (read for shapes)
        self.rows: list[tuple] = []
        self.coefficients: dict = {}
        self.gates: dict[tuple, str] = {}  # (gate data, gate params) -> constant name
        self.scalars = 0

    def scalar(self, param: str, coefficient: float) -> str:
        slot = f"B_{self.scalars}"
        self.scalars += 1
        self.rows.append((slot, param, float(coefficient), None))
        return f"ctx.bound[{literal(slot)}]"

    def tensor(self, slot: str, param: str, coefficient, v: str) -> str:
        import numpy as np

        if isinstance(coefficient, float):
            self.rows.append((slot, param, coefficient, tuple(self.tensors[slot].shape)))
        else:
            name = f"{slot}.coefficient"
            self.coefficients[name] = np.ascontiguousarray(coefficient, dtype=np.float32).reshape(
                self.tensors[slot].shape)
            self.rows.append((slot, param, name, None))
        return f"ctx.bound_tensors.get({literal(slot)}, {v})"

    def gate(self, k: KernelCall) -> str:
        key = (k.gate, k.gate_params)
        if key not in self.gates:
            self.gates[key] = f"BOUND_GATE_{len(self.gates)}"
        return f"ctx.bound[{literal(self.gates[key])}]"


def _scope_comment(scope: tuple) -> str:
    parts = []
    for item in scope:
        kind = item[0]
        if kind == "all":
            parts.append("all")
        elif kind in ("prompt", "generated"):
            a, b = item[1], item[2]
            parts.append(kind if a is None and b is None else f"{kind}[{'' if a is None else a}:{'' if b is None else b}]")
        elif kind == "positions":
            parts.append(str(list(item[1])))
        else:
            parts.append(f"after {json.dumps(item[1])}")
    return ", ".join(parts)


def _tensor(name: str | None, like: str) -> str:
    return "None" if name is None else f"_T.get({literal(name)}, {like})"


def _kernel_lines(k: KernelCall, scopes: _Names, gates: _Names, bound: _Bound, v: str) -> list[str]:
    """One kernel: its mask, then ``S.steer`` with its kind's maths (``_kernels.py``) and its operands, in the
    order its kind declares them (a per-request operand reads its bound slot)."""
    roles = {role: (param, coefficient) for role, param, coefficient in k.bindings}
    lines = [comment(k.label)]
    lines.append(f"m = ctx.scope_mask({scopes(k.scope)})")
    if k.gate is not None:
        gate = bound.gate(k) if any(b is not None for b in k.gate_params) else gates(k.gate)
        lines.append(f"m = m & ctx.gate_mask({gate})")
    operands = []
    for o in KINDS[k.kind].operands:
        name, number = k.tensor(o.role), k.number(o.role)
        if name is not None:
            value = bound.tensor(name, *roles[o.role], v) if o.role in roles else _tensor(name, v)
        elif number is not None:
            value = bound.scalar(*roles[o.role]) if o.role in roles else literal(number)
        else:
            continue
        operands.append(f"{literal(o.role)}: {value}")
    if k.schedule:
        lines.append(f"f = S.schedule_factor({literal(k.schedule)}, {_tensor(k.tensor('schedule'), v)}, "
                     "ctx.pos, ctx.plen)")
        operands.append(f"{literal('factor')}: f")
    lines.append(f"{v} = S.steer({identifier(_maths_name(k.kind))}, {v}, {{{', '.join(operands)}}}, "
                 f"{literal(k.mode)}, m, {literal(k.preserve_norm)})")
    return lines


def _maths_name(kind: str) -> str:
    return f"kernel_{KINDS[kind].maths.__name__}"


def render_kernels(kinds) -> list[str]:
    """The maths of each kernel kind the hooks use, written into ``__init__.py`` from its source in
    :mod:`steerc.ir.kernels` (the function every runtime runs, renamed ``kernel_<name>``), so the package
    cannot compute otherwise. Source that is not a plain ASCII function is refused."""
    out, seen = [], {}
    for kind in sorted(kinds):
        fn = KINDS[kind].maths
        name = _maths_name(kind)
        if seen.setdefault(name, kind) != kind:
            raise ValueError(f"kernel kinds {seen[name]!r} and {kind!r} both name their maths {fn.__name__!r}")
        source = textwrap.dedent(inspect.getsource(fn)).rstrip("\n")
        head = f"def {fn.__name__}("
        if not source.startswith(head) or not source.isascii():
            raise ValueError(f"the maths of kernel kind {kind!r} is not a plain ASCII function (def ...)")
        out.append(comment(f"kernel kind {kind}: {fn.__module__}.{fn.__name__}"))
        out.append(f"def {name}(" + source[len(head):])
        out.append("")
        out.append("")
    return out


def _site_lines(site: SiteCode, scopes: _Names, gates: _Names, bound: _Bound) -> list[str]:
    # Head sites work on their columns (`part`) of the hooked tensor; others on all of it (`x`).
    lines = []
    v = "x"
    if site.columns is not None:
        lo, hi = site.columns
        v = "part"
        lines.append(comment(f"{site.site.text}: columns {lo}:{hi}"))
        lines.append(f"part = x[..., {literal(lo)}:{literal(hi)}]")
    for p in site.probes:
        lines.append(comment(f"probe {p.name}: {p.kind}, pool {p.pool}"))
        threshold = f", {literal(p.threshold)}" if p.kind == "sae_feature" else ""
        lines.append(f"ctx.record_probe({literal(p.name)}, {literal(p.pool)}, {literal(p.kind)}, {v}, "
                     f"{_tensor(p.tensor, v)}, {literal(p.bias)}{threshold})")
    for k in site.kernels:
        lines.extend(_kernel_lines(k, scopes, gates, bound, v))
    if site.columns is not None:
        lines.append(f"x[..., {literal(site.columns[0])}:{literal(site.columns[1])}] = part")
    return lines


def _hook_function(hook: HookCode, scopes: _Names, gates: _Names, bound: _Bound) -> str:
    has_heads = any(s.columns is not None for s in hook.sites)
    sites = ", ".join(s.site.text for s in hook.sites)
    body = [docstring([f"{hook.kind}-hook on {hook.module} ({hook.tensor}): {sites}."]),
            f"x = h.to(S.compute_dtype(h.dtype), copy={literal(has_heads)})"]
    for site in hook.sites:
        body.extend(_site_lines(site, scopes, gates, bound))
    body.append("return x.to(h.dtype)")
    return f"def {identifier(hook.name)}(h, ctx):\n" + "\n".join("    " + line for line in body) + "\n"


def render_init(program: HookProgram, command: str, bound: _Bound) -> str:
    """``__init__.py``; ``bound`` collects the per-request operands and their coefficient tensors."""
    scopes, gates = _Names("SCOPE"), _Names("GATE")
    functions = [_hook_function(h, scopes, gates, bound) for h in program.hooks]
    facts = program.facts
    model_types = FAMILIES[facts["family"]].model_types
    doc = [
        f"Steering hooks for a {facts['family']} model, generated by steerc {__version__}.",
        "",
        f"Source: {program.source_name} (sha256 {program.source_sha256})",
        f"Model: {facts['family']}, {facts['layers']} layers, hidden {facts['hidden']} "
        f"(facts fingerprint {program.fingerprint})",
        f"Made by: {command}",
        "",
        "Use: handle = install(model, tokenizer); ...; handle.remove()  (or `with install(model):`).",
        *(["Per-request params: install(model, tokenizer, params={...}) (the others keep their compiled values)."]
          if program.params else []),
        "Generated code: recompile the .steer file instead of editing it.",
    ]
    out = [
        docstring(doc),
        "",
        "import os",
        "",
        "from safetensors.torch import load_file",
        "",
        *(["from . import _params as P"] if program.params else []),
        "from . import _hooks as H",
        "from . import _support as S",
        "",
        f"SOURCE_SHA256 = {literal(program.source_sha256)}",
        f"FINGERPRINT = {literal(program.fingerprint)}",
        "FACTS = " + literal({k: facts[k] for k in sorted(facts) if k != "fingerprint"}),
        f"MODEL_TYPES = {literal(tuple(model_types))}",
        f"BASE_MODEL = {literal(program.base_path)}",
        f"AFTER_TEXTS = {literal(tuple(program.after_texts))}",
        f"CONSTRAINT = {literal(program.constraint_data)}  # (kind, value) for xgrammar, imported only when set",
        "",
        '_T = S.Tensors(load_file(os.path.join(os.path.dirname(__file__), "tensors.safetensors")))',
        "",
    ]
    if scopes.items:
        out.append("# Token scopes (see _support.Context.scope_mask).")
        out.extend(f"{name} = {literal(value)}  {comment('tokens ' + _scope_comment(value))}"
                   for value, name in scopes.items.items())
        out.append("")
    if gates.items:
        out.append("# Gates (see _support.Context.gate_mask).")
        out.extend(f"{name} = {literal(value)}" for value, name in gates.items.items())
        out.append("")
    if program.params:
        out.extend(_params_lines(program, bound))
    out.append("")
    kinds = {k.kind for h in program.hooks for s in h.sites for k in s.kernels}
    if kinds:
        out.append("# Kernels: the maths of each kind, as steerc.ir.kernels writes it (S.steer runs them).")
        out.append("")
        out.extend(render_kernels(kinds))
    out.append("\n\n".join(functions))
    out.append("")
    out.append("HOOKS = (")
    out.extend(f"    ({literal(h.module)}, {literal(h.kind)}, {literal(h.tensor)}, {identifier(h.name)}),"
               for h in program.hooks)
    out.append(")")
    out.append("")
    out.append("")
    out.append(_INSTALL_WITH_PARAMS if program.params else _INSTALL)
    return "\n".join(out)


def _params_lines(program: HookProgram, bound: _Bound) -> list[str]:
    out = ["# Per-request params: name, default (the compiled value), range (see _params.check_values).",
           "PARAMS = ("]
    out.extend(f"    P.Declared({literal(p.name)}, {literal(p.default)}, {literal(p.low)}, {literal(p.high)}),"
               for p in program.params)
    out += [")", "# (param, largest |coefficient| of an operand it scales): a value past float32 is refused.",
            "LARGEST = " + literal(tuple(program.coefficient_bounds)),
            "# Bound operands: slot, param, coefficient (a number, or its stored tensor), shape of a tensor slot.",
            "BOUND = ("]
    out.extend(f"    {literal(tuple(row))}," for row in bound.rows)
    out += [")", ("# Gates with bound thresholds: the gate at the compiled values, and per comparison (param, "
                  "coefficient) or None."), "BOUND_GATES = ("]
    out.extend(f"    ({literal(name)}, {literal(gate)}, {literal(params)}),"
               for (gate, params), name in bound.gates.items())
    out += [")", ""]
    return out


_INSTALL_BODY = '''    if check:
        H.check_facts(model, FACTS, MODEL_TYPES)
    if (AFTER_TEXTS or CONSTRAINT) and tokenizer is None:
        raise ValueError("this steering needs the tokenizer (a scope after a text, or an output constraint)")
    constraint = H.constraint_factory(tokenizer, model.config.vocab_size, CONSTRAINT) if CONSTRAINT else None
    ctx = H.Context(tokenizer, AFTER_TEXTS, constraint)
'''
_INSTALL_DOC = '''    """Install the steering on ``model``; returns a handle with ``remove()`` (also a context manager).

    ``tokenizer`` is needed when a scope uses `after "..."` or the output is
    constrained (then ``model.generate`` is constrained too). ``check`` refuses
    a model whose layout differs from the one these hooks were compiled for.
'''
_INSTALL = ("def install(model, tokenizer=None, check=True):\n" + _INSTALL_DOC + '    """\n' + _INSTALL_BODY
            + '    return H.install(model, BASE_MODEL, HOOKS, ctx, family=FACTS["family"])\n')
_INSTALL_WITH_PARAMS = (
    "def install(model, tokenizer=None, check=True, params=None):\n" + _INSTALL_DOC + '''
    ``params`` gives values to the per-request params (the same kernels as a
    program compiled with ``--set`` to those values); a name not declared, or
    a value that is not a number in the declared range, raises
    ``_params.ParamError`` (a ValueError) naming the param.
    """
    values = P.check_values(PARAMS, params, LARGEST)
''' + _INSTALL_BODY + '''    ctx.bound, ctx.bound_tensors = S.bind(_T, BOUND, values)
    ctx.bound.update((name, P.bound_gate(gate, bound, values)) for name, gate, bound in BOUND_GATES)
    return H.install(model, BASE_MODEL, HOOKS, ctx, family=FACTS["family"])
''')


def emit(program: HookProgram, out_dir: str, command: str) -> list[str]:
    """Write the package; returns the files written (relative to ``out_dir``)."""
    os.makedirs(out_dir, exist_ok=True)
    bound = _Bound(program.tensors)
    init = render_init(program, command, bound)
    tensors = {**program.tensors, **bound.coefficients}
    blobs = {
        "__init__.py": init.encode("ascii"),
        "_support.py": _read(SUPPORT),
        "_hooks.py": hooks_source(),
        "tensors.safetensors": save_safetensors({k: tensors[k] for k in sorted(tensors)}),
    }
    if program.params:
        blobs["_params.py"] = _read(PARAMS)
    for name, data in blobs.items():
        tmp = os.path.join(out_dir, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(out_dir, name))
    return sorted(blobs)


def hooks_source() -> bytes:
    """``_hooks.py``: :mod:`steerc.runtime.hooks` with its one steerc import made the package's own."""
    data = _read(HOOKS)
    old, new = HOOKS_IMPORT
    if data.count(old) != 1:
        raise RuntimeError("steerc/runtime/hooks.py must import the support module exactly as HOOKS_IMPORT says")
    return data.replace(old, new)


def import_package(folder: str, name: str):
    """Import the package written to ``folder`` under the module name ``name`` (the export target installs
    it on the model it exports; the tests import packages this way)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # the folder keeps only what compile wrote
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()
