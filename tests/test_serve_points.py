"""Steer points (steerc.runtime.vllm.points) inside a compiled graph, on a small torch model.

What the serve plugin relies on when vLLM compiles the model: the graph is traced once with the points in
it, and each later call runs the point's Python body, so steering decided after compilation (a new plan, new
rows) applies without a recompile; an idle point passes its tensor through bit for bit.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from steerc.runtime.vllm import points  # noqa: E402


class Layer(torch.nn.Module):
    """A fused layer: returns (hidden, residual), the stream being their sum (as vLLM's llama layers)."""

    def __init__(self, width: int):
        super().__init__()
        self.mlp = torch.nn.Linear(width, width)

    def forward(self, hidden, residual):
        out = self.mlp(hidden + residual)
        return torch.relu(out), hidden + residual


class Model(torch.nn.Module):
    def __init__(self, width: int = 8, layers: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(Layer(width) for _ in range(layers))

    def forward(self, x):
        hidden, residual = x, torch.zeros_like(x)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return hidden + residual


class Steering:
    """What a router holds: per point, which rows get which bias this step (set between calls)."""

    def __init__(self):
        self.rows: dict[str, list] = {}
        self.ran: list[str] = []

    def one(self, name):
        def body(x):
            self.ran.append(name)
            active = self.rows.get(name)
            if not active:
                return None
            out = x.clone()
            for a, b, bias in active:
                out[a:b] = out[a:b] + bias
            return out
        return body

    def pair(self, name):
        def body(hidden, residual):
            self.ran.append(name)
            active = self.rows.get(name)
            if not active:
                return None
            hidden, residual = hidden.clone(), residual.clone()
            for a, b, bias in active:
                hidden[a:b] = hidden[a:b] + residual[a:b] + bias
                residual[a:b] = 0
            return hidden, residual
        return body


def _steered(seed_model, steering: Steering):
    model = Model()
    model.load_state_dict(seed_model.state_dict())
    for i, layer in enumerate(model.layers):
        points.install(layer, "post", "fused_pair", steering.pair(f"resid_post[{i}]"))
        points.install(layer.mlp, "post", "output", steering.one(f"mlp_out[{i}]"))
    points.install(model.layers[0], "pre", "input", steering.one("resid_pre[0]"))
    return model


def _reference(model, x, rows):
    """The same steering computed directly, without hooks or points."""
    hidden, residual = x.clone(), torch.zeros_like(x)
    for a, b, bias in rows.get("resid_pre[0]", ()):
        hidden[a:b] = hidden[a:b] + bias
    for i, layer in enumerate(model.layers):
        mlp = layer.mlp(hidden + residual)
        for a, b, bias in rows.get(f"mlp_out[{i}]", ()):
            mlp[a:b] = mlp[a:b] + bias
        hidden, residual = torch.relu(mlp), hidden + residual
        for a, b, bias in rows.get(f"resid_post[{i}]", ()):
            hidden[a:b] = hidden[a:b] + residual[a:b] + bias
            residual[a:b] = 0
    return hidden + residual


def _backend() -> str:
    """Inductor where it can build its C++ kernels here, else AOT autograd (the op is opaque to both)."""
    import shutil

    return "inductor" if shutil.which("g++") or shutil.which("c++") else "aot_eager"


def test_points_run_their_python_every_call_of_a_compiled_graph():
    import torch._dynamo

    torch._dynamo.reset()
    base = Model()
    steering = Steering()
    model = _steered(base, steering)
    compiled = torch.compile(model, backend=_backend(), dynamic=True, fullgraph=True)
    x = torch.randn(6, 8)
    with torch.no_grad():
        plain = base(x)
        assert torch.equal(compiled(x), plain), "idle points pass every row through bit for bit"
        assert steering.ran.count("mlp_out[1]") == 1
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        cases = [
            {"mlp_out[1]": [(0, 2, 1.5)]},
            {"resid_post[0]": [(1, 4, -0.5)], "resid_pre[0]": [(5, 6, 2.0)]},
            {"mlp_out[0]": [(0, 1, 0.25)], "mlp_out[2]": [(3, 6, -1.0)], "resid_post[2]": [(2, 3, 3.0)]},
            {},
        ]
        for rows in cases:
            steering.rows = rows
            got = compiled(x)
            want = _reference(base, x, rows)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            untouched = [r for r in range(6) if not any(a <= r < b for v in rows.values() for a, b, _ in v)]
            assert torch.equal(got[untouched], plain[untouched]), rows  # rows no plan touches stay exact
        steering.rows = {}
        y = torch.randn(11, 8)  # another number of tokens: the same (dynamic) graph
        assert torch.equal(compiled(y), base(y))
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames, "no recompilation"
    assert steering.ran.count("mlp_out[1]") == 1 + len(cases) + 1


def test_a_point_never_returns_its_input():
    """Compiled graphs forbid a custom op's output to alias its input: an idle point copies."""
    points._POINTS.append(lambda x: None)
    index = len(points._POINTS) - 1
    x = torch.randn(3, 4)
    out = torch.ops.steerc.point(x, index)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    assert points.SPLITTING_OPS == ("steerc::point", "steerc::point_pair")
