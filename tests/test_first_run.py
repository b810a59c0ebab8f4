"""The first ten minutes: the model name, `run`'s model diagnostics, the user cache, the command lines.

(The dequantized-GGUF cache on the real model is tested in test_smollm2.py.)
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support import REPO, run_cli

from steerc.core.cache import cache_root, cached_hash, file_sha256
from steerc.facts import load_facts
from steerc.facts.named import NAMED, NamedModel, named_config

PROGRAM = "steer 1\n\nintervention quiet {\n  at    head[1, 0]\n  scale 0.0\n}\n"


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "p.steer"
    path.write_text(PROGRAM)
    return str(path)


# ------------------------------------------------------------------ cache


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("STEERC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == str(tmp_path / "xdg" / "steerc-cache")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == str(tmp_path / "home" / ".cache" / "steerc-cache")
    monkeypatch.setenv("STEERC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == str(tmp_path / "mine")


def test_a_files_hash_is_computed_once_per_size_and_mtime(monkeypatch, tmp_path):
    monkeypatch.setenv("STEERC_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    assert cached_hash(str(f)) is None
    real = file_sha256(str(f))
    index_path = tmp_path / "cache" / "hashes.json"
    index = json.loads(index_path.read_text())
    index[os.path.realpath(f)]["sha256"] = "remembered"
    index_path.write_text(json.dumps(index))
    assert file_sha256(str(f)) == "remembered"  # not read again
    f.write_bytes(b"other weights")  # a new size and mtime: hashed again
    assert file_sha256(str(f)) not in ("remembered", real)


def test_an_unwritable_cache_does_not_stop_hashing(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("STEERC_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be created
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    assert len(file_sha256(str(f))) == 64


# -------------------------------------------------------------- model name


def test_the_name_smollm2_gives_the_shipped_config(examples_dir):
    shipped = load_facts(os.path.join(examples_dir, "models", "real", "smollm2-135m-instruct"))
    named = load_facts("smollm2")
    assert named == shipped and named.fingerprint == shipped.fingerprint


def test_an_existing_path_wins_over_a_name(examples_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(os.path.join(examples_dir, "models", "tiny-llama"), "smollm2")
    assert named_config("smollm2") == "smollm2"
    assert load_facts("smollm2").layers == load_facts(os.path.join(examples_dir, "models", "tiny-llama")).layers


def test_a_folder_without_a_model_does_not_hide_the_name(tmp_path, monkeypatch):
    # examples/smollm2 holds programs, not a model: `--model smollm2` from examples/ is still the bundled one
    monkeypatch.chdir(tmp_path)
    os.makedirs("smollm2")
    (tmp_path / "smollm2" / "x.steer").write_text("steer 1\nintervention x {\n  at resid_post[29]\n  scale 2\n}\n")
    assert named_config("smollm2").endswith("smollm2-135m-instruct.json")
    for argv in (["check", "smollm2/x.steer", "--model", "smollm2"], ["explain", "smollm2/x.steer", "--model", "smollm2"]):
        code, _, err = run_cli(argv)
        assert code == 0 and "no config.json" not in err and "note:" not in err, err
    code, out, err = run_cli(["facts", "smollm2"])
    assert code == 0 and json.loads(out)["facts"]["layers"] == 30
    from steerc.runtime.models import runnable_path

    if NAMED["smollm2"].weights_path() is not None:
        assert runnable_path("smollm2") == NAMED["smollm2"].weights_path()


def test_the_language_server_resolves_the_name_as_the_commands_do(tmp_path, monkeypatch):
    from steerc.lsp.project import FactsCache

    monkeypatch.chdir(tmp_path)
    os.makedirs("smollm2")
    facts, diagnostic, _ = FactsCache().get("smollm2")
    assert diagnostic is None and facts.layers == 30


def test_a_folder_that_is_a_model_and_a_name_says_it_was_taken(examples_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(os.path.join(examples_dir, "models", "tiny-llama"), "smollm2")
    (tmp_path / "p.steer").write_text("steer 1\nintervention x {\n  at resid_post[1]\n  scale 2\n}\n")
    code, _, err = run_cli(["check", "p.steer", "--model", "smollm2"])
    assert code == 0
    assert "note: `smollm2` is a folder here that holds a model" in err and "./smollm2 was taken" in err, err
    assert "SmolLM2-135M-Instruct" in err
    code, _, err = run_cli(["check", "p.steer", "--model", "./smollm2"])  # said outright: no note
    assert code == 0 and "note:" not in err


@pytest.mark.parametrize("command", [["check"], ["explain"], ["compile", "--target", "hf", "-o", "OUT"]])
def test_layout_commands_take_the_name(command, program, tmp_path):
    argv = [command[0], program, "--model", "smollm2", *[str(tmp_path / "out") if a == "OUT" else a
                                                          for a in command[1:]]]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert "Traceback" not in err


def test_facts_takes_the_name():
    code, out, _ = run_cli(["facts", "smollm2"])
    assert code == 0 and json.loads(out)["facts"]["layers"] == 30


def test_an_unknown_name_lists_the_names(program):
    code, _, err = run_cli(["check", program, "--model", "smollm3"])
    assert code == 2 and "`smollm2`" in err


# --------------------------------------------------- run: what has no weights


def _run(program, model, *extra):
    return run_cli(["run", program, "--model", model, "--prompt", "hi", *extra])


def _assert_model_diagnostic(err: str, model: str) -> list[str]:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith("error[model-without-weights]: "), err
    assert lines[1].startswith(" --> <command line>:1:")
    source, caret = lines[3], lines[4]
    start = caret.index("^")
    assert source[start:start + len(model)] == model and caret.count("^") == len(model), err
    return lines


def test_run_on_a_config_only_folder_says_so(examples_dir, program):
    folder = os.path.join(examples_dir, "models", "real", "smollm2-135m-instruct")
    code, out, err = _run(program, folder)
    assert code == 1 and out == ""
    lines = _assert_model_diagnostic(err, folder)
    assert "holds only a config.json" in lines[0]
    assert "`--model smollm2`" in err  # it is SmolLM2's config: the help names the bundled model


def test_run_on_another_config_only_folder_lists_what_would_work(examples_dir, program):
    folder = os.path.join(examples_dir, "models", "tiny-llama")
    code, _, err = _run(program, folder)
    assert code == 1
    _assert_model_diagnostic(err, folder)
    assert "a .gguf file" in err and "smollm2" in err


def test_run_on_a_config_file_or_facts_json_says_it_has_no_weights(examples_dir, program, tmp_path):
    config = os.path.join(examples_dir, "models", "tiny-llama", "config.json")
    code, _, err = _run(program, config)
    assert code == 1
    _assert_model_diagnostic(err, config)
    code, out, _ = run_cli(["facts", os.path.dirname(config)])
    (tmp_path / "facts.json").write_text(out)
    code, _, err = _run(program, str(tmp_path / "facts.json"))
    assert code == 1 and "a steerc facts JSON" in err


def test_run_on_a_folder_with_a_gguf_inside_points_at_the_file(tmp_path, program):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.gguf").write_bytes(b"")
    code, _, err = _run(program, str(tmp_path / "m"))
    assert code == 1 and f"--model {tmp_path / 'm' / 'x.gguf'}" in err


def test_run_on_weights_without_a_tokenizer_says_so(tmp_path, program):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    code, _, err = _run(program, str(tmp_path / "m"))
    assert code == 1 and "no tokenizer files" in err


def test_run_names_the_package_of_a_named_model_that_is_missing(monkeypatch, program):
    monkeypatch.setattr(NamedModel, "weights_path", lambda self: None)
    code, _, err = _run(program, "smollm2")
    assert code == 1
    _assert_model_diagnostic(err, "smollm2")
    assert NAMED["smollm2"].install in err


def test_run_checks_the_program_before_the_model(tmp_path, examples_dir):
    bad = tmp_path / "bad.steer"
    bad.write_text("steer 1\nintervention x {\n  at resid_post[1]\n  clamp v 3.0\n}\n")
    code, _, err = _run(str(bad), os.path.join(examples_dir, "models", "tiny-llama"))
    assert code == 1 and "error[syntax-error]" in err and "model-without-weights" not in err


def test_run_checks_the_layout_before_any_weights_load(tmp_path, monkeypatch):
    """The layout error comes from the named model's shipped config: nothing that finds, hashes, dequantizes or
    loads its weights or tokenizer runs (what the test once stood for with "under 3 s", issue 32)."""
    import steerc.runtime.models as models

    def no_load(*a, **k):
        raise AssertionError("the weights were touched before the program was checked")

    for name in ("load_model", "runnable_path", "gguf_cache_folder", "hf_folder", "_dequantize_into", "_load_gguf",
                 "_load_folder", "load_tokenizer"):
        monkeypatch.setattr(models, name, no_load)
    bad = tmp_path / "bad.steer"
    bad.write_text("steer 1\nintervention x {\n  at resid_post[40]\n  scale 2\n}\n")
    code, out, err = _run(str(bad), "smollm2")
    assert code == 1 and out == "" and "error[layer-out-of-range]" in err and "(0 to 29)" in err, err
    assert "loading" not in err and "Traceback" not in err, err


def test_run_on_a_missing_path_is_a_usage_error(program, tmp_path):
    code, _, err = _run(program, str(tmp_path / "nowhere"))
    assert code == 2 and "no such file or folder" in err


# ------------------------------------------------------------ command lines


def _subcommands():
    from steerc.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_option_has_help_text(name):
    cmd = _subcommands()[name]
    missing = [a.option_strings or a.dest for a in cmd._actions if not a.help]
    assert not missing, f"steerc {name}: no help for {missing}"


@pytest.mark.parametrize("name", ["explain", "compile", "run"])
def test_help_shows_model_as_required_here_or_in_steer_toml(name):
    """--model may come from steer.toml's [defaults] (spec/project.md), so argparse does not require it."""
    cmd = _subcommands()[name]
    (model,) = [a for a in cmd._actions if "--model" in a.option_strings]
    assert "required: here or as `model` in steer.toml" in model.help


def test_a_missing_model_is_a_usage_error(program):
    code, _, err = run_cli(["explain", program])
    assert code == 2 and "--model" in err


# ------------------------------------------------------------------ README


def _readme() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def _blocks(lang: str) -> list[str]:
    import re

    return re.findall(rf"^```{lang}\n(.*?)^```", _readme(), re.S | re.M)


def test_the_readme_first_program_is_in_canonical_layout_and_is_the_example():
    from steerc.core.source import Source
    from steerc.diagnostics import Diagnostics
    from steerc.frontend import parse
    from steerc.frontend.fmt import format_program

    text = _blocks("steer")[0]
    program = parse(Source("README.md", text), Diagnostics())
    assert format_program(program, Source("README.md", text)) == text
    with open(os.path.join(REPO, "examples", "smollm2", "joy.steer"), encoding="utf-8") as fh:
        example = fh.read()
    assert program == parse(Source("joy.steer", example), Diagnostics())


def test_the_readme_gate_example_is_the_examples_text_and_checks(examples_dir, tmp_path):
    """The README's cheer_up excerpt is examples/smollm2/cheer_up.steer's own text, and the example checks
    against SmolLM2's layout (a random unit vector stands in for the derived one)."""
    import numpy as np
    from safetensors.numpy import save_file

    from steerc.api import Options, check_file
    from steerc.facts import load_facts

    (shown,) = [b for b in _blocks("steer") if "probe mood" in b]
    with open(os.path.join(REPO, "examples", "smollm2", "cheer_up.steer"), encoding="utf-8") as fh:
        text = fh.read()
    assert shown in text
    (tmp_path / "vectors").mkdir()
    joy = np.random.default_rng(1).normal(size=576)
    save_file({"mean_diff.8": (joy / np.linalg.norm(joy)).astype(np.float32)},
              str(tmp_path / "vectors" / "joy.safetensors"))
    (tmp_path / "cheer_up.steer").write_text(text)
    facts = load_facts(os.path.join(examples_dir, "models", "real", "smollm2-135m-instruct"))
    result = check_file(str(tmp_path / "cheer_up.steer"), options=Options(root=str(tmp_path)), facts=facts)
    assert result.ok and not result.diagnostics, result.render()


def test_the_readme_per_request_example_checks(examples_dir, tmp_path):
    """The README's `per request` line is the example's, and the example compiles for serve (the joy
    vector replaced by a random one of its shape, as ./dev demo may not have run)."""
    import numpy as np
    from safetensors.numpy import save_file

    from steerc.api import Options, check_file
    from steerc.facts import load_facts

    (line,) = [b for b in _blocks("steer") if "per request" in b]
    source = os.path.join(REPO, "examples", "smollm2", "joy_per_request.steer")
    with open(source, encoding="utf-8") as fh:
        text = fh.read()
    assert line.strip() in text.splitlines()
    (tmp_path / "vectors").mkdir()
    save_file({"mean_diff.8": np.random.default_rng(0).normal(size=576).astype(np.float32)},
              str(tmp_path / "vectors" / "joy.safetensors"))
    (tmp_path / "joy_per_request.steer").write_text(text)
    facts = load_facts(os.path.join(examples_dir, "models", "real", "smollm2-135m-instruct"))
    result = check_file(str(tmp_path / "joy_per_request.steer"), options=Options(root=str(tmp_path)), facts=facts)
    assert result.ok and not result.diagnostics, result.render()
    assert [p.name for p in result.plan.params] == ["strength"]


def test_the_readme_schedule_example_explains_as_shown(examples_dir, tmp_path):
    """The README's explain excerpt for joy_fading.steer is what explain prints (joy is a unit vector;
    a random unit vector stands in where ./dev demo has not run)."""
    import numpy as np
    from safetensors.numpy import save_file

    from steerc.api import Options, check_file
    from steerc.explain.plan import explain, render
    from steerc.facts import load_facts

    (shown,) = [b for b in _blocks("text") if "decay(0.85)" in b]
    (tmp_path / "vectors").mkdir()
    joy = np.random.default_rng(0).normal(size=576)
    save_file({"mean_diff.8": (joy / np.linalg.norm(joy)).astype(np.float32)},
              str(tmp_path / "vectors" / "joy.safetensors"))
    with open(os.path.join(REPO, "examples", "smollm2", "joy_fading.steer"), encoding="utf-8") as fh:
        (tmp_path / "joy_fading.steer").write_text(fh.read())
    facts = load_facts(os.path.join(examples_dir, "models", "real", "smollm2-135m-instruct"))
    result = check_file(str(tmp_path / "joy_fading.steer"), options=Options(root=str(tmp_path)), facts=facts)
    assert result.ok and not result.diagnostics, result.render()
    printed = render(explain(result)).splitlines()
    for line in shown.strip("\n").splitlines():
        assert line in printed, line


def _readme_command_lines():
    import shlex

    for block in _blocks("sh"):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("./dev steerc "):
                argv = shlex.split(line)[2:]
                yield argv[:argv.index(">")] if ">" in argv else argv  # a shell redirection is not an argument


def test_readme_command_lines_use_the_wrapper():
    lines = list(_readme_command_lines())
    assert lines, "the README shows no `./dev steerc` lines"
    for block in _blocks("sh")[:2]:
        for line in block.splitlines():
            assert not line.startswith("steerc "), f"a bare `steerc` fails in a new shell: {line}"


@pytest.mark.parametrize("argv", list(_readme_command_lines()), ids=lambda a: " ".join(a[:2]))
def test_readme_command_lines_parse(argv):
    from steerc.cli import build_parser

    build_parser().parse_args(argv)  # argparse exits on a bad option


def test_readme_explain_runs_when_the_vector_exists(monkeypatch):
    if not os.path.exists(os.path.join(REPO, "examples", "smollm2", "vectors", "joy.safetensors")):
        pytest.skip("./dev demo has not derived examples/smollm2/vectors/joy.safetensors")
    monkeypatch.chdir(REPO)
    for argv in _readme_command_lines():
        if argv[0] in ("check", "explain"):
            code, out, err = run_cli(argv)
            assert code == 0, err


def test_dev_passes_steerc_through():
    with open(os.path.join(REPO, "dev"), encoding="utf-8") as fh:
        text = fh.read()
    assert "\n  steerc)\n" in text and 'exec "$VENV/bin/steerc" "$@"' in text


# ------------------------------------------- xgrammar verdicts, remembered


def test_an_xgrammar_verdict_is_remembered_per_text(monkeypatch, tmp_path):
    from steerc.constraints import _common

    monkeypatch.setenv("STEERC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_common, "_xgrammar_version", lambda: "0.0-test")
    monkeypatch.setattr(_common, "load_xgrammar", lambda: object())

    def rejects(_):
        raise RuntimeError("[08:02:02] /x.cc:9: Regex parsing error at position 2: Bad.")

    def must_not_run(_):
        raise AssertionError("compiled again")

    assert _common.xgrammar_error(rejects, key="regex:a(") == "Regex parsing error at position 2: Bad."
    assert _common.xgrammar_error(must_not_run, key="regex:a(") == "Regex parsing error at position 2: Bad."
    assert _common.xgrammar_error(lambda _: None, key="regex:ab") is None
    assert _common.xgrammar_error(must_not_run, key="regex:ab") is None
    monkeypatch.setattr(_common, "_xgrammar_version", lambda: "0.1-test")  # another version decides anew
    assert _common.xgrammar_error(lambda _: None, key="regex:a(") is None


def test_a_second_compile_with_a_constraint_does_not_import_xgrammar(examples_dir, tmp_path):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("xgrammar") is None:
        pytest.skip("xgrammar is not installed")
    env = {**os.environ, "STEERC_CACHE_DIR": str(tmp_path / "cache")}
    script = ("import sys; from steerc.cli import main; "
              f"rc = main(['compile', '07_json.steer', '--model', 'models/tiny-llama', '--target', 'hf', "
              f"'-o', {str(tmp_path / 'out')!r}]); print(rc, 'xgrammar' in sys.modules, 'torch' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", script], cwd=examples_dir, env=env, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    assert [r.stdout.split()[-3:] for r in runs] == [["0", "True", "True"], ["0", "False", "False"]], \
        [r.stderr for r in runs]


def test_an_unwritable_cache_falls_back_to_loading_the_file(monkeypatch, tmp_path, capsys):
    pytest.importorskip("transformers")
    from steerc.runtime import models

    monkeypatch.setenv("STEERC_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    def refuse(path, folder):
        raise PermissionError(13, "Permission denied", folder)

    monkeypatch.setattr(models, "_dequantize_into", refuse)
    monkeypatch.setattr(models, "_load_gguf", lambda path, dtype: ("model", "tokenizer"))
    assert models.load_model(str(gguf)) == ("model", "tokenizer")
    err = capsys.readouterr().err
    assert "could not keep the dequantized copy" in err and "Traceback" not in err


def test_a_cache_tokenizer_another_transformers_wrote_is_read_from_the_gguf(monkeypatch):
    """transformers 5.x saves a `TokenizersBackend` tokenizer that 4.x cannot read: the dequantized cache
    (shared by every environment) then gives the weights, and the GGUF itself the tokenizer."""
    pytest.importorskip("transformers")
    import transformers

    from steerc.runtime import models

    calls = []

    class Tok:
        pad_token_id, eos_token = 0, "</s>"

    def tokenizer(source, **kw):
        calls.append((source, kw))
        if "gguf_file" not in kw:
            raise ValueError("Tokenizer class TokenizersBackend does not exist or is not currently imported.")
        return Tok()

    class Model:
        def eval(self):
            return self

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Model())
    model, tok = models._load_folder("/cache/gguf/abc", "auto", gguf="/models/m.gguf")
    assert isinstance(tok, Tok) and calls[-1] == ("/models", {"gguf_file": "m.gguf"})
    with pytest.raises(ValueError, match="TokenizersBackend"):
        models._load_folder("/some/folder", "auto")  # a plain folder has no GGUF to fall back on
