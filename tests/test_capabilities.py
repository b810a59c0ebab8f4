"""Target capabilities: the data, the matrix in spec/capabilities.md, and the check.

The matrix is one of the generated blocks of ``spec/``, kept fresh by
``tests/test_spec.py`` (``python tests/test_spec.py --write`` rewrites them).
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from support import REPO, examples_path, needs_constraints, run_cli, uses_constraint

from steerc.api import check_file
from steerc.targets import TARGETS, check_target
from steerc.targets.capabilities import ALL_KEYS, DISPLAY, FEATURE_GROUPS, GROUP_TITLES, capability_matrix
from steerc.targets.features import program_features

SPEC = os.path.join(REPO, "spec", "capabilities.md")
def _read() -> str:
    with open(SPEC, encoding="utf-8") as fh:
        return fh.read()


# ------------------------------------------------------------------ the matrix


def test_spec_names_every_target():
    text = _read()
    for t in TARGETS.values():
        assert f"* `{t.name}` — {t.summary}." in text


def test_matrix_has_a_row_per_feature_and_a_column_per_target():
    matrix = capability_matrix()
    for group, names in FEATURE_GROUPS.items():
        assert f"### {GROUP_TITLES[group]}" in matrix
        for name in names:
            (row,) = [line for line in matrix.splitlines() if line.startswith(f"| `{name}` |")
                      and line in _group_rows(matrix, group)]
            assert row.count(" | ") == len(TARGETS)
    assert "| feature | " + " | ".join(TARGETS) + " |" in matrix


def _group_rows(matrix: str, group: str) -> list[str]:
    section = matrix.split(f"### {GROUP_TITLES[group]}\n", 1)[1].split("###", 1)[0]
    return section.splitlines()


# ------------------------------------------------------------------ the data


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_feature_key_is_present_once(target):
    t = TARGETS[target]
    keys = [f.key for f in t.features]
    assert keys == list(ALL_KEYS)
    for key in ALL_KEYS:
        f = t.get(key)
        assert isinstance(f.supported, bool) and t.supports(key) is f.supported
        if not f.supported:
            assert f.note and f.instead, f"{target} {key}: an unsupported feature needs a reason and an instead"
    with pytest.raises(KeyError):
        t.get("op:teleport")


def test_feature_keys_are_group_colon_name():
    assert len(set(ALL_KEYS)) == len(ALL_KEYS)
    assert all(k.split(":", 1)[0] in FEATURE_GROUPS for k in ALL_KEYS)


def test_the_cli_targets_have_capabilities():
    assert {"hf", "vllm", "serve"} <= set(TARGETS)
    assert not TARGETS["vllm"].supports("scope:after") and not TARGETS["serve"].supports("scope:after")
    assert TARGETS["hf"].supports("scope:after")


# ------------------------------------------------------------------ the check


AFTER = """steer 1

vector v = [1.0, 0.0, 0.0, 0.0]

intervention late {
  at     resid_post[0]
  add    v
  tokens after "Answer:"
}
"""


@pytest.mark.parametrize("target", ["vllm", "serve"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_vllm_and_serve_refuse_after_at_the_scope_line(tmp_path, fmt, target):
    prog = tmp_path / "after.steer"
    prog.write_text(AFTER, encoding="utf-8")
    code, out, err = run_cli(["check", str(prog), "--target", target, "--format", fmt])
    assert code == 1, out + err
    note, instead = TARGETS[target].get("scope:after").note, TARGETS[target].get("scope:after").instead
    if fmt == "json":
        (d,) = json.loads(out)["diagnostics"]
        assert d["code"] == "unsupported-by-target" and d["severity"] == "error"
        assert d["line"] == 8 and d["column"] == 10  # `after "Answer:"` on the tokens line
        assert note in d["message"] and "`after`" in d["message"]
        assert d["help"] == instead
    else:
        assert "error[unsupported-by-target]" in out and f"{prog}:8:10" in out
        assert '8 |   tokens after "Answer:"' in out
        assert f"help: {instead}" in out


@pytest.mark.parametrize("target", ["hf"])
def test_after_is_fine_elsewhere(tmp_path, target):
    prog = tmp_path / "after.steer"
    prog.write_text(AFTER, encoding="utf-8")
    assert run_cli(["check", str(prog), "--target", target])[0] == 0


def test_no_target_no_capability_check(tmp_path):
    prog = tmp_path / "after.steer"
    prog.write_text(AFTER, encoding="utf-8")
    assert run_cli(["check", str(prog)])[0] == 0


# What each shared example uses, written out by hand (the oracle for program_features).
EXAMPLE_FEATURES = {
    "01_add.steer": {"op:add", "site:resid_post", "scope:generated"},
    "02_abliterate.steer": {"op:ablate", "site:resid_pre", "scope:all"},
    "03_cast_gate.steer": {"op:add", "site:resid_post", "scope:generated", "gate:prompt.mean",
                           "readout:projected_cosine", "site:resid_pre"},
    "04_bank.steer": {"op:add", "site:resid_post", "site:resid_pre", "scope:all", "scope:prompt-slice",
                      "scope:generated", "scope:union"},
    "05_ops_and_scopes.steer": {"op:scale", "op:clamp", "op:ablate", "op:set", "op:suppress", "site:resid_pre",
                                "site:resid_post", "site:mlp_out", "site:attn_out", "scope:positions",
                                "scope:prompt-slice", "scope:after", "scope:generated-slice", "scope:prompt"},
    "06_heads.steer": {"op:scale", "site:head", "scope:all"},
    "07_json.steer": {"op:add", "op:preserve-norm", "site:resid_post", "scope:generated", "constraint:json_schema"},
    "08_choice.steer": {"constraint:choice"},
    "09_grammar.steer": {"op:add", "site:resid_post", "scope:all", "constraint:grammar"},
    "10_regex_inline_schema.steer": {"op:add", "site:resid_pre", "scope:all", "constraint:regex"},
    "11_rotate.steer": {"op:rotate", "site:resid_post", "site:resid_pre", "scope:generated", "scope:all"},
    "12_per_token_gate.steer": {"op:add", "site:resid_post", "scope:generated", "gate:token", "gate:prompt.last",
                                "readout:dot", "readout:norm"},
}


def _check_example(name: str):
    path = os.path.join(examples_path(), name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} not found")
    with open(path, encoding="utf-8") as fh:
        if uses_constraint(fh.read()):
            needs_constraints()
    result = check_file(path, name=name)
    assert result.ok, result.render()
    return result


def test_every_example_is_listed():
    names = {os.path.basename(p) for p in glob.glob(os.path.join(examples_path(), "*.steer"))}
    assert names == set(EXAMPLE_FEATURES)


@pytest.mark.parametrize("name", sorted(EXAMPLE_FEATURES))
def test_program_features_of_each_example(name):
    result = _check_example(name)
    found = list(program_features(result.checked))
    assert {k for k, _ in found} == EXAMPLE_FEATURES[name]
    assert all(k in ALL_KEYS for k, _ in found)
    assert all(span is not None and span.file == name for _, span in found), "every feature needs a span to blame"


# What a target's own check (capabilities.STRUCTURE) adds for the layers written outright in an example.
STRUCTURAL = {
    ("05_ops_and_scopes.steer", "llamacpp"): {"the embeddings, resid_pre[0], in intervention `damp_early`"},
    ("11_rotate.steer", "llamacpp"): {"resid_pre[1] (= resid_post[0]), layer 0's output, in intervention "
                                      "`turn_a_bit`"},
    # issue 36: the weights target folds resid_pre[0] only (resid_pre[l] is the stream, which no matrix writes)
    **{(name, "weights"): {f"resid_pre[l] for l >= 1 (= resid_post[l-1]), in intervention `{iv}`"}
       for name, iv in (("10_regex_inline_schema.steer", "tilt_it"), ("11_rotate.steer", "turn_a_bit"))},
}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(EXAMPLE_FEATURES))
def test_check_target_reports_exactly_the_unsupported_features(name, target):
    result = _check_example(name)
    check_target(result, target)
    reported = [d for d in result.diagnostics if d.code == "unsupported-by-target"]
    unsupported = {k for k in EXAMPLE_FEATURES[name] if not TARGETS[target].supports(k)}
    named = {d.message.split("cannot express ", 1)[1].split(": ", 1)[0] for d in reported}
    assert named == ({DISPLAY.get(k, f"`{k.split(':', 1)[1]}`") for k in unsupported}
                     | STRUCTURAL.get((name, target), set()))
    for d in reported:
        assert d.is_error and d.span is not None and d.help
        assert f"the {target} target cannot express" in d.message


def test_the_vllm_check_of_05_points_at_its_after_line(monkeypatch):
    _check_example("05_ops_and_scopes.steer")
    monkeypatch.chdir(examples_path())
    code, out, _ = run_cli(["check", "05_ops_and_scopes.steer", "--target", "vllm", "--format", "json"])
    assert code == 1
    (d,) = json.loads(out)["diagnostics"]
    with open("05_ops_and_scopes.steer", encoding="utf-8") as fh:
        line = next(i for i, text in enumerate(fh, 1) if 'tokens after "Answer:"' in text)
    assert d["code"] == "unsupported-by-target" and d["line"] == line


