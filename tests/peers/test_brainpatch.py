"""BrainPatch 1.2.0 itself beside ``steerc import`` and ``--target brainpatch`` (issue 37).

Each variant is an archive written by BrainPatch's own ``save_patch``; BrainPatch's transformers backend (the
reference: its own forward hooks, ``_install_hooks``, on SmolLM2-135M-Instruct in float32) generates 20 greedy
tokens; ``steerc import`` makes the program, steerc's HF runtime runs it on the same model, and the tokens are
the same and every step's logits bitwise equal. The other way, ``lower`` + ``archive_bytes`` (what
``steerc compile --target brainpatch`` writes) are byte-identical to ``save_patch`` of the same manifest and
vectors, ``load_patch`` reads them, and BrainPatch running steerc's export generates what it generated from
its own archive; a tampered archive is refused by both.

Run by ``./dev test-peers``, which installs ``brainpatch[transformers]==1.2.0`` into ``.venv-peers``;
elsewhere this skips, saying so.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))

import own_env  # noqa: E402
from own_env import require  # noqa: E402

torch = require("torch")
require("brainpatch")

from brainpatch.backends.transformers_backend import TransformersBackend  # noqa: E402
from brainpatch.patch import tensors as ts  # noqa: E402
from brainpatch.patch.format import Manifest  # noqa: E402
from brainpatch.patch.loader import PatchLoadError, load_patch, save_patch  # noqa: E402

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "The best thing about a spring morning is"
STEPS = 20


def _iv(layer, vector, coefficient, site="all"):
    return {"layer": layer, "vector": vector, "coefficient": coefficient, "site": site}


# name -> (interventions, schedule, dtype, BrainPatch's live strength, steerc's value of `strength`)
VARIANTS = {
    "all": ([_iv(8, "joy", 4.0)], None, "F32", None, None),
    "float16": ([_iv(8, "joy", 4.0)], None, "F16", None, None),
    "continuation": ([_iv(8, "joy", 6.0, "continuation")], None, "F32", None, None),
    "prompt": ([_iv(8, "joy", 6.0, "prompt")], None, "F32", None, None),
    "schedule": ([_iv(8, "joy", 4.0), _iv(12, "calm", 2.0, "continuation")], {"0": 1.0, "3": 0.5, "8": 0.0},
                 "F32", None, None),
    "strength": ([_iv(8, "joy", 4.0)], None, "F32", 0.5, 0.5),
    "clamped": ([_iv(8, "joy", 1.0)], None, "F32", 20.0, 8.0),  # BrainPatch clamps to max_abs_strength 8
    "two at one layer": ([_iv(8, "joy", 3.0), _iv(8, "calm", -2.0)], None, "F16", None, None),
    "two scopes at one layer": ([_iv(8, "joy", 3.0), _iv(8, "calm", -2.0, "prompt")], None, "F32", None, None),
}


@pytest.fixture(scope="module")
def smollm2():
    _, model, tokenizer = own_env.smollm2()
    return model.float().eval(), tokenizer


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(37)
    return {name: (rng.standard_normal(576) * 0.6).astype(np.float32) for name in ("joy", "calm")}


def _save(folder, variant, vectors):
    interventions, schedule, dtype, *_ = VARIANTS[variant]
    manifest = Manifest.from_dict({
        "name": "joy", "base_model": {"model_id": MODEL_ID, "architecture": "LlamaForCausalLM", "hidden_size": 576,
                                      "num_layers": 30, "torch_dtype": "float32"},
        "interventions": interventions, "schedule": schedule, "description": "issue 37"})
    used = {iv["vector"] for iv in interventions}
    tensors = {k: ts.Tensor(dtype, (576,), [float(x) for x in v]) for k, v in vectors.items() if k in used}
    return save_patch(manifest, tensors, os.path.join(str(folder), "joy.brainpatch"))


def _brainpatch_generate(model, tokenizer, path, strength, mode="strict"):
    backend = TransformersBackend()
    backend.model, backend.tokenizer, backend.model_id, backend.device = model, tokenizer, MODEL_ID, "cpu"
    backend.install_patch(load_patch(path), strength=strength, mode=mode)
    backend._trace, backend._apply_to_prompt = [], True
    backend._install_hooks()  # BrainPatch's own hooks, as its generate() installs them
    try:
        return _generate(model, tokenizer)
    finally:
        backend._remove_hooks()


def _generate(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=STEPS, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)
    return out.sequences[0].tolist(), [s[0].clone() for s in out.scores]


def _imported(folder, path):
    from steerc.core.source import Source
    from steerc.formats.brainpatch import convert
    from steerc.frontend.fmt import format_source

    made = convert(str(path), "joy")
    for name, data in made.files.items():
        (folder / name).write_bytes(data)
    text, _ = format_source(Source("joy.steer", made.text))
    (folder / "joy.steer").write_text(text)
    return text


def _plan(model, folder, text):
    from steerc.api import Options, check_source
    from steerc.runtime.hf import facts_from_model

    result = check_source(text, "joy.steer", path=str(folder / "joy.steer"),
                          options=Options(base_dir=str(folder), root=str(folder)), facts=facts_from_model(model))
    assert result.ok, result.render()
    return result


def _steerc_generate(model, tokenizer, plan, strength):
    from steerc.runtime.hf import install

    params = {} if strength is None else {"strength": strength}
    with install(model, plan, tokenizer, params=params):
        return _generate(model, tokenizer)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_steerc_runs_an_imported_patch_as_brainpatch_does(smollm2, vectors, variant, tmp_path):
    """issue 37: the same greedy tokens and every step's logits bitwise equal (all but the two-scope variant,
    whose exactness the import keeps by summing the prompt's vectors into one)."""
    model, tokenizer = smollm2
    path = _save(tmp_path, variant, vectors)
    *_, theirs_strength, ours_strength = VARIANTS[variant]
    theirs_tokens, theirs = _brainpatch_generate(model, tokenizer, path, theirs_strength)
    plain_tokens, plain = _generate(model, tokenizer)
    text = _imported(tmp_path, path)
    ours_tokens, ours = _steerc_generate(model, tokenizer, _plan(model, tmp_path, text).plan, ours_strength)
    assert ours_tokens == theirs_tokens, text
    assert len(ours) == len(theirs) > 0
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), (variant, step, float((a - b).abs().max()))
    assert any(not torch.equal(a, b) for a, b in zip(plain, theirs)), "the patch changes the logits"


@pytest.mark.parametrize("variant", ["all", "float16", "schedule", "strength", "two at one layer"])
def test_the_export_is_save_patchs_bytes_and_brainpatch_runs_it(smollm2, vectors, variant, tmp_path):
    """issue 37: steerc's archive is byte-identical to save_patch of the same manifest and vectors, loads with
    load_patch, and BrainPatch generates from it exactly what it generated from its own archive."""
    from steerc.io.brainpatch import archive_bytes
    from steerc.targets.brainpatch.lower import lower

    model, tokenizer = smollm2
    path = _save(tmp_path, variant, vectors)
    *_, theirs_strength, _ = VARIANTS[variant]
    text = _imported(tmp_path, path)
    result = _plan(model, tmp_path, text)
    manifest, stored = lower(result.plan, result.facts)
    ours = archive_bytes(manifest, stored)
    (tmp_path / "out").mkdir()
    again = save_patch(Manifest.from_dict(manifest),
                       {k: ts.Tensor(d, (576,), [float(x) for x in v]) for k, (d, v) in stored.items()},
                       str(tmp_path / "out" / "joy.brainpatch"))
    assert again.read_bytes() == ours
    exported = tmp_path / "exported.brainpatch"
    exported.write_bytes(ours)
    load_patch(exported)
    # steerc compiled for the live model, whose id it does not know (the binding names its family): BrainPatch's
    # architecture mode checks the layers and the width
    ours_tokens, ours_scores = _brainpatch_generate(model, tokenizer, exported, theirs_strength, mode="architecture")
    theirs_tokens, theirs_scores = _brainpatch_generate(model, tokenizer, path, theirs_strength)
    assert ours_tokens == theirs_tokens
    assert all(torch.equal(a, b) for a, b in zip(ours_scores, theirs_scores))


def test_a_tampered_archive_is_refused_by_both(vectors, tmp_path):
    """issue 37: a member changed after writing (its checksum kept) fails BrainPatch's load_patch and steerc's
    reader, each saying which member."""
    import zipfile

    from steerc.io.brainpatch import ArchiveError, read_archive

    path = _save(tmp_path, "all", vectors)
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i.filename) for i in zf.infolist()}
    members["manifest.json"] = members["manifest.json"].replace(b'"coefficient": 4.0', b'"coefficient": 40.0')
    bad = tmp_path / "bad.brainpatch"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(PatchLoadError, match="checksum mismatch"):
        load_patch(bad)
    with pytest.raises(ArchiveError, match="does not match its checksum"):
        read_archive(str(bad))
