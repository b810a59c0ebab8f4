"""The vllm target's plan.msgpack without an engine: deterministic bytes, and a runtime that imports
without vLLM. Everything that needs the engine runs on the real one (tests/engine, ./dev test-vllm)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from steerc.runtime.hf import facts_from_model  # noqa: E402
from steerc.targets.vllm.emit import plan_bytes  # noqa: E402
from steerc.targets.vllm.program import prefix_cache_safe  # noqa: E402
from steerc.targets.vllm.wire import pack, unpack  # noqa: E402

GATED = (
    "steer 1\n"
    f"probe pooled {{\n  at   resid_pre[1]\n  read cosine({vec(64, 33)})\n  pool prompt.mean\n}}\n"
    f"intervention x {{\n  at     resid_post[2]\n  add    9.0 * {vec(64, 21)}\n  tokens generated\n"
    "  when   pooled > 0.1\n}\n"
)


def _boot(text: str) -> dict:
    model = tiny_model("llama")
    return unpack(plan_bytes(plan_for(model, text), facts_from_model(model)))["boot"]


def test_plan_is_deterministic_and_round_trips():
    model = tiny_model("llama")
    a = plan_bytes(plan_for(model, GATED), facts_from_model(model))
    b = plan_bytes(plan_for(model, GATED), facts_from_model(model))
    assert a == b
    assert pack(unpack(a)) == a


@pytest.mark.parametrize("scope, safe", [("all", True), ("[0, 3]", True), ("prompt", False),
                                         ("generated", False), ("prompt[-2:]", False)])
def test_prefix_caching_only_for_plans_it_cannot_change(scope, safe):
    text = f"steer 1\nintervention x {{\n  at resid_post[1]\n  add {vec(64, 1)}\n  tokens {scope}\n}}\n"
    assert prefix_cache_safe(_boot(text)) is safe
    assert prefix_cache_safe(_boot(GATED)) is False, "prompt-pooled probes need every prompt token computed"


def test_runtime_imports_without_vllm():
    assert importlib.util.find_spec("vllm") is None or os.environ.get("STEERC_HAVE_VLLM")
    from steerc.runtime import vllm as rt

    with pytest.raises(ImportError, match="pip install"):
        rt.load("any-model", b"")
