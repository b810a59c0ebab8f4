"""A bad ``--model``: edited facts JSON, malformed configs. Each is an ``invalid-model`` diagnostic pointing at
the value at fault (exit 1), never a traceback; a file that cannot be read at all is a usage error (exit 2).

(The facts themselves are tested in test_facts.py.)
"""

from __future__ import annotations

import json
import os

import pytest
from support import run_cli

from steerc.facts import FactsError, load_facts


def test_an_edited_facts_json_is_refused(examples_dir, tmp_path):
    code, out, _ = run_cli(["facts", os.path.join(examples_dir, "models", "tiny-llama")])
    doc = json.loads(out)
    doc["facts"]["layers"] = 8
    (tmp_path / "f.json").write_text(json.dumps(doc))
    with pytest.raises(FactsError, match="fingerprint"):
        load_facts(str(tmp_path / "f.json"))
    code, _, err = run_cli(["check", os.path.join(examples_dir, "06_heads.steer"), "--model", str(tmp_path / "f.json")])
    assert code == 1 and "error[invalid-model]" in err and "fingerprint" in err


def test_facts_error_names_the_file_once(examples_dir, tmp_path):
    code, out, _ = run_cli(["facts", os.path.join(examples_dir, "models", "tiny-llama")])
    doc = json.loads(out)
    doc["facts"]["layers"] = 8
    path = str(tmp_path / "f.json")
    (tmp_path / "f.json").write_text(json.dumps(doc))
    code, _, err = run_cli(["check", os.path.join(examples_dir, "06_heads.steer"), "--model", path])
    assert err.count(f"--> {path}") == 1, err


def test_config_without_the_basic_facts(tmp_path, examples_dir):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, _, err = run_cli(["check", os.path.join(examples_dir, "06_heads.steer"), "--model", str(tmp_path)])
    assert code == 1 and "error[invalid-model]" in err and "does not give" in err


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 0},
        {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
         "intermediate_size": "x"},
        {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "head_dim": "x"},
        {"model_type": ["llama"]},
        {"format": "steerc.facts/1", "facts": {"family": "llama", "layers": "4", "hidden": 64, "heads": 4,
                                               "kv_heads": 2, "head_dim": 16, "intermediate": 128, "vocab": 512,
                                               "tied_embeddings": False, "parallel_residual": False}},
    ],
    ids=["zero-heads", "text-intermediate", "text-head-dim", "list-model-type", "text-layers-in-facts-json"],
)
def test_malformed_model_descriptions_are_diagnostics_at_the_value(config, tmp_path, examples_dir):
    (tmp_path / "config.json").write_text(json.dumps(config))
    program = os.path.join(examples_dir, "01_add.steer")
    code, _, err = run_cli(["check", program, "--model", str(tmp_path / "config.json")])
    assert code == 1 and "error[invalid-model]" in err and "^" in err and "Traceback" not in err


def test_an_unreadable_model_file_is_a_usage_error(tmp_path, examples_dir):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run_cli(["check", os.path.join(examples_dir, "01_add.steer"), "--model", str(tmp_path)])
    assert code == 2 and "Traceback" not in err
