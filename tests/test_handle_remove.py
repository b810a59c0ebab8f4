"""``Handle.remove()`` leaves ``model.generate`` as install found it (issue 32).

Before, remove deleted the instance's ``generate`` even when a wrapper of the user's (or another library's) was
there before install, so the user's wrapper silently stopped running.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import config, from_config  # noqa: E402

from steerc.runtime.hf import install  # noqa: E402

PROGRAM = "steer 1\nintervention x {{\n  at resid_post[1]\n  add 3.0 * {v}\n  tokens all\n}}\n"


def _fresh():
    """A model of its own (tiny_model's is shared by the suite, and these tests set its generate)."""
    return from_config(config("llama"), torch.float32).eval()


def _plan(model):
    return plan_for(model, PROGRAM.format(v=vec(model.config.hidden_size, 1)))


def test_a_wrapper_there_before_install_is_put_back():
    model = _fresh()
    calls = []
    original = model.generate

    def mine(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    model.generate = mine
    handle = install(model, _plan(model))
    assert model.generate is not mine  # steerc's wrapper, around the user's
    ids = torch.tensor([[1, 2, 3]])
    model.generate(input_ids=ids, max_new_tokens=1, do_sample=False)
    assert calls == [1]  # the user's wrapper runs inside steerc's
    handle.remove()
    assert model.generate is mine
    model.generate(input_ids=ids, max_new_tokens=1, do_sample=False)
    assert calls == [1, 1]


def test_without_a_wrapper_the_class_method_comes_back():
    model = _fresh()
    handle = install(model, _plan(model))
    assert "generate" in vars(model)
    handle.remove()
    assert "generate" not in vars(model)
    handle.remove()  # idempotent
    assert "generate" not in vars(model)


def test_nested_installs_removed_in_any_order_restore_the_start():
    model = _fresh()
    first = install(model, _plan(model))
    second = install(model, _plan(model))
    first.remove()  # second's wrapper is on top: left alone
    assert "generate" in vars(model)
    second.remove()
    assert vars(model).get("generate") is not None  # second puts back what it found: first's wrapper
    # what first found was no instance attribute; its wrapper is still the instance's, and harmless
    model.generate(input_ids=torch.tensor([[1, 2]]), max_new_tokens=1, do_sample=False)
