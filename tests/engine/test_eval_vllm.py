"""``steerc eval --engine vllm`` on the real engine (SmolLM2, float32): every number equals ``--engine hf``.

One eager engine, booted once by the command itself (``steerc.cli.main``, in this process): two programs,
three points. The first program's two points swap values in place; the second program (``tokens
generated``, a schedule, a prompt-pooled gate) installs another structure in the same engine. Its
completion tokens are steered only because the worker sees them as generated positions
(``extra_args["steerc_prompt_len"]``): without that, vLLM would score them unsteered, as prompt.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import hf_model, in_folder, model_folder, require_vllm

require_vllm()

DATA = "\n".join(json.dumps(row) for row in [
    {"prompt": "Describe a rainy Monday morning.", "positive": " I feel cheerful and bright.",
     "negative": " I feel miserable and tired."},
    {"prompt": "How was your weekend?", "positive": " Wonderful, full of laughter.", "negative": " Awful and grey."},
    {"prompt": "The news today", "positive": " made everyone smile.", "negative": " made everyone cry."},
    {"text": "The committee met on Tuesday to review the budget for the new library."},
    {"prompt": "Write about the sea.", "text": " The tide rolled in slowly over the grey stones."},
]) + "\n"
EVERYWHERE = ("steer 1\nparam strength = 4.0\nvector v = normalize(load(\"v.npy\"))\n"
              "intervention push {\n  at resid_post[6:10]\n  add strength * v\n}\n")
GENERATED = ("steer 1\nparam strength = 4.0\nvector v = normalize(load(\"v.npy\"))\n"
             "probe topic {\n  at resid_post[4]\n  read cosine(v)\n  pool prompt.mean\n}\n"
             "intervention push {\n  at resid_post[6:10]\n  add strength * decay(0.9) * v\n"
             "  tokens generated\n  when topic < 0.9\n}\n")
TOL = 1e-3  # the bar; the figures measured are printed


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_vllm")
    np.save(root / "v.npy", np.random.default_rng(3).normal(0, 1, 576).astype(np.float32))
    (root / "everywhere.steer").write_text(EVERYWHERE)
    (root / "generated.steer").write_text(GENERATED)
    (root / "items.jsonl").write_text(DATA)
    (root / "steer.toml").write_text("")
    return root


def _eval(project, folder: str, engine: str) -> dict:
    return in_folder(project, ["eval", "everywhere.steer", "generated.steer", "--model", folder, "--data",
                               "items.jsonl", "--sweep", "strength=0:6:2", "--engine", engine, "--format", "json",
                               "--resamples", "100"])


@pytest.fixture(scope="module")
def docs(project):
    folder = model_folder("smollm2")
    hf_model(folder)  # the float32 folder both engines read
    return _eval(project, folder, "hf"), _eval(project, folder, "vllm")


def test_every_item_and_metric_equals_the_hf_engine(docs):
    hf, vl = docs
    assert (hf["engine"], vl["engine"]) == ("hf", "vllm")
    assert [(p["program"], p["params"]) for p in vl["points"]] == [(p["program"], p["params"]) for p in hf["points"]]
    assert len(vl["points"]) == 4
    worst = 0.0
    for a, b in zip(hf["points"], vl["points"]):
        for x, y in zip(a["items"], b["items"]):
            assert (x["line"], x["kind"]) == (y["line"], y["kind"])
            for key in ("score", "unsteered", "kl", "nll", "unsteered_nll"):
                if key in x:
                    worst = max(worst, abs(x[key] - y[key]))
                    assert y[key] == pytest.approx(x[key], abs=TOL), (a["program"], a["params"], x["line"], key)
        for name, m in a["metrics"].items():
            assert b["metrics"][name]["mean"] == pytest.approx(m["mean"], abs=TOL, rel=TOL), name
    for name, m in hf["unsteered"].items():
        assert vl["unsteered"][name]["mean"] == pytest.approx(m["mean"], abs=TOL, rel=TOL), name
    print(f"\nsteerc eval --engine vllm against --engine hf: largest per-item difference {worst:.3g}")


def test_the_generated_scope_steers_the_completion_on_vllm_too(docs):
    """At strength 6 the second program moves the completions: the worker saw them as generated tokens."""
    _, vl = docs
    point = next(p for p in vl["points"] if p["program"] == "generated.steer" and p["params"]["strength"] == 6.0)
    assert point["metrics"]["kl"]["mean"] > 1e-3
    assert any(abs(i["score"] - i["unsteered"]) > 1e-2 for i in point["items"] if i["kind"] == "behavior")
    zero = next(p for p in vl["points"] if p["program"] == "generated.steer" and p["params"]["strength"] == 0.0)
    assert zero["metrics"]["kl"]["mean"] < 1e-6
