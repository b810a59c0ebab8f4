"""pytest's collection at the root: ``--doctest-modules`` imports every module of ``steerc/``.

``steerc.eval.harness`` is lm-eval's plugin and imports lm-eval at the top (its model class
subclasses lm-eval's); lm-eval lives in the peers' environment (requirements/peers.txt), so
elsewhere the module is not collected. Its tests are tests/peers/test_lm_eval.py.
"""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("lm_eval") else ["steerc/eval/harness.py"]
