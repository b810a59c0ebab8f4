"""Completion: what may come next at the cursor, read from the text itself.

The text around the cursor is often not a program yet (``at `` alone is a
syntax error), so completion reads the line before the cursor and the
declarations above it instead of the last parse.

>>> text = "steer 1\\nvector joy = [1.0]\\nparam g = 2\\nintervention x {\\n  at "
>>> [c.label for c in complete(text, len(text))][:2]
['resid_pre', 'resid_post']
>>> text += "resid_post[0]\\n  add g * "
>>> [(c.label, c.kind) for c in complete(text, len(text))][:2]
[('joy', 'vector'), ('g', 'param')]
"""

from __future__ import annotations

import functools
import re

from steerc.core.record import frozen
from steerc.ir.builtins import BUILTINS
from steerc.ir.checked import SITE_KINDS
from steerc.lsp.hover import MEANING
from steerc.passes.structure import MODEL_FIELDS, POOLS

STATEMENTS = ("param", "vector", "matrix", "sae", "probe", "intervention", "model", "constrain")
INTERVENTION_LINES = ("at", "add", "scale", "set", "suppress", "ablate", "clamp", "clamp feature", "rotate in",
                      "loreft", "tokens", "when", "preserve norm")
PROBE_LINES = ("at", "read", "pool")
SCOPES = ("all", "prompt", "generated", "after")
READOUTS = ("cosine", "projected_cosine", "subspace_cosine", "dot", "norm")
CONSTRAINTS = ("json_schema", "regex", "grammar", "choice")
# Where names may come next: after these words at the start of a line, or after these characters.
_VALUE_WORDS = re.compile(r"^(add|scale|set|ablate|clamp|when|read\s+\w+\s*\(|(param|vector)\s+\w+\s*=)")
_MATRIX_VALUE = re.compile(r"^matrix\s+\w+\s*=\s*$")  # `matrix R = `: a load, or another matrix
_LOREFT = re.compile(r"^loreft\s")
_SAE_VALUE = re.compile(r"^sae\s+\w+\s*=\s*$")  # `sae s = `: sae("folder"), or another SAE
_CLAMP_FEATURE = re.compile(r"^clamp\s+feature\s+\w*$")  # `clamp feature `: an SAE, then [i]
_VALUE_CHARS = set("*+-/(,=<>[")

_DECLARED = re.compile(r"^[ \t]*(param|vector|matrix|sae|probe)[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.M)
_STRIP = re.compile(r'"""[\s\S]*?(?:"""|$)|"(?:[^"\\\n]|\\.)*"?|#[^\n]*')
_BLOCK = re.compile(r"\b(intervention|probe|model)\b[^{}]*$")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*$")


@frozen
class Item:
    label: str
    kind: str  # keyword | site | param | vector | probe | function | field
    detail: str = ""


def complete(text: str, offset: int) -> list[Item]:
    """What may be typed at ``offset`` of ``text`` (steerc's text: line ends are ``\\n``)."""
    before = text[:offset]
    line = before[before.rfind("\n") + 1:]
    word = _WORD.search(line)
    head = (line[: word.start()] if word else line).lstrip()
    block = enclosing_block(before[: len(before) - len(line)])
    return _by_context(head, block, before)


def _by_context(head: str, block: str | None, before: str) -> list[Item]:
    if head == "":
        return _line_starts(block)
    if re.fullmatch(r"at\s+", head):
        return [Item(k, "site", MEANING[k].format(l="l", h="h")) for k in SITE_KINDS]
    if re.fullmatch(r"tokens\s+(.*,\s*)?", head):
        return _keywords(SCOPES, "token scope")
    if re.fullmatch(r"read\s+", head):
        return _keywords(READOUTS, "readout")
    if re.fullmatch(r"pool\s+", head):
        return _keywords(POOLS, "pool")
    if re.fullmatch(r"constrain\s+", head):
        return _keywords(CONSTRAINTS, "constraint")
    if _MATRIX_VALUE.match(head):
        return names_before(before, ("matrix",)) + [i for i in _functions() if i.label == "load"]
    if _SAE_VALUE.match(head):
        return names_before(before, ("sae",)) + [i for i in _functions() if i.label == "sae"]
    if _CLAMP_FEATURE.match(head):
        return names_before(before, ("sae",))
    if _LOREFT.match(head):  # `loreft R, W, b`: two matrices, then a vector
        if head.count(",") < 2:
            return names_before(before, ("matrix",))
        return names_before(before, ("param", "vector")) + _functions()
    if _VALUE_WORDS.match(head) or head.rstrip()[-1:] in _VALUE_CHARS or re.search(r"\b(to|by)\s+$", head):
        gate = head.startswith("when")
        return names_before(before, ("probe", "param") if gate else ("param", "vector", "sae")) + (
            _keywords(("not",), "gate") if gate else _functions())
    return []


def _functions() -> list[Item]:
    """The built-in functions (steerc.ir.builtins), each with its signature and what it does."""
    return [Item(b.name, "function", f"{b.signature}: {b.doc}") for b in BUILTINS.values()]


def _line_starts(block: str | None) -> list[Item]:
    if block == "intervention":
        return _keywords(INTERVENTION_LINES, "intervention line")
    if block == "probe":
        return _keywords(PROBE_LINES, "probe line")
    if block == "model":
        return [Item(k, "field", "model fact") for k in MODEL_FIELDS]
    return _keywords(STATEMENTS, "statement")


def _keywords(words, detail: str) -> list[Item]:
    return [Item(w, "keyword", detail) for w in words]


def names_before(before: str, kinds) -> list[Item]:
    """The names of ``kinds`` declared in ``before``, each once, in order."""
    seen: dict[str, Item] = {}
    for m in _DECLARED.finditer(before):
        if m.group(1) in kinds and m.group(2) not in seen:
            seen[m.group(2)] = Item(m.group(2), m.group(1), m.group(1))
    return list(seen.values())


def enclosing_block(before: str) -> str | None:
    """The kind of block (intervention, probe, model) still open at the end of ``before``, if any."""
    depth, kind = 0, None
    for piece in re.split(r"([{}])", _STRIP.sub("", before)):
        if piece == "{":
            depth += 1
        elif piece == "}":
            depth = max(depth - 1, 0)
            kind = None if depth == 0 else kind
        elif depth == 0:
            m = _BLOCK.search(piece)
            kind = m.group(1) if m else None
    return kind if depth > 0 else None


@functools.lru_cache(maxsize=1)
def keywords() -> frozenset[str]:
    """Every word the grammar spells out (``steer``, ``at``, ``add``, ``true``, ...)."""
    from steerc.frontend.parser import GRAMMAR_PATH

    with open(GRAMMAR_PATH, encoding="utf-8") as fh:
        return frozenset(re.findall(r'"([a-z_]+)"', fh.read()))

