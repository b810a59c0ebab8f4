"""Help that names the right thing: probes in gates, the vector and site of a shape mismatch, one error per fault."""

from __future__ import annotations

import pytest

from steerc.api import check_source


def errors(text: str, facts=None, code: str | None = None):
    result = check_source(text, "t.steer", facts=facts)
    return [d for d in result.diagnostics if d.is_error and (code is None or d.code == code)]


GATED = """steer 1
vector joy = [1.0, 0.0, 0.0, 0.0]
param limit = 0.5
intervention cheer {{
  at   resid_post[1]
  add  joy
  when {gate}
}}
"""


@pytest.mark.parametrize("gate", ["cheerful > 0.5", "0.5 < cheerful", "not cheerful > -0.2",
                                  "joy > 0.1 and cheerful < 0.3"])
def test_an_undefined_name_in_a_gate_asks_for_a_probe(gate):
    found = [d for d in errors(GATED.format(gate=gate), code="undefined-name") if "`cheerful`" in d.message]
    assert len(found) == 1
    assert "probe cheerful {" in found[0].help and "vector" not in found[0].help, found[0].help


def test_a_gate_name_against_a_param_may_also_be_a_threshold():
    (d,) = errors(GATED.format(gate="cheerful > threshold"), code="undefined-name")[:1]
    assert "probe cheerful {" in d.help and "param cheerful" in d.help


def test_outside_a_gate_the_hint_stays_vector_or_param():
    (d,) = errors("steer 1\nintervention x {\n  at  resid_post[1]\n  add 2.0 * joy\n}\n", code="undefined-name")
    assert "vector joy" in d.help and "probe" not in d.help


def test_gate_suggestions_are_probes_not_vectors():
    probe = "probe cheery {\n  at resid_post[0]\n  read cosine(joy)\n  pool prompt.mean\n}\n"
    text = GATED.format(gate="cheerfull > 0.5").replace("param limit = 0.5\n", probe)
    (d,) = errors(text, code="undefined-name")
    assert d.help == "did you mean `cheery`?"


SHAPES = """steer 1
vector a = [1.0, 0.0, 0.0]
vector b = [0.0, 1.0, 0.0]
intervention x {{
  at  {site}
  {op}
}}
"""


def test_a_shape_mismatch_names_the_vector_the_site_and_the_layers(tiny_facts):
    (d,) = errors(SHAPES.format(site="resid_post[1:3]", op="add 2.0 * a"), tiny_facts("tiny-llama"))
    assert d.code == "shape-mismatch"
    assert d.message == "`2.0 * a` has length 3, but `resid_post[1:3]` is 64 wide (the model's hidden size)"
    assert (d.span.line, d.span.column, d.span.end_column) == (6, 7, 14)  # the vector, not the whole line
    (note,) = d.notes
    assert note.message == "acts on layers 1 to 2" and note.span.line == 5


def test_a_shape_mismatch_at_a_head_names_head_dim(tiny_facts):
    (d,) = errors(SHAPES.format(site="head[1, 0]", op="add a"), tiny_facts("tiny-llama"))
    assert "`a` has length 3, but `head[1, 0]` is 16 wide (the model's head_dim)" == d.message


def test_ablate_of_two_wrong_directions_is_one_error_naming_both(tiny_facts):
    found = errors(SHAPES.format(site="resid_post[1]", op="ablate a, b"), tiny_facts("tiny-llama"))
    assert len(found) == 1, [d.message for d in found]
    assert found[0].message.startswith("`a` and `b` have length 3")


def test_a_probe_readout_of_the_wrong_width_names_its_vector(tiny_facts):
    text = ("steer 1\nvector a = [1.0, 0.0, 0.0]\nvector v = normalize([1.0, 0.0, 0.0])\n"
            "probe p {\n  at   resid_post[1]\n  read cosine(a)\n  pool prompt.mean\n}\n"
            "intervention x {\n  at   resid_post[2]\n  scale 2.0\n  when p > 0.5\n}\n")
    found = errors(text, tiny_facts("tiny-llama"), code="shape-mismatch")
    assert len(found) == 1 and found[0].message.startswith("`a` has length 3, but `resid_post[1]`")


# ---------------------------------------------------- the vllm-hook dialect

WIDE = "[" + ", ".join(["1.0"] + ["0.0"] * 575) + "]"


def _vllm_hook_compile(tmp_path, body: str):
    from support import run_cli

    (tmp_path / "p.steer").write_text(f"steer 1\nvector a = {WIDE}\nvector b = normalize(a + a)\n{body}")
    code, out, err = run_cli(["compile", str(tmp_path / "p.steer"), "--model", "smollm2", "--target", "serve",
                              "--dialect", "vllm-hook", "-o", str(tmp_path / "out")])
    assert code == 1 and "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error[")], err


def test_vllm_hook_reports_a_site_once_not_once_per_layer(tmp_path):
    errors_, err = _vllm_hook_compile(tmp_path, "intervention x {\n  at  attn_out[*]\n  add a\n}\n")
    assert len(errors_) == 1, err
    assert "`attn_out`" in errors_[0] and "attn_out[1]" not in err


def test_vllm_hook_help_for_preserve_norm_on_add_does_not_talk_about_rotation(tmp_path):
    errors_, err = _vllm_hook_compile(tmp_path, "intervention x {\n  at  resid_post[3]\n  add a\n  preserve norm\n}\n")
    assert len(errors_) == 1 and "`preserve norm`" in errors_[0], err
    assert "rotat" not in err


def test_the_vllm_hook_lowering_names_layer_runs_as_a_slice(tiny_facts):
    from steerc.targets.vllm_hook.lower import lower_vllm_hook

    facts = tiny_facts("tiny-llama")
    v = "[" + ", ".join(["1.0"] + ["0.0"] * (facts.hidden - 1)) + "]"
    result = check_source(f"steer 1\nvector a = {v}\nintervention x {{\n  at  attn_out[*]\n  add a\n}}\n"
                          "intervention y {\n  at  resid_post[1]\n  add a\n  preserve norm\n}\n", "t.steer",
                          facts=facts)
    _, _, diagnostics = lower_vllm_hook(result.plan, facts)
    messages = [d.message for d in diagnostics]
    assert any(f"at attn_out[0:{facts.layers}] (intervention `x`)" in m for m in messages), messages
    (preserve,) = [d for d in diagnostics if "`preserve norm`" in d.message]
    assert "rotat" not in preserve.help
