"""A slice end past the model is clipped, as in Python, and said (issue 32: `resid_post[28:32]` on a 30-layer
model passed `check` silently and steered 28-29; spec/language.md and spec/diagnostics.md disagreed)."""

from __future__ import annotations

import pytest

from steerc.api import Options, check_source
from steerc.facts import load_facts
from tests.support import examples_path


def _check(site: str):
    import os

    facts = load_facts(os.path.join(examples_path(), "models", "tiny-llama"))  # 4 layers, 4 heads
    text = f"steer 1\n\nintervention deep {{\n  at    {site}\n  scale 0.5\n}}\n"
    return check_source(text, "p.steer", options=Options(), facts=facts)


def _warnings(result):
    return [d for d in result.diagnostics if d.code == "slice-clipped"]


@pytest.mark.parametrize("site,steered", [
    ("resid_post[2:32]", "layers 2-3"),
    ("resid_post[-9:2]", "layers 0-1"),
    ("attn_out[1:5]", "layers 1-3"),
    ("head[0, 1:7]", "heads 1-3"),
])
def test_an_end_past_the_model_is_a_warning_naming_what_is_steered(site, steered):
    result = _check(site)
    assert result.ok
    [w] = _warnings(result)
    assert w.severity == "warning" and steered in w.message and "has 4" in w.message
    text = f"steer 1\n\nintervention deep {{\n  at    {site}\n  scale 0.5\n}}\n"
    shown = text[w.span.start:w.span.end]
    assert ":" in shown and "[" not in shown  # the caret is on the slice, not the whole site


@pytest.mark.parametrize("site", ["resid_post[2:4]", "resid_post[2:]", "resid_post[50%:100%]", "resid_post[-4:]",
                                  "resid_post[*]", "head[0, 1:4]", "resid_post[0:-1]"])
def test_a_slice_inside_the_model_or_open_is_not_reported(site):
    result = _check(site)
    assert result.ok and not _warnings(result), result.render()


def test_the_clipped_slice_steers_the_layers_python_gives():
    clipped, exact = _check("resid_post[2:32]"), _check("resid_post[2:4]")
    assert [s.site.layer for s in clipped.plan.sites] == [s.site.layer for s in exact.plan.sites] == [2, 3]
