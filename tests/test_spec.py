"""The spec (``spec/*.md``) stays true to the implementation.

* ``spec/grammar.md`` quotes ``steerc/frontend/steer.lark`` byte for byte;
* ``spec/diagnostics.md`` has a section for every code in the registry, with
  its severity, and each ``steer`` example there reports its section's code;
* complete programs in ``spec/language.md`` check without errors;
* the generated tables (site tables and family facts in ``spec/models.md``,
  IR node fields in ``spec/json.md``, token classes in
  ``spec/highlighting.md``) are fresh.

Regenerate the tables after changing the code they come from::

    python tests/test_spec.py --write
"""

from __future__ import annotations

import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SPEC = os.path.join(REPO, "spec")
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Codes whose examples need the output-constraint checkers.
CONSTRAINT_CODES = {"invalid-constraint", "unsupported-schema-keyword"}


def examples_dir() -> str:
    return os.path.join(REPO, "tests", "fixtures", "examples")


def read_spec(name: str) -> str:
    with open(os.path.join(SPEC, name), encoding="utf-8") as fh:
        return fh.read()


# ------------------------------------------------------------ generated tables


def _hook_cell(hook) -> str:
    return f"`{hook.module}` ({hook.kind}, {hook.tensor})"


def render_site_tables() -> str:
    """The per-backend site tables of ``spec/models.md``, from :mod:`steerc.facts.sites`."""
    from collections import Counter

    from steerc.facts.sites import TABLES

    out: list[str] = []
    for backend, tables in TABLES.items():
        common = Counter(t.read_from for t in tables.values()).most_common(1)[0][0]
        out.append(f"### Backend `{backend}`\n")
        out.append(f"Read from {common}. A cell is `module` (hook kind, tensor); `{{l}}` is the layer.\n")
        out.append("| family | decoder layers | final norm | `resid_pre[0]` | `resid_post[l]` "
                   "| `attn_out[l]` | `mlp_out[l]` | `head[l, h]` |")
        out.append("|---|---|---|---|---|---|---|---|")
        for fam, t in tables.items():
            cells = [f"`{fam}`", f"`{t.layers}`", f"`{t.final_norm}`"]
            cells += [_hook_cell(h) for h in (t.resid_pre0, t.resid_post, t.attn_out, t.mlp_out, t.head)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        notes: dict[str, list[str]] = {}  # note -> families, in order of first appearance
        for fam, t in tables.items():
            extra = [] if t.read_from == common else [f"read from {t.read_from}"]
            for note in extra + list(t.notes):
                notes.setdefault(note, []).append(f"`{fam}`")
        if notes:
            out.append("Notes:\n")
            out.extend(f"- {', '.join(fams)}: {note}" for note, fams in notes.items())
            out.append("")
    return "\n".join(out)


def _keys(keys, default=None) -> str:
    text = ", then ".join(f"`{k}`" for k in keys)
    if default is not None:
        return f"{text}, else {default}" if text else default
    return text


def render_family_table() -> str:
    """How each family's facts are read from ``config.json``, from :mod:`steerc.facts.families`."""
    from steerc.facts.families import FAMILIES

    out = [
        "| family | `model_type` | layers | hidden | heads | kv_heads | head_dim | intermediate | vocab "
        "| tied_embeddings | parallel_residual | block outputs | MLP |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES.values():
        head_dim = "`head_dim` if set, else hidden / heads" if f.head_dim_from_config else "hidden / heads"
        if f.parallel_residual_key:
            parallel = f"`{f.parallel_residual_key}`, else {str(f.parallel_residual_default).lower()}"
        else:
            parallel = str(f.parallel_residual_default).lower()
        if f.post_norms:
            block = "normed, then added"
        elif f.residual_scale_key:
            block = f"added times `{f.residual_scale_key}`"
        else:
            block = "added as they are"
        cells = [
            f"`{f.name}`",
            ", ".join(f"`{m}`" for m in f.model_types),
            _keys(f.layers),
            _keys(f.hidden),
            _keys(f.heads),
            _keys(f.kv_heads, "heads"),
            head_dim,
            _keys(f.intermediate, str(f.intermediate_default) if f.intermediate_default else "4 × hidden"),
            _keys(f.vocab, "0"),
            f"`tie_word_embeddings`, else {str(f.tied_default).lower()}",
            parallel,
            block,
            f"experts (`{f.experts_key}`)" if f.experts_key else "dense",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def render_ir_nodes() -> str:
    """The node classes of ``steerc parse --emit ir`` and their fields, from :mod:`steerc.ir.nodes`."""
    from steerc.core import record
    from steerc.ir.nodes import NODE_CLASSES

    out = ["| node | fields, in order |", "|---|---|"]
    for name, cls in NODE_CLASSES.items():
        fields = ", ".join(f"`{f.name}`" for f in record.fields(cls))
        out.append(f"| `{name}` | {fields} |")
    return "\n".join(out) + "\n"


def render_limits() -> str:
    from steerc.core.limits import render_table

    return render_table()


def render_token_classes() -> str:
    from steerc.highlight.words import render_table

    return render_table()


def render_capabilities() -> str:
    from steerc.targets.capabilities import capability_matrix

    return capability_matrix()


def render_families() -> str:
    from steerc.targets.families import family_matrix

    return family_matrix()


GENERATED = {
    ("models.md", "site-tables"): render_site_tables,
    ("models.md", "family-facts"): render_family_table,
    ("json.md", "ir-nodes"): render_ir_nodes,
    ("capabilities.md", "capabilities"): render_capabilities,
    ("capabilities.md", "families"): render_families,
    ("limits.md", "limits"): render_limits,
    ("highlighting.md", "token-classes"): render_token_classes,
}


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN GENERATED: {name} -->\n", f"<!-- END GENERATED: {name} -->"


def generated_block(text: str, name: str) -> str | None:
    begin, end = _markers(name)
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return text[i + len(begin) : j]


def write_generated() -> None:
    """Rewrite every generated block in place (``python tests/test_spec.py --write``)."""
    for (doc, name), render in GENERATED.items():
        path = os.path.join(SPEC, doc)
        text = read_spec(doc)
        begin, end = _markers(name)
        current = generated_block(text, name)
        if current is None:
            raise SystemExit(f"{doc}: no {begin.strip()} ... {end} markers")
        text = text.replace(begin + current + end, begin + render() + end, 1)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"rewrote {doc} [{name}]")


@pytest.mark.parametrize("doc,name", sorted(GENERATED))
def test_generated_tables_are_fresh(doc, name):
    block = generated_block(read_spec(doc), name)
    assert block is not None, f"spec/{doc} lacks the generated block {name}"
    assert block == GENERATED[(doc, name)](), (
        f"spec/{doc} [{name}] is stale: run `python tests/test_spec.py --write`"
    )


# --------------------------------------------------------------------- grammar


def test_grammar_block_is_the_grammar_file():
    from steerc.frontend.parser import GRAMMAR_PATH

    text = read_spec("grammar.md")
    blocks = re.findall(r"^```lark\n(.*?)^```$", text, re.S | re.M)
    assert len(blocks) == 1, "spec/grammar.md must have exactly one ```lark block"
    with open(GRAMMAR_PATH, encoding="utf-8", newline="") as fh:
        grammar = fh.read()
    assert blocks[0] == grammar, "spec/grammar.md does not quote steerc/frontend/steer.lark verbatim"


# ----------------------------------------------------------------- diagnostics

MODEL_MARK = re.compile(r"^<!--\s*model:\s*(\S+)\s*-->$")


def diagnostic_sections() -> dict[str, str]:
    """``## code`` heading -> the section's text."""
    text = read_spec("diagnostics.md")
    parts = re.split(r"^## (\S+)[ \t]*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def fenced_blocks(section: str) -> list[tuple[str, str, str | None]]:
    """(language, body, model) of each fenced block; model from a comment on the line above."""
    lines = section.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        mark = MODEL_MARK.match(lines[start - 1]) if start > 0 else None
        out.append((m.group(1), "\n".join(lines[start + 1 : i]) + "\n", mark.group(1) if mark else None))
        i += 1
    return out


def _steer_examples():
    cases = []
    for code, body in diagnostic_sections().items():
        n = 0
        for lang, text, model in fenced_blocks(body):
            if lang == "steer":
                n += 1
                cases.append(pytest.param(code, text, model, id=f"{code}-{n}"))
    return cases


def test_every_code_has_a_section():
    from steerc.diagnostics.codes import CODES

    sections = diagnostic_sections()
    missing = sorted(set(CODES) - set(sections))
    unknown = sorted(set(sections) - set(CODES))
    assert not missing, f"spec/diagnostics.md has no section for: {', '.join(missing)}"
    assert not unknown, f"spec/diagnostics.md documents unregistered codes: {', '.join(unknown)}"


def test_every_section_states_severity_and_has_an_example():
    from steerc.diagnostics.codes import CODES

    for code, body in diagnostic_sections().items():
        assert f"**Severity:** {CODES[code].severity}\n" in body, f"{code}: severity line missing or wrong"
        assert fenced_blocks(body), f"{code}: no example block"


def _check(text: str, model: str | None):
    from steerc.api import Options, check_source
    from steerc.facts import load_facts

    ex = os.path.abspath(examples_dir())
    if not os.path.isdir(ex):
        pytest.skip(f"shared examples not found at {ex}")
    facts = load_facts(os.path.join(ex, "models", model)) if model else None
    return check_source(
        text,
        "example.steer",
        path=os.path.join(ex, "example.steer"),
        options=Options(base_dir=ex, root=ex),
        facts=facts,
    )


def _needs_constraints(code: str | None, text: str) -> None:
    if code in CONSTRAINT_CODES or re.search(r"^\s*constrain\b", text, re.M):
        pytest.importorskip("steerc.constraints")


@pytest.mark.parametrize("code,text,model", _steer_examples())
def test_diagnostic_example_reports_its_code(code, text, model):
    from steerc.diagnostics.codes import CODES

    _needs_constraints(code, text)
    result = _check(text, model)
    found = {(d.code, d.severity) for d in result.diagnostics}
    assert (code, CODES[code].severity) in found, (
        f"example for {code} (model {model}) reported {sorted(found) or 'nothing'}:\n{result.render()}"
    )


# -------------------------------------------------------------------- language


def _language_programs():
    text = read_spec("language.md")
    blocks = re.findall(r"^```steer\n(.*?)^```$", text, re.S | re.M)
    return [pytest.param(b, id=f"program-{i + 1}") for i, b in enumerate(blocks) if b.startswith("steer 1\n")]


@pytest.mark.parametrize("text", _language_programs())
def test_language_programs_check_clean(text):
    _needs_constraints(None, text)
    result = _check(text, None)
    assert result.ok, result.render()
    result = _check(text, "tiny-llama")
    assert result.ok, result.render()


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_generated()
    else:
        raise SystemExit("usage: python tests/test_spec.py --write   (or run it with pytest)")
