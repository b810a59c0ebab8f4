"""Plan slots (steerc.runtime.vllm.slots): the serve plugin's batched kernels against its per-request path.

The per-request path (each request's own buffers and site function, on its own rows) is what the engine
tests compare with HF; here the slot tables, run once over a whole step of many requests, must give the
same bits on every request's rows, leave every other row untouched, and count, share and free their slots.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from steerc.api import check_source  # noqa: E402
from steerc.facts import ModelFacts  # noqa: E402
from steerc.runtime.vllm.serve import RequestSteer  # noqa: E402
from steerc.runtime.vllm.slots import SlotTables  # noqa: E402

FACTS = ModelFacts("llama", 4, 8, 2, 1, 4, 16, 32, False, False)
SCOPES = ["all", "prompt", "generated", "prompt[-2:]", "generated[:3]", "[0, 5, 9]", "prompt[-1:], generated"]
SITES = ["resid_post[1]", "resid_pre[2]", "mlp_out[1]", "attn_out[2]"]


def _vec(seed: int) -> str:
    v = np.random.default_rng(seed).normal(size=FACTS.hidden).astype(np.float32)
    return "[" + ", ".join(f"{x:.6f}" for x in v) + "]"


def _request(op: str, site: str, scope: str, seed: int) -> RequestSteer:
    body = {"add": f"add {1 + seed % 5}.5 * v", "scale": f"scale {0.25 + seed % 3}", "set": "set 0.5 * v"}[op]
    text = f"steer 1\nvector v = {_vec(seed)}\nintervention a {{\n  at {site}\n  {body}\n  tokens {scope}\n}}\n"
    result = check_source(text, "slot.steer", facts=FACTS)
    assert result.ok, result.render()
    # receipt=True keeps the request's own step metadata, which the per-request path compared here reads
    return RequestSteer(result.plan, FACTS, max_tokens=64, dtype=torch.float32, device=torch.device("cpu"),
                         tp_rank=0, tp_size=1, slot_id=f"{op}-{site}-{scope}-{seed}", receipt=True)


request = st.builds(_request, st.sampled_from(["add", "scale", "set"]), st.sampled_from(SITES),
                    st.sampled_from(SCOPES), st.integers(0, 3))


def _step(reqs, lengths, prompts, starts):
    """Rows of a step: each request's tokens one after another, at positions from its start."""
    pos, plen, spans, a = [], [], [], 0
    for n, p, s in zip(lengths, prompts, starts):
        pos += list(range(s, s + n))
        plen += [p] * n
        spans.append((a, a + n))
        a += n
    return np.array(pos, dtype=np.int64), np.array(plen, dtype=np.int64), spans


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(request, st.integers(1, 6), st.integers(1, 8), st.integers(0, 10)), min_size=1,
                max_size=6),
       st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_slots_give_the_per_request_bits_on_every_row(cases, unsteered, seed):
    reqs = [c[0] for c in cases]
    lengths = [c[1] for c in cases] + [2] * unsteered  # rows of unsteered requests at the end
    prompts = [c[2] for c in cases] + [4] * unsteered
    starts = [c[3] for c in cases] + [0] * unsteered
    pos, plen, spans = _step(reqs, lengths, prompts, starts)
    n = len(pos)
    tables = SlotTables(FACTS.hidden, torch.float32, torch.device("cpu"), grow=2)
    for r in reqs:
        r.slot = tables.acquire(r.slot_id, {k: v[:2] for k, v in r.slotted.items()})
    rows = {}
    for r, (a, b) in zip(reqs, spans):
        assert r.slotted and set(r.slotted) == set(r.fns)
        r.feed(pos[a:b], plen[a:b], restart=True)  # the per-request path reads its own metadata
        for key, mask in r.masks(pos[a:b], plen[a:b]).items():
            rows.setdefault(key, []).append((r.slot, a, b, mask))
    tables.write_step(rows, n)
    gen = torch.Generator().manual_seed(seed)
    for key in rows:
        x = torch.randn(n + 3, FACTS.hidden, generator=gen)  # three rows of padding past the step's tokens
        res = torch.randn(n + 3, FACTS.hidden, generator=gen)
        if key[2] == "fused_pair":
            got_h, got_r = tables.apply_pair(key, x, res)
            want_h, want_r = x.clone(), res.clone()
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    want_h[a:b] = r.fns[key](x[a:b] + res[a:b])
                    want_r[a:b] = 0
            assert torch.equal(got_h, want_h) and torch.equal(got_r, want_r)
        else:
            got = tables.apply(key, x)
            want = x.clone()
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    want[a:b] = r.fns[key](x[a:b])
            assert torch.equal(got, want)


def test_identical_plans_share_a_slot_counted_and_a_freed_slot_is_reused():
    a1, a2 = _request("add", "resid_post[1]", "all", 1), _request("add", "resid_post[1]", "all", 1)
    b = _request("scale", "mlp_out[1]", "generated", 2)
    tables = SlotTables(FACTS.hidden, torch.float32, torch.device("cpu"), grow=2)
    s1 = tables.acquire(a1.slot_id, {k: v[:2] for k, v in a1.slotted.items()})
    s2 = tables.acquire(a2.slot_id, {k: v[:2] for k, v in a2.slotted.items()})
    s3 = tables.acquire(b.slot_id, {k: v[:2] for k, v in b.slotted.items()})
    assert s1 == s2 != s3 and 0 not in (s1, s3)  # slot 0 is the identity, never a plan's
    key = next(iter(a1.slotted))
    tables.release(a1.slot_id)
    assert a1.slot_id in tables.plans and tables.tables[key][1][s1].abs().sum() > 0  # a2 still holds it
    tables.release(a2.slot_id)
    assert a1.slot_id not in tables.plans
    assert torch.equal(tables.tables[key][1][s1], torch.zeros(FACTS.hidden))  # back to the identity
    c = _request("add", "resid_post[1]", "all", 3)
    assert tables.acquire(c.slot_id, {k: v[:2] for k, v in c.slotted.items()}) == s1


def test_slot_tables_grow_with_the_plans_and_keep_theirs():
    tables = SlotTables(FACTS.hidden, torch.float32, torch.device("cpu"), grow=2)
    reqs = [_request("add", "resid_post[1]", "all", i) for i in range(4)] + \
        [_request("add", "resid_post[1]", "prompt", i) for i in range(4)]
    slots = [tables.acquire(r.slot_id, {k: v[:2] for k, v in r.slotted.items()}) for r in reqs]
    assert len(set(slots)) == 8 and tables.capacity >= 9
    key = next(iter(reqs[0].slotted))
    for r, s in zip(reqs, slots):
        assert torch.equal(tables.tables[key][1][s], r.slotted[key][1].reshape(-1))
    assert tables.bytes() == 2 * tables.capacity * FACTS.hidden * 4


@pytest.mark.parametrize("text", [
    "probe p {\n  at resid_pre[1]\n  read cosine(v)\n  pool prompt.mean\n}\n"
    "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  tokens generated\n  when p > 0.1\n}\n",
    "intervention a {\n  at resid_post[2]\n  ablate v\n}\n",
    "intervention a {\n  at head[1, 0]\n  add 2.0 * v\n}\n",
    "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  preserve norm\n}\n",
    "intervention a {\n  at resid_post[2]\n  add ramp(4) * v\n  tokens prompt[-1:], generated\n}\n",
    "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n}\nintervention b {\n  at resid_post[2]\n  ablate v\n}\n",
])
def test_what_is_not_one_plain_affine_kernel_keeps_the_per_request_path(text):
    head = "steer 1\nvector v = " + _vec(0) + "\n"
    if "head[" in text:
        head = "steer 1\nvector v = " + "[" + ", ".join(["0.5"] * FACTS.head_dim) + "]\n"
    result = check_source(head + text, "slot.steer", facts=FACTS)
    assert result.ok, result.render()
    steer = RequestSteer(result.plan, FACTS, max_tokens=16, dtype=torch.float32, device=torch.device("cpu"),
                          tp_rank=0, tp_size=1)
    assert steer.fns and not steer.slotted and steer.needs_metadata


def test_a_request_with_only_slotted_kernels_and_no_receipt_keeps_no_step_metadata():
    text = f"steer 1\nvector v = {_vec(1)}\nintervention a {{\n  at resid_post[0:3]\n  add 2.0 * v\n}}\n"
    plan = check_source(text, "slot.steer", facts=FACTS).plan
    kw = dict(max_tokens=2048, dtype=torch.float32, device=torch.device("cpu"), tp_rank=0, tp_size=1)
    lean, full = RequestSteer(plan, FACTS, **kw), RequestSteer(plan, FACTS, receipt=True, **kw)
    assert len(lean.slotted) == 3 and not lean.needs_metadata and full.needs_metadata
    assert len(lean.state.pos) == 1 and len(full.state.pos) == 2048
