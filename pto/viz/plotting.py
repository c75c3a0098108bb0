"""The figures of ``--plot`` (``pto estimate``, ``pto bench``), readable at 100% on a screen.

A panel is :data:`PANEL_IN` inches at :data:`DPI` dots per inch (640 x 480 pixels: every panel
as large as matplotlib's default figure, never squeezed by its neighbours), text from
:data:`LEGEND_PT` up, and the layout is matplotlib's constrained layout, so the title, the axis
labels and the legends sit inside the image. A legend label says only which line it is (at most
:data:`MAX_LABEL` characters, e.g. ``ours, adaptive tiles``); the settings those lines were
computed with, which used to fill the legend and run off the image, are the figure's title,
wrapped to its width.
"""

from __future__ import annotations

import textwrap

from pto.errors import UsageError

DPI = 100
PANEL_IN = (6.4, 4.8)
TEXT_PT, LEGEND_PT = 11, 10
#: the longest legend label
MAX_LABEL = 40


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no window)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    return plt


def figure(panels: int):
    """A figure of ``panels`` panels side by side; returns (figure, list of axes)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(PANEL_IN[0] * panels, PANEL_IN[1] + 0.8), dpi=DPI,
                             layout="constrained", squeeze=False)
    return fig, list(axes[0])


def log_axes(ax, title: str, ylabel: str | None = None, xlabel: str = "sequence length") -> None:
    """Log-log axes against a shape parameter (powers of two), a grid and the panel's title."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=TEXT_PT)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=TEXT_PT)
    ax.set_title(title, fontsize=TEXT_PT)
    ax.tick_params(labelsize=LEGEND_PT)
    ax.grid(True, which="both", alpha=0.3)


def short(label: str) -> str:
    """A legend label cut to :data:`MAX_LABEL` characters (the title has the details)."""
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def finish(fig, axes, title: str, details: list[str], path: str):
    """Legends inside each panel, the title with ``details`` wrapped to the figure's width,
    written to ``path``; returns the (closed) figure for callers that inspect it."""
    plt = pyplot()
    width = int(fig.get_figwidth() * 72 / (0.6 * TEXT_PT))  # characters of about 0.6 em
    lines = [title] + [w for d in details for w in textwrap.wrap(d, width, break_on_hyphens=False)]
    fig.suptitle("\n".join(lines), fontsize=TEXT_PT)
    for ax in axes:
        for line in ax.get_lines():
            line.set_label(short(line.get_label()))
        ax.legend(fontsize=LEGEND_PT, loc="best", framealpha=0.85)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return fig


__all__ = ["DPI", "PANEL_IN", "MAX_LABEL", "pyplot", "figure", "log_axes", "short", "finish"]
