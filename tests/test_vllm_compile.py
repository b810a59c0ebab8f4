"""The vLLM hooks trace into one graph and keep working without retracing.

vLLM compiles the model with torch.compile (``fullgraph=True``) and captures
CUDA graphs; steerc's hooks must therefore trace without a graph break, and
new metadata or new plan values (written into buffers in place) must be
picked up by the compiled graph without recompiling it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from vllm_standin import make_workers  # noqa: E402

from steerc.runtime.hf import facts_from_model  # noqa: E402
from steerc.runtime.vllm import EXTENSION  # noqa: E402
from steerc.runtime.vllm_steer import register, site_function  # noqa: E402
from steerc.targets.vllm.emit import plan_bytes  # noqa: E402
from steerc.targets.vllm.wire import unpack, validate_plan  # noqa: E402

T = 8
TEXT = (
    "steer 1\n"
    f"probe pooled {{\n  at resid_pre[1]\n  read cosine({vec(64, 33)})\n  pool prompt.mean\n}}\n"
    "probe tok {\n  at resid_post[0]\n  read norm\n  pool token\n}\n"
    f"intervention x {{\n  at mlp_out[1]\n  ablate {vec(64, 21)}\n  tokens generated\n"
    "  when pooled > -2.0 and tok > 0.0\n}\n"
    f"intervention y {{\n  at resid_post[1]\n  rotate in ({vec(64, 1)}, {vec(64, 2)}) by 20deg\n"
    "  tokens prompt[-2:], [3]\n}\n"
)


class PairOut(torch.nn.Module):
    """Stands for a decoder layer's (hidden_states, residual) output."""

    def forward(self, h, r):
        return h, r


@pytest.fixture()
def installed(tmp_path):
    model = tiny_model("llama")
    path = tmp_path / "plan.msgpack"
    path.write_bytes(plan_bytes(plan_for(model, TEXT), facts_from_model(model)))
    workers = make_workers(model, extension_cls=EXTENSION, additional_config={"steerc": {"plan": str(path)}})
    state = workers[0].get_model().steerc
    state.write_metadata(torch.arange(T), torch.full((T,), 5), torch.zeros(T, dtype=torch.long),
                         torch.ones(T, dtype=torch.bool))
    return workers[0].get_model(), state


def _counting(module):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    return torch.compile(module, fullgraph=True, backend=counter), counter


def test_fused_pair_hooks_trace_without_graph_breaks(installed):
    model, state = installed
    h, r = torch.randn(T, 64, dtype=torch.float64), torch.randn(T, 64, dtype=torch.float64)
    for name in ("resid_post_0", "resid_post_1"):
        hook = next(x for x in state.boot["hooks"] if x["name"] == name)
        pair = PairOut()
        register(pair, hook, site_function(state, [dict(s, local_columns=None) for s in hook["sites"]]))
        eager = pair(h, r)
        compiled, counter = _counting(pair)
        out = compiled(h, r)
        assert torch.equal(eager[0], out[0]) and counter.frame_count >= 1


def test_gated_mlp_hook_sees_new_metadata_and_values_without_recompiling(installed):
    model, state = installed
    mlp = model.model.layers[1].mlp
    x = torch.randn(T, 64, dtype=torch.float64)
    compiled, counter = _counting(mlp)
    assert torch.equal(mlp(x)[0], compiled(x)[0])
    frames = counter.frame_count
    # new step: decode positions, so `tokens generated` now applies
    state.write_metadata(torch.arange(T) + 5, torch.full((T,), 5), torch.zeros(T, dtype=torch.long),
                         torch.ones(T, dtype=torch.bool))
    assert torch.equal(mlp(x)[0], compiled(x)[0])
    # new plan values written in place
    fresh = validate_plan(unpack(plan_bytes(plan_for(tiny_model("llama"), TEXT.replace("-2.0", "5.0")),
                                            facts_from_model(tiny_model("llama")))))
    state.write_state(fresh)
    assert torch.equal(mlp(x)[0], compiled(x)[0])
    assert counter.frame_count == frames, "no recompilation"
