"""One gate evaluator and one probe reader for every runtime (issue 33).

The gate evaluator (``evaluate_gate``) and the probe readouts (``readout``) are written once, in
``steerc/runtime/kernels.py`` (the emitted HF package's ``_support.py``): the HF context, the emitted
package, the vLLM buffers and a vLLM request's receipt call them, each supplying only its own probe values
and thresholds. Before, the evaluator was written three times (kernels.py, vllm/steer.py, vllm/receipt.py),
free to drift. Checked here:

* by reading the source (``ast``): no other module of the runtimes or targets evaluates a gate or reads a
  probe, and each runtime's ``gate_mask`` hands its values to the shared evaluator;
* by property: on random gates and probe values (per token and pooled, NaN where undecided, thresholds on
  the values), the shared evaluator — called directly, through the HF context, through the vLLM buffers
  and through a receipt's view of them — decides what the independent reference (``steerc.ir.interpret``,
  numpy float64 over checked gates) decides.
"""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest
from fuzzing import RAN, fuzz
from hypothesis import given
from hypothesis import strategies as st
from support import REPO

from steerc.ir import checked as ck
from steerc.ir.interpret import gate_holds
from steerc.targets.hooks import gate_data
from steerc.targets.vllm.program import numbered_gate

torch = pytest.importorskip("torch")

from steerc.runtime import hooks as H  # noqa: E402  (after the importorskip)
from steerc.runtime import kernels as S  # noqa: E402
from steerc.runtime.vllm.receipt import _StateView  # noqa: E402
from steerc.runtime.vllm.steer import SteerState  # noqa: E402

SHARED = os.path.join("steerc", "runtime", "kernels.py")
READOUT_KINDS = {"cosine", "projected_cosine", "subspace_cosine", "dot", "norm"}


# ------------------------------------------------------------------ the source


def _modules() -> dict[str, ast.Module]:
    """The runtimes' and targets' modules (relative path -> tree)."""
    out = {}
    for folder in ("runtime", "targets"):
        for top, dirs, files in os.walk(os.path.join(REPO, "steerc", folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8") as fh:
                    out[os.path.relpath(path, REPO)] = ast.parse(fh.read())
    return out


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _constants_compared(fn) -> set:
    """The constants ``fn`` compares something with (``kind == "cmp"``, ``kind in ("and", "or")``)."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                for leaf in ast.walk(side):
                    if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                        out.add(leaf.value)
    return out


def _calls(fn, name: str) -> bool:
    return any(isinstance(n, ast.Call) and ((isinstance(n.func, ast.Name) and n.func.id == name)
                                            or (isinstance(n.func, ast.Attribute) and n.func.attr == name))
               for n in ast.walk(fn))


def is_gate_evaluator(fn) -> bool:
    """A function that decides a gate itself: it compares probe values with thresholds (calls ``compare``),
    or walks a gate's kinds (``"cmp"``) and combines masks with ``&``, ``|`` or ``~``."""
    if _calls(fn, "compare"):
        return True
    combines = any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.BitAnd, ast.BitOr))
                   or isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Invert) for n in ast.walk(fn))
    return "cmp" in _constants_compared(fn) and combines


def is_probe_reader(fn) -> bool:
    """A function that computes readouts itself: it branches on the readout kinds and multiplies hidden
    states with the probe's vectors (``@``). A lowering that only translates the kinds (vLLM-Hook's) is not."""
    matmul = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in ast.walk(fn))
    return len(_constants_compared(fn) & READOUT_KINDS) >= 2 and matmul


# The vLLM runtime's evaluator as it was (issue 33), for the detector's own check.
BEFORE = '''
def gate_mask(self, gate, n: int):
    kind = gate[0]
    if kind == "cmp":
        threshold = self.buffer("gates.thresholds")[gate[3]]
        return S.compare(self.probe_value(gate[1], n), gate[2], threshold)
    if kind == "not":
        return ~self.gate_mask(gate[1], n)
    parts = [self.gate_mask(g, n) for g in gate[1]]
    out = parts[0]
    for p in parts[1:]:
        out = (out & p) if kind == "and" else (out | p)
    return out
'''


def test_the_detectors_find_an_evaluator_and_a_reader_written_again():
    (before,) = _functions(ast.parse(BEFORE))
    assert is_gate_evaluator(before)
    (reader,) = [f for f in _functions(_modules()[SHARED]) if f.name == "readout"]
    assert is_probe_reader(reader)


def test_no_module_but_the_shared_one_evaluates_a_gate_or_reads_a_probe():
    """Before issue 33, vllm/steer.py and vllm/receipt.py each held their own copy of the evaluator."""
    evaluators, readers = [], []
    for path, tree in _modules().items():
        for fn in _functions(tree):
            if is_gate_evaluator(fn):
                evaluators.append(f"{path}:{fn.lineno} {fn.name}")
            if is_probe_reader(fn):
                readers.append(f"{path}:{fn.lineno} {fn.name}")
    # and, in the same module, their batched forms for tables (the serve plugin's: an operator per row)
    assert evaluators == [f"{SHARED}:{_line('compare_rows')} compare_rows",
                          f"{SHARED}:{_line('evaluate_gate')} evaluate_gate"]
    assert readers == [f"{SHARED}:{_line('readout')} readout", f"{SHARED}:{_line('readout_row')} readout_row"]


def _line(name: str) -> int:
    (fn,) = [f for f in _functions(_modules()[SHARED]) if f.name == name]
    return fn.lineno


@pytest.mark.parametrize("path", [os.path.join("steerc", "runtime", "hooks.py"),
                                  os.path.join("steerc", "runtime", "vllm", "steer.py"),
                                  os.path.join("steerc", "runtime", "vllm", "receipt.py")])
def test_each_runtime_hands_its_values_to_the_shared_evaluator(path):
    (fn,) = [f for f in _functions(_modules()[path]) if f.name == "gate_mask"]
    assert _calls(fn, "evaluate_gate")


def test_the_shared_module_imports_torch_alone():
    """kernels.py is the emitted package's ``_support.py``: it must import where steerc is not installed."""
    imported = set()
    for node in ast.walk(_modules()[SHARED]):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add((node.module or "").split(".")[0])
    assert "steerc" not in imported
    assert imported <= {"__future__", "contextlib", "inspect", "math", "json", "torch", "transformers", "xgrammar"}


def test_the_hook_runtime_imports_torch_and_the_shared_module_alone():
    """hooks.py is the emitted package's ``_hooks.py``: its one steerc import is the shared module, which the
    emitter rewrites to the package's ``_support`` (the HF hook runtime split from the shared maths, issue 33)."""
    from steerc.targets.hf.emit import hooks_source

    tree = _modules()[os.path.join("steerc", "runtime", "hooks.py")]
    top = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            top.add((node.module or "").split(".")[0])
    assert top <= {"__future__", "contextlib", "inspect", "math", "json", "torch", "transformers", "xgrammar",
                   "steerc"}
    named = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.module or "").startswith("steerc")]
    assert named == ["from steerc.runtime import kernels as S"]
    package = hooks_source()
    assert b"from steerc" not in package and b"import steerc" not in package
    assert b"from . import _support as S  # steerc:support" not in package
    assert b"\nfrom . import _support as S\n" in package


# ------------------------------------------------------------------ the semantics

PROBES = {"t1": "token", "t2": "token", "m": "prompt.mean", "l": "prompt.last"}
OPS = ("<", "<=", ">", ">=")
# Thresholds and values from one small float32-exact set, so comparisons land on equality too.
NUMBERS = (-1.0, -0.5, 0.0, 0.25, 0.5, 1.0)
ROWS, TOKENS = 2, 5

leaves = st.builds(ck.GateCompare, st.sampled_from(sorted(PROBES)), st.sampled_from(OPS), st.sampled_from(NUMBERS))
gates = st.recursive(leaves, lambda inner: st.one_of(
    st.builds(ck.GateNegate, inner),
    st.lists(inner, min_size=2, max_size=3).map(lambda ps: ck.GateAll(tuple(ps))),
    st.lists(inner, min_size=2, max_size=3).map(lambda ps: ck.GateAny(tuple(ps))),
), max_leaves=6)
numbers = st.one_of(st.sampled_from(NUMBERS), st.just(float("nan")),
                    st.floats(-2.0, 2.0, width=32, allow_nan=False))


@st.composite
def probe_values(draw, rows: int = ROWS):
    """Each probe's values, [rows, tokens] float32: per position for a token probe, one value per row spread
    over its positions for a pooled one (NaN: not decided yet)."""
    out = {}
    for name, pool in PROBES.items():
        if pool == "token":
            flat = draw(st.lists(numbers, min_size=rows * TOKENS, max_size=rows * TOKENS))
            out[name] = np.asarray(flat, dtype=np.float32).reshape(rows, TOKENS)
        else:
            per_row = np.asarray(draw(st.lists(numbers, min_size=rows, max_size=rows)), dtype=np.float32)
            out[name] = np.repeat(per_row[:, None], TOKENS, axis=1)
    return out


def _shared(gate, values):
    return S.evaluate_gate(gate_data(gate), lambda name: torch.from_numpy(values[name])).numpy()


def _hf_context(gate, values):
    """Through the HF runtime's (and the emitted package's) context: per-token values this forward, pooled
    values held per row."""
    ctx = H.Context()
    ctx.pos = torch.zeros(ROWS, TOKENS, dtype=torch.long)
    ctx.values = {n: torch.from_numpy(v) for n, v in values.items() if PROBES[n] == "token"}
    ctx.held = {n: torch.from_numpy(v[:, 0].copy()) for n, v in values.items() if PROBES[n] != "token"}
    return ctx.gate_mask(gate_data(gate)).numpy()


def _vllm_state(values, thresholds, rows: int):
    """A vLLM SteerState (CPU, float32) holding ``values``: rows x tokens flattened, row i in slot i."""
    boot = {"hooks": [], "probes": [{"name": n, "pool": p} for n, p in PROBES.items()]}
    n = rows * TOKENS
    state = SteerState(boot, {"gates.thresholds": thresholds}, max_tokens=n, max_slots=rows + 1, width=4,
                       dtype=torch.float32, device="cpu")
    slots = [i for i in range(rows) for _ in range(TOKENS)]
    state.write_metadata(list(range(TOKENS)) * rows, [TOKENS] * n, slots, [True] * n)
    for name, v in values.items():
        if PROBES[name] == "token":
            getattr(state, f"tok_{name}")[:n].copy_(torch.from_numpy(v.reshape(-1)))
        else:
            getattr(state, f"held_{name}")[:rows].copy_(torch.from_numpy(v[:, 0].copy()))
    return state


def _vllm(gate, values):
    """Through the vLLM buffers: the boot's gate (thresholds numbered into the thresholds buffer)."""
    thresholds: list = []
    boot_gate = numbered_gate(gate_data(gate), thresholds)
    state = _vllm_state(values, thresholds or [0.0], ROWS)
    return state.gate_mask(boot_gate, ROWS * TOKENS).numpy().reshape(ROWS, TOKENS)


def _receipt(gate, values):
    """Through a receipt's view of one request's buffers (row 0, slot 0)."""
    one = {name: v[:1] for name, v in values.items()}
    state = _vllm_state(one, [0.0], 1)
    view = _StateView(state, list(range(TOKENS)), [TOKENS] * TOKENS)
    return view.gate_mask(gate_data(gate)).numpy()


@fuzz(150, "one gate")
@given(gate=gates, values=probe_values())
def test_every_runtime_decides_a_gate_as_the_reference_does(gate, values):
    RAN["one gate"] += 1
    expected = gate_holds(gate, {name: v.astype(np.float64) for name, v in values.items()})
    assert expected.shape == (ROWS, TOKENS)
    for how in (_shared, _hf_context, _vllm):
        got = how(gate, values)
        assert got.dtype == np.bool_ and np.array_equal(got, expected), (how.__name__, got, expected)
    got = _receipt(gate, values)
    assert got.shape == (1, TOKENS) and np.array_equal(got, expected[:1]), (got, expected[:1])


def test_an_undecided_probe_passes_no_comparison_and_its_negation_passes():
    nan = {"p": np.full((1, 3), np.nan)}
    for op in OPS:
        leaf = ck.GateCompare("p", op, 0.0)
        assert not gate_holds(leaf, nan).any() and gate_holds(ck.GateNegate(leaf), nan).all()
        got = S.evaluate_gate(gate_data(leaf), lambda name: torch.from_numpy(nan[name]))
        assert not got.any()


def test_the_vllm_evaluator_keeps_the_compute_dtype_and_shape():
    """Same maths, same tensors: a bfloat16 state compares its bfloat16 values with its bfloat16 thresholds."""
    boot = {"hooks": [], "probes": [{"name": "t1", "pool": "token"}, {"name": "m", "pool": "prompt.mean"}]}
    state = SteerState(boot, {"gates.thresholds": [0.5, -0.25]}, max_tokens=8, max_slots=2, width=4,
                       dtype=torch.bfloat16, device="cpu")
    state.write_metadata([0, 1, 2], [2, 2, 2], [0, 0, 0], [True] * 3)
    state.tok_t1[:3].copy_(torch.tensor([0.25, 0.5, 0.75]))
    state.held_m[0] = 0.0
    mask = state.gate_mask(["and", [["cmp", "t1", ">=", 0], ["not", ["cmp", "m", "<", 1]]]], 3)
    assert mask.dtype == torch.bool and mask.shape == (3,)
    assert mask.tolist() == [False, True, True]
