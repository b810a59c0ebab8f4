"""The vLLM target on a GPU: correctness against the HF target, and throughput.

Where CUDA and vLLM exist, in one run:

1. compile three plans for the model (add at 4 layers; ablate at every layer;
   a prompt-pooled gate over an add) — the CPU-side preparation, which runs
   everywhere;
2. correctness: greedy tokens of the steered vLLM engine (float32, CUDA graphs
   on) equal those of the same plan on the HF target (transformers on the same
   GPU) for a batch of prompts of different lengths;
3. throughput (bfloat16): tokens/s unsteered (vLLM's default CUDA graphs, and
   the piecewise graphs steerc runs under: full graphs replay without the
   step metadata steerc writes), steered with piecewise CUDA graphs, and the
   same plan with ``enforce_eager=True``, side by side.

4. the serve plugin (bfloat16, 256 requests in one batch): plain vLLM (its default CUDA graphs, and
   PIECEWISE), then the plugin compiled with PIECEWISE graphs (its steer points are splitting ops)
   with 0, 1, 8, 32 and 256 distinct plans among the requests, and the plugin eager with 0 and 256.

It prints which vLLM version and model runner (V1 or V2) it ran on.

Elsewhere it prints what it prepared and says why it skipped the rest (exit 0).

    python benchmarks/vllm_gpu.py [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--prompts 64] [--new 128]
                                  [--serve-only]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.environ.get("STEERC_EXAMPLES", os.path.join(HERE, "..", "tests", "fixtures", "examples"))
PROMPTS = ["Write a short poem about the sea.", "What is the capital of France?",
           "Explain photosynthesis to a child in three sentences.", "List three uses of copper."]


def programs(hidden: int) -> dict[str, str]:
    v = np.random.default_rng(7).normal(size=hidden)
    lit = "[" + ", ".join(f"{x / np.linalg.norm(v):.7f}" for x in v) + "]"
    return {
        "add4": f"steer 1\nvector v = {lit}\nintervention a {{\n  at resid_post[8:12]\n  add 4.0 * v\n}}\n",
        "ablate_all": f"steer 1\nvector v = {lit}\nintervention a {{\n  at resid_pre[*]\n  ablate v\n}}\n",
        "gated": (f"steer 1\nvector v = {lit}\nprobe p {{\n  at resid_pre[6]\n  read cosine(v)\n  pool prompt.mean\n}}\n"
                  "intervention a {\n  at resid_post[8:12]\n  add 4.0 * v\n  tokens generated\n  when p > -2.0\n}\n"),
    }


def prepare(facts_path: str, out_dir: str):
    """Compile each program for the model's facts; returns {name: (plan bytes, Plan)}."""
    from steerc.api import check_source
    from steerc.facts import load_facts
    from steerc.targets.vllm.emit import plan_bytes

    facts = load_facts(facts_path)
    out = {}
    for name, text in programs(facts.hidden).items():
        result = check_source(text, f"{name}.steer", facts=facts)
        assert result.ok, result.render()
        data = plan_bytes(result.plan, facts)
        with open(os.path.join(out_dir, f"{name}.msgpack"), "wb") as fh:
            fh.write(data)
        out[name] = (data, result.plan)
        print(f"prepared {name}: {result.plan.kernel_count} kernels, plan.msgpack {len(data):,} bytes")
    return facts, out


def hf_reference(model_name: str, plan, prompts, new: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerc.runtime.hf import install

    tok = AutoTokenizer.from_pretrained(model_name)
    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.float32).cuda().eval()
    outs = []
    with install(model, plan, tok):
        for p in prompts:
            ids = tok(p, return_tensors="pt").to("cuda")
            g = model.generate(**ids, max_new_tokens=new, do_sample=False)
            outs.append(g[0, ids["input_ids"].shape[1]:].tolist())
    del model
    torch.cuda.empty_cache()
    return outs


def vllm_tokens(llm, prompts, new: int):
    from vllm import SamplingParams

    res = llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
    return [list(r.outputs[0].token_ids) for r in res]


def throughput(llm, n: int, new: int) -> float:
    from vllm import SamplingParams

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:4], params)  # warm-up
    t = time.perf_counter()
    res = llm.generate(prompts, params)
    took = time.perf_counter() - t
    return sum(len(r.outputs[0].token_ids) for r in res) / took


def serve_plans(facts, out_dir: str, n: int = 256) -> list[dict]:
    """``extra_args`` of ``n`` distinct serve plans (an add at 4 layers, each its own direction)."""
    from steerc.api import check_source
    from steerc.serve_client import extra_args, read_compiled
    from steerc.targets.serve.emit import emit

    rng = np.random.default_rng(11)
    fields = []
    for i in range(n):
        v = rng.normal(size=facts.hidden)
        lit = "[" + ", ".join(f"{x / np.linalg.norm(v):.7f}" for x in v) + "]"
        text = f"steer 1\nvector v = {lit}\nintervention a {{\n  at resid_post[8:12]\n  add 4.0 * v\n}}\n"
        result = check_source(text, f"p{i}.steer", facts=facts)
        assert result.ok, result.render()
        out = os.path.join(out_dir, f"serve-{i}")
        emit(result.plan, facts, out)
        fields.append(extra_args(*read_compiled(out)))
    print(f"prepared {n} distinct serve plans")
    return fields


def serve_sweep(model: str, fields: list[dict], new: int) -> list[tuple[str, float]]:
    """256 requests in one batch: plain vLLM, then the serve plugin compiled and eager."""
    from vllm import LLM, SamplingParams

    from steerc.runtime.vllm.loader import register_loader

    register_loader()
    n = len(fields)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]

    def rate(llm, k: int) -> float:
        params = [SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True,
                                 extra_args=fields[i % k] if k else None) for i in range(n)]
        llm.generate(prompts[:4], params[:4])  # warm-up
        t = time.perf_counter()
        res = llm.generate(prompts, params)
        return sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t)

    base = dict(model=model, dtype="bfloat16", gpu_memory_utilization=0.5, max_num_seqs=n,
                enable_prefix_caching=False)
    serve = dict(load_format="steerc", additional_config={"steerc": {"mode": "serve"}},
                 logits_processors=["steerc.runtime.serve:SteercGuard"])
    rows = []
    for label, kw, ks in (("plain vLLM (default CUDA graphs)", {}, (0,)),
                          ("plain vLLM (PIECEWISE)", {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, (0,)),
                          ("serve, compiled (PIECEWISE)", dict(serve, compilation_config={"cudagraph_mode": "PIECEWISE"}),
                           (0, 1, 8, 32, n)),
                          ("serve, eager", dict(serve, enforce_eager=True), (0, n))):
        llm = LLM(**base, **kw)
        for k in ks:
            rows.append((f"{label}, {k} distinct plans" if k else f"{label}, plain requests", rate(llm, k)))
            print(f"  {rows[-1][0]}: {rows[-1][1]:.0f} tokens/s")
        release(llm)
    return rows


def release(llm) -> None:
    import torch

    del llm
    gc.collect()
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--facts", default=os.path.join(EXAMPLES, "models", "real", "smollm2-135m-instruct"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--serve-only", action="store_true", help="only the serve plugin's sweep (step 4)")
    args = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix="steerc-vllm-")
    facts, plans = prepare(args.facts, out_dir)
    fields = serve_plans(facts, out_dir)

    import torch

    if not torch.cuda.is_available():
        print("skipped the GPU part: no CUDA device")
        return 0
    if importlib.util.find_spec("vllm") is None:
        print("skipped the GPU part: vllm is not installed (pip install vllm)")
        return 0
    from steerc.runtime.vllm import load, status

    if args.serve_only:
        return _print_serve(args, serve_sweep(args.model, fields, args.new))
    # 1. correctness, float32, CUDA graphs on
    for name, (data, plan) in plans.items():
        want = hf_reference(args.model, plan, PROMPTS, 24)
        llm = load(args.model, data, dtype="float32", gpu_memory_utilization=0.5)
        first = status(llm)[0]
        print(f"vLLM {first['vllm']}, {first['runner']} model runner, hooks {first['hooks'][:3]}...")
        got = vllm_tokens(llm, PROMPTS, 24)
        release(llm)
        same = sum(a == b for a, b in zip(want, got))
        print(f"correctness {name}: {same}/{len(PROMPTS)} prompts give the HF target's greedy tokens")

    # 2. throughput, bfloat16
    from vllm import LLM

    rows = []
    llm = LLM(model=args.model, dtype="bfloat16", gpu_memory_utilization=0.5)
    base = throughput(llm, args.prompts, args.new)
    release(llm)
    rows.append(("unsteered (vLLM's default CUDA graphs)", base))
    llm = LLM(model=args.model, dtype="bfloat16", gpu_memory_utilization=0.5,
              compilation_config={"cudagraph_mode": "PIECEWISE"})
    rows.append(("unsteered (piecewise CUDA graphs)", throughput(llm, args.prompts, args.new)))
    release(llm)
    for name in ("add4", "ablate_all", "gated"):
        data = plans[name][0]
        for eager in (False, True):
            llm = load(args.model, data, dtype="bfloat16", gpu_memory_utilization=0.5, enforce_eager=eager)
            rows.append((f"steerc {name} ({'eager' if eager else 'piecewise CUDA graphs'})",
                         throughput(llm, args.prompts, args.new)))
            release(llm)
    print(f"\n{args.model}, {args.prompts} prompts x {args.new} new tokens, bf16")
    print("| condition | tokens/s | vs unsteered |")
    print("|---|---:|---:|")
    for name, tps in rows:
        print(f"| {name} | {tps:.0f} | {tps / base:.3f} |")
    return _print_serve(args, serve_sweep(args.model, fields, args.new))


def _print_serve(args, rows) -> int:
    plain = rows[0][1]
    print(f"\n{args.model}, the serve plugin, 256 requests x {args.new} new tokens, bf16")
    print("| condition | tokens/s | vs plain vLLM (default CUDA graphs) |")
    print("|---|---:|---:|")
    for name, tps in rows:
        print(f"| {name} | {tps:.0f} | {tps / plain:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
