"""``steerc compile --target lm-eval`` (issue 37): a program as lm-eval's ``steered`` CSV steering config, without
lm-eval: the bytes (a golden CSV this test computes itself from the SAE fixture), export then import gives the
same plan, and everything the CSV cannot say refused with the reason (exit 1, nothing written).
tests/peers/test_lm_eval_steered.py runs the export under lm-eval's own SteeredModel."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
from support import run_cli

from steerc.api import Options, check_source
from steerc.targets.lm_eval.lower import coefficient, release_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAE = os.path.join(REPO, "tests", "fixtures", "saes", "smollm2-l8")
MODEL = os.path.join(REPO, "steerc", "facts", "configs", "smollm2-135m-instruct.json")  # SmolLM2: d 576, llama
HEADER = "loader,action,sparse_model,hookpoint,feature_index,steering_coefficient,head_index,sae_id,description\n"
SAE_LINE = 'sae s = sae("sae_lens/steerc-test/smollm2-l8")\n'
PROGRAM = ("steer 1\n" + SAE_LINE + "vector joy = s[7]\n"
           "intervention pin {\n  at resid_post[8]\n  clamp s[5] to 3.0\n}\n"
           "intervention low {\n  at mlp_out[3]\n  clamp joy to -1.0\n}\n"
           "intervention calm {\n  at attn_out[2, 4]\n  clamp s[2] to 0.25\n}\n"
           "intervention first {\n  at resid_pre[0]\n  clamp s[9] to 0.5\n}\n")


@pytest.fixture
def project(tmp_path):
    shutil.copytree(SAE, tmp_path / "sae_lens" / "steerc-test" / "smollm2-l8")
    return tmp_path


def _compile(project, text: str, name: str = "p.steer"):
    (project / name).write_text(text)
    out = project / "out"
    code, stdout, stderr = run_cli(["compile", str(project / name), "--model", MODEL, "--target", "lm-eval",
                                    "-o", str(out)])
    return code, out, stderr


def _c(index: int, target: float) -> float:
    """lm-eval's coefficient for steerc's clamp target: target - dot(b_dec, û) from the fixture, computed here (the
    float nearest it that adds back to the target)."""
    from steerc.io.sae import read_sae

    sae = read_sae(SAE)
    row = sae.decoder_row(index).astype(np.float64)
    offset = float(sae.tensor("b_dec").astype(np.float64) @ (row / np.linalg.norm(row)))
    return next((c for c in _floats_around(target - offset, 4) if c + offset == target), target - offset)


def _plan(project, text: str, name: str):
    from steerc.facts import load_facts

    result = check_source(text, name, path=str(project / name),
                          options=Options(base_dir=str(project), root=str(project)), facts=load_facts(MODEL))
    assert result.ok, result.render()
    return result.plan


def test_the_csv_is_lm_evals_clamp_rows_byte_for_byte(project):
    """issue 37: one sae_lens clamp row a hookpoint, coefficient target - dot(b_dec, û), in the plan's site order;
    the same program gives the same bytes twice."""
    code, out, err = _compile(project, PROGRAM)
    assert code == 0, err
    rows = [("embed_tokens", 9, 0.5, "first"), ("layers.2.self_attn", 2, 0.25, "calm"),
            ("layers.3.mlp", 7, -1.0, "low"), ("layers.4.self_attn", 2, 0.25, "calm"), ("layers.8", 5, 3.0, "pin")]
    golden = HEADER + "".join(f"sae_lens,clamp,steerc-test,{hook},{i},{_c(i, t)!r},,smollm2-l8,steerc intervention "
                              f"{n}\n" for hook, i, t, n in rows)
    data = (out / "steer.csv").read_bytes()
    assert data == golden.encode("utf-8")
    assert _compile(project, PROGRAM)[0] == 0 and (out / "steer.csv").read_bytes() == data


def test_export_then_import_gives_the_same_plan(project):
    """issue 37: the CSV imported with --sae-root (DIR/<release>/<sae_id>) folds to the same plan: the same
    directions, and targets equal to the last bit (the coefficient is the float that adds back to the target)."""
    from steerc.formats.lm_eval import convert

    code, out, err = _compile(project, PROGRAM)
    assert code == 0, err
    made = convert(str(out / "steer.csv"), "back", sae_root=str(project / "sae_lens"), out_dir=str(project))
    back, plan = _plan(project, made.text, "back.steer"), _plan(project, PROGRAM, "p.steer")
    assert len(plan.sites) == 5
    assert (back.facts_fingerprint, back.sites, back.probes, back.params) == \
        (plan.facts_fingerprint, plan.sites, plan.probes, plan.params)


def test_the_coefficient_adds_back_to_the_target_exactly_where_a_float_can():
    """issue 37: c + offset is t in float64 wherever one of the floats near t - offset reaches it (where none
    does, as for a t far below the offset, c is t - offset: within an ulp of the larger)."""
    rng = np.random.default_rng(37)
    exact = 0
    for t, offset in zip(rng.normal(size=400) * 10.0 ** rng.integers(-6, 6, 400), rng.normal(size=400)):
        t, offset = float(t), float(offset)
        c, near = coefficient(t, offset), t - offset
        reachable = any(x + offset == t for x in _floats_around(near, 4))
        assert (c + offset == t) == reachable
        assert abs(c + offset - t) <= math.ulp(max(abs(c), abs(offset)))
        exact += reachable
    assert exact > 150


def _floats_around(x: float, n: int) -> list[float]:
    out, up, down = [x], x, x
    for _ in range(n):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        out += [up, down]
    return out


def test_the_release_and_sae_id_are_the_folders_last_two_names():
    assert release_of("/a/sae_lens/steerc-test/smollm2-l8") == ("steerc-test", "smollm2-l8")
    assert release_of("/x/google--gemma-scope-2b/layer_20") == ("google/gemma-scope-2b", "layer_20")
    for bad in ("/x/a--b--c/id", "/x/with space/id", "/x/rel/sp ace"):
        with pytest.raises(ValueError):
            release_of(bad)


REFUSED = {
    "add": ("intervention a {\n  at resid_post[8]\n  add 4 * s[5]\n}\n", "asserts on a CSV add row"),
    "plain vector": ("vector v = [" + ", ".join(["1.0"] * 576) + "]\nintervention a {\n  at resid_post[8]\n"
                     "  clamp v to 1.0\n}\n", "its direction is no SAE feature"),
    "clamp feature": ("intervention a {\n  at resid_post[8]\n  clamp feature s[5] to 2.0\n}\n",
                      "lm-eval's clamp sets the projection of h - b_dec"),
    "gate": ("probe p {\n  at resid_post[8]\n  read dot(s[5])\n  pool prompt.mean\n}\nintervention a {\n"
             "  at resid_post[8]\n  clamp s[5] to 1.0\n  when p > 0\n}\n", "reads no probe"),
    "tokens": ("intervention a {\n  at resid_post[8]\n  clamp s[5] to 1.0\n  tokens generated\n}\n",
               "steers every position"),
    "schedule": ("intervention a {\n  at resid_post[8]\n  add ramp(4) * s[5]\n  tokens generated\n}\n",
                 "coefficient is fixed"),
    "per-request": ("param k = 1.0 per request\nintervention a {\n  at resid_post[8]\n  clamp s[5] to k\n}\n",
                    "fixed number"),
    "two at one hookpoint": ("intervention a {\n  at resid_post[8]\n  clamp s[5] to 1.0\n}\nintervention b {\n"
                             "  at resid_pre[9]\n  clamp s[4] to 1.0\n}\n", "one row per hookpoint"),
    "head": ("intervention a {\n  at head[3, 1]\n  ablate s[5]\n}\n", "steers a module's whole output"),
    "ablate": ("intervention a {\n  at resid_post[8]\n  ablate s[5]\n}\n", "add or clamp an SAE feature"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_lm_eval_cannot_say_is_refused_before_writing(project, case):
    """issue 37: unsupported-by-target with the reason, exit 1, no output folder."""
    body, words = REFUSED[case]
    code, out, err = _compile(project, "steer 1\n" + SAE_LINE + body)
    assert code == 1, err
    assert "unsupported-by-target" in err and words in err, err
    assert "Traceback" not in err and not out.exists()


def test_an_sae_folder_that_names_no_release_is_refused_at_its_string(project):
    """issue 37: the release and sae_id are the folder's last two names; one that is no sae_lens name (a space)
    is refused at the sae(...) string, nothing written."""
    shutil.copytree(SAE, project / "my saes" / "l8 final")
    code, out, err = _compile(project, 'steer 1\nsae s = sae("my saes/l8 final")\n'
                                       "intervention a {\n  at resid_post[8]\n  clamp s[5] to 1.0\n}\n")
    assert code == 1 and "unsupported-by-target" in err and "sae_lens release and id" in err, err
    assert 'sae("my saes/l8 final")' in err and not out.exists()


def test_a_family_whose_sites_are_other_modules_is_refused(project):
    """issue 37: lm-eval names modules of model.base_model; gpt2's resid_post is `transformer.h.L`, which steerc's
    import does not read back: refused with the module named."""
    from steerc.ir.plan import Site
    from steerc.targets.lm_eval.lower import Refused, hookpoint

    with pytest.raises(Refused, match="transformer.h.3"):
        hookpoint(Site("resid_post", 3), "gpt2", None)
    with pytest.raises(Refused, match="post_attention_layernorm"):
        hookpoint(Site("attn_out", 3), "gemma2", None)
    with pytest.raises(Refused, match="embed_tokens"):
        hookpoint(Site("resid_pre", 0), "gemma2", None)
    assert hookpoint(Site("mlp_out", 3), "llama", None) == "layers.3.mlp"


def test_the_readme_example_runs(project):
    """issue 37: compile, then lm-eval's steer_path is OUT/steer.csv; check --target lm-eval agrees."""
    (project / "p.steer").write_text(PROGRAM)
    code, _, err = run_cli(["check", str(project / "p.steer"), "--model", MODEL, "--target", "lm-eval"])
    assert code == 0, err
