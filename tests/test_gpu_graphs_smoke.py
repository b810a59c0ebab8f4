"""benchmarks/gpu_graphs.py's CPU check (what it runs where there is no CUDA): the plan tables on a tiny
transformers model leave generation exact with no plan (identity rows), and change it with three plans."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


def test_the_gpu_benchmark_runs_its_cpu_check(capsys):
    import gpu_graphs

    assert gpu_graphs.main(["--smoke"]) == 0
    assert "tiny CPU check passed" in capsys.readouterr().out
