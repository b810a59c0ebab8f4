"""``steerc explain --tokens TEXT --format html``: one self-contained page of a prompt's tokens.

Every prompt token, then the first generated positions, is a box; under it,
one coloured bar per intervention that steers that position (a striped bar:
steered if its gate opens). A legend gives each intervention's colour, sites,
scope, gate, and whether it steers ``P-1``. The page has inline CSS and no
script; token text is escaped. The same document gives the same bytes.

>>> palette(0), palette(1), palette(12)
('#4e79a7', '#f28e2b', '#407fbf')
"""

from __future__ import annotations

import colorsys
from html import escape

from steerc.explain.plan import title
from steerc.explain.tokens import describe, mark, visible

TABLEAU = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 6px; }
p.meta { color: #444; margin: 2px 0; }
table.legend { border-collapse: collapse; margin: 14px 0; }
table.legend td { padding: 4px 10px 4px 0; vertical-align: top; border-bottom: 1px solid #eee; }
.swatch { display: inline-block; width: 30px; height: 14px; margin-top: 3px; }
.gated { background-image: repeating-linear-gradient(135deg, transparent 0 4px, rgba(255, 255, 255, 0.7) 4px 8px); }
.tokens { display: flex; flex-wrap: wrap; gap: 8px 4px; align-items: flex-start; }
.tok { display: inline-flex; flex-direction: column; min-width: 18px; padding: 2px 3px 3px;
       border: 1px solid #ccc; border-radius: 3px; }
.tok .pos { font-size: 10px; color: #888; white-space: nowrap; }
.tok .text { font: 13px/1.3 ui-monospace, monospace; white-space: pre; }
.tok.last { border: 2px solid #222; }
.tok.gen { border-style: dashed; color: #777; }
.bar { display: block; height: 6px; margin-top: 2px; }
.key { color: #555; font-size: 13px; }
""".strip()


def palette(i: int) -> str:
    """The colour of the ``i``-th intervention: Tableau's ten, then hues a golden angle apart."""
    if i < len(TABLEAU):
        return TABLEAU[i]
    r, g, b = colorsys.hls_to_rgb(((i * 137.508) % 360) / 360, 0.5, 0.5)
    return "#" + "".join(f"{round(c * 255):02x}" for c in (r, g, b))


def render_html(doc: dict) -> str:
    """The page for an explain document with a ``tokens`` member."""
    t = doc["tokens"]
    items = t["interventions"]
    colour = {item["name"]: palette(i) for i, item in enumerate(items)}
    how = "in the chat template" if t["template"] == "chat" else "as raw text"
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>steerc explain --tokens: {escape(doc['file'])}</title>", f"<style>\n{CSS}\n</style>", "</head>",
           "<body>", f"<h1>{escape(title(doc))}</h1>",
           f'<p class="meta">prompt {escape(visible(t["prompt"], 200))} {how}: P = {t["P"]} '
           f'token{"s" if t["P"] != 1 else ""} '
           f'(positions 0..{t["P"] - 1}); position P-1 = {t["P"] - 1}, boxed, predicts the first generated token'
           + (f'; then the first {t["generated"]} generated positions (dashed)' if t["generated"] else "") + "</p>"]
    out.append('<table class="legend">')
    for item in items:
        name = escape(item["name"])
        gated = " gated" if item["gate"] else ""
        lines = "<br>".join(escape(line) for line in describe(item, t))
        out.append(f'<tr data-intervention="{name}"><td><span class="swatch{gated}" '
                   f'style="background-color: {colour[item["name"]]}"></span></td><td><b>{name}</b></td>'
                   f"<td>{lines}</td></tr>")
    out.append("</table>")
    if not items:
        out.append("<p>no interventions: the program does not steer this model</p>")
    out.append('<p class="key">one bar under a token for each intervention that steers its position; '
               "a striped bar: steered if the intervention's gate opens</p>")
    out.append('<div class="tokens">')
    for p in range(t["P"] + t["generated"]):
        out.append(_token(p, t, items, colour))
    out.append("</div>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def _token(p: int, t: dict, items: list[dict], colour: dict) -> str:
    length = t["P"]
    marks = [(item["name"], mark(item, p, length)) for item in items]
    touched = [name for name, m in marks if m]
    gated = [name for name, m in marks if m == "gated"]
    step = p - (length - 1)
    if p < length:
        token = t["tokens"][p]
        kind, shown = "tok", visible(token["text"], 40)[1:-1].replace(" ", "\u2423")
        label = f"{p}" + (" P-1 n=0" if step == 0 else "")
        hover = f"position {p}, token id {token['id']}: {visible(token['text'], 200)}"
    else:
        kind, shown = "tok gen", f"generated[{p - length}]"
        label = f"{p} n={step}"
        hover = f"position {p} = P+{p - length}, generation step n = {step}: not known before generation"
    if step == 0:
        kind += " last"
    bars = "".join(f'<span class="bar{" gated" if name in gated else ""}" data-intervention="{escape(name)}" '
                   f'style="background-color: {colour[name]}"></span>' for name in touched)
    data = f'data-pos="{p}"' + (f' data-n="{step}"' if step >= 0 else "")
    return (f'<span class="{kind}" {data} data-interventions="{escape(",".join(touched))}" '
            f'data-gated="{escape(",".join(gated))}" title="{escape(hover)}"><span class="pos">{escape(label)}</span>'
            f'<span class="text">{escape(shown)}</span>{bars}</span>')
