"""`loreft R, W, b` against pyreft's own ``LoreftIntervention``, running for real (issue 34).

pyreft 0.1.0 (with pyvene 0.1.8) builds a LoReFT at SmolLM2-135M-Instruct's layer 8 ``block_output``
(``pyreft.get_reft_model``, the intervention on every position of the prompt). The test writes that
intervention's weights to a safetensors file — ``R`` the transpose of its ``rotate_layer``, ``W`` and ``b``
its ``learned_source`` — and steerc compiles ``loreft R, W, b`` at ``resid_post[8]`` from the file. Both run
on the same model and prompts: the hidden state after the edit (the input of layer 9) agrees to 1e-5 of its
largest entry, and so do the logits; pyreft's intervention applied by hand to the unsteered activations
agrees with ``steerc.ir.interpret`` too.

pyreft pins transformers 4.45.1; ``./dev test-peers`` installs it (and pyvene) without its pins into
``.venv-peers`` (transformers 4.57), where it imports and runs. Elsewhere this skips, saying so; under
``CI=true`` or ``STEERC_PEER_TESTS=1`` a missing library fails.
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

LAYER, RANK = 8, 4
PROMPTS = ("The joy of a spring morning is", "Write one sentence about the sea.")
TOL = 1e-5  # of the largest entry compared: both compute in float32, in the same order


torch = require("torch")
pyreft = require("pyreft")


@pytest.fixture(scope="module")
def smollm2():
    _, model, tokenizer = own_env.smollm2()
    return model.float().eval(), tokenizer


@pytest.fixture(scope="module")
def intervention(smollm2):
    """pyreft's LoreftIntervention for SmolLM2's width, its learned map made large enough to matter."""
    from pyreft.interventions import LoreftIntervention

    model, _ = smollm2
    torch.manual_seed(34)
    iv = LoreftIntervention(embed_dim=model.config.hidden_size, low_rank_dimension=RANK, dtype=torch.float32)
    with torch.no_grad():
        iv.learned_source.weight.mul_(20.0)
        iv.learned_source.bias.normal_(0.0, 4.0)
    return iv.eval()


@pytest.fixture(scope="module")
def program(intervention, tmp_path_factory):
    """The intervention's weights in a safetensors file, as pyreft's state_dict names them, and the program."""
    from safetensors.torch import save_file

    state = intervention.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {"weight": (RANK, 576), "bias": (RANK,),
                                                               "rotate_layer": (576, RANK)}
    folder = tmp_path_factory.mktemp("pyreft")
    save_file({"R": state["rotate_layer"].T.contiguous(), "W": state["weight"].contiguous(),
               "b": state["bias"].contiguous()}, str(folder / "reft.safetensors"))
    (folder / "steer.toml").write_text("")
    text = ('steer 1\n\nmatrix R = load("reft.safetensors", key="R")\nmatrix W = load("reft.safetensors", key="W")\n'
            'vector b = load("reft.safetensors", key="b")\n\n'
            f"intervention reft {{\n  at     resid_post[{LAYER}]\n  loreft R, W, b\n}}\n")
    return folder, text


def _plan(model, folder, text):
    from steerc.api import Options, check_source
    from steerc.runtime.hf import facts_from_model

    result = check_source(text, "reft.steer", path=str(folder / "reft.steer"),
                          options=Options(base_dir=str(folder), root=str(folder)), facts=facts_from_model(model))
    assert result.ok, result.render()
    return result.plan


def _after_site(model, run):
    """(the input of layer LAYER + 1, i.e. resid_post[LAYER] after any edit, and the logits) of ``run()``.

    Read by wrapping the layer's ``forward`` rather than with a module hook: pyvene clears the modules' hooks
    when it runs."""
    layer = model.model.layers[LAYER + 1]
    seen = []
    forward = layer.forward

    def reading(*args, **kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).detach().clone())
        return forward(*args, **kwargs)

    layer.forward = reading
    try:
        with torch.no_grad():
            logits = run()
    finally:
        del layer.forward
    return seen[0][0], logits[0]


def _close(got, want):
    scale = float(want.abs().max())
    return float((got - want).abs().max()), scale


@pytest.mark.parametrize("prompt", PROMPTS)
def test_pyreft_and_steerc_give_the_same_edit_and_logits(smollm2, intervention, program, prompt):
    from steerc.runtime.hf import install

    model, tokenizer = smollm2
    folder, text = program
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    plain_h, plain = _after_site(model, lambda: model(input_ids=ids).logits)

    config = pyreft.ReftConfig(representations={"layer": LAYER, "component": "block_output",
                                                "low_rank_dimension": RANK, "intervention": intervention})
    reft = pyreft.get_reft_model(model, config)
    reft.set_device("cpu")
    theirs_h, theirs = _after_site(model, lambda: reft({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                                       unit_locations={"sources->base": (None, [[list(range(n))]])}
                                                       )[1].logits)
    with install(model, _plan(model, folder, text)):
        ours_h, ours = _after_site(model, lambda: model(input_ids=ids).logits)

    diff, scale = _close(ours_h, theirs_h)
    assert diff <= TOL * scale, (diff, scale)
    diff, scale = _close(ours, theirs)
    assert diff <= TOL * scale * 10, (diff, scale)  # through 21 more layers
    assert float((theirs - plain).abs().max()) > 1e-2 * float(plain.abs().max()), "the edit changes the logits"
    assert float((ours_h - plain_h).abs().max()) > 1.0


def test_pyreft_by_hand_equals_the_interpreter(smollm2, intervention, program):
    """pyreft's forward on activations equals steerc.ir.interpret's loreft on the plan's own R, W and b."""
    from steerc.ir.interpret import apply_op

    model, tokenizer = smollm2
    folder, text = program
    (site,) = _plan(model, folder, text).sites
    assert site.site.kind == "resid_post" and site.site.layer == LAYER
    ids = tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]
    h, _ = _after_site(model, lambda: model(input_ids=ids).logits)
    with torch.no_grad():
        theirs = intervention(h).double().numpy()
    ours = apply_op(site.kernels[0].op, h.double().numpy())
    diff, scale = float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())
    assert diff <= TOL * scale, (diff, scale)
