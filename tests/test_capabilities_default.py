"""A capability a target does not declare is unsupported there (issue 33).

Before, ``features.every()`` marked every feature key supported, so a key added to ``FEATURE_GROUPS`` was
"supported" on hf, vllm, serve and export at once, and an emitter nobody taught it failed on
``assert isinstance(op, Rotate)`` (a traceback). Now each table declares what its target supports, key by
key; any other key is refused with ``unsupported-by-target`` (code, span, reason, what to do instead), and
a plan kernel the hooks cannot lower is that diagnostic too, never an assertion. The tables of the existing
targets are exactly what they were.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import typing

import numpy as np
import pytest
from support import REPO

from steerc.api import check_file, check_source
from steerc.diagnostics import Refusal
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.explain.plan import describe_op
from steerc.ir import kernels as KERNELS
from steerc.ir import plan as P
from steerc.ir.values import Vec
from steerc.targets import capabilities as C
from steerc.targets import features as F
from steerc.targets import hooks
from steerc.targets.registry import REGISTRY
from steerc.targets.seat import Target

# The tables as they were before issue 33 (sha256 of their canonical JSON, and of the matrix they render), with
# the rows that issue 34 added: `op:loreft` and `op:clamp-feature` (yes on hf, vllm, serve and export; no on
# llamacpp and vllm-hook, each saying why).
TABLES_SHA256 = "8e552f301fc5b25187fd9850252e40b798ecbb81f50742d18f1c49c7e921e550"  # with issue 34's sae_feature readout
MATRIX_SHA256 = "53aa3803758989dee2d22b7a9567c1e3e4740da1e4a825018e0fdbfc51c1a8c6"  # with issue 36's weights and issue 37's brainpatch, easysteer and lm-eval columns, issue 34's sae_feature row

PROGRAM = "steer 1\nvector v = [1.0, 2.0]\nintervention a {\n  at resid_post[1]\n  add v\n}\n"
NEW = "op:twist"  # a feature key no target declares


LATER = ("weights", "brainpatch", "easysteer", "lm-eval")  # targets added since (issues 36, 37): their own tests check their tables


def _tables_json() -> str:
    doc = [[n, c.name, c.summary, [[f.key, f.supported, f.note, f.instead] for f in c.features]]
           for n, c in C.TARGETS.items() if n not in LATER]
    return json.dumps(doc, sort_keys=True, ensure_ascii=True)


# ------------------------------------------------------------ nothing changed


def test_every_existing_table_is_unchanged():
    assert hashlib.sha256(_tables_json().encode()).hexdigest() == TABLES_SHA256
    assert list(C.TARGETS) == ["hf", "vllm", "serve", "vllm-hook", "llamacpp", "export", *LATER]


def test_the_rendered_matrix_is_unchanged_and_is_the_one_in_the_spec():
    matrix = C.capability_matrix()
    assert hashlib.sha256(matrix.encode()).hexdigest() == MATRIX_SHA256
    with open(os.path.join(REPO, "spec", "capabilities.md"), encoding="utf-8") as fh:
        spec = fh.read()
    assert "<!-- BEGIN GENERATED: capabilities -->\n" + matrix + "<!-- END GENERATED: capabilities -->" in spec


# ------------------------------------------------------------ a new key


@pytest.fixture
def new_key(monkeypatch):
    """``op:twist`` registered as a feature key, and used by every program's first operation (this test
    only)."""
    monkeypatch.setitem(F.FEATURE_GROUPS, "op", (*F.FEATURE_GROUPS["op"], "twist"))
    monkeypatch.setattr(F, "ALL_KEYS", (*F.ALL_KEYS, NEW))
    used = C.program_features

    def program_features(checked):
        yield from used(checked)
        yield NEW, checked.interventions[0].op.span

    monkeypatch.setattr(C, "program_features", program_features)
    return NEW


def _checked():
    return check_source(PROGRAM, "twist.steer")


@pytest.mark.parametrize("target", sorted(REGISTRY))
def test_a_key_a_target_does_not_declare_is_refused_with_a_diagnostic(new_key, target):
    """Before issue 33 hf, vllm, serve and export "supported" any new key: no diagnostic, and the emitter
    met a kernel it did not know."""
    result = _checked()
    C.check_target(result, target)
    found = [d for d in result.diagnostics if d.code == UNSUPPORTED_BY_TARGET and "`twist`" in d.message]
    assert len(found) == 1, [d.message for d in result.diagnostics]
    (d,) = found
    assert d.is_error and d.span == result.checked.interventions[0].op.span
    assert d.span.line == 5 and PROGRAM[d.span.start:d.span.end] == "add v"
    assert d.message.startswith(f"the {target} target cannot express `twist`: ")
    assert "does not declare it" in d.message and d.help
    assert not result.ok


def test_a_new_key_is_a_refused_row_of_every_table_and_of_the_matrix(new_key):
    for t in C.TARGETS.values():
        f = t.get(new_key)
        assert not f.supported and not t.supports(new_key) and f.note and f.instead
    (row,) = [line for line in C.capability_matrix().splitlines() if line.startswith("| `twist` |")]
    assert row.count("**no**: not implemented for this target") == len(C.TARGETS)


def _fresh(path: str):
    """A target module's table built again, from its source, while the new key is registered."""
    spec = importlib.util.spec_from_file_location(f"fresh_{os.path.basename(os.path.dirname(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CAPABILITIES


@pytest.mark.parametrize("folder", ["hf", "vllm", "serve", "vllm_hook", "llamacpp", "export"])
def test_a_table_built_with_the_new_key_refuses_it_and_keeps_every_other_row(new_key, folder):
    built = _fresh(os.path.join(REPO, "steerc", "targets", folder, "target.py"))
    assert [f.key for f in built.features] == list(F.ALL_KEYS)
    f = built.get(new_key)
    assert not f.supported and f.note and f.instead
    old = C.TARGETS[built.name]
    assert [f for f in built.features if f.key != new_key] == list(old.features)


def test_a_target_that_declares_the_key_supports_it(new_key, monkeypatch):
    caps = F.table("twister", "a test target", F.supported("twisted in the test", op="add twist",
                                                            site="resid_post", scope="all"))
    monkeypatch.setitem(REGISTRY, "twister", Target("twister", "a test target", caps, lambda *a, **k: []))
    monkeypatch.setitem(C.TARGETS, "twister", caps)
    assert caps.supports(new_key) and caps.get(new_key).note == "twisted in the test"
    assert not caps.supports("op:rotate")  # declared by nobody here: refused
    result = _checked()
    C.check_target(result, "twister")
    assert result.ok, result.render()


def test_a_table_that_names_no_feature_key_fails_where_it_is_written():
    with pytest.raises(ValueError, match="op:twsit"):
        F.supported(op="add twsit")
    with pytest.raises(ValueError, match="op:teleport"):
        F.table("t", "s", {}, teleport=F.yes("op:teleport", "nowhere"))
    with pytest.raises(KeyError):
        C.TARGETS["hf"].get("op:teleport")


# ------------------------------------------------------------ the emitters


def test_every_plan_kernel_has_a_lowering_and_an_explanation():
    """The hooks lower, and explain describes, each member of ``steerc.ir.plan.Op``: the else branch that
    asserted ``isinstance(op, Rotate)`` is unreachable by construction."""
    kinds = set(typing.get_args(P.Op))
    assert kinds == {k.op for k in KERNELS.BUILT_IN} == {k.op for k in KERNELS.KINDS.values()}
    assert all(hooks.runs_on_hooks(k) for k in KERNELS.KINDS.values())
    v, w = Vec([1.0, 0.0]), Vec([0.0, 1.0])
    samples = {P.Affine: P.Affine(2.0, v), P.Project: P.Project((v,)), P.Rotate: P.Rotate(v, w, math.pi / 6, "by"),
               P.LoReFT: P.LoReFT((v,), (w,), Vec([0.5])),
               P.SaeClamp: P.SaeClamp(v, 0.5, 0.0, w, v, 4.0, "jumprelu")}
    assert set(samples) == kinds
    for op in samples.values():
        assert describe_op(op)["kind"] in ("affine", "project", "rotate", "loreft", "sae_clamp")


def test_a_kernel_the_hooks_cannot_lower_is_a_diagnostic_not_an_assertion(monkeypatch, examples_dir, tiny_facts):
    """Before issue 33: ``AssertionError`` from ``assert isinstance(op, Rotate)``."""
    path = os.path.join(examples_dir, "11_rotate.steer")
    result = check_file(path, facts=tiny_facts("tiny-llama"))
    assert result.ok, result.render()
    monkeypatch.setattr(hooks, "runs_on_hooks", lambda kind: kind.name != "rotate")  # hooks without its maths
    with pytest.raises(Refusal) as caught:
        hooks.lower_hf(result.plan, result.facts)
    (d,) = caught.value.diagnostics
    assert d.code == UNSUPPORTED_BY_TARGET and d.is_error
    # the first rotation in layer order: turn_a_bit at resid_pre[1] (lines 13-16)
    assert "`rotate` kernel of `turn_a_bit`" in d.message and d.help
    assert d.span is not None and d.span.file.endswith("11_rotate.steer") and 13 <= d.span.line <= 16


def test_the_hooks_lower_as_before(examples_dir, tiny_facts):
    """The dispatch table writes each kernel's tensors in the order the if/elif chain did."""
    path = os.path.join(examples_dir, "05_ops_and_scopes.steer")
    result = check_file(path, facts=tiny_facts("tiny-llama"))
    program = hooks.lower_hf(result.plan, result.facts)
    roles = {"affine": ("scale", "bias", "schedule"), "project": ("basis", "target"), "rotate": ("e1", "e2")}
    for h in program.hooks:
        for site in h.sites:
            for k in site.kernels:
                names = [role for role, _ in k.tensors]
                assert names == [r for r in roles[k.kind] if r in names]
                for _, name in k.tensors:
                    assert program.tensors[name].dtype == np.float32
