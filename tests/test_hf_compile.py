"""torch.compile over a steered model with a static KV cache: the same greedy tokens as eager, no graph break
from steerc, and after one warm-up generation a whole generation under
``torch.compiler.set_stance("fail_on_recompile")`` (two graphs: the prompt's and a decode step's).

Positions come from ``position_ids`` and the padding from the 4-D mask as tensors (see
tests/test_hf_static_cache.py), so nothing steerc reads in the graph is a Python number that changes from step
to step; the check that every planned hook runs happens in an eager warm-up forward, outside the graph; the
``after "..."`` starts are found by ``generate``'s wrapper before the first forward. Most cases compile with
Dynamo's ``eager`` backend (what recompiles and breaks graphs is decided there, before any backend); one
compiles with Inductor, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import load_emitted, plan_for, vec  # noqa: E402
from test_hf_static_cache import PROGRAMS, write_bank  # noqa: E402
from tiny_models import CharTokenizer, tiny_model  # noqa: E402

from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.runtime.hooks import HookNeverRan  # noqa: E402

IDS = torch.tensor([[0, 0, 5, 2, 7, 8], [3, 4, 5, 2, 7, 8]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
NEW = 8
HERE = os.path.dirname(os.path.abspath(__file__))


def fresh():
    """A private copy of the tiny Llama: these tests compile, reroute and hook it (the cached one stays clean)."""
    import copy

    return copy.deepcopy(tiny_model("llama", "float32"))


def generate(model):
    out = model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         eos_token_id=None, cache_implementation="static")
    return out[:, IDS.shape[1]:].tolist()


@pytest.fixture()
def dynamo():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _compiled_run(model, handle_ctx, counters, backend: str = "eager"):
    """(eager tokens, compiled warm-up tokens, tokens under fail_on_recompile) with the steering installed."""
    with handle_ctx:
        eager = generate(model)
        original = model.forward
        model.forward = torch.compile(model.forward, backend=backend)
        try:
            warm = generate(model)
            with torch.compiler.set_stance("fail_on_recompile"):
                fixed = generate(model)
        finally:
            model.forward = original
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    return eager, warm, fixed


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_compiled_generation_steers_as_eager_without_recompiling(name, dynamo, tmp_path):
    model = fresh()
    plan = plan_for(model, PROGRAMS[name], base_dir=write_bank(tmp_path))
    eager, warm, fixed = _compiled_run(model, install(model, plan, CharTokenizer()), dynamo)
    assert warm == eager and fixed == eager


def test_the_emitted_package_compiles_the_same_way(dynamo, tmp_path):
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = fresh()
    plan = plan_for(model, PROGRAMS["gates"])
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    package = load_emitted(str(tmp_path / "pkg"), "steer_compiled_gates")
    eager, warm, fixed = _compiled_run(model, package.install(model, CharTokenizer()), dynamo)
    assert warm == eager and fixed == eager
    with install(model, plan, CharTokenizer()):
        assert generate(model) == eager  # and the in-process runtime agrees


def test_inductor_gives_the_eager_tokens(dynamo):
    model = fresh()
    plan = plan_for(model, PROGRAMS["schedules"])
    eager, warm, fixed = _compiled_run(model, install(model, plan, CharTokenizer()), dynamo, backend="inductor")
    assert warm == eager and fixed == eager


def test_a_compiled_plain_forward_is_checked_eagerly_first(dynamo):
    """Warmed up by hand, a compiled plain forward has no graph break; met unchecked, it runs the check from
    outside its graph; either way it steers as eager."""
    model = fresh()
    plan = plan_for(model, f"steer 1\nintervention x {{\n  at resid_post[1]\n  add 4.0 * {vec(64, 3)}\n}}\n")
    with install(model, plan):
        want = model(input_ids=IDS, attention_mask=MASK).logits
    with install(model, plan) as handle:
        handle.warm_up()
        assert handle.verified
        got = torch.compile(model, backend="eager")(input_ids=IDS, attention_mask=MASK).logits
    assert torch.equal(got, want) and not dynamo["graph_break"]
    torch._dynamo.reset()
    with install(model, plan) as handle:
        got = torch.compile(model, backend="eager")(input_ids=IDS, attention_mask=MASK).logits
        assert handle.verified
    assert torch.equal(got, want)


@pytest.mark.parametrize("how", ["generate", "forward"])
def test_the_warm_up_finds_a_hook_that_never_runs(dynamo, how):
    from test_hf_runtime import _reroute

    model = fresh()
    plan = plan_for(model, f"steer 1\nintervention x {{\n  at mlp_out[1]\n  add 4.0 * {vec(64, 3)}\n}}\n")
    with install(model, plan):
        _reroute(model, 1)
        compiled = torch.compile(model.forward, backend="eager")
        model.forward = compiled
        with pytest.raises(HookNeverRan, match=r"model\.layers\.1\.mlp \(forward hook\)"):
            generate(model) if how == "generate" else compiled(input_ids=IDS, attention_mask=MASK)


SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from tiny_models import CharTokenizer, tiny_model
from hf_util import plan_for
from test_hf_static_cache import PROGRAMS
from test_hf_compile import fresh, generate
from steerc.runtime.hf import install
model = fresh()
with install(model, plan_for(model, PROGRAMS["gates"]), CharTokenizer()):
    model.forward = torch.compile(model.forward, backend="eager")
    generate(model)
    with torch.compiler.set_stance("fail_on_recompile"):
        generate(model)
print("DONE")
"""


def test_torch_logs_show_no_graph_break():
    env = dict(os.environ, TORCH_LOGS="graph_breaks", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=HERE)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    assert "graph break" not in proc.stderr.lower(), proc.stderr[-3000:]


@pytest.mark.parametrize("how", ["forward", "module"])
def test_installing_or_removing_after_compiling_is_never_silent(dynamo, how):
    """Dynamo does not guard on hooks by default: without steerc dropping the compiled code, a graph traced
    before install would run unsteered, and one traced before remove would go on steering."""
    model = fresh()
    plan = plan_for(model, PROGRAMS["schedules"])
    plain = generate(model)
    with install(model, plan, CharTokenizer()):
        steered = generate(model)
    assert steered != plain
    if how == "forward":
        model.forward = torch.compile(model.forward, backend="eager")
    else:
        model.compile(backend="eager")
    assert generate(model) == plain  # traced without hooks
    with install(model, plan, CharTokenizer()):
        assert generate(model) == steered, "the graph traced before install ran unsteered"
    assert generate(model) == plain, "the graph traced with the steering went on steering after remove"


def test_two_models_of_one_class_compiled_with_different_plans_keep_their_own(dynamo):
    model, other = fresh(), fresh()
    plan = plan_for(model, PROGRAMS["schedules"])
    with install(model, plan, CharTokenizer()):
        steered = generate(model)
    plain = generate(other)
    with install(model, plan, CharTokenizer()):
        model.forward = torch.compile(model.forward, backend="eager")
        other.forward = torch.compile(other.forward, backend="eager")
        assert generate(other) == plain and generate(model) == steered
