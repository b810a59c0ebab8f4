"""Issue 32 (hostile inputs): unbounded resources, lm-eval's model_args, `steerc run`, and progress in a log.

* ``eval --data`` parses in time linear in the file (each row's line number was counted from the file's
  start: quadratic, half an hour at the limits);
* ``run`` bounds each prompt and ``--max-new-tokens`` by the model's context and MAX_TEXT_TOKENS, and its
  sampling flags by their ranges, before the model loads, as diagnostics at the flag; it says which
  params it used and where each came from;
* ``capture`` and ``derive`` bound each text's tokens (characters do not bound them: an emoji is several)
  before any forward, with a diagnostic at its line in the data file;
* lm-eval's ``steerc`` model refuses a ``max_length`` of -5 (and every other numeric argument out of
  range, and keys it does not know) before anything loads;
* long commands report progress where standard error is not a terminal: a line every few seconds of an
  injected clock, and the final line.

The model is the tiny random Llama (context 256) with a small byte-level tokenizer, saved as a folder.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import threading

import pytest
from support import CpuSeconds, run_cli

from steerc.cli.progress import Progress
from steerc.core.source import Source

EMOJI = "\U0001F600"  # four UTF-8 bytes: several tokens of a byte-level tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny random Llama (max_position_embeddings 256) with its byte-level tokenizer, as a model folder."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-bounds"))


def _no_load(monkeypatch):
    """Make any model load fail the test: what is checked here must be refused before the weights load."""
    from steerc.runtime import models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", refuse)


def _caret_under(err: str, needle: str) -> str:
    """The caret line under the echoed source line holding ``needle`` (which must be there)."""
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if needle in line and "|" in line)
    return lines[at + 1]


# ------------------------------------------------------------- eval data: linear


def _items_text(n: int) -> str:
    line = json.dumps({"prompt": "Tell me about the weather. " + "x" * 400, "positive": " Sunny!",
                       "negative": " Rain."})
    return "\n".join([line] * n) + "\n"


def _parse_seconds(parse, text: str) -> float:
    best = float("inf")
    for _ in range(3):
        with CpuSeconds() as cpu:
            parse(Source("e.jsonl", text))
        best = min(best, cpu.seconds)
    return best


@pytest.mark.parametrize("which", ["eval", "derive"])
def test_data_files_parse_in_linear_time(which):
    """Issue 32: 40,000 valid eval items spent minutes before any load, each row's line number counted from
    the file's start. Four times the rows must cost about four times the CPU, not sixteen."""
    from steerc.derive.data import parse_pairs
    from steerc.eval.data import parse_items

    parse = parse_items if which == "eval" else parse_pairs
    text = _items_text(2000)  # {"prompt", "positive", "negative"}: an eval item and a derive pair alike
    small, large = _parse_seconds(parse, text), _parse_seconds(parse, text * 4)
    assert large < 8 * small, f"{small:.3f} s for 2,000 rows, {large:.3f} s for 8,000"


def test_item_lines_are_the_file_lines_with_blank_and_crlf_lines():
    """The line numbers (what EvalError diagnostics point at) are still each row's own line."""
    from steerc.eval.data import parse_items

    text = '\n{"text": "a"}\r\n\n\n{"prompt": "p", "positive": "x", "negative": "y"}\n  \n{"text": "b"}'
    items = parse_items(Source("e.jsonl", text)).items
    assert [(i.kind, i.line) for i in items] == [("cost", 2), ("behavior", 5), ("cost", 7)]
    assert items[1].spans["negative"].line == 5


# ---------------------------------------------------------------------- run


PROGRAM = """steer 1
param strength = 2.0
param layer_scale = 1.0
vector v = normalize({vec})
intervention lift {{
  at  resid_post[1]
  add strength * layer_scale * v
}}
"""


@pytest.fixture()
def run_project(tmp_path, monkeypatch):
    from hf_util import vec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.steer").write_text(PROGRAM.format(vec=vec(64, 3)))
    (tmp_path / "steer.toml").write_text("[params]\nstrength = 6\n")
    return tmp_path


def _run(folder, *extra):
    return run_cli(["run", "p.steer", "--model", folder, "--raw", *extra])


def test_run_refuses_a_huge_prompt_at_its_flag_before_loading(folder, run_project, monkeypatch):
    """Issue 32: a 120 KB prompt ran far past the model's context."""
    _no_load(monkeypatch)
    code, out, err = _run(folder, "--prompt", "hello", "--prompt", "y" * 120_000)
    assert code == 1 and out == "" and "Traceback" not in err
    assert "error[invalid-value]: this prompt has 120,000 characters" in err and "MAX_PROMPT_CHARS" in err
    assert "^" in _caret_under(err, "yyyy")


def test_run_bounds_prompt_tokens_by_the_models_context_before_loading(folder, run_project, monkeypatch):
    """Issue 32: 100 emoji are 100 characters and some 400 tokens, over the tiny model's 256: refused at that
    --prompt (the second), counted with the tokenizer before the weights load."""
    _no_load(monkeypatch)
    code, out, err = _run(folder, "--prompt", "hello", "--prompt", EMOJI * 100, "--max-new-tokens", "8")
    assert code == 1 and out == ""
    assert "this prompt is" in err and "over the model's context of 256 tokens" in err
    assert "--max-new-tokens 8" in err
    caret = _caret_under(err, EMOJI * 10)
    assert caret.count("^") >= 10  # under the second prompt, not the first
    # a prompt that fits alone, but not with the tokens to generate
    code, _, err = _run(folder, "--prompt", "hello " * 30, "--max-new-tokens", "250")
    assert code == 1 and "the sequence would be" in err and "over the model's context of 256" in err


@pytest.mark.parametrize("flags, says, under", [
    (["--max-new-tokens", "0"], "--max-new-tokens 0: give a count from 1 to 4,096", "0"),
    (["--max-new-tokens", "-3"], "--max-new-tokens -3: give a count from 1", "-3"),
    (["--max-new-tokens", "100000"], "(MAX_NEW_TOKENS, spec/limits.md)", "100000"),
    (["--max-new-tokens", "300"], "leaves no room for a prompt within the model's context of 256 tokens", "300"),
    (["--temperature", "-1"], "--temperature -1: give a temperature from 0 (greedy)", "-1"),
    (["--temperature", "nan"], "--temperature nan", "nan"),
    (["--temperature", "inf"], "--temperature inf", "inf"),
    (["--temperature", "0.7", "--top-p", "0"], "--top-p 0: give a probability above 0, at most 1", "0"),
    (["--temperature", "0.7", "--top-p", "1.5"], "--top-p 1.5", "1.5"),
    (["--temperature", "0.7", "--seed", "-1"], "--seed -1: give a seed from 0 to 4,294,967,295", "-1"),
    (["--top-p", "0.9"], "--top-p shapes sampling, and without --temperature run decodes greedily", "0.9"),
    (["--seed", "7"], "--seed shapes sampling", "7"),
])
def test_run_flags_out_of_range_are_diagnostics_at_the_flag(folder, run_project, monkeypatch, flags, says, under):
    """Issue 32: --max-new-tokens had no bound; the sampling flags are checked before anything loads."""
    _no_load(monkeypatch)
    code, out, err = _run(folder, "--prompt", "hi", *flags)
    assert code == 1 and out == "" and "Traceback" not in err
    assert "error[invalid-value]" in err and says in err, err
    line = next(x for x in err.splitlines() if x.startswith("1 | "))
    caret = _caret_under(err, "1 | ")
    assert line[caret.index("^"):].startswith(under), err


def test_run_says_which_params_it_used_and_samples_with_a_seed(folder, run_project):
    """Issue 32: after `tune`, strength 6 came from steer.toml silently. The params line names each value's
    source; --temperature samples, and one --seed repeats its text."""
    code, out, err = _run(folder, "--prompt", "hello world", "--max-new-tokens", "4")
    assert code == 0, err
    assert "params: strength=6 (steer.toml), layer_scale=1 (default)" in err.splitlines()
    sampled = ["--prompt", "hello world", "--max-new-tokens", "12", "--temperature", "1.5", "--seed", "3",
               "--set", "layer_scale=2", "--format", "json"]
    code, first, err = _run(folder, *sampled)
    assert code == 0, err
    assert "params: strength=6 (steer.toml), layer_scale=2 (--set)" in err
    doc = json.loads(first)
    assert doc["sampling"] == {"temperature": 1.5, "top_p": 1.0, "seed": 3}
    assert doc["params"] == {"strength": {"value": 6.0, "from": "steer.toml"},
                             "layer_scale": {"value": 2.0, "from": "--set"}}
    code, again, err = _run(folder, *sampled)
    assert code == 0 and json.loads(again)["prompts"] == doc["prompts"]
    others = {json.loads(_run(folder, *sampled[:-4], "--seed", str(s), "--format", "json")[1])["prompts"][0]["steered"]
              for s in range(4, 8)}
    assert len(others | {doc["prompts"][0]["steered"]}) > 1  # other seeds draw other texts
    code, out, err = _run(folder, "--prompt", "hello world", "--max-new-tokens", "4", "--format", "json")
    assert json.loads(out)["sampling"] is None  # greedy stays the default


# ------------------------------------------------------ capture and derive: tokens


def _long_line() -> str:
    return EMOJI * 200  # 200 characters, well inside MAX_EXAMPLE_CHARS; some 800 tokens


def test_capture_bounds_each_texts_tokens_at_its_line(folder, tmp_path, monkeypatch):
    """Issue 32: one line of 65,000 characters passed (characters are bounded, tokens were not)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lines.txt").write_text("The sun is out.\n\n" + _long_line() + "\nRain.\n")
    code, _out, err = run_cli(["capture", "resid_post[1]", "--model", folder, "--data", "lines.txt",
                              "-o", "acts.safetensors"])
    assert code == 1 and "Traceback" not in err
    assert "error[invalid-data]: this text is" in err and "over the model's context of 256" in err
    assert "lines.txt:3:1" in err and "^" in _caret_under(err, EMOJI * 10)
    assert not os.path.exists(tmp_path / "acts.safetensors")
    (tmp_path / "texts.jsonl").write_text('{"text": "fine"}\n' + json.dumps({"text": _long_line()}) + "\n")
    code, _, err = run_cli(["capture", "resid_post[1]", "--model", folder, "--data", "texts.jsonl",
                            "-o", "acts.safetensors"])
    assert code == 1 and "texts.jsonl:2:2" in err and "over the model's context of 256" in err


def test_derive_bounds_each_texts_tokens_at_its_key(folder, tmp_path, monkeypatch):
    """Issue 32: derive's texts too, pointing at the key (JSONL) or the line (two text files)."""
    monkeypatch.chdir(tmp_path)
    rows = [{"positive": "yes, good", "negative": "no, bad"}, {"positive": "fine", "negative": _long_line()}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run_cli(["derive", "--model", folder, "--data", "pairs.jsonl", "--at", "resid_post[1]",
                            "-o", "bank.safetensors", "--no-cache"])
    assert code == 1 and "Traceback" not in err
    assert "error[invalid-data]: this text is" in err and "pairs.jsonl:2:" in err
    assert _caret_under(err, '"negative"').count("^") == len('"negative"')
    (tmp_path / "pos.txt").write_text("good\nfine\n")
    (tmp_path / "neg.txt").write_text("bad\n" + _long_line() + "\n")
    code, _, err = run_cli(["derive", "--model", folder, "--positive", "pos.txt", "--negative", "neg.txt",
                            "--at", "resid_post[1]", "-o", "bank.safetensors", "--no-cache"])
    assert code == 1 and "neg.txt:2:1" in err
    assert not os.path.exists(tmp_path / "bank.safetensors")


def test_the_python_apis_bound_tokens_too(folder, monkeypatch):
    """derive() raises DeriveError at the pair's key; items_of bounds by MAX_TEXT_TOKENS without a context."""
    from steerc.core import limits
    from steerc.derive import DeriveError, derive
    from steerc.runtime import capture as C
    from steerc.runtime.models import load_model

    model, tokenizer = load_model(folder)
    with pytest.raises(DeriveError) as bad:
        derive(model, tokenizer, [("a", "b"), ("c", _long_line())], at="resid_post[1]")
    assert bad.value.diagnostics[0].code == "invalid-data" and "<pairs>:2:" in bad.value.render()
    monkeypatch.setattr(limits, "MAX_TEXT_TOKENS", 20)
    with pytest.raises(C.CaptureError) as bad:
        C.items_of(tokenizer, ["short", "a longer text that is more than twenty tokens " * 3], "last", False)
    assert "texts[1] is" in bad.value.diagnostics[0].message and "MAX_TEXT_TOKENS" in str(bad.value)


def test_context_comes_from_the_config():
    from steerc.core.limits import context_of, text_tokens_limit

    assert context_of({"model_type": "gpt2", "n_positions": 1024}) == 1024
    assert context_of({"text_config": {"max_position_embeddings": 4096}, "max_position_embeddings": 9}) == 4096
    assert context_of({"max_position_embeddings": True}) is None and context_of({"n_ctx": "big"}) is None
    assert text_tokens_limit(256) == 256 and text_tokens_limit(10**9) == text_tokens_limit(None)


# --------------------------------------------------------- lm-eval's model_args


@pytest.mark.parametrize("args, says", [
    ({"max_length": -5.0}, "max_length=-5 is not a whole number from 1 to 16,384"),
    ({"max_length": 0}, "max_length=0 is not a whole number"),
    ({"max_length": 10**9}, "max_length=1000000000 is not a whole number"),
    ({"max_length": 2.5}, "max_length=2.5 is not"),
    ({"max_length": True}, "max_length=True is not"),
    ({"max_length": "abc"}, "max_length=abc is not"),
    ({"batch_size": -1}, "batch_size=-1 is not a whole number"),
    ({"batch_size": "auto:0"}, "batch_size=auto:0 is not auto, auto:N or a whole number"),
    ({"max_batch_size": 0}, "max_batch_size=0"),
    ({"max_lenght": 8}, "unknown argument 'max_lenght'"),
    ({"set": "strength=inf"}, "the value must be finite"),
    ({"set": "strength"}, "is not NAME=NUMBER"),
])
def test_lm_eval_model_args_out_of_range_are_refused_naming_the_argument(args, says):
    """Issue 32: `max_length=-5` was accepted and kept all but the last five tokens of every context."""
    from steerc.eval.model_args import ModelArgsError, check_model_args

    with pytest.raises(ModelArgsError) as bad:
        check_model_args({"program": "joy.steer", **args})
    assert says in str(bad.value) and str(bad.value).startswith("steerc model_args: ")


def test_lm_eval_model_args_that_fit_are_normalized():
    from steerc.eval.model_args import ModelArgsError, check_model_args, max_gen_toks, max_length_for

    args = check_model_args({"program": "joy.steer", "max_length": 512.0, "batch_size": "4", "device": "cpu",
                             "max_batch_size": 64, "set": "strength=4;bias=-1"})
    assert (args["max_length"], args["batch_size"], args["set"]) == (512, 4, {"strength": 4.0, "bias": -1.0})
    assert check_model_args({"program": "p.steer", "batch_size": "auto"})["batch_size"] == "auto"
    assert max_length_for(None, 256) == 256 and max_length_for(128, 256) == 128
    with pytest.raises(ModelArgsError, match="over the model's context of 256"):
        max_length_for(1024, 256)
    assert max_gen_toks(32.0, 256) == 32
    for bad in (-1, 0, 256, 10**6, "x"):
        with pytest.raises(ModelArgsError, match="max_gen_toks="):
            max_gen_toks(bad, 256)


# ------------------------------------------------------------------ progress


class Clock:
    """A fake clock: ``now`` seconds, moved by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_in_a_log_is_a_line_every_few_seconds_then_the_final_line():
    """Issue 32: eval and tune printed nothing for minutes when standard error was not a terminal."""
    clock, out = Clock(), io.StringIO()
    p = Progress(100, stream=out, clock=clock, tty=False)
    for i in range(100):
        clock.now = i * 0.5  # one item every half second: 50 s in all
        p.step()
    clock.now = 50.0
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "scoring: 11/100 items (5 s)"
    assert lines[-1] == "scored 100 items in 50.0 s"
    assert len(lines) == 10  # a line at 5, 10, ... 45 s: at most one every 5 s, and the final line
    times = [float(line.rsplit("(", 1)[1].split()[0]) for line in lines[:-1]]
    assert all(b - a >= 5 for a, b in itertools.pairwise(times))


def test_progress_on_a_terminal_redraws_one_bar():
    clock, out = Clock(), io.StringIO()
    p = Progress(4, stream=out, clock=clock, tty=True)
    for _ in range(4):
        clock.now += 1
        p.step()
    p.finish()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("4/4 items (4 s)\x1b[K\n") and text.count("\n") == 1
    assert "[#######" in text and "1/4 items" in text


def test_quick_work_prints_nothing_and_a_long_call_still_reports():
    clock, out = Clock(), io.StringIO()
    quick = Progress(3, "steps", stream=out, clock=clock, tty=False, quiet_if_quick=True)
    for _ in range(3):
        quick.step()
    quick.finish()
    assert out.getvalue() == ""
    # one long call: the heartbeat thread reports while it runs (the fake clock jumps 6 s at each look)
    seen = threading.Event()

    def later() -> float:
        clock.now += 6
        if threading.current_thread().name == "steerc-progress":
            seen.set()
        return clock.now

    slow = Progress(3, "steps", doing="explain --tokens", done="explain --tokens:", stream=out, clock=later,
                    tty=False, quiet_if_quick=True)
    slow.stage("loading the tokenizer")
    with slow.ticking(interval=0.01):
        assert seen.wait(60)  # stands for the call: it returns once the heartbeat has looked at the clock
    slow.step(3)
    slow.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("explain --tokens: 0/3 steps, loading the tokenizer (")
    assert lines[-1].startswith("explain --tokens: 3 steps in ")


def test_explain_tokens_reports_in_a_log(folder, tmp_path, monkeypatch):
    """Issue 32: `explain --tokens` was silent for 30 s loading a GGUF's tokenizer; with a clock that moves
    6 s at each look, its log has progress lines and the final one."""
    from steerc.cli import progress

    class SlowTime:
        now = 0.0

        @classmethod
        def monotonic(cls):
            cls.now += 6
            return cls.now

    monkeypatch.setattr(progress, "time", SlowTime)
    monkeypatch.chdir(tmp_path)
    from hf_util import vec

    (tmp_path / "p.steer").write_text(f"steer 1\nintervention a {{\n  at resid_post[1]\n  add {vec(64, 1)}\n}}\n")
    code, _out, err = run_cli(["explain", "p.steer", "--model", folder, "--tokens", "hello", "--raw"])
    assert code == 0, err
    lines = [x for x in err.splitlines() if x.startswith("explain --tokens")]
    assert any("/3 steps" in x for x in lines) and lines[-1].startswith("explain --tokens: 3 steps in "), err


def test_eval_uses_the_progress_reporter():
    from steerc.cli import eval as eval_cli

    assert isinstance(eval_cli._progress(3), Progress)
