"""The CPU vLLM stand-in (tests/vllm_standin.py) is exact against HF and faithful to vLLM's layout.

The unsteered stand-in must reproduce the HF tiny llama (float64) token for token and logit for
logit, whatever the batching: several requests per step, chunked prefill, tensor and pipeline
parallelism, request slots reused. The vLLM-specific structure that steering hooks rely on
(module tree, layer return values, o_proj head layout per TP rank, InputBatch fields, the
worker-extension mix-in and collective_rpc's msgpack hop) is checked directly.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import vllm_standin as vs
from tiny_models import tiny_model

ATOL = 1e-8

# Different lengths (including a one-token prompt, which is batched like a decode).
PROMPTS = {
    "a": [5, 17, 42, 9, 300, 12],
    "b": [7, 8, 9],
    "c": [101],
    "d": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9],
    "e": [250, 251, 252, 253, 254, 255, 256, 257, 258],
}
MAX_TOKENS = {"a": 5, "b": 7, "c": 4, "d": 3, "e": 6}


@pytest.fixture(scope="module")
def hf():
    return tiny_model("llama")


@functools.lru_cache(maxsize=None)
def hf_greedy(prompt: tuple[int, ...], max_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and next-token logits by re-running HF on the growing sequence."""
    model = tiny_model("llama")
    ids, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            rows.append(logits)
            ids.append(int(logits.argmax()))
    return ids[len(prompt):], torch.stack(rows)


def add_all(engine: vs.StandinEngine, names=PROMPTS, extra_args=None) -> None:
    for name in names:
        engine.add_request(name, PROMPTS[name], MAX_TOKENS[name],
                           extra_args=None if extra_args is None else extra_args(name))


def assert_matches_hf(records: dict[str, vs.RequestRecord]) -> None:
    for name, rec in records.items():
        tokens, logits = hf_greedy(tuple(rec.prompt_token_ids), rec.max_tokens)
        assert rec.finished
        assert rec.output_token_ids == tokens, name
        assert len(rec.logits) == rec.max_tokens
        torch.testing.assert_close(torch.stack(rec.logits), logits, atol=ATOL, rtol=0)


def hf_prefill_hidden(hf, prompts) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([hf.model(torch.tensor([p])).last_hidden_state[0] for p in prompts])


# ---------------------------------------------------------------------------------------------
# Model structure and layer semantics
# ---------------------------------------------------------------------------------------------


def test_module_tree_is_vllms(hf):
    model = vs.from_hf(hf)
    names = {n for n, _ in model.named_modules()}
    for i in range(4):
        for sub in ("input_layernorm", "post_attention_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
                    "self_attn.attn", "mlp.gate_up_proj", "mlp.act_fn", "mlp.down_proj"):
            assert f"model.layers.{i}.{sub}" in names
    assert {"model.embed_tokens", "model.norm", "lm_head", "logits_processor"} <= names
    # get_rope's cached module is shared, so de-duplicated named_modules lists it under layer 0 only.
    assert "model.layers.0.self_attn.rotary_emb" in names and "model.layers.1.self_attn.rotary_emb" not in names
    assert model.model.layers[3].self_attn.rotary_emb is model.model.layers[0].self_attn.rotary_emb
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == (64 + 32 + 32, 64) and attn.o_proj.weight.shape == (64, 64)
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape == (256, 64)
    assert attn.attn.layer_name == "model.layers.0.self_attn.attn"
    out, bias = attn.o_proj(torch.zeros(3, 64, dtype=torch.float64))
    assert out.shape == (3, 64) and bias is None
    with pytest.raises(RuntimeError):
        model.lm_head(torch.zeros(1, 64))


def test_prefill_layers_match_hf_out_of_place(hf):
    """Layer i returns (mlp_i, x_i + attn_i): their sum is HF's stream after layer i; layer 0
    gets residual=None; nothing is written into a layer's inputs; model.norm returns the pair."""
    model = vs.from_hf(hf)
    prompts = [PROMPTS["a"], PROMPTS["b"], PROMPTS["d"]]
    seen, hf_out, handles = {}, {}, []

    def pre(i):
        def hook(mod, args, kwargs):
            positions, h, r = args
            seen[i] = {"in": (h.clone(), None if r is None else r.clone()), "r_is_none": r is None,
                       "args": (h, r), "positions": positions.clone()}
        return hook

    def post(i):
        def hook(mod, args, output):
            h_in, r_in = seen[i]["args"]
            assert torch.equal(h_in, seen[i]["in"][0]) and (r_in is None or torch.equal(r_in, seen[i]["in"][1]))
            seen[i]["out"] = output
        return hook

    for i, layer in enumerate(model.model.layers):
        handles += [layer.register_forward_pre_hook(pre(i), with_kwargs=True), layer.register_forward_hook(post(i))]
    handles.append(model.model.norm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm", o)))
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.register_forward_hook(
            lambda m, a, o, i=i: hf_out.__setitem__(i, hf_out.get(i, []) + [o[0] if isinstance(o, tuple) else o])))
    model_hook_calls = []
    handles.append(model.model.register_forward_hook(lambda *a: model_hook_calls.append(1)))
    try:
        hidden = vs.forward_batch(model, prompts)
        with torch.no_grad():
            for p in prompts:
                hf(torch.tensor([p]))
    finally:
        for h in handles:
            h.remove()

    torch.testing.assert_close(hidden, hf_prefill_hidden(hf, prompts), atol=1e-12, rtol=0)
    assert seen[0]["r_is_none"] and not seen[1]["r_is_none"]
    assert seen[0]["positions"].tolist() == [*range(6), *range(3), *range(13)]
    for i in range(4):
        h, r = seen[i]["out"]
        expected = torch.cat([t[0] for t in hf_out[i]])
        torch.testing.assert_close(h + r, expected, atol=1e-12, rtol=0)
    normed, stream = seen["norm"]
    torch.testing.assert_close(normed, hidden, atol=0, rtol=0)
    torch.testing.assert_close(stream, sum(seen[3]["out"]), atol=0, rtol=0)
    assert model_hook_calls == []  # like @support_torch_compile: hooks on model.model never fire


# ---------------------------------------------------------------------------------------------
# Engine: continuous batching against HF
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 4, 1])
def test_engine_matches_hf(hf, chunk):
    engine = vs.StandinEngine(vs.make_workers(hf), chunk=chunk)
    add_all(engine)
    assert_matches_hf(engine.run())
    if chunk == 1:
        assert engine.num_steps >= len(PROMPTS["d"]) + MAX_TOKENS["d"]


def test_prepare_inputs_batches_are_vllm_shaped(hf):
    """Wrap runner.prepare_inputs on the instance (as steerc does) and check every InputBatch."""
    workers = vs.make_workers(hf)
    runner = workers[0].model_runner
    engine = vs.StandinEngine(workers, chunk=5)
    add_all(engine, extra_args=lambda name: {"steer": name, "alpha": 2.5})
    batches, padding_seen = [], []
    original = runner.prepare_inputs

    def wrapped(*args, **kwargs):
        ib = original(*args, **kwargs)
        rs = runner.req_states
        batches.append({
            "ib": ib, "positions": ib.positions.clone(), "input_ids": ib.input_ids.clone(),
            "is_padding": ib.is_padding.clone(), "slots": {r: rs.req_id_to_index[r] for r in ib.req_ids},
            "extra": [rs.extra_args[i] for i in ib.idx_mapping_np],
            "prompt_len": rs.prompt_len.np[ib.idx_mapping_np].copy(),
        })
        return ib

    runner.prepare_inputs = wrapped
    handle = runner.get_model().model.layers[0].register_forward_pre_hook(
        lambda m, a: padding_seen.append(vs.get_forward_context().is_padding.clone()))
    try:
        records = engine.run()
    finally:
        handle.remove()
    assert_matches_hf(records)
    assert len(batches) == engine.num_steps - 1  # the last step only frees slots
    assert any(b["ib"].num_tokens % 8 for b in batches)  # so padding is exercised

    for b, is_padding in zip(batches, padding_seen):
        ib = b["ib"]
        n, n_pad = ib.num_tokens, ib.num_tokens_after_padding
        assert n_pad % 8 == 0 and n <= n_pad < n + 8
        assert ib.input_ids.shape == ib.positions.shape == (n_pad,)
        assert b["is_padding"].tolist() == [False] * n + [True] * (n_pad - n)
        assert torch.equal(is_padding, b["is_padding"])
        qsl = ib.query_start_loc_np
        assert qsl.shape == (ib.num_reqs + 1,) and qsl[0] == 0 and qsl[-1] == n
        assert np.array_equal(np.diff(qsl), ib.num_scheduled_tokens)
        assert ib.logits_indices.tolist() == (qsl[1:] - 1).tolist()
        decode = [k == 1 for k in ib.num_scheduled_tokens]
        assert decode == sorted(decode, reverse=True)  # decode-like rows lead (sort_batch_req_ids)
        for i, req_id in enumerate(ib.req_ids):
            rec = records[req_id]
            assert ib.idx_mapping_np[i] == b["slots"][req_id]
            assert b["extra"][i] == {"steer": req_id, "alpha": 2.5}
            assert b["prompt_len"][i] == len(rec.prompt_token_ids)
            start, end = qsl[i], qsl[i + 1]
            expected_pos = list(range(ib.num_computed_tokens_np[i], ib.num_computed_tokens_np[i] + end - start))
            assert b["positions"][start:end].tolist() == expected_pos
            assert b["input_ids"][start:end].tolist() == [rec.all_token_ids[p] for p in expected_pos]


def test_slots_are_freed_and_reused(hf):
    workers = vs.make_workers(hf, max_num_seqs=2)
    runner = workers[0].model_runner
    engine = vs.StandinEngine(workers)
    add_all(engine, extra_args=lambda name: {"who": name})
    slots_by_step = []
    original = runner.prepare_inputs

    def wrapped(*args, **kwargs):
        ib = original(*args, **kwargs)
        slots_by_step.append(dict(zip(ib.req_ids, ib.idx_mapping_np.tolist())))
        return ib

    runner.prepare_inputs = wrapped
    records = engine.run()
    assert_matches_hf(records)
    assert all(len(s) <= 2 for s in slots_by_step)
    assert slots_by_step[0] == {"b": 0, "a": 1}  # free_indices.pop() hands out the last slot first
    users = {}
    for step in slots_by_step:
        for req_id, slot in step.items():
            users.setdefault(slot, set()).add(req_id)
    assert set(users) == {0, 1} and sum(len(u) for u in users.values()) == len(PROMPTS)
    rs = runner.req_states
    assert rs.req_id_to_index == {} and sorted(rs.free_indices) == [0, 1] and rs.extra_args == [None, None]


# ---------------------------------------------------------------------------------------------
# Tensor and pipeline parallelism
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_group_equals_unsharded(hf, tp):
    """Each rank's o_proj pre-hook sees exactly its own heads; outputs equal the unsharded model."""
    prompts = [PROMPTS["a"], PROMPTS["c"], PROMPTS["e"]]
    full = vs.from_hf(hf)
    group = vs.TensorParallelGroup(tp)
    ranks = [vs.from_hf(hf, tp_size=tp, tp_rank=r, tp_group=group) for r in range(tp)]
    captured: dict[tuple, torch.Tensor] = {}

    def capture(key):
        return lambda m, a: captured.__setitem__(key, a[0].clone())

    handles = [full.model.layers[1].self_attn.o_proj.register_forward_pre_hook(capture(("o", "full"))),
               full.model.layers[2].mlp.down_proj.register_forward_pre_hook(capture(("down", "full")))]
    for r, m in enumerate(ranks):
        handles += [m.model.layers[1].self_attn.o_proj.register_forward_pre_hook(capture(("o", r))),
                    m.model.layers[2].mlp.down_proj.register_forward_pre_hook(capture(("down", r)))]
    try:
        expected = vs.forward_batch(full, prompts)
        outs = group.run([lambda m=m: vs.forward_batch(m, prompts) for m in ranks])
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(expected, hf_prefill_hidden(hf, prompts), atol=1e-12, rtol=0)
    for out in outs:
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
        assert torch.equal(out, outs[0])  # the all-reduce gives every rank the same bits
    heads, d, inter = 4 // tp, 16, 128 // tp
    for r in range(tp):
        o_proj = ranks[r].model.layers[1].self_attn.o_proj
        assert captured[("o", r)].shape[1] == heads * d == o_proj.input_size_per_partition
        torch.testing.assert_close(captured[("o", r)], captured[("o", "full")][:, r * heads * d:(r + 1) * heads * d],
                                   atol=1e-12, rtol=0)
        torch.testing.assert_close(captured[("down", r)], captured[("down", "full")][:, r * inter:(r + 1) * inter],
                                   atol=1e-12, rtol=0)


def test_tensor_parallel_biases_load_and_reduce_once():
    """With attention/MLP biases: q/k/v biases stack like the weights, RowParallel adds its bias on rank 0 only."""
    from transformers import AutoModelForCausalLM

    from tiny_models import config

    cfg = config("llama")
    cfg.attention_bias, cfg.mlp_bias = True, True
    torch.manual_seed(1)
    biased = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in biased.parameters():
            p.normal_(0.0, 0.08)
    prompts = [PROMPTS["a"], PROMPTS["b"]]
    group = vs.TensorParallelGroup(2)
    ranks = [vs.from_hf(biased, tp_size=2, tp_rank=r, tp_group=group) for r in range(2)]
    assert ranks[0].model.layers[0].self_attn.qkv_proj.bias.shape == (64,)  # 2 q heads + 1 k + 1 v, 16 wide
    outs = group.run([lambda m=m: vs.forward_batch(m, prompts) for m in ranks])
    for out in outs:
        torch.testing.assert_close(out, hf_prefill_hidden(biased, prompts), atol=1e-12, rtol=0)


@pytest.mark.parametrize("pp", [2, 3])
def test_pipeline_parallel_layers_and_group(hf, pp):
    prompts = [PROMPTS["b"], PROMPTS["d"]]
    ranks = [vs.from_hf(hf, pp_size=pp, pp_rank=p) for p in range(pp)]
    owned = [(m.model.start_layer, m.model.end_layer) for m in ranks]
    assert owned == ([(0, 2), (2, 4)] if pp == 2 else [(0, 1), (1, 3), (3, 4)])
    for p, m in enumerate(ranks):
        real = [i for i, layer in enumerate(m.model.layers) if not isinstance(layer, vs.PPMissingLayer)]
        assert real == list(range(*owned[p]))
        assert isinstance(m.model.embed_tokens, vs.PPMissingLayer) == (p > 0)
        assert isinstance(m.model.norm, vs.PPMissingLayer) == (p < pp - 1)
        assert isinstance(m.lm_head, vs.PPMissingLayer) == (p < pp - 1)
    intermediates = []

    def stage(p, t, x):
        out = vs.forward_batch(ranks[p], prompts, x)
        intermediates.append(out)
        return out

    out = vs.PipelineGroup(pp).run(stage)[0]
    assert all(isinstance(x, vs.IntermediateTensors) and set(x.keys()) == {"hidden_states", "residual"}
               for x in intermediates[:-1])
    torch.testing.assert_close(out, hf_prefill_hidden(hf, prompts), atol=1e-12, rtol=0)


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)])
def test_parallel_engine_matches_hf(hf, tp, pp):
    workers = vs.make_workers(hf, tp_size=tp, pp_size=pp, max_num_seqs=3)
    assert [(w.rank, w.tp_rank, w.pp_rank) for w in workers] == [(p * tp + t, t, p) for p in range(pp)
                                                                  for t in range(tp)]
    engine = vs.StandinEngine(workers, chunk=4)
    add_all(engine)
    assert_matches_hf(engine.run())


# ---------------------------------------------------------------------------------------------
# Worker extension and collective_rpc
# ---------------------------------------------------------------------------------------------


class RecordingExtension:
    """A dummy worker extension in the shape steerc's takes."""

    def init_worker_extension(self):
        self.calls = ["init_worker_extension"]
        self.model_at_init = self.model_runner.get_model()
        self.fired = 0
        original = self.load_model

        def load_model_then_hook(*args, **kwargs):
            self.calls.append("load_model")
            original(*args, **kwargs)
            self.calls.append("install")
            self.get_model().model.layers[0].self_attn.o_proj.register_forward_pre_hook(self._count)

        self.load_model = load_model_then_hook

    def _count(self, module, args):
        self.fired += 1

    def ext_info(self, tag, payload, *, scale=None):
        o_proj = self.get_model().model.layers[-1].self_attn.o_proj
        return {"rank": vs.get_tensor_model_parallel_rank(), "tp": vs.get_tensor_model_parallel_world_size(),
                "tag": tag, "payload": payload, "scale": scale, "in_features": o_proj.input_size_per_partition,
                "steer": self.vllm_config.additional_config.get("steerc")}

    def ext_tensor(self):
        return torch.zeros(2)


def test_extension_lifecycle_and_mixin(hf):
    workers = vs.make_workers(hf, tp_size=2, extension_cls=RecordingExtension, additional_config={"steerc": "abc"})
    for w in workers:
        assert type(w).__bases__[-1] is RecordingExtension
        assert w.calls == ["init_worker_extension", "load_model", "install"]
        assert w.model_at_init is None  # runner exists after init_device, the model does not yet
        assert w.fired == 1  # the profile run is a forward too
    assert RecordingExtension not in vs.Worker.__mro__  # vLLM mutates Worker; the stand-in extends a copy
    engine = vs.StandinEngine(workers)
    add_all(engine, names=["a", "b"])
    assert_matches_hf(engine.run())
    assert [w.fired for w in workers] == [1 + engine.num_steps - 1] * 2

    # worker extension given by qualified name, as LLM(worker_extension_cls="pkg.mod.Cls") does
    (w,) = vs.make_workers(hf, extension_cls=f"{__name__}.RecordingExtension", profile=False)
    assert w.calls == ["init_worker_extension", "load_model", "install"]


def test_extension_name_clash_is_refused(hf):
    class Clash:
        def get_model(self):
            return None

    class DunderOnly:
        def __repr__(self):
            return "ok"

    factory = lambda tp_rank, pp_rank: vs.from_hf(hf)  # noqa: E731
    config = vs.make_workers(hf, profile=False)[0].vllm_config
    with pytest.raises(AssertionError, match="get_model"):
        vs.make_worker(Clash, vllm_config=config, model_factory=factory)
    w = vs.make_worker(DunderOnly, vllm_config=config, model_factory=factory)
    assert type(w).__bases__[-1] is DunderOnly and w.get_model() is not None


def test_collective_rpc_msgpack_hop(hf):
    workers = vs.make_workers(hf, tp_size=2, extension_cls=RecordingExtension, profile=False,
                              additional_config={"steerc": "abc"})
    results = vs.collective_rpc(workers, "ext_info", args=("t", (1, 2.5, b"\x00\x01", {"k": [3]})),
                                kwargs={"scale": 0.5})
    assert results == [
        {"rank": r, "tp": 2, "tag": "t", "payload": [1, 2.5, b"\x00\x01", {"k": [3]}], "scale": 0.5,
         "in_features": 32, "steer": "abc"}
        for r in range(2)
    ]
    with pytest.raises(TypeError):
        vs.collective_rpc(workers, "ext_info", args=("t", torch.ones(2)))
    with pytest.raises(TypeError):
        vs.collective_rpc(workers, "ext_info", args=("t",), kwargs={"scale": np.float32(1.0)})
    with pytest.raises(TypeError):
        vs.collective_rpc(workers, lambda w: 0)
    with pytest.raises(TypeError):
        vs.collective_rpc(workers, "ext_tensor")


def test_parallel_state_and_fake_vllm_modules(hf):
    with pytest.raises(AssertionError):
        vs.get_tensor_model_parallel_rank()
    with pytest.raises(AssertionError):
        vs.get_forward_context()
    with vs.fake_vllm_modules() as vllm:
        from vllm.distributed import get_pp_group
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.models.utils import PPMissingLayer

        assert vllm.__version__ == "0.33.0"
        assert get_forward_context is vs.get_forward_context and PPMissingLayer is vs.PPMissingLayer
        (w,) = vs.make_workers(hf, pp_size=1, profile=False)
        with vs.worker_scope(w):
            assert get_pp_group().is_first_rank and get_pp_group().is_last_rank
    import sys

    assert "vllm" not in sys.modules and "vllm.forward_context" not in sys.modules
