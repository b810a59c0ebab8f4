"""``steerc explain --tokens``: the positions of one prompt each intervention steers.

:func:`tokens_doc` tokenizes the prompt as ``steerc run`` does
(:func:`steerc.runtime.models.encode_prompt`) and asks the HF runtime's own
position code (:func:`steerc.runtime.hf.tokens.selected`) which prompt positions
and which of the first generated positions each intervention's scope selects;
:func:`render_tokens` prints that as a table, one row a position, one column
an intervention. ``steerc.explain.html`` draws the same document as a page.

Position ``P-1``, the prompt's last, is the one whose output predicts the
first generated token; every intervention says whether it steers it.
"""

from __future__ import annotations

from steerc.core.text import shown as escaped
from steerc.explain.plan import gate_text, precise
from steerc.frontend.fmt import scope as scope_text

TEXT_WIDTH = 24
MARK = {"always": "#", "gated": "?", None: "."}


def prompt_ids(tokenizer, prompt: str, chat: bool) -> tuple[list[int], bool]:
    """(the prompt's token ids as ``steerc run`` feeds them, whether the chat template wrapped it)."""
    from steerc.runtime.models import encode_prompt

    templated = bool(chat and getattr(tokenizer, "chat_template", None))
    return [int(i) for i in encode_prompt(tokenizer, prompt, chat)["input_ids"][0].tolist()], templated


def tokens_doc(plan, tokenizer, prompt: str, ids: list[int], templated: bool, generated: int) -> dict:
    """The ``tokens`` member of an explain document for ``prompt``, tokenized to ``ids`` by
    :func:`prompt_ids` (see spec/explain.md)."""
    from steerc.runtime.hf.tokens import selected

    interventions = _interventions(plan)
    chosen = selected([s for i in interventions for s in i["data"]], tokenizer, ids, generated)
    length = len(ids)
    for item in interventions:
        scopes = item.pop("data")
        item["prompt_positions"] = sorted({p for s in scopes for p in chosen[s][0]})
        item["generated"] = sorted({j for s in scopes for j in chosen[s][1]})
        item["last_prompt"] = length - 1 in item["prompt_positions"]
        item["note"] = _last_note(item, length)
    return {
        "prompt": prompt,
        "template": "chat" if templated else "raw",
        "P": length,
        "generated": generated,
        "tokens": [{"position": p, "id": i, "text": tokenizer.decode([i])} for p, i in enumerate(ids)],
        "interventions": interventions,
    }


def _interventions(plan) -> list[dict]:
    """One entry per intervention of the plan, in source order: its sites, scope, gate, and the runtime's
    scope data of its kernels (``data``, each once)."""
    from steerc.targets.hooks import scope_data

    found: dict[str, dict] = {}
    for sp in plan.sites:
        for k in sp.kernels:
            data = scope_data(k.scope)
            for p in k.provenance:
                entry = found.setdefault(p.intervention, {
                    "name": p.intervention, "line": p.span.line if p.span else None, "sites": [],
                    "scope": ", ".join(scope_text(s) for s in k.scope),
                    "gate": gate_text(k.gate, precise) if k.gate is not None else None, "data": []})
                if sp.site.text not in entry["sites"]:
                    entry["sites"].append(sp.site.text)
                if data not in entry["data"]:
                    entry["data"].append(data)
    return sorted(found.values(), key=lambda e: (e["line"] is None, e["line"] or 0))


def _last_note(item: dict, length: int) -> str:
    where = f"P-1 (position {length - 1}), whose output predicts the first generated token"
    if not item["last_prompt"]:
        return f"does not steer {where}"
    return f"steers {where}" + (", if its gate opens" if item["gate"] else "")


# -------------------------------------------------------------------- render


def visible(text: str, width: int = TEXT_WIDTH) -> str:
    """A token's text for a terminal or a page: control and format characters as escapes, clipped.

    >>> visible("a\\nb\\x1b[31m"), visible("x" * 30, 8)
    ("'a\\\\nb\\\\x1b[31m'", "'xxxxxxx…'")
    """
    shown = escaped(text)
    if len(shown) > width:
        shown = shown[:width - 1] + "…"
    return f"'{shown}'"


def ranges(values) -> str:
    """``0..3, 7`` for [0, 1, 2, 3, 7]; ``none`` for [].

    >>> ranges([0, 1, 2, 3, 7, 9, 10]), ranges([])
    ('0..3, 7, 9..10', 'none')
    """
    values = sorted(values)
    if not values:
        return "none"
    parts, start = [], values[0]
    for prev, cur in zip(values, values[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            parts.append(str(start) if start == prev else f"{start}..{prev}")
            start = cur
    return ", ".join(parts)


def mark(item: dict, position: int, length: int) -> str | None:
    """``always``, ``gated`` (steered if the gate opens) or None: what ``item`` does at ``position``."""
    hit = position in item["prompt_positions"] if position < length else position - length in item["generated"]
    if not hit:
        return None
    return "gated" if item["gate"] else "always"


def describe(item: dict, doc: dict) -> list[str]:
    """The lines that say what one intervention steers on this prompt."""
    length, k = doc["P"], doc["generated"]
    when = f", when {item['gate']}" if item["gate"] else ""
    gated = " if its gate opens" if item["gate"] else ""
    gen = item["generated"]
    lines = [f"at {sites_text(item['sites'])}, tokens {item['scope']}{when}",
             f"prompt positions: {ranges(item['prompt_positions'])}",
             f"P-1 (position {length - 1}, predicts the first generated token): "
             + (f"steered{gated}" if item["last_prompt"] else "NOT steered")]
    if k:
        shown = "all" if len(gen) == k else ranges(gen)
        lines.append(f"generated[0..{k - 1}] (positions {length}..{length + k - 1}): "
                     + (f"{shown} steered{gated}" if gen else "none steered"))
    return lines


def sites_text(sites: list[str]) -> str:
    """``resid_post[6..9], head[2, 0]``: runs of one site kind over consecutive layers written once.

    >>> sites_text(["resid_post[6]", "resid_post[7]", "resid_post[8]", "mlp_out[1]", "mlp_out[3]"])
    'resid_post[6..8], mlp_out[1], mlp_out[3]'
    """
    out, run = [], []
    for s in sites + [None]:
        kind, _, rest = (s or "").partition("[")
        if run and s is not None and "," not in rest and kind == run[0][0] and int(rest[:-1]) == run[-1][1] + 1:
            run.append((kind, int(rest[:-1])))
            continue
        if run:
            out.append(f"{run[0][0]}[{run[0][1]}]" if len(run) == 1 else f"{run[0][0]}[{run[0][1]}..{run[-1][1]}]")
            run = []
        if s is not None and "," not in rest and rest[:-1].isdigit():
            run = [(kind, int(rest[:-1]))]
        elif s is not None:
            out.append(s)
    return ", ".join(out)


def render_tokens(doc: dict, header: str) -> str:
    """The ``steerc explain --tokens`` text: what each intervention steers, then the table."""
    t = doc["tokens"]
    length, k, items = t["P"], t["generated"], t["interventions"]
    how = "in the chat template" if t["template"] == "chat" else "as raw text"
    lines = [header,
             f"prompt {visible(t['prompt'], 60)} {how}: P = {length} token{'s' if length != 1 else ''} "
             f"(positions 0..{length - 1})"
             + (f", then the first {k} generated (positions {length}..{length + k - 1})" if k else "")]
    if not items:
        lines.append("\nno interventions: the program does not steer this model")
        return "\n".join(lines) + "\n"
    lines.append("\ninterventions")
    for n, item in enumerate(items, 1):
        first, *rest = describe(item, t)
        lines.append(f"  [{n}] {item['name']} {first}")
        lines.extend(f"      {line}" for line in rest)
    lines.append(f"\n  {MARK['always']} steered   {MARK['gated']} steered if its gate opens   "
                 f"{MARK[None]} not steered;   n = p - (P - 1), the generation step")
    cols = [str(n) for n in range(1, len(items) + 1)]
    width = max(len(c) for c in cols)
    lines.append(f"\n  {'pos':>5} {'n':>4}  {'token':<{TEXT_WIDTH + 2}}  {'P-1':3}  "
                 + " ".join(c.rjust(width) for c in cols))
    for p in range(length + k):
        if p == length:
            lines.append(f"  {'':>5} {'':>4}  -- generated (their tokens are not known before generation)")
        step = p - (length - 1)
        text = visible(t["tokens"][p]["text"]) if p < length else f"generated[{p - length}]"
        cells = " ".join(MARK[mark(item, p, length)].rjust(width) for item in items)
        lines.append(f"  {p:>5} {step if step >= 0 else '':>4}  {text:<{TEXT_WIDTH + 2}}  "
                     f"{'<--' if p == length - 1 else '':3}  {cells}")
    return "\n".join(lines) + "\n"
