"""The hostile-input corpus (``tests/corpus/hostile``): diagnostics only, cheaply, from every entry point.

Each program goes through the API and every command line; each model
description through ``facts`` and ``check --model``. Nothing may print a
traceback, exit other than 0, 1 or 2, or cost much more than an ordinary
input through the same path, measured beside it (``scaling.assert_cheap``):
the bombs (zero-width banks, huge configs, oversized programs) cost about
what a small clean program does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import struct

import numpy as np
import pytest
from scaling import assert_cheap, unit_cost
from support import TESTS, run_cli

from steerc.api import check_source

CORPUS = os.path.join(TESTS, "corpus", "hostile")
MODEL = "models/tiny-llama"
ORDINARY = "nesting_64_is_fine.steer"  # a clean corpus program: what a command costs on an ordinary input
# How many times an ordinary input's cost a hostile one may take (the most measured, 2026-12-05, in brackets): a
# command on a hostile program (29x), on a large one, parsed to its limit (680x: 70,000 list items), a bomb
# through the API (95x: the values budget, spent), a bad model description (4x).
COMMAND_TIMES, LARGE_TIMES, BOMB_TIMES, MODEL_TIMES = 300, 3000, 300, 40


def _expectations(text: str) -> tuple[str, str | None]:
    expect = re.search(r"^# expect: (\S+)$", text, re.MULTILINE)
    model = re.search(r"^# model: (\S+)$", text, re.MULTILINE)
    assert expect, "a corpus program starts with `# expect: CODE` (or `clean`)"
    return expect.group(1), model.group(1) if model else None


# ------------------------------------------------------------- generated


def _wide_vector(width: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [width], "data_offsets": [0, 4 * width]}}).encode()
    return struct.pack("<Q", len(header)) + header + np.full(width, 0.5, dtype="<f4").tobytes()


def _fill(line: str, size: int) -> str:
    out, n = ["steer 1\n"], 0
    total = 8
    while total < size:
        text = line.format(i=n)
        out.append(text)
        total += len(text)
        n += 1
    return "".join(out)


GENERATED = {
    # name: (expect, model, text)
    "gen_source_3mib.steer": ("limit-exceeded", None, lambda: _fill("vector v{i} = [0.5, 0.25, 0.125, 1.0]\n", 3 << 20)),
    "gen_line_3mb.steer": ("limit-exceeded", None,
                           lambda: "steer 1\nvector v = [" + ", ".join(["0.5"] * 750_000) + "]\n"),
    "gen_list_70000.steer": ("limit-exceeded", None, lambda: "steer 1\nvector v = [" + ", ".join(["1"] * 70_000) + "]\n"),
    "gen_scopes_70000.steer": ("limit-exceeded", None, lambda: "steer 1\nintervention i {\n  at resid_pre[1]\n  scale 2\n"
                               "  tokens " + ", ".join(["all"] * 70_000) + "\n}\n"),
    "gen_string_70000.steer": ("limit-exceeded", None, lambda: 'steer 1\nintervention i {\n  at resid_pre[1]\n  scale 2\n'
                               '  tokens after "' + "x" * 70_000 + '"\n}\n'),
    "gen_path_400k.steer": ("limit-exceeded", None, lambda: 'steer 1\nvector v = load("' + "a/" * 200_000 + 'x.npy")\n'),
    "gen_path_60k.steer": ("limit-exceeded", None, lambda: 'steer 1\nvector v = load("' + "a/" * 30_000 + 'x.npy")\n'),
    "gen_unused_300.steer": ("unused-name", None, lambda: _fill("vector v{i} = [0.5, 0.25]\n", 7000)),
    "gen_undefined_3000.steer": ("undefined-name", None, lambda: _fill("param p{i} = 1\nparam q{i} = r{i}\n", 100_000)),
    "gen_long_line_warning.steer": ("unused-name", None,
                                    lambda: "steer 1\nvector v = [" + ", ".join(["0.5"] * 2_000) + "]\n"),
    "gen_values_budget.steer": ("limit-exceeded", None,
                                lambda: 'steer 1\nvector w = load("vectors/gen_wide.safetensors")\n'
                                + "".join(f"vector v{i} = 2 * w\n" for i in range(600))),
    "gen_wide_vector.steer": ("shape-mismatch", None, lambda: 'steer 1\nvector v = load("vectors/gen_too_wide.safetensors")\n'),
    "gen_heads_everywhere.steer": ("limit-exceeded", "gen-1024-layers",
                                   lambda: "steer 1\nintervention k {\n  at    head[*, *]\n  scale 0.5\n}\n"),
    "gen_plan_values.steer": ("limit-exceeded", "gen-1024-layers",
                              lambda: 'steer 1\nvector w = load("vectors/gen_wide.safetensors")\n\n'
                              "intervention k {\n  at  resid_post[*]\n  add w\n}\n"),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory, examples_dir):
    """The corpus in a scratch folder, with the shared tiny vectors and models and the generated inputs."""
    root = tmp_path_factory.mktemp("hostile") / "corpus"
    shutil.copytree(CORPUS, root)
    (root / "steer.toml").write_text("")
    shutil.copy(os.path.join(examples_dir, "vectors", "tiny.safetensors"), root / "vectors" / "tiny.safetensors")
    for name in ("tiny-llama", "tiny-gpt2"):
        shutil.copytree(os.path.join(examples_dir, "models", name), root / "models" / name)
    (root / "vectors" / "gen_wide.safetensors").write_bytes(_wide_vector(65_536))
    (root / "vectors" / "gen_too_wide.safetensors").write_bytes(_wide_vector(70_000))
    big = root / "models" / "gen-1024-layers"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 1024, "hidden_size": 65_536, "num_attention_heads": 1024,
        "num_key_value_heads": 8, "intermediate_size": 131_072, "vocab_size": 1000}))
    for name, (_, _, make) in GENERATED.items():
        (root / name).write_text(make(), encoding="utf-8")
    check_source("steer 1\nvector v = [1.0]\n")  # imports, so that timings below measure work
    return root


def _programs() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(CORPUS, "*.steer"))) + sorted(GENERATED)


def _expected(work, name: str) -> tuple[str, str | None]:
    if name in GENERATED:
        return GENERATED[name][:2]
    return _expectations((work / name).read_text(encoding="utf-8"))


def _model_path(model: str | None) -> str:
    return f"models/{model}" if model else MODEL


COMMANDS = [
    ["check"],
    ["check", "--format", "json"],
    ["check", "--model", "{model}"],
    ["fmt", "--check"],
    ["parse", "--emit", "ast"],
    ["parse", "--emit", "ir"],
    ["explain", "--model", "{model}"],
    ["compile", "--model", "{model}", "--target", "hf", "-o", "{out}/hf"],
    ["compile", "--model", "{model}", "--target", "vllm", "-o", "{out}/vllm"],
    ["compile", "--model", "{model}", "--target", "serve", "-o", "{out}/serve", "--no-xgrammar"],
]


# Large generated programs are parsed (or refused) the same way by every command: a few suffice.
LARGE = {"gen_source_3mib.steer", "gen_line_3mb.steer", "gen_list_70000.steer", "gen_scopes_70000.steer",
         "gen_undefined_3000.steer", "gen_string_70000.steer", "gen_path_400k.steer", "gen_values_budget.steer"}
LARGE_COMMANDS = [COMMANDS[0], COMMANDS[4]]

# The bombs: inputs whose cost used to grow with what they claim, or with their size past the limits.
# (Lists of 70,000 items and thousands of undefined names are bounded, but cost their limit's worth of parsing.)
BOMBS = [n for n in sorted(GENERATED) if n not in {"gen_list_70000.steer", "gen_scopes_70000.steer",
                                                   "gen_undefined_3000.steer"}]


_ORDINARY_COST: dict[tuple, float] = {}


def _run(argv: list[str], ordinary: list[str], times: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one in-process CLI run, which costs at most ``times`` the ``ordinary`` run
    of the same command (measured once per command, here, beside it)."""
    if tuple(ordinary) not in _ORDINARY_COST:
        _ORDINARY_COST[tuple(ordinary)] = unit_cost(lambda: run_cli(ordinary))
    return assert_cheap(lambda: run_cli(argv), _ORDINARY_COST[tuple(ordinary)], times, " ".join(argv)[:200])


@pytest.mark.parametrize("name", _programs())
def test_a_hostile_program_gets_diagnostics_only(name, work, monkeypatch, tmp_path):
    expect, model = _expected(work, name)
    monkeypatch.chdir(work)
    for command in LARGE_COMMANDS if name in LARGE else COMMANDS:
        argv = [command[0], name] + [a.format(model=_model_path(model), out=tmp_path) for a in command[1:]]
        ordinary = [command[0], ORDINARY] + [a.format(model=MODEL, out=work / "ordinary") for a in command[1:]]
        code, out, err = _run(argv, ordinary, LARGE_TIMES if name in LARGE else COMMAND_TIMES)
        assert "Traceback" not in out + err, (argv, err)
        assert code in (0, 1, 2), (argv, code, err)
        assert "would change what it means" not in err, err  # fmt: layout only, never meaning
        if command[0] in ("check", "explain", "compile") and code == 1 and "--format" not in command:
            assert "error[" in out + err, (argv, out, err)
        if command == ["check", "--format", "json"]:
            doc = json.loads(out)
            json.dumps(doc, ensure_ascii=False).encode("utf-8")  # printable: no lone surrogates
            codes = {d["code"] for d in doc["diagnostics"]}
            if model is None:
                assert (expect in codes) if expect != "clean" else not doc["errors"], (name, codes)
        elif command == ["check"] and model is None or command[:2] == ["check", "--model"] and model:
            if expect == "clean":
                assert code == 0, out
            else:
                assert f"[{expect}]" in out, out
            assert max(map(len, (out + err).splitlines()), default=0) < 700, "echoed lines are trimmed"


@pytest.mark.parametrize("name", [n for n in _programs() if n.startswith(("bank_", "st_", "npy_"))] + BOMBS)
def test_bombs_cost_about_what_a_clean_program_does(name, work):
    expect, model = _expected(work, name)
    facts = None
    if model:
        from steerc.facts import load_facts

        facts = load_facts(str(work / "models" / model))
    path = work / name
    from steerc.core.source import read_program

    def checked(path=path, name=name, facts=facts):
        result = check_source(read_program(str(path)), name, path=str(path), facts=facts)
        result.render()
        return result

    if "check" not in _ORDINARY_COST:
        _ORDINARY_COST["check"] = unit_cost(lambda: checked(work / ORDINARY, ORDINARY, None))
    result = assert_cheap(checked, _ORDINARY_COST["check"], BOMB_TIMES, name)  # CPU time: not how busy the machine is
    assert expect in {d.code for d in result.diagnostics} or expect == "clean"


def test_repeated_diagnostics_are_capped_and_counted(work, monkeypatch):
    monkeypatch.chdir(work)
    _, out, _ = run_cli(["check", "gen_unused_300.steer"])
    n = out.count("warning[unused-name]")
    total = int(re.search(r"(\d+) warnings", out).group(1))
    assert n == 50 and total > 250
    assert f"{total - 50:,} more `unused-name` warnings like this one are not shown" in out
    _, out, _ = run_cli(["check", "gen_unused_300.steer", "--format", "json"])
    doc = json.loads(out)
    assert len(doc["diagnostics"]) == 50 and doc["warnings"] == total
    assert doc["diagnostics"][-1]["omitted"] == total - 50


def test_long_lines_are_echoed_as_a_window(work, monkeypatch):
    monkeypatch.chdir(work)
    _, out, _ = run_cli(["check", "gen_long_line_warning.steer"])
    echoed = [line for line in out.splitlines() if line.startswith("2 | ")]
    assert echoed and len(echoed[0]) < 140 and echoed[0].endswith("...")


def test_fused_kernels_stay_finite(work, monkeypatch, tmp_path):
    """Two `scale 1e30` must not fuse into an infinite float32 scale (nor any target hold inf)."""
    from safetensors.numpy import load_file

    monkeypatch.chdir(work)
    for target in ("hf", "serve"):
        code, _, err = run_cli(["compile", "fused_scales_overflow.steer", "--model", MODEL, "--target", target,
                                "-o", str(tmp_path / target), "--no-xgrammar"] if target == "serve" else
                               ["compile", "fused_scales_overflow.steer", "--model", MODEL, "--target", target,
                                "-o", str(tmp_path / target)])
        assert code == 0, err
    for path in glob.glob(str(tmp_path / "**" / "*.safetensors"), recursive=True):
        for value in load_file(path).values():
            assert np.isfinite(value).all(), path
    _, out, _ = run_cli(["explain", "fused_scales_overflow.steer", "--model", MODEL])
    assert "inf" not in out and out.count("affine: 1e+30 * h") == 2


# ---------------------------------------------------------------- models


def _model_files() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(CORPUS, "models", "*.json")))


@pytest.mark.parametrize("name", _model_files())
def test_a_bad_model_description_is_refused_quickly(name, work, monkeypatch):
    monkeypatch.chdir(work)
    path = f"models/{name}"
    for argv in (["facts", path], ["check", "nesting_64_is_fine.steer", "--model", path],
                 ["compile", "nesting_64_is_fine.steer", "--model", path, "--target", "vllm", "-o", "out"]):
        code, out, err = _run(argv, [a.replace(path, MODEL) for a in argv], MODEL_TIMES)
        assert "Traceback" not in out + err
        # A model that reads but describes no usable model: a diagnostic at the value; unreadable: usage error.
        assert (code == 1 and "error[invalid-model]" in err and "^" in err) or (code == 2 and "error:" in err), \
            (argv, code, out, err)


# ------------------------------------------------------------------- API


def test_a_lone_surrogate_in_the_text_is_a_diagnostic():
    result = check_source("steer 1\nparam p = 1 # \ud800\n", "x\udcff.steer")
    assert [d.code for d in result.diagnostics] == ["syntax-error"]
    result.render().encode("utf-8")
    json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")


def test_every_json_reader_refuses_deep_json(tmp_path):
    from steerc.core import jsonio
    from steerc.ir.serialize import loads
    from steerc.serve_client import read_compiled

    deep = "[" * 100_000 + "]" * 100_000
    for read in (jsonio.loads, loads):
        with pytest.raises(jsonio.JSONError, match="nest more than"):
            read(deep)
    (tmp_path / "plan.json").write_text('{"format": "steerc.serve/1", "sites": ' + deep + "}")
    with pytest.raises(jsonio.JSONError, match="nest more than"):
        read_compiled(str(tmp_path))


def test_huge_configs_through_the_api_are_refused_quickly():
    from steerc.facts import FactsError, facts_from_config

    base = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4}
    ordinary = unit_cost(lambda: facts_from_config(base))

    for bad in ({"num_hidden_layers": 10**6}, {"num_hidden_layers": 10**30}, {"num_attention_heads": 10**6},
                {"head_dim": 0}, {"tie_word_embeddings": "false"}, {"num_hidden_layers": True}):
        def refused(bad=bad):
            try:
                facts_from_config({**base, **bad})
            except FactsError as exc:
                return exc
            return None

        assert isinstance(assert_cheap(refused, ordinary, MODEL_TIMES, str(bad)), FactsError), bad
