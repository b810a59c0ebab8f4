"""Per-request params: `param strength = 1 in [0, 4] per request`.

Checked statically (where a per-request param may go, ranges against defaults and ``--set``), and
exact at run time: a plan rebound to a value is the plan compiled with ``--set`` to it (the same
kernels, bit for bit, where the coefficient is exact), on the HF runtime (``install(...,
params=...)``: equal logits), in the vllm target's buffers (``set_params``) and in serve admission
(a request's ``steerc_params``, refused with the param named; its own ``cache_salt``). The real
engine runs the same comparisons in tests/engine.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steerc.api import Options, check_source
from steerc.ir.plan import ParamError, check_params, rebind

BASE = """steer 1

param strength = 1 in [0, 4] per request
param limit = 0.2 per request

vector joy = {joy}
vector harm = {harm}

probe topic {{
  at   resid_pre[1]
  read cosine(harm)
  pool prompt.mean
}}

intervention cheer {{
  at     resid_post[1:3]
  add    strength * joy
  tokens generated
  when   topic > limit
}}

intervention louder {{
  at    resid_post[2]
  scale strength
}}

intervention pin {{
  at    resid_post[3]
  clamp harm to -0.5 * strength
}}

intervention turn {{
  at     resid_post[0]
  rotate in (joy, harm) by strength * 10deg
  tokens prompt
}}
"""


def _vec(seed: int, width: int = 64) -> str:
    rng = np.random.default_rng(seed)
    return "[" + ", ".join(f"{x:.6f}" for x in rng.normal(0.0, 1.0, width)) + "]"


TEXT = BASE.format(joy=_vec(1), harm=_vec(2))


def _check(text: str, facts=None, **overrides):
    return check_source(text, "p.steer", options=Options(overrides=overrides), facts=facts)


def _codes(text: str, **overrides) -> list[str]:
    """The error codes (an unused helper vector is only a warning)."""
    return [d.code for d in _check(text, **overrides).diagnostics if d.severity == "error"]


def _program(op: str, extra: str = "", head: str = "param strength = 1 per request\n") -> str:
    return (f"steer 1\n{head}vector v = [1.0, 2.0]\nvector w = [0.0, 1.0]\n{extra}"
            f"intervention x {{\n  at resid_post[0]\n  {op}\n  tokens generated\n}}\n")


# ----------------------------------------------------------------------- static


@pytest.mark.parametrize("op", [
    "add strength * v", "add -strength * v", "add 0.5 * strength * v", "add strength * v / 3",
    "add strength * decay(0.9) * v", "add 2 * (strength * v)", "set strength * v", "scale strength",
    "scale strength * v", "clamp v to strength", "clamp v to -2 * strength", "rotate in (v, w) by strength * 10deg",
    "rotate in (v, w) to strength",
])
def test_one_factor_of_a_whole_operand_is_allowed(op):
    assert _codes(_program(op)) == []


@pytest.mark.parametrize("op, extra, reason", [
    ("add (strength + 1) * v", "", "in a sum"),
    ("add normalize(strength * v)", "", "inside `normalize(...)`"),
    ("add strength * strength * v", "", "used 2 times in one operand"),
    ("add v / strength", "", "in a divisor"),
    ("scale 1 / strength", "", "in a divisor"),
    ("add decay(0.9) * ramp(strength) * v", "", "an argument of the schedule `ramp`"),
    ("add u", "vector u = strength * v\n", "a vector declaration"),
    ("add k * v", "param k = 2 * strength\n", "a param declaration"),
    ("add (strength - 1) * v", "", "in a difference"),
])
def test_a_use_the_kernels_cannot_replay_is_refused_at_the_param(op, extra, reason):
    text = _program(op, extra)
    result = _check(text)
    bad = [d for d in result.diagnostics if d.code == "per-request-param"]
    assert bad, result.render()
    for d in bad:  # the caret is on the param's name, and the message says why
        line = text.split("\n")[d.span.line - 1]
        assert line[d.span.column - 1:].startswith("strength")
        assert reason in d.message, d.message


def test_a_per_request_param_in_a_probe_or_a_scope_is_refused():
    probe = ("probe p {\n  at resid_pre[0]\n  read dot(v) + strength\n  pool prompt.mean\n}\n")
    assert "per-request-param" in _codes(_program("add v\n  when p > 0", probe))


def test_a_gate_threshold_may_be_a_per_request_param():
    probe = "probe p {\n  at resid_pre[0]\n  read cosine(v)\n  pool prompt.mean\n}\n"
    assert _codes(_program("add v\n  when p > strength and not p > 0.5 * strength", probe)) == []
    assert _codes(_program("add v\n  when strength < p", probe)) == []
    assert "per-request-param" in _codes(_program("add v\n  when p > strength + 0.1", probe))


def test_ranges_check_the_default_and_set():
    head = "param strength = 1 in [0, 4] per request\n"
    assert _codes(_program("add strength * v", head=head)) == []
    assert _codes(_program("add strength * v", head=head), strength=4) == []
    assert "param-out-of-range" in _codes(_program("add strength * v", head=head), strength=4.5)
    assert "param-out-of-range" in _codes(_program("add strength * v", head=head), strength=-1)
    out = "param strength = 5 in [0, 4] per request\n"
    assert "param-out-of-range" in _codes(_program("add strength * v", head=out))
    empty = "param strength = 1 in [4, 0] per request\n"
    assert "invalid-value" in _codes(_program("add strength * v", head=empty))
    plain = "param strength = 1 in [0, 4]\n"  # a range without `per request` checks --set too
    assert "param-out-of-range" in _codes(_program("add (strength + 1) * v", head=plain), strength=9)
    assert _codes(_program("add (strength + 1) * v", head=plain), strength=3) == []


def test_set_out_of_range_points_at_the_range():
    text = _program("add strength * v", head="param strength = 1 in [0, 4] per request\n")
    (d,) = [d for d in _check(text, strength=7).diagnostics if d.code == "param-out-of-range"]
    assert "--set strength=7" in d.message and d.span.line == 2
    assert text.split("\n")[1][d.span.column - 1:].startswith("in [0, 4]")


def test_fmt_keeps_range_and_per_request():
    from steerc.frontend import parse_source
    from steerc.frontend.fmt import format_program

    text = "steer 1\n\nparam strength = 1 in [0, 4] per request\nparam limit    = 0.2 per request\n"
    program, diagnostics = parse_source(text, "p.steer")
    assert not list(diagnostics) and format_program(program) == text


# ------------------------------------------------------------------------- plans


@pytest.fixture(scope="module")
def facts(tiny_facts):
    return tiny_facts("tiny-llama")


def _plan(facts, **overrides):
    result = _check(TEXT, facts, **overrides)
    assert result.ok, result.render()
    return result.plan


def _sites(plan):
    return [(sp.site, [(k.op, k.gate, k.scope) for k in sp.kernels]) for sp in plan.sites]


def test_plan_declares_params_and_binds_every_use(facts):
    plan = _plan(facts)
    assert [(p.name, p.default, p.low, p.high) for p in plan.params] == [
        ("strength", 1.0, 0.0, 4.0), ("limit", 0.2, None, None)]
    roles = sorted({(b.role, b.param) for sp in plan.sites for k in sp.kernels for b in k.bindings})
    assert roles == [("angle", "strength"), ("bias", "strength"), ("scale", "strength"), ("target", "strength")]
    gated = [k.gate for sp in plan.sites for k in sp.kernels if k.gate is not None]
    assert gated and all(g.param == "limit" and g.coefficient == 1.0 for g in gated)


@pytest.mark.parametrize("values", [{"strength": 2.0}, {"strength": 0.0}, {"strength": 4.0, "limit": -0.25},
                                    {"limit": 0.5}])
def test_rebind_equals_set(facts, values):
    assert _sites(rebind(_plan(facts), values)) == _sites(_plan(facts, **values))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 4.0, allow_nan=False))
def test_rebind_equals_set_for_a_loaded_vector(tmp_path_factory, value):
    """A vector from a file is exact in float32, so coefficient * value rounds as --set's fold does."""
    from safetensors.numpy import save_file
    from support import examples_path

    from steerc.facts import load_facts

    folder = tmp_path_factory.mktemp("vec")
    rng = np.random.default_rng(3)
    save_file({"joy": rng.normal(size=64).astype(np.float32)}, str(folder / "v.safetensors"))
    text = ("steer 1\nparam strength = 1 in [0, 4] per request\nvector joy = load(\"v.safetensors\", key=\"joy\")\n"
            "intervention cheer {\n  at resid_post[1]\n  add strength * joy\n}\n")
    facts = load_facts(os.path.join(examples_path(), "models", "tiny-llama"))

    def plan(**o):
        r = check_source(text, "p.steer", options=Options(base_dir=str(folder), root=str(folder), overrides=o),
                         facts=facts)
        assert r.ok, r.render()
        return r.plan

    assert _sites(rebind(plan(), {"strength": value})) == _sites(plan(strength=value))


def test_bound_kernels_are_neither_fused_nor_dropped(facts):
    text = _program("add strength * v", head="param strength = 0 in [0, 4] per request\n")
    text = text.replace("vector v = [1.0, 2.0]", f"vector v = {_vec(1)}").replace(
        "vector w = [0.0, 1.0]", f"vector w = {_vec(2)}")
    text += ("intervention y {\n  at resid_post[0]\n  add w\n  tokens generated\n}\n"
             "intervention z {\n  at resid_post[0]\n  scale strength\n}\n"
             "intervention q {\n  at resid_post[0]\n  set w\n}\n")
    plan = _check(text, facts).plan
    (sp,) = plan.sites
    # x (bound add at 0: not a no-op), y, z (bound scale: not a killer of y... but q kills all of them)
    kinds = [(k.names, bool(k.bindings)) for k in sp.kernels]
    assert kinds == [(("q",), False)]  # a bound `set`-free kill: q overwrites every position, for every value
    text2 = text.replace("intervention q {\n  at resid_post[0]\n  set w\n}\n", "")
    plan2 = _check(text2, facts).plan
    assert [k.names for k in plan2.sites[0].kernels] == [("x",), ("y",), ("z",)]
    assert [k.names for k in rebind(plan2, {"strength": 1}).sites[0].kernels] == [("x",), ("y",), ("z",)]


def test_a_bound_scale_does_not_kill(facts):
    text = _program("add w", head="param strength = 0 in [0, 4] per request\n")
    text = text.replace("vector v = [1.0, 2.0]", f"vector v = {_vec(1)}").replace(
        "vector w = [0.0, 1.0]", f"vector w = {_vec(2)}")
    text += "intervention z {\n  at resid_post[0]\n  scale strength\n  tokens generated\n}\n"
    plan = _check(text, facts).plan
    assert [k.names for k in plan.sites[0].kernels] == [("x",), ("z",)]


@pytest.mark.parametrize("values, field, message", [
    ({"strength": 5}, "strength", "outside its declared range [0, 4]"),
    ({"strength": -0.001}, "strength", "outside"),
    ({"strength": "2"}, "strength", "expected a number, got str"),
    ({"strength": True}, "strength", "expected a number, got bool"),
    ({"strength": float("nan")}, "strength", "finite"),
    ({"limit": float("inf")}, "limit", "finite"),
    ({"limit": 10 ** 400}, "limit", "finite"),
    ({"limit": 1e39}, "limit", "overflow float32"),
    ({"strenght": 1}, "strenght", "no per-request param of that name (its params: limit, strength)"),
])
def test_bad_values_name_the_param(facts, values, field, message):
    with pytest.raises(ParamError) as info:
        check_params(_plan(facts), values)
    assert info.value.field == field and message in info.value.message


def test_a_plan_without_params_refuses_values(facts):
    plan = _check(TEXT.replace(" per request", "").replace(" in [0, 4]", ""), facts).plan
    assert plan.params == () and rebind(plan) is plan
    with pytest.raises(ParamError, match="its params: none"):
        rebind(plan, {"strength": 2})


def test_explain_lists_params_and_bound_operands(facts):
    from steerc.explain.plan import explain, render

    doc = explain(_check(TEXT, facts))
    assert doc["params"][0] == {"name": "strength", "default": 1.0, "min": 0.0, "max": 4.0}
    text = render(doc)
    assert "per-request params" in text and "strength: default 1, in [0, 4]" in text
    assert "per request: b = strength * a vector of norm" in text
    assert "per request: angle = strength * 10 deg" in text
    assert "(= 1 * limit)" in text


def test_vllm_hook_dialect_refuses_per_request_params(facts):
    from steerc.targets.capabilities import check_target

    result = _check(TEXT, facts)
    check_target(result, "vllm-hook")
    assert any(d.code == "unsupported-by-target" and "per request" in d.message for d in result.diagnostics)


# ------------------------------------------------------------------------ HF runtime


def test_hf_install_params_equals_set():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import tiny_model

    from steerc.runtime.hf import facts_from_model, install

    model = tiny_model("llama")
    facts = facts_from_model(model)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])

    def logits(plan, **kw):
        with install(model, plan, **kw), torch.no_grad():
            return model.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True,
                                  return_dict_in_generate=True, pad_token_id=0)

    base = _plan(facts)
    for values in ({"strength": 2.0, "limit": -1.0}, {"strength": 0.5, "limit": -1.0}):
        a = logits(base, params=values)
        b = logits(_plan(facts, **values))
        assert torch.equal(a.sequences, b.sequences)
        assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))
    unsteered_default = logits(base)
    assert not torch.equal(torch.stack(unsteered_default.logits), torch.stack(a.logits))
    with pytest.raises(ParamError, match="outside"):
        install(model, base, params={"strength": 9})


@pytest.mark.parametrize("text", [TEXT, TEXT.replace("scale strength\n", "scale strength * joy\n")],
                         ids=["scalar-scale", "vector-scale"])
def test_the_emitted_package_takes_params_as_install_does(tmp_path, text):
    """compile --target hf, then the package's install(params=): the in-process install's logits, bit for bit,
    for every bound role (add, scale, clamp, rotate, a gate threshold); its refusals name the param alike."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_util import load_emitted
    from tiny_models import tiny_model

    from steerc.runtime.hf import facts_from_model, install
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = tiny_model("llama")
    facts = facts_from_model(model)
    result = _check(text, facts)
    assert result.ok, result.render()
    plan = result.plan
    files = emit(lower_hf(plan, facts), str(tmp_path / "pkg"), "steerc compile (test)")
    assert files == ["__init__.py", "_hooks.py", "_params.py", "_support.py", "tensors.safetensors"]
    pkg = load_emitted(str(tmp_path / "pkg"), f"steer_params_{len(text)}")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])

    def logits(handle):
        with handle, torch.no_grad():
            out = model.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        return out.sequences, torch.stack(out.logits)

    seen = []
    for values in (None, {"strength": 2.0, "limit": -1.0}, {"strength": 0.5, "limit": -1.0}, {"limit": -1.0}):
        a, b = logits(pkg.install(model, params=values)), logits(install(model, plan, params=values))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), values
        seen.append(a[1])
    assert all(not torch.equal(seen[0], x) for x in seen[1:])  # each value steers differently
    for bad in ({"strength": 9}, {"nope": 1}, {"strength": True}, {"strength": float("nan")}, [1]):
        with pytest.raises(ValueError) as ours:
            pkg.install(model, params=bad)
        with pytest.raises(ParamError) as theirs:
            install(model, plan, params=bad)
        assert str(ours.value) == str(theirs.value) and type(ours.value).__name__ == "ParamError"
    assert pkg.install.__doc__ and "params" in pkg.install.__doc__


def test_the_packages_param_checks_are_plain_python():
    """_params.py is steerc/ir/param_values.py, copied: it must import nothing but the standard library."""
    import ast

    from steerc.core.limits import FLOAT32_MAX
    from steerc.ir import param_values

    with open(param_values.__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "collections"}, imported
    assert param_values.FLOAT32_MAX == FLOAT32_MAX == float(np.finfo(np.float32).max)


def test_an_emitted_package_without_params_is_as_before(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import inspect

    from hf_util import load_emitted
    from tiny_models import tiny_model

    from steerc.runtime.hf import facts_from_model
    from steerc.targets.hf.emit import emit
    from steerc.targets.hooks import lower_hf

    model = tiny_model("llama")
    facts = facts_from_model(model)
    plan = _plan(facts, strength=2.0)
    fixed = _check(TEXT.replace(" per request", ""), facts, strength=2.0).plan
    assert emit(lower_hf(fixed, facts), str(tmp_path / "pkg"), "t") == ["__init__.py", "_hooks.py", "_support.py",
                                                                         "tensors.safetensors"]
    pkg = load_emitted(str(tmp_path / "pkg"), "steer_no_params")
    assert list(inspect.signature(pkg.install).parameters) == ["model", "tokenizer", "check"]
    assert "ctx.bound" not in (tmp_path / "pkg" / "__init__.py").read_text(encoding="utf-8")
    assert plan.params and not fixed.params


# ---------------------------------------------------------------- vllm buffers


def test_vllm_param_tensors_equal_the_set_plan(facts):
    from steerc.targets.vllm.program import build, plan_document
    from steerc.targets.vllm.wire import PlanError, param_tensors

    header = plan_document(_plan(facts), facts)["header"]
    boot, tensors = build(_plan(facts), facts)
    assert [p["name"] for p in header["params"]] == ["strength", "limit"]
    values = {"strength": 3.0, "limit": 0.125}
    new = param_tensors(header, boot, tensors, values)
    boot2, twin = build(_plan(facts, **values), facts)
    assert set(new) == {b["buffer"] for b in boot["bindings"]}
    for name, value in new.items():
        # a literal vector is float64 in --set's fold; its float32 coefficient times 3 may differ by 1 ulp
        np.testing.assert_array_max_ulp(value, twin[name], maxulp=1)
    exact = param_tensors(header, boot, tensors, {"strength": 2.0, "limit": 0.125})
    boot3, twin3 = build(_plan(facts, strength=2.0, limit=0.125), facts)
    assert all(np.array_equal(v, twin3[k]) for k, v in exact.items())
    with pytest.raises(PlanError) as info:
        param_tensors(header, boot, tensors, {"strength": 4.5})
    assert info.value.field == "params.strength"


def test_vllm_plan_with_params_validates_and_refuses_bad_bindings(facts):
    import copy

    from steerc.targets.vllm.emit import plan_bytes
    from steerc.targets.vllm.wire import PlanError, boot_sha256, seal, unpack, validate_plan

    obj = unpack(plan_bytes(_plan(facts), facts))
    validate_plan(obj)
    for edit, field in [
        (lambda o: o["boot"]["bindings"][0].update(param="nope"), "plan.boot.bindings[0].param"),
        (lambda o: o["boot"]["bindings"][0].update(buffer="gates.thresholds", index=None),
         "plan.boot.bindings[0].index"),
        (lambda o: o["boot"]["bindings"][0].update(coefficient="gates.thresholds"),
         "plan.boot.bindings[0].coefficient"),
        (lambda o: o["header"]["params"].append(dict(o["header"]["params"][0])), "plan.header.params[2].name"),
        (lambda o: o["header"]["params"][0].update(default=9.0), "plan.header.params[0].default"),
        (lambda o: o["header"].pop("params"), "plan.boot.bindings"),
    ]:
        bad = copy.deepcopy(obj)
        edit(bad)
        bad["header"]["boot_sha256"] = boot_sha256(bad["boot"])
        with pytest.raises(PlanError) as info:
            validate_plan(seal(bad))
        assert info.value.field == field, (field, str(info.value))


# ------------------------------------------------------------------------ serve


@pytest.fixture(scope="module")
def served(facts, tmp_path_factory):
    from steerc.targets.serve.emit import emit

    folder = str(tmp_path_factory.mktemp("serve"))
    emit(_plan(facts), facts, folder)
    return folder


def _admit(folder, facts, params=None, **kw):
    from steerc.serve_client import request_fields
    from steerc.targets.serve.admission import admit

    body = request_fields(folder, params=params)["extra_body"]
    return admit(body["vllm_xargs"], facts, salt=body["cache_salt"], **kw)


def test_serve_request_values_equal_set(facts, served):
    from steerc.targets.serve.format import to_serve

    for values in ({"strength": 2.0}, {"strength": 0.0, "limit": 0.5}):
        admitted = _admit(served, facts, values)
        twin = _plan(facts, **values)
        assert _sites(admitted.plan) == _sites(twin)
        assert admitted.salt != json.load(open(os.path.join(served, "plan.json")))["cache_salt"]
        doc, _ = to_serve(twin, facts.to_json())
        assert doc["params"][0]["default"] == values.get("strength", 1.0)


def test_serve_salt_is_the_plans_at_the_defaults_and_differs_by_value(facts, served):
    plan_salt = json.load(open(os.path.join(served, "plan.json")))["cache_salt"]
    assert _admit(served, facts).salt == plan_salt
    assert _admit(served, facts, {"strength": 1}).salt == plan_salt  # the default, spelled as an int
    salts = {_admit(served, facts, {"strength": v}).salt for v in (0.5, 2, 3)}
    assert len(salts) == 3 and plan_salt not in salts


@pytest.mark.parametrize("raw, field, message", [
    ('{"strength": 9}', "steerc_params.strength", "outside its declared range"),
    ('{"strength": "2"}', "steerc_params.strength", "expected a number"),
    ('{"strength": null}', "steerc_params.strength", "expected a number"),
    ('{"nope": 1}', "steerc_params.nope", "no per-request param"),
    ('[1, 2]', "steerc_params", "expected a JSON object"),
    ('{"strength": NaN}', "steerc_params", "not JSON"),
    ('{"strength": 1', "steerc_params", "not JSON"),
])
def test_serve_bad_values_are_refused_naming_the_param(facts, served, raw, field, message):
    from steerc.serve_client import request_fields
    from steerc.targets.serve.admission import RequestError, admit

    xargs = dict(request_fields(served)["extra_body"]["vllm_xargs"], steerc_params=raw)
    with pytest.raises(RequestError) as info:
        admit(xargs, facts)
    assert info.value.field == field and message in info.value.message


def test_serve_refuses_a_stale_salt_and_params_without_a_plan(facts, served):
    from steerc.serve_client import request_fields
    from steerc.targets.serve.admission import RequestError, admit

    body = request_fields(served)["extra_body"]
    xargs = dict(body["vllm_xargs"], steerc_params='{"strength": 2}')
    with pytest.raises(RequestError) as info:  # the default's salt for a strength-2 request
        admit(xargs, facts, salt=body["cache_salt"])
    assert info.value.field == "cache_salt"
    with pytest.raises(RequestError) as info:
        admit({"steerc_params": '{"strength": 2}'}, facts)
    assert info.value.field == "steerc_params"


def test_serve_document_with_params_is_checked(facts, served):
    import copy

    from steerc.serve_client import read_compiled
    from steerc.targets.serve.admission import RequestError, check_document
    from steerc.targets.serve.format import cache_salt

    doc, artifacts = read_compiled(served)
    check_document(doc, facts, artifacts)

    def kernel(d):
        return next(k for s in d["sites"] for k in s["kernels"] if k.get("bindings"))

    for edit, field in [
        (lambda d: kernel(d)["bindings"][0].update(param="nope"), ".bindings[0].param"),
        (lambda d: kernel(d)["bindings"][0].update(role="scale"), ".bindings[0].role"),
        (lambda d: d["params"].append(dict(d["params"][0])), "steerc_plan.params[2].name"),
        (lambda d: d["params"][0].update(default=7.0), "steerc_plan.params[0].default"),
        (lambda d: d["params"][0].update(default=3.0), "steerc_plan.params"),  # values != coefficient * default
    ]:
        bad = copy.deepcopy(doc)
        edit(bad)
        bad["cache_salt"] = cache_salt(bad)
        with pytest.raises(RequestError) as info:
            check_document(bad, facts, artifacts)
        assert info.value.field.endswith(field), (field, info.value.field, info.value.message)


def test_serve_plan_round_trips_with_params(facts):
    from steerc.targets.serve.format import dumps, from_serve, to_serve

    plan = _plan(facts)
    doc, blobs = to_serve(plan, facts.to_json())
    again = from_serve(doc, blobs.__getitem__)
    assert _sites(again) == _sites(plan) and again.params == plan.params
    assert [k.bindings for sp in again.sites for k in sp.kernels] == [k.bindings for sp in plan.sites
                                                                      for k in sp.kernels]
    assert dumps(to_serve(again, facts.to_json())[0]) == dumps(doc)


def test_many_misuses_are_one_error_in_linear_time():
    """4096 uses of a per-request param in one sum: one error at the first, and about 4x the CPU time of 1024
    uses, measured side by side (a ratio, not seconds against a limit, which a loaded machine fails: issue 32)."""
    from scaling import assert_linear

    def tree(depth):
        return "strength * v" if depth == 0 else f"({tree(depth - 1)} + {tree(depth - 1)})"

    small, large = _program(f"add {tree(10)}"), _program(f"add {tree(12)}")
    for text in (small, large):
        assert [d.code for d in _check(text).diagnostics if d.severity == "error"] == ["per-request-param"]
    assert_linear(lambda: _check(small), lambda: _check(large))


def test_an_intervention_with_errors_of_its_own_gets_no_per_request_error_too():
    """`add strength * joy` with `joy` undefined is one error (undefined-name), not also a misuse."""
    from steerc.api import check_source

    result = check_source("steer 1\nparam strength = 1 per request\nintervention c {\n  at resid_post[1]\n"
                          "  add strength * joy\n}\n", "pr.steer")
    assert [d.code for d in result.diagnostics if d.is_error] == ["undefined-name"], result.render()
