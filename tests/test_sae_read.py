"""``read s[i]``: a probe that reads an SAE feature's activation (issue 34).

* the language: ``read s[i]`` parses, formats (round trip) and checks; a vector indexed, an index out of range,
  a topk or gated SAE, an SAE as wide as another model and a probe at another site than the SAE's hook are
  each a diagnostic at the feature; llamacpp and the vLLM-Hook dialect refuse it (``unsupported-by-target``);
* the value is ``f_i(h) = relu(pre) * [pre > threshold_i]``, ``pre = (h - b_dec) . W_enc[:, i] + b_enc[i]``:
  the runtime's readout equals that formula written here in float64 and steerc's SAE reader's
  ``feature_activation`` (both within float32's rounding), and the activation ``clamp feature`` computes
  (bitwise: one formula);
* a gate on it steers where the formula says (HF runtime against ``steerc.ir.interpret`` with the mask the
  formula gives), per token and pooled over the prompt; the emitted HF package equals the runtime; the vllm
  plan's site function on CPU equals the runtime; the serve format carries it and refuses a threshold on any
  other readout; the exported program gives the runtime's logits; explain names the feature.

SAELens's own ``SAE.encode`` is compared in ``tests/sae/test_sae_steer_lens.py`` (``./dev test-sae``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from test_sae_steer import HIDDEN, IDS, MASK, _capture, _model, check, only, spanned, tiny_facts, write_sae

from steerc.diagnostics.codes import (
    INVALID_VALUE,
    SHAPE_MISMATCH,
    TYPE_ERROR,
    UNSUPPORTED_BY_TARGET,
    VECTOR_SITE_MISMATCH,
)

THRESHOLD = 0.05  # of the gates below: the tiny model's feature 3 reads above it at some positions only


def read_program(read: str = "s[3]", pool: str = "token", site: str = "resid_post[1]", op: str = "add 3 * s[5]",
                 gate: str = f"act > {THRESHOLD}", scope: str = "all", decls: str = "") -> str:
    return (f'steer 1\n\nsae s = sae("saes/s")\n{decls}\nprobe act {{\n  at   {site}\n  read {read}\n'
            f"  pool {pool}\n}}\n\nintervention push {{\n  at     resid_post[1]\n  {op}\n  tokens {scope}\n"
            f"  when   {gate}\n}}\n")


def activation(h, t, index: int, architecture: str = "jumprelu", apply_b_dec: bool = True) -> np.ndarray:
    """Feature ``index``'s activation as SAELens encodes it, in float64, written out here."""
    h = np.asarray(h, np.float64)
    pre = (h - np.asarray(t["b_dec"], np.float64) * apply_b_dec) @ np.asarray(t["W_enc"], np.float64)[:, index]
    pre = pre + float(t["b_enc"][index])
    theta = float(t["threshold"][index]) if architecture == "jumprelu" else 0.0
    return np.where(pre > theta, np.maximum(pre, 0.0), 0.0)


# ------------------------------------------------------------------ the language


def test_read_checks_formats_and_round_trips(tmp_path):
    from steerc.core.source import Source
    from steerc.frontend import parse_source
    from steerc.frontend.fmt import format_source
    from steerc.ir import nodes as ir
    from steerc.ir.serialize import dumps, loads

    write_sae(tmp_path)
    text = read_program()
    result = check(tmp_path, text, facts=tiny_facts())
    assert result.ok and not result.diagnostics, result.render()
    (probe,) = result.plan.probes
    assert probe.kind == "sae_feature" and len(probe.vectors) == 2 and probe.threshold > 0
    formatted, diagnostics = format_source(Source("p.steer", text.replace("read s[3]", "read   s[ 1+2 ]")))
    assert diagnostics == [] and "  read s[1 + 2]\n" in formatted
    assert format_source(Source("p.steer", formatted))[0] == formatted  # idempotent
    program, _ = parse_source(formatted, "p.steer")
    readout = program.statements[1].readout
    assert isinstance(readout, ir.FeatureReadout) and readout.feature.base == ir.Name("s")
    assert loads(dumps(program)) == program


@pytest.mark.parametrize("read, decls, code, at, words", [
    ("v[3]", "vector v = [1, 2]", TYPE_ERROR, "v", "SAE"),
    ("s[12]", "", INVALID_VALUE, "12", "d_sae = 12"),
    ("s[1.5]", "", INVALID_VALUE, "1.5", "whole number"),
])
def test_every_misuse_is_a_diagnostic_at_the_feature(tmp_path, read, decls, code, at, words):
    write_sae(tmp_path)
    text = read_program(read=read, decls=decls)
    d = only(check(tmp_path, text), code)
    assert spanned(text, d) == at and words in d.message, d.message


@pytest.mark.parametrize("architecture, words", [("topk", "whole encoder"), ("gated", "gate path")])
def test_topk_and_gated_reads_are_refused_saying_why(tmp_path, architecture, words):
    write_sae(tmp_path, architecture=architecture)
    text = read_program(op="add 2 * [" + ", ".join(["0.5"] * HIDDEN) + "]")
    d = only(check(tmp_path, text), INVALID_VALUE)
    assert spanned(text, d) == "s[3]" and "`read s[i]`" in d.message and words in d.message
    assert "dot(s[i])" in d.help


def test_the_sae_is_checked_against_the_site(tmp_path):
    write_sae(tmp_path, d_in=32)
    text = read_program(op="add 2 * [" + ", ".join(["0.5"] * HIDDEN) + "]")
    d = only(check(tmp_path, text, facts=tiny_facts()), SHAPE_MISMATCH)
    assert spanned(text, d) == "s[3]" and "d_in = 32" in d.message and "64 wide" in d.message
    write_sae(tmp_path, hook="blocks.2.hook_resid_post")
    text = read_program(op="add 2 * [" + ", ".join(["0.5"] * HIDDEN) + "]")
    d = only(check(tmp_path, text), VECTOR_SITE_MISMATCH)
    assert spanned(text, d) == "s[3]" and "resid_post[2]" in d.message


@pytest.mark.parametrize("argv", [["--target", "llamacpp"], ["--target", "serve", "--dialect", "vllm-hook"]])
def test_llamacpp_and_vllm_hook_refuse_it(tmp_path, monkeypatch, argv):
    from support import examples_path, run_cli

    monkeypatch.chdir(tmp_path)
    write_sae(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(read_program(op="add 2 * [" + ", ".join(["0.5"] * HIDDEN) + "]"))
    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, _, err = run_cli(["compile", "p.steer", "--model", model, *argv, "-o", "refused"])
    assert code == 1 and f"error[{UNSUPPORTED_BY_TARGET}]" in err and "Traceback" not in err
    assert not (tmp_path / "refused").exists()


# ------------------------------------------------------------------ the value


@pytest.mark.parametrize("architecture, apply_b_dec", [("jumprelu", True), ("standard", True),
                                                       ("jumprelu", False)])
def test_the_readout_is_the_saes_encoder(tmp_path, architecture, apply_b_dec):
    from steerc.io.sae import read_sae
    from steerc.ir.kernels.sae_clamp import sae_clamp
    from steerc.passes.lower_plan import _sae_clamp
    from steerc.runtime import kernels as S

    t = write_sae(tmp_path, architecture=architecture, apply_b_dec_to_input=apply_b_dec)
    result = check(tmp_path, read_program(op="clamp feature s[3] to 0"), facts=tiny_facts())
    (probe,) = result.plan.probes
    h = torch.randn(200, HIDDEN, generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    stacked = torch.from_numpy(np.stack([v.array for v in probe.vectors]))
    got = S.readout("sae_feature", h, stacked, probe.bias, probe.threshold)
    want = activation(h.numpy(), t, 3, architecture, apply_b_dec)
    assert got.dtype == torch.float32 and np.abs(got.double().numpy() - want).max() <= 1e-5
    assert 10 < int((want > 0).sum()) < 190, "the feature fires on some rows only"
    theirs = read_sae(str(tmp_path / "saes" / "s")).feature_activation(h.numpy(), 3)
    assert np.abs(got.numpy() - theirs).max() <= 1e-5
    # clamp feature to 0 subtracts exactly f_i(h) W_dec[i]: the same f, bitwise
    op = _sae_clamp(result.checked.interventions[0].op)
    o = {"enc": torch.tensor(op.enc.array), "b_enc": op.b_enc, "threshold": op.threshold,
         "b_dec": torch.tensor(op.b_dec.array), "dec": torch.tensor(op.dec.array), "target": 0.0}
    clamped = sae_clamp(S, h, o, op.mode)
    assert torch.equal(clamped, h - got.unsqueeze(-1) * o["dec"])


@pytest.mark.parametrize("pool, scope", [("token", "all"), ("token", "prompt[1:]"), ("prompt.mean", "generated"),
                                         ("prompt.last", "generated")])
def test_a_gate_on_it_steers_where_the_formula_says(tmp_path, pool, scope):
    from hf_util import expected_site, hook_of, plan_for, positions

    model = _model()
    t = write_sae(tmp_path)
    text = read_program(pool=pool, scope=scope)
    plan = plan_for(model, text, base_dir=str(tmp_path))
    (sp,) = plan.sites
    hook = hook_of(model, sp.site)
    (h0,), plain = _capture(model, None, [hook])
    real, pos = MASK.bool().numpy(), positions(MASK).numpy()
    plen = real.sum(1)  # every real position is prompt here
    x = h0.double().numpy()
    if pool == "token":
        values = activation(x, t, 3)
    else:  # the readout of the pooled hidden state, held for the sequence
        pooled = [x[b][real[b]].mean(0) if pool == "prompt.mean" else x[b][real[b]][-1] for b in range(2)]
        values = np.stack([np.full(x.shape[1], activation(p[None], t, 3)[0]) for p in pooled])

    def mask_of(kernel, b):
        m = real[b] & (values[b] > THRESHOLD)
        if scope == "prompt[1:]":
            m &= pos[b] >= 1
        elif scope == "generated":
            m &= pos[b] >= plen[b]
        return m

    (h1,), steered = _capture(model, plan, [hook])
    want = expected_site(sp, h0, mask_of)
    torch.testing.assert_close(h1.double()[MASK.bool()], want[MASK.bool()], rtol=0, atol=1e-10)
    if pool == "token":
        assert 0 < sum(mask_of(None, b).sum() for b in range(2)) < real.sum(), "the gate selects some positions"
        assert not torch.allclose(steered, plain)
    else:  # the whole prompt: no generated position is steered in this one forward pass
        assert torch.equal(steered, plain)


def test_the_emitted_hf_package_equals_the_runtime(tmp_path):
    from hf_util import load_emitted, plan_for

    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = _model()
    write_sae(tmp_path)
    plan = plan_for(model, read_program(), base_dir=str(tmp_path))
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    source = (tmp_path / "pkg" / "__init__.py").read_text(encoding="ascii")
    assert "'sae_feature'" in source
    package = load_emitted(str(tmp_path / "pkg"), "sae_read_pkg")
    with torch.no_grad():
        with install(model, plan):
            runtime = model(input_ids=IDS, attention_mask=MASK).logits
        with package.install(model):
            emitted = model(input_ids=IDS, attention_mask=MASK).logits
        plain = model(input_ids=IDS, attention_mask=MASK).logits
    assert torch.equal(emitted, runtime) and not torch.equal(runtime, plain)


def test_the_vllm_plan_site_function_reads_it_as_the_runtime_does(tmp_path):
    from hf_util import plan_for

    from steerc.runtime import kernels as S
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.steer import SteerState, site_function
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.program import build
    from steerc.targets.vllm.wire import PlanError, boot_sha256, seal, unpack, validate_plan

    model = _model()
    facts = facts_from_model(model)
    write_sae(tmp_path)
    plan = plan_for(model, read_program(), base_dir=str(tmp_path))
    boot, tensors = build(plan, facts)
    (hook,) = boot["hooks"]
    (row,) = hook["sites"][0]["probes"]
    assert row["kind"] == "sae_feature" and tensors[row["tensor"]].shape == (2, HIDDEN)
    assert float(tensors[row["threshold"]][0]) == np.float32(plan.probes[0].threshold)
    obj = unpack(plan_bytes(plan, facts))
    validate_plan(obj, fingerprint=facts.fingerprint)
    del obj["boot"]["hooks"][0]["sites"][0]["probes"][0]["threshold"]
    obj["header"]["boot_sha256"] = boot_sha256(obj["boot"])
    with pytest.raises(PlanError) as info:
        validate_plan(seal(obj), fingerprint=facts.fingerprint)
    assert "threshold" in info.value.field
    n = 8
    state = SteerState(boot, tensors, max_tokens=n, max_slots=2, width=HIDDEN, dtype=torch.float32, device="cpu")
    state.write_metadata(list(range(n)), [n] * n, [0] * n, [True] * n)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(4)) * 2
    got = site_function(state, hook["sites"])(x)
    probe = plan.probes[0]
    values = S.readout("sae_feature", x, torch.from_numpy(np.stack([v.array for v in probe.vectors])), probe.bias,
                       probe.threshold)
    steer = (values > THRESHOLD).unsqueeze(-1)
    want = x + steer * torch.tensor(plan.sites[0].kernels[0].op.bias.array)  # the add of 3 * s[5], folded
    assert torch.equal(state.probe_value("act", n), values)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert 0 < int(steer.sum()) < n


def test_the_serve_format_carries_it(tmp_path):
    from hf_util import plan_for

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.admission import RequestError, check_document
    from steerc.targets.serve.format import to_serve

    model = _model()
    facts = facts_from_model(model)
    write_sae(tmp_path)
    plan = plan_for(model, read_program(), base_dir=str(tmp_path))
    doc, artifacts = to_serve(plan, facts.to_json())
    (probe,) = doc["probes"]
    assert probe["readout"] == "sae_feature" and probe["threshold"] == plan.probes[0].threshold
    assert check_document(doc, facts, artifacts).plan.probes == plan.probes
    del probe["threshold"]
    with pytest.raises(RequestError, match="threshold"):
        check_document(doc, facts, artifacts)
    dotted = plan_for(model, read_program(read="dot(s[3])"), base_dir=str(tmp_path))
    doc, artifacts = to_serve(dotted, facts.to_json())
    assert "threshold" not in doc["probes"][0]
    doc["probes"][0]["threshold"] = 0.5
    with pytest.raises(RequestError, match="threshold"):
        check_document(doc, facts, artifacts)


def test_the_exported_program_gives_the_hf_runtimes_logits(tmp_path, monkeypatch):
    from hf_util import exported_and_runtime
    from tiny_models import save_tiny_llama

    monkeypatch.chdir(tmp_path)
    save_tiny_llama(tmp_path / "model")
    write_sae(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    got, want, plain, _ = exported_and_runtime(tmp_path, read_program(gate=f"act < {THRESHOLD}"))
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert float((want - plain).abs().max()) > 1e-3


def test_explain_names_the_feature(tmp_path):
    from steerc.explain.plan import explain, render

    write_sae(tmp_path)
    text = render(explain(check(tmp_path, read_program(), facts=tiny_facts())))
    assert "act: sae_feature at resid_post[1], pool token" in text
    assert "feature 3 of a jumprelu SAE (d_sae 12, hook blocks.1.hook_resid_post, neuronpedia tiny-s/3)" in text
