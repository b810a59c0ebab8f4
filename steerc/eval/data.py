"""The items `steerc eval` scores, read from JSONL with diagnostics that point into the file.

One JSON object per line, of two kinds (spec/eval.md):

* **a behaviour item** — ``{"prompt": P, "positive": A, "negative": B}``:
  two completions of one prompt, the shape of derive's pairs with a prompt
  (one file can serve both commands);
* **a cost item** — ``{"text": T}``, optionally with ``"prompt": P``: a text
  whose fluency steering should not cost.

Blank lines are skipped. A line that is neither (a missing or unknown key,
both kinds at once, an empty or non-string text) is ``invalid-data`` at
the key; a file with no items is ``empty-data``.

>>> from steerc.core.source import Source
>>> items = parse_items(Source("e.jsonl", '{"prompt": "Hi", "positive": " :)", "negative": " :("}\\n{"text": "Rain."}\\n'))
>>> [(i.kind, i.line) for i in items.items], items.counts()
([('behavior', 1), ('cost', 2)], (1, 1))
"""

from __future__ import annotations

from steerc.core.record import field, frozen
from steerc.core.source import Source
from steerc.derive.data import DataError, did_you_mean_key, json_rows, key_span, sha256_of, text_ok
from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import EMPTY_DATA, INVALID_DATA

BEHAVIOR_KEYS = ("prompt", "positive", "negative")
COST_KEYS = ("prompt", "text")
KEYS = ("prompt", "positive", "negative", "text")
EXAMPLE = '{"prompt": "...", "positive": "...", "negative": "..."} or {"text": "..."}'


@frozen
class Item:
    """One scored line: ``kind`` is "behavior" (``positive`` and ``negative`` complete ``prompt``) or "cost"
    (``text``, after ``prompt`` when it has one). ``line`` is its 1-based line in the file."""

    kind: str
    line: int
    prompt: str | None = None
    positive: str | None = None
    negative: str | None = None
    text: str | None = None
    spans: dict = field(factory=dict, eq=False, repr=False)  # key -> the Span of its key on the line


@frozen
class Items:
    items: tuple[Item, ...]
    file: str
    sha256: str  # of the file's bytes (sha256sum)

    def counts(self) -> tuple[int, int]:
        """(behaviour items, cost items)."""
        behavior = sum(1 for i in self.items if i.kind == "behavior")
        return behavior, len(self.items) - behavior


def parse_items(src: Source) -> Items:
    """The items of a JSONL file (raises DataError with every problem found, up to the repeat limit)."""
    problems: list[Diagnostic] = []
    items: list[Item] = []
    for offset, line, row in json_rows(src, problems, EXAMPLE):
        lineno = src.position(offset)[0]  # the Source's line index: counting from the file's start is quadratic
        unknown = [k for k in row if k not in KEYS]
        is_cost = "text" in row
        wanted = COST_KEYS if is_cost else BEHAVIOR_KEYS
        stray = [k for k in row if k in KEYS and k not in wanted]
        missing = [k for k in wanted if k not in row and not (is_cost and k == "prompt")]
        if unknown or stray or missing:
            if unknown:
                what = f"unknown key {unknown[0]!r}"
            elif stray:
                what = f"{stray[0]!r} beside \"text\": an item is a behaviour item or a cost item, not both"
            else:
                what = f"no {missing[0]!r}"
            bad = unknown or stray
            problems.append(Diagnostic.error(
                INVALID_DATA, f"{what} (a behaviour item has \"prompt\", \"positive\" and \"negative\"; a cost item "
                "\"text\" and optionally \"prompt\")", key_span(src, offset, line, bad),
                help=did_you_mean_key(unknown, KEYS) if unknown else None))
            continue
        spans = {k: key_span(src, offset, line, [k]) for k in wanted if k in row}
        checked = [text_ok(row[k], f'"{k}"', spans[k], problems) for k in spans]  # each text's problems, not the first
        if not all(checked):
            continue
        if is_cost:
            items.append(Item("cost", lineno, prompt=row.get("prompt"), text=row["text"], spans=spans))
        else:
            items.append(Item("behavior", lineno, prompt=row["prompt"], positive=row["positive"],
                              negative=row["negative"], spans=spans))
    if not problems and not items:
        problems.append(Diagnostic.error(EMPTY_DATA, "no items in this file", src.span(0, min(1, len(src.text))),
                                         help=f"one JSON object per line: {EXAMPLE}"))
    if problems:
        raise DataError(problems, {src.name: src})
    return Items(tuple(items), src.name, sha256_of(src))
