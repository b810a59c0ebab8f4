"""Every vllm site table against the model vLLM itself builds, without an engine.

``vllm_modules.py`` builds each family's tiny config as vLLM's model class on the ``meta`` device
(one subprocess, every family, ~20 s); here each table is judged against it: every hooked module of
every layer exists, the layers and final norm are where the table says, the stream input of layer 0
is the ``hidden_states`` parameter the table's tensor names, a fused ``(hidden_states, residual)``
output is claimed only of layers that take a residual, and an MoE family's ``mlp_out`` is the block
that holds the experts. Families the real engine also runs here are compared token for token in
``test_families.py``; for the others this is the check of their vllm tables.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

import pytest
from harness import require_vllm

from steerc.facts.families import FAMILIES
from steerc.facts.sites import site_table

require_vllm()

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def report() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "modules.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE)),
                                                              os.path.dirname(HERE),
                                                              os.environ.get("PYTHONPATH", "")]))
        run = subprocess.run([sys.executable, os.path.join(HERE, "vllm_modules.py"), out], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        with open(out) as fh:
            return json.load(fh)


def _built(family: str) -> dict:
    got = report()[family]
    assert "error" not in got, f"vLLM could not build the {family} model: {got.get('error')}"
    return got


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_hook_of_every_layer_is_a_vllm_module(family):
    got, table = _built(family), site_table(family, "vllm")
    modules = got["modules"]
    assert got["layers"] == table.layers
    assert table.final_norm in modules
    assert table.resid_pre0.module in modules
    layers = sum(1 for name in modules if name.startswith(table.layers + ".") and name.count(".") ==
                 table.layers.count(".") + 1)
    assert layers == 4
    for layer in range(layers):
        for kind in ("resid_post", "attn_out", "mlp_out", "head"):
            module = table.hook(kind, layer).module
            assert module in modules, f"{family}: no module {module} in vLLM's {got['model_class']}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_stream_tensors_match_the_decoder_layer_signature(family):
    got, table = _built(family), site_table(family, "vllm")
    params = got["layer0_forward"]
    index = {"input": 0, "input1": 1}[table.resid_pre0.tensor]
    assert params[index] == "hidden_states", f"{family}: {got['layer0_class']}.forward{tuple(params)}"
    if table.resid_post.tensor == "fused_pair":
        assert "residual" in params, f"{family}: a fused pair from a layer that takes no residual"
    else:
        assert table.resid_post.tensor == "output"


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if FAMILIES[f].experts_key))
def test_mlp_out_of_an_moe_family_is_the_sparse_block(family):
    got, table = _built(family), site_table(family, "vllm")
    block = table.hook("mlp_out", 0).module
    assert f"{block}.experts" in got["modules"], f"{family}: {block} ({got['modules'][block]}) holds no experts"
