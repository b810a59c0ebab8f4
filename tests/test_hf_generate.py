"""Generation with steering: scopes under a KV cache, per-row gates, batches, the emitted package."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import load_emitted, plan_for, vec  # noqa: E402
from tiny_models import CharTokenizer, tiny_model  # noqa: E402

from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.targets.hf.emit import emit  # noqa: E402
from steerc.targets.hooks import lower_hf  # noqa: E402

PROMPTS = [[5, 2, 7, 8, 9, 10], [11, 12, 2], [20, 21, 22, 23], [30, 2, 31, 32, 33]]
NEW = 6


def left_pad(rows, pad=0):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def greedy(model, rows, use_cache=True):
    ids, mask = left_pad(rows)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                         use_cache=use_cache, pad_token_id=0, eos_token_id=None)
    return [row[ids.shape[1]:].tolist() for row in out]


SCOPES = ["all", "prompt", "generated", "prompt[-2:]", "generated[:3]", "generated[2:]", "[0, 3]",
          'after "c"', "prompt[-1:], generated"]


def _add_program(scope: str, site: str = "resid_post[1]", strength: float = 12.0) -> str:
    return f"steer 1\nintervention x {{\n  at {site}\n  add {strength} * {vec(64, 21)}\n  tokens {scope}\n}}\n"


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("scope", SCOPES)
def test_cache_and_no_cache_generate_the_same_tokens(family, scope):
    model = tiny_model(family)
    plan = plan_for(model, _add_program(scope))
    with install(model, plan, CharTokenizer()):
        cached = greedy(model, PROMPTS, use_cache=True)
        uncached = greedy(model, PROMPTS, use_cache=False)
    assert cached == uncached


def test_generated_scope_changes_generation_but_not_the_first_token():
    model = tiny_model("llama")
    base = greedy(model, PROMPTS)
    with install(model, plan_for(model, _add_program("generated"))):
        steered = greedy(model, PROMPTS)
    # The first new token is predicted at P-1, a prompt position: `generated` leaves it alone.
    assert [r[0] for r in steered] == [r[0] for r in base]
    assert steered != base


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_batch_of_one_equals_batch_of_four(family):
    model = tiny_model(family)
    plan = plan_for(model, _add_program("prompt[-1:], generated"))
    with install(model, plan):
        together = greedy(model, PROMPTS)
        alone = [greedy(model, [p])[0] for p in PROMPTS]
    assert together == alone


def _probe_values(model, rows):
    """cosine(v) of the prompt-mean hidden state at resid_pre[1], computed directly."""
    v = torch.tensor(eval(vec(64, 33)), dtype=torch.float64)
    values = []
    for r in rows:
        hs = model(input_ids=torch.tensor([r]), output_hidden_states=True).hidden_states[1][0].double()
        mean = hs.mean(dim=0)
        values.append(((mean @ v) / (mean.norm() * v.norm())).item())
    return values


def test_gate_steers_only_the_rows_whose_gate_fires():
    model = tiny_model("llama")
    values = _probe_values(model, PROMPTS)
    ordered = sorted(values)
    threshold = (ordered[1] + ordered[2]) / 2  # two rows above, two below
    text = (
        "steer 1\n"
        f"vector v = {vec(64, 33)}\n"
        "probe topic {\n  at   resid_pre[1]\n  read cosine(v)\n  pool prompt.mean\n}\n"
        f"intervention x {{\n  at     resid_post[2]\n  add    12.0 * {vec(64, 21)}\n  tokens generated\n"
        f"  when   topic > {threshold!r}\n}}\n"
    )
    ungated = text.replace(f"  when   topic > {threshold!r}\n", "").replace(
        "probe topic {\n  at   resid_pre[1]\n  read cosine(v)\n  pool prompt.mean\n}\n", "")
    ungated = ungated.replace(f"vector v = {vec(64, 33)}\n", "")
    base = greedy(model, PROMPTS)
    with install(model, plan_for(model, text)):
        gated = greedy(model, PROMPTS)
        gated_nocache = greedy(model, PROMPTS, use_cache=False)
    with install(model, plan_for(model, ungated)):
        always = greedy(model, PROMPTS)
    assert gated == gated_nocache
    for row, value in enumerate(values):
        want = always[row] if value > threshold else base[row]
        assert gated[row] == want, (row, value, threshold)
    assert sum(v > threshold for v in values) == 2


def test_per_token_gate_matches_between_cache_modes():
    model = tiny_model("gpt2")
    text = (
        "steer 1\n"
        f"probe big {{\n  at   resid_post[0]\n  read dot({vec(64, 40)}) + 0.0\n  pool token\n}}\n"
        f"intervention x {{\n  at     resid_post[1]\n  add    12.0 * {vec(64, 41)}\n  tokens generated\n"
        "  when   big > 0.0\n}\n"
    )
    with install(model, plan_for(model, text)):
        assert greedy(model, PROMPTS) == greedy(model, PROMPTS, use_cache=False)


EMITTED_PROGRAMS = {
    "ops": "steer 1\n"
           f"intervention a {{\n  at resid_pre[0]\n  scale {vec(64, 50)}\n  tokens [0, 2]\n}}\n"
           f"intervention b {{\n  at mlp_out[1]\n  ablate {vec(64, 51)}, {vec(64, 52)}\n  tokens prompt[-2:]\n}}\n"
           f"intervention c {{\n  at head[2, (0, 3)]\n  scale 1.5\n}}\n"
           f"intervention d {{\n  at resid_post[2]\n  rotate in ({vec(64, 53)}, {vec(64, 54)}) to 90deg\n"
           "  tokens generated\n}\n"
           f"intervention e {{\n  at attn_out[3]\n  clamp {vec(64, 55)} to -1.0\n  tokens after \"c\"\n"
           "  preserve norm\n}\n",
    "gates": "steer 1\n"
             f"probe p {{\n  at   resid_post[0]\n  read projected_cosine({vec(64, 60)}, {vec(64, 61)})\n"
             "  pool prompt.last\n}\n"
             f"probe q {{\n  at   head[1, 1]\n  read norm\n  pool token\n}}\n"
             f"intervention x {{\n  at     resid_post[2]\n  add    8.0 * {vec(64, 62)}\n  tokens generated\n"
             "  when   p > -0.5 and not (q < 0.0) or q > 1000.0\n}\n",
}


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
@pytest.mark.parametrize("name", sorted(EMITTED_PROGRAMS))
def test_emitted_package_equals_in_process_runtime(tmp_path, family, name):
    model = tiny_model(family)
    plan = plan_for(model, EMITTED_PROGRAMS[name])
    program = lower_hf(plan, facts_from_model(model))
    out = tmp_path / "pkg"
    emit(program, str(out), "test")
    package = load_emitted(str(out), f"steer_pkg_{family}_{name}")
    ids, mask = left_pad(PROMPTS)
    tok = CharTokenizer()
    with install(model, plan, tok):
        runtime_logits = model(input_ids=ids, attention_mask=mask).logits
        runtime_tokens = greedy(model, PROMPTS)
    with package.install(model, tok):
        emitted_logits = model(input_ids=ids, attention_mask=mask).logits
        emitted_tokens = greedy(model, PROMPTS)
    assert torch.equal(runtime_logits, emitted_logits)
    assert runtime_tokens == emitted_tokens
    source = (out / "__init__.py").read_text()
    assert "import steerc" not in source and "from steerc" not in source
    assert "pickle" not in (out / "_support.py").read_text()


def test_emitted_package_is_deterministic(tmp_path):
    model = tiny_model("llama")
    plan = plan_for(model, EMITTED_PROGRAMS["ops"])
    program = lower_hf(plan, facts_from_model(model))
    emit(program, str(tmp_path / "a"), "same")
    emit(lower_hf(plan_for(model, EMITTED_PROGRAMS["ops"]), facts_from_model(model)), str(tmp_path / "b"), "same")
    for name in ("__init__.py", "_support.py", "tensors.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_emitted_package_refuses_another_model(tmp_path):
    plan = plan_for(tiny_model("llama"), EMITTED_PROGRAMS["ops"])
    emit(lower_hf(plan, facts_from_model(tiny_model("llama"))), str(tmp_path / "p"), "t")
    package = load_emitted(str(tmp_path / "p"), "steer_pkg_wrong")
    with pytest.raises(RuntimeError, match="another model"):
        package.install(tiny_model("gpt2"))
    assert os.path.exists(tmp_path / "p" / "tensors.safetensors")
