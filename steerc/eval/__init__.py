"""``steerc eval``: what a program does to the behaviour it targets, what it costs in fluency, at which strength.

The pipeline (spec/eval.md):

* :mod:`steerc.eval.data` reads the items (behaviour pairs and cost texts);
* :func:`grid` expands ``--sweep NAME=a:b:n`` into points;
* :mod:`steerc.eval.score` scores every item unsteered once and steered at
  every point, teacher-forced on the HF runtime;
* :mod:`steerc.eval.metrics` turns scores into metrics with bootstrap
  intervals;
* :mod:`steerc.eval.report` writes the ``steerc.eval/1`` document, the
  table and the plot.

The core of the package (data, metrics, grid) imports no torch.
"""

from __future__ import annotations

import math

from steerc.core.record import frozen

MAX_POINTS = 1000
MAX_STEPS = 1000


class SweepError(ValueError):
    """A ``--sweep`` that is not ``NAME=a:b:n`` (``index``: which --sweep)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.message, self.index = message, index


def parse_sweep(text: str, index: int = 0) -> tuple[str, tuple[float, ...]]:
    """``NAME=a:b:n`` -> (NAME, n values evenly spaced from a to b, both included).

    >>> parse_sweep("strength=0:8:5")
    ('strength', (0.0, 2.0, 4.0, 6.0, 8.0))
    """
    name, sep, spec = text.partition("=")
    parts = spec.split(":")
    if not sep or not name.strip() or len(parts) != 3:
        raise SweepError(f"--sweep takes NAME=a:b:n (n values from a to b), got {text!r}", index)
    try:
        a, b = float(parts[0]), float(parts[1])
    except ValueError:
        raise SweepError(f"--sweep {name.strip()}: {parts[0]!r} and {parts[1]!r} must be numbers", index) from None
    try:
        n = int(parts[2])
    except ValueError:
        raise SweepError(f"--sweep {name.strip()}: the count {parts[2]!r} must be a whole number", index) from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise SweepError(f"--sweep {name.strip()}: the ends must be finite", index)
    if not 1 <= n <= MAX_STEPS:
        raise SweepError(f"--sweep {name.strip()}: the count must be from 1 to {MAX_STEPS}, got {n}", index)
    if n == 1:
        return name.strip(), (a,)
    # a + (b - a) * i / (n - 1), rounded to 12 significant digits so 0:1:11 gives 0.1, not 0.30000000000000004
    return name.strip(), tuple(float(f"{a + (b - a) * i / (n - 1):.12g}") for i in range(n))


def grid(sweeps: list[str]) -> list[dict[str, float]]:
    """Every combination of the sweeps' values, the first sweep varying slowest; ``[{}]`` without sweeps."""
    axes = []
    seen = set()
    for i, text in enumerate(sweeps):
        name, values = parse_sweep(text, i)
        if name in seen:
            raise SweepError(f"--sweep {name} is given twice", i)
        seen.add(name)
        axes.append((name, values))
    points: list[dict[str, float]] = [{}]
    for name, values in axes:
        points = [dict(p, **{name: v}) for p in points for v in values]
        if len(points) > MAX_POINTS:
            raise SweepError(f"the sweeps make more than {MAX_POINTS} points", len(axes) - 1)
    return points


@frozen
class Point:
    """One steered configuration: a program (its path as given) with params at ``params`` (the swept
    values, and ``--set`` ones), and its checked plan."""

    program: str
    params: dict
    plan: object


def evaluate(engine, items, points: list[Point], *, chat: bool, seed: int = 0, resamples: int | None = None,
             progress=None, model_name: str = "", cache_bytes: int | None = None) -> dict:
    """The ``steerc.eval/1`` document of ``points`` on ``items`` (a :class:`steerc.eval.data.Items`), scored
    by ``engine`` (:class:`steerc.eval.score.HFEngine`, :class:`steerc.eval.vllm.VLLMEngine`)."""
    from steerc.eval import metrics as M
    from steerc.eval.report import document
    from steerc.eval.score import CACHE_BYTES, Scorer

    opts = {"seed": seed, "resamples": M.RESAMPLES if resamples is None else resamples}
    scorer = Scorer(engine, items.items, chat, progress=progress,
                    cache_bytes=CACHE_BYTES if cache_bytes is None else cache_bytes)
    base_behavior, base_cost = scorer.unsteered()
    results = []
    for point in points:
        behavior, cost = scorer.point(point)
        results.append((point, M.point_metrics(behavior, cost, **opts), behavior, cost))
    unsteered = M.unsteered_metrics(base_behavior, base_cost, **opts)
    return document(items, model_name, chat, opts, unsteered, results, engine=engine.name)
