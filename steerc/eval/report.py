"""The ``steerc.eval/1`` document (spec/eval.md), its table, and the behaviour-against-KL plot. How every plot
of steerc is written (format, bytes, atomically) is :mod:`steerc.core.figures`, which ``derive --plot`` uses too."""

from __future__ import annotations

from steerc.core.figures import (  # noqa: F401  (the plot helpers, named here for eval's callers)
    DEFAULT_FORMAT,
    figure_bytes,
    figure_format,
    plot_formats,
    save_figure,
    try_format,
)
from steerc.eval.metrics import METRICS

FORMAT = "steerc.eval/1"


def _item_rows(items, behavior, cost) -> list[dict]:
    rows = []
    b, c = iter(behavior), iter(cost)
    for item in items.items:
        if item.kind == "behavior":
            steered, unsteered = next(b)
            rows.append({"line": item.line, "kind": "behavior", "score": steered, "unsteered": unsteered})
        else:
            kl, nll, base_nll, tokens = next(c)
            rows.append({"line": item.line, "kind": "cost", "kl": kl, "nll": nll, "unsteered_nll": base_nll,
                         "tokens": int(tokens)})
    return rows


def document(items, model: str, chat: bool, opts: dict, unsteered: dict, results, engine: str = "hf") -> dict:
    """``results``: (Point, metrics, behaviour scores, cost scores) per point, in order."""
    behavior, cost = items.counts()
    return {
        "format": FORMAT,
        "model": model,
        "engine": engine,
        "data": {"file": items.file, "sha256": items.sha256, "behavior_items": behavior, "cost_items": cost},
        "chat": chat,
        "bootstrap": {"resamples": opts["resamples"], "seed": opts["seed"], "confidence": 0.95},
        "unsteered": unsteered,
        "points": [{"program": point.program, "params": dict(sorted(point.params.items())), "metrics": metrics,
                    "items": _item_rows(items, b, c)} for point, metrics, b, c in results],
    }


def _cell(m: dict | None, digits: int = 3) -> str:
    if m is None:
        return "-"
    return f"{m['mean']:.{digits}f} [{m['low']:.{digits}f}, {m['high']:.{digits}f}]"


COLUMNS = ("behavior", "behavior_change", "win_rate", "kl", "perplexity_ratio")


def table(doc: dict) -> str:
    """The points as a text table: each metric's mean and its 95% interval."""
    d = doc["data"]
    lines = [(f"{d['file']}: {d['behavior_items']} behaviour items, {d['cost_items']} cost items; "
              f"95% bootstrap intervals ({doc['bootstrap']['resamples']} resamples, seed {doc['bootstrap']['seed']})")]
    base = doc["unsteered"]
    parts = [f"{k} {_cell(base.get(k))}" for k in ("behavior", "win_rate", "perplexity") if k in base]
    lines.append("unsteered: " + "; ".join(parts))
    cols = [c for c in COLUMNS if any(c in p["metrics"] for p in doc["points"])]
    header = ["program", "params", *cols]
    rows = [header]
    for p in doc["points"]:
        params = ", ".join(f"{k}={v:g}" for k, v in p["params"].items()) or "-"
        rows.append([p["program"], params, *(_cell(p["metrics"].get(c)) for c in cols)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for n, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("behavior: " + METRICS["behavior"] + "; kl: " + METRICS["kl"])
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> None:
    """Behaviour score against KL, one curve per program, each point labelled by its params, with
    both intervals as error bars (needs matplotlib: steerc[plot])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    programs = list(dict.fromkeys(p["program"] for p in doc["points"]))
    for program in programs:
        pts = [p for p in doc["points"] if p["program"] == program and "kl" in p["metrics"]
               and "behavior" in p["metrics"]]
        if not pts:
            continue
        xs = [p["metrics"]["kl"]["mean"] for p in pts]
        ys = [p["metrics"]["behavior"]["mean"] for p in pts]
        xerr = [[x - p["metrics"]["kl"]["low"] for x, p in zip(xs, pts)],
                [p["metrics"]["kl"]["high"] - x for x, p in zip(xs, pts)]]
        yerr = [[y - p["metrics"]["behavior"]["low"] for y, p in zip(ys, pts)],
                [p["metrics"]["behavior"]["high"] - y for y, p in zip(ys, pts)]]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, label=program)
        for x, y, p in zip(xs, ys, pts):
            label = ", ".join(f"{k}={v:g}" for k, v in p["params"].items())
            if label:
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    base = doc["unsteered"].get("behavior")
    if base is not None:
        ax.axhline(base["mean"], color="grey", linestyle="--", linewidth=1, label="unsteered")
    ax.set_xlabel("KL(unsteered || steered) per token on the cost texts (nats)")
    ax.set_ylabel("behaviour score: log p(positive) - log p(negative)")
    ax.set_title(f"steerc eval: {doc['data']['file']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
