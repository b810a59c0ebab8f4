"""Editor speed: the Pygments lexer on large programs, and ``steerc lsp`` re-checking a large program per edit.

* lexer: ``steerc.highlight``'s Pygments lexer over programs of ROWS vector lines with comments and a
  triple-quoted string of 20 characters a row (best of RUNS, in this process, one core);
* lsp: ``python -m steerc lsp`` over stdio, as an editor drives it (tests/lsp_client.py), in a project whose
  steer.toml names SmolLM2's shipped config (30 layers; no weights are read). A program of N interventions is
  opened, then EDITS edits of an ``at`` line's layer each wait for their ``publishDiagnostics``:
  wall time from ``didChange`` to the diagnostics of that version (median, min, max).

These were once limits in the tests (``tests/test_highlight.py``: 5 s for 3,000 rows; ``tests/test_lsp.py``: a
median under 0.3 s for 1,000 interventions); the tests now assert what the results mean, and a ratio where they
claim linear time (issue 32).

    python benchmarks/editor_speed.py [--runs 3] [--edits 12]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from common import HERE

sys.path.insert(0, os.path.join(HERE, "..", "tests"))

LEXER_ROWS = (750, 3000, 12000)
LSP_SIZES = (250, 1000)


def large_program(rows: int) -> str:
    """The program tests/test_highlight.py lexes: ``rows`` vector lines, then a long triple-quoted string."""
    body = "".join(f"vector v{i} = [1.0, -2.5e-3, {i}]  # row {i}\n" for i in range(rows))
    return "steer 1\n" + body + 'constrain json_schema """' + "x" * (20 * rows) + '"""\n'


def big_program(n: int) -> str:
    """The program tests/test_lsp.py opens: ``n`` interventions adding a loaded vector at rotating layers."""
    lines = ["steer 1", "", 'vector joy = load("vectors/joy.safetensors", key="joy")', "param s = 2"]
    for i in range(n):
        lines += ["", f"intervention i{i} {{", f"  at     resid_post[{i % 30}]", f"  add    {0.5 + i % 7} * s * joy",
                  "  tokens generated", "}"]
    return "\n".join(lines) + "\n"


def best_of(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def lexer_table(runs: int) -> None:
    from steerc.highlight.pygments_lexer import SteerLexer

    lexer = SteerLexer()
    print(f"Pygments lexer (best of {runs}, one core)")
    print("| rows | characters | seconds | characters/s |")
    print("|---:|---:|---:|---:|")
    for rows in LEXER_ROWS:
        text = large_program(rows)
        seconds = best_of(runs, lambda text=text: sum(1 for _ in lexer.get_tokens_unprocessed(text)))
        print(f"| {rows:,} | {len(text):,} | {seconds:.3f} | {len(text) / seconds:,.0f} |")


def project() -> str:
    import numpy as np
    from safetensors.numpy import save_file

    root = tempfile.mkdtemp(prefix="steerc-bench-lsp-")
    os.makedirs(os.path.join(root, "vectors"))
    joy = np.zeros(576, dtype=np.float32)  # SmolLM2-135M's width
    joy[:4] = [3.0, 4.0, 0.0, 0.0]
    save_file({"joy": joy}, os.path.join(root, "vectors", "joy.safetensors"))
    with open(os.path.join(root, "steer.toml"), "w", encoding="utf-8") as fh:
        fh.write('[defaults]\nmodel = "smollm2"\n')
    return root


def recheck_times(client, root: str, n: int, edits: int) -> tuple[float, list[float]]:
    """(seconds from didOpen to the first diagnostics, seconds from each didChange to its diagnostics)."""
    from pathlib import Path

    text = big_program(n)
    path = Path(root) / f"big{n}.steer"
    path.write_text(text, encoding="utf-8")
    uri = path.as_uri()
    start = time.perf_counter()
    client.open(uri, text)
    if client.diagnostics(uri, 1, timeout=120) != []:
        raise SystemExit(f"the {n}-intervention program has diagnostics")
    opened = time.perf_counter() - start
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith("  at")]
    times = []
    for version in range(2, 2 + edits):
        row = rows[(version * 83) % len(rows)]
        col = lines[row].index("[") + 1
        end = lines[row].index("]")
        new = "17" if version % 2 else "5"  # the layer's length changes, and it stays in range
        lines[row] = lines[row][:col] + new + lines[row][end:]
        start = time.perf_counter()
        client.change(uri, version, new, ((row, col), (row, end)))
        if client.diagnostics(uri, version, timeout=120) != []:
            raise SystemExit(f"an edit of the {n}-intervention program has diagnostics")
        times.append(time.perf_counter() - start)
    return opened, times


def lsp_table(edits: int) -> None:
    from lsp_client import Client

    root = project()
    client = Client(cwd=root)
    try:
        client.initialize(root=root)
        rows = [(n, *recheck_times(client, root, n, edits)) for n in LSP_SIZES]
        client.close()
    finally:
        client.kill()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nsteerc lsp over stdio, SmolLM2's layout: didChange -> publishDiagnostics ({edits} edits)")
    print("| interventions | didOpen (s) | median (ms) | min (ms) | max (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for n, opened, times in rows:
        print(f"| {n:,} | {opened:.2f} | {statistics.median(times) * 1000:.0f} | {min(times) * 1000:.0f} | "
              f"{max(times) * 1000:.0f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="lexer runs to take the best of (default 3)")
    ap.add_argument("--edits", type=int, default=12, help="edits per program for the LSP (default 12)")
    args = ap.parse_args()
    lexer_table(args.runs)
    try:
        import pygls  # noqa: F401
    except ImportError:
        print("\nsteerc lsp: not measured (pip install 'steerc[lsp]')")
        return 0
    lsp_table(args.edits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
