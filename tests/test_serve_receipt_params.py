"""A served request's receipt reports its gates at the request's own param values.

issue 32: the receipt's gate recorder was given the request's bound plan without its values, and rebinding
a plan to no values puts every per-request param back at its default. A request that moved a gate's
threshold (``when p > t`` with ``t`` per request) was steered at its own threshold but got a receipt that
said where the gate would have held at the default one.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from support import examples_path  # noqa: E402

from steerc.api import check_source  # noqa: E402
from steerc.facts import load_facts  # noqa: E402
from steerc.runtime.vllm.receipt import Receipt  # noqa: E402
from steerc.runtime.vllm.request import RequestSteer  # noqa: E402
from steerc.serve_client import extra_args, read_compiled  # noqa: E402
from steerc.targets.serve.admission import admit  # noqa: E402
from steerc.targets.serve.emit import emit  # noqa: E402

FACTS = load_facts(os.path.join(examples_path(), "models", "tiny-llama"))
COSINES = [0.9, 0.5, 0.3, 0.95, -0.2]  # each row's cosine with v: over 0.7 twice, over the default 0.1 four times


def _unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=FACTS.hidden)
    return v / np.linalg.norm(v)


def _rows(v: np.ndarray) -> np.ndarray:
    """One row per cosine in COSINES: c * v plus a unit vector orthogonal to v times sqrt(1 - c^2)."""
    rows = []
    for i, c in enumerate(COSINES):
        w = _unit(100 + i)
        w = w - (w @ v) * v
        w = w / np.linalg.norm(w)
        rows.append(c * v + np.sqrt(1 - c * c) * w)
    return np.asarray(rows, dtype=np.float32)


def test_a_receipt_reads_the_gates_at_the_requests_param_values(tmp_path, monkeypatch):
    monkeypatch.setenv("STEERC_RECEIPTS", str(tmp_path / "receipts"))
    v = _unit(1)
    literal = "[" + ", ".join(repr(float(x)) for x in v.astype(np.float32)) + "]"
    text = (f"steer 1\nparam t = 0.1 in [-1, 1] per request\nvector v = {literal}\n"
            "probe p {\n  at resid_post[0]\n  read cosine(v)\n  pool token\n}\n"
            "intervention x {\n  at resid_post[2]\n  add 3.0 * v\n  when p > t\n}\n")
    result = check_source(text, "gated.steer", facts=FACTS)
    assert result.ok, result.render()
    emit(result.plan, FACTS, str(tmp_path / "plan"))
    doc, arts = read_compiled(str(tmp_path / "plan"))
    admitted = admit(extra_args(doc, arts, params={"t": 0.7}), FACTS)
    steer = RequestSteer(admitted.plan, FACTS, max_tokens=16, dtype=torch.float32, device=torch.device("cpu"),
                         tp_rank=0, tp_size=1, receipt=True, built=admitted.built())
    steer.receipt = Receipt("0" * 32, admitted)
    n = len(COSINES)
    pos, plen = np.arange(n, dtype=np.int64), np.full(n, n, dtype=np.int64)
    steer.feed(pos, plen, restart=True)
    probe, kernel = sorted(steer.fns, key=lambda key: key[0])  # model.layers.0 (the probe), .2 (the kernel)
    x = torch.from_numpy(_rows(v))
    steer.fns[probe](x)
    changed = (steer.fns[kernel](x.clone()) != x).any(dim=1)
    steer.receipt.record(steer.state, pos, plen)
    doc = steer.receipt.document()
    (gate,) = doc["gates"]
    assert doc["params"] == {"t": 0.7}
    assert gate["comparisons"][0]["threshold"] == pytest.approx(0.7)
    assert gate["positions"] == [i for i, c in enumerate(COSINES) if c > 0.7] == [0, 3]
    assert gate["positions"] == torch.nonzero(changed).flatten().tolist(), "the rows the kernel steered"
