"""Compile speed: parse and full check of generated programs, and cold start.

Programs of 10, 100, 1,000 and 10,000 interventions (vectors loaded from one
safetensors file, with a model so layout checks and plan building run too)
are timed for parse alone and for the full check; each figure is the best
of N runs in this process. Then the cold start of `steerc check` on a small
file, next to `python -c "import lark"`, measured the same way (median of
process runs).

    python benchmarks/compile_speed.py [--runs 3] [--cold-runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
# The examples the clone ships (a copy of the conformance examples); STEERC_EXAMPLES points elsewhere.
EXAMPLES = os.environ.get("STEERC_EXAMPLES", os.path.join(HERE, "..", "tests", "fixtures", "examples"))
SIZES = (10, 100, 1000, 10000)
OPS = ("add {s} * v{k}", "scale {s}", "ablate v{k}", "clamp v{k} to {s}", "rotate in (v{k}, v{j}) by {s}")
SCOPES = ("generated", "prompt[-2:]", "all", "prompt[-1:], generated")


def write_vectors(folder: str, n_vectors: int = 16) -> str:
    rng = np.random.default_rng(0)
    save_file({f"v{i}": rng.normal(size=64).astype(np.float32) for i in range(n_vectors)},
              os.path.join(folder, "bench.safetensors"))
    return folder


def program(n: int, n_vectors: int = 16) -> str:
    lines = ["steer 1", ""]
    lines += [f'vector v{i} = load("bench.safetensors", key="v{i}")' for i in range(n_vectors)]
    for i in range(n):
        k, j = i % n_vectors, (i + 1) % n_vectors
        op = OPS[i % len(OPS)].format(s=0.5 + (i % 7) * 0.25, k=k, j=j)
        lines += ["", f"intervention i{i} {{", f"  at     resid_post[{i % 4}]", f"  {op}",
                  f"  tokens {SCOPES[i % len(SCOPES)]}", "}"]
    return "\n".join(lines) + "\n"


def paused_gc(fn, *args):
    """Run ``fn`` with the garbage collector paused, as ``steerc.api.check`` does."""
    import gc

    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()


def best_of(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def cold(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold-runs", type=int, default=15)
    args = ap.parse_args()

    from steerc.api import Options, check_source
    from steerc.facts import load_facts
    from steerc.frontend import parse_source

    facts = load_facts(os.path.join(EXAMPLES, "models", "tiny-llama"))
    folder = write_vectors(tempfile.mkdtemp(prefix="steerc-bench-"))
    options = Options(base_dir=folder, root=folder)
    rows = []
    for n in SIZES:
        text = program(n)
        result = check_source(text, "bench.steer", options=options, facts=facts)
        assert result.ok, result.render()[:2000]
        parse = best_of(args.runs, lambda: paused_gc(parse_source, text, "bench.steer"))
        check = best_of(args.runs, lambda: check_source(text, "bench.steer", options=options, facts=facts))
        rows.append((n, parse, check, result.plan.kernel_count))
    print(f"compile speed (best of {args.runs}; check = parse + all passes + layout + plan, one core)")
    print("| interventions | parse (s) | full check (s) | per intervention (us) | kernels |")
    print("|---:|---:|---:|---:|---:|")
    for n, parse, check, kernels in rows:
        print(f"| {n:,} | {parse:.3f} | {check:.3f} | {check / n * 1e6:.0f} | {kernels:,} |")
    t1k = next(c for n, _, c, _ in rows if n == 1000)
    t10k = next(c for n, _, c, _ in rows if n == 10000)
    print(f"\n1,000 interventions: {t1k:.3f} s (goal < 0.5 s); 10,000 / 1,000 = {t10k / t1k:.1f}x (goal <= 12x)")

    small = os.path.join(EXAMPLES, "06_heads.steer")
    with_vectors = os.path.join(EXAMPLES, "01_add.steer")
    py = sys.executable
    lark = cold([py, "-c", "import lark"], args.cold_runs)
    steer_small = cold([py, "-m", "steerc", "check", small], args.cold_runs)
    steer_vec = cold([py, "-m", "steerc", "check", with_vectors], args.cold_runs)
    print(f"\ncold start (median of {args.cold_runs} processes)")
    print("| command | seconds | vs import lark |")
    print("|---|---:|---:|")
    print(f"| `python -c \"import lark\"` | {lark:.3f} | 1.0x |")
    print(f"| `steerc check 06_heads.steer` (no vectors) | {steer_small:.3f} | {steer_small / lark:.1f}x |")
    print(f"| `steerc check 01_add.steer` (loads a vector) | {steer_vec:.3f} | {steer_vec / lark:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
