"""Per-request plans on the vLLM stand-in: each request gets its own steering, and only that.

Requests with different plans (and one with none) share batches; every
request's greedy tokens and logits must equal the HF target running that
request alone with its own plan, and the unsteered request must be
bit-identical to an engine with no steered request at all.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from vllm_standin import StandinEngine, collective_rpc, make_workers  # noqa: E402

from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.serve_client import extra_args  # noqa: E402
from steerc.targets.serve.format import to_serve  # noqa: E402

NEW = 6
PROMPTS = {"a": [5, 2, 7, 8, 9, 10, 11], "b": [11, 12, 2], "plain": [20, 21, 22, 23, 24], "a2": [30, 2, 31, 32]}
PLANS = {
    "A": f"steer 1\nintervention x {{\n  at resid_post[1]\n  add 8.0 * {vec(64, 1)}\n  tokens prompt[-2:], generated\n}}\n",
    "B": ("steer 1\n"
          f"probe p {{\n  at resid_pre[1]\n  read cosine({vec(64, 3)})\n  pool prompt.mean\n}}\n"
          f"intervention y {{\n  at mlp_out[2]\n  ablate {vec(64, 4)}, {vec(64, 5)}\n}}\n"
          f"intervention z {{\n  at resid_post[2]\n  rotate in ({vec(64, 6)}, {vec(64, 7)}) to 90deg\n"
          "  tokens generated\n  when p > -2.0\n}\n"
          "intervention h {\n  at head[1, (0, 2)]\n  scale 0.0\n}\n"),
}
WHICH = {"a": "A", "b": "B", "plain": None, "a2": "A"}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def compiled(model):
    facts = facts_from_model(model)
    out = {}
    for name, text in PLANS.items():
        plan = plan_for(model, text)
        doc, arts = to_serve(plan, facts.to_json())
        out[name] = (plan, extra_args(doc, arts))
    return out


def _hf_alone(model, prompt, plan):
    ids = torch.tensor([prompt])
    kwargs = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None, output_scores=True,
                  return_dict_in_generate=True)
    if plan is None:
        out = model.generate(input_ids=ids, **kwargs)
    else:
        with install(model, plan):
            out = model.generate(input_ids=ids, **kwargs)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.scores, dim=1)[0]


def _engine(model, tmp_path, monkeypatch, chunk=None):
    monkeypatch.setenv("STEERC_ARTIFACTS", str(tmp_path / "store"))
    workers = make_workers(model, extension_cls="steerc.runtime.serve.SteercServeExtension", max_num_seqs=4)
    return workers, StandinEngine(workers, chunk=chunk)


@pytest.mark.parametrize("chunk", [None, 3])
def test_each_request_gets_its_own_plan(model, compiled, tmp_path, monkeypatch, chunk):
    workers, engine = _engine(model, tmp_path, monkeypatch, chunk)
    for rid, prompt in PROMPTS.items():
        plan_name = WHICH[rid]
        engine.add_request(rid, prompt, NEW, extra_args=compiled[plan_name][1] if plan_name else None)
    records = engine.run()
    for rid, prompt in PROMPTS.items():
        plan_name = WHICH[rid]
        tokens, scores = _hf_alone(model, prompt, compiled[plan_name][0] if plan_name else None)
        rec = records[rid]
        assert rec.output_token_ids == tokens, rid
        got = torch.stack([torch.as_tensor(x) for x in rec.logits]).double()
        assert torch.allclose(got, scores.double(), atol=1e-6), (rid, (got - scores).abs().max())
    steered = collective_rpc(workers, "steerc_requests")[0]["steered"]
    assert set(steered) <= {"a", "b", "a2"}  # finished requests are forgotten


def test_unsteered_rows_are_bit_identical(model, compiled, tmp_path, monkeypatch):
    # The same batches, once with nobody steered and once with the neighbours steered.
    runs = []
    for n, steer in enumerate((False, True)):
        _, engine = _engine(model, tmp_path / str(n), monkeypatch)
        engine.add_request("a", PROMPTS["a"], NEW, extra_args=compiled["A"][1] if steer else None)
        engine.add_request("plain", PROMPTS["plain"], NEW)
        engine.add_request("b", PROMPTS["b"], NEW, extra_args=compiled["B"][1] if steer else None)
        runs.append(engine.run())
    want, got = runs[0]["plain"], runs[1]["plain"]
    assert runs[0]["a"].output_token_ids != runs[1]["a"].output_token_ids  # the neighbours were steered
    assert got.output_token_ids == want.output_token_ids
    for x, y in zip(got.logits, want.logits):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_a_tampered_request_runs_unsteered_and_the_engine_goes_on(model, compiled, tmp_path, monkeypatch):
    _, engine = _engine(model, tmp_path, monkeypatch)
    bad = dict(compiled["A"][1])
    arts = json.loads(bad["steerc_artifacts"])
    key = next(iter(arts))
    arts[key] = arts[key][:-8] + "AAAAAAA="
    bad["steerc_artifacts"] = json.dumps(arts)
    engine.add_request("bad", PROMPTS["a"], NEW, extra_args=bad)
    engine.add_request("good", PROMPTS["b"], NEW, extra_args=compiled["B"][1])
    records = engine.run()
    assert records["bad"].output_token_ids == _hf_alone(model, PROMPTS["a"], None)[0]
    assert records["good"].output_token_ids == _hf_alone(model, PROMPTS["b"], compiled["B"][0])[0]
