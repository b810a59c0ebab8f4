"""The program strategies reach every construct of the language (so the properties mean something)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from strategies import commented, mutated, programs

from steerc.ir import nodes as ir
from steerc.ir.walk import walk


def _features(p: ir.Program) -> Counter:
    seen: Counter = Counter()
    for node in walk(p):
        seen[type(node).__name__] += 1
        if isinstance(node, ir.SelIndex) and node.index < 0:
            seen["negative index"] += 1
        elif isinstance(node, ir.SelSlice):
            seen["open slice" if node.start is None or node.stop is None else "closed slice"] += 1
            if isinstance(node.start, ir.SelPercent) or isinstance(node.stop, ir.SelPercent):
                seen["percent slice"] += 1
        elif isinstance(node, ir.SiteRef) and node.name != "head" and len(node.items) > 1:
            seen["layer list"] += 1
        elif isinstance(node, ir.Rotate):
            seen[f"rotate {node.mode}"] += 1
        elif isinstance(node, ir.Compare):
            seen["probe on the left" if isinstance(node.left, ir.Name) and node.left.id in _probes(p)
                 else "probe on the right"] += 1
        elif isinstance(node, ir.InterventionDecl) and node.scopes and len(node.scopes) > 1:
            seen["scope union"] += 1
        elif isinstance(node, ir.ConstrainText):
            seen[f"{node.kind} {'from' if node.from_file else 'inline'}"] += 1
        elif isinstance(node, ir.Str) and node.long:
            seen["long string"] += 1
        elif isinstance(node, ir.Call):
            seen[f"call {node.func}"] += 1
    return seen


def _probes(p: ir.Program) -> set[str]:
    return {s.name for s in p.of_type(ir.ProbeDecl)}


EXPECTED = (set(ir.NODE_CLASSES) - {"Comment", "Program"}) | {
    "negative index", "open slice", "closed slice", "percent slice", "layer list", "rotate to", "rotate by",
    "probe on the left", "probe on the right", "scope union", "long string", "call load", "call normalize",
} | {f"{k} {w}" for k in ("json_schema", "regex", "grammar") for w in ("from", "inline")}


def test_programs_reach_every_construct():
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(programs(with_loads=True))
    def collect(p):
        names = [s.name for s in p.statements if hasattr(s, "name")]
        assert len(names) == len(set(names))
        seen.update(_features(p))

    collect()
    # The rare ones (if any): look for each on its own.
    search = settings(max_examples=3000, deadline=None, database=None, phases=[Phase.generate])
    for feature in sorted(EXPECTED - seen):
        try:
            find(programs(with_loads=True), lambda p, f=feature: f in _features(p), settings=search)
        except NoSuchExample:
            pytest.fail(f"the strategies never draw {feature}")


@settings(max_examples=20, deadline=None, database=None)
@given(st.data())
def test_commented_adds_the_comments_it_reports(data):
    text = "steer 1\nparam g = 1\n"
    new, added = data.draw(commented(text))
    assert all(c.startswith("#") and "\n" not in c for c in added)
    assert new.count("#") >= len(added)


@settings(max_examples=20, deadline=None, database=None)
@given(st.data())
def test_mutated_changes_text(data):
    text = "steer 1\nparam g = 1\n"
    assert isinstance(data.draw(mutated(text)), str)
