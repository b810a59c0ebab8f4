"""steerc lsp's shortcuts give check's answers: the incremental parse (steerc/lsp/reparse.py) against full
parses (after any edit, the same IR, the same spans on every node, the same diagnostics), and a check without
the plan's fusion passes against a whole one."""

from __future__ import annotations

import glob
import os
import random

import pytest

from steerc.api import check
from steerc.core import record
from steerc.core.source import Source
from steerc.diagnostics import Diagnostics, to_json_dict
from steerc.frontend import parse
from steerc.ir.walk import walk
from steerc.lsp.reparse import Reparser
from steerc.passes.context import Options

# Edits a person makes while typing: a character, a word, a line, a block; some break the program.
SNIPPETS = ["1", "x", " ", "\n", "\n\n", "}", "{", "(", "]", "#", "# note\n", '"', "é😀", "2.5 * ", "joy",
            "param q = 3\n", "vector w = [1.0, 2.0, 3.0, 4.0]\n", "intervention z {\n  at resid_pre[0]\n  scale 2\n}\n",
            "  tokens generated\n", "\u2028", "\r\n"]


def spans(program) -> list:
    out = [(program.span, program.version_span)]
    for stmt in program.statements:
        for node in walk(stmt):
            out.append((type(node).__name__, *(getattr(node, f.name) for f in record.fields(type(node))
                                               if f.name.endswith("span"))))
    return out


def same_as_full(reparser: Reparser, text: str, folder: str) -> None:
    path = os.path.join(folder, "edited.steer")
    source = Source(path, text, path)
    got = check(source, Options(), None, parser=reparser)
    want = check(Source(path, text, path), Options(), None)
    assert [to_json_dict(d) for d in got.diagnostics] == [to_json_dict(d) for d in want.diagnostics]
    if want.program is not None:
        assert got.program == want.program
        assert spans(got.program) == spans(want.program)


def edit(rng: random.Random, text: str) -> str:
    if rng.random() < 0.5:
        return gentle_edit(rng, text)
    start = rng.randrange(len(text) + 1)
    end = min(len(text), start + rng.choice([0, 0, 1, 2, 5, 20]))
    return text[:start] + rng.choice(SNIPPETS + [""]) + text[end:]


def gentle_edit(rng: random.Random, text: str) -> str:
    """An edit that mostly keeps the program whole: a digit for a digit, a new line or a comment at a line's end."""
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    ends = [i for i, ch in enumerate(text) if ch == "\n"]
    if digits and rng.random() < 0.6:
        i = rng.choice(digits)
        return text[:i] + rng.choice("0123456789") + rng.choice(["", "", "5"]) + text[i + 1:]
    i = rng.choice(ends) if ends else len(text)
    return text[:i] + rng.choice(["\n", "  # a comment", "\n\n", "\nparam extra = 1"]) + text[i:]


def programs(examples_dir):
    paths = sorted(glob.glob(os.path.join(examples_dir, "*.steer")))
    return [(p, open(p, encoding="utf-8").read()) for p in paths]


@pytest.mark.parametrize("seed", range(4))
def test_random_edits_match_full_parses(examples_dir, seed):
    rng = random.Random(seed)
    for path, text in programs(examples_dir):
        reparser = Reparser()
        same_as_full(reparser, text, examples_dir)
        for _ in range(25):
            text = edit(rng, text) if rng.random() < 0.8 else open(path, encoding="utf-8").read()
            same_as_full(reparser, text, examples_dir)


def test_an_edit_inside_one_statement_keeps_the_others(examples_dir):
    lines = ["steer 1", ""] + [f"param p{i} = {i}" for i in range(50)] + [""]
    text = "\n".join(lines)
    reparser = Reparser()
    reparser(Source("x", text), Diagnostics())
    edited = text.replace("p25 = 25", "p25 = 250\n\n")
    program = reparser(Source("x", edited), Diagnostics())
    assert reparser.reused == 49
    assert program == parse(Source("x", edited))
    assert spans(program) == spans(parse(Source("x", edited)))


def test_errors_fall_back_to_a_full_parse():
    reparser = Reparser()
    text = "steer 1\nparam a = 1\nparam b = 2\n"
    reparser(Source("x", text), Diagnostics())
    broken = Diagnostics()
    assert reparser(Source("x", text.replace("b = 2", "b = ")), broken) is None
    assert [d.code for d in broken] == ["syntax-error"] and reparser.reused == 0
    fixed = reparser(Source("x", text.replace("b = 2", "b = 3")), Diagnostics())
    assert fixed.statements[1].value.value == 3 and reparser.reused == 1  # from the last clean parse
    fresh = Reparser()
    assert fresh(Source("x", "steer 1\nparam a =\n"), Diagnostics()) is None
    assert fresh(Source("x", text), Diagnostics()) is not None and fresh.reused == 0  # none to start from


@pytest.mark.parametrize("seed", range(3))
def test_answers_read_through_edits_point_at_the_same_text(examples_dir, seed):
    """Lookup (the last analysis that parsed, read through the edits since): at every offset of the edited
    text where it answers, the thing it finds and every span it moves spell in the new text what they spelled
    in the old, and no answer comes from text the edits changed."""
    from steerc.lsp.analysis import Analysis, Lookup

    rng = random.Random(seed)
    for path, text in programs(examples_dir):
        parsed = Analysis(check(Source(path, text, path), Options(), None))
        if parsed.program is None:
            continue
        new = text
        for _ in range(rng.choice([1, 2])):
            new = edit(rng, new)
        source = Source(path, new, path)
        for offset in range(0, len(new) + 1, 3):
            look = Lookup(parsed, source, offset)
            if look.offset is None:
                continue
            assert offset <= look.prefix or offset >= len(new) - look.suffix
            hit = parsed.at(look.offset)
            moved = look.span(hit.span) if hit is not None else None
            if moved is None:
                continue
            assert new[moved.start:moved.end] == text[hit.span.start:hit.span.end]
            assert source.span(moved.start, moved.end) == moved  # lines and columns of the new text
            found = parsed.symbol_at(look.offset)
            if found is not None:
                for span in [found[0].decl.name_span, *found[0].uses]:
                    there = look.span(span)
                    assert there is None or new[there.start:there.end] == found[0].name


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_leaving_out_fusion_changes_no_diagnostic(examples_dir, tiny_facts, model):
    paths = sorted(glob.glob(os.path.join(examples_dir, "*.steer")) + glob.glob(os.path.join(examples_dir, "bad",
                                                                                              "*.steer")))
    for path in paths + [None]:
        text = open(path, encoding="utf-8").read() if path else DEAD
        path = path or os.path.join(examples_dir, "dead.steer")
        whole = check(Source(path, text, path), Options(), tiny_facts(model))
        quick = check(Source(path, text, path), Options(), tiny_facts(model), fuse=False)
        assert [to_json_dict(d) for d in quick.diagnostics] == [to_json_dict(d) for d in whole.diagnostics]


# Kernels that drop-dead and drop-noops remove, next to ones fusion merges.
DEAD = """steer 1
vector v = load("vectors/tiny.safetensors", key="joy")
intervention a {
  at resid_post[1]
  add v
}
intervention b {
  at resid_post[1]
  set 2 * v
}
intervention c {
  at resid_post[2]
  scale 1
}
intervention d {
  at resid_post[2]
  add 2 * v
}
intervention e {
  at resid_post[2]
  add 3 * v
}
"""
