"""Figures written as files: the format a path's extension names, the same bytes for the same figure (no
version, no date), atomically, and a check that a format can be written here before a long run draws one.
Used by ``steerc eval``'s and ``steerc derive``'s plots; matplotlib is imported only when a figure is made.
"""

from __future__ import annotations

import os

from steerc.core.paths import write_atomically

# The metadata that keeps a format's bytes free of matplotlib's version and the date, where it takes any.
_METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
    "svgz": {"Creator": None, "Date": None},
    "eps": {"Creator": None},
    "ps": {"Creator": None},
}
DEFAULT_FORMAT = "png"


def figure_format(path: str) -> str:
    """The format a plot at ``path`` is written in: its extension, lower case ('png' when it has none).

    >>> figure_format("a/joy.PNG"), figure_format("plot.svg"), figure_format("out/plot")
    ('png', 'svg', 'png')
    """
    ext = os.path.splitext(path)[1]
    return ext[1:].lower() if len(ext) > 1 else DEFAULT_FORMAT


def plot_formats() -> tuple[str, ...]:
    """The formats matplotlib's Agg canvas writes (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return tuple(sorted(FigureCanvasAgg(Figure()).get_supported_filetypes()))


def figure_bytes(fig, fmt: str) -> bytes:
    """``fig`` rendered in ``fmt``, the same figure giving the same bytes in png, pdf, svg and the raster
    formats (no version, no date, SVG ids from a fixed salt)."""
    import io

    import matplotlib

    buffer = io.BytesIO()
    metadata = _METADATA.get(fmt)
    with matplotlib.rc_context({"svg.hashsalt": "steerc"}):
        fig.savefig(buffer, format=fmt, **({"metadata": metadata} if metadata else {}))
    return buffer.getvalue()


def try_format(fmt: str) -> str | None:
    """None when a small plot with text renders in ``fmt`` here; else why not (pgf without LaTeX, a Pillow
    without the format's plugin), so that a command can refuse before its work, not after."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1), dpi=20)
    ax = fig.subplots()
    ax.plot([0, 1], [1, 0], marker="o", label="a")
    ax.set_title("steerc")
    ax.legend()
    try:
        figure_bytes(fig, fmt)
    except Exception as exc:  # noqa: BLE001 (whatever the backend raises is the reason)
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def save_figure(fig, path: str) -> None:
    """Write ``fig`` to exactly ``path`` in its extension's format (:func:`figure_format`), atomically (a
    temporary file in the same folder, then a rename; removed on any failure), making missing folders."""
    data = figure_bytes(fig, figure_format(path))
    write_atomically(path, data)
