"""Plan tables (steerc.runtime.vllm.tables): the serve plugin's in-graph kernels against its per-request path.

The per-request path (each request's own buffers and site function, on its own rows) is what the engine
tests compare with HF. Here the tables, run once over a whole step of many requests, must give every
request's rows the per-request values (affine rows bit for bit; low-rank rows to float32 rounding: the
batched form sums in another order), leave every other row untouched bit for bit, and count, share and
free their slots. Each kind's batched row (the kernel seat) is also held to its own maths directly.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from steerc.api import check_source  # noqa: E402
from steerc.facts import ModelFacts  # noqa: E402
from steerc.ir.kernels import KINDS  # noqa: E402
from steerc.runtime import kernels as S  # noqa: E402
from steerc.runtime.vllm.serve import RequestSteer  # noqa: E402
from steerc.runtime.vllm.tables import SteerTables, TableFull, tableable  # noqa: E402
from steerc.targets.serve.capacity import Capacity  # noqa: E402

FACTS = ModelFacts("llama", 4, 8, 2, 1, 4, 16, 32, False, False)
SCOPES = ["all", "prompt", "generated", "prompt[-2:]", "generated[:3]", "[0, 5, 9]", "prompt[-1:], generated"]
SITES = ["resid_post[1]", "resid_pre[2]", "mlp_out[1]", "attn_out[2]"]


def _vec(seed: int, width: int = FACTS.hidden) -> str:
    v = np.random.default_rng(seed).normal(size=width).astype(np.float32)
    return "[" + ", ".join(f"{x:.6f}" for x in v) + "]"


def _body(op: str, seed: int) -> str:
    return {"add": f"add {1 + seed % 5}.5 * v", "scale": f"scale {0.25 + seed % 3}", "set": "set 0.5 * v",
            "ablate": "ablate v", "ablate2": "ablate v, u", "clamp": f"clamp v to {seed - 1.5}",
            "rotate by": f"rotate in (v, u) by {10 + seed}deg", "rotate to": f"rotate in (v, u) to {20 * seed}deg",
            "ramp": "add ramp(3) * v", "norm": "add 3.0 * v\n  preserve norm",
            "two": "ablate u\n}\nintervention b {\n  at SITE\n  add 2.0 * v"}[op]


OPS = ["add", "scale", "set", "ablate", "ablate2", "clamp", "rotate by", "rotate to", "ramp", "norm", "two"]


def _request(op: str, site: str, scope: str, seed: int, receipt: bool = True) -> RequestSteer:
    if op in ("ramp",) and scope not in ("generated", "prompt[-1:], generated", "generated[:3]"):
        scope = "generated"
    text = (f"steer 1\nvector v = {_vec(seed)}\nvector u = {_vec(seed + 50)}\nintervention a {{\n  at {site}\n"
            f"  {_body(op, seed).replace('SITE', site)}\n  tokens {scope}\n}}\n")
    result = check_source(text, "table.steer", facts=FACTS)
    assert result.ok, result.render()
    # receipt=True keeps the request's own step metadata, which the per-request path compared here reads
    return RequestSteer(result.plan, FACTS, max_tokens=64, dtype=torch.float32, device=torch.device("cpu"),
                         tp_rank=0, tp_size=1, slot_id=f"{op}-{site}-{scope}-{seed}", receipt=receipt)


request = st.builds(_request, st.sampled_from(OPS), st.sampled_from(SITES), st.sampled_from(SCOPES),
                    st.integers(0, 3))


def _step(lengths, prompts, starts):
    """Rows of a step: each request's tokens one after another, at positions from its start."""
    pos, plen, spans, a = [], [], [], 0
    for n, p, s in zip(lengths, prompts, starts):
        pos += list(range(s, s + n))
        plen += [p] * n
        spans.append((a, a + n))
        a += n
    return np.array(pos, dtype=np.int64), np.array(plen, dtype=np.int64), spans


def _tables(plans: int = 8, requests: int = 8) -> SteerTables:
    from steerc.targets.serve.capacity import ALL_SITES, point_hooks

    return SteerTables({key: FACTS.hidden for key in point_hooks(FACTS, ALL_SITES)}, plans=plans, rank=2,
                       kernels=2, requests=requests, hidden=FACTS.hidden, max_tokens=64, dtype=torch.float32,
                       device=torch.device("cpu"))


def _write(tables, reqs, spans, pos, plen, restart: bool = True):
    """The router's per-step writes (ServeRouter.before) for requests holding slots, on rows ``spans``."""
    n = len(pos)
    slots = np.zeros(n, dtype=np.int64)
    rslots = np.full(n, tables.requests, dtype=np.int64)
    rows = {}
    for r, (a, b) in zip(reqs, spans):
        r.feed(pos[a:b], plen[a:b], restart=restart, tables=tables)  # the per-request path reads its own metadata
        slots[a:b] = r.slot
        if r.rslot is not None:
            rslots[a:b] = r.rslot
        for key, stages in r.stage_masks(pos[a:b], plen[a:b]).items():
            for k, (mask, factor) in enumerate(stages):
                rows.setdefault(key, []).append((k, a, b, mask, factor))
    tables.write_step(n, slots, rows, rslots, pos, plen)
    return rows


def _close(got, want, exact: bool):
    if exact:
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max().clamp_min(1.0)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(request, st.integers(1, 6), st.integers(1, 8), st.integers(0, 10)), min_size=1,
                max_size=6),
       st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_tables_give_the_per_request_values_on_every_row(cases, unsteered, seed):
    reqs = [c[0] for c in cases]
    lengths = [c[1] for c in cases] + [2] * unsteered  # rows of unsteered requests at the end
    prompts = [c[2] for c in cases] + [4] * unsteered
    starts = [c[3] for c in cases] + [0] * unsteered
    pos, plen, spans = _step(lengths, prompts, starts)
    n = len(pos)
    tables = _tables()
    for r in reqs:
        assert r.tabled and set(r.tabled) == set(r.fns)
        r.slot = tables.acquire(r.slot_id, r.table_rows())
    rows = _write(tables, reqs, spans[: len(reqs)], pos, plen)
    gen = torch.Generator().manual_seed(seed)
    for key in rows:
        affine = all(k["kind"] == "affine" and not k["preserve_norm"] for r in reqs if key in r.fns
                     for s in r.hooks[key]["sites"] for k in s["kernels"])
        x = torch.randn(n + 3, FACTS.hidden, generator=gen)  # three rows of padding past the step's tokens
        res = torch.randn(n + 3, FACTS.hidden, generator=gen)
        if key[2] == "fused_pair":
            got_h, got_r = tables.apply_pair(key, x, res)
            trimmed = tables.apply_pair(key, x, res, tables.used(key))
            assert _close(trimmed[0], got_h, affine) and torch.equal(trimmed[1], got_r)
            want_h, want_r = x.clone(), res.clone()
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    want_h[a:b] = r.fns[key](x[a:b] + res[a:b])
                    want_r[a:b] = 0
            assert _close(got_h, want_h, affine) and torch.equal(got_r, want_r)
            untouched = torch.ones(n + 3, dtype=torch.bool)
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    untouched[a:b] = False
            assert torch.equal(got_h[untouched], x[untouched]) and torch.equal(got_r[untouched], res[untouched])
        else:
            got = tables.apply(key, x)
            # trimmed to what the step uses: the same rows (a shorter rank sums in another order)
            assert _close(tables.apply(key, x, tables.used(key)), got, affine)
            want = x.clone()
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    want[a:b] = r.fns[key](x[a:b])
            assert _close(got, want, affine)
            same = torch.ones(n + 3, dtype=torch.bool)
            for r, (a, b) in zip(reqs, spans):
                if key in r.fns:
                    same[a:b] = False
            assert torch.equal(got[same], x[same]), "rows no plan steers here are untouched, bit for bit"


def _operands(kind: str, d: int, gen) -> tuple[dict, str | None]:
    def unit(*shape):
        v = torch.randn(*shape, d, generator=gen)
        return v / v.norm(dim=-1, keepdim=True)

    if kind == "affine":
        return {"scale": torch.rand(d, generator=gen) + 0.5, "bias": torch.randn(d, generator=gen)}, None
    if kind == "project":
        q, _ = torch.linalg.qr(torch.randn(d, 2, generator=gen))
        return {"basis": q.T.contiguous(), "target": torch.randn(2, generator=gen)}, None
    if kind == "rotate":
        e = torch.linalg.qr(torch.randn(d, 2, generator=gen))[0].T
        return {"e1": e[0].contiguous(), "e2": e[1].contiguous(), "angle": torch.tensor(0.7)}, None
    if kind == "loreft":
        q, _ = torch.linalg.qr(torch.randn(d, 2, generator=gen))
        return {"R": q.T.contiguous(), "W": torch.randn(2, d, generator=gen), "b": torch.randn(2, generator=gen)}, None
    return {"enc": unit(), "b_enc": torch.tensor(0.3), "threshold": torch.tensor(0.2), "b_dec": torch.randn(d, generator=gen) * 0.1,
            "dec": unit(), "target": torch.tensor(2.5)}, None


@pytest.mark.parametrize("name,mode", [("affine", None), ("project", None), ("rotate", "by"), ("rotate", "to"),
                                       ("loreft", None), ("sae_clamp", "standard"), ("sae_clamp", "jumprelu")])
@pytest.mark.parametrize("keep", [False, True])
def test_each_kinds_batched_row_is_its_maths(name, mode, keep):
    """The kernel seat's two forms of a kind: its row in a table, and its maths, on the same operands."""
    d, gen = 16, torch.Generator().manual_seed(3)
    kind = KINDS[name]
    o, _ = _operands(name, d, gen)
    key = ("m", "post", "output")
    tables = SteerTables({key: d}, plans=3, rank=2, kernels=1, max_tokens=32, dtype=torch.float32,
                         device=torch.device("cpu"))
    slot = tables.acquire("p", {"points": {key: {"stages": [(kind.batched(S, o, mode), keep, None, None)]}}})
    x = torch.randn(20, d, generator=gen) * 3
    mask = torch.rand(20, generator=gen) > 0.3
    slots = np.where(np.arange(20) < 15, slot, 0)  # the last five rows hold no plan
    tables.write_step(20, slots, {key: [(0, 0, 15, mask[:15].numpy(), None)]})
    got = tables.apply(key, x)
    want = S.steer(kind.maths, x[:15], o, mode, mask[:15].unsqueeze(0), keep).squeeze(0)
    assert torch.allclose(got[:15], want, rtol=1e-5, atol=1e-5), (got[:15] - want).abs().max()
    assert torch.equal(got[15:], x[15:])
    if name == "affine" and not keep:
        assert torch.equal(got[:15], want), "an affine row is the per-request kernel, bit for bit"


def test_identical_plans_share_a_slot_counted_and_a_freed_slot_is_reused():
    a1, a2 = _request("add", "resid_post[1]", "all", 1), _request("add", "resid_post[1]", "all", 1)
    b = _request("ablate", "mlp_out[1]", "generated", 2)
    tables = _tables()
    s1 = tables.acquire(a1.slot_id, a1.table_rows())
    s2 = tables.acquire(a2.slot_id, a2.table_rows())
    s3 = tables.acquire(b.slot_id, b.table_rows())
    assert s1 == s2 != s3 and 0 not in (s1, s3)  # slot 0 is the identity, never a plan's
    key = next(iter(a1.tabled))
    w, j = tables.where[key]
    bias = tables._buf("bias", w)
    tables.release(a1.slot_id)
    assert a1.slot_id in tables.held and bias[j, 0, s1].abs().sum() > 0  # a2 still holds it
    tables.release(a2.slot_id)
    assert a1.slot_id not in tables.held
    assert torch.equal(bias[j, 0, s1], torch.zeros(FACTS.hidden))  # back to the identity
    c = _request("add", "resid_post[1]", "all", 3)
    assert tables.acquire(c.slot_id, c.table_rows()) == s1


def test_a_slot_freed_and_taken_by_another_plan_is_used_as_that_plan_steps_after():
    """What a step uses at a point is kept by the step's slots (decode steps repeat them); a slot that changes
    plans between two such steps must not keep the old plan's use: an add (rank 0) then an ablation (rank 1)."""
    a, b = _request("add", "resid_post[1]", "all", 1), _request("ablate", "resid_post[1]", "all", 2)
    tables = _tables()
    key = next(iter(a.tabled))
    assert key in b.tabled
    pos, plen, spans = _step([1], [3], [3])
    a.slot = tables.acquire(a.slot_id, a.table_rows())
    _write(tables, [a], spans, pos, plen, restart=False)
    assert tables.used(key).rank == 0
    tables.release(a.slot_id)
    b.slot = tables.acquire(b.slot_id, b.table_rows())
    assert b.slot == a.slot
    _write(tables, [b], spans, pos, plen, restart=False)
    assert tables.used(key).rank == 1
    x = torch.randn(1, FACTS.hidden)
    assert torch.allclose(tables.apply(key, x, tables.used(key)), b.fns[key](x), atol=1e-5)


def test_a_slot_retaken_by_a_plan_of_the_same_shape_steers_with_its_own_rows():
    """Eager steps keep each point's operands gathered by slot while the step's slots repeat (decode steps);
    a slot freed and taken by another plan of the same shape (the same use: an add, rank 0) between two such
    steps must steer with the new plan's rows, not the gathered old ones."""
    a, b = _request("add", "resid_post[1]", "all", 1), _request("add", "resid_post[1]", "all", 2)
    tables = _tables()
    key = next(iter(a.tabled))
    pos, plen, spans = _step([2], [3], [3])
    x = torch.randn(2, FACTS.hidden)
    a.slot = tables.acquire(a.slot_id, a.table_rows())
    _write(tables, [a], spans, pos, plen, restart=False)
    assert torch.equal(tables.apply(key, x, tables.used(key)), a.fns[key](x))
    assert tables._gathers  # kept for the next step with these slots
    first = tables.used(key)
    tables.release(a.slot_id)
    b.slot = tables.acquire(b.slot_id, b.table_rows())
    assert b.slot == a.slot
    _write(tables, [b], spans, pos, plen, restart=False)
    assert tables.used(key) == first
    assert torch.equal(tables.apply(key, x, tables.used(key)), b.fns[key](x))
    assert not torch.equal(a.fns[key](x), b.fns[key](x))


def test_eager_points_write_in_place_and_only_the_rows_they_steer():
    """steer_ and steer_pair_ (the steer points' eager form) write the step's steering into the tensors they are
    given, as apply and apply_pair compute it; the rows of a request without a plan keep their bits, and a
    fused pair's residual is written only where a plan steers."""
    r = _request("ablate", "resid_post[1]", "all", 2)
    tables = _tables()
    r.slot = tables.acquire(r.slot_id, r.table_rows())
    pos, plen, spans = _step([2, 3], [3, 3], [3, 3])
    _write(tables, [r], spans[:1], pos, plen, restart=False)  # rows 2..4: a request without a plan
    key = next(iter(r.tabled))
    use = tables.used(key)
    for _ in range(2):  # the second step reads the operands kept for these slots
        x = torch.randn(5, FACTS.hidden)
        x[2, 0] = -0.0
        want = tables.apply(key, x, use)
        y = x.clone()
        address = y.data_ptr()
        tables.steer_(key, y, use)
        assert y.data_ptr() == address and torch.equal(y, want)
        assert torch.equal(y[2:].view(torch.int32), x[2:].view(torch.int32))  # bits, -0.0 included
        assert torch.allclose(y[:2], r.fns[key](x[:2]), atol=1e-5)
        h, res = torch.randn(5, FACTS.hidden), torch.randn(5, FACTS.hidden)
        want_h, want_r = tables.apply_pair(key, h, res, use)
        h2, r2 = h.clone(), res.clone()
        tables.steer_pair_(key, h2, r2, use)
        assert torch.equal(h2, want_h) and torch.equal(r2, want_r)
        assert torch.equal(h2[2:], h[2:]) and torch.equal(r2[2:], res[2:]) and not r2[:2].any()
        assert torch.allclose(h2[:2], r.fns[key](h[:2] + res[:2]), atol=1e-5)


def test_a_full_table_says_so_and_its_buffers_never_move():
    tables = _tables(plans=2)
    addresses = [b.data_ptr() for b in tables.buffers()]
    for i in range(2):
        r = _request("add", "resid_post[1]", "all", i)
        tables.acquire(r.slot_id, r.table_rows())
    r = _request("add", "resid_post[1]", "all", 9)
    with pytest.raises(TableFull, match="2 plan slots"):
        tables.acquire(r.slot_id, r.table_rows())
    assert [b.data_ptr() for b in tables.buffers()] == addresses, "a compiled graph reads these addresses"


@pytest.mark.parametrize("text,why", [
    ("probe p {\n  at resid_pre[1]\n  read subspace_cosine(v, u, w)\n  pool prompt.mean\n}\n"
     "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  tokens generated\n  when p > 0.1\n}\n", "basis of rank 3"),
    ("probe p {\n  at resid_pre[1]\n  read dot(v)\n  pool token\n}\nprobe q {\n  at resid_pre[1]\n  read dot(u)\n"
     "  pool token\n}\nprobe r {\n  at resid_pre[1]\n  read norm\n  pool token\n}\n"
     "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  when p > 0 and q > 0 and r > 1\n}\n"
     "intervention b {\n  at resid_post[3]\n  add 1.0 * u\n}\n", "3 probes"),
    ("probe p {\n  at resid_pre[1]\n  read dot(v)\n  pool token\n}\n"
     "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  when p > 0 and p < 1 or p > 2 and p < 3 or p > 9\n}\n",
     "5 comparisons"),
    ("probe p {\n  at resid_pre[1]\n  read dot(v)\n  pool token\n}\n"
     "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  when p > 0\n}\n"
     "intervention b {\n  at resid_post[3]\n  ablate v, u, w\n}\n", None),
    ("intervention a {\n  at resid_post[2]\n  ablate v, u, w\n}\n", "rank 3"),
    ("intervention a {\n  at resid_post[2]\n  add 2.0 * v\n}\nintervention b {\n  at resid_post[2]\n  ablate v\n}\n"
     "intervention c {\n  at resid_post[2]\n  scale 0.5\n}\n", "3 kernels"),
])
def test_what_the_tables_cannot_hold_keeps_the_per_request_path(text, why):
    head = f"steer 1\nvector v = {_vec(0)}\nvector u = {_vec(1)}\nvector w = {_vec(2)}\n"
    result = check_source(head + text, "table.steer", facts=FACTS)
    assert result.ok, result.render()
    steer = RequestSteer(result.plan, FACTS, max_tokens=16, dtype=torch.float32, device=torch.device("cpu"),
                          tp_rank=0, tp_size=1, table_bounds=Capacity(rank=2, kernels=2))
    assert steer.fns and steer.needs_metadata
    untabled = [k for k in steer.fns if k not in steer.tabled]
    if why is None:  # an untabled hook without probes or gates leaves the gated one in the tables
        assert len(untabled) == 1 and "rank 3" in steer.why_not[untabled[0]] and steer.tabled, steer.why_not
        return
    assert untabled and any(why in steer.why_not[k] for k in untabled), steer.why_not
    assert not steer.tabled or all(not steer.hooks[k]["sites"][0]["probes"] for k in steer.tabled)
    if steer.tabled:  # the rest of the plan takes a slot; its probes stay per request, with no row here
        assert _tables().acquire("p", steer.table_rows()) == 1


def test_a_head_kernel_is_a_row_padded_to_the_point():
    text = (f"steer 1\nvector v = {_vec(4, FACTS.head_dim)}\nintervention a {{\n  at head[1, 0]\n  ablate v\n}}\n"
            f"intervention b {{\n  at head[1, 1]\n  add 2.0 * v\n}}\n")
    result = check_source(text, "table.steer", facts=FACTS)
    assert result.ok, result.render()
    r = RequestSteer(result.plan, FACTS, max_tokens=16, dtype=torch.float32, device=torch.device("cpu"),
                     tp_rank=0, tp_size=1, receipt=True, slot_id="h")
    (key,) = r.fns
    assert key in r.tabled
    tables = SteerTables({key: FACTS.heads * FACTS.head_dim}, plans=2, rank=2, kernels=2, max_tokens=16,
                         dtype=torch.float32, device=torch.device("cpu"))
    r.slot = tables.acquire("h", r.table_rows())
    pos, plen, spans = _step([3, 2], [2, 2], [0, 0])
    _write(tables, [r], spans[:1], pos, plen)
    x = torch.randn(5, FACTS.heads * FACTS.head_dim)
    got = tables.apply(key, x)
    want = x.clone()
    want[:3] = r.fns[key](x[:3])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5) and torch.equal(got[3:], x[3:])


def test_tableable_reads_only_data():
    hook = {"sites": [{"site": "resid_post[1]", "head": None, "probes": [], "kernels": [{"kind": "project", "gate": None, "preserve_norm": False,
                                                  "tensors": {"basis": "q"}}]}]}
    assert tableable(hook, lambda name: (3, 16), Capacity(rank=4, kernels=1), []) is None
    assert "rank 3" in tableable(hook, lambda name: (3, 16), Capacity(rank=2, kernels=1), [])


# ------------------------------------------------------------------ gates and probes in the tables

READS = {"dot": "dot(v)", "offset": "dot(v) + 0.5", "cosine": "cosine(v)", "norm": "norm",
         "subspace": "subspace_cosine(v, u)", "projected": "projected_cosine(v, u)"}
THRESHOLDS = {"dot": 0.0, "offset": 0.5, "cosine": 0.0, "norm": 4.0, "subspace": 0.3, "projected": 0.1}
GATES = ["p > T", "p < T", "not p >= T", "p > T and q < 0", "p < T or q > 0", "not (p > T and q > 0) or p < -9"]
# (probe site, intervention site): the probe's point before the kernel's, or the same point (read first)
PLACES = [("resid_pre[1]", "resid_post[2]"), ("resid_post[1]", "resid_post[1]"), ("mlp_out[1]", "attn_out[2]")]


def _gated(read: str, pool: str, gate: str, place: int, seed: int, body: str = "add 2.5 * v") -> RequestSteer:
    at_probe, at = PLACES[place]
    text = (f"steer 1\nvector v = {_vec(seed)}\nvector u = {_vec(seed + 50)}\n"
            f"probe p {{\n  at {at_probe}\n  read {READS[read]}\n  pool {pool}\n}}\n"
            f"probe q {{\n  at {at_probe}\n  read dot(u)\n  pool token\n}}\n"
            f"intervention a {{\n  at {at}\n  {body}\n  tokens {'generated' if pool != 'token' else 'all'}\n"
            f"  when {gate.replace('T', str(THRESHOLDS[read]))}\n}}\n")
    result = check_source(text, "gated.steer", facts=FACTS)
    assert result.ok, result.render()
    return RequestSteer(result.plan, FACTS, max_tokens=64, dtype=torch.float32, device=torch.device("cpu"),
                        tp_rank=0, tp_size=1, slot_id=f"{read}-{pool}-{gate}-{place}-{seed}", receipt=True)


gated = st.builds(_gated, st.sampled_from(sorted(READS)), st.sampled_from(["token", "prompt.mean", "prompt.last"]),
                  st.sampled_from(GATES), st.integers(0, len(PLACES) - 1), st.integers(0, 3))


def _forward(tables, reqs, spans, n: int, gen, full: bool, pos, plen) -> None:
    """One step's pass over every point in order: the tables on the whole step, each request's own function
    on its rows; the same rows out, and rows no plan steers untouched."""
    from steerc.targets.serve.capacity import ALL_SITES, point_hooks

    for key in point_hooks(FACTS, ALL_SITES):
        use = tables.used(key)
        mine = [(r, a, b) for r, (a, b) in zip(reqs, spans) if key in r.fns]
        if use is None:  # no plan steers here, or its plans only pool a probe here and no prompt token passes
            for r, a, b in mine:
                x = torch.randn(b - a, FACTS.hidden, generator=gen)
                assert r.state.pooled and bool((pos >= plen)[a:b].all()) and torch.equal(r.fns[key](x), x), key
            continue
        x = torch.randn(n + 2, FACTS.hidden, generator=gen) * 2
        got = tables.apply(key, x, None if full else use)
        want = x.clone()
        for r, a, b in mine:
            want[a:b] = r.fns[key](x[a:b])
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (key, (got - want).abs().max())
    for r, (a, b) in zip(reqs, spans):  # and the probe values themselves, per token and pooled per request
        for name in r.state.per_token:
            mine = getattr(r.state, f"tok_{name}")[:b - a]
            assert torch.allclose(tables.pv[a:b, r.probe_index[name]], mine, rtol=1e-5, atol=1e-5), name
        for name in r.state.pooled:
            held = tables.pheld[r.probe_index[name], r.rslot]
            mine = getattr(r.state, f"held_{name}")[0]
            assert torch.allclose(held, mine, rtol=1e-5, atol=1e-5, equal_nan=True), (name, held, mine)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(gated, st.integers(2, 7)), min_size=1, max_size=4), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_gates_and_probes_in_the_tables_give_the_per_request_values(cases, full, seed):
    """Per-token and pooled probes of every readout, gates of every form, over three steps: the prompt in two
    chunks (a pooled probe sums across them and decides at the prompt's last position), then one decode
    step; the twin of a plan shares its slot and keeps a request row of its own."""
    reqs = [c[0] for c in cases]
    prompts = [c[1] for c in cases]
    tables = _tables(plans=8, requests=6)
    for r in reqs:
        assert r.tabled and set(r.tabled) == set(r.fns), r.why_not
        r.slot = tables.acquire(r.slot_id, r.table_rows())
        if r.pools:
            r.rslot = tables.take_request()
    gen = torch.Generator().manual_seed(seed)
    half = [p // 2 for p in prompts]
    for lengths, starts in ((half, [0] * len(reqs)), ([p - h + 1 for p, h in zip(prompts, half)], half),
                            ([1] * len(reqs), [p + 1 for p in prompts])):
        pos, plen, spans = _step(lengths, prompts, starts)
        _write(tables, reqs, spans, pos, plen, restart=starts[0] == 0)
        _forward(tables, reqs, spans, len(pos), gen, full, pos, plen)


def test_a_pooled_gate_decides_per_request_not_per_plan():
    """Two requests of one plan share its slot; each pools its own prompt into its own request row, so the
    gate opens for one and stays shut for the other; preempted and recomputed, a request pools afresh."""
    a, b = (_gated("dot", "prompt.mean", "p > T", 0, 1) for _ in range(2))
    tables = _tables(requests=2)
    for r in (a, b):
        r.slot = tables.acquire(r.slot_id, r.table_rows())
        r.rslot = tables.take_request()
    assert a.slot == b.slot and a.rslot != b.rslot
    probe_key = next(iter(a.reading))
    kernel_key = next(k for k in a.tabled if k not in a.reading)
    v = torch.from_numpy(np.array(eval(_vec(1)), dtype=np.float32))  # noqa: S307 - our own literal

    def step(lengths, starts, sign_a, sign_b):
        pos, plen, spans = _step(lengths, [3, 3], starts)
        _write(tables, [a, b], spans, pos, plen, restart=starts[0] == 0)
        n = len(pos)
        x = torch.zeros(n, FACTS.hidden)
        (a0, a1), (b0, b1) = spans
        x[a0:a1], x[b0:b1] = sign_a * v, sign_b * v
        tables.apply(probe_key, x, tables.used(probe_key))
        y = torch.zeros(n, FACTS.hidden)
        return tables.apply(kernel_key, y, tables.used(kernel_key)), spans

    step([3, 3], [0, 0], 1.0, -1.0)  # the prompts: a's mean reads +|v|^2, b's -|v|^2
    out, ((a0, a1), (b0, b1)) = step([1, 1], [3, 3], -1.0, 1.0)  # decode: the held values decide, not these rows
    assert out[a0:a1].abs().sum() > 0 and out[b0:b1].abs().sum() == 0
    assert float(tables.pheld[0, a.rslot]) > 0 > float(tables.pheld[0, b.rslot])
    pos, plen, spans = _step([3], [3], [0])  # a, recomputed from its first token after preemption
    _write(tables, [a], spans, pos, plen, restart=True)
    assert torch.isnan(tables.pheld[0, a.rslot]) and float(tables.cnt[0, a.rslot]) == 0


def test_a_decode_step_skips_a_point_that_only_pools_a_probe():
    """A point where a plan only pools a probe does nothing once no prompt token passes: the host leaves it out
    of the step (no readout per site per decode step), and the gate still decides from the held value."""
    text = (f"steer 1\nvector v = {_vec(3)}\nprobe p {{\n  at resid_pre[1]\n  read cosine(v)\n  pool prompt.mean\n}}\n"
            "intervention a {\n  at resid_post[2]\n  add 2.0 * v\n  tokens generated\n  when p > 0\n}\n")
    result = check_source(text, "pooled.steer", facts=FACTS)
    assert result.ok, result.render()
    r = RequestSteer(result.plan, FACTS, max_tokens=64, dtype=torch.float32, device=torch.device("cpu"),
                     tp_rank=0, tp_size=1, slot_id="pooled-only", receipt=True)
    tables = _tables(requests=2)
    r.slot, r.rslot = tables.acquire(r.slot_id, r.table_rows()), tables.take_request()
    probe_key, kernel_key = next(iter(r.reading)), next(k for k in r.tabled if k not in r.reading)
    v = torch.from_numpy(np.array(eval(_vec(3)), dtype=np.float32))  # noqa: S307 - our own literal
    pos, plen, spans = _step([4], [4], [0])
    _write(tables, [r], spans, pos, plen, restart=True)
    assert tables.used(probe_key).pooled == {(0, 1)}  # (probe 0, cosine)
    x = v.expand(4, -1).clone()
    before = x.clone()
    out = tables.apply(probe_key, x, tables.used(probe_key))
    assert torch.equal(out, before) and torch.equal(x, before)  # read, untouched
    assert float(tables.pheld[0, r.rslot]) == pytest.approx(1.0, abs=1e-5)
    pos, plen, spans = _step([1], [4], [4])
    _write(tables, [r], spans, pos, plen, restart=False)
    assert tables.used(probe_key) is None and tables.used(kernel_key).gated
    out = tables.apply(kernel_key, torch.zeros(1, FACTS.hidden), tables.used(kernel_key))
    assert torch.allclose(out[0], 2.0 * v)


def test_traced_tables_keep_the_token_count_symbolic():
    """vLLM traces the model once at max_num_batched_tokens rows, the token count marked dynamic: nothing in the
    tables (gates and pooled probes included) may specialise it. A per-token buffer laid out [.., token] is
    sliced to a view whose contiguity depends on whether n is the whole buffer, a guard that pins n."""
    key = ("m", "post", "output")
    tables = SteerTables({key: 16}, plans=3, rank=2, kernels=2, probes=2, requests=4, hidden=16, max_tokens=32,
                         dtype=torch.float32, device=torch.device("cpu"))
    compiled = torch.compile(lambda x: tables.apply(key, x), fullgraph=True, backend="aot_eager")
    x = torch.randn(32, 16)
    torch._dynamo.mark_dynamic(x, 0)  # raises ConstraintViolationError where the trace specialises it
    assert torch.equal(compiled(x), x), "no plan: every row as it was"


@pytest.mark.parametrize("kind", sorted(S.READOUT_CODES))
def test_each_readouts_row_is_its_readout(kind):
    """The shared module's two forms of a readout: a probe row read in a batch, and the readout itself."""
    gen = torch.Generator().manual_seed(7)
    d, n = 16, 12
    h = torch.randn(n, d, generator=gen) * 2
    vector = {"dot": torch.randn(d, generator=gen), "cosine": torch.randn(d, generator=gen), "norm": None,
              "sae_feature": torch.stack([torch.randn(d, generator=gen) / 4, torch.randn(d, generator=gen) / 10]),
              "subspace_cosine": torch.linalg.qr(torch.randn(d, 3, generator=gen))[0].T.contiguous(),
              "projected_cosine": torch.linalg.qr(torch.randn(d, 2, generator=gen))[0].T.contiguous()}[kind]
    row = S.readout_row(kind, vector, 0.25, 0.1)
    U = torch.zeros(n, d, 3)
    U[:, :, :row["U"].shape[1]] = row["U"]
    got = S.readout_rows(h, U, torch.full((n,), row["off"]), torch.full((n,), row["p"]),
                         torch.full((n,), row["code"]))
    want = S.readout(kind, h, vector, 0.25, 0.1)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    if kind == "sae_feature":
        assert (want == 0).any() and (want > 0).any(), "the JumpReLU both fires and stays shut here"
