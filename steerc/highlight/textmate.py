"""The TextMate grammar of Steer (``source.steer``), built from the word classes.

``editors/vscode/syntaxes/steer.tmLanguage.json`` is this module's output;
regenerate it after changing :mod:`steerc.highlight.words` or this file::

    python -m steerc.highlight.textmate

(``tests/test_highlight_textmate.py`` fails while the file is stale, and
tokenizes every example with the real ``vscode-textmate`` engine.) The
grammar has the same shape as the Pygments lexer: a region for each
statement and block, and in a block a region for each line, holding the
keywords the grammar accepts there; ``( )`` and ``[ ]`` are regions that may
span lines. Regexes are Oniguruma's, written in the subset Python shares.

>>> g = grammar()
>>> g["scopeName"], sorted(g["repository"])[:3]
('source.steer', ['at-line', 'block', 'brackets'])
"""

from __future__ import annotations

import json
import os
import sys

from steerc.highlight import words as W

OUTPUT = os.path.join("editors", "vscode", "syntaxes", "steer.tmLanguage.json")

# Scopes used inside the classes' own (the punctuation of strings and comments; regions).
INNER_SCOPES = (
    "punctuation.definition.comment.steer",
    "punctuation.definition.string.begin.steer",
    "punctuation.definition.string.end.steer",
)
_SP = W.SPACE + "*"
# Oniguruma searches each regex from every offset of the rest of the line: a pattern that may start
# inside a run of digits or letters and fail at its end would cost the square of the run's length
# (a 5,000-digit number took seconds). A number or name starts where no digit or letter precedes it.
_NUM = "(?<![0-9])"


def scope(cls: str) -> str:
    return W.CLASSES[cls].scope


def _cap(*classes: str | None) -> dict:
    return {str(i): {"name": scope(c)} for i, c in enumerate(classes, 1) if c}


def _kw(cls: str) -> str:
    return W.START + W.alternation(W.KEYWORD_CLASSES[cls]) + W.END


def _word(word: str) -> str:
    assert W.keyword_class(word), word
    return W.START + word + W.END


def _match(regex: str, cls: str) -> dict:
    return {"match": regex, "name": scope(cls)}


def _inc(*names: str) -> list[dict]:
    return [{"include": "#" + n} for n in names]


# A line inside a block ends at its end, before the block's `}`, or at a line that can only start
# a statement (the `}` is missing); a statement at the top level at its end or at such a line.
_BLOCK_LINE_END = r"$|(?=\})|(?=" + W.STATEMENT_LINE + ")"
_STATEMENT_END = r"$|(?=" + W.STATEMENT_LINE + ")"
_UNCLOSED = r"|(?=" + W.STATEMENT_LINE + ")"


def _line(keyword_regex: str, captures: dict, patterns: list[dict], name: str) -> dict:
    return {
        "name": f"meta.line.{name}.steer",
        "begin": keyword_regex,
        "beginCaptures": captures,
        "end": _BLOCK_LINE_END,
        "patterns": patterns,
    }


def _region(open_: str, close: str, patterns: list[dict], name: str | None = None) -> dict:
    rule = {
        "begin": "(" + open_ + ")",
        "beginCaptures": _cap("bracket"),
        "end": "(" + close + ")" + _UNCLOSED,
        "endCaptures": _cap("bracket"),
        "patterns": patterns,
    }
    if name:
        rule = {"name": name, **rule}
    return rule


def repository() -> dict:
    repo: dict[str, dict] = {}
    repo["comment"] = {
        "match": "(#).*$",
        "name": scope("comment"),
        "captures": {"1": {"name": "punctuation.definition.comment.steer"}},
    }
    repo["strings"] = {"patterns": [
        {
            "name": scope("long_string"),
            "begin": '"""',
            "beginCaptures": {"0": {"name": "punctuation.definition.string.begin.steer"}},
            "end": '"""',
            "endCaptures": {"0": {"name": "punctuation.definition.string.end.steer"}},
        },
        {
            # A newline ends a "..." string that is not closed (steerc reports it).
            "name": scope("string"),
            "begin": '"',
            "beginCaptures": {"0": {"name": "punctuation.definition.string.begin.steer"}},
            "end": '(")|$',
            "endCaptures": {"1": {"name": "punctuation.definition.string.end.steer"}},
            "patterns": [_match(W.ESCAPE, "escape"), _match(r"\\.?", "bad_escape")],
        },
    ]}
    repo["numbers"] = {"patterns": [
        {"match": _NUM + "(" + W.NUMBER_FLOAT + ")" + _SP + "(deg" + W.END + ")", "captures": _cap("float", "unit")},
        {"match": _NUM + "(" + W.NUMBER_INT + ")" + _SP + "(deg" + W.END + ")", "captures": _cap("integer", "unit")},
        _match(_NUM + "(?:" + W.NUMBER_FLOAT + ")", "float"),
        _match(_NUM + W.NUMBER_INT, "integer"),
    ]}
    repo["call"] = {
        "name": "meta.function-call.steer",
        "begin": W.START + "(?:(" + W.alternation(W.FUNCTIONS) + ")" + W.END + "|(" + W.NAME + "))" + _SP + r"(\()",
        "beginCaptures": _cap("function", "call", "bracket"),
        "end": r"(\))" + _UNCLOSED,
        "endCaptures": _cap("bracket"),
        "patterns": [
            # `true` and `false` are booleans where an argument starts.
            {"match": "(?<=[(,=])" + _SP + "(" + _kw("constant") + ")", "captures": _cap("constant")},
            {"match": W.START + "(" + W.NAME + ")" + _SP + "(=)", "captures": _cap("argument", "assignment")},
            *_inc("expression"),
        ],
    }
    repo["parens"] = _region(r"\(", r"\)", _inc("expression"))
    repo["brackets"] = _region(r"\[", r"\]", _inc("expression"))
    repo["operators"] = {"patterns": [
        _match("<=|>=|<|>", "comparison"),
        _match("[-+*/]", "arithmetic"),
        _match("=", "assignment"),
        _match("[,:.]", "punctuation"),
        _match(r"[)\]{}]", "bracket"),
    ]}
    repo["name"] = _match(W.NAME, "name")
    repo["expression"] = {"patterns": _inc("comment", "strings", "numbers", "call", "name", "parens", "brackets",
                                           "operators")}

    # Selectors: `[1:3]`, `[-2, 50%]`, `[*]`, `[(1, 3), 0:2]`; also the positions of `tokens`.
    atoms = [_match(_NUM + W.PERCENT, "percent"), _match(_NUM + W.SIGNED_INT, "integer"), _match(r"\*", "arithmetic")]
    repo["selector"] = _region(r"\[", r"\]", [*atoms, _region(r"\(", r"\)", [*atoms, *_inc("expression")]),
                                              *_inc("expression")])

    # Gates: `not` starts a condition; `and` and `or` follow one.
    gate = [
        _match(_word("not"), "logical"),
        {"match": W.AFTER_OPERAND + _SP + "(" + W.START + "(?:and|or)" + W.END + ")", "captures": _cap("logical")},
        _region(r"\(", r"\)", _inc("gate")),
        *_inc("expression"),
    ]
    repo["gate"] = {"patterns": gate}

    sites = W.START + W.alternation(W.SITE_KINDS) + W.END
    pools = []
    for pool in W.POOLS:
        parts = pool.split(".")
        regex = W.START + r"(\.)".join("(" + p + ")" for p in parts) + W.END
        classes = ["pool", "punctuation", "pool"] if len(parts) == 2 else ["pool"]
        pools.append({"match": regex, "captures": _cap(*classes)})
    repo["at-line"] = _line("(" + _word("at") + ")", _cap("keyword"),
                            [_match(sites, "site"), *_inc("selector", "expression")], "at")
    repo["block"] = {
        "name": "meta.block.steer",
        "begin": "(" + W.START + "(?:probe|intervention)" + W.END + ")" + _SP + "(" + W.NAME + ")?",
        "beginCaptures": _cap("declaration", "block"),
        "end": r"(\})" + _UNCLOSED,
        "endCaptures": _cap("bracket"),
        "patterns": [
            *_inc("comment"),
            _match(r"\{", "bracket"),
            *_inc("at-line"),
            _line("(" + _word("read") + ")", _cap("keyword"), [_match(_kw("readout"), "readout"),
                                                                *_inc("expression")], "read"),
            _line("(" + _word("pool") + ")", _cap("keyword"), [*pools, *_inc("expression")], "pool"),
            _line("(" + _word("tokens") + ")", _cap("keyword"), [
                _match(_kw("scope"), "scope"), _match(_word("after"), "connective"), *_inc("selector", "expression"),
            ], "tokens"),
            _line("(" + _word("when") + ")", _cap("keyword"), _inc("gate"), "when"),
            _line("(" + _word("preserve") + ")(?:" + _SP + "(" + _word("norm") + "))?", _cap("keyword", "readout"),
                  _inc("expression"), "preserve"),
            # `clamp feature s[0] to 4` sets an SAE feature; `clamp to to 1` clamps a vector called `to`
            _line("(" + _word("clamp") + ")" + W.SPACE + "+(" + _word("feature") + ")", _cap("keyword", "connective"),
                  [_match(_word("to"), "connective"), *_inc("expression")], "clamp-feature"),
            _line("(" + _word("clamp") + ")(?:" + W.SPACE + "+(to" + W.END + "))?", _cap("keyword", "name"),
                  [_match(_word("to"), "connective"), *_inc("expression")], "clamp"),
            _line("(" + _word("rotate") + ")", _cap("keyword"), [
                {
                    "begin": "(" + _word("in") + ")" + _SP + r"(\()",
                    "beginCaptures": _cap("connective", "bracket"),
                    "end": r"(\))" + _UNCLOSED,
                    "endCaptures": _cap("bracket"),
                    "patterns": _inc("expression"),
                },
                _match(W.START + "(?:to|by)" + W.END, "connective"),
                *_inc("expression"),
            ], "rotate"),
            _line("(" + _kw("keyword") + ")", _cap("keyword"), _inc("expression"), "operation"),
            *_inc("expression"),
        ],
    }
    repo["model"] = {
        "name": "meta.block.model.steer",
        "begin": "(" + _word("model") + ")",
        "beginCaptures": _cap("declaration"),
        "end": r"(\})" + _UNCLOSED,
        "endCaptures": _cap("bracket"),
        "patterns": [
            _match(r"\{", "bracket"),
            {"match": W.START + "(" + W.NAME + ")" + _SP + "(=)", "captures": _cap("field", "assignment")},
            _match(_kw("constant"), "constant"),
            *_inc("expression"),
        ],
    }
    repo["declaration"] = {
        "name": "meta.statement.declaration.steer",
        "begin": "(" + W.START + "(?:param|vector|matrix|sae)" + W.END + ")" + _SP + "(" + W.NAME + ")?",
        "beginCaptures": _cap("declaration", "declared"),
        "end": _STATEMENT_END,
        "patterns": [
            _match(_word("in") + "(?=" + _SP + r"\[)", "connective"),
            {"match": "(" + _word("per") + ")" + W.SPACE + "+(" + _word("request") + ")",
             "captures": _cap("connective", "connective")},
            *_inc("expression"),
        ],
    }
    repo["constrain"] = {
        "name": "meta.statement.constrain.steer",
        "begin": "(" + _word("constrain") + ")",
        "beginCaptures": _cap("declaration"),
        "end": _STATEMENT_END,
        "patterns": [_match(_kw("constraint"), "constraint"), _match(_word("from"), "connective"),
                     *_inc("expression")],
    }
    repo["header"] = _match(_word("steer"), "header")
    return repo


def grammar() -> dict:
    return {
        "$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
        "name": "Steer",
        "scopeName": "source.steer",
        "fileTypes": ["steer"],
        "comment": "Generated by `python -m steerc.highlight.textmate` from steerc/highlight/words.py. Do not edit.",
        "patterns": _inc("comment", "header", "model", "declaration", "block", "constrain", "expression"),
        "repository": repository(),
    }


def render() -> str:
    return json.dumps(grammar(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), OUTPUT)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
