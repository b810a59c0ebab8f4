"""A target is one folder plus one registry entry: the registry lists every target folder, and the command
line, its --help, steer.toml, the family table, the capability check and spec/capabilities.md's matrix all
agree with it."""

from __future__ import annotations

import os

import pytest
from support import REPO, run_cli

from steerc.project import project_at
from steerc.targets.capabilities import TARGETS, capability_matrix
from steerc.targets.registry import DIALECTS, REGISTRY, TARGET_NAMES, selected

FOLDERS = sorted(d for d in os.listdir(os.path.join(REPO, "steerc", "targets"))
                 if os.path.isfile(os.path.join(REPO, "steerc", "targets", d, "target.py")))


def test_every_target_folder_is_one_registry_entry():
    assert sorted(t.name.replace("-", "_") for t in REGISTRY.values()) == FOLDERS
    for name, t in REGISTRY.items():
        module = __import__(f"steerc.targets.{name.replace('-', '_')}.target", fromlist=["TARGET"])
        assert module.TARGET is t and t.capabilities.name == name
        assert selected(*t.selected_by) is t


def test_the_capability_table_and_matrix_are_the_registrys():
    assert list(TARGETS) == list(REGISTRY)
    assert "| feature | " + " | ".join(REGISTRY) + " |" in capability_matrix()


def test_the_command_line_offers_what_the_registry_has():
    code, out, _ = run_cli(["compile", "--help"])
    assert code == 0
    flat = " ".join(out.split())
    assert "{" + ",".join(TARGET_NAMES) + "}" in flat and "{" + ",".join(DIALECTS) + "}" in flat
    for t in REGISTRY.values():
        assert " ".join(t.help.split()) in flat, t.name
    code, out, _ = run_cli(["check", "--help"])
    assert "{" + ",".join(TARGET_NAMES) + "}" in " ".join(out.split())


@pytest.mark.parametrize("name", [*TARGET_NAMES, "sglang"])
def test_steer_toml_takes_exactly_the_registrys_targets(tmp_path, name):
    (tmp_path / "steer.toml").write_text(f'[defaults]\ntarget = "{name}"\n')
    project = project_at(str(tmp_path))
    if name in TARGET_NAMES:
        assert not project.diagnostics and project.target == name
    else:
        assert [d.code for d in project.diagnostics] == ["invalid-config"]
        assert all(n in project.diagnostics[0].message for n in TARGET_NAMES)


def test_a_signing_target_takes_a_key_and_the_others_refuse_it(tmp_path):
    (tmp_path / "k").write_bytes(b"k" * 32)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512}')
    (tmp_path / "p.steer").write_text("steer 1\nintervention a {\n  at resid_post[1]\n  scale 1.5\n}\n")
    for t in REGISTRY.values():
        target, dialect = t.selected_by
        code, _, err = run_cli(["compile", str(tmp_path / "p.steer"), "--model", str(tmp_path / "model"), "--target", target,
                                "--dialect", dialect, "--hmac-key-file", str(tmp_path / "k"), "-o",
                                str(tmp_path / t.name)])
        if t.signs:
            assert code == 0 and os.listdir(tmp_path / t.name), (t.name, err)
        else:
            assert code == 2 and "--hmac-key-file applies to" in err, (t.name, err)
