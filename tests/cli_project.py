"""A small project for command-line tests: a program over the tiny random Llama, eval items, contrastive
pairs and a text, in a folder with an empty steer.toml (test_cli_hostile.py, test_engine_seat.py)."""

from __future__ import annotations

import json

WIDTH = 64  # the tiny Llama's hidden size
VECTOR = "[" + ", ".join(f"{0.05 * ((i % 7) - 3):.2f}" for i in range(WIDTH)) + "]"
PROGRAM = f"steer 1\nparam strength = 4.0\nintervention push {{\n  at resid_post[1:3]\n  add strength * {VECTOR}\n}}\n"
ITEMS = '{"prompt": "Hi", "positive": " yes", "negative": " no"}\n{"text": "Rain falls on the town."}\n'
PAIRS = "".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in
                [("I love it", "I hate it"), ("Great day", "Awful day"), ("So happy", "So sad"),
                 ("Wonderful", "Terrible")])


def write_project(root):
    """``root`` made a project: steer.toml (empty), p.steer (PROGRAM), e.jsonl (ITEMS), pairs.jsonl (PAIRS),
    t.txt (two lines). Returns ``root``."""
    root.mkdir()
    (root / "steer.toml").write_text("")
    (root / "p.steer").write_text(PROGRAM)
    (root / "e.jsonl").write_text(ITEMS)
    (root / "pairs.jsonl").write_text(PAIRS)
    (root / "t.txt").write_text("The sun is out.\nRain again today.\n")
    return root


def tiny_folder(tmp_path_factory, name: str):
    """The tiny random Llama saved as a model folder."""
    from tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp(name))
