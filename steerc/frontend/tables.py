"""The parser's LALR tables, precomputed so that ``steerc`` starts quickly.

Building the LALR tables from ``steer.lark`` takes tens of milliseconds on
every start. ``steer.tables.json`` holds them as data (Lark's own serialised
form), together with the sha256 of the grammar they were built from; when
the grammar changes and the tables do not, the parser is built from the
grammar instead (and ``tests/test_parser.py`` fails until the tables are
regenerated with ``python -m steerc.frontend.tables``).

Lark's form keys three tables by integers (the parse states and their
actions, the token ids, the memo), which JSON cannot: they are written as
decimal strings and :func:`read_tables` turns them back into integers. No
other key of the form is a decimal string (:func:`render` checks), so a
table that grows another integer key fails to render rather than read back
wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from lark import Lark

GRAMMAR_PATH = os.path.join(os.path.dirname(__file__), "steer.lark")
TABLES_PATH = os.path.join(os.path.dirname(__file__), "steer.tables.json")
OPTIONS = dict(parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=True)


def grammar_text() -> str:
    with open(GRAMMAR_PATH, encoding="utf-8") as fh:
        return fh.read()


def grammar_sha256(text: str | None = None) -> str:
    return hashlib.sha256((text if text is not None else grammar_text()).encode("utf-8")).hexdigest()


def build(postlex=None) -> Lark:
    """Build the parser from the grammar (slow path)."""
    return Lark(grammar_text(), postlex=postlex, **OPTIONS)


def read_tables() -> dict | None:
    """The stored tables, ``{"grammar_sha256", "data", "memo"}``, or None when there are none."""
    try:
        with open(TABLES_PATH, encoding="utf-8") as fh:
            tables = json.load(fh)
        parser = tables["data"]["parser"]["parser"]
        parser["states"] = {int(s): {int(t): a for t, a in acts.items()} for s, acts in parser["states"].items()}
        parser["tokens"] = {int(t): name for t, name in parser["tokens"].items()}
        tables["memo"] = {int(i): v for i, v in tables["memo"].items()}
        return tables
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def load(postlex) -> Lark:
    """The parser from the precomputed tables when they match the grammar, else built."""
    tables = read_tables()
    if tables is None or tables.get("grammar_sha256") != grammar_sha256():
        return build(postlex)
    # Tables written by one lark release name options another may not know (lark 1.3 added
    # cache_grammar; vLLM pins lark 1.2): keep those this lark has, and build if it still refuses.
    from lark.lark import LarkOptions

    data = tables["data"]
    data = dict(data, options={k: v for k, v in data["options"].items() if k in LarkOptions._defaults})
    try:
        return Lark._load_from_dict(data, tables["memo"], postlex=postlex)
    except Exception:  # noqa: BLE001 - any incompatibility of the stored tables: the slow, sure path
        return build(postlex)


def render() -> str:
    """The tables of the grammar as it is now, as the text of ``steer.tables.json`` (one line, sorted keys)."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    text = grammar_text()
    data, memo = build().memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k != "postlex"}
    tables = {"grammar_sha256": grammar_sha256(text), "data": data, "memo": memo}
    _check_keys(tables)
    return json.dumps(tables, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def _check_keys(node: object) -> None:
    """No string key may read back as an integer (see the module's docstring)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and key.isdigit():
                raise ValueError(f"a table key {key!r} would read back as an integer")
            _check_keys(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _check_keys(value)


def main() -> int:
    with open(TABLES_PATH, "w", encoding="utf-8") as fh:
        fh.write(render())
    print(f"wrote {TABLES_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
