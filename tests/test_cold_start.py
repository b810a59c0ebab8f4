"""Cold start (issue 33): ``steerc check`` of a program that loads a vector imports what the program uses, when
it uses it.

Asserted on meaning, never on time: the modules a check leaves in ``sys.modules`` (numpy, torch, the target
registry, the constraint checkers, the model facts, the plan builder are absent unless the program or the
command line needs them), and the diagnostics of a check that folds its vectors without numpy
(``diagnostics_only``, what ``steerc check`` without a model asks for) are those of a full check, for programs
that exercise every vector diagnostic and every file format. ``benchmarks/cold_start.py`` measures the time.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from steerc.api import Options, check_source
from steerc.io import floats
from steerc.io.controlvector import control_vector_bytes
from steerc.io.floats import Floats
from steerc.io.vectorfile import VectorFileError
from steerc.io.vectors import open_vector_file

# Never imported by a check that does not need them (a prefix names a package and its modules).
HEAVY = ("numpy", "torch", "transformers", "safetensors", "gguf", "xgrammar", "vllm", "pygls", "lsprotocol",
         "pygments", "attrs", "attr")  # attrs: steerc's records are its own (steerc.core.record, issue 33)
UNUSED = ("steerc.targets", "steerc.facts", "steerc.constraints", "steerc.ir.plan", "steerc.passes.plan_pipeline",
          "steerc.runtime", "steerc.io.controlvector", "steerc.io.gguf")
WIDE = floats.PYTHON_MAX // 2 + 8  # two of these, folded, pass the bound past which numpy folds

PROBE = """
import json, sys
from steerc.cli import main
code = main({argv!r})
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


# ------------------------------------------------------------------ fixtures


def _write_safetensors(path, tensors: dict) -> None:
    """A safetensors file by hand: ``tensors`` maps a name to a numpy array, or to ("BF16", uint16 array)."""
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
    header, blobs, at = {}, [], 0
    for name, value in tensors.items():
        dtype, arr = value if isinstance(value, tuple) else (names[value.dtype], value)
        data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project with every kind of vector file a check reads, and the values the programs below need."""
    top = tmp_path_factory.mktemp("cold")
    (top / "steer.toml").write_text("# the project root\n", encoding="utf-8")
    rng = np.random.default_rng(33)
    joy = rng.normal(size=8)
    bf16 = (rng.normal(size=8).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    _write_safetensors(top / "v.safetensors", {
        "joy": joy.astype(np.float32), "sad": rng.normal(size=8).astype(np.float16), "bfv": ("BF16", bf16),
        "f64": rng.normal(size=8), "zero": np.zeros(8, np.float32), "bank": rng.normal(size=(4, 8)).astype(np.float32),
        **{f"rows.{i}": rng.normal(size=8).astype(np.float32) for i in (0, 1, 3)},
        "nan": np.array([0.0, np.nan] * 4, np.float32), "big": np.full(8, 1e300),
        "w1": rng.normal(size=WIDE).astype(np.float32), "w2": rng.normal(size=WIDE).astype(np.float32),
    })
    np.save(top / "v.npy", joy.astype(np.float32))
    np.save(top / "be.npy", joy.astype(">f4"))
    np.save(top / "bank.npy", rng.normal(size=(4, 8)))
    np.save(top / "fortran.npy", np.asfortranarray(rng.normal(size=(4, 8)).astype(np.float32)))
    np.save(top / "ints.npy", np.arange(8))
    directions = {layer: rng.normal(size=8).astype(np.float32) for layer in (1, 2, 3)}
    (top / "cv.gguf").write_bytes(control_vector_bytes(directions, "llama"))
    return top


def _program(top, name: str, body: str) -> str:
    path = top / name
    path.write_text("steer 1\n\n" + body, encoding="utf-8")
    return str(path)


# --------------------------------------------------- the same diagnostics without numpy

ST = 'load("v.safetensors", key="{}")'
CASES = {
    "algebra": (f"vector a = {ST.format('joy')}\nvector b = normalize(a) * 3 - a / 2\n"
                f"vector c = -b + {ST.format('sad')} + {ST.format('bfv')} + {ST.format('f64')}\n"
                "intervention i {\n  at resid_post[0]\n  add c\n}\n", set()),
    "normalize-zero": (f"vector z = normalize({ST.format('zero')})\n", {"invalid-value"}),
    "ablate-zero": (f"intervention i {{\n  at resid_post[0]\n  ablate {ST.format('zero')}\n}}\n", {"invalid-value"}),
    "parallel-plane": (f"vector a = {ST.format('joy')}\n"
                       "intervention i {\n  at resid_post[0]\n  rotate in (a, -2 * a) by 30deg\n}\n", {"invalid-value"}),
    "past-float32": (f"vector a = {ST.format('joy')} * 1e37 * 1e10\n", {"invalid-value"}),
    "divide-by-zero": (f"vector a = {ST.format('joy')} / 0\n", {"invalid-value"}),
    "literal-past-float32": ("vector a = [1e38, -2e38] * 10\n", {"invalid-value"}),
    "nan-in-file": (f"vector a = {ST.format('nan')}\n", {"invalid-vector-file"}),
    "float64-past-float32": (f"vector a = {ST.format('big')}\n", {"invalid-vector-file"}),
    "widths": (f"vector a = {ST.format('joy')} + [1, 2, 3]\n", {"shape-mismatch"}),
    "banks": ('vector b = load("v.safetensors", key="bank", per_layer=true)\n'
              'vector r = load("v.safetensors", key="rows", per_layer=true)\n'
              "intervention i {\n  at resid_post[0:2]\n  add normalize(b) + 2 * r\n}\n"
              "intervention j {\n  at resid_post[3]\n  add b - r\n}\n"
              "intervention k {\n  at resid_post[2]\n  add r\n}\n", {"missing-key"}),
    "schedule": (f"vector a = {ST.format('joy')}\n"
                 "intervention i {\n  at resid_post[0]\n  add ramp(4) * 2 * a / 3\n  tokens generated\n}\n", set()),
    "npy": ('vector a = load("v.npy") + load("be.npy") - 0.5 * load("fortran.npy", per_layer=true)\n'
            'vector b = load("bank.npy", per_layer=true)\n'
            "intervention i {\n  at resid_post[0:4]\n  add a + b\n}\n", set()),
    "npy-ints": ('vector a = load("ints.npy")\n', {"invalid-vector-file"}),
    "gguf": ('vector cv = load("cv.gguf")\nvector one = load("cv.gguf", key="direction.2")\n'
             "intervention i {\n  at resid_post[0:3]\n  add 2 * cv + one\n}\n", {"missing-key"}),
    "past-python-bound": ('vector w = load("v.safetensors", key="w1")\n'
                          'vector x = w * 2 + load("v.safetensors", key="w2")\n'
                          "vector n = normalize(x - x)\nvector m = normalize(-x)\n"
                          "intervention i {\n  at resid_post[0]\n  ablate m\n}\n", {"invalid-value"}),
}


def _diagnostics(result) -> list[tuple]:
    return [(d.code, d.severity, d.message, d.help, d.span.line if d.span else None,
             d.span.column if d.span else None) for d in result.diagnostics]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_check_without_numpy_reports_what_a_full_check_does(project, case):
    """issue 33: folding in plain Python (no numpy) gives a full check's diagnostics, for every vector
    diagnostic and file format, and past PYTHON_MAX entries, where numpy takes over."""
    body, codes = CASES[case]
    path = _program(project, f"{case}.steer", body)
    text = open(path, encoding="utf-8").read()
    full = check_source(text, path, path=path, options=Options())
    light = check_source(text, path, path=path, options=Options(), diagnostics_only=True)
    assert _diagnostics(light) == _diagnostics(full)
    assert {d.code for d in full.errors} == codes, full.render()
    assert light.values == {}


def test_small_vectors_fold_in_python_and_large_ones_in_numpy(project):
    """issue 33: a check that wants only diagnostics folds small vectors as Floats; past PYTHON_MAX entries
    the values are numpy's; a full check's are numpy's from the start."""
    path = _program(project, "kinds.steer",
                    f"intervention small {{\n  at resid_post[0]\n  add normalize({ST.format('joy')})\n}}\n"
                    'intervention wide {\n  at resid_post[0]\n  add load("v.safetensors", key="w1") * 2\n}\n'
                    'intervention after {\n  at resid_post[0]\n  add load("v.safetensors", key="w2") * 2\n}\n')
    text = open(path, encoding="utf-8").read()
    light = check_source(text, path, path=path, options=Options(), diagnostics_only=True)
    full = check_source(text, path, path=path, options=Options())
    kinds = [type(iv.op.vectors[0]) for iv in light.checked.interventions]
    assert kinds == [Floats, np.ndarray, np.ndarray]  # `* 2` of the wide one passes the bound: numpy's from then on
    assert all(type(iv.op.vectors[0]) is np.ndarray for iv in full.checked.interventions)
    for a, b in zip(light.checked.interventions, full.checked.interventions):
        assert np.allclose(np.asarray(a.op.vectors[0]), b.op.vectors[0], rtol=1e-15, atol=0)


# ------------------------------------------------------------ what a check imports


def _check_modules(folder, argv: list[str]) -> tuple[int, list[str]]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=str(folder), env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["code"], out["modules"]


def _present(modules: list[str], names) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


LOADS = {
    "safetensors": f"vector v = {ST.format('joy')}\n",
    "npy": 'vector v = load("v.npy")\n',
    "bank": 'vector v = load("bank.npy", per_layer=true)\n',
}


@pytest.mark.parametrize("kind", sorted(LOADS))
def test_checking_a_program_that_loads_a_vector_imports_nothing_it_does_not_use(project, kind):
    """issue 33: `steerc check` of a program that loads and folds a vector imports no numpy, no heavy
    package, no target registry, constraint checker, model facts, plan builder or GGUF reader."""
    body = LOADS[kind] + "intervention i {\n  at resid_post[0:2]\n  add normalize(v) * 2\n}\n"
    path = _program(project, f"imports_{kind}.steer", body)
    code, modules = _check_modules(project, ["check", path])
    assert code == 0
    assert "steerc.passes.foldvec" in modules  # it did fold the vector
    assert _present(modules, HEAVY + UNUSED) == []


def test_a_control_vector_imports_its_reader_and_no_numpy(project):
    """issue 33: a .gguf control vector brings the GGUF reader, still without numpy."""
    path = _program(project, "imports_gguf.steer",
                    'vector cv = load("cv.gguf")\nintervention i {\n  at resid_post[1:3]\n  add 2 * cv\n}\n')
    code, modules = _check_modules(project, ["check", path])
    assert code == 0 and "steerc.io.controlvector" in modules
    assert _present(modules, HEAVY + tuple(u for u in UNUSED if not u.startswith("steerc.io."))) == []


def test_what_a_program_or_command_uses_is_imported_when_used(project):
    """issue 33: --target loads the target registry, a `constrain` the constraint checkers, and folding
    past PYTHON_MAX entries numpy: each when used, not before."""
    small = _program(project, "use_target.steer", f"vector v = {ST.format('joy')}\n"
                     "intervention i {\n  at resid_post[1]\n  add v\n}\n")
    _, modules = _check_modules(project, ["check", small, "--target", "llamacpp"])
    assert "steerc.targets.registry" in modules
    constrained = _program(project, "use_constraint.steer", 'constrain choice ["yes", "no"]\n')
    code, modules = _check_modules(project, ["check", constrained])
    assert code == 0 and "steerc.constraints" in modules and "numpy" not in modules
    wide = _program(project, "use_numpy.steer", 'vector w = load("v.safetensors", key="w1")\n'
                    'vector x = w * 2 + load("v.safetensors", key="w2")\n'
                    "intervention i {\n  at resid_post[0]\n  add x\n}\n")
    _, modules = _check_modules(project, ["check", wide])
    assert "numpy" in modules


# ------------------------------------------------------------------ steerc.io.floats


@pytest.mark.parametrize("fmt", floats.FORMATS)
def test_decoding_bytes_is_numpys_reading_them(fmt):
    """issue 33: every byte format decodes to numpy's float32 reading of it, widened (NaN, infinities,
    subnormals and values past float32 included)."""
    rng = np.random.default_rng(7)
    if fmt == "bf16":
        bits = rng.integers(0, 1 << 16, size=4096, dtype=np.uint16)
        raw = bits.astype("<u2").tobytes()
        expected = (bits.astype(np.uint32) << 16).view(np.float32)
    elif fmt[1:] == "f8":
        values = np.concatenate([rng.normal(size=1000) * 10.0 ** rng.integers(-320, 308, size=1000),
                                 [np.inf, -np.inf, np.nan, 1e300, -1e-320, 0.0, -0.0]])
        raw = values.astype(fmt).tobytes()
        with np.errstate(over="ignore"):
            expected = values.astype(np.float32)
    else:
        size = int(fmt[2])
        raw = rng.integers(0, 256, size=size * 4096, dtype=np.uint8).tobytes()
        expected = np.frombuffer(raw, dtype=fmt).astype(np.float32)
    got = np.array(floats.decode(raw, fmt))
    assert got.dtype == np.float64 and got.shape == expected.shape
    with np.errstate(invalid="ignore"):  # widening a signalling NaN
        assert np.array_equal(got, expected.astype(np.float64), equal_nan=True)


def test_entry_wise_operations_are_numpys_bit_for_bit():
    """issue 33: each entry-wise operation is the same IEEE float64 operation numpy does."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=2000) * 10.0 ** rng.integers(-300, 300, size=2000)
    b = rng.normal(size=2000) * 10.0 ** rng.integers(-300, 300, size=2000)
    fa, fb = Floats(a), Floats(b)
    with np.errstate(over="ignore", under="ignore"):
        assert np.array_equal(np.array(floats.times(fa, 3.7e200)), a * 3.7e200)
        assert np.array_equal(np.array(floats.divided(fa, 1e-200)), a / 1e-200)
        assert np.array_equal(np.array(floats.plus(fa, fb)), a + b)
        assert np.array_equal(np.array(floats.minus(fa, fb)), a - b)
        assert np.array_equal(np.array(floats.negative(fa)), -a)
    assert floats.max_abs(fa) == np.max(np.abs(a))
    v = rng.normal(size=999)
    assert math.isclose(floats.norm(Floats(v)), float(np.linalg.norm(v)), rel_tol=1e-13)
    assert floats.norm(Floats()) == 0.0 and floats.norm(Floats([1e200, 1e200])) == math.inf  # as numpy's overflows
    assert floats.nonzero(Floats([0.0, -0.0, 1e-320])) and not floats.nonzero(Floats([0.0, -0.0]))


@pytest.mark.parametrize("values", [[math.nan, 1.0], [1.0, math.nan], [math.inf, math.nan], [-math.inf, 2.0], []])
def test_largest_magnitude_is_numpys_wherever_a_nan_is(values):
    """issue 33: Python's max skips a NaN that is not first; numpy's does not; max_abs is numpy's."""
    expected = float(np.max(np.abs(np.array(values, dtype=np.float64)), initial=0.0))
    got = floats.max_abs(Floats(values))
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


def test_floats_refuse_array_concatenation_and_repetition():
    """issue 33: `+` and `*` on an array.array concatenate and repeat; on Floats they are refused, so a vector
    can never be silently doubled in length by arithmetic meant for numpy."""
    with pytest.raises(TypeError):
        Floats([1.0]) * 2
    with pytest.raises(TypeError):
        Floats([1.0]) + Floats([2.0])
    assert Floats([1.0, 2.0]).shape == (2,) and Floats([1.0, 2.0]).size == 2


# ------------------------------------------------------------------ VectorFile


def test_a_tensor_read_without_numpy_then_with_it_is_read_and_paid_for_once(project):
    """issue 33: both forms of a tensor hold the same values, and MAX_VALUES is charged once for the two."""
    f = open_vector_file(str(project / "v.safetensors"))
    paid = []
    light = f.read64("bank", before=paid.append, python=True)
    array = f.read64("bank", before=paid.append)
    assert isinstance(light, Floats) and isinstance(array, np.ndarray) and array.shape == (4, 8)
    assert paid == [32] and np.array_equal(np.array(light), array.reshape(-1))
    g = open_vector_file(str(project / "v.safetensors"))
    first = g.read64("joy", before=paid.append)
    assert g.read64("joy", before=paid.append, python=True) is first and paid == [32, 8]


@pytest.mark.parametrize("python", [False, True])
def test_a_safetensors_file_cut_short_after_its_header_is_an_invalid_vector_file(tmp_path, python):
    """issue 32: a file truncated between reading its header and its data was a ValueError from a reshape
    (a traceback); it is now `invalid-vector-file`, with numpy and without."""
    path = tmp_path / "v.safetensors"
    _write_safetensors(path, {"joy": np.ones(8, np.float32)})
    f = open_vector_file(str(path))
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 4)
    with pytest.raises(VectorFileError) as exc:
        f.read64("joy", python=python)
    assert exc.value.code == "invalid-vector-file" and "runs past the end of the file" in exc.value.message


def test_a_truncated_npy_is_refused_alike_with_and_without_numpy(tmp_path):
    """issue 33: a plain .npy read by hand whose data is cut short gives numpy's own message."""
    path = tmp_path / "v.npy"
    np.save(path, np.ones(8, np.float32))
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 4)
    messages = []
    for python in (False, True):
        with pytest.raises(VectorFileError) as exc:
            open_vector_file(str(path)).read64("", python=python)
        messages.append(exc.value.message)
    assert messages[0] == messages[1] and messages[0].startswith("not a readable .npy file")
