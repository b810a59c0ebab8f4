"""lm-eval 0.4.13's own ``steered`` model (``lm_eval/models/hf_steered.py``) beside steerc's HF runtime on the
program ``steerc import`` makes of the same CSV steering config (issue 37), on SmolLM2-135M in float32.

lm-eval loads a CSV row's SAE with ``sae_lens.SAE.from_pretrained(release, sae_id)``; sae-lens 6.54 needs
transformers 5 and cannot live in this environment (transformers 4.57), and there is no hub here. So lm-eval is
given a ``sae_lens`` module of one function that reads the SAELens folder of the fixture (``W_dec``, ``b_dec``
and ``cfg.hook_name``, exactly the three things lm-eval reads of the SAE): the CSV's parsing (pandas), the rows'
meaning, the hooks on module outputs and the ``add`` / ``clamp`` arithmetic are lm-eval's own code.

lm-eval 0.4.13 itself refuses a CSV ``add`` row: ``derive_steer_config`` gives every row the SAE's ``b_dec``
as its bias and ``__init__`` asserts an ``add`` has none. That is checked as such; the add's meaning is then
checked with lm-eval's own ``steer`` context manager and ``SteeredModel.add`` on its own derived config.

Run by ``./dev test-peers`` in ``.venv-peers``.
"""

from __future__ import annotations

import os
import sys
import types
from functools import partial

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import own_env  # noqa: E402

lm_eval = own_env.require("lm_eval")
torch = own_env.require("torch")
np = own_env.require("numpy")

SAE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
PROMPTS = ("The weather today is", "I opened the letter and")
HEADER = "loader,action,sparse_model,hookpoint,feature_index,steering_coefficient,head_index,sae_id,description\n"
TOLERANCE = 1e-4  # of the logits' scale: float32 rounding of two orders of the same sums


class _Folder:
    """What lm-eval reads of a sae_lens SAE, from a SAELens folder."""

    def __init__(self, folder):
        import json

        from safetensors.torch import load_file

        weights = load_file(os.path.join(folder, "sae_weights.safetensors"))
        self.W_dec, self.b_dec = weights["W_dec"], weights["b_dec"]
        with open(os.path.join(folder, "cfg.json")) as fh:
            self.cfg = types.SimpleNamespace(hook_name=json.load(fh)["metadata"]["hook_name"])


@pytest.fixture(scope="module")
def sae_root(tmp_path_factory):
    """``--sae-root``: ROOT/steerc-test/smollm2-l8 (release steerc-test, sae_id smollm2-l8); and lm-eval's
    ``sae_lens`` that reads it."""
    import shutil

    root = tmp_path_factory.mktemp("project")
    folder = root / "sae_lens" / "steerc-test" / "smollm2-l8"
    shutil.copytree(SAE, folder)
    module = types.ModuleType("sae_lens")

    class Loader:
        @staticmethod
        def from_pretrained(release, sae_id):
            return _Folder(str(root / "sae_lens" / release.replace("/", "--") / sae_id)), {}, None

    module.SAE = Loader
    sys.modules.setdefault("sae_lens", module)
    return root


@pytest.fixture(scope="module")
def smollm2():
    _, model, tokenizer = own_env.smollm2()
    return model.float().eval(), tokenizer


def _csv(root, rows):
    path = root / "steer.csv"
    path.write_text(HEADER + "".join(f"sae_lens,{r},,smollm2-l8,issue 37\n" for r in rows))
    return path


def _steerc_logits(model, tokenizer, root, path):
    from steerc.api import Options, check_source
    from steerc.formats.lm_eval import convert
    from steerc.runtime.hf import facts_from_model, install

    made = convert(str(path), "steer", sae_root=str(root / "sae_lens"), out_dir=str(root))
    result = check_source(made.text, "steer.steer", path=str(root / "steer.steer"),
                          options=Options(base_dir=str(root), root=str(root)), facts=facts_from_model(model))
    assert result.ok, result.render()
    with install(model, result.plan, tokenizer):
        return _logits(model, tokenizer)


def _logits(model, tokenizer):
    out = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out.append(model(**tokenizer(prompt, return_tensors="pt")).logits[0].clone())
    return out


def _lm_eval_logits(model, tokenizer, path):
    """lm-eval's own SteeredModel (HFLM) on ``model``; its _model_call is its steered forward."""
    from lm_eval.models.hf_steered import SteeredModel

    lm = SteeredModel(pretrained=model, tokenizer=tokenizer, steer_path=str(path), device="cpu", batch_size=1)
    out = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out.append(lm._model_call(ids)[0].clone())
    return out


def _close(a, b):
    worst = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))
    assert worst < TOLERANCE, worst
    return worst


@pytest.mark.parametrize("rows", [
    ["clamp,steerc-test,layers.8,5,2.5"],
    ["clamp,steerc-test,layers.8,3,-4.0", "clamp,steerc-test,layers.4.mlp,7,1.5"],
    ["clamp,steerc-test,layers.6.self_attn,11,0.5"],
])
def test_lm_evals_steered_model_and_steerc_give_the_same_logits(smollm2, sae_root, rows):
    model, tokenizer = smollm2
    path = _csv(sae_root, rows)
    plain = _logits(model, tokenizer)
    theirs = _lm_eval_logits(model, tokenizer, path)
    ours = _steerc_logits(model, tokenizer, sae_root, path)
    assert max(float((x - y).abs().max()) for x, y in zip(theirs, plain)) > 1e-3  # it steers
    print("clamp", rows, _close(ours, theirs))


def test_lm_eval_refuses_its_own_csv_add_row(smollm2, sae_root):
    model, tokenizer = smollm2
    with pytest.raises(AssertionError, match="Bias is not supported"):
        _lm_eval_logits(model, tokenizer, _csv(sae_root, ["add,steerc-test,layers.8,3,10.0"]))


def test_an_add_row_means_what_lm_evals_add_computes(smollm2, sae_root):
    """lm-eval's derive_steer_config, its SteeredModel.add and its steer() hooks, past __init__'s assert."""
    from lm_eval.models.hf_steered import SteeredModel, steer

    model, tokenizer = smollm2
    path = _csv(sae_root, ["add,steerc-test,layers.8,3,10.0", "add,steerc-test,layers.2.mlp,9,-6.0"])
    config = SteeredModel.derive_steer_config(str(path))
    hooks = {hook: partial(SteeredModel.add, vector=info["steering_vector"] * info["steering_coefficient"],
                           head_index=None) for hook, info in config.items()}
    with steer(model, hooks):
        theirs = _logits(model, tokenizer)
    ours = _steerc_logits(model, tokenizer, sae_root, path)
    print("add", _close(ours, theirs))


def test_the_export_runs_under_lm_evals_steered_model(smollm2, sae_root):
    """issue 37: a .steer program compiled with --target lm-eval (clamps at layers.8 and layers.3.mlp, around
    the origin: the CSV's coefficients are c - dot(b_dec, û)): lm-eval's SteeredModel on the CSV gives steerc's
    logits."""
    from steerc.api import Options, check_source
    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.capabilities import check_target
    from steerc.targets.lm_eval.emit import emit

    model, tokenizer = smollm2
    program = ('steer 1\nsae s = sae("sae_lens/steerc-test/smollm2-l8")\n'
               "intervention pin {\n  at resid_post[8]\n  clamp s[5] to 3.0\n}\n"
               "intervention low {\n  at mlp_out[3]\n  clamp s[2] to -1.0\n}\n")
    (sae_root / "p.steer").write_text(program)
    result = check_source(program, "p.steer", path=str(sae_root / "p.steer"),
                          options=Options(base_dir=str(sae_root), root=str(sae_root)), facts=facts_from_model(model))
    check_target(result, "lm-eval")
    assert result.ok, result.render()
    out = sae_root / "out"
    [name] = emit(result.plan, result.facts, str(out), result=result)
    plain = _logits(model, tokenizer)
    theirs = _lm_eval_logits(model, tokenizer, out / name)
    assert max(float((x - y).abs().max()) for x, y in zip(theirs, plain)) > 1e-3  # it steers
    with install(model, result.plan, tokenizer):
        ours = _logits(model, tokenizer)
    print("export", _close(ours, theirs))
