"""Page, font and spacing of a drawing, and estimates of its size before graphviz measures it.

The estimates (from the labels' lengths and the edges that pass through each column) choose a
drawing without running graphviz; :func:`layout_work` counts what graphviz's layered layout has
to place, which bounds the time it takes.
"""

from __future__ import annotations

import math

import numpy as np

# The largest page, in inches: 60 x 36 in is 5,760 x 3,456 px at 100% zoom (96 dpi), three
# full-HD screens across and about three down.
PAGE_IN = (60.0, 36.0)
# Font sizes in points; nothing on the page is smaller than MIN_FONT_PT (10 pt is 13 px at 100%).
TITLE_PT, NODE_PT, EDGE_PT = 14, 12, 10
MIN_FONT_PT = min(TITLE_PT, NODE_PT, EDGE_PT)
# graphviz spacing (inches) between boxes of one rank and between ranks
NODESEP, RANKSEP = 0.15, 0.6
# nodes plus edge segments a drawing may have: a few seconds of `dot` (see pto/viz/__init__.py)
LAYOUT_BUDGET = 10_000
# above this many nodes plus segments, cap dot's crossing-minimization and positioning passes:
# a slightly less tidy picture instead of minutes of optimization
TUNE_ABOVE = 1_000


# Helvetica (Liberation Sans) averages 0.56-0.58 em on names, digits and underscores and dot's
# lines are about 1.1 em apart; both rounded up, so that estimates err on the large side.
CHAR_EM, LINE_EM = 0.6, 1.2
NODE_MARGIN_IN = (0.08, 0.04)
# points of padding around every line of a box's label (pto.viz.dot.join_label)
LABEL_PAD_PT = 1
# room an edge passing through a rank takes in it (dot puts a virtual node there), and around a
# row's cluster (margin and label)
VIRTUAL_IN = 0.2
CLUSTER_PAD_IN = 0.15
# graphviz's margin around the whole drawing (4 pt each side)
PAD_IN = 4 / 72
# rows are only worth their dashed copies when one row would be wider than a screen (1920 x
# 1080 px at 96 dpi) and this much wider than tall
SCREEN_IN = (20.0, 11.25)
MAX_ASPECT = 3.0


def box_in(lines: list[str], pt: float = NODE_PT) -> tuple[float, float]:
    """Estimated size in inches of a box with these label lines (graphviz's minimum is 0.75 x 0.5)."""
    chars = max(len(s) for s in lines)
    return (max(0.75, (chars * pt * CHAR_EM + 2 * LABEL_PAD_PT) / 72 + 2 * NODE_MARGIN_IN[0]),
            max(0.5, len(lines) * (pt * LINE_EM + 2 * LABEL_PAD_PT) / 72 + 2 * NODE_MARGIN_IN[1]))


def capacity(page: tuple[float, float]) -> int:
    """The most boxes of the minimum size a page can hold: more never fit."""
    return int((page[0] + RANKSEP) // (0.75 + RANKSEP)) * int((page[1] + NODESEP) // (0.5 + NODESEP))


def layered_in(row: np.ndarray, col: np.ndarray, w: np.ndarray, h: np.ndarray, src: np.ndarray,
               dst: np.ndarray) -> tuple[float, float]:
    """Estimated size in inches of a left-to-right layered drawing without its title.

    Node ``k`` is ``w[k]`` x ``h[k]`` in column ``col[k]`` of row ``row[k]`` (rows are clusters
    stacked top to bottom that share the columns); edges ``src -> dst`` stay inside their row. A
    column of a row is as tall as its boxes plus the edges that pass through it; a column is as
    wide as its widest box over all rows.
    """
    n_rows, n_cols = int(row.max()) + 1, int(col.max()) + 1
    cell = np.bincount(row * n_cols + col, h + NODESEP, n_rows * n_cols).reshape(n_rows, n_cols)
    # an edge from column a to column b passes columns a+1 .. b-1: +VIRTUAL_IN from a+1, minus
    # again from b, summed along the row (linear in edges however long they are)
    long = col[dst] - col[src] > 1
    first, stop = row[src][long] * (n_cols + 1) + col[src][long] + 1, row[src][long] * (n_cols + 1) + col[dst][long]
    passing = np.bincount(first, minlength=n_rows * (n_cols + 1)) - np.bincount(stop, minlength=n_rows * (n_cols + 1))
    cell += VIRTUAL_IN * np.cumsum(passing.reshape(n_rows, n_cols + 1), axis=1)[:, :n_cols]
    widths = np.zeros(n_cols)
    np.maximum.at(widths, col, w)
    width = float(widths.sum()) + RANKSEP * (n_cols - 1)
    height = float(cell.max(axis=1).sum()) - NODESEP * n_rows
    if n_rows > 1:
        width += 2 * CLUSTER_PAD_IN
        height += n_rows * (NODE_PT * LINE_EM / 72 + 2 * CLUSTER_PAD_IN) + NODESEP * (n_rows - 1)
    return width, height


def title_in(texts: list[str], legend: list[str]) -> tuple[float, float]:
    """Estimated size in inches of the title table: text rows, then legend rows of 6 cells."""
    cell = (TITLE_PT * LINE_EM + 10) / 72  # text, cellpadding 3 pt twice, cellspacing 4 pt
    width = max(len(t) for t in texts) * TITLE_PT * CHAR_EM / 72
    for i in range(0, len(legend), 6):
        width = max(width, sum(len(b) * TITLE_PT * CHAR_EM / 72 + 10 / 72 for b in legend[i:i + 6]))
    return width + 0.2, cell * (len(texts) + math.ceil(len(legend) / 6)) + 0.1


def page_in(graph: tuple[float, float], title: tuple[float, float]) -> tuple[float, float]:
    """The page of a drawing and its title above it, with graphviz's margin."""
    return max(graph[0], title[0]) + 2 * PAD_IN, graph[1] + title[1] + 2 * PAD_IN


def fits(size: tuple[float, float], page: tuple[float, float]) -> bool:
    """Whether a drawing of ``size`` inches fits ``page``."""
    return size[0] <= page[0] and size[1] <= page[1]


def layout_work(n_nodes: int, spans: np.ndarray) -> int:
    """Nodes plus edge segments of a layered layout: an edge across ``k`` ranks is ``k``
    segments (a flat edge inside one rank counts as one)."""
    return n_nodes + int(np.maximum(spans, 1).sum())
