"""What steering inside the graph costs under CUDA graphs, without vLLM (issue 35).

The GPU machine this project may be lent has torch, transformers and Triton but no vLLM, so this measures
the design itself on a transformers model: a Llama-3-8B-sized config with random bfloat16 weights (built
from the config: nothing is downloaded), decoding BATCH rows at once under CUDA graphs
(``torch.compile(mode="reduce-overhead")`` through transformers' static-cache generation), in one run:

* plain (no steering);
* **tables in the graph**: the serve plugin's plan tables (:mod:`steerc.runtime.vllm.tables`, the very
  ``SteerTables.apply`` a vLLM worker traces) at every decoder layer's output, with K = 1, 8, 32, 64 and
  256 distinct plans of mixed kernels among the rows (adds, ablations, clamps, rotations, SAE-style
  clamps, two kernels at a point) — one compiled graph for every K, since K changes only the tables' data;
* **opaque points**: the same tables called eagerly between graph pieces (a graph break at every layer, as
  the per-request path's steer points split vLLM's graphs), at K = 32.

Each row: decode tokens/s (median of ROUNDS) and the ratio to plain. Prefill is timed with decode; the
per-token slots are written once, for the decode layout (row b holds plan b mod K), before generation.

Elsewhere (no CUDA) it builds a tiny model on the CPU, runs each condition eagerly once, checks that the
tables change the output and that plan 0 (the identity row) does not, and says it skipped the measure.

    python benchmarks/gpu_graphs.py [--batch 128] [--new 64] [--rounds 3] [--layers 32] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

KS = (1, 8, 32, 64, 256)


def build(layers: int, tiny: bool, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    else:  # Llama-3-8B's shape
        config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                             max_position_embeddings=8192, rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def mixed_rows(width: int, k: int, gen):
    """Plan k's rows at one point, in the kernel seat's batched forms (the kinds' own ``batched``)."""
    import torch

    from steerc.ir.kernels import KINDS
    from steerc.runtime import kernels as S

    def unit(n=1):
        q, _ = torch.linalg.qr(torch.randn(width, n, generator=gen))
        return q.T.contiguous()

    e = unit(2)
    rows = [
        [(KINDS["affine"].batched(S, {"scale": 1.0, "bias": unit()[0] * 4.0}, None), False, None)],
        [(KINDS["project"].batched(S, {"basis": unit()}, None), False, None)],
        [(KINDS["project"].batched(S, {"basis": unit(), "target": torch.tensor([2.0])}, None), False, None)],
        [(KINDS["rotate"].batched(S, {"e1": e[0], "e2": e[1], "angle": torch.tensor(0.5)}, "by"), False, None)],
        [(KINDS["sae_clamp"].batched(S, {"enc": unit()[0], "b_enc": torch.tensor(0.1), "threshold": torch.tensor(0.2),
                                         "b_dec": torch.zeros(width), "dec": unit()[0], "target": torch.tensor(3.0)},
                                     "jumprelu"), False, None)],
        [(KINDS["project"].batched(S, {"basis": unit()}, None), False, None),
         (KINDS["affine"].batched(S, {"scale": 1.0, "bias": unit()[0] * 2.0}, None), True, None)],
        # an add gated by a per-token probe read at the same point (its probe row: GATED_PROBE)
        [(KINDS["affine"].batched(S, {"scale": 1.0, "bias": unit()[0] * 3.0}, None), False, None, GATE)],
    ]
    return [row if len(row) == 4 else (*row, None) for row in rows[k % len(rows)]]


GATE = {"q": [0], "op": [2], "threshold": [0.0], "gate": ["cmp", "p", ">", 0]}  # p > 0


def gated(stages) -> bool:
    return any(gate is not None for *_, gate in stages)


class Steering:
    """Plan tables at every decoder layer's output, written for K plans over ``batch`` decode rows."""

    def __init__(self, model, batch: int, plans: int, device):
        import numpy as np
        import torch

        from steerc.runtime.kernels import compute_dtype
        from steerc.runtime.vllm.tables import SteerTables, probe_row

        width = model.config.hidden_size
        self.keys = [(f"model.layers.{i}", "post", "output") for i in range(model.config.num_hidden_layers)]
        self.tables = SteerTables({k: width for k in self.keys}, plans=plans, rank=2, kernels=2, probes=1,
                                  conditions=1, requests=batch, hidden=width, max_tokens=max(batch, 64) * 64,
                                  dtype=compute_dtype(model.dtype), device=device)
        gen = torch.Generator().manual_seed(35)
        self.slots = []
        for k in range(plans):
            rows = {key: mixed_rows(width, k, gen) for key in self.keys}
            probes = []
            if gated(next(iter(rows.values()))):
                v = torch.randn(width, generator=gen)
                probes = [dict(probe_row("dot", _on({"v": v / v.norm()}, device)["v"], 0.0, 0.0), pool=0)]
            points = {key: {"stages": [(_on(r, device), keep, cols, gate) for r, keep, cols, gate in stages],
                            "probes": [0] if probes else []} for key, stages in rows.items()}
            self.slots.append(self.tables.acquire(f"plan{k}", {"points": points, "probes": probes}))
        self.batch, self.np = batch, np

    def write(self, k: int) -> None:
        """Row b holds plan b mod k (k = 0: no row steered), every stage's scope selecting it."""
        np = self.np
        slots = np.array([self.slots[b % k] if k else 0 for b in range(self.batch)], dtype=np.int64)
        rows = {key: [(s, 0, self.batch, np.ones(self.batch, dtype=bool), None) for s in range(2)]
                for key in self.keys} if k else {}
        self.tables.write_step(self.batch, slots, rows)

    def hooks(self, model, opaque: bool):
        import torch

        tables = self.tables

        def steer(key, h):
            flat = h.reshape(-1, h.shape[-1])
            n = min(flat.shape[0], self.batch)  # decode rows; prefill rows past the batch stay as they are
            out = tables.apply(key, flat[:n]) if not opaque else _eager(tables, key, flat[:n])
            return torch.cat([out, flat[n:]]).reshape(h.shape)

        handles = []
        for key in self.keys:
            def post(mod, args, output, key=key):
                if isinstance(output, tuple):
                    return (steer(key, output[0]),) + tuple(output[1:])
                return steer(key, output)

            handles.append(model.get_submodule(key[0]).register_forward_hook(post))
        return handles


def _on(row: dict, device) -> dict:
    import torch

    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in row.items()}


def _eager(tables, key, x):
    """The tables run eagerly between graph pieces: a graph break, as a splitting op is under vLLM."""
    import torch

    @torch._dynamo.disable
    def run(x):
        return tables.apply(key, x, tables.used(key) or tables.full)

    return run(x)


def decode_rate(model, batch: int, new: int, rounds: int, compiled: bool) -> tuple[float, object]:
    import torch

    ids = torch.randint(1, model.config.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(1)).to(
        model.device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids))
    if compiled:
        from transformers import CompileConfig

        kw.update(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead", fullgraph=False))
    with torch.no_grad():
        out = model.generate(ids, **kw)  # warm: compile and capture
        rates = []
        for _ in range(rounds):
            if ids.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, **kw)
            if ids.is_cuda:
                torch.cuda.synchronize()
            rates.append(batch * new / (time.perf_counter() - start))
    return statistics.median(rates), out


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="the tiny CPU check only, even where CUDA is")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda:
        model = build(2, True, "cpu", torch.float32)
        steering = Steering(model, 4, 3, torch.device("cpu"))
        plain = decode_rate(model, 4, 4, 1, False)[1]
        handles = steering.hooks(model, opaque=False)
        steering.write(0)
        idle = decode_rate(model, 4, 4, 1, False)[1]
        steering.write(3)
        steered = decode_rate(model, 4, 4, 1, False)[1]
        for h in handles:
            h.remove()
        assert torch.equal(idle, plain), "no plan: the identity rows leave generation as it is"
        assert not torch.equal(steered, plain), "three plans change the tokens"
        print("gpu_graphs: no CUDA here; the tiny CPU check passed (identity rows exact, plans in effect). "
              "Skipped the measure.")
        return 0
    device = torch.device("cuda")
    model = build(args.layers, False, device, torch.bfloat16)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, Llama-3-8B-sized ({args.layers} layers), "
          f"bfloat16, batch {args.batch}, {args.new} new tokens, median of {args.rounds}", flush=True)
    rows = []
    plain, _ = decode_rate(model, args.batch, args.new, args.rounds, True)
    rows.append(("plain", "-", plain))
    print(f"  plain: {plain:.0f} tokens/s", flush=True)
    steering = Steering(model, args.batch, max(KS), device)
    handles = steering.hooks(model, opaque=False)
    for k in KS:
        steering.write(k)
        rate, _ = decode_rate(model, args.batch, args.new, args.rounds, True)
        rows.append(("tables in the graph", k, rate))
        print(f"  tables in the graph, {k} plans: {rate:.0f} tokens/s ({rate / plain:.3f})", flush=True)
    for h in handles:
        h.remove()
    torch._dynamo.reset()
    handles = steering.hooks(model, opaque=True)
    steering.write(32)
    rate, _ = decode_rate(model, args.batch, args.new, args.rounds, True)
    rows.append(("opaque points (graph breaks)", 32, rate))
    print(f"  opaque points, 32 plans: {rate:.0f} tokens/s ({rate / plain:.3f})", flush=True)
    print("\n| condition | distinct plans | tokens/s | vs plain |\n|---|---:|---:|---:|")
    for name, k, rate in rows:
        print(f"| {name} | {k} | {rate:.0f} | {rate / plain:.3f} |")
    print(f"\nplan tables: {steering.tables.bytes() / 2**20:.0f} MiB ({len(steering.keys)} points, "
          f"{max(KS)} plans, rank 2, 2 kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
