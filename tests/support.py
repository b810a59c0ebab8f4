"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
GOLDEN = os.path.join(TESTS, "golden")


# The example programs, tiny model configs, vectors and bad programs the tests read: a copy of the
# conformance examples that the clone ships, so that a bare clone passes its own tests. Only
# tests/conformance.py (the conformance step of .ci/run) reads ../shared/examples.
EXAMPLES = os.path.join(TESTS, "fixtures", "examples")


class CpuSeconds:
    """``with CpuSeconds() as cpu: ...`` then ``cpu.seconds``: the CPU time this thread spent in the block, with the
    garbage collector off. What the code under test costs: not how busy the machine is, not another thread, and
    not a collection of the suite's heap (~0.7 GB late in a run) that happens to fall inside the block.

    The collector is only switched off, not run first: a full collection of that heap costs about a second, and
    a test that times many short blocks paid it at every block (minutes in CI)."""

    seconds = 0.0

    def __enter__(self) -> "CpuSeconds":
        import gc

        gc.disable()
        self._start = _thread_cpu()
        return self

    def __exit__(self, *exc) -> None:
        import gc

        self.seconds = _thread_cpu() - self._start
        gc.enable()


def _thread_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def examples_path() -> str:
    """Where the tests' own example programs are (tests/fixtures/examples)."""
    return EXAMPLES


def run_cli(argv: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    """Run ``steerc`` in-process: (exit code, stdout, stderr)."""
    import sys

    from steerc.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # main() should return, but never let a test die of it
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue(), err.getvalue()


def needs_constraints():
    """Skip the calling test while ``steerc.constraints`` cannot be imported."""
    return pytest.importorskip("steerc.constraints", reason="steerc.constraints has not landed yet")


def uses_constraint(text: str) -> bool:
    """Whether a program has a ``constrain`` statement (and so needs steerc.constraints)."""
    return re.search(r"^\s*constrain\b", text, re.M) is not None


def compare_golden(path: str, actual: str, update: bool) -> None:
    """Compare ``actual`` with the golden file at ``path`` (or rewrite it when ``update``)."""
    if update:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as fh:
            fh.write(actual)
        return
    if not os.path.exists(path):
        pytest.fail(f"golden file {os.path.relpath(path, REPO)} is missing; run pytest --update-golden")
    with open(path, encoding="utf-8", newline="") as fh:
        expected = fh.read()
    assert actual == expected, f"output differs from {os.path.relpath(path, REPO)} (pytest --update-golden rewrites it)"


def joy_project(folder, *names: str) -> None:
    """``folder`` as a project holding ``names`` from examples/smollm2 and the joy bank derived into its
    vectors/ by the README's command (on the real SmolLM2; the caller is already in ``folder``)."""
    import shutil

    for name in ("joy.jsonl", *names):
        shutil.copy(os.path.join(REPO, "examples", "smollm2", name), os.path.join(folder, name))
    with open(os.path.join(folder, "steer.toml"), "w", encoding="utf-8"):
        pass
    code, out, err = run_cli(["derive", "--model", "smollm2", "--data", "joy.jsonl", "--at", "resid_post[8]",
                              "--read", "mean", "--normalize", "-o", "vectors/joy.safetensors"])
    assert code == 0, err
