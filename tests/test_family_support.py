"""Which families each target steers: the data of spec/capabilities.md, its refusals, and the one
family-specific limit (Cohere's attention and MLP outputs under tensor parallelism on vLLM)."""

from __future__ import annotations

import json

import pytest
from tiny_models import BUILT
from tiny_models import FAMILIES as TINY_FAMILIES

from steerc.api import check_source
from steerc.facts import FAMILIES, facts_from_config
from steerc.facts import sites as sites_module
from steerc.targets import check_target
from steerc.targets.families import ENGINE_CI, ENGINE_ONCE, HF_INTERPRET, VERIFIED, family_matrix, family_support


def test_the_matrix_has_every_family_on_both_backends():
    matrix = family_matrix()
    for family in FAMILIES:
        (row,) = [line for line in matrix.splitlines() if line.startswith(f"| `{family}` |")]
        assert row.count(" | ") == 2
        for backend in ("hf", "vllm"):
            s = family_support(family, backend)
            assert s.supported and s.verified in VERIFIED, (family, backend)


def test_verification_claims_are_the_test_suites_families():
    assert HF_INTERPRET == set(TINY_FAMILIES)  # tests/test_hf_runtime.py runs every one of them
    assert ENGINE_CI.isdisjoint(ENGINE_ONCE) and (ENGINE_CI | ENGINE_ONCE) <= set(FAMILIES)
    assert family_support("gpt_neox", "vllm").verified == "meta"


def test_an_unknown_family_is_unsupported_with_the_reason():
    s = family_support("bert", "vllm")
    assert not s.supported and "no vllm site table" in s.note


PROGRAM = "steer 1\nintervention x {\n  at mlp_out[1]\n  scale 0.5\n}\n"


def _cohere():
    return facts_from_config({"model_type": "cohere", **BUILT["cohere"]})


@pytest.mark.parametrize("target", ["vllm", "serve"])
def test_a_family_without_a_vllm_table_is_refused_by_the_vllm_targets(monkeypatch, target):
    monkeypatch.setitem(sites_module.TABLES, "vllm", {k: v for k, v in sites_module.TABLES["vllm"].items()
                                                      if k != "cohere"})
    result = check_source(PROGRAM, "t.steer", facts=_cohere())
    assert result.ok
    check_target(result, target)
    (d,) = [d for d in result.diagnostics if d.code == "unsupported-by-target"]
    assert d.severity == "error" and "`cohere`" in d.message and "no vllm site table" in d.message
    hf = check_source(PROGRAM, "t.steer", facts=_cohere())
    check_target(hf, "hf")
    assert hf.ok


def _cohere_hooks(site: str):
    from steerc.targets.vllm.program import build

    facts = _cohere()
    result = check_source(PROGRAM.replace("mlp_out[1]", site), "t.steer", facts=facts)
    assert result.ok, result.render()
    boot, _ = build(result.plan, facts)
    return boot["hooks"], facts


@pytest.mark.parametrize("site", ["attn_out[1]", "mlp_out[2]"])
def test_cohere_attn_and_mlp_outputs_are_refused_under_tensor_parallelism(site):
    from steerc.runtime.vllm.parallel import localise as _localise
    from steerc.targets.vllm.wire import PlanError

    (hook,), facts = _cohere_hooks(site)
    assert _localise(hook, facts.heads, 0, 1, facts.head_dim, "cohere") is not None
    with pytest.raises(PlanError, match="partial sum"):
        _localise(hook, facts.heads, 1, 2, facts.head_dim, "cohere")


def test_cohere_residual_sites_are_fine_under_tensor_parallelism():
    from steerc.runtime.vllm.parallel import localise as _localise

    (hook,), facts = _cohere_hooks("resid_post[1]")
    assert _localise(hook, facts.heads, 1, 2, facts.head_dim, "cohere") is not None


def test_serve_admission_refuses_cohere_mlp_out_under_tensor_parallelism(tmp_path):
    from steerc.targets.serve.admission import RequestError, check_document
    from steerc.targets.serve.emit import emit

    facts = _cohere()
    result = check_source(PROGRAM, "t.steer", facts=facts)
    emit(result.plan, facts, str(tmp_path / "p"))
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    arts = {k: (tmp_path / "p" / "artifacts" / f"{k}.safetensors").read_bytes() for k in doc["artifacts"]}
    check_document(doc, facts, arts, tp_size=1)
    with pytest.raises(RequestError) as err:
        check_document(doc, facts, arts, tp_size=2)
    assert err.value.field.endswith("sites[0].site.kind") and "partial sum" in str(err.value)


def test_steerc_facts_names_the_partial_sites():
    from steerc.facts import facts_document

    assert facts_document(_cohere(), "vllm")["sites"]["partial_under_tensor_parallel"] == ["attn_out", "mlp_out"]
    assert "partial_under_tensor_parallel" not in facts_document(_cohere(), "hf")["sites"]
