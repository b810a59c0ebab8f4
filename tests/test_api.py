"""The embedding API (:mod:`steerc.api`): results are objects, nothing is written or printed."""

from __future__ import annotations

import builtins
import gc
import io
import os
import subprocess
import sys

import numpy as np
import pytest
from support import examples_path

from steerc.api import CHECK_PASSES, CheckResult, Options, check_file, check_source
from steerc.core.source import Span
from steerc.diagnostics import Diagnostic, render_text, to_json_dict
from steerc.explain.plan import explain, render
from steerc.facts import facts_from_config, load_facts
from steerc.ir.plan import Plan, Site

FACTS = facts_from_config({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 4, "num_attention_heads": 2,
                           "intermediate_size": 8, "vocab_size": 16})

GOOD = """steer 1

param gain = 2.0

vector v = [1.0, 0.0, 0.0, 0.0]

probe p {
  at   resid_pre[1]
  read cosine(v)
  pool prompt.mean
}

intervention push {
  at     resid_post[1:3]
  add    gain * v
  tokens generated
  when   p > 0.1
}
"""

BAD = """steer 1

intervention x {
  at  resid_post[9]
  add w
}
"""


@pytest.fixture
def no_writes(monkeypatch):
    """Fail on any attempt to open a file for writing or to make a folder."""
    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            raise AssertionError(f"the API tried to write {file!r}")
        return real_open(file, mode, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError(f"the API tried to change the filesystem: {args!r}")

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    for name in ("makedirs", "mkdir", "remove", "unlink", "rename", "replace"):
        monkeypatch.setattr(os, name, refuse)


def test_check_source_in_memory(no_writes, capsys):
    result = check_source(GOOD)
    assert isinstance(result, CheckResult)
    assert result.ok and result.diagnostics == [] and result.errors == []
    assert result.source.name == "<string>" and result.source.text == GOOD
    assert [i.name for i in result.checked.interventions] == ["push"]
    assert result.checked.params == {"gain": 2.0}
    assert result.facts is None and result.plan is None  # no model: no plan
    assert capsys.readouterr() == ("", "")


def test_diagnostics_are_objects(no_writes, capsys):
    result = check_source(BAD, "bad.steer")
    assert not result.ok and result.plan is None
    (d,) = result.diagnostics  # without a model only the undefined name is an error
    assert isinstance(d, Diagnostic) and d.is_error
    assert (d.code, d.severity) == ("undefined-name", "error")
    assert isinstance(d.span, Span) and d.span.file == "bad.steer"
    assert (d.span.line, d.span.column, d.span.end_line, d.span.end_column) == (5, 7, 5, 8)
    assert "`w`" in d.message
    text = result.render()
    assert text == render_text(d, result.sources)
    assert text.startswith("error[undefined-name]: ") and " --> bad.steer:5:7" in text
    assert "5 |   add w\n  |       ^" in text
    obj = result.to_json()[0]
    assert obj == to_json_dict(d)
    assert {k: obj[k] for k in ("code", "severity", "file", "line", "column", "end_line", "end_column")} == {
        "code": "undefined-name", "severity": "error", "file": "bad.steer", "line": 5, "column": 7,
        "end_line": 5, "end_column": 8}
    assert capsys.readouterr() == ("", "")


def test_layout_errors_need_facts(no_writes):
    result = check_source(BAD, "bad.steer", facts=FACTS)
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("undefined-name", 5)]
    result = check_source(BAD.replace("add w", "add [1, 0, 0, 0]"), "bad.steer", facts=FACTS)
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("layer-out-of-range", 4)]
    assert result.plan is None


def test_diagnostics_are_sorted_by_position():
    text = ("steer 1\nintervention a {\n  at resid_post[0]\n  add w\n}\n"
            "intervention b {\n  at resid_post[0]\n  add u\n}\n")
    lines = [d.span.line for d in check_source(text).diagnostics]
    assert lines == sorted(lines) and len(lines) == 2


def test_plan_with_facts(no_writes, capsys):
    result = check_source(GOOD, "good.steer", facts=FACTS)
    assert result.ok and result.facts is FACTS
    plan = result.plan
    assert isinstance(plan, Plan)
    assert plan.facts_fingerprint == FACTS.fingerprint and plan.family == "llama"
    assert plan.source_name == "good.steer" and len(plan.source_sha256) == 64
    assert [sp.site for sp in plan.sites] == [Site("resid_post", 1), Site("resid_post", 2)]
    (k,) = plan.sites[0].kernels
    assert np.array_equal(k.op.bias.array, [2.0, 0.0, 0.0, 0.0]) and k.names == ("push",)
    (probe,) = plan.probes
    assert (probe.name, probe.site, probe.pool) == ("p", Site("resid_post", 0), "prompt.mean")
    assert capsys.readouterr() == ("", "")


def test_overrides_change_the_plan():
    result = check_source(GOOD, facts=FACTS, options=Options(overrides={"gain": -3.0}))
    assert np.array_equal(result.plan.sites[0].kernels[0].op.bias.array, [-3.0, 0.0, 0.0, 0.0])


def test_optimiser_warnings_come_back_as_diagnostics():
    text = GOOD + "\nintervention noop {\n  at resid_post[1]\n  scale 1\n}\n"
    result = check_source(text, facts=FACTS)
    assert result.ok
    (d,) = result.diagnostics
    assert (d.code, d.severity, d.span.line) == ("no-effect", "warning", 20)


def test_explain_document(no_writes, capsys):
    result = check_source(GOOD, "good.steer", facts=FACTS)
    doc = explain(result)
    assert doc["format"] == "steerc.explain/1" and doc["file"] == "good.steer" and doc["target"] == "hf"
    assert doc["model"] == FACTS.to_json()
    assert [s["site"] for s in doc["sites"]] == ["resid_post[1]", "resid_post[2]"]
    kernel = doc["sites"][0]["kernels"][0]
    assert kernel["interventions"] == [{"name": "push", "line": 13, "source": "add gain * v"}]
    assert kernel["gate"]["condition"] == "p > 0.1"
    assert doc["sites"][0]["hook"] == {"module": "model.layers.1", "hook": "post", "tensor": "output"}
    text = render(doc)
    assert text.startswith("good.steer on llama (4 layers, hidden 4, 2 heads of 2) for target hf\n")
    assert explain(result, "vllm")["sites"][0]["hook"]["tensor"] == "fused_pair"
    assert capsys.readouterr() == ("", "")


def test_loads_relative_to_base_dir(no_writes):
    ex = examples_path()
    if not os.path.isdir(ex):
        pytest.skip("no shared examples")
    text = 'steer 1\nvector joy = load("vectors/tiny.safetensors", key="joy")\n' \
           'intervention a {\n  at resid_post[1]\n  add joy\n}\n'
    result = check_source(text, options=Options(base_dir=ex, root=ex), facts=load_facts(os.path.join(ex, "models",
                                                                                                      "tiny-llama")))
    assert result.ok, result.render()
    assert result.plan.sites[0].kernels[0].op.bias.width == 64
    escape = check_source(text.replace("vectors/", "../"), options=Options(base_dir=ex, root=ex))
    assert [d.code for d in escape.diagnostics] == ["path-escape"]


def test_check_file_uses_the_file_and_a_display_name():
    ex = examples_path()
    path = os.path.join(ex, "01_add.steer")
    if not os.path.isfile(path):
        pytest.skip("no shared examples")
    result = check_file(path, name="01_add.steer")
    assert result.ok and result.source.name == "01_add.steer" and result.source.path == os.path.abspath(path)
    with pytest.raises(OSError):
        check_file(os.path.join(ex, "no-such-file.steer"))


def test_syntax_errors_have_no_checked_program():
    result = check_source("steer 1\nintervention {\n")
    assert result.program is None and result.checked is None
    assert [d.code for d in result.diagnostics] == ["syntax-error"]


def test_gc_state_is_restored():
    assert gc.isenabled()
    check_source(GOOD, facts=FACTS)
    check_source("steer 1\nintervention {\n")
    assert gc.isenabled()
    gc.disable()
    try:
        check_source(GOOD)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_check_pipeline_is_a_visible_tuple():
    assert [p.name for p in CHECK_PASSES] == ["structure", "names", "types", "fold", "request", "causality", "constraints",
                                             "unused"]


def test_the_compiler_core_imports_no_torch():
    code = (
        "import sys\n"
        "from steerc.api import check_source\n"
        "from steerc.explain.plan import explain\n"
        "from steerc.facts import facts_from_config\n"
        "from steerc.targets import check_target\n"
        "f = facts_from_config({'model_type': 'llama', 'num_hidden_layers': 2, 'hidden_size': 4,"
        " 'num_attention_heads': 2})\n"
        "r = check_source('steer 1\\nintervention a {\\n  at resid_post[0]\\n  scale 2\\n}\\n', facts=f)\n"
        "check_target(r, 'vllm'); explain(r)\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
