"""steerc's ``clamp feature s[i] to c`` and ``add c * s[i]`` against sae-lens 6.54 itself (issue 34).

Runs in ``.venv-sae`` (``./dev test-sae``); elsewhere it skips, saying so (under ``CI=true`` or
``STEERC_SAE_TESTS=1`` a missing sae-lens fails). On the SmolLM2 fixture (tests/fixtures/saes, written by
sae-lens's own ``SAE.save_model``), a program is compiled against SmolLM2-135M's facts and its plan's kernel
is run by steerc's runtime dispatch (``steerc.runtime.kernels.steer``, the function every runtime and the
emitted package run) on float32 activations, beside SAELens:

* ``clamp feature s[i] to c`` against SAELens's splice with the error term: the SAE loaded with
  ``SAE.load_from_disk``, its error term on (``use_error_term``: the output is ``decode(f') + (h -
  decode(encode(h)))``), and a hook on ``hook_sae_acts_post`` that sets feature ``i`` to ``c``. Within 1e-4
  of the activations' scale: SAELens decodes all 64 features and subtracts two reconstructions, steerc adds
  one row, so the float32 roundings differ (the exact values agree: see ``tests/test_sae_steer.py``);
* ``add c * s[i]`` against SAELens's steering, ``h + c * sae.W_dec[i]``: bitwise (one float32 product, and
  steerc folds ``c * W_dec[i]`` in float64 and rounds once).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from own_env import require

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
RELU = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8-relu")
SMOLLM2 = os.path.join(REPO, "tests", "fixtures", "examples", "models", "real", "smollm2-135m-instruct")


require("sae_lens", "sae")
import torch  # noqa: E402
from sae_lens import SAE  # noqa: E402

from steerc.api import Options, check_source  # noqa: E402
from steerc.facts import load_facts  # noqa: E402
from steerc.ir.kernels import kind_of  # noqa: E402
from steerc.runtime import kernels as S  # noqa: E402


def _plan_op(tmp_path, folder: str, op: str):
    """The one kernel op of ``op`` at resid_post[8], compiled against SmolLM2-135M's facts."""
    shutil.copytree(folder, tmp_path / "saes" / "s")
    (tmp_path / "steer.toml").write_text("")
    text = f'steer 1\n\nsae s = sae("saes/s")\n\nintervention x {{\n  at resid_post[8]\n  {op}\n}}\n'
    result = check_source(text, "x.steer", path=str(tmp_path / "x.steer"), facts=load_facts(SMOLLM2),
                          options=Options(base_dir=str(tmp_path), root=str(tmp_path)))
    assert result.ok and not result.diagnostics, result.render()
    (site,) = result.plan.sites
    (kernel,) = site.kernels
    return kernel.op


def _steerc(op, h: torch.Tensor) -> torch.Tensor:
    """The plan's kernel by steerc's runtime dispatch, in float32, at every row."""
    kind = kind_of(op)
    operands = {role: torch.from_numpy(np.array(v, dtype=np.float32)) if not isinstance(v, float) else v
                for role, v in kind.operands_of(op)}
    return S.steer(kind.maths, h, operands, kind.mode_of(op), torch.ones(h.shape[0], dtype=torch.bool))


def _activations(sae, index: int, n: int = 64, seed: int = 0) -> torch.Tensor:
    """SmolLM2-scale activations (entries of a few units), half of them pushed along the feature's encoder
    column so that it fires on some rows and not on others."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, sae.cfg.d_in)) * 3.0
    w = sae.W_enc[:, index].detach().double().numpy()
    h[: n // 2] += np.outer(rng.uniform(0.0, 40.0, n // 2), w / (w @ w))
    return torch.from_numpy(h.astype(np.float32))


def _splice(sae, h: torch.Tensor, index: int, c: float) -> torch.Tensor:
    """SAELens's splice with the error term, feature ``index`` set to ``c`` by a hook on its activations."""

    def clamp(acts, hook):
        acts = acts.clone()
        acts[..., index] = c
        return acts

    sae._use_error_term = True  # what HookedSAETransformer.add_sae(sae, use_error_term=True) sets
    try:
        with torch.no_grad():
            return sae.run_with_hooks(h, fwd_hooks=[("hook_sae_acts_post", clamp)])
    finally:
        sae._use_error_term = False


@pytest.mark.parametrize("folder, index, c", [(FIXTURE, 0, 40.0), (FIXTURE, 17, 0.0), (FIXTURE, 5, 3.5),
                                              (RELU, 2, 12.0), (RELU, 9, 0.0)])
def test_clamp_feature_is_saelens_splice_with_the_error_term(tmp_path, folder, index, c):
    sae = SAE.load_from_disk(folder)
    op = _plan_op(tmp_path, folder, f"clamp feature s[{index}] to {c}")
    assert type(op).__name__ == "SaeClamp" and op.mode == sae.cfg.architecture()
    h = _activations(sae, index)
    with torch.no_grad():
        fires = (sae.encode(h)[:, index] > 0).numpy()
    assert 0 < fires.sum() < len(fires), "the feature fires on some rows, not on all"
    theirs = _splice(sae, h, index, c)
    ours = _steerc(op, h)
    scale = float(h.abs().max())
    worst = float((ours - theirs).abs().max())
    print(f"clamp feature {index} to {c}: largest difference {worst:.3g} of {scale:.3g}")
    assert worst <= 1e-4 * scale, worst
    assert not torch.allclose(ours, h), "the clamp changes the activations"


def test_the_clamp_is_not_the_projection_clamp(tmp_path):
    """The issue's point: steerc's ``clamp u to c`` (the projection) is another operation."""
    sae = SAE.load_from_disk(FIXTURE)
    h = _activations(sae, 0)
    theirs = _splice(sae, h, 0, 40.0)
    projection = _plan_op(tmp_path / "a", FIXTURE, "clamp s[0] to 40")
    assert type(projection).__name__ == "Project"
    assert float((_steerc(projection, h) - theirs).abs().max()) > 1.0


@pytest.mark.parametrize("index, c", [(0, 8.0), (33, -2.5)])
def test_add_is_saelens_steering(tmp_path, index, c):
    sae = SAE.load_from_disk(FIXTURE)
    op = _plan_op(tmp_path, FIXTURE, f"add {c} * s[{index}]")
    h = _activations(sae, index)
    with torch.no_grad():
        theirs = h + c * sae.W_dec[index]
    assert torch.equal(_steerc(op, h), theirs)


def _probe(tmp_path, folder: str, index: int):
    """The plan's probe of ``read s[index]`` at resid_post[8], compiled against SmolLM2-135M's facts."""
    shutil.copytree(folder, tmp_path / "saes" / "s")
    (tmp_path / "steer.toml").write_text("")
    text = (f'steer 1\n\nsae s = sae("saes/s")\n\nprobe act {{\n  at   resid_post[8]\n  read s[{index}]\n'
            "  pool token\n}\n\nintervention x {\n  at   resid_post[8]\n  add  s[1]\n  when act > 1\n}\n")
    result = check_source(text, "x.steer", path=str(tmp_path / "x.steer"), facts=load_facts(SMOLLM2),
                          options=Options(base_dir=str(tmp_path), root=str(tmp_path)))
    assert result.ok and not result.diagnostics, result.render()
    (probe,) = result.plan.probes
    return probe


@pytest.mark.parametrize("folder, index", [(FIXTURE, 0), (FIXTURE, 17), (FIXTURE, 5), (RELU, 2), (RELU, 9)])
def test_read_s_i_is_saelens_encode(tmp_path, folder, index):
    """``read s[i]``, by the readout every runtime runs (``steerc.runtime.kernels.readout``), against
    ``SAE.encode(h)[:, i]``: equal where SAELens's own matmul and steerc's one column round alike, within
    float32's rounding of the encoder's dot product everywhere (SAELens is not bitwise even against itself
    across batch shapes: tests/sae/test_sae_lens.py), and the same rows fire."""
    sae = SAE.load_from_disk(folder)
    probe = _probe(tmp_path, folder, index)
    assert probe.kind == "sae_feature"
    h = _activations(sae, index, n=200, seed=index)
    stacked = torch.from_numpy(np.stack([v.array for v in probe.vectors]))
    ours = S.readout(probe.kind, h, stacked, probe.bias, probe.threshold)
    with torch.no_grad():
        theirs = sae.encode(h)[:, index]
    assert ours.dtype == theirs.dtype == torch.float32
    worst = float((ours - theirs).abs().max())
    scale = float(theirs.abs().max())
    print(f"read s[{index}]: largest difference {worst:.3g} of {scale:.3g}, "
          f"{int((ours == theirs).sum())} of {len(h)} rows bitwise equal")
    assert worst <= 1e-5 * max(scale, 1.0), worst
    margin = (theirs - probe.threshold).abs() > 1e-4 * max(scale, 1.0)  # rows clear of the threshold
    assert torch.equal((ours > 0)[margin], (theirs > 0)[margin])
    assert 0 < int((theirs > 0).sum()) < len(h), "the feature fires on some rows only"
