"""llama.cpp tests: they run in the environment ``./dev test-llamacpp`` builds (llama-cpp-python 0.3.36).

Elsewhere each module skips, saying so; with ``STEERC_LLAMACPP_TESTS=1`` (set by ``./dev test-llamacpp``)
or ``CI=true`` a missing llama_cpp is a failure, never a skip.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
