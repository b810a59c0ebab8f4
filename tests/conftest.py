"""Shared fixtures for the steerc test suite.

* ``examples_dir``: the tests' own copy of the conformance programs, tiny
  model configs, vectors and bad programs (``tests/fixtures/examples``), so
  a bare clone passes its tests; only ``tests/conformance.py`` reads
  ``../shared/examples``.
* ``tiny_facts(name)``: the :class:`~steerc.facts.ModelFacts` of one of the
  tiny model configs in ``examples/models`` (``"tiny-llama"``, ...).
* ``update_golden``: true under ``pytest --update-golden``; golden-file
  tests then rewrite their expectations instead of comparing.

Helpers the test modules share (golden comparison, running the CLI
in-process) live in ``tests/support.py``.

steerc's user cache (dequantized GGUF models, xgrammar verdicts) goes to a
temporary folder removed after the session, so tests neither read nor fill
``~/.cache/steerc-cache``; set ``STEERC_CACHE_DIR`` to keep one between runs
(the real-model tests then skip the 15 s dequantization).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
if not os.environ.get("STEERC_CACHE_DIR"):
    _cache = tempfile.mkdtemp(prefix="steerc-test-cache-")
    os.environ["STEERC_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

import pytest  # noqa: E402
from support import examples_path  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden instead of comparing with them",
    )


def _tree_digest(path: str) -> dict[str, str]:
    import hashlib

    out = {}
    for top, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(top, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="session")
def examples_dir():
    """The tests' example programs. Tests must not change them: a test that writes into them (a `fmt`
    on their folder, say) fails the session at its end, naming the files."""
    path = examples_path()
    before = _tree_digest(path)
    yield path
    after = _tree_digest(path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"tests changed the shared examples in {path}: {', '.join(changed)}"


@pytest.fixture(scope="session")
def tiny_facts(examples_dir):
    """``tiny_facts("tiny-llama")``: facts of a tiny model config from the examples."""
    from steerc.facts import load_facts

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_facts(os.path.join(examples_dir, "models", name))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))


def pytest_terminal_summary(terminalreporter):
    import fuzzing

    if any(fuzzing.RAN.values()):
        terminalreporter.write_line(fuzzing.summary())


def pytest_sessionfinish(session, exitstatus):
    """A fuzz test that ran fewer than 90% of its budgeted inputs checked less than it claims: fail the run."""
    import fuzzing

    short = fuzzing.shortfalls()
    if short:
        print(f"\nfuzz tests that ran fewer inputs than budgeted (ran, budget): {short}")
        session.exitstatus = 1
