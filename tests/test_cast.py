"""`projected_cosine` is CAST's condition, exactly; `subspace_cosine` is the tanh-free value.

CAST (IBM/activation-steering, ``leash_layer.py`` and ``malleable_model.py``) pools the hidden state
entering a layer (mean or last over the prompt), builds ``P = c cᵀ / (cᵀ c)`` and reads
``cos(h, tanh(P h))``; aisteer360 and vLLM-Hook take the orthogonal projector onto the span for several
directions. The direct computation below is written from those definitions, in float64 on hidden states
captured from the model; steerc's value is read back through its gate: with the threshold a hair
(1e-6) below the value the gate opens, a hair above it stays closed — so steerc's readout equals the
direct one to 1e-6, per row of a batch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from steerc.runtime.hf import install  # noqa: E402

IDS = torch.tensor([[0, 0, 5, 2, 7, 8, 9], [11, 12, 13, 2, 15, 16, 17]])  # row 0 left-padded
MASK = (torch.arange(7)[None, :] >= torch.tensor([[2], [0]])).long()
EPS = 1e-6


def _directions(*seeds) -> list[np.ndarray]:
    return [np.array(eval(vec(64, s)), dtype=np.float64) for s in seeds]


def cast_value(h: np.ndarray, directions: list[np.ndarray], squash: bool = True) -> float:
    """CAST's condition (``squash``) or the tanh-free cosine, for one pooled hidden state ``h``."""
    if len(directions) == 1:
        (c,) = directions
        projector = np.outer(c, c) / (c @ c)
    else:
        q, _ = np.linalg.qr(np.stack(directions, axis=1))
        projector = q @ q.T
    projected = projector @ h
    if squash:
        projected = np.tanh(projected)
    return float(h @ projected / (np.linalg.norm(h) * np.linalg.norm(projected)))


def _pooled(model, layer: int, pool: str) -> list[np.ndarray]:
    """The hidden state entering ``layer`` (steerc's resid_pre[layer]), pooled over each row's prompt."""
    with torch.no_grad():
        hs = model(input_ids=IDS, attention_mask=MASK, output_hidden_states=True).hidden_states[layer]
    out = []
    for b in range(IDS.shape[0]):
        rows = hs[b][MASK[b].bool()].double().numpy()
        out.append(rows.mean(axis=0) if pool == "prompt.mean" else rows[-1])
    return out


def _program(readout: str, threshold: float, pool: str) -> str:
    return ("steer 1\n"
            f"probe p {{\n  at resid_pre[1]\n  read {readout}\n  pool {pool}\n}}\n"
            f"intervention x {{\n  at resid_post[2]\n  add 5.0 * {vec(64, 9)}\n  tokens generated\n"
            f"  when p > {threshold!r}\n}}\n")


def _opened(model, text: str) -> list[bool]:
    """Per row: whether the gated add changed the generated logits."""
    kwargs = dict(input_ids=IDS, attention_mask=MASK, max_new_tokens=2, do_sample=False, pad_token_id=0,
                  eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        plain = torch.stack(model.generate(**kwargs).logits, 1)
        with install(model, plan_for(model, text)):
            steered = torch.stack(model.generate(**kwargs).logits, 1)
    return [not torch.equal(plain[b], steered[b]) for b in range(IDS.shape[0])]


READOUTS = {
    "projected_cosine one direction": ("projected_cosine", (1,), True),
    "projected_cosine two directions": ("projected_cosine", (1, 2), True),
    "subspace_cosine one direction": ("subspace_cosine", (3,), False),
    "subspace_cosine two directions": ("subspace_cosine", (3, 4), False),
}


@pytest.mark.parametrize("pool", ["prompt.mean", "prompt.last"])
@pytest.mark.parametrize("case", sorted(READOUTS))
def test_readout_equals_the_direct_computation(case, pool):
    kind, seeds, squash = READOUTS[case]
    model = tiny_model("llama")  # float64
    directions = _directions(*seeds)
    readout = f"{kind}(" + ", ".join(vec(64, s) for s in seeds) + ")"
    values = [cast_value(h, directions, squash) for h in _pooled(model, 1, pool)]
    for b, value in enumerate(values):
        below = _opened(model, _program(readout, value - EPS, pool))
        above = _opened(model, _program(readout, value + EPS, pool))
        assert below[b] and not above[b], (b, value, below, above)


def test_cast_and_the_tanh_free_value_differ_where_the_stream_is_large():
    """The issue's case: with h large along c, CAST's value is far from |cos(h, c)|."""
    c = _directions(1)[0]
    rng = np.random.default_rng(0)
    h = 200.0 * c / np.linalg.norm(c) + rng.normal(size=64)
    cast, plain = cast_value(h, [c]), cast_value(h, [c], squash=False)
    assert abs(plain - abs(h @ c) / (np.linalg.norm(h) * np.linalg.norm(c))) < 1e-12
    # tanh saturates each component of P h to about ±1, so CAST's value tends to cos(c, sign(c)), which
    # is near sqrt(2/pi) = 0.80 for a random c: a threshold calibrated on one is meaningless on the other.
    assert plain > 0.99 and cast < 0.9
