"""Steer points (steerc.runtime.vllm.points) inside a compiled graph, on a small torch model.

What the serve plugin relies on when vLLM compiles the model: the graph is traced once with the points in
it, and each later call runs the point's Python body, so steering decided after compilation (a new plan, new
rows) applies without a recompile; a point steers its tensor in place, and an idle point writes nothing.
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
        self.embed = torch.nn.Linear(width, width)  # the stream starts as a new tensor, as vLLM's embedding
        self.layers = torch.nn.ModuleList(Layer(width) for _ in range(layers))

    def forward(self, x):
        hidden = self.embed(x)
        residual = torch.zeros_like(hidden)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return hidden + residual


class Steering:
    """What a router holds: per point, which rows get which bias this step (set between calls)."""

    def __init__(self):
        self.rows: dict[str, list] = {}
        self.ran: list[str] = []

    def one(self, name):
        def body(x):  # in place, as the router's bodies
            self.ran.append(name)
            for a, b, bias in self.rows.get(name, ()):
                x[a:b] += bias
        return body

    def pair(self, name):
        def body(hidden, residual):
            self.ran.append(name)
            for a, b, bias in self.rows.get(name, ()):
                hidden[a:b] = hidden[a:b] + residual[a:b] + bias
                residual[a:b] = 0
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
    hidden = model.embed(x)
    residual = torch.zeros_like(hidden)
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


def test_a_point_steers_in_place_and_an_idle_point_writes_nothing():
    """The op mutates its input (compiled graphs let a mutating op run in place): an idle point costs its call
    and writes nothing, with no copy; a steered point writes its rows into the tensor itself. A tensor that is
    not contiguous is steered through a contiguous copy and written back."""
    def nothing(t):
        return None

    idle = points.register(nothing)
    x = torch.randn(3, 4)
    before, address = x.clone(), x.data_ptr()
    assert torch.ops.steerc.point(x, idle) is None
    assert torch.equal(x, before) and x.data_ptr() == address

    def steer(t):
        t[1:2] += 1.0

    busy = points.register(steer)
    torch.ops.steerc.point(x, busy)
    assert torch.equal(x[1], before[1] + 1.0) and torch.equal(x[[0, 2]], before[[0, 2]])
    t = torch.randn(4, 3).T  # [3, 4], not contiguous
    was = t.clone()
    torch.ops.steerc.point(t, busy)
    assert torch.equal(t[1], was[1] + 1.0) and torch.equal(t[[0, 2]], was[[0, 2]])
    assert points.SPLITTING_OPS == ("steerc::point", "steerc::point_pair")


def test_the_points_table_keeps_no_model_alive():
    """The points' table finds a body by its index and holds it weakly: once the hook is removed, nothing keeps
    the body (its router, its model) alive, as where vLLM runs engines in the caller's process one after
    another (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    import gc
    import weakref

    model = torch.nn.Linear(4, 4)
    runs = []

    def body(t):
        runs.append(t.shape)

    alive = weakref.ref(body)
    handle = points.install(model, "post", "output", body)
    model(torch.randn(2, 4))
    assert runs == [(2, 4)]  # the op found the body by its index
    del body
    gc.collect()
    assert alive() is not None  # the hook holds it
    handle.remove()
    gc.collect()
    assert alive() is None  # the table did not


def test_inductor_runs_the_points_in_place_with_no_copy():
    """What the in-place op buys: Inductor's compiled model calls each point on the hooked buffer itself, with no
    copy of the tensor around it (a functional op had to return a new tensor: a copy per point per step)."""
    import shutil

    import torch._dynamo
    from torch._inductor.utils import run_and_get_code

    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("Inductor's C++ kernels need a compiler")
    torch._dynamo.reset()
    base = Model()
    steering = Steering()
    model = _steered(base, steering)
    compiled = torch.compile(model, backend="inductor", dynamic=True, fullgraph=True)
    x = torch.randn(6, 8)
    with torch.no_grad():
        steering.rows = {"mlp_out[1]": [(0, 2, 1.5)], "resid_post[0]": [(1, 4, -0.5)]}
        got, (code, *_) = run_and_get_code(compiled, x)
        torch.testing.assert_close(got, _reference(base, x, steering.rows), rtol=1e-5, atol=1e-5)
    calls = code.count("torch.ops.steerc.point.default(") + code.count("torch.ops.steerc.point_pair.default(")
    assert calls == 7, code  # every point: resid_pre[0], then mlp_out and resid_post at each of 3 layers
    assert "clone" not in code and "copy_" not in code, code
