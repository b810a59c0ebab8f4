"""SAE steering and clamping in the language (issue 34): ``sae s = sae("folder")``, ``s[i]``, ``clamp feature``.

* the language: the declarations and ``clamp feature s[i] to c`` parse, format (round trip, idempotent) and
  check; every refusal is a diagnostic with its code and span (a feature index out of range or not whole,
  with d_sae in the message; a folder missing, outside the root or broken; topk and gated clamps; an SAE in
  arithmetic; ``clamp feature`` of a vector; ``d_in`` against the site); the SAE's hook site is checked
  (``vector-site-mismatch``, naming the SAE's site); llamacpp and the vLLM-Hook dialect refuse the clamp;
* ``s[i]`` is the decoder row: ``add 8 * s[0]`` equals ``add`` of that row written out, and only that row
  is read;
* the maths of ``clamp feature`` (the ``sae_clamp`` kernel): the HF runtime equals ``steerc.ir.interpret``
  (float64) and the formula written here, with scopes and a gate; a per-request target; the emitted HF
  package equals the runtime (``torch.equal``); the vllm plan's site function on CPU equals the runtime;
  the serve format admits it.

The fixtures here are SAELens folders written by the test (``cfg.json`` and ``sae_weights.safetensors``, as
``SAE.save_model`` writes them) for the tiny Llama (hidden 64); SAELens itself is compared in
``tests/sae/test_sae_steer_lens.py`` (``./dev test-sae``) on the SmolLM2 fixture.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from steerc.api import Options, check_source
from steerc.diagnostics.codes import (
    FILE_NOT_FOUND,
    INVALID_VALUE,
    INVALID_VECTOR_FILE,
    PATH_ESCAPE,
    SHAPE_MISMATCH,
    TYPE_ERROR,
    UNSUPPORTED_BY_TARGET,
    UNUSED_NAME,
    VECTOR_SITE_MISMATCH,
)

HIDDEN, D_SAE = 64, 12
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "saes")


def sae_tensors(d_in: int = HIDDEN, d_sae: int = D_SAE, architecture: str = "jumprelu", seed: int = 0) -> dict:
    """The tensors of a SAELens SAE of ``architecture``, float32, from ``seed``: thresholds and biases spread
    so that on the tiny model's activations some features fire and some do not."""
    rng = np.random.default_rng(seed)
    t = {"W_enc": rng.normal(size=(d_in, d_sae)) / np.sqrt(d_in), "W_dec": rng.normal(size=(d_sae, d_in)) * 0.5,
         "b_dec": rng.normal(size=d_in) * 0.1}
    if architecture == "gated":
        t.update(b_gate=rng.normal(size=d_sae) * 0.1, b_mag=rng.normal(size=d_sae) * 0.1,
                 r_mag=rng.normal(size=d_sae) * 0.1)
    else:
        t["b_enc"] = rng.normal(size=d_sae) * 0.1
    if architecture == "jumprelu":
        t["threshold"] = np.abs(rng.normal(size=d_sae)) * 0.2
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}


def write_sae(folder, name: str = "s", d_in: int = HIDDEN, d_sae: int = D_SAE, architecture: str = "jumprelu",
              hook: str = "blocks.1.hook_resid_post", seed: int = 0, apply_b_dec_to_input: bool = True,
              **cfg) -> dict:
    """A SAELens 6.x folder ``folder/saes/name`` (as ``SAE.save_model`` writes it); returns its tensors."""
    from safetensors.numpy import save_file

    path = os.path.join(str(folder), "saes", name)
    os.makedirs(path, exist_ok=True)
    t = sae_tensors(d_in, d_sae, architecture, seed)
    save_file(t, os.path.join(path, "sae_weights.safetensors"))
    config = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu", "architecture": architecture,
              "apply_b_dec_to_input": apply_b_dec_to_input, "normalize_activations": "none",
              "metadata": {"sae_lens_version": "6.54.0", "model_name": "tiny-llama", "hook_name": hook,
                           "neuronpedia_id": f"tiny-{name}"}}
    if architecture == "topk":
        config["k"] = 3
    config.update(cfg)
    with open(os.path.join(path, "cfg.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    return t


def formula(h, t, index: int, c: float, architecture: str = "jumprelu", apply_b_dec: bool = True) -> np.ndarray:
    """SAELens's splice with the error term for one clamped feature, in float64, written out in full:
    ``decode(f') + (h - decode(f))`` with ``f`` every feature's activation and ``f'`` it with feature
    ``index`` set to ``c``."""
    h = np.asarray(h, dtype=np.float64)
    w_enc, w_dec, b_dec = (np.asarray(t[k], np.float64) for k in ("W_enc", "W_dec", "b_dec"))
    pre = (h - b_dec * apply_b_dec) @ w_enc + np.asarray(t["b_enc"], np.float64)
    f = np.maximum(pre, 0.0)
    if architecture == "jumprelu":
        f = f * (pre > np.asarray(t["threshold"], np.float64))
    clamped = f.copy()
    clamped[..., index] = c
    return (clamped @ w_dec + b_dec) + (h - (f @ w_dec + b_dec))


def tiny_facts():
    from support import examples_path

    from steerc.facts import load_facts

    return load_facts(os.path.join(examples_path(), "models", "tiny-llama"))


def check(folder, text: str, facts=None, **kw):
    (folder / "steer.toml").write_text("")
    return check_source(text, "sae.steer", path=str(folder / "sae.steer"),
                        options=Options(base_dir=str(folder), root=str(folder)), facts=facts, **kw)


def only(result, code):
    """The one diagnostic of ``code``; every diagnostic has a code and a span."""
    assert all(d.code and d.span is not None for d in result.diagnostics), result.render()
    found = [d for d in result.diagnostics if d.code == code]
    assert len(found) == 1, result.render()
    return found[0]


def spanned(text: str, d) -> str:
    return text[d.span.start:d.span.end]


def program(op: str = "clamp feature s[3] to 2.5", site: str = "resid_post[1]", decls: str = "",
            folder: str = "saes/s", extra: str = "") -> str:
    return (f'steer 1\n\nsae s = sae("{folder}")\n{decls}\n{extra}intervention pin {{\n  at    {site}\n  {op}\n'
            "}\n")


# ------------------------------------------------------------------ the language


def test_a_program_with_an_sae_checks_without_and_with_a_model(tmp_path):
    write_sae(tmp_path)
    text = program(extra="intervention joy {\n  at  resid_post[1]\n  add 8 * s[0]\n}\n\n")
    for facts in (None, tiny_facts()):
        result = check(tmp_path, text, facts=facts)
        assert result.ok and not result.diagnostics, result.render()
    (iv_joy, iv_pin) = result.checked.interventions
    assert iv_pin.op.kind == "clamp_feature" and iv_pin.op.feature == 3 and iv_pin.op.mode == "jumprelu"
    assert iv_pin.op.sae.d_sae == D_SAE and iv_joy.op.kind == "add"


def test_format_round_trip_and_ir_json():
    from steerc.core.source import Source
    from steerc.frontend import parse_source
    from steerc.frontend.fmt import format_source
    from steerc.ir import nodes as ir
    from steerc.ir.serialize import dumps, loads

    messy = ('steer 1\nsae   s=sae( "saes/s" )\nsae tee = sae("saes/t")\nvector feature = [1.0, 2.0]\n'
             "intervention a {\n  at resid_post[1]\n  clamp  feature  s[ 1+2 ]  to 40\n}\n"
             "intervention b {\n  at resid_post[1]\n  clamp (feature) to 4\n}\n"
             "intervention c {\n  at resid_post[1]\n  add 8*tee[0]\n}\n")
    text, diagnostics = format_source(Source("a.steer", messy))
    assert diagnostics == []
    assert 'sae s   = sae("saes/s")\nsae tee = sae("saes/t")\n\nvector feature' in text
    assert "clamp feature s[1 + 2] to 40" in text and "clamp (feature) to 4" in text and "add 8 * tee[0]" in text
    assert format_source(Source("a.steer", text))[0] == text  # idempotent
    program, _ = parse_source(text, "a.steer")
    assert isinstance(program.statements[0], ir.SaeDecl)
    op = program.statements[3].op
    assert isinstance(op, ir.ClampFeature) and op.feature.base == ir.Name("s")
    assert isinstance(program.statements[4].op, ir.Clamp), "a vector called `feature` keeps its parentheses"
    assert loads(dumps(program)) == program and dumps(loads(dumps(program))) == dumps(program)


def test_the_syntax_error_says_what_clamp_feature_takes():
    result = check_source("steer 1\nintervention a {\n  at resid_post[0]\n  clamp feature s[0] 4\n}\n", "x.steer")
    (d,) = [d for d in result.diagnostics if d.is_error]
    assert "`clamp feature s[i]` needs `to`" in d.message and "clamp feature s[0] to 4" in (d.help or "")


@pytest.mark.parametrize("op, decls, code, at, words", [
    ("clamp feature s[12] to 1", "", INVALID_VALUE, "12", "d_sae = 12"),
    ("clamp feature s[-1] to 1", "", INVALID_VALUE, "-1", "d_sae = 12"),
    ("add s[1.5]", "", INVALID_VALUE, "1.5", "whole number"),
    ("add s[n]", "param n = 2.5", INVALID_VALUE, "n", "whole number"),
    ("clamp feature 2 * s[0] to 1", "", TYPE_ERROR, "2 * s[0]", "an SAE's feature"),
    ("clamp feature v to 1", "vector v = [1.0, 2.0]", TYPE_ERROR, "v", "clamp v to c"),
    ("add 2 * s", "", TYPE_ERROR, "2 * s", "no arithmetic"),
    ("add s", "", TYPE_ERROR, "s", "its features"),
    ("add v[0]", "vector v = [1.0, 2.0]", TYPE_ERROR, "v", "picks a feature of an SAE"),
    ("clamp feature s[0] to s[1]", "", TYPE_ERROR, "s[1]", "the number c"),
    ("add s[0]", 'vector w = sae("saes/s")', TYPE_ERROR, 'sae("saes/s")', "its features"),
])
def test_every_misuse_is_a_diagnostic_at_its_operand(tmp_path, op, decls, code, at, words):
    write_sae(tmp_path)
    text = program(op=op, decls=decls)
    d = only(check(tmp_path, text), code)
    assert spanned(text, d) == at and words in (d.message + " " + (d.help or "")), d.message


@pytest.mark.parametrize("folder, code, words", [
    ("saes/nothing", FILE_NOT_FOUND, "does not exist"),
    ("../outside", PATH_ESCAPE, "leaves the project root"),
    ("saes/broken", INVALID_VECTOR_FILE, "cfg.json"),
    ("saes/short", INVALID_VECTOR_FILE, "W_dec"),
])
def test_a_folder_that_cannot_be_read_is_a_diagnostic_at_the_path(tmp_path, folder, code, words):
    write_sae(tmp_path, "broken")
    (tmp_path / "saes" / "broken" / "cfg.json").write_text("{not json")
    write_sae(tmp_path, "short")
    weights = tmp_path / "saes" / "short" / "sae_weights.safetensors"
    from safetensors.numpy import save_file

    t = sae_tensors()
    t["W_dec"] = t["W_dec"][:5]
    save_file(t, str(weights))
    (tmp_path.parent / "outside").mkdir(exist_ok=True)
    text = program(folder=folder)
    d = only(check(tmp_path, text), code)
    assert spanned(text, d) == f'"{folder}"' and words in d.message, d.message


def test_a_link_out_of_the_root_is_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    write_sae(outside)
    project = tmp_path / "project"
    (project / "saes").mkdir(parents=True)
    os.symlink(outside / "saes" / "s" / "sae_weights.safetensors", project / "saes" / "w")
    shutil.copytree(outside / "saes" / "s", project / "saes" / "s", ignore=shutil.ignore_patterns("*.safetensors"))
    os.symlink(outside / "saes" / "s" / "sae_weights.safetensors", project / "saes" / "s" / "sae_weights.safetensors")
    text = program()
    d = only(check(project, text), PATH_ESCAPE)
    assert spanned(text, d) == '"saes/s"'


@pytest.mark.parametrize("architecture, words", [("topk", "whole encoder"), ("gated", "gate path")])
def test_topk_and_gated_clamps_are_refused_saying_why(tmp_path, architecture, words):
    write_sae(tmp_path, architecture=architecture)
    text = program()
    d = only(check(tmp_path, text), INVALID_VALUE)
    assert spanned(text, d) == "s[3]" and architecture in d.message and words in d.message
    assert d.help and "add c * s[i]" in d.help
    assert check(tmp_path, program(op="add 2 * s[3]")).ok, "steering along the feature works"


def test_only_the_rows_used_are_read(tmp_path):
    t = write_sae(tmp_path)
    result = check(tmp_path, program(op="add 8 * s[5]"), facts=tiny_facts())
    assert result.ok, result.render()
    sae = result.checked.interventions[0].op.vectors  # the folded vector
    np.testing.assert_array_equal(np.asarray(sae[0]), 8.0 * t["W_dec"][5].astype(np.float64))
    (site,) = result.plan.sites
    assert site.kernels[0].op.bias.array.tolist() == (8.0 * t["W_dec"][5].astype(np.float64)).astype(
        np.float32).tolist()


def test_add_s_i_is_the_add_of_its_row_written_out(tmp_path):
    from safetensors.numpy import save_file

    t = write_sae(tmp_path)
    save_file({"row": t["W_dec"][4]}, str(tmp_path / "row.safetensors"))
    via_sae = check(tmp_path, program(op="add 8 * s[4] + s[1]"), facts=tiny_facts())
    written = check(tmp_path, program(op="add 8 * r + q", decls='vector r = load("row.safetensors", key="row")\n'
                                      f"vector q = [{', '.join(repr(float(x)) for x in t['W_dec'][1])}]"),
                    facts=tiny_facts())
    assert via_sae.ok and written.ok, (via_sae.render(), written.render())
    a, b = via_sae.plan.sites[0].kernels[0].op, written.plan.sites[0].kernels[0].op
    assert np.array_equal(a.bias.array, b.bias.array) and a.scale == b.scale


def test_the_sites_are_checked_against_the_saes_hook(tmp_path):
    write_sae(tmp_path, hook="blocks.1.hook_resid_post")
    for site in ("resid_post[1]", "resid_pre[2]"):  # the same point of the residual stream
        assert not check(tmp_path, program(site=site), facts=tiny_facts()).diagnostics
    for site, used in (("resid_post[0]", "resid_post[0]"), ("mlp_out[1]", "mlp_out[1]"),
                       ("resid_pre[0:2]", "resid_pre[0], resid_pre[1]")):
        text = program(site=site)
        result = check(tmp_path, text, facts=tiny_facts())
        d = only(result, VECTOR_SITE_MISMATCH)
        assert result.ok and not d.is_error
        assert "resid_post[1]" in d.message and "blocks.1.hook_resid_post" in d.message and used in d.message
        assert spanned(text, d) == "s[3]" and "resid_post[1]" in d.help
    text = program(op="add s[0]", site="attn_out[1]").replace("intervention", "probe p {\n  at resid_post[0]\n"
                                                                "  read cosine(s[2])\n  pool prompt.last\n}\n\n"
                                                                "intervention", 1)
    result = check(tmp_path, text)
    assert sorted(spanned(text, d) for d in result.diagnostics if d.code == VECTOR_SITE_MISMATCH) == \
        ["s[0]", "s[2]"]


def test_d_in_against_the_site_width(tmp_path):
    write_sae(tmp_path, d_in=32)
    text = program()
    result = check(tmp_path, text, facts=tiny_facts())
    d = only(result, SHAPE_MISMATCH)
    assert "d_in = 32" in d.message and "64 wide" in d.message and spanned(text, d) == "s[3]"
    text = program(op="add s[3]")
    d = only(check(tmp_path, text, facts=tiny_facts()), SHAPE_MISMATCH)
    assert spanned(text, d) == "s[3]" and "32" in d.message
    assert check(tmp_path, program()).ok, "without a model the width is not known"


def test_an_unused_sae_is_a_warning(tmp_path):
    write_sae(tmp_path)
    text = program(op="add [1.0, 2.0]")
    d = only(check(tmp_path, text), UNUSED_NAME)
    assert "sae `s`" in d.message


@pytest.mark.parametrize("target", ["llamacpp", "vllm-hook"])
def test_llamacpp_and_vllm_hook_refuse_it(tmp_path, target):
    from steerc.targets.capabilities import TARGETS, check_target

    write_sae(tmp_path)
    text = program()
    result = check(tmp_path, text, facts=tiny_facts())
    check_target(result, target)
    d = only(result, UNSUPPORTED_BY_TARGET)
    assert spanned(text, d) == "clamp feature s[3] to 2.5" and d.is_error
    assert not TARGETS[target].supports("op:clamp-feature") and TARGETS[target].get("op:clamp-feature").note
    for good in ("hf", "vllm", "serve", "export"):
        fine = check(tmp_path, text, facts=tiny_facts())
        check_target(fine, good)
        assert fine.ok, (good, fine.render())


# ------------------------------------------------------------------ the maths

torch = pytest.importorskip("torch")
IDS = torch.tensor([[0, 0, 5, 2, 7, 8, 9], [11, 12, 13, 2, 15, 16, 17]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
PROBE_W = np.linspace(-1.0, 1.0, HIDDEN)


def _model():
    from tiny_models import tiny_model

    return tiny_model("llama")  # float64


def _capture(model, plan, hooks, params=None):
    import contextlib

    from hf_util import capture

    from steerc.runtime.hf import install

    stores = [[] for _ in hooks]
    with contextlib.ExitStack() as stack, torch.no_grad():
        if plan is not None:
            stack.enter_context(install(model, plan, params=params))
        for hook, store in zip(hooks, stores):
            stack.enter_context(capture(model, hook, store))
        logits = model(input_ids=IDS, attention_mask=MASK).logits
    return [s[-1] for s in stores], logits


@pytest.mark.parametrize("architecture, scope, gated, apply_b_dec, preserve", [
    ("jumprelu", "all", False, True, False), ("jumprelu", "prompt[-2:]", False, True, False),
    ("standard", "[0, 2]", False, True, False), ("standard", "all", False, False, False),
    ("jumprelu", "all", True, True, False), ("jumprelu", "prompt[1:]", True, False, False),
    ("jumprelu", "all", False, True, True),
])
def test_the_hf_runtime_equals_the_interpreter_and_the_formula(tmp_path, architecture, scope, gated, apply_b_dec,
                                                                preserve):
    from hf_util import expected_site, hook_of, plan_for, scoped

    model = _model()
    t = write_sae(tmp_path, architecture=architecture, apply_b_dec_to_input=apply_b_dec)
    probe = ("probe p {\n  at   resid_post[0]\n  read dot([" + ", ".join(f"{x:.6f}" for x in PROBE_W) + "])\n"
             "  pool token\n}\n\n") if gated else ""
    text = program(op=f"clamp feature s[3] to 2.5\n  tokens {scope}" + ("\n  when   p > 0.0" if gated else "")
                   + ("\n  preserve norm" if preserve else ""), extra=probe)
    plan = plan_for(model, text, base_dir=str(tmp_path))
    (sp,) = plan.sites
    assert type(sp.kernels[0].op).__name__ == "SaeClamp"
    hook, probe_hook = hook_of(model, sp.site), hook_of(model, type(sp.site)("resid_post", 0))
    (h0, p0), plain = _capture(model, None, [hook, probe_hook])
    (h1,), steered = _capture(model, plan, [hook])
    values = p0.double().numpy() @ np.asarray([float(f"{x:.6f}") for x in PROBE_W])
    mask_of = scoped(MASK, scope, values if gated else None)
    real = MASK.bool().numpy()

    want = expected_site(sp, h0, mask_of)  # steerc.ir.interpret, float64
    torch.testing.assert_close(h1.double()[MASK.bool()], want[MASK.bool()], rtol=0, atol=1e-10)
    direct = h0.double().numpy().copy()
    for b in range(direct.shape[0]):
        m = mask_of(None, b)
        new = formula(direct[b, m], t, 3, 2.5, architecture, apply_b_dec)
        if preserve:  # rescaled to the norm of its input
            new = new * (np.linalg.norm(direct[b, m], axis=-1) / np.linalg.norm(new, axis=-1))[:, None]
        direct[b, m] = new
    assert np.abs(h1.double().numpy()[real] - direct[real]).max() <= 1e-5  # the splice, written out here
    assert torch.equal(h1[~MASK.bool()], h0[~MASK.bool()]), "padding is never modified"
    assert not torch.allclose(steered, plain)
    if gated:
        assert 0 < sum(mask_of(None, b).sum() for b in range(2)) < real.sum(), "the gate selects some positions"


def test_the_clamp_moves_h_along_the_decoder_row_only(tmp_path):
    """``h`` changes only along ``W_dec[i]``, by ``c - f_i(h)``: where the feature already reads ``c`` nothing
    changes (the splice's error term keeps everything the SAE does not explain)."""
    from steerc.io.sae import read_sae
    from steerc.ir.interpret import apply_op
    from steerc.passes.lower_plan import _sae_clamp

    write_sae(tmp_path)
    result = check(tmp_path, program(op="clamp feature s[3] to 2.5"))
    op = _sae_clamp(result.checked.interventions[0].op)
    h = np.random.default_rng(1).normal(size=(20, HIDDEN))
    out = apply_op(op, h)
    sae = read_sae(str(tmp_path / "saes" / "s"))
    w_dec = sae.decoder_row(3).astype(np.float64)
    f = sae.feature_activation(h.astype(np.float32), 3).astype(np.float64)
    np.testing.assert_allclose(out - h, np.outer(2.5 - f, w_dec), atol=1e-5)
    assert 0 < (f > 0).sum() < 20, "the feature fires on some rows and not on others"


def test_a_per_request_target(tmp_path):
    from hf_util import hook_of, plan_for

    model = _model()
    t = write_sae(tmp_path)
    text = program(op="clamp feature s[3] to 2 * c", decls="param c = 1.5 in [0, 10] per request")
    plan = plan_for(model, text, base_dir=str(tmp_path))
    (sp,) = plan.sites
    hook = hook_of(model, sp.site)
    (h0,), _ = _capture(model, None, [hook])
    real = MASK.bool().numpy()
    for value in (None, 4.0):
        (h1,), _ = _capture(model, plan, [hook], params=None if value is None else {"c": value})
        c = 2 * (1.5 if value is None else value)
        want = formula(h0.double().numpy()[real], t, 3, c)
        assert np.abs(h1.double().numpy()[real] - want).max() <= 1e-5, value


def test_the_emitted_hf_package_equals_the_runtime(tmp_path):
    import ast

    from hf_util import load_emitted, plan_for

    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = _model()
    write_sae(tmp_path)
    plan = plan_for(model, program(op="clamp feature s[3] to 2.5\n  tokens prompt[1:]"), base_dir=str(tmp_path))
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    source = (tmp_path / "pkg" / "__init__.py").read_text(encoding="ascii")
    assert "def kernel_sae_clamp(S, x, o, mode):" in source
    ast.parse(source)
    package = load_emitted(str(tmp_path / "pkg"), "sae_pkg")
    with torch.no_grad():
        with install(model, plan):
            runtime = model(input_ids=IDS, attention_mask=MASK).logits
        with package.install(model):
            emitted = model(input_ids=IDS, attention_mask=MASK).logits
    assert torch.equal(emitted, runtime)


def test_the_vllm_plan_site_function_equals_the_runtime(tmp_path):
    from hf_util import plan_for

    from steerc.ir.interpret import apply_op
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm.steer import SteerState, site_function
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.program import build
    from steerc.targets.vllm.wire import unpack, validate_plan

    model = _model()
    facts = facts_from_model(model)
    t = write_sae(tmp_path)
    plan = plan_for(model, program(), base_dir=str(tmp_path))
    boot, tensors = build(plan, facts)
    (hook,) = boot["hooks"]
    (kernel,) = hook["sites"][0]["kernels"]
    assert kernel["kind"] == "sae_clamp" and sorted(kernel["tensors"]) == sorted(
        ["enc", "b_enc", "threshold", "b_dec", "dec", "target"])
    validate_plan(unpack(plan_bytes(plan, facts)), fingerprint=facts.fingerprint)
    n = 6
    state = SteerState(boot, tensors, max_tokens=n, max_slots=2, width=HIDDEN, dtype=torch.float32, device="cpu")
    state.write_metadata(list(range(n)), [n] * n, [0] * n, [True] * n)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(0)) * 2
    got = site_function(state, hook["sites"])(x)
    want = apply_op(plan.sites[0].kernels[0].op, x.double().numpy())
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(want, formula(x.double().numpy(), t, 3, 2.5), rtol=0, atol=1e-5)


def test_the_serve_format_admits_it(tmp_path):
    from hf_util import plan_for

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.serve.admission import check_document, schema
    from steerc.targets.serve.format import to_serve

    model = _model()
    facts = facts_from_model(model)
    write_sae(tmp_path)
    plan = plan_for(model, program(), base_dir=str(tmp_path))
    assert {"const": "sae_clamp"} in [o["properties"]["kind"] for o in schema()["$defs"]["op"]["oneOf"]]
    doc, artifacts = to_serve(plan, facts.to_json())
    op = doc["sites"][0]["kernels"][0]["op"]
    assert op["kind"] == "sae_clamp" and op["mode"] == "jumprelu" and op["target"] == 2.5
    assert check_document(doc, facts, artifacts).plan.sites == plan.sites


def test_explain_shows_the_sae_and_the_feature(tmp_path):
    from steerc.explain.plan import explain, render

    write_sae(tmp_path)
    result = check(tmp_path, program(), facts=tiny_facts())
    text = render(explain(result))
    assert "sae_clamp" in text and "c = 2.5" in text and "feature 3 of a jumprelu SAE" in text
    assert "d_sae 12" in text and "blocks.1.hook_resid_post" in text and "neuronpedia tiny-s/3" in text


def test_the_smollm2_fixture_checks_against_smollm2(tmp_path):
    """The shipped SAELens fixture (d_in 576, blocks.8.hook_resid_post) against SmolLM2's facts."""
    shutil.copytree(os.path.join(FIXTURES, "smollm2-l8"), tmp_path / "saes" / "smollm2-l8")
    from support import examples_path

    from steerc.facts import load_facts

    facts = load_facts(os.path.join(examples_path(), "models", "real", "smollm2-135m-instruct"))
    text = program(folder="saes/smollm2-l8", site="resid_post[8]", op="clamp feature s[0] to 40")
    result = check(tmp_path, text, facts=facts)
    assert result.ok and not result.diagnostics, result.render()
    assert result.plan.sites[0].kernels[0].op.mode == "jumprelu"
    result = check(tmp_path, program(folder="saes/smollm2-l8", site="resid_post[7]", op="add 8 * s[0]"), facts=facts)
    assert [d.code for d in result.diagnostics] == [VECTOR_SITE_MISMATCH] and result.ok


def test_the_examples_fixture_is_what_its_recipe_makes(tmp_path):
    """``tests/fixtures/examples/saes/tiny-l1`` (the spec's examples use it) is ``write_sae``'s, byte for byte."""
    from support import examples_path

    write_sae(tmp_path, "tiny-l1", hook="blocks.1.hook_resid_post", seed=7)
    for name in ("cfg.json", "sae_weights.safetensors"):
        with open(os.path.join(examples_path(), "saes", "tiny-l1", name), "rb") as stored, \
                open(tmp_path / "saes" / "tiny-l1" / name, "rb") as made:
            assert stored.read() == made.read(), name


def test_hover_completion_and_highlighting(tmp_path):
    from steerc.highlight.pygments_lexer import SteerLexer
    from steerc.lsp.analysis import Analysis
    from steerc.lsp.complete import complete
    from steerc.lsp.hover import hover

    t = write_sae(tmp_path)
    text = program(extra="intervention joy {\n  at  resid_post[1]\n  add 2 * s[5]\n}\n\n")
    analysis = Analysis(check(tmp_path, text))
    shown = hover(analysis, text.index("s = "))
    assert shown.startswith("**sae `s`**: jumprelu, d_in 64, d_sae 12")
    assert "`blocks.1.hook_resid_post` (`resid_post[1]`)" in shown and "Neuronpedia `tiny-s`" in shown
    assert "folder `saes/s`" in shown and "feature" not in shown
    at_use = hover(analysis, text.index("s[5]"))
    norm = float(np.linalg.norm(t["W_dec"][5].astype(np.float64)))
    assert f"feature 5: as a vector its decoder row `W_dec[5]`, norm {norm:.4g}" in at_use
    assert "Neuronpedia feature `tiny-s/5`" in at_use and "`read s[5]` reads its activation" in at_use  # issue 37
    assert "splice with the error term" in hover(analysis, text.index("pin {"))
    before = text[:text.index("intervention joy")] + "intervention y {\n  at resid_post[1]\n  clamp feature "
    assert [c.label for c in complete(before, len(before))] == ["s"]
    assert "clamp feature" in [c.label for c in complete("steer 1\nintervention y {\n  ", 28)]
    assert "sae" in [c.label for c in complete("steer 1\n", len("steer 1\n"))]
    assert "sae" in [c.label for c in complete("steer 1\nsae t = ", len("steer 1\nsae t = "))]
    tokens = {(str(kind), value) for kind, value in SteerLexer().get_tokens(text)}
    assert ("Token.Keyword.Declaration", "sae") in tokens and ("Token.Name.Builtin", "sae") in tokens
    assert ("Token.Name.Variable", "s") in tokens
    clamp = [(str(kind), value) for kind, value in SteerLexer().get_tokens(text) if value.strip()]
    at = clamp.index(("Token.Keyword", "clamp"))
    assert clamp[at + 1] == ("Token.Keyword", "feature") and clamp[at + 2] == ("Token.Name", "s")


@pytest.mark.parametrize("method, op", [("decoder_row", "add s[3]"), ("encoder_column", "clamp feature s[3] to 1")])
def test_a_file_unreadable_after_its_header_is_a_diagnostic(tmp_path, monkeypatch, method, op):
    """The weights file going away (or failing) between the header and a row is a diagnostic at ``s[i]``."""
    from steerc.io.sae import SAE

    def fail(self, index):
        raise OSError(5, "Input/output error")

    write_sae(tmp_path)
    monkeypatch.setattr(SAE, method, fail)
    text = program(op=op)
    d = only(check(tmp_path, text), INVALID_VECTOR_FILE)
    assert spanned(text, d) == "s[3]" and "Input/output error" in d.message


# ------------------------------------------------------------------ the command line and the export target


def test_the_command_line_compiles_it_where_it_runs_and_refuses_it_where_it_does_not(tmp_path, monkeypatch):
    from support import examples_path, run_cli

    monkeypatch.chdir(tmp_path)
    write_sae(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(program())
    model = os.path.join(examples_path(), "models", "tiny-llama")
    for target in ("hf", "vllm", "serve"):
        code, _, err = run_cli(["compile", "p.steer", "--model", model, "--target", target, "-o", f"out_{target}"])
        assert code == 0, err
    for argv in (["--target", "llamacpp"], ["--target", "serve", "--dialect", "vllm-hook"]):
        code, _, err = run_cli(["compile", "p.steer", "--model", model, *argv, "-o", "refused"])
        assert code == 1 and "error[unsupported-by-target]" in err and "clamp feature s[3] to 2.5\n  |   ^^^^" in err
        assert not (tmp_path / "refused").exists()
    (tmp_path / "bad.steer").write_text(program(op="clamp feature s[40] to 1"))
    code, _, err = run_cli(["compile", "bad.steer", "--model", model, "--target", "hf", "-o", "bad"])
    assert code == 1 and "error[invalid-value]" in err and "d_sae = 12" in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


def test_the_exported_program_gives_the_hf_runtimes_logits(tmp_path, monkeypatch):
    """--target export traces the sae_clamp kernel into the exported graph; its operands are buffers."""
    from hf_util import exported_and_runtime
    from tiny_models import save_tiny_llama

    monkeypatch.chdir(tmp_path)
    save_tiny_llama(tmp_path / "model")
    write_sae(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    text = program(op="clamp feature s[3] to 2.5\n  tokens prompt[1:]")
    got, want, plain, buffers = exported_and_runtime(tmp_path, text)
    assert buffers >= {"enc", "b_dec", "dec"}, buffers
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert float((want - plain).abs().max()) > 1e-3


def test_a_vector_made_from_a_feature_keeps_the_saes_site(tmp_path):
    """``vector v = 2 * s[0]`` used at another site is warned about at the use, naming the vector."""
    write_sae(tmp_path, hook="blocks.1.hook_resid_post")
    text = program(op="add v", site="resid_post[2]", decls="vector v = 2 * s[0]\nvector w = v + s[1]")
    text = text.replace("add v", "add v\n}\n\nintervention other {\n  at  resid_post[1]\n  add w")
    result = check(tmp_path, text)
    d = only(result, VECTOR_SITE_MISMATCH)
    assert result.ok and text[d.span.start:d.span.end] == "v" and "`v` is made from `s[...]`" in d.message
    assert "resid_post[2]" in d.message


def test_an_sae_of_a_hook_without_a_site_is_warned_about(tmp_path):
    write_sae(tmp_path, hook="blocks.1.hook_resid_mid")
    text = program(op="add s[0]")
    d = only(check(tmp_path, text), VECTOR_SITE_MISMATCH)
    assert "cannot tell where it belongs" in d.message and "resid_mid" in d.message


def test_a_per_request_param_in_a_feature_index_is_refused_there(tmp_path):
    from steerc.diagnostics.codes import PER_REQUEST_PARAM

    write_sae(tmp_path)
    for op in ("add c * s[c]", "clamp feature s[c] to c", "add s[2 * c]"):
        text = program(op=op, decls="param c = 2 per request")
        d = only(check(tmp_path, text), PER_REQUEST_PARAM)
        index = text.index("s[", text.index("intervention")) + 2
        assert d.span.start >= index and spanned(text, d) == "c" and "feature index" in d.message, op
