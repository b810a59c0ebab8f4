"""Shared fixtures for the steerc test suite.

* ``examples_dir``: the shared conformance programs (``$STEERC_EXAMPLES`` or
  ``../shared/examples`` next to the repository); tests using it skip when
  the folder is missing.
* ``tiny_facts(name)``: the :class:`~steerc.facts.ModelFacts` of one of the
  tiny model configs in ``examples/models`` (``"tiny-llama"``, ...).
* ``update_golden``: true under ``pytest --update-golden``; golden-file
  tests then rewrite their expectations instead of comparing.

Helpers the test modules share (golden comparison, running the CLI
in-process) live in ``tests/support.py``.

steerc's user cache (dequantized GGUF models, xgrammar verdicts) goes to a
temporary folder removed after the session, so tests neither read nor fill
``~/.cache/steerc``; set ``STEERC_CACHE_DIR`` to keep one between runs
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
    """The shared conformance examples. They are not ours to change: a test that writes into them (a `fmt`
    on their folder, say) fails the session at its end, naming the files."""
    path = examples_path()
    if not os.path.isdir(path):
        pytest.skip(f"shared examples not found at {path} (set STEERC_EXAMPLES)")
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
