"""What work costs against other work, for the tests that claim linear time (issue 32) or a bounded cost.

A test that says "linear" measures the same work at two sizes, side by side in one process, and asserts on the
ratio of the CPU times: neither a loaded machine (CPU time, :class:`support.CpuSeconds`) nor a slow one (a ratio,
not a number of seconds) fails it, while a quadratic cost does (4x the input: about 16x the time, where linear
work takes about 4x). A test that says a hostile input is refused cheaply compares it the same way with an
ordinary input through the same path (:func:`assert_cheap`). How fast the work is against a clock belongs to
benchmarks/.
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


def unit_cost(work: Callable[[], object], at_least: float = 0.05) -> float:
    """The CPU seconds of one run of ``work``, timed over as many runs as add up to ``at_least`` seconds (so that a
    clock tick cannot make a cheap run look free or dear): the runs share one timed block, read to the clock's
    grain once, not once a run."""
    from support import _thread_cpu

    runs = 0
    with CpuSeconds() as cpu:
        start = _thread_cpu()
        while runs < 10_000:
            work()
            runs += 1
            if _thread_cpu() - start >= at_least:
                break
    return max(cpu.seconds, 1e-6) / runs


def assert_cheap(work: Callable[[], object], reference: Callable[[], object] | float, times: float,
                 what: str = "", tries: int = 3) -> object:
    """Run ``work`` and assert it cost at most ``times`` one run of ``reference``: an ordinary input through the
    same path (or its :func:`unit_cost`, measured once for many checks), both timed here in CPU time. A bound on
    the work a hostile input causes, whatever the machine's speed; returns what ``work`` returned.

    A run over the bound is run again, up to ``tries`` runs, and the least counts (as :func:`cpu_seconds`): a
    busy machine's page faults and cache misses land in a thread's CPU time too (a 0.1 s check once read 1.4 s
    beside an engine's compile), while work that really grows costs as much every time."""
    base = reference if isinstance(reference, float) else unit_cost(reference)
    # One run is read to the clock's grain (4 ms ticks here): a bound below a few ticks could fail on one tick.
    limit = max(times * base, 5 * clock_grain())
    best = float("inf")
    for _ in range(tries):
        with CpuSeconds() as cpu:
            result = work()
        best = min(best, cpu.seconds)
        if best <= limit:
            return result
    raise AssertionError(f"{what}: {best:.3f} s of CPU at least, {best / base:.0f}x an ordinary input's "
                         f"{base * 1e3:.2f} ms (at most {times:g}x)")


_GRAIN: list[float] = []


def clock_grain() -> float:
    """The smallest step of the thread CPU clock :class:`support.CpuSeconds` reads (seconds), measured once."""
    if not _GRAIN:
        from support import _thread_cpu

        steps = []
        last = _thread_cpu()
        while len(steps) < 3:
            now = _thread_cpu()
            if now != last:
                steps.append(now - last)
                last = now
        _GRAIN.append(min(steps))
    return _GRAIN[0]
