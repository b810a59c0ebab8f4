"""SAELens SAE folders read by steerc itself (steerc/io/sae.py; issue 34), without sae-lens.

Every refusal is a SaeError naming the file and the key, before any tensor data is read; only the rows and
columns asked for are read; the hook names map to steerc's sites; the numpy encoders follow SAELens's
formulas (tests/sae compares them with sae-lens itself, in its own environment). The tests write their own
folders (a tiny SAE, d_in = 8, d_sae = 4) or read the committed fixture, tests/fixtures/saes/smollm2-l8.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from steerc.io import sae as saeio
from steerc.io.sae import SaeError, read_sae, site_of_hook, why_no_site
from tests.support import REPO

FIXTURE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
D_IN, D_SAE = 8, 4


def _weights(arch: str = "jumprelu", seed: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng(seed)
    w = {"W_enc": rng.standard_normal((D_IN, D_SAE)), "W_dec": rng.standard_normal((D_SAE, D_IN)),
         "b_dec": 0.1 * rng.standard_normal(D_IN)}
    if arch == "gated":
        w.update(b_gate=rng.standard_normal(D_SAE), b_mag=rng.standard_normal(D_SAE),
                 r_mag=0.1 * rng.standard_normal(D_SAE))
    else:
        w["b_enc"] = 0.5 * rng.standard_normal(D_SAE)
    if arch == "jumprelu":
        w["threshold"] = np.abs(rng.standard_normal(D_SAE))
    return {k: v.astype(dtype) for k, v in w.items()}


def _cfg(arch: str = "jumprelu", **over) -> dict:
    cfg = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none", "architecture": arch,
           "metadata": {"sae_lens_version": "6.54.0", "model_name": "tiny", "hook_name": "blocks.1.hook_resid_post",
                        "hook_head_index": None, "neuronpedia_id": "tiny/1-res"}}
    if arch == "topk":
        cfg["k"] = 2
    cfg.update(over)
    return cfg


def _folder(tmp_path, cfg=None, weights=None, name: str = "sae") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps(_cfg() if cfg is None else cfg), encoding="utf-8")
    save_file(_weights() if weights is None else weights, str(folder / "sae_weights.safetensors"))
    return str(folder)


def _refused(folder: str, code: str = "invalid-vector-file", root=None) -> SaeError:
    with pytest.raises(SaeError) as exc:
        read_sae(folder, root=root)
    assert exc.value.code == code, exc.value.message
    assert "\n" not in exc.value.message
    return exc.value


# ------------------------------------------------------------------------- reading


def test_the_fixture_reads_as_sae_lens_wrote_it():
    """issue 34: the committed fixture (sae-lens's own save_model): a JumpReLU SAE for SmolLM2 at resid_post[8]."""
    sae = read_sae(FIXTURE)
    c = sae.config
    assert (c.architecture, c.d_in, c.d_sae, c.dtype, c.apply_b_dec_to_input) == ("jumprelu", 576, 64, "float32", True)
    assert (sae.hook_name, sae.site, sae.site_reason) == ("blocks.8.hook_resid_post", ("resid_post", 8), None)
    assert (sae.neuronpedia_id, sae.model_name, c.sae_lens_version) == ("smollm2-l8-jumprelu",
                                                                         "HuggingFaceTB/SmolLM2-135M", "6.54.0")
    assert {n: t.shape for n, t in sae.tensors.items()} == {"W_enc": (576, 64), "W_dec": (64, 576), "b_dec": (576,),
                                                             "b_enc": (64,), "threshold": (64,)}
    assert sae.bytes_read == 0 and sae.feature_is_local


def test_rows_and_columns_equal_the_whole_tensors(tmp_path):
    """issue 34: decoder_row(i) is W_dec[i], encoder_column(i) is W_enc[:, i], b_enc[i] and threshold[i]."""
    w = _weights()
    sae = read_sae(_folder(tmp_path, weights=w))
    for i in range(D_SAE):
        assert np.array_equal(sae.decoder_row(i), w["W_dec"][i])
        col = sae.encoder_column(i)
        assert np.array_equal(col.w, w["W_enc"][:, i]) and col.bias == w["b_enc"][i]
        assert col.threshold == w["threshold"][i] and col.b_mag is None
    assert sae.decoder_row(1).flags.writeable is False


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_dtypes_widen_to_float32(tmp_path, dtype):
    """issue 34: F16 and F64 weights are read as float32, as SAELens's dtype="float32" loads them."""
    w = _weights(dtype=dtype)
    sae = read_sae(_folder(tmp_path, weights=w))
    assert sae.tensors["W_dec"].dtype == {np.float16: "F16", np.float64: "F64"}[dtype]
    assert np.array_equal(sae.decoder_row(2), w["W_dec"][2].astype(np.float32))
    assert sae.decoder_row(2).dtype == np.float32


def test_bf16_weights_are_read(tmp_path):
    """issue 34: a bfloat16 SAE (safetensors BF16, which numpy cannot write) reads as its float32 values."""
    values = np.array([1.0, -2.5, 0.15625, 3.0e-3], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    exact = (bf16.astype(np.uint32) << 16).view(np.float32)
    header = json.dumps({"b_dec": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    raw = struct.pack("<Q", len(header)) + header + bf16.tobytes()
    path = tmp_path / "w.safetensors"
    path.write_bytes(raw)
    cfg = saeio.SaeConfig("standard", 4, 2, "bfloat16", True, "none", None, None, None, None, False)
    tensors, entries = {"b_dec": saeio.TensorInfo("b_dec", "BF16", (4,))}, {"b_dec": ("bf16", 8 + len(header))}
    sae = saeio.SAE(str(tmp_path), cfg, str(path), tensors, entries)
    assert np.array_equal(sae.tensor("b_dec"), exact)


# ------------------------------------------------------------------- lazy reading


def test_a_decoder_row_reads_only_that_row(monkeypatch):
    """issue 34: decoder_row(i) reads d_in floats at W_dec[i]'s offset, once; nothing else of the 298 KB."""
    calls = []
    real = os.pread

    def counting(fd, n, offset):
        calls.append((n, offset))
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting)
    sae = read_sae(FIXTURE)
    assert calls == []  # the header is read, no tensor data
    row = sae.decoder_row(10)
    assert sae.bytes_read == 576 * 4 and sum(n for n, _ in calls) == 576 * 4 and len(calls) == 1
    start = 8 + struct.unpack("<Q", open(os.path.join(FIXTURE, "sae_weights.safetensors"), "rb").read(8))[0]
    assert calls[0][1] == start + 10 * 576 * 4  # W_dec is first in the file, row 10 of it
    assert row.shape == (576,)
    sae.decoder_row(10)
    assert sae.bytes_read == 576 * 4 and len(calls) == 1  # read once


def test_an_encoder_column_reads_only_that_column(monkeypatch):
    """issue 34: encoder_column(i) reads W_enc[:, i] (one float per row of W_enc), b_enc[i] and threshold[i]."""
    read = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: read.append(n) or real(fd, n, off))
    sae = read_sae(FIXTURE)
    sae.encoder_column(63)
    assert sae.bytes_read == sum(read) == 576 * 4 + 4 + 4
    h = np.ones((3, 576), dtype=np.float32)
    sae.feature_activation(h, 63)
    assert sae.bytes_read == 576 * 4 + 4 + 4 + 576 * 4  # and b_dec, which every encoding subtracts


def test_a_whole_tensor_is_bounded(monkeypatch):
    """issue 34: a tensor read whole (topk's encoder) past MAX_SAE_DENSE_VALUES is limit-exceeded, not read."""
    monkeypatch.setattr(saeio, "MAX_SAE_DENSE_VALUES", 1000)
    sae = read_sae(FIXTURE)
    with pytest.raises(SaeError) as exc:
        sae.tensor("W_enc")
    assert exc.value.code == "limit-exceeded" and exc.value.key == "W_enc" and sae.bytes_read == 0
    sae.decoder_row(0)  # a row is still read alone


def test_a_file_cut_short_after_its_header_is_refused_at_the_read(tmp_path):
    """issue 34: a weights file truncated after read_sae checked it: the row read says so, no traceback."""
    folder = _folder(tmp_path)
    sae = read_sae(folder)
    path = os.path.join(folder, "sae_weights.safetensors")
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 100)
    with pytest.raises(SaeError) as exc:
        sae.encoder_column(3)
    assert "runs past the end of the file" in exc.value.message


def test_non_finite_weights_are_refused_when_read(tmp_path):
    """issue 34: a NaN in a row is refused naming the row; the other rows still read."""
    w = _weights()
    w["W_dec"][2, 5] = np.nan
    sae = read_sae(_folder(tmp_path, weights=w))
    with pytest.raises(SaeError) as exc:
        sae.decoder_row(2)
    assert exc.value.key == "W_dec[2]" and "NaN" in exc.value.message
    assert np.array_equal(sae.decoder_row(1), w["W_dec"][1])


@pytest.mark.parametrize("index", [-1, 4, 2**40, True, 1.0, "0"])
def test_a_feature_index_out_of_range_is_refused(tmp_path, index):
    """issue 34: feature indices are 0 .. d_sae - 1, whole numbers (not booleans): invalid-value, not IndexError."""
    sae = read_sae(_folder(tmp_path))
    for call in (sae.decoder_row, sae.encoder_column, lambda i: sae.feature_activation(np.zeros(D_IN), i)):
        with pytest.raises(SaeError) as exc:
            call(index)
        assert exc.value.code == "invalid-value" and "0 .. 3" in exc.value.message


def test_numpy_integers_are_feature_indices(tmp_path):
    """issue 34: an index from numpy (np.int64, np.uint8) is a whole number like an int; a numpy bool is not."""
    w = _weights()
    sae = read_sae(_folder(tmp_path, weights=w))
    assert np.array_equal(sae.decoder_row(np.int64(2)), w["W_dec"][2])
    assert sae.encoder_column(np.uint8(3)).index == 3 and type(sae.encoder_column(np.uint8(3)).index) is int
    with pytest.raises(SaeError):
        sae.decoder_row(np.bool_(True))


def test_activations_of_another_width_are_refused(tmp_path):
    """issue 34: the SAE's d_in against the activations' width: a d_in mismatch is said, not broadcast."""
    sae = read_sae(_folder(tmp_path))
    with pytest.raises(SaeError) as exc:
        sae.feature_activation(np.zeros((2, D_IN + 1), dtype=np.float32), 0)
    assert exc.value.code == "invalid-value" and f"[..., {D_IN}]" in exc.value.message


# ------------------------------------------------------------------------ encoders


def _reference(arch, w, h, apply=True, k=2):
    """SAELens's formulas written out in float64 (steerc's float32 result is within rounding of these)."""
    x = h.astype(np.float64) - w["b_dec"].astype(np.float64) * apply
    if arch == "gated":
        gate = x @ w["W_enc"] + w["b_gate"]
        mag = x @ (w["W_enc"] * np.exp(w["r_mag"].astype(np.float64))) + w["b_mag"]
        return (gate > 0) * np.maximum(mag, 0)
    pre = x @ w["W_enc"] + w["b_enc"]
    if arch == "jumprelu":
        return np.maximum(pre, 0) * (pre > w["threshold"])
    if arch == "topk":
        out = np.zeros_like(pre)
        top = np.argsort(pre, axis=-1)[..., -k:]
        np.put_along_axis(out, top, np.maximum(np.take_along_axis(pre, top, axis=-1), 0), axis=-1)
        return out
    return np.maximum(pre, 0)


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk", "gated"])
@pytest.mark.parametrize("apply", [True, False])
def test_the_encoders_follow_sae_lens_formulas(tmp_path, arch, apply):
    """issue 34: pre = (h - b_dec * apply_b_dec_to_input) @ W_enc + b_enc; standard relu(pre); jumprelu
    relu(pre) * (pre > threshold); topk the k largest, ReLU'd; gated (gate > 0) * relu(magnitude)."""
    w = _weights(arch, seed=4)
    sae = read_sae(_folder(tmp_path, cfg=_cfg(arch, apply_b_dec_to_input=apply), weights=w))
    h = np.random.default_rng(5).standard_normal((50, D_IN)).astype(np.float32) * 2
    want = _reference(arch, w, h, apply)
    got = sae.encode(h)
    assert got.dtype == np.float32 and got.shape == (50, D_SAE)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    for i in range(D_SAE):
        one = sae.feature_activation(h, i)
        assert one.dtype == np.float32 and np.allclose(one, want[:, i], rtol=1e-5, atol=1e-5)
    assert sae.feature_is_local is (arch != "topk")
    single = sae.feature_activation(h[0], 1)  # one activation vector: a scalar
    assert np.shape(single) == () and np.isclose(single, want[0, 1], rtol=1e-5, atol=1e-5)


def test_jumprelu_is_strict_at_the_threshold(tmp_path):
    """issue 34: JumpReLU keeps a feature only when pre > threshold (SAELens's Step): at pre == threshold it is 0."""
    w = {"W_enc": np.eye(D_IN, D_SAE, dtype=np.float32), "W_dec": np.eye(D_SAE, D_IN, dtype=np.float32),
         "b_dec": np.zeros(D_IN, np.float32), "b_enc": np.zeros(D_SAE, np.float32),
         "threshold": np.full(D_SAE, 0.5, np.float32)}
    sae = read_sae(_folder(tmp_path, weights=w))
    h = np.zeros((3, D_IN), np.float32)
    h[:, 0] = [0.5, np.nextafter(np.float32(0.5), np.float32(1)), 0.25]
    assert sae.feature_activation(h, 0).tolist() == [0.0, float(np.nextafter(np.float32(0.5), np.float32(1))), 0.0]
    assert sae.encode(h)[:, 0].tolist() == sae.feature_activation(h, 0).tolist()


def test_topk_rescaled_by_decoder_norms(tmp_path):
    """issue 34: rescale_acts_by_decoder_norm scales the pre-activations by ||W_dec[i]|| before choosing."""
    w = _weights("topk", seed=6)
    w["W_dec"][3] *= 100  # feature 3 wins whenever its pre-activation is positive
    sae = read_sae(_folder(tmp_path, cfg=_cfg("topk", k=1, rescale_acts_by_decoder_norm=True), weights=w))
    h = np.random.default_rng(7).standard_normal((40, D_IN)).astype(np.float32)
    pre = (h - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    got = sae.encode(h)
    positive = pre[:, 3] > 0
    assert np.all(np.nonzero(got[positive])[1] == 3)
    norm = np.linalg.norm(w["W_dec"][3])
    assert np.allclose(got[positive, 3], pre[positive, 3] * norm, rtol=1e-5)


# --------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("hook,site", [
    ("blocks.0.hook_resid_pre", ("resid_pre", 0)), ("blocks.8.hook_resid_post", ("resid_post", 8)),
    ("blocks.12.hook_attn_out", ("attn_out", 12)), ("blocks.29.hook_mlp_out", ("mlp_out", 29)),
])
def test_hooks_map_to_sites(hook, site):
    """issue 34: TransformerLens's hook names and steerc's sites."""
    assert site_of_hook(hook) == site and why_no_site(hook) is None


@pytest.mark.parametrize("hook,says", [
    ("blocks.8.attn.hook_z", "head by head"), ("blocks.8.hook_mlp_in", "MLP block's input"),
    ("blocks.8.hook_resid_mid", "between the attention and the MLP"), ("blocks.8.mlp.hook_post", "hidden"),
    ("hook_embed", "not a hook steerc knows"), ("blocks.x.hook_resid_post", "not a hook steerc knows"),
    ("blocks.8.hook_resid_post.extra", "not a hook steerc knows"), ("", "names no hook"),
    ("blocks.1234567.hook_resid_pre", "not a hook steerc knows"),
])
def test_other_hooks_have_no_site_and_say_why(hook, says):
    """issue 34: hooks with no steerc site (hook_z, a transcoder's hook_mlp_in, resid_mid, ...) give None and
    a reason naming the hook and the sites steerc has."""
    assert site_of_hook(hook) is None
    reason = why_no_site(hook)
    assert says in reason and "resid_pre, resid_post, attn_out and mlp_out" in reason


def test_an_sae_at_a_hook_without_a_site_reads_and_says_why(tmp_path):
    """issue 34: an SAE at resid_mid reads (a caller reports where it can be used); its site is None with why."""
    cfg = _cfg()
    cfg["metadata"]["hook_name"] = "blocks.3.hook_resid_mid"
    sae = read_sae(_folder(tmp_path, cfg=cfg))
    assert sae.site is None and "between the attention and the MLP" in sae.site_reason


# ------------------------------------------------------------------------ refusals


def _cfg_with(path: str, value, arch="jumprelu") -> dict:
    """The tiny config with ``value`` at ``path`` (``metadata.hook_name``); None as the value deletes the key."""
    cfg = _cfg(arch)
    *outer, last = path.split(".")
    node = cfg
    for part in outer:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


_DELETE = object()

CONFIG_REFUSALS = [  # (key, value, what the message says, code)
    ("d_in", _DELETE, "`d_in` is missing", "invalid-vector-file"),
    ("d_in", "576", "whole number above 0", "invalid-vector-file"),
    ("d_in", True, "whole number above 0", "invalid-vector-file"),
    ("d_in", 0, "whole number above 0", "invalid-vector-file"),
    ("d_in", 8.0, "whole number above 0", "invalid-vector-file"),
    ("d_in", 10**6, "at most 65,536", "limit-exceeded"),
    ("d_sae", 2**30, "at most 16,777,216 features", "limit-exceeded"),
    ("architecture", _DELETE, "`architecture` is missing", "invalid-vector-file"),
    ("architecture", "mystery", "steerc reads standard, jumprelu, topk and gated", "invalid-vector-file"),
    ("architecture", "abstopk", "does not read yet", "invalid-vector-file"),
    ("architecture", ["jumprelu"], "must be a string", "invalid-vector-file"),
    ("architecture", "transcoder", "transcoder", "invalid-vector-file"),
    ("architecture", "jumprelu_skip_transcoder", "transcoder", "invalid-vector-file"),
    ("metadata.hook_name_out", "blocks.8.hook_mlp_out", "transcoder", "invalid-vector-file"),
    ("dtype", "int8", "`dtype` is \"int8\"", "invalid-vector-file"),
    ("apply_b_dec_to_input", "yes", "true or false", "invalid-vector-file"),
    ("normalize_activations", "layer_norm", "normalizes each activation", "invalid-vector-file"),
    ("normalize_activations", "expected_average_only_in", "normalizes each activation", "invalid-vector-file"),
    ("normalize_activations", "constant_norm_rescale", "\"none\"", "invalid-vector-file"),
    ("normalize_activations", "sometimes", "not a normalization SAELens knows", "invalid-vector-file"),
    ("reshape_activations", "hook_z", "hook_z SAE", "invalid-vector-file"),
    ("reshape_activations", "flat", "takes \"none\" or \"hook_z\"", "invalid-vector-file"),
    ("metadata.hook_name", "blocks.2.attn.hook_z", "hook_z SAE", "invalid-vector-file"),
    ("metadata.hook_name", 8, "must be a string", "invalid-vector-file"),
    ("metadata.hook_head_index", 3, "one attention head", "invalid-vector-file"),
    ("metadata.neuronpedia_id", 7, "must be a string", "invalid-vector-file"),
    ("metadata", [], "`metadata` must be an object", "invalid-vector-file"),
    ("metadata.sae_lens_version", "six", "not a version SAELens reads", "invalid-vector-file"),
    ("metadata.sae_lens_version", 6, "must be a version string", "invalid-vector-file"),
]


@pytest.mark.parametrize("key,value,says,code", CONFIG_REFUSALS,
                         ids=[f"{k}={v if v is not _DELETE else 'deleted'}" for k, v, _, _ in CONFIG_REFUSALS])
def test_config_refusals_name_the_file_and_key(tmp_path, key, value, says, code):
    """issue 34: every wrong cfg.json value is a SaeError naming cfg.json and the key, with what is wrong:
    normalized activations, hook_z SAEs and transcoders are refused saying so."""
    err = _refused(_folder(tmp_path, cfg=_cfg_with(key, value)), code)
    assert says in err.message, err.message
    assert err.file == "cfg.json"
    assert err.key == key


def test_topk_needs_a_k_it_can_keep(tmp_path):
    """issue 34: topk's k is a whole number from 1 to d_sae (absent: SAELens's default, 100, past d_sae here)."""
    assert _refused(_folder(tmp_path, cfg=_cfg("topk", k=5), weights=_weights("topk"))).key == "k"
    cfg = _cfg("topk")
    del cfg["k"]
    assert "at most 4 features kept" in _refused(_folder(tmp_path, cfg=cfg, weights=_weights("topk"), name="b")).message
    err = _refused(_folder(tmp_path, cfg=_cfg("topk", rescale_acts_by_decoder_norm=1), weights=_weights("topk"),
                           name="c"))
    assert err.key == "rescale_acts_by_decoder_norm"


PRE_6 = {"d_in": D_IN, "d_sae": D_SAE, "hook_point": "blocks.1.hook_resid_pre", "hook_point_layer": 1,
         "activation_fn_str": "relu", "dtype": "float32", "normalize_activations": False,
         "sae_lens_training_version": "3.13.0", "model_name": "tiny", "neuronpedia_id": None}


def test_pre_6_keys_are_read(tmp_path):
    """issue 34: the flat keys of SAELens before 6.0: hook_point, activation_fn_str, a boolean
    normalize_activations, no architecture (standard), apply_b_dec_to_input true by default."""
    sae = read_sae(_folder(tmp_path, cfg=PRE_6, weights=_weights("standard")))
    c = sae.config
    assert (c.pre_6, c.architecture, c.apply_b_dec_to_input, c.normalize_activations) == (True, "standard", True, "none")
    assert sae.hook_name == "blocks.1.hook_resid_pre" and sae.site == ("resid_pre", 1)


@pytest.mark.parametrize("over,key,says", [
    ({"activation_fn_str": "tanh-relu"}, "activation_fn_str", "silently encode this one with a ReLU"),
    ({"activation_fn_str": "topk"}, "activation_fn_kwargs", "needs its `activation_fn_kwargs.k`"),
    ({"normalize_activations": True}, "normalize_activations", "\"expected_average_only_in\""),
    ({"hook_point": "blocks.0.attn.hook_z"}, "reshape_activations", "hook_z SAE"),
    ({"hook_point": 3}, "hook_point", "`hook_point` must be a string"),
    ({"hook_name_out": "blocks.0.hook_mlp_out"}, "hook_name_out", "transcoder"),
    ({"hook_point_head_index": 2}, "hook_point_head_index", "one attention head"),
])
def test_pre_6_refusals_name_the_key_the_file_used(tmp_path, over, key, says):
    """issue 34: a pre-6.0 config's refusal names its own key (hook_point, not hook_name)."""
    err = _refused(_folder(tmp_path, cfg={**PRE_6, **over}, weights=_weights("standard")))
    assert err.key == key and says in err.message and err.file == "cfg.json", (err.key, err.message)


def test_pre_6_topk_reads_k_from_its_kwargs(tmp_path):
    """issue 34: before 6.0 a topk SAE was activation_fn "topk" with activation_fn_kwargs.k."""
    cfg = {**PRE_6, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3}}
    sae = read_sae(_folder(tmp_path, cfg=cfg, weights=_weights("standard")))
    assert (sae.architecture, sae.config.k) == ("topk", 3)


@pytest.mark.parametrize("edit,key,says", [
    (lambda w: w.pop("threshold"), "threshold", "has no tensor `threshold`, which a jumprelu SAE needs"),
    (lambda w: w.pop("W_dec"), "W_dec", "has no tensor `W_dec`"),
    (lambda w: w.update(log_threshold=np.zeros(D_SAE, np.float32)), "log_threshold", "does not have"),
    (lambda w: w.update(W_enc=np.zeros((D_IN + 1, D_SAE), np.float32)), "W_enc", "must be [8, 4]"),
    (lambda w: w.update(W_dec=np.zeros((D_IN, D_SAE), np.float32)), "W_dec", "must be [4, 8]"),
    (lambda w: w.update(b_dec=np.zeros(D_IN + 2, np.float32)), "b_dec", "d_in = 8"),
    (lambda w: w.update(threshold=np.zeros(D_SAE, np.int32)), "threshold", "must be floating point"),
    (lambda w: w.update(scaling_factor=np.full(D_SAE, 2, np.float32)), "scaling_factor", "not all ones"),
    (lambda w: w.update(scaling_factor=np.ones(D_SAE + 1, np.float32)), "scaling_factor", "must be [4]"),
])
def test_weight_refusals_name_the_file_and_tensor(tmp_path, edit, key, says):
    """issue 34: a missing, extra, misshapen or integer tensor is refused from the header, naming it."""
    w = _weights()
    edit(w)
    err = _refused(_folder(tmp_path, weights=w))
    assert err.file == "sae_weights.safetensors" and err.key == key and says in err.message, err.message


def test_a_scaling_factor_of_ones_is_dropped(tmp_path):
    """issue 34: SAELens drops a scaling_factor of all ones (older SAEs carry one); steerc too."""
    w = {**_weights(), "scaling_factor": np.ones(D_SAE, np.float32)}
    sae = read_sae(_folder(tmp_path, weights=w))
    assert "scaling_factor" not in sae.tensors and sae.bytes_read == 0


@pytest.mark.parametrize("content,says", [
    (b"", "too short"), (b"\x10\x00\x00\x00\x00\x00\x00\x00[1,2]", "header"),
    (struct.pack("<Q", 2**62) + b"{}", "out of range"), (b"not safetensors at all", "header"),
])
def test_a_corrupt_weights_file_is_refused(tmp_path, content, says):
    """issue 34: the safetensors header is checked as any vector file's is (its reader), and named."""
    folder = _folder(tmp_path)
    with open(os.path.join(folder, "sae_weights.safetensors"), "wb") as fh:
        fh.write(content)
    err = _refused(folder)
    assert err.message.startswith("`sae_weights.safetensors`: ") and says in err.message, err.message


@pytest.mark.parametrize("content,says", [
    ("{", "not JSON"), ("[1, 2]", "JSON object"), ('{"d_in": 1e999}', "not JSON"), ("\ufeff{}", "not JSON"),
    ('{"a": ' * 300 + "1" + "}" * 300, "nest"), ('{"d_in": NaN}', "not JSON"),
])
def test_a_config_that_is_not_json_is_refused(tmp_path, content, says):
    """issue 34: cfg.json goes through steerc's bounded JSON reader: no traceback whatever it holds."""
    folder = _folder(tmp_path)
    with open(os.path.join(folder, "cfg.json"), "w", encoding="utf-8") as fh:
        fh.write(content)
    err = _refused(folder)
    assert err.file == "cfg.json" and says in err.message, err.message


def test_a_config_past_the_json_limit_is_refused_unread(tmp_path, monkeypatch):
    """issue 34: cfg.json is read at most MAX_JSON_BYTES (plus one byte, to know)."""
    monkeypatch.setattr(saeio, "MAX_JSON_BYTES", 100)
    folder = _folder(tmp_path)
    assert "larger than" in _refused(folder).message


def test_missing_files_and_folders(tmp_path):
    """issue 34: a folder that is not there, a file given as the folder, a folder without either file."""
    assert _refused(str(tmp_path / "nowhere"), "file-not-found").message == f"`{tmp_path / 'nowhere'}` does not exist"
    (tmp_path / "file").write_text("x")
    assert "is a file, not an SAE folder" in _refused(str(tmp_path / "file")).message
    folder = _folder(tmp_path)
    os.remove(os.path.join(folder, "cfg.json"))
    err = _refused(folder)
    assert err.file == "cfg.json" and "has no `cfg.json`" in err.message
    folder = _folder(tmp_path, name="b")
    os.remove(os.path.join(folder, "sae_weights.safetensors"))
    assert _refused(folder).file == "sae_weights.safetensors"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    """issue 34: cfg.json as a named pipe would block a reader forever: refused as not a regular file."""
    folder = _folder(tmp_path)
    os.remove(os.path.join(folder, "cfg.json"))
    os.mkfifo(os.path.join(folder, "cfg.json"))
    assert "not a regular file" in _refused(folder).message


# ---------------------------------------------------------------------- path policy


def test_a_folder_outside_the_root_is_refused_before_reading(tmp_path):
    """issue 34: with a project root, `../elsewhere` (or an absolute path) outside it is path-escape, and
    nothing is tested, not even existence."""
    root = tmp_path / "project"
    root.mkdir()
    outside = _folder(tmp_path, name="outside")
    err = _refused(os.path.join(str(root), "..", "outside"), "path-escape", root=str(root))
    assert "leaves the project root" in err.message
    assert _refused(str(tmp_path / "not-there"), "path-escape", root=str(root))
    assert read_sae(outside).d_sae == D_SAE  # without a root, a library call reads it


@pytest.mark.parametrize("member", ["cfg.json", "sae_weights.safetensors"])
def test_a_link_out_of_the_root_inside_the_folder_is_refused(tmp_path, member):
    """issue 34: the folder is inside the root but one of its files is a link out of it: path-escape."""
    root = tmp_path / "project"
    root.mkdir()
    outside = _folder(tmp_path, name="outside")
    inside = _folder(root, name="sae")
    os.remove(os.path.join(inside, member))
    os.symlink(os.path.join(outside, member), os.path.join(inside, member))
    err = _refused(inside, "path-escape", root=str(root))
    assert member in err.message


def test_a_link_to_the_folder_out_of_the_root_is_refused(tmp_path):
    """issue 34: a link inside the root to an SAE folder outside it: path-escape, as a vector file's link is."""
    root = tmp_path / "project"
    root.mkdir()
    outside = _folder(tmp_path, name="outside")
    os.symlink(outside, root / "sae")
    _refused(str(root / "sae"), "path-escape", root=str(root))


def test_links_inside_the_root_are_followed(tmp_path):
    """issue 34: a link that stays inside the root is fine, for the folder and for its files."""
    root = tmp_path / "project"
    root.mkdir()
    real = _folder(root, name="real")
    os.symlink(real, root / "alias")
    assert read_sae(str(root / "alias"), root=str(root)).d_in == D_IN


# ---------------------------------------------------------------- whatever the input


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False,
                     allow_infinity=False) | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=12)
_keys = st.sampled_from(["d_in", "d_sae", "dtype", "architecture", "apply_b_dec_to_input", "normalize_activations",
                         "reshape_activations", "metadata", "k", "rescale_acts_by_decoder_norm", "hook_point",
                         "activation_fn_str", "activation_fn_kwargs", "sae_lens_version", "hook_name_out"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6), st.booleans())
def test_any_config_reads_or_is_a_sae_error(tmp_path_factory, edits, keep_6):
    """issue 34: whatever cfg.json holds, read_sae returns an SAE or raises SaeError: never another exception."""
    folder = tmp_path_factory.mktemp("fuzz")
    cfg = _cfg() if keep_6 else dict(PRE_6)
    cfg.update(edits)
    (folder / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")
    save_file(_weights(), str(folder / "sae_weights.safetensors"))
    try:
        sae = read_sae(str(folder))
    except SaeError as exc:
        assert exc.code and exc.message and exc.file in ("cfg.json", "sae_weights.safetensors")
    else:
        assert sae.d_in == D_IN and sae.architecture in saeio.ARCHITECTURES
