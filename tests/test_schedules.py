"""Strength schedules: `add strength * decay(0.9) * ramp(4) * v`, a factor of the generation step.

Step ``n = p - (P - 1)``: 0 at the prompt's last position, which predicts the first generated token.
Checked statically (types, values, scopes), and exactly at run time: the HF target's steered hidden
states during ``generate`` equal the unsteered ones plus ``factor(n) * v`` at every real position it
selects (float64, with and without the KV cache, left padding), the emitted package gives the same
logits bit for bit, plans fuse only what stays equal, and the vllm and serve formats carry and check
schedules. The real engine runs them in tests/engine.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from steerc.api import check_source

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_util import load_emitted, plan_for, vec  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from steerc.ir.interpret import schedule_factor  # noqa: E402
from steerc.runtime.hf import facts_from_model, install  # noqa: E402

V = vec(64, 5)
IDS = torch.tensor([[0, 0, 5, 2, 7, 8, 9], [11, 12, 13, 2, 15, 16, 17]])  # row 0 left-padded
MASK = (torch.arange(7)[None, :] >= torch.tensor([[2], [0]])).long()
NEW = 5


def _codes(text: str) -> list[str]:
    return [d.code for d in check_source(text, "s.steer").diagnostics]


def _iv(op: str, scope: str | None = "generated", extra: str = "") -> str:
    tokens = f"\n  tokens {scope}" if scope else ""
    return f"steer 1\n{extra}vector v = [1.0, 2.0]\nintervention x {{\n  at resid_post[0]\n  {op}{tokens}\n}}\n"


# ----------------------------------------------------------------------- static


@pytest.mark.parametrize("op, code", [
    ("add decay(0.9) * v + v", "type-error"),            # schedules combine by products only
    ("add v / decay(0.9)", "type-error"),
    ("scale decay(0.9)", "type-error"),                   # only the vector of an `add`
    ("add decay(0.9)", "type-error"),                     # a schedule alone is no vector
    ("add decay(0.9, 2) * v", "type-error"),
    ("add decay(0) * v", "invalid-value"),                # non-positive rate
    ("add decay(-0.5) * v", "invalid-value"),
    ("add decay(1.5) * v", "invalid-value"),              # grows without bound
    ("add ramp(0) * v", "invalid-value"),
    ("add ramp(2.5) * v", "invalid-value"),
    ("add window(3, 3) * v", "invalid-value"),
    ("add window(-1, 3) * v", "invalid-value"),
])
def test_misuse_is_a_diagnostic(op, code):
    assert code in _codes(_iv(op))


@pytest.mark.parametrize("scope", [None, "all", "prompt", "prompt[-2:]", "[0, 4]", "generated[-2:]",
                                   "prompt[-1:], [3]"])
def test_a_schedule_outside_generation_is_refused(scope):
    assert "schedule-outside-generation" in _codes(_iv("add decay(0.9) * v", scope))


@pytest.mark.parametrize("scope", ["generated", "generated[2:9]", "prompt[-1:]", "prompt[-1]",
                                   "prompt[-1:], generated[:4]"])
def test_schedules_from_the_last_prompt_position_on_are_fine(scope):
    assert _codes(_iv("add 2 * decay(0.9) * ramp(4) * window(0, 9) * v", scope)) == []


def test_a_vector_declaration_cannot_hold_a_schedule():
    text = "steer 1\nvector v = [1.0, 2.0]\nvector w = decay(0.9) * v\n"
    result = check_source(text, "s.steer")
    assert [d.code for d in result.diagnostics] == ["type-error"]
    assert "scheduled vector" in result.render()


def test_numbers_fold_into_the_vector_and_factors_are_sorted():
    text = _iv("add -2 * (ramp(4) * decay(0.5)) * v / 4", "generated", "param s = 3.0\n")
    op = check_source(text, "s.steer").checked.interventions[0].op
    assert op.schedule == (("decay", 0.5, 0.0), ("ramp", 4.0, 0.0))
    assert np.allclose(op.vectors[0], [-0.5, -1.0])


def test_schedule_values():
    steps = np.arange(6)
    assert np.allclose(schedule_factor((("ramp", 3.0, 0.0),), steps), [1 / 3, 2 / 3, 1, 1, 1, 1])
    assert np.allclose(schedule_factor((("decay", 0.5, 0.0),), steps), [1, 0.5, 0.25, 0.125, 0.0625, 0.03125])
    assert np.allclose(schedule_factor((("window", 1.0, 3.0),), steps), [0, 1, 1, 0, 0, 0])


def test_fmt_keeps_schedules():
    from steerc.core.source import Source
    from steerc.frontend import parse_source
    from steerc.frontend.fmt import format_program

    text = _iv("add   2 *decay( 0.9 )* v")
    program, _ = parse_source(text, "s.steer")
    assert "add    2 * decay(0.9) * v" in format_program(program, Source("s.steer", text))


# ---------------------------------------------------------------------- the HF target


PROGRAM = ("steer 1\n"
           f"intervention x {{\n  at resid_post[1]\n  add 3.0 * decay(0.7) * ramp(3) * {V}\n"
           "  tokens prompt[-1:], generated\n}\n")


def _generate(model, plan=None, use_cache=True, package=None):
    kwargs = dict(input_ids=IDS, attention_mask=MASK, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                  eos_token_id=None, output_hidden_states=True, output_logits=True, return_dict_in_generate=True,
                  use_cache=use_cache)
    with torch.no_grad():
        if plan is None:
            return model.generate(**kwargs)
        handle = package.install(model) if package is not None else install(model, plan)
        with handle:
            return model.generate(**kwargs)


def test_hf_steers_each_step_by_the_schedule_exactly():
    model = tiny_model("llama")  # float64
    plan = plan_for(model, PROGRAM)
    out = _generate(model, plan)
    steered = torch.cat([step[2] for step in out.hidden_states], dim=1)  # resid_post[1], positions fed so far
    full_mask = torch.cat([MASK, torch.ones(2, NEW, dtype=torch.long)], dim=1)
    position_ids = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 1)  # as generate() counts them
    with torch.no_grad():
        plain = model(input_ids=out.sequences, attention_mask=full_mask, position_ids=position_ids,
                      output_hidden_states=True).hidden_states[2]
    kernel = plan.sites[0].kernels[0].op
    # The runtimes steer with the plan's float32 numbers (the vector, and 0.7 as float32 = 0.69999999).
    v = np.asarray(kernel.bias.array, dtype=np.float32).astype(np.float64)
    schedule = tuple((k, float(np.float32(a)), float(np.float32(b))) for k, a, b in kernel.schedule)
    for b in range(IDS.shape[0]):
        real = full_mask[b, : steered.shape[1]].bool().numpy()
        pos = np.cumsum(real) - 1
        prompt_len = int(MASK[b].sum())
        steps = pos - (prompt_len - 1)
        factor = schedule_factor(schedule, steps)
        selected = real & (steps >= 0)
        want = plain[b, : steered.shape[1]].double().numpy() + np.where(selected[:, None], factor[:, None] * v, 0)
        got = steered[b].double().numpy()
        np.testing.assert_allclose(got[real], want[real], rtol=0, atol=1e-10)
        assert np.abs(got[real][steps[real] == 0] - plain[b][: steered.shape[1]][real][steps[real] == 0].numpy()).max() > 0.1


def test_with_and_without_the_kv_cache_alike():
    model = tiny_model("llama")
    plan = plan_for(model, PROGRAM)
    cached, uncached = _generate(model, plan), _generate(model, plan, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), rtol=0, atol=1e-9)
    assert not torch.equal(cached.sequences, _generate(model).sequences), "the schedule steers"


def test_the_emitted_package_gives_the_same_logits(tmp_path):
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = tiny_model("llama")
    plan = plan_for(model, PROGRAM)
    emit(lower_hf(plan, facts_from_model(model)), str(tmp_path / "pkg"), "test")
    assert "S.schedule_factor(('decay', 'ramp')" in (tmp_path / "pkg" / "__init__.py").read_text()
    package = load_emitted(str(tmp_path / "pkg"), "scheduled_pkg")
    a, b = _generate(model, plan), _generate(model, plan, package=package)
    assert torch.equal(torch.stack(a.logits), torch.stack(b.logits))


# ------------------------------------------------------------------------ plans


def test_fusion_keeps_different_schedules_apart_and_joins_equal_ones():
    from steerc.passes.fuse_affine import run

    model = tiny_model("llama")
    two = ("steer 1\n"
           f"intervention a {{\n  at resid_post[1]\n  add decay(0.5) * {vec(64, 1)}\n  tokens generated\n}}\n"
           f"intervention b {{\n  at resid_post[1]\n  add SECOND * {vec(64, 2)}\n  tokens generated\n}}\n")
    apart = run(plan_for(model, two.replace("SECOND", "decay(0.6)")))
    joined = run(plan_for(model, two.replace("SECOND", "decay(0.5)")))
    assert len(apart.sites[0].kernels) == 2 and len(joined.sites[0].kernels) == 1
    assert joined.sites[0].kernels[0].op.schedule == (("decay", 0.5, 0.0),)


def test_explain_prints_the_first_steps(tmp_path):
    from support import run_cli

    prog = tmp_path / "s.steer"
    prog.write_text(PROGRAM.replace("resid_post[1]", "resid_post[1]"))
    import os

    from support import examples_path

    model = os.path.join(examples_path(), "models", "tiny-llama")
    code, out, err = run_cli(["explain", str(prog), "--model", model, "--format", "json"])
    assert code == 0, err
    (kernel,) = json.loads(out)["sites"][0]["kernels"]
    sched = kernel["op"]["schedule"]
    assert sched["factors"] == "decay(0.7) * ramp(3)"
    assert sched["steps"][:3] == [round(1 / 3, 6), round(0.7 * 2 / 3, 6), round(0.49, 6)]
    code, text, _ = run_cli(["explain", str(prog), "--model", model])
    assert "b scaled by decay(0.7) * ramp(3): steps 0.. 7: 0.333333, 0.466667, 0.49" in text


def test_vllm_plans_carry_schedules_and_check_their_numbers():
    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.wire import PlanError, seal, unpack, validate_plan

    model = tiny_model("llama")
    obj = unpack(plan_bytes(plan_for(model, PROGRAM), facts_from_model(model)))
    (hook,) = obj["boot"]["hooks"]
    kernel = hook["sites"][0]["kernels"][0]
    assert kernel["schedule"] == ["decay", "ramp"]
    tensors = validate_plan(obj)
    assert np.allclose(tensors[kernel["tensors"]["schedule"]], [[0.7, 0], [3, 0]])
    name = kernel["tensors"]["schedule"]
    for rows, message in (([[1.5, 0], [3, 0]], "decay rate"), ([[0.7, 0], [2.5, 0]], "whole steps")):
        bad = unpack(plan_bytes(plan_for(model, PROGRAM), facts_from_model(model)))
        bad["state"]["tensors"][name]["data"] = np.asarray(rows, dtype="<f4").tobytes()
        with pytest.raises(PlanError, match=message):
            validate_plan(seal(bad))


def test_serve_plans_carry_schedules_and_admission_checks_them():
    from steerc.serve_client import extra_args
    from steerc.targets.serve.admission import RequestError, admit
    from steerc.targets.serve.format import cache_salt, from_serve, to_serve

    model = tiny_model("llama")
    facts = facts_from_model(model)
    plan = plan_for(model, PROGRAM)
    doc, arts = to_serve(plan, facts.to_json())
    op = doc["sites"][0]["kernels"][0]["op"]
    assert op["schedule"] == [{"kind": "decay", "rate": 0.7}, {"kind": "ramp", "steps": 3}]
    assert from_serve(doc, arts.__getitem__) == plan
    assert admit(extra_args(doc, arts), facts) is not None
    for edit, field in ((lambda d: d["sites"][0]["kernels"][0]["op"]["schedule"][0].update(rate=0.0), "rate"),
                        (lambda d: d["sites"][0]["kernels"][0]["scope"].__setitem__(0, {"kind": "all"}), "scope")):
        bad = json.loads(json.dumps(doc))
        edit(bad)
        bad["cache_salt"] = cache_salt(bad)
        with pytest.raises(RequestError) as err:
            admit(extra_args(bad, arts), facts)
        assert field in str(err.value)
