"""Cold start: `steerc check` of a small program, side by side with `python -c "import lark"`.

Each command is a new process; the two run in turn (lark, steerc, lark,
steerc, ...) and each figure is the median of the per-pair ratios, so that a
machine whose speed drifts during the run moves both sides of a ratio alike.
Bytecode is cached for both (in a temporary PYTHONPYCACHEPREFIX, filled by
warm-up runs), as it is for an installed steerc; the programs are the
conformance examples without vectors (06_heads), with a safetensors vector
(01_add) and with a .npy one (02_abliterate), and one that loads a llama.cpp
control vector (.gguf) written here. The goal (issue 33): a program that
loads a vector checks within 2x of importing lark.

    python benchmarks/cold_start.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The examples the clone ships (a copy of the conformance examples); STEERC_EXAMPLES points elsewhere.
EXAMPLES = os.environ.get("STEERC_EXAMPLES", os.path.join(HERE, "..", "tests", "fixtures", "examples"))
GOAL = 2.0

GGUF_PROGRAM = """steer 1

# A llama.cpp control vector: one direction per layer, from layer 1.
vector cv = load("control.gguf")

intervention push {
  at     resid_post[1:3]
  add    2.0 * cv
}
"""


def steerc_command() -> list[str]:
    """The ``steerc`` console script next to this Python (what a user runs), else ``python -m steerc``."""
    script = os.path.join(os.path.dirname(sys.executable), "steerc")
    return [script] if os.path.isfile(script) else [sys.executable, "-m", "steerc"]


def gguf_project(folder: str) -> str:
    """A project holding a control vector for layers 1 to 3 (width 64) and a program that loads it."""
    import numpy as np

    from steerc.io.controlvector import control_vector_bytes

    rng = np.random.default_rng(0)
    directions = {layer: rng.normal(size=64).astype(np.float32) for layer in (1, 2, 3)}
    with open(os.path.join(folder, "control.gguf"), "wb") as fh:
        fh.write(control_vector_bytes(directions, "llama"))
    with open(os.path.join(folder, "steer.toml"), "w", encoding="utf-8") as fh:
        fh.write("# the project root\n")
    path = os.path.join(folder, "control.steer")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(GGUF_PROGRAM)
    return path


def run_once(cmd: list[str], cwd: str, env: dict) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-400:]}")
    return elapsed


def side_by_side(cmd: list[str], base: list[str], cwd: str, env: dict, runs: int) -> tuple[float, float, float]:
    """(median seconds of ``cmd``, of ``base``, median of the per-pair ratios), after two warm-up pairs."""
    for _ in range(2):
        run_once(base, cwd, env)
        run_once(cmd, cwd, env)
    mine, theirs = [], []
    for _ in range(runs):
        theirs.append(run_once(base, cwd, env))
        mine.append(run_once(cmd, cwd, env))
    ratios = [a / b for a, b in zip(mine, theirs)]
    return statistics.median(mine), statistics.median(theirs), statistics.median(ratios)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21, help="pairs of runs per program (default 21)")
    args = ap.parse_args()

    cache = tempfile.mkdtemp(prefix="steerc-cold-pyc-")
    work = tempfile.mkdtemp(prefix="steerc-cold-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=cache, HF_HUB_OFFLINE="1")
    lark = [sys.executable, "-c", "import lark"]
    steerc = steerc_command()
    cases = [
        ("06_heads.steer (no vectors)", EXAMPLES, "06_heads.steer"),
        ("01_add.steer (a safetensors vector)", EXAMPLES, "01_add.steer"),
        ("02_abliterate.steer (a .npy vector)", EXAMPLES, "02_abliterate.steer"),
        ("control.steer (a .gguf control vector)", work, gguf_project(work)),
    ]
    try:
        rows = [(label, *side_by_side(steerc + ["check", program], lark, cwd, env, args.runs))
                for label, cwd, program in cases]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"cold start: `{os.path.basename(steerc[0])} check` beside `python -c \"import lark\"` "
          f"(median of {args.runs} pairs, bytecode cached)")
    print("| program | steerc check (s) | import lark (s) | ratio |")
    print("|---|---:|---:|---:|")
    for label, mine, theirs, ratio in rows:
        print(f"| {label} | {mine:.3f} | {theirs:.3f} | {ratio:.2f}x |")
    worst = max(ratio for label, *_, ratio in rows if "no vectors" not in label)
    print(f"\nslowest program that loads a vector: {worst:.2f}x import lark (goal <= {GOAL:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
