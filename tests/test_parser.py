"""The parser: every example parses, nodes know where they are, errors say what was expected."""

from __future__ import annotations

import glob
import os

import pytest
from support import examples_path, run_cli

from steerc.core.source import Source
from steerc.frontend import parse_source
from steerc.frontend.parser import get_parser, parse_tree
from steerc.ir import nodes as ir


def _example_files(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(examples_path(), pattern)))


def parse_ok(text: str, name: str = "t.steer") -> ir.Program:
    program, diagnostics = parse_source(text, name)
    assert program is not None and not diagnostics.items, [d.message for d in diagnostics]
    return program


def parse_error(text: str):
    """The one diagnostic of a text that does not parse."""
    program, diagnostics = parse_source(text, "t.steer")
    assert diagnostics.has_errors, f"expected a syntax error in {text!r}"
    assert len(diagnostics.items) == 1, [d.message for d in diagnostics]
    return diagnostics.items[0]


def col(line: str, needle: str, nth: int = 0) -> int:
    """1-based column of the ``nth`` occurrence of ``needle`` in ``line``."""
    at = -1
    for _ in range(nth + 1):
        at = line.index(needle, at + 1)
    return at + 1


# ------------------------------------------------------------ the examples


@pytest.mark.parametrize(
    "path",
    [p for p in _example_files("*.steer") + _example_files("bad/*.steer")
     if not p.endswith("syntax_missing_brace.steer")],
    ids=os.path.basename,
)
def test_every_example_parses(path, examples_dir):
    with open(path, encoding="utf-8") as fh:
        program = parse_ok(fh.read(), path)
    assert program.version in (1, 2)
    assert program.span is not None and program.version_span is not None


def test_examples_are_present(examples_dir):
    assert len(_example_files("*.steer")) >= 12
    assert len(_example_files("bad/*.steer")) >= 19


# ---------------------------------------------------------------- positions


def _load(examples_dir, name):
    path = os.path.join(examples_dir, name)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return text, text.split("\n"), parse_ok(text, name)


def test_positions_in_01_add(examples_dir):
    text, lines, p = _load(examples_dir, "01_add.steer")
    assert p.version_span.as_tuple() == (1, 7, 1, 8)
    vec, iv = p.statements
    l4 = lines[3]
    assert vec.span.as_tuple() == (4, 1, 4, len(l4) + 1)
    assert vec.name_span.as_tuple() == (4, col(l4, "joy"), 4, col(l4, "joy") + 3)
    call = vec.value
    assert isinstance(call, ir.Call) and call.func == "load"
    assert call.func_span.as_tuple() == (4, col(l4, "load"), 4, col(l4, "load") + 4)
    assert call.span.as_tuple() == (4, col(l4, "load"), 4, len(l4) + 1)
    path = call.args[0]
    assert path.span.as_tuple() == (4, col(l4, '"vectors'), 4, col(l4, '"vectors') + len('"vectors/tiny.safetensors"'))
    key = call.kwargs[0]
    assert key.span.as_tuple() == (4, col(l4, "key="), 4, len(l4))

    assert iv.span.as_tuple() == (6, 1, 10, 2)
    assert iv.name_span.as_tuple() == (6, 14, 6, 22)
    l7, l8, l9 = lines[6], lines[7], lines[8]
    assert iv.site.span.as_tuple() == (7, col(l7, "resid_post"), 7, len(l7) + 1)
    assert iv.site.name_span.as_tuple() == (7, col(l7, "resid_post"), 7, col(l7, "resid_post") + 10)
    (sl,) = iv.site.items
    assert sl.span.as_tuple() == (7, col(l7, "1:3"), 7, col(l7, "1:3") + 3)
    assert sl.start.span.as_tuple() == (7, col(l7, "1:3"), 7, col(l7, "1:3") + 1)
    assert iv.op.span.as_tuple() == (8, 3, 8, len(l8) + 1)
    product = iv.op.vector
    assert product.span.as_tuple() == (8, col(l8, "4.0"), 8, len(l8) + 1)
    assert product.left.span.as_tuple() == (8, col(l8, "4.0"), 8, col(l8, "4.0") + 3)
    assert product.right.span.as_tuple() == (8, col(l8, "joy"), 8, col(l8, "joy") + 3)
    assert iv.scopes[0].span.as_tuple() == (9, col(l9, "generated"), 9, len(l9) + 1)


def test_positions_of_head_selectors_and_gates(examples_dir):
    _, lines, p = _load(examples_dir, "06_heads.steer")
    knockout = p.statements[0]
    l5 = lines[4]
    layer, heads = knockout.site.items
    assert layer.span.as_tuple() == (5, col(l5, "1"), 5, col(l5, "1") + 1)
    assert heads.span.as_tuple() == (5, col(l5, "0:2"), 5, col(l5, "0:2") + 3)
    _, lines, p = _load(examples_dir, "12_per_token_gate.steer")
    iv = p.of_type(ir.InterventionDecl)[0]
    gate_line = next(n for n, line in enumerate(lines, 1) if line.strip().startswith("when"))
    text = lines[gate_line - 1]
    assert isinstance(iv.gate, ir.GateAnd)
    assert iv.gate.span.as_tuple() == (gate_line, col(text, "sarcastic"), gate_line, len(text) + 1)
    assert iv.gate.right.span.as_tuple() == (gate_line, col(text, "not"), gate_line, len(text) + 1)


def test_spans_exclude_from_equality():
    a = parse_ok("steer 1\nparam g = 2\n")
    b = parse_ok("\n\nsteer   1\n\n\nparam    g=2   # moved\n")
    assert a == b and hash(a) == hash(b)
    assert a.statements[0].span != b.statements[0].span


def test_multiline_spans():
    p = parse_ok("steer 1\nvector v = [1,\n  2,\n  3]\n")
    (vec,) = p.statements
    assert vec.value.span.as_tuple() == (2, 12, 4, 5)
    assert vec.value.items[2].span.as_tuple() == (4, 3, 4, 4)


# ---------------------------------------------------------------- comments


def test_comments_are_captured_with_own_line_flags():
    text = ("# top\nsteer 1  # header\n\n  # indented own line\nparam g = 2 # trailing\n"
            "intervention x {  # head\n  at resid_pre[0]\n  # inside\n  scale g\n}\n# last")
    p = parse_ok(text)
    got = [(c.line, c.column, c.text, c.own_line) for c in p.comments]
    assert got == [
        (1, 1, "# top", True),
        (2, 10, "# header", False),
        (4, 3, "# indented own line", True),
        (5, 13, "# trailing", False),
        (6, 19, "# head", False),
        (8, 3, "# inside", True),
        (11, 1, "# last", True),
    ]


def test_comments_inside_brackets_are_kept():
    p = parse_ok("steer 1\nvector v = [1,  # first\n  2]  # done\n")
    assert [(c.line, c.text, c.own_line) for c in p.comments] == [(2, "# first", False), (3, "# done", False)]
    assert len(p.statements[0].value.items) == 2


def test_example_comment(examples_dir):
    _, lines, p = _load(examples_dir, "01_add.steer")
    (c,) = p.comments
    assert (c.line, c.column, c.own_line) == (3, 1, True)
    assert c.text == lines[2]


def test_hash_inside_a_string_is_not_a_comment():
    p = parse_ok('steer 1\nconstrain regex "a#b"  # real\n')
    assert p.statements[0].value.value == "a#b"
    assert [c.text for c in p.comments] == ["# real"]


# ------------------------------------------------------------------ strings


def test_triple_quoted_strings_are_raw_and_span_lines():
    p = parse_ok('steer 1\nconstrain json_schema """{"a":\n  "b\\d\\n"}"""\n')
    s = p.statements[0].value
    assert s.long is True
    assert s.value == '{"a":\n  "b\\d\\n"}'
    assert s.span.as_tuple() == (2, 23, 3, 14)


def test_escapes_in_normal_strings():
    p = parse_ok('steer 1\nconstrain regex "q\\"b\\\\s\\/d\\b\\f\\n\\r\\t\\u00e9\\u0041"\n')
    assert p.statements[0].value.value == 'q"b\\s/d\b\f\n\r\t\u00e9A'


def test_unknown_escape_is_a_syntax_error_at_the_backslash():
    d = parse_error('steer 1\nconstrain regex "ab\\dc"\n')
    assert d.code == "syntax-error"
    line = 'constrain regex "ab\\dc"'
    assert d.span.as_tuple() == (2, col(line, "\\"), 2, col(line, "\\") + 2)
    assert "\\d" in d.message
    assert d.help and "\\\\" in d.help


@pytest.mark.parametrize("escape", ["\\u12", "\\u12g4", "\\x41", "\\U0001"])
def test_malformed_escapes(escape):
    d = parse_error(f'steer 1\nconstrain regex "a{escape}"\n')
    assert d.code == "syntax-error" and d.span.line == 2


def test_unterminated_string():
    d = parse_error('steer 1\nvector v = load("vectors/x.npy)\n')
    assert d.code == "syntax-error"
    assert "unterminated string" in d.message
    assert d.span.as_tuple()[:2] == (2, col('vector v = load("vectors/x.npy)', '"'))
    assert d.help


def test_unterminated_string_at_end_of_file():
    d = parse_error('steer 1\nconstrain regex "abc')
    assert "unterminated string" in d.message and d.span.line == 2


def test_unterminated_triple_quoted_string():
    d = parse_error('steer 1\nconstrain regex """abc\ndef\n')
    assert d.code == "syntax-error"
    assert "unterminated" in d.message
    assert d.span.line == 2


# ---------------------------------------------------------------- layout


def test_newlines_inside_parentheses_and_brackets_are_ignored():
    text = """steer 1
vector v = [1.0,
            2.0,
]
vector w = load(
  "vectors/tiny.safetensors",
  key="joy"
)
probe p {
  at   resid_pre[0]
  read cosine(v
  )
  pool token
}
intervention x {
  at head[(1,
           3),
          0:2]
  add (2.0 *
       v)
  tokens [0,
          1]
  when (p > 1 and
        p < 2)
}
"""
    p = parse_ok(text)
    v, w, probe, iv = p.statements
    assert len(v.value.items) == 2
    assert w.value.kwargs[0].value.value == "joy"
    assert isinstance(probe.readout, ir.Cosine)
    assert iv.site.items[0] == ir.SelGroup((ir.SelIndex(1), ir.SelIndex(3)))
    assert iv.scopes == (ir.ScopePositions((0, 1)),)
    assert isinstance(iv.gate, ir.GateAnd)


def test_newline_outside_brackets_ends_the_line():
    d = parse_error("steer 1\nparam x = 1 +\n  2\n")
    assert d.code == "syntax-error"
    assert d.span.line == 2
    assert "unexpected end of line" in d.message


def test_crlf_and_blank_lines_parse_like_lf():
    lf = "steer 1\n\n\nparam g = 2  # c\nintervention x {\n  at resid_pre[0]\n\n  scale g\n}\n"
    assert parse_ok(lf.replace("\n", "\r\n")) == parse_ok(lf)
    assert [c.text for c in parse_ok(lf.replace("\n", "\r\n")).comments] == ["# c"]


def test_a_file_without_final_newline_parses():
    assert parse_ok("steer 1\nparam g = 2") == parse_ok("steer 1\nparam g = 2\n")


def test_block_lines_in_any_order():
    a = parse_ok("steer 1\nintervention x {\n  at resid_pre[0]\n  scale 2\n  tokens prompt\n}\n")
    b = parse_ok("steer 1\nintervention x {\n  tokens prompt\n  scale 2\n  at resid_pre[0]\n}\n")
    assert a == b


# ------------------------------------------------------------------- trees


def test_every_construct_builds_its_node():
    p = parse_ok("""steer 1
model {
  family = "llama"
  layers = 4
  tied_embeddings = false
  vocab = -1
}
param a = -(1 + 2) * 3 / 4 - 5
vector v = normalize([1, 2e-3, .5, 30deg])
vector w = load("f.safetensors", key="k", per_layer=true)
probe p {
  at   head[-1, 50%]
  read dot(v) + 0.5 - a
  pool prompt.last
}
probe q {
  at   resid_post[0]
  read projected_cosine(v, w)
  pool token
}
intervention x {
  at     resid_pre[1:3, -2:, :1, *, 25%:75%, 0]
  rotate in (v, w) by 30deg
  tokens prompt[-3:], generated[:8], generated[2], [0, 1], after "A:", all
  when   not p > a or 0.5 <= q and (p < 1)
  preserve norm
}
intervention y {
  at    mlp_out[0]
  clamp v to -a
}
intervention z {
  at     attn_out[1]
  ablate v, w
}
constrain choice ["yes", "no",]
""")
    model, a, v, w, probe_p, probe_q, x, y, z, choice = p.statements
    assert [f.value for f in model.fields] == [ir.Str("llama"), ir.Number(4), ir.Bool(False), ir.Number(-1)]
    assert a.value == ir.BinOp(
        "-",
        ir.BinOp("/", ir.BinOp("*", ir.Neg(ir.BinOp("+", ir.Number(1), ir.Number(2))), ir.Number(3)), ir.Number(4)),
        ir.Number(5),
    )
    literal = ir.VectorLit((ir.Number(1), ir.Number(0.002), ir.Number(0.5), ir.Degrees(30)))
    assert v.value == ir.Call("normalize", (literal,))
    assert w.value.kwargs == (ir.Keyword("key", ir.Str("k")), ir.Keyword("per_layer", ir.Bool(True)))
    assert probe_p.site == ir.SiteRef("head", (ir.SelIndex(-1), ir.SelPercent(50.0)))
    assert probe_p.readout == ir.Dot(ir.Name("v"), (ir.Offset("+", ir.Number(0.5)), ir.Offset("-", ir.Name("a"))))
    assert probe_p.pool == ir.Pool("prompt.last")
    assert probe_q.readout == ir.ProjectedCosine((ir.Name("v"), ir.Name("w")))
    assert x.site.items == (
        ir.SelSlice(ir.SelIndex(1), ir.SelIndex(3)),
        ir.SelSlice(ir.SelIndex(-2), None),
        ir.SelSlice(None, ir.SelIndex(1)),
        ir.SelAll(),
        ir.SelSlice(ir.SelPercent(25.0), ir.SelPercent(75.0)),
        ir.SelIndex(0),
    )
    assert x.op == ir.Rotate(ir.Name("v"), ir.Name("w"), "by", ir.Degrees(30))
    assert x.scopes == (
        ir.ScopePrompt(ir.PosSlice(-3, None)),
        ir.ScopeGenerated(ir.PosSlice(None, 8)),
        ir.ScopeGenerated(ir.PosIndex(2)),
        ir.ScopePositions((0, 1)),
        ir.ScopeAfter(ir.Str("A:")),
        ir.ScopeAll(),
    )
    # `not` binds tighter than `and`, which binds tighter than `or`.
    assert x.gate == ir.GateOr(
        ir.GateNot(ir.Compare(ir.Name("p"), ">", ir.Name("a"))),
        ir.GateAnd(ir.Compare(ir.Number(0.5), "<=", ir.Name("q")), ir.Compare(ir.Name("p"), "<", ir.Number(1))),
    )
    assert x.preserve == ir.Preserve()
    assert y.op == ir.Clamp(ir.Name("v"), ir.Neg(ir.Name("a")))
    assert z.op == ir.Ablate((ir.Name("v"), ir.Name("w")))
    assert choice == ir.ConstrainChoice((ir.Str("yes"), ir.Str("no")))


def test_number_spelling_is_kept_but_not_compared():
    p = parse_ok("steer 1\nparam a = 2.50\nparam b = 1e3\nparam c = 7\n")
    a, b, c = (s.value for s in p.statements)
    assert (a.value, a.text) == (2.5, "2.50")
    assert (b.value, b.text) == (1000.0, "1e3")
    assert (c.value, c.text) == (7, "7") and isinstance(c.value, int)
    assert a == ir.Number(2.5)


@pytest.mark.parametrize(
    "text",
    [
        "steer 1\nconstrain json_schema from \"s.json\"\n",
        "steer 1\nconstrain json_schema \"{}\"\n",
        "steer 1\nconstrain regex from \"r.txt\"\n",
        "steer 1\nconstrain grammar from \"g.ebnf\"\n",
        "steer 1\nconstrain grammar \"\"\"root ::= \"a\" \"\"\"\n",
    ],
)
def test_constraint_forms(text):
    (c,) = parse_ok(text).statements
    assert isinstance(c, ir.ConstrainText)
    assert c.from_file == ("from" in text)


def test_duplicate_block_lines_are_reported_by_the_frontend():
    text = "steer 1\nintervention x {\n  at resid_pre[0]\n  add v\n  set v\n  at resid_pre[1]\n}\n"
    program, diagnostics = parse_source(text)
    assert program is not None
    got = [(d.code, d.span.line) for d in diagnostics]
    assert got == [("duplicate-field", 5), ("duplicate-field", 6)]
    assert all(d.notes and d.notes[0].span is not None for d in diagnostics)
    # the first line of each kind wins
    iv = program.statements[0]
    assert iv.op == ir.Add(ir.Name("v")) and iv.site.items == (ir.SelIndex(0),)


# ----------------------------------------------------------- syntax errors


def test_missing_brace_example(examples_dir):
    path = os.path.join(examples_dir, "bad", "syntax_missing_brace.steer")
    with open(path, encoding="utf-8") as fh:
        d = parse_error(fh.read())
    assert d.code == "syntax-error" and d.severity == "error"
    assert (d.span.line, d.span.column) == (10, 1)
    assert "`intervention`" in d.message and "`}`" in d.message
    (note,) = d.notes
    assert "not closed" in note.message
    assert (note.span.line, note.span.column) == (6, 23)
    assert d.help and "}" in d.help


@pytest.mark.parametrize(
    "text, line, column, fragments",
    [
        ("param x = 1\n", 1, 1, ["`param`", "`steer`"]),
        ("", 1, 1, ["unexpected end of file", "`steer`"]),
        ("# only a comment\n", 2, 1, ["unexpected end of file", "`steer`"]),
        ("steer\n", 1, 6, ["whole number"]),
        ("steer 1 param x = 1\n", 1, 9, ["`param`", "new line"]),
        ("steer 1\nvector = 1\n", 2, 8, ["`=`", "a name"]),
        ("steer 1\nparam x 1\n", 2, 9, ["`1`", "`=`"]),
        ("steer 1\nparam x = 1 $\n", 2, 13, ["character `$`"]),
        ("steer 1\nparam x = * 2\n", 2, 11, ["`*`", "a number"]),
        ("steer 1\nintervention x {\n  at resid_pre[0\n}\n", 4, 1, ["`}`", "`]`"]),
        ("steer 1\nintervention x {\n  at resid_pre[0]\n  add v\n", 5, 1, ["unexpected end of file", "`}`"]),
        ("steer 1\nintervention x {\n  when p > 1 and\n}\n", 3, 17, ["unexpected end of line", "`not`"]),
        ("steer 1\nintervention x {\n  at resid_pre[0]\n  rotate in (a, b) v\n}\n", 4, 20, ["`v`", "`by`", "`to`"]),
        ("steer 1\nprobe p {\n  pool prompt.\n}\n", 3, 15, ["a name"]),
        ("steer 1\nconstrain choice [\"a\" \"b\"]\n", 2, 23, ["unexpected string", "`,`"]),
        ("steer 1\nmodel {\n  layers = x\n}\n", 3, 12, ["`x`"]),
    ],
)
def test_syntax_errors_point_at_the_first_bad_token(text, line, column, fragments):
    d = parse_error(text)
    assert d.code == "syntax-error"
    assert (d.span.line, d.span.column) == (line, column), d.message
    for fragment in fragments:
        assert fragment in d.message, (fragment, d.message)


def test_missing_header_has_help():
    d = parse_error("param x = 1\n")
    assert d.help and "steer 1" in d.help


def test_unclosed_parenthesis_is_not_blamed_on_the_block():
    d = parse_error("steer 1\nprobe p {\n  at resid_pre[0]\n  read cosine(v\n  pool token\n}\n")
    assert (d.span.line, d.span.column) == (5, 3)
    assert "`)`" in d.message
    assert not (d.help or "").startswith("add `}`"), d.help


def test_two_lines_on_one_line_do_not_claim_an_unclosed_block():
    d = parse_error("steer 1\nintervention x {\n  at resid_pre[0] add v\n}\n")
    assert (d.span.line, d.span.column) == (3, 19)
    assert "new line" in d.message
    assert not any("not closed" in n.message for n in d.notes)


def test_a_syntax_error_gives_no_program():
    program, diagnostics = parse_source("steer 1\nparam = \n")
    assert program is None and [d.code for d in diagnostics] == ["syntax-error"]


# ------------------------------------------------------------ --emit ast


def test_emit_ast(examples_dir):
    code, out, err = run_cli(["parse", os.path.join(examples_dir, "06_heads.steer"), "--emit", "ast"])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "start"
    assert lines[1].split() == ["header", "1"]
    for word in ("intervention_decl", "knockout", "boost", "at_line", "site", "sel_slice", "scale_op"):
        assert any(line.strip().split("\t")[0] == word or line.strip() == word for line in lines), word
    with open(os.path.join(examples_dir, "06_heads.steer"), encoding="utf-8") as fh:
        tree, _ = parse_tree(Source("06_heads.steer", fh.read()))
    assert out == tree.pretty()


def test_emit_ast_reports_syntax_errors(examples_dir):
    path = os.path.join(examples_dir, "bad", "syntax_missing_brace.steer")
    code, out, err = run_cli(["parse", path, "--emit", "ast"])
    assert code == 1 and out == ""
    assert "error[syntax-error]" in err and ":10:1" in err


def test_emit_ast_from_stdin():
    code, out, err = run_cli(["parse", "-", "--emit", "ast"], stdin="steer 1\nparam g = 2\n")
    assert code == 0
    assert out.splitlines()[:3] == ["start", "  header\t1", "  param_decl"]


def test_parser_is_cached():
    assert get_parser() is get_parser()


# ------------------------------------------------------- the stored LALR tables


def test_the_stored_tables_are_of_this_grammar():
    """steer.tables.json was built from steer.lark as it is now; regenerate: python -m steerc.frontend.tables."""
    from steerc.frontend import tables

    stored = tables.read_tables()
    assert stored is not None, f"{tables.TABLES_PATH} is missing or unreadable"
    assert stored["grammar_sha256"] == tables.grammar_sha256(), "regenerate: python -m steerc.frontend.tables"


def test_the_stored_tables_parse_as_the_grammar_does(examples_dir):
    """The parser loaded from the stored tables gives every example the tree a parser built from the
    grammar gives it, token for token, positions included."""
    from steerc.frontend import tables
    from steerc.frontend.parser import _Layout

    stored, built = tables.load(_Layout()), tables.build(_Layout())
    assert stored.parser is not built.parser
    paths = sorted(glob.glob(os.path.join(examples_dir, "**", "*.steer"), recursive=True))
    assert len(paths) > 20
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            want = built.parse(text)
        except Exception as exc:  # noqa: BLE001 - a bad example must fail the same way
            with pytest.raises(type(exc)):
                stored.parse(text)
            continue
        assert stored.parse(text) == want, path


def test_unreadable_tables_fall_back_to_the_grammar(tmp_path, monkeypatch):
    from steerc.frontend import tables

    bad = tmp_path / "steer.tables.json"
    bad.write_text('{"grammar_sha256": "x", "data": [1]}', encoding="utf-8")
    monkeypatch.setattr(tables, "TABLES_PATH", str(bad))
    assert tables.read_tables() is None
    assert tables.load(None).parse("steer 1\n") is not None


# ------------------------------------------------------ keyword typos and names outside ASCII


@pytest.mark.parametrize("text, word, meant", [
    ("steer 1\nvector v = [1.0]\nintervention x {\n  at resid_pre[0]\n  ad v\n}\n", "ad", "add"),
    ("steer 1\nintervention x {\n  at resid_pre[0]\n  scale 2\n  tokenz generated\n}\n", "tokenz", "tokens"),
    ("steer 1\nintervension x {\n  at resid_pre[0]\n  scale 2\n}\n", "intervension", "intervention"),
    ("steer 1\nvectr v = [1.0]\n", "vectr", "vector"),
    ("steer 1\nprobe p {\n  at resid_post[1]\n  raed norm\n  pool prompt.mean\n}\n", "raed", "read"),
])
def test_a_keyword_typo_gets_a_suggestion(text, word, meant):
    d = parse_error(text)
    assert d.code == "syntax-error" and f"unexpected `{word}`" in d.message
    assert d.help == f"did you mean `{meant}`?", d
    assert text[d.span.start:d.span.end] == word


def test_a_word_far_from_every_keyword_gets_no_suggestion():
    d = parse_error("steer 1\nintervention x {\n  at resid_pre[0]\n  zzzz v\n}\n")
    assert "did you mean" not in (d.help or "")


@pytest.mark.parametrize("name, help", [
    ("joië", "write `joie`"),
    ("été", "write `ete`"),
    ("жук", "rename it with ASCII letters, digits and `_` (text in strings may use any character)"),
])
def test_a_name_outside_ascii_says_what_a_name_may_hold(name, help):
    text = f"steer 1\nvector {name} = [1.0]\n"
    d = parse_error(text)
    assert d.code == "syntax-error" and f"in `{name}`" in d.message
    assert "a name holds ASCII letters (a-z, A-Z), digits and `_`" in d.message and d.help == help
    assert not text[d.span.start].isascii() and d.span.end - d.span.start == 1


def test_any_character_in_a_string_stays_fine():
    parse_ok('steer 1\nvector v = load("jöy.safetensors")\n')
