"""``matrix`` declarations and ``loreft R, W, b`` (issue 34): pyreft's LoReFT, ``h + Rᵀ (W h + b − R h)``.

* the language: ``matrix NAME = load(...)`` and ``loreft R, W, b`` parse, format (round trip, idempotent),
  travel as IR JSON, highlight, complete and hover;
* every refusal is a diagnostic with its code and span (never a traceback): shapes (R and W ``[r, d]``,
  ``b`` ``[r]``, ``1 <= r <= d``, ``d`` the site's width), R's rows not orthonormal, a matrix where a vector
  is needed and a vector where a matrix is, ``per_layer``, a schedule, a per-request param, a bank;
  llamacpp and the vLLM-Hook dialect refuse it with ``unsupported-by-target``;
* the maths: the HF runtime equals ``steerc.ir.interpret`` and the formula written here in float64, with
  token scopes and a per-token gate; the emitted HF package equals the runtime (``torch.equal``); the vllm
  plan's site function on CPU equals the formula; the serve format round-trips and is admitted, and a
  tampered document is refused naming the field;
* the tensor checks of the formats: the vllm plan's W must have R's rows (before issue 34 a second ``k,d``
  operand was checked for the width only), the serve admission checks W and b against R.

pyreft itself is compared in ``tests/peers/test_pyreft.py`` (``./dev test-peers``), the vLLM engine in
``tests/engine/test_loreft_vllm.py`` (``./dev test-vllm``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from steerc.api import Options, check_source
from steerc.diagnostics.codes import (
    INVALID_VALUE,
    MISSING_KEY,
    PER_REQUEST_PARAM,
    SHAPE_MISMATCH,
    TYPE_ERROR,
    UNDEFINED_NAME,
    UNSUPPORTED_BY_TARGET,
    UNUSED_NAME,
)

HIDDEN, RANK = 64, 4
PROGRAM = """steer 1

matrix R = load("reft.safetensors", key="R")
matrix W = load("reft.safetensors", key="W")
vector b = load("reft.safetensors", key="b")

intervention reft {{
  at     {site}
  loreft R, W, b
  tokens {scope}
}}
"""


def reft_tensors(d: int = HIDDEN, r: int = RANK, seed: int = 0, scale: float = 0.5) -> dict:
    """R ([r, d], orthonormal rows: the Q of a QR), W ([r, d]) and b ([r]), float32, from ``seed``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, r)))
    return {"R": np.ascontiguousarray(q.T, dtype=np.float32),
            "W": (rng.normal(size=(r, d)) * scale).astype(np.float32),
            "b": rng.normal(size=r).astype(np.float32)}


def write(folder, name: str = "reft.safetensors", **tensors) -> str:
    from safetensors.numpy import save_file

    path = os.path.join(str(folder), name)
    if name.endswith(".npy"):
        (value,) = tensors.values()
        np.save(path, value)
    else:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path)
    return path


def check(folder, text: str, facts=None, **kw):
    (folder / "steer.toml").write_text("")
    return check_source(text, "reft.steer", path=str(folder / "reft.steer"),
                        options=Options(base_dir=str(folder), root=str(folder)), facts=facts, **kw)


def tiny_facts():
    from support import examples_path

    from steerc.facts import load_facts

    return load_facts(os.path.join(examples_path(), "models", "tiny-llama"))


def formula(h, t) -> np.ndarray:
    """pyreft's LoReFT in float64, position by position: ``h + Rᵀ (W h + b − R h)``."""
    r, w, b = (np.asarray(t[k], dtype=np.float64) for k in ("R", "W", "b"))
    h = np.asarray(h, dtype=np.float64)
    return h + (w @ h.T + b[:, None] - r @ h.T).T @ r


def only(result, code):
    """The one diagnostic of ``code``, with its span; every diagnostic has a code and a span."""
    assert all(d.code and d.span is not None for d in result.diagnostics), result.render()
    found = [d for d in result.diagnostics if d.code == code]
    assert len(found) == 1, result.render()
    return found[0]


def spanned(result, text: str, d) -> str:
    return text[d.span.start:d.span.end]


# ------------------------------------------------------------------ the language


def test_a_loreft_program_checks_without_and_with_a_model(tmp_path):
    """Issue 34: `matrix` and `loreft` are new; before, `matrix R = ...` was a syntax error."""
    write(tmp_path, **reft_tensors())
    text = PROGRAM.format(site="resid_post[1]", scope="prompt")
    assert check(tmp_path, text, diagnostics_only=True).ok
    result = check(tmp_path, text, facts=tiny_facts())
    assert result.ok, result.render()
    (sp,) = result.plan.sites
    (k,) = sp.kernels
    assert type(k.op).__name__ == "LoReFT" and k.op.rank == RANK and k.op.b.width == RANK
    assert result.checked.interventions[0].op.text == "loreft R, W, b"


def test_format_round_trip_and_ir_json():
    from steerc.core.source import Source
    from steerc.frontend import parse_source
    from steerc.frontend.fmt import format_source
    from steerc.ir import nodes as ir
    from steerc.ir.serialize import dumps, loads

    messy = ('steer 1\nmatrix R=load("a.safetensors",key="R")  # rows\nmatrix Weight = load("a.safetensors", '
             'key="W")\nvector b = [1.0, 2.0]\nintervention x{\nat resid_post[0]\nloreft R,Weight,  2 * b\n}\n')
    text, diagnostics = format_source(Source("a.steer", messy))
    assert diagnostics == []
    assert text == ('steer 1\n\nmatrix R      = load("a.safetensors", key="R")  # rows\n'
                    'matrix Weight = load("a.safetensors", key="W")\n\nvector b = [1.0, 2.0]\n\n'
                    'intervention x {\n  at     resid_post[0]\n  loreft R, Weight, 2 * b\n}\n')
    assert format_source(Source("a.steer", text))[0] == text  # idempotent
    program, _ = parse_source(text, "a.steer")
    assert isinstance(program.statements[0], ir.MatrixDecl)
    op = program.statements[3].op
    assert isinstance(op, ir.LoReFT) and op.rotation == ir.Name("R") and op.weight == ir.Name("Weight")
    assert loads(dumps(program)) == program and dumps(loads(dumps(program))) == dumps(program)


@pytest.mark.parametrize("line, needs", [
    ("loreft R W b", "separated by commas"),
    ("loreft R, W", "separated by commas"),
    ("loreft R, W, b c", "three operands"),
])
def test_syntax_errors_say_what_loreft_takes(line, needs):
    text = f"steer 1\nintervention x {{\n  at resid_post[0]\n  {line}\n}}\n"
    d = only(check_source(text, "a.steer"), "syntax-error")
    assert needs in d.message and d.span.line == 4


def test_the_keywords_are_contextual():
    """`matrix` and `loreft` are still names where no keyword can stand (as `vector add = [1.0]`)."""
    text = ("steer 1\nvector matrix = [1.0, 0.0]\nvector loreft = [0.0, 1.0]\n"
            "intervention x {\n  at resid_post[0]\n  add matrix + loreft\n}\n")
    assert check_source(text, "a.steer").ok


def examples_reft() -> dict:
    """The LoReFT of ``tests/fixtures/examples/vectors/reft.safetensors`` (the spec's examples use it), exact
    in float32: R is four rows of the 64-wide Sylvester Hadamard matrix over 8, W and b small dyadic numbers."""
    h = np.ones((1, 1))
    while h.shape[0] < HIDDEN:
        h = np.block([[h, h], [h, -h]])
    i, j = np.meshgrid(np.arange(RANK), np.arange(HIDDEN), indexing="ij")
    return {"R": (h[[1, 2, 5, 11]] / 8).astype(np.float32), "W": (((i * 7 + j * 3) % 11 - 5) / 16).astype(np.float32),
            "b": np.array([0.5, -0.25, 1.0, 0.125], dtype=np.float32)}


def test_the_examples_fixture_is_what_its_recipe_makes():
    from safetensors.numpy import load_file
    from support import examples_path

    stored = load_file(os.path.join(examples_path(), "vectors", "reft.safetensors"))
    want = examples_reft()
    assert sorted(stored) == sorted(want)
    for key, value in want.items():
        assert stored[key].dtype == np.float32 and np.array_equal(stored[key], value), key
    r = want["R"].astype(np.float64)
    assert np.array_equal(r @ r.T, np.eye(RANK))  # exactly orthonormal


# ------------------------------------------------------------------ refusals


def _program(op: str = "loreft R, W, b", site: str = "resid_post[1]", decls: str = "", extra: str = "") -> str:
    return (f'steer 1\nmatrix R = load("reft.safetensors", key="R")\nmatrix W = load("reft.safetensors", key="W")\n'
            f'vector b = load("reft.safetensors", key="b")\n{decls}'
            f"intervention x {{\n  at {site}\n  {op}\n{extra}}}\n")


@pytest.mark.parametrize("tensors, code, at, words", [
    (dict(W=np.zeros((3, HIDDEN), np.float32)), SHAPE_MISMATCH, "W", "both [r, d]"),
    (dict(b=np.zeros(5, np.float32)), SHAPE_MISMATCH, "b", "has length 5, but `R` has 4 rows"),
    (dict(R=np.eye(HIDDEN, 8, dtype=np.float32).T.copy() * 1.01, W=np.zeros((8, HIDDEN), np.float32),
          b=np.zeros(8, np.float32)), INVALID_VALUE, "R", "not orthonormal"),
    (dict(R=np.eye(8, 4, dtype=np.float32), W=np.zeros((8, 4), np.float32), b=np.zeros(8, np.float32)),
     SHAPE_MISMATCH, "R", "8 rows of 4 numbers"),
    (dict(R=np.ones((2, HIDDEN), np.float32) / 8, W=np.zeros((2, HIDDEN), np.float32), b=np.zeros(2, np.float32)),
     INVALID_VALUE, "R", "R Rᵀ differs from the identity by up to 1"),
])
def test_shapes_and_orthonormality_are_checked_without_a_model(tmp_path, tensors, code, at, words):
    """Each refusal is a diagnostic at the operand (code, span, caret), found with or without a model."""
    write(tmp_path, **{**reft_tensors(), **tensors})
    text = _program()
    for kw in ({"diagnostics_only": True}, {"facts": tiny_facts()}):
        result = check(tmp_path, text, **kw)
        d = only(result, code)
        assert words in d.message, d.message
        assert spanned(result, text, d) == at and d.span.line == 7
        assert "7 |   loreft R, W, b\n  |" in result.render()


def test_r_past_the_tolerance_is_refused_and_within_it_accepted(tmp_path):
    t = reft_tensors()
    r = t["R"].astype(np.float64)
    r[0] *= 1 + 4e-5  # R Rᵀ is 8e-5 from I at [0, 0]: inside
    write(tmp_path, **{**t, "R": r.astype(np.float32)})
    assert check(tmp_path, _program(), diagnostics_only=True).ok
    r[0] *= 1 + 1e-4  # now about 3e-4: outside
    write(tmp_path, **{**t, "R": r.astype(np.float32)})
    assert only(check(tmp_path, _program(), diagnostics_only=True), INVALID_VALUE)


def test_the_rank_is_bounded_before_r_is_multiplied(tmp_path):
    """R Rᵀ costs r * r * d: a rank past MAX_LOREFT_RANK is limit-exceeded at R, before the product."""
    from steerc.core.limits import MAX_LOREFT_RANK

    r, d = MAX_LOREFT_RANK + 1, MAX_LOREFT_RANK + 8
    write(tmp_path, R=np.zeros((r, d), np.float32), W=np.zeros((r, d), np.float32), b=np.zeros(r, np.float32))
    result = check(tmp_path, _program(), diagnostics_only=True)
    d = only(result, "limit-exceeded")
    assert "rank up to 1,024" in d.message and spanned(result, _program(), d) == "R"
    assert not [x for x in result.diagnostics if x.code == INVALID_VALUE]  # never multiplied


def test_the_site_width_is_checked_with_the_model(tmp_path):
    write(tmp_path, **reft_tensors(d=32))
    text = _program()
    assert check(tmp_path, text, diagnostics_only=True).ok  # 32 wide: fine until a model says otherwise
    result = check(tmp_path, text, facts=tiny_facts())
    d = only(result, SHAPE_MISMATCH)
    assert "`R` has shape [4, 32], but `resid_post[1]` is 64 wide" in d.message and spanned(result, text, d) == "R"
    assert d.notes and "layer 1" in d.notes[0].message
    # at a head the width is head_dim
    write(tmp_path, **reft_tensors(d=16))
    assert check(tmp_path, _program(site="head[1, 2]"), facts=tiny_facts()).ok
    assert only(check(tmp_path, _program(), facts=tiny_facts()), SHAPE_MISMATCH)


@pytest.mark.parametrize("decls, op, code, at, words", [
    ("", "add R", TYPE_ERROR, "R", "expected a vector, found a matrix"),
    ("", "loreft b, W, b", TYPE_ERROR, "b", "expected a matrix, found a vector"),
    ("", "loreft R, W, R", TYPE_ERROR, "R", "expected a vector, found a matrix"),
    ("", "loreft R, W, 2 * R", TYPE_ERROR, "2 * R", "a matrix takes part in no arithmetic"),
    ("", "loreft -R, W, b", TYPE_ERROR, "-R", "a matrix takes part in no arithmetic"),
    ("", "scale W", TYPE_ERROR, "W", "takes a number or a vector, found a matrix"),
    ("", "loreft R, W, ramp(4) * b", TYPE_ERROR, "ramp(4) * b", "found a scheduled vector"),
    ("param g = 2.0 per request\n", "loreft R, W, g * b", PER_REQUEST_PARAM, "g", "takes no per-request value"),
    ("vector v = R\n", "loreft R, W, b", TYPE_ERROR, "R", "expected a vector, found a matrix"),
    ("matrix M = b\n", "loreft M, W, b", TYPE_ERROR, "b", "expected a matrix, found a vector"),
    ("matrix M = [1.0, 2.0]\n", "loreft M, W, b", TYPE_ERROR, "[1.0, 2.0]", "expected a matrix"),
    ('matrix M = load("reft.safetensors", key="R", per_layer=true)\n', "loreft M, W, b", TYPE_ERROR,
     "per_layer=true", "a matrix is one 2-D tensor"),
    ('matrix M = load("reft.safetensors", key="b")\n', "loreft M, W, b", SHAPE_MISMATCH, '"b"',
     "has shape [4]; a matrix has two dimensions"),
    ('matrix M = load("reft.safetensors", key="Q")\n', "loreft M, W, b", MISSING_KEY, '"Q"', "no tensor `Q`"),
    ('matrix M = load("reft.safetensors")\n', "loreft M, W, b", MISSING_KEY, '"reft.safetensors"', "say which"),
    ('vector v = load("reft.safetensors", key="R")\n', "add v", SHAPE_MISMATCH, '"R"',
     "a vector has one dimension"),  # a vector's load of a 2-D tensor stays what it was
    ("", "loreft R, V, b", UNDEFINED_NAME, "V", "undefined name `V`"),
    ("probe p {\n  at resid_post[0]\n  read norm\n  pool token\n}\n", "loreft R, W, b\n  when p > R", TYPE_ERROR,
     "p > R", "compare a probe with a number, not with a matrix"),
])
def test_a_matrix_where_a_vector_is_needed_and_every_other_misuse(tmp_path, decls, op, code, at, words):
    write(tmp_path, **reft_tensors())
    text = _program(op, decls=decls)
    result = check(tmp_path, text, diagnostics_only=True)
    d = only(result, code)
    assert words in d.message, d.message
    assert spanned(result, text, d) == at
    assert not result.ok


def test_tensors_of_other_ranks_and_files(tmp_path):
    write(tmp_path, **reft_tensors(), C=np.zeros((2, 4, HIDDEN), np.float32), E=np.zeros((0, HIDDEN), np.float32))
    for key, words in (("C", "has shape [2, 4, 64]; a matrix has two dimensions"), ("E", "no entries")):
        text = _program(decls=f'matrix M = load("reft.safetensors", key="{key}")\n', op="loreft M, W, b")
        assert words in only(check(tmp_path, text, diagnostics_only=True), SHAPE_MISMATCH).message
    t = reft_tensors()
    write(tmp_path, "r.npy", R=t["R"])  # a .npy holds one matrix as well
    text = _program(decls='matrix M = load("r.npy")\n', op="loreft M, W, b")
    assert check(tmp_path, text, facts=tiny_facts()).ok


def test_a_bias_bank_is_refused(tmp_path):
    write(tmp_path, **reft_tensors(), B=np.zeros((4, RANK), np.float32))
    text = _program(decls='vector bank = load("reft.safetensors", key="B", per_layer=true)\n',
                    op="loreft R, W, bank")
    assert "per-layer bank" in only(check(tmp_path, text, diagnostics_only=True), SHAPE_MISMATCH).message


def test_an_unused_matrix_is_a_warning(tmp_path):
    write(tmp_path, **reft_tensors())
    text = 'steer 1\nmatrix R = load("reft.safetensors", key="R")\n'
    d = only(check(tmp_path, text), UNUSED_NAME)
    assert d.message == "matrix `R` is never used"


@pytest.mark.parametrize("target", ["llamacpp", "vllm-hook"])
def test_llamacpp_and_vllm_hook_refuse_it(tmp_path, target):
    from steerc.targets.capabilities import TARGETS, check_target

    write(tmp_path, **reft_tensors())
    text = _program()
    result = check(tmp_path, text, facts=tiny_facts())
    check_target(result, target)
    found = [d for d in result.diagnostics if d.code == UNSUPPORTED_BY_TARGET]
    assert found and all(d.is_error and d.span is not None for d in found)
    assert "`loreft`" in found[0].message and spanned(result, text, found[0]) == "loreft R, W, b"
    assert not TARGETS[target].supports("op:loreft") and TARGETS[target].get("op:loreft").note
    for good in ("hf", "vllm", "serve", "export"):
        fine = check(tmp_path, text, facts=tiny_facts())
        check_target(fine, good)
        assert fine.ok, (good, fine.render())


def test_the_limits_count_a_loreft_at_every_site_it_reaches(tmp_path, monkeypatch):
    from steerc.passes import layout

    write(tmp_path, **reft_tensors())
    monkeypatch.setattr(layout, "MAX_VALUES", 3 * (2 * RANK * HIDDEN + RANK) - 1)
    result = check(tmp_path, _program(site="resid_post[0:3]"), facts=tiny_facts())
    assert only(result, "limit-exceeded")


# ------------------------------------------------------------------ the maths

torch = pytest.importorskip("torch")
IDS = torch.tensor([[0, 0, 5, 2, 7, 8, 9], [11, 12, 13, 2, 15, 16, 17]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
PROBE_W = np.linspace(-1.0, 1.0, HIDDEN)


def _model():
    from tiny_models import tiny_model

    return tiny_model("llama")  # float64


def _steered(model, plan, site_hook):
    from hf_util import capture

    from steerc.runtime.hf import install

    store: list = []
    with install(model, plan), capture(model, site_hook, store), torch.no_grad():
        logits = model(input_ids=IDS, attention_mask=MASK).logits
    return store[-1], logits


def _plain(model, hooks):
    from hf_util import capture

    stores = [[] for _ in hooks]
    import contextlib

    with contextlib.ExitStack() as stack, torch.no_grad():
        for hook, store in zip(hooks, stores):
            stack.enter_context(capture(model, hook, store))
        logits = model(input_ids=IDS, attention_mask=MASK).logits
    return [s[-1] for s in stores], logits


@pytest.mark.parametrize("scope, gated", [("all", False), ("[0, 2]", False), ("prompt[-2:]", False),
                                          ("all", True), ("prompt[1:]", True)])
def test_the_hf_runtime_equals_the_interpreter_and_the_formula(tmp_path, scope, gated):
    from hf_util import expected_site, hook_of, plan_for, scoped

    model = _model()
    t = reft_tensors()
    write(tmp_path, **t)
    probe = ("probe p {\n  at   resid_post[0]\n  read dot([" + ", ".join(f"{x:.6f}" for x in PROBE_W) + "])\n"
             "  pool token\n}\n") if gated else ""
    text = PROGRAM.format(site="resid_post[1]", scope=scope)
    if gated:
        text = text.replace("intervention reft", probe + "intervention reft").replace(
            f"tokens {scope}\n", f"tokens {scope}\n  when   p > 0.0\n")
    plan = plan_for(model, text, base_dir=str(tmp_path))
    (sp,) = plan.sites
    hook, probe_hook = hook_of(model, sp.site), hook_of(model, type(sp.site)("resid_post", 0))
    (h0, p0), plain = _plain(model, [hook, probe_hook])
    h1, steered = _steered(model, plan, hook)
    values = p0.double().numpy() @ np.asarray([float(f"{x:.6f}") for x in PROBE_W])
    mask_of = scoped(MASK, scope, values if gated else None)
    real = MASK.bool().numpy()

    want = expected_site(sp, h0, mask_of)  # steerc.ir.interpret
    torch.testing.assert_close(h1.double()[MASK.bool()], want[MASK.bool()], rtol=0, atol=1e-10)
    direct = h0.double().numpy().copy()
    for b in range(direct.shape[0]):
        m = mask_of(None, b)
        direct[b, m] = formula(direct[b, m], t)
    assert np.abs(h1.double().numpy()[real] - direct[real]).max() <= 1e-5  # the formula, written here
    assert torch.equal(h1[~MASK.bool()], h0[~MASK.bool()]), "padding is never modified"
    assert not torch.allclose(steered, plain)
    if gated:
        assert 0 < sum(mask_of(None, b).sum() for b in range(2)) < real.sum(), "the gate selects some positions"


def test_the_emitted_hf_package_equals_the_runtime(tmp_path):
    import ast

    from hf_util import load_emitted, plan_for

    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = _model()
    write(tmp_path, **reft_tensors())
    plan = plan_for(model, PROGRAM.format(site="resid_post[2]", scope="prompt[1:]"), base_dir=str(tmp_path))
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    source = (tmp_path / "pkg" / "__init__.py").read_text(encoding="ascii")
    assert "def kernel_loreft(S, x, o, mode):" in source
    ast.parse(source)
    package = load_emitted(str(tmp_path / "pkg"), "loreft_pkg")
    with torch.no_grad():
        with install(model, plan):
            runtime = model(input_ids=IDS, attention_mask=MASK).logits
        with package.install(model):
            emitted = model(input_ids=IDS, attention_mask=MASK).logits
    assert torch.equal(emitted, runtime)


def test_the_interpreter_is_the_formula():
    from steerc.ir.interpret import apply_op
    from steerc.ir.kernels.loreft import LoReFT, loreft
    from steerc.ir.values import Vec
    from steerc.runtime import kernels as S

    t = reft_tensors(seed=3)
    op = LoReFT(tuple(Vec(r) for r in t["R"]), tuple(Vec(r) for r in t["W"]), Vec(t["b"]))
    h = np.random.default_rng(5).normal(size=(9, HIDDEN))
    np.testing.assert_allclose(apply_op(op, h), formula(h, t), rtol=0, atol=1e-12)
    assert apply_op(op, h[:0]).shape == (0, HIDDEN)
    x = torch.from_numpy(h)
    o = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in t.items()}
    np.testing.assert_allclose(loreft(S, x, o, None).numpy(), formula(h, t), rtol=0, atol=1e-12)
    # inside R's row space h's coordinates become W h + b; outside it h is kept
    r = t["R"].astype(np.float64)
    out = apply_op(op, h)
    np.testing.assert_allclose(out @ r.T, h @ t["W"].astype(np.float64).T + t["b"], atol=1e-5)
    np.testing.assert_allclose(out - (out @ r.T) @ r, h - (h @ r.T) @ r, atol=1e-6)  # R is float32


def test_the_vllm_plan_site_function_equals_the_formula(tmp_path):
    from hf_util import plan_for

    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.steer import SteerState, site_function
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.program import build
    from steerc.targets.vllm.wire import unpack, validate_plan

    model = _model()
    facts = facts_from_model(model)
    t = reft_tensors(seed=1)
    write(tmp_path, **t)
    plan = plan_for(model, PROGRAM.format(site="resid_post[1]", scope="all"), base_dir=str(tmp_path))
    boot, tensors = build(plan, facts)
    (hook,) = boot["hooks"]
    (kernel,) = hook["sites"][0]["kernels"]
    assert kernel["kind"] == "loreft" and sorted(kernel["tensors"]) == ["R", "W", "b"]
    assert boot["buffers"][kernel["tensors"]["W"]]["shape"] == [RANK, HIDDEN]
    validate_plan(unpack(plan_bytes(plan, facts)), fingerprint=facts.fingerprint)
    n = 6
    state = SteerState(boot, tensors, max_tokens=n, max_slots=2, width=HIDDEN, dtype=torch.float32, device="cpu")
    state.write_metadata(list(range(n)), [n] * n, [0] * n, [True] * n)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(0))
    got = site_function(state, hook["sites"])(x)
    np.testing.assert_allclose(got.double().numpy(), formula(x.double().numpy(), t), rtol=0, atol=1e-5)


def test_the_vllm_plan_refuses_a_w_without_rs_rows(tmp_path):
    """A bug fixed in issue 34 (with its regression test, as issue 32 asks): the worker's check took the rows
    of every ``k,d`` operand afresh, so a W of other rows than R passed it (and the ``b`` of W's rows); the
    first ``k,d`` operand fixes ``k`` now."""
    from hf_util import plan_for

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.vllm import wire
    from steerc.targets.vllm.program import build

    model = _model()
    facts = facts_from_model(model)
    write(tmp_path, **reft_tensors())
    boot, _ = build(plan_for(model, PROGRAM.format(site="resid_post[1]", scope="all"), base_dir=str(tmp_path)),
                    facts)
    wire._check_boot(boot, facts)
    (kernel,) = boot["hooks"][0]["sites"][0]["kernels"]
    boot["buffers"][kernel["tensors"]["W"]]["shape"] = [RANK + 1, HIDDEN]
    boot["buffers"][kernel["tensors"]["b"]]["shape"] = [RANK + 1]
    with pytest.raises(wire.PlanError, match=r"kernels\[0\]\.tensors\.W.*\[4, 64\] is needed"):
        wire._check_boot(boot, facts)


def test_the_serve_format_round_trips_and_refuses_tampering(tmp_path):
    from hf_util import plan_for

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.admission import RequestError, check_document, schema
    from steerc.targets.serve.format import artifact_id, to_serve

    model = _model()
    facts = facts_from_model(model)
    t = reft_tensors()
    write(tmp_path, **t)
    plan = plan_for(model, PROGRAM.format(site="resid_post[1]", scope="prompt"), base_dir=str(tmp_path))
    assert {"const": "loreft"} in [o["properties"]["kind"] for o in schema()["$defs"]["op"]["oneOf"]]
    doc, artifacts = to_serve(plan, facts.to_json())
    op = doc["sites"][0]["kernels"][0]["op"]
    assert op["kind"] == "loreft" and set(op) == {"kind", "R", "W", "b"}
    assert check_document(doc, facts, artifacts).plan.sites == plan.sites

    def tampered(role, value):
        from safetensors.numpy import save

        data = save({"value": np.ascontiguousarray(value, dtype=np.float32)})
        ref = {**op, role: {"artifact": artifact_id(data)}}
        kernel = {**doc["sites"][0]["kernels"][0], "op": ref}
        used = sorted({ref[k]["artifact"] for k in ("R", "W", "b")})
        new = {**doc, "sites": [{**doc["sites"][0], "kernels": [kernel]}], "artifacts": used}
        return new, {k: v for k, v in {**artifacts, artifact_id(data): data}.items() if k in used}

    for role, value, words in (("W", t["W"][:3], "[4, 64] is needed here"),
                               ("b", t["b"][:3], "a vector of length 4 is needed here"),
                               ("R", t["R"] * 2.0, "not orthonormal")):
        bad, arts = tampered(role, value)
        with pytest.raises(RequestError) as caught:
            check_document(bad, facts, arts)
        assert words in str(caught.value) and role in caught.value.field, (role, caught.value)


def test_explain_shows_the_kernel(tmp_path):
    from steerc.explain.plan import explain, render

    write(tmp_path, **reft_tensors())
    result = check(tmp_path, PROGRAM.format(site="resid_post[1]", scope="all"), facts=tiny_facts())
    text = render(explain(result))
    assert "1. loreft: h + R^T (W h + b - R h), rank 4, |b| = " in text


# ------------------------------------------------------------------ the editors


def test_hover_completion_and_highlighting(tmp_path):
    from steerc.highlight.pygments_lexer import SteerLexer
    from steerc.lsp.analysis import Analysis
    from steerc.lsp.complete import complete
    from steerc.lsp.hover import hover

    write(tmp_path, **reft_tensors(), M=np.ones((2, HIDDEN), np.float32))
    text = _program(decls='matrix M = load("reft.safetensors", key="M")\n', op="loreft R, W, b\n  loreft R, M, b")
    analysis = Analysis(check(tmp_path, text))
    shown = hover(analysis, text.index("R ="))
    assert shown.startswith("**matrix `R`** `[4, 64]`") and "usable as a LoReFT's R" in shown
    assert "key `R`" in shown
    assert "not its R" in hover(analysis, text.index("M ="))
    assert "pyreft's LoReFT" in hover(analysis, text.index("x {"))
    before = text[:text.index("intervention")] + "intervention y {\n  at resid_post[1]\n  loreft "
    assert [c.label for c in complete(before, len(before))] == ["R", "W", "M"]
    before += "R, W, "
    assert [c.label for c in complete(before, len(before))][:1] == ["b"]
    block = "steer 1\nintervention y {\n  "
    assert "loreft" in [c.label for c in complete(block, len(block))]
    assert "matrix" in [c.label for c in complete("steer 1\n", len("steer 1\n"))]
    tokens = {(str(kind), value) for kind, value in SteerLexer().get_tokens(text)}
    assert ("Token.Keyword.Declaration", "matrix") in tokens and ("Token.Keyword", "loreft") in tokens
    assert ("Token.Name.Variable", "R") in tokens


# ------------------------------------------------------------------ the command line and the export target


def test_the_command_line_compiles_it_where_it_runs_and_refuses_it_where_it_does_not(tmp_path, monkeypatch):
    from support import examples_path, run_cli

    monkeypatch.chdir(tmp_path)
    write(tmp_path, **reft_tensors())
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(PROGRAM.format(site="resid_post[1]", scope="all"))
    model = os.path.join(examples_path(), "models", "tiny-llama")
    for target in ("hf", "vllm", "serve"):
        code, _, err = run_cli(["compile", "p.steer", "--model", model, "--target", target, "-o", f"out_{target}"])
        assert code == 0, err
    for argv in (["--target", "llamacpp"], ["--target", "serve", "--dialect", "vllm-hook"]):
        code, _, err = run_cli(["compile", "p.steer", "--model", model, *argv, "-o", "refused"])
        assert code == 1 and "error[unsupported-by-target]" in err and "loreft R, W, b\n  |   ^^^^" in err, err
        assert not (tmp_path / "refused").exists()


def test_the_exported_program_gives_the_hf_runtimes_logits(tmp_path, monkeypatch):
    """--target export traces the loreft kernel into the exported graph; its R, W and b are buffers."""
    from hf_util import exported_and_runtime
    from tiny_models import save_tiny_llama

    monkeypatch.chdir(tmp_path)
    save_tiny_llama(tmp_path / "model")
    write(tmp_path, **reft_tensors())
    (tmp_path / "steer.toml").write_text("")
    text = PROGRAM.format(site="resid_post[1]", scope="prompt[1:]")
    got, want, plain, buffers = exported_and_runtime(tmp_path, text)
    assert buffers >= {"R", "W", "b"}, buffers
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert float((want - plain).abs().max()) > 1e-2


# ------------------------------------------------------------------ fuzz

from fuzzing import RAN, fuzz  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SHAPES = st.sampled_from([(4, 64), (3, 64), (4, 32), (0, 64), (64, 4), (65, 64), (4,), (5,), (3,), (2, 4, 64), ()])
_KINDS = st.sampled_from(["orthonormal", "scaled", "zeros", "random", "huge"])


def _tensor(shape, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "orthonormal" and len(shape) == 2 and 0 < shape[0] <= shape[1]:
        return np.linalg.qr(rng.normal(size=(shape[1], shape[0])))[0].T.astype(np.float32)
    if kind == "huge":
        return np.full(shape, 3e38, np.float32)
    value = {"scaled": 2.0, "zeros": 0.0}.get(kind)
    return (np.full(shape, value) if value is not None else rng.normal(size=shape)).astype(np.float32)


_DECLS = st.sampled_from(["matrix", "vector"])
_OPERANDS = st.sampled_from(["R", "W", "b", "2 * b", "-R", "R + W", "[1.0, 2.0, 3.0, 4.0]", "ramp(2) * b",
                             'load("reft.safetensors", key="R")', "normalize(b)", "g * b"])


@fuzz(60, "loreft-programs")
@given(st.lists(st.tuples(_SHAPES, _KINDS), min_size=3, max_size=3), st.lists(_DECLS, min_size=3, max_size=3),
       st.lists(_OPERANDS, min_size=3, max_size=3), st.booleans(), st.integers(0, 3))
def test_any_loreft_program_is_checked_or_refused_with_a_diagnostic(tmp_path_factory, tensors, decls, operands,
                                                                      with_model, seed):
    """Whatever the tensors' shapes and values, the declarations and the operands: a clean check, or
    diagnostics that each have a code and a span — never an exception."""
    folder = tmp_path_factory.mktemp("fuzz")
    write(folder, **{name: _tensor(shape, kind, seed) for name, (shape, kind) in zip("RWb", tensors)})
    lines = [f'{decl} {name} = load("reft.safetensors", key="{name}")' for decl, name in zip(decls, "RWb")]
    text = ("steer 1\nparam g = 1.0 per request\n" + "\n".join(lines) +
            f"\nintervention x {{\n  at resid_post[1]\n  loreft {', '.join(operands)}\n  tokens prompt\n}}\n")
    result = check(folder, text, facts=tiny_facts() if with_model else None)
    assert all(d.code and d.span is not None and d.span.file == "reft.steer" for d in result.diagnostics), \
        result.render()
    if result.ok and with_model:
        (sp,) = result.plan.sites
        assert type(sp.kernels[0].op).__name__ == "LoReFT"
    RAN["loreft-programs"] += 1
