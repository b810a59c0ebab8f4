"""steerc's SAE folder reader (steerc/io/sae.py) against sae-lens 6.54 itself (issue 34).

sae-lens pulls transformer-lens 3, which needs transformers 5, so this runs in an environment of its own,
``.venv-sae`` (``./dev test-sae`` builds it). Elsewhere it skips, saying so; under ``CI=true`` or
``STEERC_SAE_TESTS=1`` a missing sae-lens fails.

What is compared, on the fixtures of tests/fixtures/saes (written by sae-lens's own ``SAE.save_model``) and
on folders the tests write with it (topk, gated, the pre-6.0 config keys):

* the weights: every tensor, row and column steerc reads equals ``SAE.load_from_disk``'s, bitwise;
* the config: architecture, widths, hook, Neuronpedia id, ``apply_b_dec_to_input``, topk's ``k``;
* the encoders. The element-wise steps are bitwise: steerc's ``sae_in`` is SAELens's ``process_sae_in``, and
  steerc's activation function on SAELens's own pre-activations (caught at ``hook_sae_acts_pre``) is
  ``SAE.encode``. The matrix product is not bitwise, and cannot be: a float32 product's rounding depends on
  the BLAS kernel's order of summation, which depends on the library, the CPU and the batch's shape;
  SAELens's own ``encode`` of one row and of the same row inside a batch differ by up to about 1e-5 on this
  fixture (torch 2.13 with MKL, AVX-512, measured 2026-12-05). So steerc's ``feature_activation(h, i)`` and
  ``encode(h)`` and SAELens's ``SAE.encode(h)`` are each held within the float32 rounding bound of a dot
  product of d_in terms around the exact (float64) value, and the features that fire are the same wherever
  the pre-activation is farther than that bound from the threshold.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from own_env import require

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "saes")
JUMPRELU = os.path.join(FIXTURES, "smollm2-l8")
RELU = os.path.join(FIXTURES, "smollm2-l8-relu")
U = 2.0**-24  # float32's unit roundoff


require("sae_lens", "sae")
import torch  # noqa: E402
from sae_lens import SAE  # noqa: E402

from steerc.io.sae import read_sae  # noqa: E402


def _theirs(folder: str):
    return SAE.load_from_disk(folder)


def _activations(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Random activations of SmolLM2's scale at layer 8 (entries of a few units), float32 [n, 576]."""
    return (np.random.default_rng(seed).standard_normal((n, 576)) * scale).astype(np.float32)


def _their_encode(sae, h: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return sae.encode(torch.from_numpy(h)).numpy()


def _their_pre(sae, h: np.ndarray) -> np.ndarray:
    """SAELens's own pre-activations, as its hook_sae_acts_pre sees them during SAE.encode."""
    caught = []
    handle = sae.hook_sae_acts_pre.register_forward_hook(lambda _m, _i, out: caught.append(out.detach().clone()))
    try:
        _their_encode(sae, h)
    finally:
        handle.remove()
    return caught[0].numpy()


def _exact(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the exact pre-activation in float64, the float32 rounding bound of computing it in float32)."""
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    n = x.shape[-1] + 2  # the products' sum, the bias, and b_dec's subtraction before them
    gamma = n * U / (1 - n * U)
    return x64 @ w64 + b64, gamma * (np.abs(x64) @ np.abs(w64) + np.abs(b64)) + 4 * U * np.abs(x64 @ w64 + b64)


def _save(tmp_path, name: str, sae, cfg_edit=None) -> str:
    folder = str(tmp_path / name)
    sae.save_model(folder)
    if cfg_edit is not None:
        path = os.path.join(folder, "cfg.json")
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(cfg_edit(cfg), fh)
    return folder


def _random_sae(cls_name: str, d_sae: int, seed: int, **cfg):
    """An SAE of sae-lens's class ``cls_name`` (StandardSAE, TopKSAE, GatedSAE, ...) with random weights."""
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata

    config = getattr(sae_lens, cls_name + "Config")(
        d_in=576, d_sae=d_sae, metadata=SAEMetadata(hook_name="blocks.8.hook_resid_post", model_name="m"), **cfg)
    sae = getattr(sae_lens, cls_name)(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            scale = 1 / 24 if p.ndim == 2 else 0.3
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return sae


# ---------------------------------------------------------------- weights and config


@pytest.mark.parametrize("folder", [JUMPRELU, RELU], ids=["jumprelu", "relu"])
def test_the_weights_are_sae_lens_own(folder):
    """issue 34: every tensor steerc reads from a SAELens folder equals SAE.load_from_disk's, bitwise; so do the
    rows and columns it reads alone."""
    theirs, ours = _theirs(folder), read_sae(folder)
    state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    assert sorted(state) == sorted(ours.tensors)
    for name, value in state.items():
        assert np.array_equal(ours.tensor(name), value), name
    fresh = read_sae(folder)
    for i in (0, 1, ours.d_sae - 1):
        assert np.array_equal(fresh.decoder_row(i), state["W_dec"][i])
        col = fresh.encoder_column(i)
        assert np.array_equal(col.w, state["W_enc"][:, i]) and col.bias == state["b_enc"][i]
        if "threshold" in state:
            assert col.threshold == state["threshold"][i]


@pytest.mark.parametrize("folder", [JUMPRELU, RELU], ids=["jumprelu", "relu"])
def test_the_config_is_read_as_sae_lens_reads_it(folder):
    """issue 34: architecture, widths, dtype, hook, Neuronpedia id and apply_b_dec_to_input as SAELens sees them."""
    theirs, ours = _theirs(folder), read_sae(folder)
    cfg = theirs.cfg
    assert (ours.architecture, ours.d_in, ours.d_sae) == (cfg.architecture(), cfg.d_in, cfg.d_sae)
    assert ours.config.dtype == cfg.dtype and ours.config.apply_b_dec_to_input == cfg.apply_b_dec_to_input
    assert ours.hook_name == cfg.metadata.hook_name == "blocks.8.hook_resid_post"
    assert ours.neuronpedia_id == cfg.metadata.neuronpedia_id and ours.model_name == cfg.metadata.model_name
    assert ours.site == ("resid_post", 8) and not ours.config.pre_6


# ------------------------------------------------------------------------ encoders


@pytest.mark.parametrize("folder", [JUMPRELU, RELU], ids=["jumprelu", "relu"])
def test_sae_in_and_the_activation_function_are_bitwise_sae_lens(folder):
    """issue 34: the element-wise steps are SAELens's, bitwise: process_sae_in, and the activation function on
    SAELens's own pre-activations gives SAE.encode exactly."""
    theirs, ours = _theirs(folder), read_sae(folder)
    h = _activations(64, seed=1)
    with torch.no_grad():
        assert np.array_equal(ours.sae_in(h), theirs.process_sae_in(torch.from_numpy(h)).numpy())
    pre = _their_pre(theirs, h)
    assert np.array_equal(ours.activate(pre), _their_encode(theirs, h))
    for i in (0, 5, ours.d_sae - 1):  # one feature's own threshold, as feature_activation uses it
        col = ours.encoder_column(i)
        assert np.array_equal(ours.activate(pre[:, i], threshold=col.threshold), _their_encode(theirs, h)[:, i])


@pytest.mark.parametrize("folder", [JUMPRELU, RELU], ids=["jumprelu", "relu"])
@pytest.mark.parametrize("batch", [1, 7, 200])
def test_feature_activation_equals_sae_encode(folder, batch):
    """issue 34: feature_activation(h, i) and encode(h) equal SAE.encode(h)[:, i] within float32's rounding of
    the encoder's dot products (not bitwise: see the module's doc), and the same features fire wherever the
    pre-activation is clear of the threshold by more than that rounding."""
    theirs, ours = _theirs(folder), read_sae(folder)
    h = _activations(batch, seed=batch)
    enc_theirs, enc_ours = _their_encode(theirs, h), ours.encode(h)
    x = ours.sae_in(h)
    w, b = ours.tensor("W_enc"), ours.tensor("b_enc")
    exact, bound = _exact(x, w, b)
    threshold = ours.tensor("threshold") if ours.architecture == "jumprelu" else np.zeros(ours.d_sae)
    clear = np.abs(exact - threshold) > bound
    assert clear.mean() > 0.99  # the comparison below is about nearly every entry
    fires = (exact > threshold) & clear
    for i in range(ours.d_sae):
        one = ours.feature_activation(h, i)
        assert one.dtype == np.float32 and one.shape == (batch,)
        for got in (one, enc_ours[:, i], enc_theirs[:, i]):
            assert np.all(np.abs(got - np.where(exact[:, i] > threshold[i], exact[:, i], 0))[clear[:, i]]
                          <= bound[:, i][clear[:, i]]), i
            assert np.array_equal((got > 0)[clear[:, i]], fires[:, i][clear[:, i]]), i
    assert 0.05 < fires.mean() < 0.95  # the fixture exercises both branches


def test_sae_lens_itself_is_not_bitwise_across_batch_shapes():
    """issue 34: why the encoder comparison has a bound: SAELens's SAE.encode of each row alone differs from
    the same rows in one batch (here; the size of the difference is the BLAS kernel's), within the same bound."""
    theirs, ours = _theirs(JUMPRELU), read_sae(JUMPRELU)
    h = _activations(200, seed=3)
    pre_batch = _their_pre(theirs, h)
    pre_rows = np.concatenate([_their_pre(theirs, h[j:j + 1]) for j in range(len(h))])
    _, bound = _exact(ours.sae_in(h), ours.tensor("W_enc"), ours.tensor("b_enc"))
    assert np.all(np.abs(pre_batch - pre_rows) <= 2 * bound)


def test_only_the_asked_rows_are_read_where_sae_lens_reads_all():
    """issue 34: one feature's activation reads its column, two scalars and b_dec: a few KiB of the fixture's
    298 KB, and the same values SAELens computes from all of it."""
    ours = read_sae(JUMPRELU)
    h = _activations(16, seed=9)
    got = ours.feature_activation(h, 7)
    assert ours.bytes_read == 576 * 4 + 4 + 4 + 576 * 4  # W_enc[:, 7], b_enc[7], threshold[7], b_dec
    assert np.allclose(got, _their_encode(_theirs(JUMPRELU), h)[:, 7], rtol=0, atol=1e-4)


# ----------------------------------------------------------------- topk and gated


def test_topk_is_sae_lens_topk(tmp_path):
    """issue 34: a topk SAE saved by sae-lens: the same k features kept (where the k-th and the next are apart
    by more than the rounding), the same values within it; its feature activation reads the whole encoder."""
    sae = _random_sae("TopKSAE", 48, seed=11, k=5)
    folder = _save(tmp_path, "topk", sae)
    theirs, ours = _theirs(folder), read_sae(folder)
    assert ours.architecture == "topk" and ours.config.k == 5 and not ours.feature_is_local
    h = _activations(100, seed=12)
    mine, their = ours.encode(h), _their_encode(theirs, h)
    exact, bound = _exact(ours.sae_in(h), ours.tensor("W_enc"), ours.tensor("b_enc"))
    ordered = np.sort(exact, axis=-1)
    clear = (ordered[:, -5] - ordered[:, -6]) > 2 * bound.max(axis=-1)
    assert clear.mean() > 0.9
    assert np.array_equal((mine != 0)[clear], (their != 0)[clear])
    assert np.all(np.abs(mine - their)[clear] <= 2 * bound[clear])
    assert np.array_equal(ours.feature_activation(h, 3), mine[:, 3])
    assert np.count_nonzero(mine, axis=-1).max() <= 5


def test_topk_rescaled_by_the_decoder_norm(tmp_path):
    """issue 34: rescale_acts_by_decoder_norm multiplies the pre-activations by the decoder rows' norms before
    the top k are chosen, as TopKSAE.encode does."""
    sae = _random_sae("TopKSAE", 32, seed=13, k=4, rescale_acts_by_decoder_norm=True)
    folder = _save(tmp_path, "topk-rescaled", sae)
    theirs, ours = _theirs(folder), read_sae(folder)
    assert ours.config.rescale_acts_by_decoder_norm
    h = _activations(50, seed=14)
    mine, their = ours.encode(h), _their_encode(theirs, h)
    assert np.array_equal(mine != 0, their != 0)
    assert np.allclose(mine, their, rtol=1e-5, atol=1e-4)


def test_gated_is_sae_lens_gated(tmp_path):
    """issue 34: a gated SAE saved by sae-lens: b_gate, b_mag and r_mag read as SAELens reads them; the gate and
    magnitude paths on SAELens's own pre-activations give SAE.encode bitwise, and feature_activation is within
    the rounding of SAELens's encode."""
    sae = _random_sae("GatedSAE", 24, seed=15)
    folder = _save(tmp_path, "gated", sae)
    theirs, ours = _theirs(folder), read_sae(folder)
    assert ours.architecture == "gated" and sorted(ours.tensors) == sorted(theirs.state_dict())
    h = _activations(40, seed=16)
    mag = _their_pre(theirs, h)  # hook_sae_acts_pre sees the magnitude path
    with torch.no_grad():
        gate = (theirs.process_sae_in(torch.from_numpy(h)) @ theirs.W_enc + theirs.b_gate).numpy()
    their = _their_encode(theirs, h)
    assert np.array_equal(ours.activate(mag, gate_pre=gate), their)
    col = ours.encoder_column(2)
    assert col.bias == ours.tensor("b_gate")[2] and col.b_mag == ours.tensor("b_mag")[2]
    assert col.r_mag == ours.tensor("r_mag")[2]
    for i in range(ours.d_sae):
        assert np.allclose(ours.feature_activation(h, i), their[:, i], rtol=1e-5, atol=1e-4), i


# ------------------------------------------------------------------ pre-6.0 configs


def _pre_6(folder: str, tmp_path, name: str, cfg: dict) -> str:
    """A copy of ``folder``'s weights beside a config in the flat keys of a SAELens before 6.0."""
    out = tmp_path / name
    out.mkdir()
    shutil.copy(os.path.join(folder, "sae_weights.safetensors"), out / "sae_weights.safetensors")
    (out / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(out)


PRE_4 = {  # SAELens 3.x/4.x: hook_point, hook_point_layer, activation_fn_str, a boolean normalize_activations
    "model_name": "HuggingFaceTB/SmolLM2-135M", "hook_point": "blocks.8.hook_resid_post", "hook_point_layer": 8,
    "hook_point_head_index": None, "d_in": 576, "d_sae": 16, "dtype": "float32", "device": "cpu",
    "activation_fn_str": "relu", "apply_b_dec_to_input": True, "normalize_activations": False,
    "finetuning_scaling_factor": False, "context_size": 128, "prepend_bos": True,
    "sae_lens_training_version": "3.13.0", "neuronpedia_id": "smollm2/8-res",
}
PRE_6_JUMPRELU = {  # SAELens 5.x: flat hook_name, an architecture, sae_lens_training_version only
    "architecture": "jumprelu", "d_in": 576, "d_sae": 64, "dtype": "float32", "device": "cpu",
    "model_name": "HuggingFaceTB/SmolLM2-135M", "hook_name": "blocks.8.hook_resid_post", "hook_layer": 8,
    "hook_head_index": None, "activation_fn": "relu", "activation_fn_kwargs": {}, "apply_b_dec_to_input": False,
    "normalize_activations": "none", "finetuning_scaling_factor": False, "sae_lens_training_version": "5.9.1",
    "neuronpedia_id": None,
}


@pytest.mark.parametrize("name,folder,cfg", [("pre-4", RELU, PRE_4), ("pre-6-jumprelu", JUMPRELU, PRE_6_JUMPRELU),
                                             ("pre-6-topk", RELU, {**PRE_4, "activation_fn_str": "topk",
                                                                   "activation_fn_kwargs": {"k": 3}})],
                         ids=["pre-4", "pre-6-jumprelu", "pre-6-topk"])
def test_pre_6_configs_read_as_sae_lens_reads_them(tmp_path, name, folder, cfg):
    """issue 34: the flat keys of SAELens before 6.0 (hook_point, activation_fn_str, boolean
    normalize_activations, topk by activation_fn_kwargs.k) read as SAELens 6.54 reads them, and encode alike."""
    path = _pre_6(folder, tmp_path, name, cfg)
    theirs, ours = _theirs(path), read_sae(path)
    assert ours.config.pre_6
    assert (ours.architecture, ours.d_in, ours.d_sae) == (theirs.cfg.architecture(), theirs.cfg.d_in,
                                                         theirs.cfg.d_sae)
    assert ours.hook_name == theirs.cfg.metadata.hook_name and ours.site == ("resid_post", 8)
    assert ours.neuronpedia_id == theirs.cfg.metadata.neuronpedia_id
    assert ours.config.apply_b_dec_to_input == theirs.cfg.apply_b_dec_to_input
    if ours.architecture == "topk":
        assert ours.config.k == theirs.cfg.k == 3
    h = _activations(30, seed=21)
    with torch.no_grad():
        assert np.array_equal(ours.sae_in(h), theirs.process_sae_in(torch.from_numpy(h)).numpy())
    mine, their = ours.encode(h), _their_encode(theirs, h)
    assert np.allclose(mine, their, rtol=1e-5, atol=1e-4)
    if ours.architecture != "topk":
        assert np.array_equal(ours.activate(_their_pre(theirs, h)), their)
