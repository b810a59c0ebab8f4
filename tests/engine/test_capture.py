"""``steerc.runtime.vllm.capture``: activations read inside the real engine equal the HF path's
(``steerc.runtime.hf.capture``, the reads ``steerc derive`` makes), at every site kind.

One eager engine on SmolLM2 (float32) with a plan that adds a vector at ``resid_post[3]``: with the
steering off the capture reads the model's own stream, with it on the stream as steered, each against
HF's read of the same texts (with the same plan installed for the second), to 1e-4 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import Engine, checked_plan, hf_model, model_folder, model_tokenizer, require_vllm, vllm_bytes

require_vllm()

STEER = ('steer 1\nvector v = load("v.npy")\n'
         "intervention x {\n  at resid_post[3]\n  add 2.0 * v\n}\n")
TEXTS = ["The rain fell on the quiet town all night.", "Hello!", "Write a short poem about the sea and the wind.",
         "Numbers: one, two, three, four, five, six, seven, eight, nine, ten.", "I am happy."]
REL = 1e-4


@pytest.fixture(scope="module")
def folder():
    return model_folder("smollm2")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("capture")
    np.save(path / "v.npy", np.random.default_rng(5).normal(0, 1, 576).astype(np.float32))
    (path / "steer.toml").write_text("")
    return path


@pytest.fixture(scope="module")
def plan(folder, root):
    return checked_plan(folder, STEER, root=str(root))


@pytest.fixture(scope="module")
def engine(folder, plan):
    eng = Engine(folder, vllm_bytes(folder, plan), enforce_eager=True, enable_prefix_caching=False)
    yield eng
    eng.close()


def _sites():
    from steerc.runtime.capture import Site

    return [Site("resid_pre", 0), Site("resid_post", 0), Site("resid_post", 6), Site("resid_post", 29),
            Site("mlp_out", 4), Site("attn_out", 5), Site("head", 5, 2), Site("resid_pre", 7)]


def _items(folder, read: str):
    from transformers import AutoTokenizer

    from steerc.runtime.capture import positions

    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    for text in TEXTS:
        ids = list(tok(text)["input_ids"])
        a, b = positions(len(ids), 2 if len(ids) > 3 else 0, read)
        out.append((ids, a, b))
    return out, tok


def _facts(folder):
    from steerc.runtime.hf import facts_from_model

    return facts_from_model(hf_model(folder))


def _compare(got: dict, want: dict) -> float:
    worst = 0.0
    for site, value in want.items():
        assert got[site].shape == value.shape and got[site].dtype == np.float32, site.text
        scale = np.abs(value).max(axis=1, keepdims=True)
        rel = float((np.abs(got[site] - value) / scale).max())
        worst = max(worst, rel)
        assert rel <= REL, f"{site.text}: {rel:.3g} relative"
    return worst


@pytest.mark.parametrize("read", ["last", "mean", "completion"])
def test_unsteered_capture_equals_the_hf_read_at_every_site_kind(engine, folder, read):
    from steerc.runtime.hf.capture import read_items as hf_read
    from steerc.runtime.vllm import capture_items, enable

    items, tok = _items(folder, read)
    want = hf_read(hf_model(folder), tok, _facts(folder), items, _sites(), batch_size=8)
    enable(engine.llm, False)
    try:
        got = capture_items(engine.llm, items, _sites(), _facts(folder), batch_size=2)  # several steps, mixed batches
    finally:
        enable(engine.llm, True)
    print(f"\ncapture ({read}) against HF: {_compare(got, want):.3g} relative at most")


def test_a_steered_capture_reads_after_the_steering_before_the_site(engine, folder, plan):
    from steerc.runtime.hf import install
    from steerc.runtime.hf.capture import read_items as hf_read
    from steerc.runtime.vllm import capture_items

    items, tok = _items(folder, "mean")
    model = hf_model(folder)
    sites = _sites()
    with install(model, plan, tok):
        want = hf_read(model, tok, _facts(folder), items, sites, batch_size=8)
    got = capture_items(engine.llm, items, sites, _facts(folder))
    _compare(got, want)
    plain = hf_read(model, tok, _facts(folder), items, sites, batch_size=8)
    moved = {s.text: float(np.abs(got[s] - plain[s]).max()) for s in sites}
    scale = float(np.abs(plain[sites[1]]).max())  # resid_post[0]
    # before the add only the engine's own rounding against HF's, relative as in _compare (an absolute 1e-5 was
    # one float32 step of these values, 2**-16, on some runs); after it, moved by the add
    assert moved["resid_post[0]"] <= REL * scale and moved["resid_post[6]"] > 1e-2


def test_a_capture_that_cannot_be_served_is_refused_before_any_forward(engine, folder):
    from steerc.runtime.capture import Site
    from steerc.runtime.vllm import capture_items, status
    from steerc.targets.vllm.wire import PlanError

    before = status(engine.llm)[0]["forwards"]
    with pytest.raises((PlanError, ValueError)):
        capture_items(engine.llm, [([1, 2, 3], 0, 3)], [Site("resid_post", 99)], _facts(folder))
    assert status(engine.llm)[0]["forwards"] == before
    # the engine still captures afterwards
    items, _ = _items(folder, "last")
    assert capture_items(engine.llm, items[:1], [Site("resid_post", 1)], _facts(folder))[Site("resid_post", 1)].shape == (1, 576)


def test_a_per_position_capture_keeps_every_position_in_order(engine, folder):
    """``per_position``: each item's positions [a, b), one after the other, each the HF stream at that
    position (batched two at a time, so items share steps)."""
    import torch

    from steerc.runtime.capture import Site
    from steerc.runtime.vllm import capture_items, enable

    items, tok = _items(folder, "mean")
    items = [(ids, 1, len(ids)) for ids, _, _ in items]
    sites = [Site("resid_post", 6), Site("mlp_out", 2)]
    enable(engine.llm, False)
    try:
        got = capture_items(engine.llm, items, sites, _facts(folder), batch_size=2, per_position=True)
    finally:
        enable(engine.llm, True)
    assert got[sites[0]].shape == (sum(b - a for _, a, b in items), 576)
    model = hf_model(folder)
    seen = []
    handle = model.model.layers[2].mlp.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        offset = 0
        for ids, a, b in items:
            seen.clear()
            with torch.no_grad():
                hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            for site, want in ((sites[0], hs[7][0, a:b]), (sites[1], seen[0][0, a:b])):
                rows = got[site][offset:offset + b - a]
                scale = float(want.abs().max())
                assert float((torch.from_numpy(rows) - want).abs().max()) <= REL * scale, site.text
            offset += b - a
    finally:
        handle.remove()


@pytest.mark.parametrize("read", ["all", "completion"])
def test_the_text_api_gives_the_hf_engines_arrays(engine, folder, read):
    """The call the two engines share: ``capture(llm, texts, sites, read=...)`` equals
    ``steerc.runtime.hf.capture(model, tokenizer, texts, sites, read=...)``, texts with and without a
    prompt, in order, ``all`` padded with zeros past each text's tokens."""
    from steerc.runtime.hf import capture as hf_capture
    from steerc.runtime.vllm import capture, enable

    texts = TEXTS[:3] + [("Tell me a story.", " Once upon a time there was a lighthouse.")]
    model = hf_model(folder)
    want = hf_capture(model, model_tokenizer(folder), texts, ["resid_post[6, 29]", "head[5, 2]"], read=read)
    enable(engine.llm, False)
    try:
        got = capture(engine.llm, texts, ["resid_post[6, 29]", "head[5, 2]"], read=read, batch_size=3)
    finally:
        enable(engine.llm, True)
    assert list(got) == list(want) == ["resid_post[6]", "resid_post[29]", "head[5, 2]"]
    assert (got.lengths == want.lengths).all()
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == np.float32
        scale = np.abs(want[key]).max()
        assert float(np.abs(got[key] - want[key]).max()) <= REL * scale, key
    if read == "all":
        for i, n in enumerate(got.lengths):
            assert not got["resid_post[6]"][i, n:].any()


PROBES = ('steer 1\nvector v = load("v.npy")\n'
          "probe tok {\n  at resid_post[5]\n  read cosine(v)\n  pool token\n}\n"
          "probe pooled {\n  at resid_pre[9]\n  read dot(v)\n  pool prompt.mean\n}\n"
          "intervention x {\n  at resid_post[12]\n  add 2.0 * v\n  tokens generated\n  when tok > -1.0 and pooled > -1000.0\n}\n")


def test_probe_values_are_what_the_gates_read_as_on_hf(engine, folder, root, plan):
    """``probe_values``: a per-token probe at each text's last token and a prompt-pooled one, read from the
    installed plan's own probe state, equal the HF runtime's values (``derive --calibrate``'s)."""
    from types import SimpleNamespace

    from steerc.cli.derive import _probe_values
    from steerc.runtime.vllm import install, probe_values

    probes = checked_plan(folder, PROBES, root=str(root))
    tok = model_tokenizer(folder)
    ids = [list(tok(t)["input_ids"]) for t in TEXTS]
    install(engine.llm, vllm_bytes(folder, probes))
    try:
        got = {name: probe_values(engine.llm, ids, name, batch_size=2) for name in ("tok", "pooled")}
        with pytest.raises(Exception, match="no probe 'mood'"):
            probe_values(engine.llm, ids, "mood")
    finally:
        install(engine.llm, vllm_bytes(folder, plan))
    args = SimpleNamespace(batch_size=2, chat=False)
    for name, values in got.items():
        want = _probe_values(hf_model(folder), tok, probes, name, TEXTS, args)
        assert values.shape == (len(TEXTS),)
        np.testing.assert_allclose(values, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
