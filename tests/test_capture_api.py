"""``steerc.runtime.hf.capture(model, tokenizer, texts, sites, read=...)``: the capture API on a tiny random
Llama, against answers computed without steerc (transformers' ``output_hidden_states``, a hook on one
attention projection's input), and its refusals, all before any forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steerc.runtime import capture as C
from steerc.runtime.hf import capture

TEXTS = ["the cat sat on the mat", ("Q: what is two and two?", " four, of course"), "hi",
         {"prompt": "say", "text": " something long enough to be the longest text here"}]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from tiny_models import tiny_model
    from tokenizer_util import byte_bpe

    return tiny_model("llama", "float32").eval(), byte_bpe(512)


def _ids(tok, text):
    prompt, body = (None, text) if isinstance(text, str) else (
        (text["prompt"], text["text"]) if isinstance(text, dict) else text)
    head = tok(prompt)["input_ids"] if prompt is not None else []
    return head + tok(body, add_special_tokens=prompt is None)["input_ids"], len(head)


def _hidden(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states


@pytest.mark.parametrize("read", ["last", "mean", "completion", "all"])
def test_rows_are_each_texts_own_hidden_states_in_order(model_and_tokenizer, read):
    model, tok = model_and_tokenizer
    texts = TEXTS
    got = capture(model, tok, texts, ["resid_post[0:4]", "resid_pre[2]"], read=read, batch_size=3)
    assert list(got) == ["resid_post[0]", "resid_post[1]", "resid_post[2]", "resid_post[3]", "resid_pre[2]"]
    assert all(a.dtype == np.float32 for a in got.values()) and got.read == read
    longest = int(got.lengths.max())
    for i, text in enumerate(texts):
        ids, start = _ids(tok, text)
        hs = _hidden(model, ids)  # hs[l] is layer l's input, hs[l + 1] its output (below the last layer)
        a, b = {"last": (len(ids) - 1, len(ids)), "completion": (start, len(ids))}.get(read, (0, len(ids)))
        assert got.lengths[i] == b - a
        for key, h in (("resid_post[1]", hs[2]), ("resid_pre[2]", hs[2])):
            if read == "all":
                assert got[key].shape == (len(texts), longest, 64)
                np.testing.assert_allclose(got[key][i, :b - a], h[0].numpy(), rtol=1e-5, atol=1e-6)
                assert not got[key][i, b - a:].any(), "a row past the text's tokens is not zero"
            else:
                assert got[key].shape == (len(texts), 64)
                np.testing.assert_allclose(got[key][i], h[0, a:b].double().mean(0).float().numpy(),
                                           rtol=1e-5, atol=1e-6)


def test_the_last_layer_is_read_before_the_final_norm(model_and_tokenizer):
    model, tok = model_and_tokenizer
    seen = []
    handle = model.model.layers[3].register_forward_hook(lambda m, a, out: seen.append(
        (out[0] if isinstance(out, tuple) else out).detach().clone()))
    try:
        got = capture(model, tok, ["one two three"], "resid_post[3]", read="mean")
    finally:
        handle.remove()
    np.testing.assert_allclose(got["resid_post[3]"][0], seen[0][0].double().mean(0).float().numpy(), rtol=1e-6)
    hs = _hidden(model, _ids(tok, "one two three")[0])
    assert not np.allclose(got["resid_post[3]"][0], hs[-1][0].mean(0).numpy(), atol=1e-3)  # hs[-1] is normed


def test_a_head_is_its_columns_of_the_output_projections_input(model_and_tokenizer):
    model, tok = model_and_tokenizer
    seen = []
    handle = model.model.layers[1].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        got = capture(model, tok, ["a b c d"], "head[1, 1:3]", read="last")
    finally:
        handle.remove()
    assert list(got) == ["head[1, 1]", "head[1, 2]"]
    for h in (1, 2):
        np.testing.assert_allclose(got[f"head[1, {h}]"][0], seen[-1][0, -1, h * 16:(h + 1) * 16].numpy(), rtol=1e-6)


def test_a_steered_model_is_read_as_steered(model_and_tokenizer, tmp_path):
    from steerc.runtime.hf import compile_for, install

    model, tok = model_and_tokenizer
    vec = np.linspace(-1, 1, 64).astype(np.float32)
    np.save(tmp_path / "v.npy", vec)
    (tmp_path / "p.steer").write_text('steer 1\nvector v = load("v.npy")\nintervention x {\n'
                                      "  at resid_post[1]\n  add 3.0 * v\n}\n")
    plain = capture(model, tok, ["one two"], "resid_post[1]", read="all")
    with install(model, compile_for(str(tmp_path / "p.steer"), model), tok):
        steered = capture(model, tok, ["one two"], "resid_post[1]", read="all")
    np.testing.assert_allclose(steered["resid_post[1]"] - plain["resid_post[1]"],
                               np.broadcast_to(3.0 * vec, plain["resid_post[1]"].shape), rtol=1e-5, atol=1e-5)


def test_refusals_come_before_any_forward_with_diagnostics(model_and_tokenizer):
    model, tok = model_and_tokenizer
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(C.CaptureError) as exc:
            capture(model, tok, ["x"], "resid_post[9]")
        assert exc.value.diagnostics[0].code == "layer-out-of-range" and "^" in exc.value.render()
        with pytest.raises(C.CaptureError, match="one site selector"):
            capture(model, tok, ["x"], "resid_post[0] }")
        with pytest.raises(C.CaptureError, match="no tokens to read"):
            capture(model, tok, [("a prompt", "")], "resid_post[0]", read="completion")
        with pytest.raises(C.CaptureError, match="read 'every'"):
            capture(model, tok, ["x"], "resid_post[0]", read="every")
        with pytest.raises(C.CaptureError, match=r"texts\[1\] is a int"):
            capture(model, tok, ["x", 3], "resid_post[0]")
        with pytest.raises(C.CaptureError, match="one string"):
            capture(model, tok, "x", "resid_post[0]")
        with pytest.raises(C.CaptureError, match="batch_size"):
            capture(model, tok, ["x"], "resid_post[0]", batch_size=0)
    finally:
        handle.remove()
    assert not calls, "a refused capture ran the model"


def test_a_read_all_capture_is_bounded():
    from steerc.facts import facts_from_config

    facts = facts_from_config({"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 4096,
                               "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000})
    items = [([1] * 4096, 0, 4096)] * 200
    with pytest.raises(C.CaptureError, match="GiB"):
        C.check_size(items, C.sites_of("resid_post[*]", facts), facts, "all")
    C.check_size(items, C.sites_of("resid_post[*]", facts), facts, "mean")  # one row per text: no bound


def test_no_texts_give_empty_arrays(model_and_tokenizer):
    model, tok = model_and_tokenizer
    got = capture(model, tok, [], "mlp_out[0]")
    assert got["mlp_out[0]"].shape == (0, 64) and got.lengths.shape == (0,)
