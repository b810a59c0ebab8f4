"""The peers' environment (.venv-peers, built by ./dev test-peers): a peer that does not import skips its
test here, and fails it where the environment must have it (CI, or STEERC_PEER_TESTS=1)."""

from __future__ import annotations

import os

import pytest


def require(name: str):
    """The module ``name``, imported; else the test module is skipped (or failed, see above)."""
    try:
        return __import__(name)
    except ImportError as exc:
        if os.environ.get("CI") == "true" or os.environ.get("STEERC_PEER_TESTS") == "1":
            pytest.fail(f"the peers' environment is missing {name} ({exc}); ./dev test-peers builds it",
                        pytrace=False)
        pytest.skip(f"{name} is not installed here: ./dev test-peers runs this in .venv-peers",
                    allow_module_level=True)
