"""The vLLM target against the HF target, on the CPU stand-in of vLLM.

The same checked program is compiled twice: to the HF runtime (installed on
the tiny HF llama) and to ``plan.msgpack`` (installed through
:class:`steerc.runtime.vllm.SteercWorkerExtension` on the stand-in built
from the same weights). Greedy tokens must be identical and the logits at
every step close: both compute with the same kernels and float32 parameters.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from vllm_standin import StandinEngine, collective_rpc, make_workers  # noqa: E402

from steerc.runtime.hf import facts_from_model, install  # noqa: E402
from steerc.runtime.vllm import EXTENSION, check_coverage  # noqa: E402
from steerc.targets.vllm.emit import plan_bytes  # noqa: E402
from steerc.targets.vllm.wire import PlanError, pack, unpack  # noqa: E402

PROMPTS = [[5, 2, 7, 8, 9, 10, 11], [11, 12, 2], [20, 21, 22, 23, 24], [30, 2, 31, 32]]
NEW = 6


def _engine(model, data: bytes, tmp_path, *, tp=1, pp=1, chunk=None, seqs=8):
    path = tmp_path / "plan.msgpack"
    path.write_bytes(data)
    workers = make_workers(model, tp_size=tp, pp_size=pp, extension_cls=EXTENSION,
                           additional_config={"steerc": {"plan": str(path)}}, max_num_seqs=seqs)
    return workers, StandinEngine(workers, chunk=chunk)


def _vllm_run(model, data, tmp_path, **kw):
    workers, engine = _engine(model, data, tmp_path, **kw)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, NEW)
    records = engine.run()
    return workers, [records[f"r{i}"] for i in range(len(PROMPTS))]


def _hf_run(model, plan):
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    with install(model, plan):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=None, output_scores=True, return_dict_in_generate=True)
    tokens = [row[width:].tolist() for row in out.sequences]
    scores = torch.stack(out.scores, dim=1)  # [batch, steps, vocab]
    return tokens, scores


def _compare(text: str, tmp_path, atol: float = 1e-6, **kw):
    model = tiny_model("llama")
    plan = plan_for(model, text)
    want_tokens, want_scores = _hf_run(model, plan)
    _, records = _vllm_run(model, plan_bytes(plan, facts_from_model(model)), tmp_path, **kw)
    for i, rec in enumerate(records):
        assert rec.output_token_ids == want_tokens[i], f"prompt {i}"
        got = torch.stack([torch.as_tensor(x) for x in rec.logits]).double()
        assert torch.allclose(got, want_scores[i].double(), atol=atol), (i, (got - want_scores[i]).abs().max())
    return want_tokens


KERNELS = {
    "add": f"add 6.0 * {vec(64, 1)}",
    "scale": "scale 0.5",
    "scale-vector": f"scale {vec(64, 2)}",
    "set": f"set {vec(64, 3)}",
    "suppress": "suppress",
    "ablate": f"ablate {vec(64, 4)}, {vec(64, 5)}",
    "clamp": f"clamp {vec(64, 6)} to 2.5",
    "rotate-to": f"rotate in ({vec(64, 7)}, {vec(64, 8)}) to 60deg",
    "rotate-by": f"rotate in ({vec(64, 9)}, {vec(64, 10)}) by -30deg",
    "add-preserve": f"add 5.0 * {vec(64, 11)}\n  preserve norm",
}
SITES = ["resid_pre[0]", "resid_pre[2]", "resid_post[3]", "attn_out[1]", "mlp_out[2]"]


def _program(site: str, op: str, scope: str = "all") -> str:
    return f"steer 1\nintervention x {{\n  at {site}\n  {op}\n  tokens {scope}\n}}\n"


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("site", SITES)
def test_every_kernel_at_every_site_matches_hf(tmp_path, op, site):
    _compare(_program(site, KERNELS[op]), tmp_path)


@pytest.mark.parametrize("op", ["scale", "add", "ablate", "rotate-to"])
def test_head_kernels_match_hf(tmp_path, op):
    text = _program("head[(1, 2), (0, 3)]", KERNELS[op].replace("64", "16") if op == "scale" else
                    {"add": f"add 3.0 * {vec(16, 1)}", "ablate": f"ablate {vec(16, 4)}",
                     "rotate-to": f"rotate in ({vec(16, 7)}, {vec(16, 8)}) to 60deg"}[op])
    _compare(text, tmp_path)


@pytest.mark.parametrize("scope", ["prompt", "generated", "prompt[-2:]", "generated[:3]", "generated[1:]",
                                   "[0, 3, 8]", "prompt[-1:], generated"])
def test_scopes_match_hf(tmp_path, scope):
    _compare(_program("resid_post[1]", KERNELS["add"], scope), tmp_path)


def test_chunked_prefill_matches_hf(tmp_path):
    _compare(_program("resid_post[1]", KERNELS["add"], "prompt[-2:], generated[:2]"), tmp_path, chunk=3)


GATED = (
    "steer 1\n"
    f"probe pooled {{\n  at   resid_pre[1]\n  read cosine({vec(64, 33)})\n  pool prompt.mean\n}}\n"
    f"probe last {{\n  at   resid_post[1]\n  read dot({vec(64, 34)}) + 0.25\n  pool prompt.last\n}}\n"
    f"probe tok {{\n  at   resid_post[0]\n  read norm\n  pool token\n}}\n"
    f"intervention x {{\n  at     resid_post[2]\n  add    9.0 * {vec(64, 21)}\n  tokens generated\n"
    "  when   (pooled > THRESH or last < -1.0) and not (tok > 1000.0)\n}\n"
)


@pytest.mark.parametrize("chunk", [None, 2])
def test_gates_decided_per_request_match_hf(tmp_path, chunk):
    model = tiny_model("llama")
    # A threshold between the requests' pooled values, so some rows fire and some do not.
    values = []
    v = torch.tensor(eval(vec(64, 33)), dtype=torch.float64)
    for p in PROMPTS:
        mean = model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[1][0].double().mean(0)
        values.append(float((mean @ v / (mean.norm() * v.norm())).detach()))
    ordered = sorted(values)
    text = GATED.replace("THRESH", repr((ordered[1] + ordered[2]) / 2))
    tokens = _compare(text, tmp_path, chunk=chunk)
    base = _hf_run(model, plan_for(model, "steer 1\n"))[0]
    steered = sum(t != b for t, b in zip(tokens, base))
    assert 0 < steered < len(PROMPTS), "the gate is decided per request: some rows fire, some do not"


def test_tensor_parallel_heads_land_on_their_rank(tmp_path):
    model = tiny_model("llama")
    text = _program("head[(1, 3), (0, 3)]", "scale 3.0")
    plan = plan_for(model, text)
    data = plan_bytes(plan, facts_from_model(model))
    want_tokens, want_scores = _hf_run(model, plan)
    workers, records = _vllm_run(model, data, tmp_path, tp=2)
    for i, rec in enumerate(records):
        assert rec.output_token_ids == want_tokens[i]
    statuses = collective_rpc(workers, "steerc_status")
    assert all(s["installed"] for s in statuses)
    check_coverage(statuses, unpack(data)["boot"])


def test_pipeline_parallel_skips_layers_it_does_not_own(tmp_path):
    model = tiny_model("llama")
    text = _program("resid_post[*]", KERNELS["add"])
    plan = plan_for(model, text)
    data = plan_bytes(plan, facts_from_model(model))
    want_tokens, _ = _hf_run(model, plan)
    workers, records = _vllm_run(model, data, tmp_path, pp=2)
    assert [r.output_token_ids for r in records] == want_tokens
    statuses = collective_rpc(workers, "steerc_status")
    assert statuses[0]["hooks"] and statuses[1]["hooks"]
    assert not set(statuses[0]["hooks"]) & set(statuses[1]["hooks"])
    boot = unpack(data)["boot"]
    check_coverage(statuses, boot)
    with pytest.raises(PlanError, match="not installed on any rank"):
        check_coverage(statuses[:1], boot)


def test_plan_is_deterministic_and_round_trips():
    model = tiny_model("llama")
    text = GATED.replace("THRESH", "0.1")
    a = plan_bytes(plan_for(model, text), facts_from_model(model))
    b = plan_bytes(plan_for(model, text), facts_from_model(model))
    assert a == b
    assert pack(unpack(a)) == a


def _installed(tmp_path, text=None):
    model = tiny_model("llama")
    plan = plan_for(model, text or _program("resid_post[1]", KERNELS["add"]))
    data = plan_bytes(plan, facts_from_model(model))
    workers, engine = _engine(model, data, tmp_path)
    return model, workers, engine, data


def _mutate(data: bytes, fn) -> bytes:
    obj = unpack(data)
    fn(obj)
    return pack(obj)


BAD = {
    "unknown top-level key": (lambda o: o.__setitem__("extra", 1), "plan.extra"),
    "version": (lambda o: o.__setitem__("format", "steerc.vllm/9"), "plan.format"),
    "wrong shape": (lambda o: o["state"]["tensors"]["resid_post_1.k0.bias"].__setitem__("shape", [32]),
                    "resid_post_1.k0.bias.shape"),
    "short data": (lambda o: o["state"]["tensors"]["resid_post_1.k0.bias"].__setitem__("data", b"\0" * 8),
                   "resid_post_1.k0.bias.data"),
    "non-finite": (lambda o: o["state"]["tensors"]["resid_post_1.k0.bias"].__setitem__(
        "data", np.full(64, np.nan, dtype="<f4").tobytes()), "resid_post_1.k0.bias.data"),
    "wrong dtype": (lambda o: o["state"]["tensors"]["resid_post_1.k0.bias"].__setitem__("dtype", "float16"),
                    "resid_post_1.k0.bias.dtype"),
    "unknown tensor": (lambda o: o["state"]["tensors"].__setitem__("evil", o["state"]["tensors"]["gates.thresholds"]),
                       "plan.state.tensors.evil"),
    "another model": (lambda o: o["header"].__setitem__("facts_fingerprint", "0" * 64),
                      "plan.header.facts_fingerprint"),
    "changed structure": (lambda o: o["boot"]["hooks"][0].__setitem__("module", "model.layers.2"),
                          "plan.header.boot_sha256"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_payloads_are_refused_and_the_engine_keeps_running(tmp_path, case):
    model, workers, engine, data = _installed(tmp_path)
    mutate, field = BAD[case]
    with pytest.raises(PlanError) as err:
        collective_rpc(workers, "steerc_update", args=(_mutate(data, mutate),))
    assert field in str(err.value)
    engine.add_request("after", PROMPTS[0], 3)
    assert len(engine.run()["after"].output_token_ids) == 3


def test_garbage_and_oversize_payloads(tmp_path):
    _, workers, _, _ = _installed(tmp_path)
    with pytest.raises(PlanError, match="payload"):
        collective_rpc(workers, "steerc_update", args=(b"\xc1 not msgpack",))
    with pytest.raises(PlanError, match="payload"):
        collective_rpc(workers, "steerc_update", args=(b"\0" * (256 * 1024 * 1024 + 1),))
    with pytest.raises(TypeError):
        collective_rpc(workers, "steerc_update", args=(torch.zeros(3),))


def test_swap_values_in_place_and_disable(tmp_path):
    model = tiny_model("llama")
    weak, strong = (_program("resid_post[1]", f"add {s} * {vec(64, 1)}") for s in (0.5, 9.0))
    plan_weak, plan_strong = plan_for(model, weak), plan_for(model, strong)
    facts = facts_from_model(model)
    workers, engine = _engine(model, plan_bytes(plan_weak, facts), tmp_path)
    state = workers[0].get_model().steerc
    before = {n: b.data_ptr() for n, b in state.named_buffers()}
    collective_rpc(workers, "steerc_update", args=(plan_bytes(plan_strong, facts),))
    assert {n: b.data_ptr() for n, b in state.named_buffers()} == before, "updated in place, same buffers"
    engine.add_request("s", PROMPTS[0], NEW)
    got = engine.run()["s"].output_token_ids
    with install(model, plan_strong):
        want = model.generate(input_ids=torch.tensor([PROMPTS[0]]), max_new_tokens=NEW, do_sample=False,
                              pad_token_id=0, eos_token_id=None)[0, len(PROMPTS[0]):].tolist()
    assert got == want
    collective_rpc(workers, "steerc_enable", args=(False,))
    engine.add_request("off", PROMPTS[0], NEW)
    plain = model.generate(input_ids=torch.tensor([PROMPTS[0]]), max_new_tokens=NEW, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0, len(PROMPTS[0]):].tolist()
    assert engine.run()["off"].output_token_ids == plain


def test_head_probe_under_tensor_parallel_is_refused(tmp_path):
    model = tiny_model("llama")
    text = ("steer 1\nprobe h {\n  at head[1, 0]\n  read norm\n  pool token\n}\n"
            f"intervention x {{\n  at resid_post[2]\n  add {vec(64, 1)}\n  when h > 0.0\n}}\n")
    data = plan_bytes(plan_for(model, text), facts_from_model(model))
    with pytest.raises(PlanError, match="tensor-parallel"):
        _engine(model, data, tmp_path, tp=2)


def test_runtime_imports_without_vllm():
    import importlib.util

    assert importlib.util.find_spec("vllm") is None or os.environ.get("STEERC_HAVE_VLLM")
    from steerc.runtime import vllm as rt

    with pytest.raises(ImportError, match="pip install"):
        rt.load("any-model", b"")
