"""lm-eval's ``steered`` model's CSV steering config into steerc without lm-eval (issue 37): ``steerc import``
on CSVs this test writes itself, with the SAE fixture as ``--sae-root DIR/<release>/<sae_id>``: the program's
meaning (add c * s[i]; the clamp around b_dec), lm-eval's one row per hookpoint, every refusal a diagnostic with
a code and a caret (the .pt pickle unread), and a fuzz of the CSV that never gives a traceback.
tests/peers/test_lm_eval_steered.py runs lm-eval's own SteeredModel against it."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_cli

from steerc.formats import ForeignFileError, format_for
from steerc.formats.lm_eval import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
HEADER = "loader,action,sparse_model,hookpoint,feature_index,steering_coefficient,head_index,sae_id,description\n"


@pytest.fixture
def project(tmp_path):
    shutil.copytree(SAE, tmp_path / "sae_lens" / "steerc-test" / "smollm2-l8")
    return tmp_path


def _csv(folder, body: str, header: str = HEADER, name: str = "steer.csv") -> str:
    path = folder / name
    path.write_bytes((header + body).encode("utf-8"))
    return str(path)


def _convert(project, body, **kw):
    return convert(_csv(project, body, **kw), "steer", sae_root=str(project / "sae_lens"), out_dir=str(project))


def test_rows_become_adds_and_clamps_around_b_dec(project):
    from steerc.io.sae import read_sae

    made = _convert(project, "sae_lens,add,steerc-test,layers.8,3,10.0,,smollm2-l8,more joy\n"
                             "sae_lens,clamp,steerc-test,layers.4.mlp,5,2.5,,smollm2-l8,\n")
    sae = read_sae(str(project / "sae_lens" / "steerc-test" / "smollm2-l8"))
    row = sae.decoder_row(5).astype(np.float64)
    offset = float(sae.tensor("b_dec").astype(np.float64) @ (row / np.linalg.norm(row)))
    assert 'sae s0 = sae("sae_lens/steerc-test/smollm2-l8")' in made.text
    assert "at resid_post[8]\n  add 10.0 * s0[3]" in made.text
    assert f"at mlp_out[4]\n  clamp s0[5] to 2.5 + {offset!r}" in made.text
    assert "# more joy" in made.text and made.files == {}


def test_hookpoints_map_to_sites(project):
    for hook, site in [("layers.0", "resid_post[0]"), ("layers.3.self_attn", "attn_out[3]"),
                       ("layers.3.self_attn.o_proj", "attn_out[3]"), ("layers.2.mlp.down_proj", "mlp_out[2]"),
                       ("embed_tokens", "resid_pre[0]")]:
        made = _convert(project, f"sae_lens,add,steerc-test,{hook},1,2.0,,smollm2-l8,\n")
        assert f"at {site}\n" in made.text, hook


def test_one_row_per_hookpoint_as_lm_eval_keeps(project):
    made = _convert(project, "sae_lens,add,steerc-test,layers.8,3,10.0,,smollm2-l8,\n"
                             "sae_lens,add,steerc-test,layers.8,4,1.0,,smollm2-l8,\n")
    assert "s0[4]" in made.text and "s0[3]" not in made.text
    assert any("row 1 is dropped" in n for n in made.notes)


def test_the_import_command_writes_a_checked_program(project):
    path = _csv(project, "sae_lens,clamp,steerc-test,layers.8,5,2.5,,smollm2-l8,\n")
    out = str(project / "steer.steer")
    code, stdout, stderr = run_cli(["import", path, "-o", out, "--sae-root", str(project / "sae_lens")])
    assert code == 0, stderr
    assert stdout.strip() == out
    code, _, stderr = run_cli(["check", out])
    assert code == 0, stderr


@pytest.mark.parametrize("body, header, code, words", [
    ("sae_lens,add,steerc-test,layers.8,3,10.0,,smollm2-l8,\n", HEADER.replace("hookpoint", "hook"),
     "invalid-foreign-file", "no `hookpoint` column"),
    ("", HEADER, "invalid-foreign-file", "has a header and no rows"),
    ("sparsify,add,EleutherAI/sae,layers.3,30,10.0,,,\n", HEADER, "invalid-foreign-file", "sparsify"),
    ("torch,add,steerc-test,layers.8,3,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "neither sae_lens"),
    ("sae_lens,steer,steerc-test,layers.8,3,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "neither add"),
    ("sae_lens,add,steerc-test,,3,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "no hookpoint"),
    ("sae_lens,add,steerc-test,model.layers.8,3,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "model."),
    ("sae_lens,add,steerc-test,blocks.8.hook_resid_post,3,1,,smollm2-l8,\n", HEADER, "invalid-foreign-file",
     "no module"),
    ("sae_lens,add,steerc-test,layers.8,3.5,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "whole number"),
    ("sae_lens,add,steerc-test,layers.8,640,10.0,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "out of range"),
    ("sae_lens,add,steerc-test,layers.8,3,inf,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "finite"),
    ("sae_lens,add,steerc-test,layers.8,3,1e39,,smollm2-l8,\n", HEADER, "invalid-foreign-file", "float32"),
    ("sae_lens,add,other,layers.8,3,10.0,,smollm2-l8,\n", HEADER, "file-not-found", "holds no cfg.json"),
    ("sae_lens,add,steerc-test,layers.8,3,10.0,,../../etc,\n", HEADER, "invalid-foreign-file", "sae_id"),
    ("sae_lens,add,steerc-test,layers.8,3,10.0,,smollm2-l8,,extra\n", HEADER, "invalid-foreign-file", "fields"),
    ('sae_lens,add,"steerc-test,layers.8,3\n', HEADER, "invalid-foreign-file", "CSV"),
])
def test_malformed_rows_are_diagnostics_with_a_caret(project, body, header, code, words):
    path = _csv(project, body, header=header)
    out = str(project / "out.steer")
    rc, _, stderr = run_cli(["import", path, "-o", out, "--sae-root", str(project / "sae_lens")])
    assert rc == 1, stderr
    assert f"error[{code}]" in stderr and words in stderr, stderr
    assert "Traceback" not in stderr and "^" in stderr
    assert not os.path.exists(out)


def test_an_sae_without_sae_root_names_what_is_missing(project):
    path = _csv(project, "sae_lens,add,gemma-scope-2b-pt-res-canonical,layers.20,12082,240.0,,"
                         "layer_20/width_16k/canonical,increase dogs\n")
    rc, _, stderr = run_cli(["import", path, "-o", str(project / "o.steer")])
    assert rc == 1 and "error[file-not-found]" in stderr
    assert "gemma-scope-2b-pt-res-canonical/layer_20/width_16k/canonical" in stderr and "--sae-root" in stderr


@pytest.mark.parametrize("name, blob", [("steer.pt", b"\x80\x04\x95junk"), ("steer.pth", b"PK\x03\x04junk"),
                                        ("steer.csv", b"\x80\x04\x95cos\nsystem\n")])
def test_a_pickle_is_refused_unread(project, name, blob):
    path = project / name
    path.write_bytes(blob)
    assert format_for(str(path)).name == "lm-eval"
    with pytest.raises(ForeignFileError, match="pickle"):
        convert(str(path), "steer")
    rc, _, stderr = run_cli(["import", str(path), "-o", str(project / "o.steer")])
    assert rc == 1 and "pickle" in stderr and "Traceback" not in stderr


def test_sae_root_is_only_for_formats_that_name_saes(project, tmp_path):
    path = tmp_path / "x.brainpatch"
    path.write_bytes(b"PK")
    rc, _, stderr = run_cli(["import", str(path), "-o", str(tmp_path / "o.steer"), "--sae-root", "x"])
    assert rc == 2 and "--sae-root is for formats that name SAEs by id (lm-eval" in stderr and "brainpatch" in stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(["sae_lens", "add", "clamp", "steerc-test", "layers.8", "3", "-1", "2.5",
                                          "nan", "", "smollm2-l8", '"', "x,y", "\r", "layers.99999", "é"]),
                         max_size=11), max_size=4))
def test_fuzzed_csvs_are_programs_or_diagnostics(project, rows):
    body = "".join(",".join(r) + "\n" for r in rows)
    try:
        made = _convert(project, body)
    except ForeignFileError as exc:
        assert exc.code in ("invalid-foreign-file", "file-not-found") and exc.message
    else:
        assert made.text.startswith("steer 1\n")
