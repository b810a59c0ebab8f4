"""The Pygments lexer agrees with steerc's own lexer, and the word classes with the grammar.

* every keyword of ``steer.lark`` is in one class of
  :mod:`steerc.highlight.words`, every other terminal has a class in
  ``highlight_support.TERMINAL_CLASSES``, and the builtin names are the
  checker's: nothing the grammar or the checker adds can go uncoloured;
* on every ``.steer`` file (the shared examples, ``examples/``, the corpus
  under ``tests/``), on programs where keywords stand as names, and on
  random well-formed programs with comments, each character's Pygments
  token agrees with the class steerc's Lark lexer gives it, and each name
  and keyword is one Pygments token, with no ``Error`` token and the text
  round-tripping;
* on arbitrary text the lexer never raises and round-trips;
* Pygments finds the lexer by name, file name and mimetype through the
  ``pygments.lexers`` entry point that ``pyproject.toml`` declares.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pygments = pytest.importorskip("pygments", reason="the highlight extra (pygments) is not installed")

import highlight_support as H  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pygments.token import Comment, Error, Number, String, Text, Whitespace, string_to_tokentype  # noqa: E402
from strategies import commented, mutated, programs, random_text  # noqa: E402

from steerc.highlight import words as W  # noqa: E402
from steerc.highlight.pygments_lexer import SteerLexer  # noqa: E402

LEXER = SteerLexer()
FILES = H.steer_files()
# STEERC_FUZZ_SCALE=20 runs the random tests twenty times longer (as in test_fuzz.py).
SCALE = max(1, int(os.environ.get("STEERC_FUZZ_SCALE", "1")))


def fuzz(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def T(cls: str):
    return string_to_tokentype(W.CLASSES[cls].pygments)


_ROLES_BY_TYPE: dict = {}
for _role in H.NAME_ROLES:
    _ROLES_BY_TYPE.setdefault(T(_role), []).append(_role)


def agrees(cls: str, ttype, word: str) -> bool:
    """Whether Pygments' ``ttype`` is what a character of steerc class ``cls`` (in token ``word``) may get."""
    if cls == "space":
        return ttype in Whitespace or ttype is Text
    if cls == "comment":
        return ttype in Comment
    if cls == "string":
        return ttype in String
    if cls == "number":
        return ttype in Number
    if cls == "name":
        return any(H.may_colour_name(role, word) for role in _ROLES_BY_TYPE.get(ttype, ()))
    return ttype == T(cls)


def pygments_tokens(text: str) -> list[tuple[int, object, str]]:
    toks = [t for t in LEXER.get_tokens_unprocessed(text) if t[2]]
    assert "".join(v for _, _, v in toks) == text
    pos = 0
    for start, _, value in toks:
        assert start == pos
        pos += len(value)
    return toks


def assert_agrees(text: str, where: str = "") -> int:
    """Check every character steerc vouches for; return how many that is."""
    toks = pygments_tokens(text)
    assert not [t for t in toks if t[1] in Error], [t for t in toks if t[1] in Error][:5]
    ttype = [None] * len(text)
    for start, tt, value in toks:
        ttype[start:start + len(value)] = [tt] * len(value)
    bounds = {start for start, _, _ in toks}, {start + len(value) for start, _, value in toks}
    return H.assert_agrees(text, ttype, agrees, "Pygments", bounds, where)


# ------------------------------------------------------------- the word lists


def test_every_keyword_of_the_grammar_has_one_class():
    from steerc.frontend.parser import get_parser

    grammar_keywords = {t.pattern.value for t in get_parser().terminals if H.is_keyword_terminal(t)}
    listed = [w for ws in W.KEYWORD_CLASSES.values() for w in ws]
    assert len(listed) == len(set(listed)), "a keyword is in two classes"
    assert set(listed) == grammar_keywords


def test_every_other_terminal_has_a_class():
    from steerc.frontend.parser import get_parser

    others = {t.name for t in get_parser().terminals if not H.is_keyword_terminal(t) and not t.name.startswith("__")}
    assert others == set(H.TERMINAL_CLASSES)


def test_builtin_names_are_the_checkers():
    from steerc.ir.checked import SITE_KINDS
    from steerc.passes.names import FUNCTIONS
    from steerc.passes.structure import POOLS

    assert (W.FUNCTIONS, W.SITE_KINDS, W.POOLS) == (FUNCTIONS, SITE_KINDS, POOLS)


def test_every_class_names_a_real_token_type_and_scope():
    for name, cls in W.CLASSES.items():
        ttype = string_to_tokentype(cls.pygments)
        assert str(ttype) == "Token." + cls.pygments, name
        assert cls.scope.endswith(".steer"), name
    assert len({c.scope for c in W.CLASSES.values()}) == len(W.CLASSES), "two classes share a scope"


# ---------------------------------------------------- agreement with steerc


@pytest.mark.parametrize("path", FILES, ids=H.file_id)
def test_every_steer_file_lexes_as_steerc_lexes_it(path):
    text = H.read(path)
    checked = assert_agrees(text, H.file_id(path))
    _, ok = H.lark_tokens(text)
    assert checked == len(text) or not ok


def test_the_shared_examples_are_among_the_files(examples_dir):
    shared = [p for p in FILES if p.startswith(os.path.abspath(examples_dir))]
    assert len(shared) >= 12


@pytest.mark.parametrize("text", H.KEYWORDS_AS_NAMES)
def test_keywords_where_they_stand_as_names(text):
    assert assert_agrees(text) == len(text), "the program should parse"


def test_probe_tokens():
    text = H.read(os.path.join(H.REPO, "examples", "smollm2", "joy_per_request.steer"))
    got = {(v, str(t)) for _, t, v in pygments_tokens(text)}
    for value, ttype in [
        ("steer", "Token.Keyword.Namespace"), ("model", "Token.Keyword.Declaration"),
        ("family", "Token.Name.Attribute"), ('"llama"'[1:-1], "Token.Literal.String.Double"),
        ("30", "Token.Literal.Number.Integer"), ("4.0", "Token.Literal.Number.Float"),
        ("strength", "Token.Name.Variable"), ("in", "Token.Keyword"), ("per", "Token.Keyword"),
        ("request", "Token.Keyword"), ("load", "Token.Name.Builtin"), ("key", "Token.Name.Attribute"),
        ("cheerful", "Token.Name.Function"), ("at", "Token.Keyword"), ("resid_post", "Token.Name.Builtin.Pseudo"),
        ("add", "Token.Keyword"), ("joy", "Token.Name"), ("*", "Token.Operator"),
        ("# joy.steer for a steerc server, with the strength left to each request:", "Token.Comment.Single"),
    ]:
        assert (value, ttype) in got, (value, ttype)


def _types(text: str) -> dict[str, str]:
    return {v: str(t) for _, t, v in pygments_tokens(text) if v.strip()}


def test_contextual_words():
    got = _types('steer 1\nvector v = load("a", per_layer=true)\nintervention i {\n  at head[-1, 50%]\n'
                 '  rotate in (v, w) by 30 deg\n  when not p > 1 and q < 2\n  tokens prompt[-1:], after "x"\n}\n')
    assert got["true"] == "Token.Keyword.Constant"
    assert got["deg"] == "Token.Keyword.Type"
    assert got["-1"] == "Token.Literal.Number.Integer"
    assert got["50%"] == "Token.Literal.Number"
    assert got["not"] == got["and"] == "Token.Operator.Word"
    assert got["prompt"] == "Token.Keyword.Pseudo"
    assert got["after"] == "Token.Keyword"
    assert got["head"] == "Token.Name.Builtin.Pseudo"


def test_strings_and_escapes():
    toks = [(str(t), v) for _, t, v in pygments_tokens('steer 1\nconstrain regex "a\\\\.\\u00e9\\q"\n')]
    assert ("Token.Literal.String.Escape", "\\\\") in toks
    assert ("Token.Literal.String.Escape", "\\u00e9") in toks
    assert ("Token.Literal.String.Double", "\\q") in toks  # steerc refuses it; still string text
    long = '"""{\n  "type": "object"\n}"""'
    assert (str(String.Double), long) in [(str(t), v) for _, t, v in pygments_tokens(f"constrain json_schema {long}")]


def test_an_unterminated_string_ends_at_its_line():
    text = 'steer 1\nvector v = load("oops\nparam p = 2\n'
    got = _types(text)
    assert got["param"] == "Token.Keyword.Declaration"
    assert got["p"] == "Token.Name.Variable"


def test_a_missing_brace_does_not_swallow_the_next_statement():
    got = _types("steer 1\nintervention a {\n  at resid_post[1]\n  add v\n\nvector w = [1.0]\n")
    assert got["vector"] == "Token.Keyword.Declaration"
    assert got["w"] == "Token.Name.Variable"


# ------------------------------------------------------------ random programs


@fuzz(150)
@given(st.data())
def test_random_programs_lex_as_steerc_lexes_them(data):
    from steerc.frontend.fmt import format_program

    text = format_program(data.draw(programs(with_loads=True)))
    text, _ = data.draw(commented(text))
    assert assert_agrees(text) == len(text)


@fuzz(300)
@given(st.one_of(st.text(), random_text()))
def test_any_text_lexes_without_error_and_round_trips(text):
    pygments_tokens(text)
    assert "".join(v for _, v in LEXER.get_tokens(text))  # the usual entry point, with its newline handling


@fuzz(200)
@given(st.sampled_from(FILES), st.data())
def test_edited_programs_lex_without_error_and_round_trip(path, data):
    pygments_tokens(data.draw(mutated(H.read(path))))


def _large_program(rows: int) -> str:
    """``rows`` vector lines with comments, then a triple-quoted string 20 characters a row long."""
    body = "".join(f"vector v{i} = [1.0, -2.5e-3, {i}]  # row {i}\n" for i in range(rows))
    return "steer 1\n" + body + 'constrain json_schema """' + "x" * (20 * rows) + '"""\n'


def test_a_large_program_lexes_in_linear_time():
    """3,000 rows and a 60,000-character string lex (and round-trip) at about 4x the CPU time of a quarter of
    that, measured side by side: no rule backtracks over a long line or string. A ratio, not seconds against a
    limit, which a loaded machine fails (issue 32); benchmarks/editor_speed.py prints the lexer's speed."""
    from scaling import FACTOR, assert_linear

    small, large = _large_program(3000 // FACTOR), _large_program(3000)
    assert_linear(lambda: pygments_tokens(small), lambda: pygments_tokens(large))


# ------------------------------------------------------------- registration


def test_analyse_text_knows_a_program():
    for path in FILES[:5]:
        assert SteerLexer.analyse_text(H.read(path)) > 0, path
    assert SteerLexer.analyse_text("import os\nprint(1)\n") == 0


def test_pyproject_declares_the_entry_point_and_extra():
    import tomllib

    with open(os.path.join(H.REPO, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert project["entry-points"]["pygments.lexers"] == {"steer": "steerc.highlight.pygments_lexer:SteerLexer"}
    assert any(r.startswith("pygments") for r in project["optional-dependencies"]["highlight"])
    with open(os.path.join(H.REPO, "dev"), encoding="utf-8") as fh:
        assert "highlight" in next(line for line in fh if 'pipq -e ".[' in line)


def test_pygments_finds_the_lexer_through_the_entry_point(tmp_path):
    """A distribution holding only the declared entry point, on the path: Pygments' own lookups find the lexer."""
    import tomllib

    with open(os.path.join(H.REPO, "pyproject.toml"), "rb") as fh:
        target = tomllib.load(fh)["project"]["entry-points"]["pygments.lexers"]["steer"]
    info = tmp_path / "steer_lexer_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: steer-lexer-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[pygments.lexers]\nsteer = {target}\n")
    code = textwrap.dedent("""
        import pygments, pygments.lexers as L
        from pygments.formatters import HtmlFormatter
        a = L.get_lexer_by_name("steer")
        b = L.get_lexer_for_filename("cheerful.steer")
        c = L.get_lexer_for_mimetype("text/x-steer")
        d = L.find_lexer_class_by_name("steer")
        assert type(a) is type(b) is type(c) is d, (a, b, c, d)
        assert d.__module__ == "steerc.highlight.pygments_lexer", d
        html = pygments.highlight("steer 1\\nparam p = 2  # two\\n", a, HtmlFormatter())
        assert '<span class="kd">param</span>' in html and '<span class="c1"># two</span>' in html, html
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), H.REPO]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
