"""The serve plugin's plan tables in the steer points, without an engine: what each step costs the host.

On a CPU, ``steerc serve`` runs the plan tables inside its steer points, eagerly, trimmed to what the step's
plans use at each site (spec/targets.md, the per-request path). This measures that work alone, in seconds rather
than the minutes an engine boot takes, on SmolLM2-135M-Instruct's layout: the 32 distinct mixed plans of
``benchmarks/vllm_cpu.py`` (adds, ablations, a clamp, a schedule, a head, two gates) hold table slots, then

* ``before``: the router's per-step writes for a decode step of the 32 requests (stage masks, slots, the
  tables' per-token arrays), as ``ServeRouter.before`` makes them;
* ``points``: every site a plan steers, through ``SteerTables.apply``/``apply_pair`` with the step's use, the
  sites in model order, each one's cost listed (the dearest first);
* ``--flush``: the same with the caches flushed between sites (a 32 MiB write), as a model's layers flush
  them between steer points on a real engine: closer to what the engine sees.

One thread, as vLLM's CPU worker runs. The real-engine figures are ``benchmarks/vllm_cpu.py --serve``'s.

    python benchmarks/serve_tables_cpu.py [--steps 20] [--flush] [--top 8]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))


def build(requests: int = 32, prompt: int = 30):
    """(tables, requests with their slots, point widths) for the mixed plans of vllm_cpu.py on SmolLM2."""
    import torch
    from models import ensure
    from vllm_cpu import _facts, _plan, mixed_plan

    from steerc.runtime.vllm.serve import RequestSteer
    from steerc.runtime.vllm.tables import SteerTables
    from steerc.targets.serve.capacity import ALL_SITES, point_hooks

    folder = ensure("smollm2")
    facts = _facts(folder)
    widths: dict = {}
    for group in ALL_SITES:
        for key in point_hooks(facts, (group,)):
            widths.setdefault(key, facts.heads * facts.head_dim if group == "head" else facts.hidden)
    tables = SteerTables(widths, plans=32, rank=4, kernels=2, probes=2, requests=requests, hidden=facts.hidden,
                         max_tokens=2048, dtype=torch.float32, device=torch.device("cpu"))
    reqs = []
    for i in range(requests):
        r = RequestSteer(_plan(folder, mixed_plan(i)), facts, max_tokens=2048, dtype=torch.float32,
                         device=torch.device("cpu"), tp_rank=0, tp_size=1, slot_id=f"mixed{i}")
        r.slot = tables.acquire(r.slot_id, r.table_rows())
        if r.pools:
            r.rslot = tables.take_request()
        reqs.append(r)
    return tables, reqs, widths


def before(tables, reqs, pos, plen, spans) -> None:
    """ServeRouter.before's writes for requests holding table slots."""
    n = len(pos)
    slots = np.zeros(n, dtype=np.int64)
    rslots = np.full(n, tables.requests, dtype=np.int64)
    rows: dict = {}
    for r, (a, b) in zip(reqs, spans):
        r.feed(pos[a:b], plen[a:b], restart=False, tables=tables)
        slots[a:b] = r.slot
        if r.rslot is not None:
            rslots[a:b] = r.rslot
        for key, stages in r.stage_masks(pos[a:b], plen[a:b]).items():
            rows.setdefault(key, []).extend((k, a, b, m, f) for k, (m, f) in enumerate(stages))
    tables.write_step(n, slots, rows, rslots, pos, plen)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--flush", action="store_true", help="flush the caches between sites")
    parser.add_argument("--top", type=int, default=8, help="list this many of the dearest sites")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    tables, reqs, widths = build()
    n = len(reqs)
    pos, plen, spans = np.full(n, 35), np.full(n, 30), [(i, i + 1) for i in range(n)]  # a decode step
    junk = torch.zeros(8 << 20)  # 32 MiB
    xs = {key: torch.randn(n, w) for key, w in widths.items()}
    per: collections.Counter = collections.Counter()

    def points() -> None:
        for key in widths:
            use = tables.used(key)
            if use is None:
                continue
            if args.flush:
                junk.add_(1.0)
            start = time.perf_counter()
            if key[2] == "fused_pair":
                tables.apply_pair(key, xs[key], xs[key], use)
            else:
                tables.apply(key, xs[key], use)
            per[key] += time.perf_counter() - start

    with torch.inference_mode():
        for _ in range(3):  # warm
            before(tables, reqs, pos, plen, spans)
            points()
        start = time.perf_counter()
        for _ in range(args.steps):
            before(tables, reqs, pos, plen, spans)
        took = (time.perf_counter() - start) / args.steps
        per.clear()
        for _ in range(args.steps):
            points()
    print(f"32 distinct mixed plans on SmolLM2's layout, a decode step of {n} tokens, one thread, "
          f"{'caches flushed between sites' if args.flush else 'warm caches'}, mean of {args.steps} steps:")
    print(f"  before (the host's step writes): {took * 1e3:.2f} ms")
    print(f"  points: {sum(per.values()) / args.steps * 1e3:.2f} ms at {len(per)} sites")
    for key, spent in per.most_common(args.top):
        print(f"    {key[0]} {key[1]} {key[2]}: {spent / args.steps * 1e6:.0f} us  {tables.used(key)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
