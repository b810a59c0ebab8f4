"""The HF target under a static KV cache (``cache_implementation="static"``): transformers hands the model a
4-D attention mask and ``position_ids`` instead of the 2-D mask, and steerc reads positions and padding from
them. Every op, site kind, scope, schedule, gate (pooled and per-token), a per-layer bank and ``preserve
norm`` generate the same greedy tokens and logits as with the dynamic cache, with and without left padding,
in the in-process runtime and in the emitted package."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import load_emitted, plan_for, vec  # noqa: E402
from test_hf_generate import EMITTED_PROGRAMS  # noqa: E402  (every op, and the gates, as the emitted package runs them)
from tiny_models import CharTokenizer, tiny_model, tolerance  # noqa: E402

from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.targets.hf.emit import emit  # noqa: E402
from steerc.targets.hooks import lower_hf  # noqa: E402

PADDED = [[5, 2, 7, 8, 9, 10], [11, 12, 2], [20, 21, 22, 23], [30, 2, 31, 32, 33]]
SINGLE = [[5, 2, 7, 8, 9, 10, 3]]
NEW = 6

PROGRAMS = {
    "ops": EMITTED_PROGRAMS["ops"],
    "schedules": "steer 1\n"
                 f"intervention a {{\n  at resid_post[1]\n  add 6.0 * decay(0.8) * ramp(3) * {vec(64, 70)}\n"
                 "  tokens prompt[-1:], generated\n}\n"
                 f"intervention b {{\n  at resid_post[2]\n  add 5.0 * window(1, 4) * {vec(64, 71)}\n"
                 "  tokens generated[:5]\n}\n"
                 f"intervention c {{\n  at mlp_out[0]\n  rotate in ({vec(64, 72)}, {vec(64, 73)}) by 30deg\n"
                 "  tokens generated[2:]\n  preserve norm\n}\n",
    "gates": EMITTED_PROGRAMS["gates"]  # and a prompt-pooled mean beside its prompt.last and per-token probes
             + f"probe m {{\n  at   resid_pre[1]\n  read cosine({vec(64, 63)})\n  pool prompt.mean\n}}\n"
             f"intervention y {{\n  at     resid_post[3]\n  add    6.0 * {vec(64, 64)}\n  tokens generated\n"
             "  when   m > 0.0\n}\n",
    "bank": "steer 1\n"
            'vector rows = load("bank.safetensors", key="mean_diff", per_layer=true)\n'
            "intervention x {\n  at resid_post[1:3]\n  add 4.0 * rows\n  tokens all\n}\n",
}


def write_bank(folder) -> str:
    """The per-layer bank the "bank" program loads, written into ``folder``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    save_file({f"mean_diff.{layer}": rng.normal(0, 1, 64).astype(np.float32) for layer in range(4)},
              os.path.join(folder, "bank.safetensors"))
    return str(folder)


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory):
    return write_bank(tmp_path_factory.mktemp("bank"))


def _left_pad(rows):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def generate(model, rows, cache: str):
    """Greedy tokens and each step's logits, ``cache`` being "dynamic" or "static"."""
    ids, mask = _left_pad(rows)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         eos_token_id=None, output_logits=True, return_dict_in_generate=True, **extra)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits, dim=1)


def _same(a, b, tol: float, what: str) -> None:
    assert a[0] == b[0], f"{what}: tokens {a[0]} vs {b[0]}"
    diff = float((a[1] - b[1]).abs().max())
    assert diff <= tol * max(1.0, float(a[1].abs().max())), f"{what}: logits differ by {diff}"


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("rows", [PADDED, SINGLE], ids=["left-padded", "one-row"])
def test_a_static_cache_steers_as_the_dynamic_one(family, name, rows, bank_dir):
    model = tiny_model(family)
    tol = tolerance(family)
    plain_dynamic, plain_static = generate(model, rows, "dynamic"), generate(model, rows, "static")
    _same(plain_dynamic, plain_static, tol, "transformers alone")
    plan = plan_for(model, PROGRAMS[name], base_dir=bank_dir)
    with install(model, plan, CharTokenizer()):
        dynamic, static = generate(model, rows, "dynamic"), generate(model, rows, "static")
    _same(dynamic, static, tol, f"{family} {name}")
    assert dynamic[0] != plain_dynamic[0] or not torch.equal(dynamic[1], plain_dynamic[1]), "the program steers"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_emitted_package_under_a_static_cache_equals_the_runtime(tmp_path, name, bank_dir):
    model = tiny_model("llama")
    plan = plan_for(model, PROGRAMS[name], base_dir=bank_dir)
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    package = load_emitted(str(tmp_path / "pkg"), f"steer_static_{name}")
    with install(model, plan, CharTokenizer()):
        runtime = generate(model, PADDED, "static")
    with package.install(model, CharTokenizer()):
        emitted = generate(model, PADDED, "static")
        dynamic = generate(model, PADDED, "dynamic")
    assert runtime[0] == emitted[0] and torch.equal(runtime[1], emitted[1])
    _same(dynamic, emitted, tolerance("llama"), f"emitted {name}")


def test_a_4d_mask_without_position_ids_is_refused_with_the_reason():
    model = tiny_model("llama")
    plan = plan_for(model, "steer 1\nintervention x {\n  at resid_post[1]\n  scale 2.0\n}\n")
    with install(model, plan):
        mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
        with pytest.raises(ValueError, match="position_ids beside a 4-D"):
            model.model(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=mask)
