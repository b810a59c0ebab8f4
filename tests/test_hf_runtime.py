"""The HF runtime is exact: every op, site and scope against a direct computation.

Each case compiles a one-intervention program for a random-weight tiny model
(float64), runs a left-padded batch with and without steering, captures the
tensor at the site, and compares the steered one with
:func:`steerc.ir.interpret.apply_kernel` applied to the unsteered one.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import capture, count_hooks, expected_site, hook_of, plan_for, positions, vec  # noqa: E402
from tiny_models import FAMILIES, CharTokenizer, tiny_model, tolerance  # noqa: E402

from steerc.runtime.hf import SteerInstallError, install  # noqa: E402

HIDDEN, HEAD_DIM = 64, 16

OPS = {
    "add": lambda w: f"add 3.0 * {vec(w, 1)}",
    "scale": lambda w: "scale 0.5",
    "scale-vector": lambda w: f"scale {vec(w, 2)}",
    "set": lambda w: f"set {vec(w, 3)}",
    "suppress": lambda w: "suppress",
    "ablate": lambda w: f"ablate {vec(w, 4)}, {vec(w, 5)}",
    "clamp": lambda w: f"clamp {vec(w, 6)} to 2.5",
    "rotate-to": lambda w: f"rotate in ({vec(w, 7)}, {vec(w, 8)}) to 60deg",
    "rotate-by": lambda w: f"rotate in ({vec(w, 9)}, {vec(w, 10)}) by -30deg",
    "add-preserve": lambda w: f"add 5.0 * {vec(w, 11)}\n  preserve norm",
}

SITES = ["resid_pre[0]", "resid_pre[2]", "resid_post[3]", "attn_out[1]", "mlp_out[2]", "head[1, 2]"]

# Left-padded batch: row 0 has 2 pads. Token 2 decodes to "c" (for `after "c"`).
IDS = torch.tensor([[0, 0, 5, 2, 7, 8, 9], [11, 12, 13, 2, 15, 16, 17]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])


def _program(site: str, op: str, scope: str = "all") -> str:
    width = HEAD_DIM if site.startswith("head") else HIDDEN
    return f"steer 1\nintervention x {{\n  at {site}\n  {OPS[op](width)}\n  tokens {scope}\n}}\n"


def _run(model, plan=None, tokenizer=None, hook=None):
    store: list = []
    handle = install(model, plan, tokenizer) if plan is not None else None
    try:
        with capture(model, hook, store):
            logits = model(input_ids=IDS, attention_mask=MASK).logits
    finally:
        if handle is not None:
            handle.remove()
    return store[-1], logits


def _scope_mask(scope: str):
    pos = positions(MASK)
    plen = MASK.sum(1)

    def mask_of(kernel, b):
        p = pos[b].numpy()
        real = p >= 0
        if scope == "all":
            m = real
        elif scope == "prompt[-2:]":
            m = real & (p >= plen[b].item() - 2)
        elif scope == "[0, 2]":
            m = real & np.isin(p, [0, 2])
        elif scope == 'after "c"':
            m = real & (p >= (2 if b == 0 else 4))  # "c" is real token 1 of row 0, 3 of row 1
        else:
            raise AssertionError(scope)
        return m

    return mask_of


def _cases():
    # Every op at every site on llama and gpt2 (two layouts); on the other
    # families every op at one residual site and one op at every site.
    for family in FAMILIES:
        for site in SITES:
            for op in sorted(OPS):
                if family in ("llama", "gpt2") or site == "resid_pre[2]" or op in ("add", "ablate"):
                    yield family, site, op


@pytest.mark.parametrize("family,site,op", list(_cases()))
def test_kernel_matches_direct_computation(family, site, op):
    model = tiny_model(family)
    plan = plan_for(model, _program(site, op))
    (sp,) = plan.sites
    hook = hook_of(model, sp.site)
    h0, base = _run(model, hook=hook)
    h1, steered = _run(model, plan, hook=hook)
    columns = (sp.site.head * HEAD_DIM, (sp.site.head + 1) * HEAD_DIM) if sp.site.head is not None else None
    want = expected_site(sp, h0, _scope_mask("all"), columns)
    real = MASK.bool()
    tol = tolerance(family)
    assert torch.allclose(h1[real].double(), want[real], atol=tol, rtol=tol)
    assert torch.equal(h1[~real], h0[~real]) or torch.isnan(h0[~real]).all(), "padding must never be modified"
    if op not in ("scale-vector",):
        assert not torch.allclose(steered, base), "steering must change the logits"


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("scope", ["prompt[-2:]", "[0, 2]", 'after "c"'])
def test_scopes_select_the_right_positions(family, scope):
    model = tiny_model(family)
    plan = plan_for(model, _program("resid_post[1]", "add", scope))
    (sp,) = plan.sites
    hook = hook_of(model, sp.site)
    tok = CharTokenizer()
    h0, _ = _run(model, hook=hook)
    h1, _ = _run(model, plan, tokenizer=tok, hook=hook)
    want = expected_site(sp, h0, _scope_mask(scope))
    real = MASK.bool()
    assert torch.allclose(h1[real], want[real], atol=1e-10)
    assert torch.equal(h1[~real], h0[~real])


def test_after_needs_a_tokenizer():
    model = tiny_model("llama")
    plan = plan_for(model, _program("resid_post[1]", "add", 'after "c"'))
    with pytest.raises(SteerInstallError, match="tokenizer"):
        install(model, plan)


def test_output_hidden_states_show_the_steered_values():
    model = tiny_model("llama")
    plan = plan_for(model, _program("resid_post[1]", "add"))
    base = model(input_ids=IDS, attention_mask=MASK, output_hidden_states=True).hidden_states
    with install(model, plan):
        steered = model(input_ids=IDS, attention_mask=MASK, output_hidden_states=True).hidden_states
    assert torch.equal(steered[1], base[1])  # resid_post[0] untouched
    assert not torch.allclose(steered[2][MASK.bool()], base[2][MASK.bool()])  # resid_post[1] steered


def test_removal_leaves_no_hook_even_when_generation_raises():
    model = tiny_model("qwen2")
    model(input_ids=IDS, attention_mask=MASK)  # let transformers install its own capture hooks first
    before = count_hooks(model)
    plan = plan_for(model, _program("mlp_out[1]", "add"))
    handle = install(model, plan)
    assert count_hooks(model) > before
    with pytest.raises(Exception):
        with handle:
            model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=-5)
    assert count_hooks(model) == before
    assert "generate" not in vars(model)
    handle.remove()  # idempotent
    assert count_hooks(model) == before


def test_wrong_model_is_refused():
    plan = plan_for(tiny_model("llama"), _program("resid_post[1]", "add"))
    with pytest.raises(SteerInstallError, match="another model|fingerprint"):
        install(tiny_model("qwen2"), plan)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_half_and_single_precision_models_run(dtype):
    model = tiny_model("llama", dtype=dtype)
    plan = plan_for(model, _program("resid_post[1]", "ablate"))
    with install(model, plan):
        out = model(input_ids=IDS, attention_mask=MASK).logits
    assert out.dtype == getattr(torch, dtype) and torch.isfinite(out.float()).all()


def test_unknown_family_is_checked_from_discovered_facts_but_not_installed():
    from transformers import AutoConfig, AutoModelForCausalLM

    from steerc.runtime.hf import compile_for, facts_from_model

    cfg = AutoConfig.for_model("olmo", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg)
    facts = facts_from_model(model)
    assert facts.layers == 2 and facts.hidden == 32 and any("model.layers" in g for g in facts.guesses)
    plan = compile_for("steer 1\nintervention x {\n  at resid_post[0]\n  scale 2\n}\n", model)
    with pytest.raises(SteerInstallError, match="no hf site table for the `olmo` family"):
        install(model, plan)
