"""The kernel seat (issue 33): a kernel kind is one module, and every engine and format reads it.

A kind registered from this test (``test-lerp``, ``h -> h + t (target - h)``: no steerc module knows it)
runs on the HF runtime, in the emitted HF package and on the vLLM buffers' site functions, goes through
the vllm plan and the serve format (schemas included) and the plan verifier, and a target that does not
declare it (llamacpp, the vLLM-Hook dialect) refuses it with ``unsupported-by-target`` — with no edit to
any steerc module. Before the seat, each of these was an if-chain on the kind in its own module.
"""

from __future__ import annotations

import ast
import os
import re

import numpy as np
import pytest
from support import REPO

from steerc.api import check_source
from steerc.core.record import evolve, frozen
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.ir import kernels as K
from steerc.ir.kernels.base import REF, Kind, Operand
from steerc.ir.values import Vec

torch = pytest.importorskip("torch")

PROGRAM = "steer 1\nvector v = [{v}]\nintervention pull {{\n  at resid_post[1]\n  add 0.5 * v\n}}\n"
T = 0.375


@frozen
class Lerp:
    target: Vec
    t: float


def lerp_test_kernel(S, x, o, mode):
    """``x + t (target - x)``: a kind no steerc module knows."""
    return x + o["t"] * (o["target"] - x)


def _operands(op):
    yield "target", op.target.array
    yield "t", float(op.t)


def _verify(op, width, where, field, v):
    v.check(v.finite_vector(op.target, width), f"{where}: bad target", f"{field}.target")
    v.check(v.f32(op.t), f"{where}: bad t", f"{field}.t")


LERP = Kind(
    name="test-lerp", op=Lerp,
    operands=(Operand("target", "d"), Operand("t", "1", number=True, bindable=True)),
    operands_of=_operands, maths=lerp_test_kernel, verify=_verify,
    explain=lambda op, fmt: {"kind": "test-lerp", "form": f"h + {fmt(op.t)} (target - h)"},
    to_serve=lambda op, put: {"kind": "test-lerp", "target": put(op.target.array), "t": op.t},
    from_serve=lambda d, read: Lerp(Vec(read(d["target"])), float(d["t"])),
    check_serve=lambda field, d, tensor, width, fail: tensor(f"{field}.target", d["target"], None, width),
    serve_schema={"type": "object", "additionalProperties": False, "required": ["kind", "target", "t"],
                  "properties": {"kind": {"const": "test-lerp"}, "target": REF, "t": {"type": "number"}}},
)


@pytest.fixture
def lerp():
    K.register(LERP)
    try:
        yield LERP
    finally:
        K.unregister(LERP.name)


def _lerp_plan(facts):
    """A checked plan whose one kernel is made a ``test-lerp`` (the language has no such op)."""
    width = facts.hidden
    target = np.linspace(-1.0, 1.0, width).astype(np.float32)
    result = check_source(PROGRAM.format(v=", ".join("1.0" for _ in range(width))), "lerp.steer", facts=facts)
    assert result.ok, result.render()
    plan = result.plan
    (sp,) = plan.sites
    (k,) = sp.kernels
    site = evolve(sp, kernels=(evolve(k, op=Lerp(Vec(target), T)),))
    return evolve(plan, sites=(site,)), target


def _model():
    from tiny_models import tiny_model

    return tiny_model("llama")


def _reference_logits(model, ids, target):
    """The model with ``h + t (target - h)`` at resid_post[1], written here, in float64."""
    layer = model.model.layers[1]

    def hook(mod, args, output):
        h = output[0] if isinstance(output, tuple) else output
        new = (h.double() + T * (torch.from_numpy(target).double() - h.double())).to(h.dtype)
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    handle = layer.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits
    finally:
        handle.remove()


def test_a_registered_kind_runs_on_the_hf_runtime_and_in_the_emitted_package(lerp, tmp_path):
    from hf_util import load_emitted

    from steerc.passes.plan_pipeline import verify
    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = _model()
    facts = facts_from_model(model)
    plan, target = _lerp_plan(facts)
    verify(plan, facts)  # the kind's own invariants
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with install(model, plan):
            steered = model(input_ids=ids).logits
    want = _reference_logits(model, ids, target)
    assert not torch.allclose(plain, want, atol=1e-3), "the kernel changes the logits"
    torch.testing.assert_close(steered, want, rtol=0, atol=1e-5)

    emit(lower_hf(plan, facts), str(tmp_path / "pkg"), "test")
    source = (tmp_path / "pkg" / "__init__.py").read_text(encoding="ascii")
    assert "def kernel_lerp_test_kernel(S, x, o, mode):" in source  # its maths, from this file's source
    ast.parse(source)
    package = load_emitted(str(tmp_path / "pkg"), "lerp_pkg")
    with torch.no_grad(), package.install(model):
        emitted = model(input_ids=ids).logits
    assert torch.equal(emitted, steered)


def test_a_registered_kind_runs_on_the_vllm_buffers(lerp):
    """The vllm plan (buffers, boot checks, schema) and the worker's site function, on CPU."""
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.steer import SteerState, site_function
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.program import build
    from steerc.targets.vllm.wire import unpack, validate_plan

    facts = facts_from_model(_model())
    plan, target = _lerp_plan(facts)
    boot, tensors = build(plan, facts)
    (hook,) = boot["hooks"]
    (kernel,) = hook["sites"][0]["kernels"]
    assert kernel["kind"] == "test-lerp" and sorted(kernel["tensors"]) == ["t", "target"]
    assert tensors[kernel["tensors"]["t"]].tolist() == [T]  # a number is a [1] buffer
    validate_plan(unpack(plan_bytes(plan, facts)), fingerprint=facts.fingerprint)  # the worker's checks, schema

    n, width = 6, facts.hidden
    state = SteerState(boot, tensors, max_tokens=n, max_slots=2, width=width, dtype=torch.float32, device="cpu")
    state.write_metadata(list(range(n)), [n] * n, [0] * n, [True] * n)
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(0))
    got = site_function(state, hook["sites"])(x)
    want = x.double() + T * (torch.from_numpy(target).double() - x.double())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_a_registered_kind_travels_in_the_serve_format(lerp):
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.admission import check_document, schema
    from steerc.targets.serve.format import to_serve

    facts = facts_from_model(_model())
    plan, _ = _lerp_plan(facts)
    assert {"const": "test-lerp"} in [o["properties"]["kind"] for o in schema()["$defs"]["op"]["oneOf"]]
    assert "t" in schema()["$defs"]["binding"]["properties"]["role"]["enum"]
    doc, artifacts = to_serve(plan, facts.to_json())
    assert doc["sites"][0]["kernels"][0]["op"]["kind"] == "test-lerp"
    admitted = check_document(doc, facts, artifacts)
    assert admitted.plan.sites == plan.sites


@pytest.mark.parametrize("target", ["llamacpp", "vllm-hook"])
def test_a_target_that_does_not_declare_a_kind_refuses_it(lerp, target):
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.capabilities import unlowered_kernel

    facts = facts_from_model(_model())
    plan, _ = _lerp_plan(facts)
    d = unlowered_kernel(plan, target)
    assert d is not None and d.code == UNSUPPORTED_BY_TARGET and d.is_error
    assert "`test-lerp` kernel of `pull`" in d.message
    assert d.span is not None and d.span.line == 3
    for hook_target in ("hf", "vllm", "serve", "export"):
        assert unlowered_kernel(plan, hook_target) is None


def test_an_unregistered_kind_is_refused_by_every_target():
    """A kind no one registered: no target lowers it (capabilities default to unsupported)."""
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.capabilities import unlowered_kernel
    from steerc.targets.registry import REGISTRY

    facts = facts_from_model(_model())
    plan, _ = _lerp_plan(facts)
    for name in REGISTRY:
        d = unlowered_kernel(plan, name)
        assert d is not None and d.code == UNSUPPORTED_BY_TARGET and "`Lerp` kernel" in d.message


def test_the_built_in_kinds_are_the_plans_ops_and_the_published_schemas_are_generated():
    from steerc.targets.serve import admission
    from steerc.targets.vllm import wire

    assert [k.name for k in K.BUILT_IN] == ["affine", "project", "rotate", "loreft", "sae_clamp"] == list(K.KINDS)
    for published, paths in ((wire.published(), ("steerc/targets/vllm/plan.schema.json",
                                                   "spec/vllm_plan.schema.json")),
                             (admission.published(), ("steerc/targets/serve/serve.schema.json",
                                                      "spec/serve.schema.json"))):
        for path in paths:
            with open(os.path.join(REPO, path), encoding="utf-8") as fh:
                assert fh.read() == published, (f"{path} is generated from the kernel kinds: write "
                                                 "steerc.targets.*.published() to it")


def test_no_module_outside_the_seat_branches_on_more_than_three_kernel_kinds():
    """Issue 33's count: modules under runtime, targets, explain, eval and derive that branch on a kernel's
    kind (isinstance on a kernel class, or a comparison with a kind's name) — at most 3 (12 before)."""
    pattern = re.compile(r"isinstance\([^)]*\b(Affine|Project|Rotate)\b|[=!]= *[\"'](affine|project|rotate)[\"']")
    branching = []
    for folder in ("runtime", "targets", "explain", "eval", "derive"):
        for root, _, files in os.walk(os.path.join(REPO, "steerc", folder)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(root, name), encoding="utf-8") as fh:
                        if pattern.search(fh.read()):
                            branching.append(os.path.relpath(os.path.join(root, name), REPO))
    assert len(branching) <= 3, branching


def test_an_op_a_target_refuses_is_refused_once_not_again_as_its_kernel():
    """Issue 33: llamacpp refused a `rotate` twice, as the feature op:rotate and as the `rotate` kernel its
    kinds do not declare; the kinds back the feature table up and add nothing where it refused already."""
    from steerc.runtime.hf import facts_from_model
    from steerc.targets.capabilities import check_target

    facts = facts_from_model(_model())
    width = facts.hidden
    e1 = ", ".join("1.0" if i == 0 else "0.0" for i in range(width))
    e2 = ", ".join("1.0" if i == 1 else "0.0" for i in range(width))
    text = (f"steer 1\nvector a = [{e1}]\nvector b = [{e2}]\n"
            "intervention turn {\n  at resid_post[1]\n  rotate in (a, b) by 10deg\n}\n")
    result = check_source(text, "turn.steer", facts=facts)
    assert result.ok, result.render()
    check_target(result, "llamacpp")
    refusals = [d for d in result.diagnostics if d.code == UNSUPPORTED_BY_TARGET]
    assert len(refusals) == 1 and "rotate" in refusals[0].message
