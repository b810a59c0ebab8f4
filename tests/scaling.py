"""How a cost grows with the size of its input, for the tests that claim linear time (issue 32).

A test that says "linear" measures the same work at two sizes, side by side in one process, and asserts on the
ratio of the CPU times: neither a loaded machine (CPU time, :class:`support.CpuSeconds`) nor a slow one (a ratio,
not a number of seconds) fails it, while a quadratic cost does (4x the input: about 16x the time, where linear
work takes about 4x). How fast the work is against a clock belongs to benchmarks/.
"""

from __future__ import annotations

from collections.abc import Callable

from support import CpuSeconds

FACTOR = 4  # the large input is FACTOR times the small one: linear work costs about 4x, quadratic about 16x


def cpu_seconds(work: Callable[[], object], repeats: int = 3) -> float:
    """The least CPU time of ``repeats`` runs of ``work()``: the cost of the work, not of what happened beside it."""
    best = float("inf")
    for _ in range(repeats):
        with CpuSeconds() as cpu:
            work()
        best = min(best, cpu.seconds)
    return best


def growth(small: Callable[[], object], large: Callable[[], object], repeats: int = 3) -> tuple[float, str]:
    """(large's CPU time over small's, a line that says both): each measured ``repeats`` times, alternately.

    The small side is floored at 1 ms, so a clock tick on a cheap small run cannot make the ratio huge.
    """
    small_s = large_s = float("inf")
    for _ in range(repeats):
        small_s = min(small_s, cpu_seconds(small, 1))
        large_s = min(large_s, cpu_seconds(large, 1))
    ratio = large_s / max(small_s, 1e-3)
    return ratio, f"{large_s:.3f} s of CPU against {small_s:.3f} s: {ratio:.1f}x"


def assert_linear(small: Callable[[], object], large: Callable[[], object], factor: int = FACTOR) -> None:
    """``large`` (``factor`` times ``small``'s input) costs at most twice what linear growth allows."""
    ratio, said = growth(small, large)
    assert ratio < 2.0 * factor, f"{factor}x the input cost {said} (linear: about {factor}x)"
