"""``steerc eval`` checks (compiles) each point of its sweep once (issue 33: it compiled every point twice, once
against the config before the load and again against the loaded model, whose facts are the same)."""

from __future__ import annotations

import pytest
from support import run_cli

VECTOR = "[" + ", ".join(f"{0.05 * ((i % 7) - 3):.2f}" for i in range(64)) + "]"
PROGRAM = f"steer 1\nparam strength = 4.0\nintervention push {{\n  at resid_post[1:3]\n  add strength * {VECTOR}\n}}\n"
ITEMS = '{"prompt": "Hi", "positive": " yes", "negative": " no"}\n{"text": "Rain falls on the town."}\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-eval-once"))


def test_each_point_is_checked_once(tiny, tmp_path, monkeypatch):
    import steerc.api

    monkeypatch.chdir(tmp_path)
    (tmp_path / "steer.toml").write_text("")
    (tmp_path / "p.steer").write_text(PROGRAM)
    (tmp_path / "e.jsonl").write_text(ITEMS)
    calls = []
    real = steerc.api.check_source

    def counted(*args, **kwargs):
        calls.append(kwargs.get("options"))
        return real(*args, **kwargs)

    monkeypatch.setattr(steerc.api, "check_source", counted)
    code, out, err = run_cli(["eval", "p.steer", "--model", tiny, "--data", "e.jsonl", "--sweep", "strength=0:4:3",
                              "--format", "json"])
    assert code == 0, err
    assert len(calls) == 3  # one per point
    assert '"strength": 2.0' in out
