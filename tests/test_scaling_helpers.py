"""tests/scaling.py's bound on a hostile input's cost: it passes work about as dear as the ordinary input, and
fails work far dearer every time it runs, however busy the machine (a ratio of CPU times, no clock limit)."""

from __future__ import annotations

import pytest
from scaling import assert_cheap, clock_grain, unit_cost


def _spin(n: int) -> int:
    return sum(i * i for i in range(n))


def test_work_like_the_ordinary_input_passes_and_returns_its_result():
    ordinary = unit_cost(lambda: _spin(20_000))
    assert assert_cheap(lambda: _spin(20_000), ordinary, 10, "same work") == _spin(20_000)


def test_work_far_dearer_than_the_ordinary_input_fails_on_every_try():
    ordinary = unit_cost(lambda: _spin(2_000))
    runs = []

    def dear():
        runs.append(1)
        return _spin(2_000 * 2_000)  # 2000x the ordinary work: far over 5 clock ticks (20 ms) on any machine

    with pytest.raises(AssertionError, match="an ordinary input's"):
        assert_cheap(dear, ordinary, 20, "dear work")
    assert len(runs) == 3  # tried again before failing: a busy moment is not a bomb


def test_the_clock_grain_is_a_positive_step():
    assert 0 < clock_grain() < 1
