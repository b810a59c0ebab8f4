"""The per-layer picture of `steerc derive`: a table of held-out AUROC, and the same as a PNG.

>>> print(table({"mean_diff": {"6": 0.75, "7": 1.0}}, [6, 7], 2, 8), end="")
held-out AUROC (2 of 8 pairs; 1.0 separates perfectly, 0.5 is chance)
layer   mean_diff
    6      0.7500
    7      1.0000*
"""

from __future__ import annotations


def table(scores: dict, layers, held: int, total: int) -> str:
    """Layers down, methods across; ``*`` marks each method's best layers."""
    methods = list(scores)
    widths = [max(10, len(m)) for m in methods]
    lines = [f"held-out AUROC ({held} of {total} pairs; 1.0 separates perfectly, 0.5 is chance)"]
    lines.append("layer  " + "  ".join(f"{m:>{w}} " for m, w in zip(methods, widths)).rstrip())
    best = {m: max(scores[m].values()) for m in methods}
    for layer in layers:
        cells = [f"{scores[m][str(layer)]:{w}.4f}" + ("*" if scores[m][str(layer)] == best[m] else " ")
                 for m, w in zip(methods, widths)]
        lines.append(f"{layer:5d}  " + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def best_layer(by_layer: dict, layers) -> int:
    """The layer with the best score; among equals, the middle one (a plateau's centre, not its edge)."""
    top = max(by_layer[str(layer)] for layer in layers)
    tied = [layer for layer in layers if by_layer[str(layer)] == top]
    return tied[(len(tied) - 1) // 2]


def plot(path: str, scores: dict, layers, site_kind: str, title: str) -> None:
    """A PNG: one line per method, layers on the x axis, held-out AUROC on the y axis (needs
    matplotlib: ``pip install 'steerc[plot]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from steerc.core.figures import save_figure

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for method, by_layer in scores.items():
        ax.plot(list(layers), [by_layer[str(layer)] for layer in layers], marker="o", label=method)
    ax.set_xlabel(f"layer ({site_kind}[l])")
    ax.set_ylabel("held-out AUROC")
    ax.set_ylim(0.0, 1.02)
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        save_figure(fig, path)  # in its extension's format, atomically, as every steerc plot
    finally:
        plt.close(fig)
