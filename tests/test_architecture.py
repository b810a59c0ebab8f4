"""spec/architecture.md's layers, held against the code: every import inside steerc (at module level or
inside a function) points down the layers or stays in its own, and no modules import each other in a
circle. Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import os

from support import REPO

PACKAGE = os.path.join(REPO, "steerc")

# spec/architecture.md, "Layers, from the bottom".
LAYERS = {
    "core": 1,
    "diagnostics": 2, "facts": 2, "ir": 2, "constraints": 2,
    "frontend": 3, "io": 3, "highlight": 3,
    "passes": 4,
    "targets": 5, "project": 5, "api": 5, "serve_client": 5, "formats": 5,
    "runtime": 6,
    "derive": 7, "explain": 7, "eval": 7,
    "cli": 8, "lsp": 8,
    "__main__": 9,
}


def _modules() -> dict[str, str]:
    """steerc's modules: dotted name -> path."""
    out = {}
    for top, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(top, name), REPO)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(top, name)
    return out


def _imports(path: str, modules: dict[str, str], me: str) -> set[str]:
    """The steerc modules ``path`` imports (a package's name for ``from steerc.x import y`` when y is no module)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(me.split(".")[:-node.level] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(n for n in names if n in modules and n != me)
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    return 0 if len(parts) == 1 else LAYERS[parts[1]]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules, m) for m, p in modules.items()}


def test_every_folder_has_a_layer():
    assert {m.split(".")[1] for m in _modules() if "." in m} <= set(LAYERS)


def test_imports_point_down_the_layers():
    up = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps
                if _layer(b) > _layer(a) and _layer(a) != 0)
    assert not up, "imports that run up the layers (spec/architecture.md):\n" + "\n".join(up)


def test_no_import_circles():
    graph = _graph()
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # a package's __init__ that hands on its submodules' names is not a circle of meaning
    real = [c for c in circles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not real, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in real)


# The vLLM runtime's own layers (steerc/runtime/vllm/__init__.py): engine access (and the serve plugin's
# artifact store), a worker's share, steering state, the two modes side by side — the vllm target's plan,
# and the serve plugin's request steering and logits guard, its router above them, then serve (which wires
# them) and its HTTP front end —, the loader, the API.
VLLM_LAYERS = {"engine": 1, "store": 1, "parallel": 2,
               "steer": 3, "points": 3, "receipt": 3, "tables": 3, "activations": 3,
               "plan": 4, "request": 4, "guard": 4, "router": 5, "serve": 6, "http": 6,
               "loader": 7, "api": 8}


def test_the_vllm_runtime_imports_down_its_own_layers():
    prefix = "steerc.runtime.vllm."
    graph = _graph()
    assert {m.removeprefix(prefix) for m in graph if m.startswith(prefix)} == set(VLLM_LAYERS)
    wrong = sorted(f"{a} -> {b}" for a, deps in graph.items() if a.startswith(prefix) for b in deps
                   if b.startswith(prefix) and VLLM_LAYERS[b.removeprefix(prefix)] >= VLLM_LAYERS[a.removeprefix(prefix)])
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    found = []
    for me, path in modules.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("steerc") and not node.level:
                found += [f"{me}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)


def test_diagnostic_codes_are_constants_never_strings():
    """A misspelt constant fails at import; a misspelt string would only fail when reported."""
    found = []
    for me, path in _modules().items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("error", "warning", "note") and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "Diagnostic" and node.args and isinstance(node.args[0], ast.Constant)):
                found.append(f"{me}:{node.lineno}: Diagnostic.{node.func.attr}({node.args[0].value!r}, ...)")
    assert not found, "\n".join(found)


def test_the_runtime_bottom_is_the_shared_kernels_then_the_hf_hook_runtime():
    """runtime/kernels.py (what both engines compute per step) imports no steerc module, runtime/hooks.py
    (the HF hook runtime) that one alone, and the vLLM runtime never the HF hook runtime (issue 33's split);
    both are copied into the emitted HF package, which runs without steerc."""
    graph = _graph()
    assert graph["steerc.runtime.kernels"] == set()
    assert graph["steerc.runtime.hooks"] == {"steerc.runtime.kernels"}
    assert not [m for m, deps in graph.items() if m.startswith("steerc.runtime.vllm.") and "steerc.runtime.hooks" in deps]
