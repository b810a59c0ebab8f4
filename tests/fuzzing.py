"""The fuzz budget every fuzz test shares: ``@fuzz(n, "name")`` runs ``n * STEERC_FUZZ_SCALE`` inputs,
and the test counts each input it really ran in ``RAN["name"]``.

At the end of the session ``conftest.py`` prints the count per entry point and fails the run when a
fuzz test that ran checked fewer than 90% of its budget (a test whose inputs were all filtered out
would check nothing). ``STEERC_FUZZ_SCALE=20 pytest tests/test_fuzz*.py`` fuzzes twenty times longer.
"""

from __future__ import annotations

import collections
import os

from hypothesis import HealthCheck, settings

SCALE = max(1, int(os.environ.get("STEERC_FUZZ_SCALE", "1")))

# How many inputs each fuzz test runs (times SCALE), and how many it did.
BUDGET: dict[str, int] = {}
RAN: collections.Counter = collections.Counter()


def fuzz(n: int, name: str) -> settings:
    BUDGET[name] = n * SCALE
    return settings(max_examples=n * SCALE, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.large_base_example])


def shortfalls() -> dict[str, tuple[int, int]]:
    """The fuzz tests that ran here but fewer than 90% of their budget: name -> (ran, budget)."""
    return {name: (RAN[name], BUDGET[name]) for name in BUDGET if 0 < RAN[name] < BUDGET[name] * 0.9}


def summary() -> str:
    ran = {name: RAN[name] for name in BUDGET if RAN[name]}
    return f"fuzz inputs run: {sum(ran.values())} ({', '.join(f'{k}: {v}' for k, v in ran.items())})"
