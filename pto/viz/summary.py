"""The summarized drawing: tasks grouped by (band of levels, InCore function), the bands
wrapped into rows, its estimated size and its DOT text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pto.viz.dot import (
    dot_header,
    fill_color,
    human_bytes,
    join_label,
    rank_groups,
    stats_line,
    title_label,
    title_size_in,
)
from pto.viz.dumpgraph import DumpGraph
from pto.viz.sizes import (
    MAX_ASPECT,
    NODE_PT,
    PAGE_IN,
    SCREEN_IN,
    box_in,
    fits,
    layered_in,
    layout_work,
    page_in,
)


@dataclass
class Summary:
    """Tasks collapsed into groups of (band of ``band`` levels, InCore function), the bands
    wrapped into rows of ``cols`` bands."""

    band: int
    group: np.ndarray       # group index of every task
    band_of: np.ndarray     # band index of every group
    base_of: np.ndarray     # InCore function (base index) of every group
    count: np.ndarray       # tasks per group
    edges: np.ndarray       # (E, 3): source group, target group, dependency count
    n_levels: int
    cols: int               # bands per row
    work: int = 0           # nodes plus edge segments of its layout
    offset: int = 0         # band of level v: (v + offset) // band (bands aligned to the graph's period)
    period: int = 0         # the levels after which the graph repeats itself, when it does (0: not found)

    @property
    def n_groups(self) -> int:
        return len(self.count)

    @property
    def n_bands(self) -> int:
        return -(-(self.n_levels + self.offset) // self.band)

    @property
    def rows(self) -> int:
        return -(-self.n_bands // self.cols)

    def texts(self, n_tasks: int) -> list[str]:
        """The title's lines about the summary."""
        if self.band == 1:
            per = "one per InCore function and level"
        elif self.n_bands == 1:
            per = f"one per InCore function over all {self.n_levels:,} levels"
        else:
            per = f"one per InCore function and band of {self.band} levels"
        if self.period and self.band % self.period == 0 and self.n_bands > 1:
            per += f" (the graph repeats every {self.period} levels; a band holds {self.band // self.period})"
        texts = [f"summarized: {n_tasks:,} tasks in {self.n_groups:,} groups: {per}"]
        if self.rows > 1:
            unit = "levels" if self.band == 1 else "bands"
            texts.append(f"{self.rows} rows of {self.cols} {unit}; a dashed box repeats a group of an earlier row")
        return texts


def group_tasks(g: DumpGraph, levels: np.ndarray, band: int, offset: int = 0, period: int = 0) -> Summary:
    """Tasks grouped by (band of ``band`` levels, InCore function), all bands in one row; level v
    falls in band ``(v + offset) // band``."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    nb = max(len(g.base_names), 1)
    key = ((levels + offset) // band) * nb + g.base
    uniq, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    src_task = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    src, dst = group[src_task], group[g.succ]
    keep = src != dst  # dependencies inside a group are not drawn (its count covers them)
    n_groups = len(uniq)
    # one int64 key per group pair: a 1-D unique is much faster than unique(axis=0)
    pair_keys, counts = np.unique(src[keep].astype(np.int64) * n_groups + dst[keep], return_counts=True)
    edges = np.stack([pair_keys // n_groups, pair_keys % n_groups, counts], axis=1)
    s = Summary(band, group, uniq // nb, uniq % nb, np.bincount(group, minlength=n_groups), edges, n_levels, 1,
                offset=offset, period=period)
    return wrap_rows(s, s.n_bands)


def find_period(g: DumpGraph, levels: np.ndarray, longest: int = 64) -> tuple[int, int]:
    """The smallest p (2 to ``longest`` levels, at least three repeats) after which the InCore
    functions present at each level repeat for at least 90% of the levels (a model's layers), and
    the offset that starts a band of p where most bands look alike; (0, 0) when there is none."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    nb = max(len(g.base_names), 1)
    present = np.zeros((n_levels, nb), dtype=bool)
    present[levels, g.base] = True
    sig = np.unique(present, axis=0, return_inverse=True)[1].reshape(-1)  # one id per set of functions
    for p in range(2, min(longest, n_levels // 3) + 1):
        if len(set(sig[:p].tolist())) < 2:
            continue  # the same functions at every level of a period: no structure to show
        if np.mean(sig[p:] == sig[:-p]) >= 0.9:
            return p, max(range(p), key=lambda o, p=p: (_alike(sig, p, o), -o))
    return 0, 0


def _alike(sig: np.ndarray, p: int, offset: int) -> int:
    """How many bands of ``p`` levels starting at ``-offset`` equal the most common one."""
    n = len(sig)
    bands = [tuple(sig[max(b * p - offset, 0):b * p - offset + p].tolist()) for b in range(1, -(-n // p))]
    return max((bands.count(x) for x in set(bands)), default=0)


@dataclass
class _Placement:
    """The nodes of a wrapped summary: its groups, then one dashed copy (a "ghost") per (row,
    source group) of the edges that enter a later row, in a column of their own at the head of
    the rows, so every edge drawn stays inside one row."""

    row: np.ndarray         # row of every node
    col: np.ndarray         # column of every node (column 0 holds the ghosts when there are any)
    ghost_of: np.ndarray    # the group each ghost copies
    edges: np.ndarray       # (E, 3): source node, target node, dependency count

    @property
    def work(self) -> int:
        return layout_work(len(self.row), self.col[self.edges[:, 1]] - self.col[self.edges[:, 0]])


def _place(s: Summary) -> _Placement:
    n = s.n_groups
    row, col = s.band_of // s.cols, s.band_of % s.cols
    a, b, c = s.edges[:, 0], s.edges[:, 1], s.edges[:, 2]
    cross = row[a] != row[b]
    keys, ghost = np.unique(row[b[cross]] * n + a[cross], return_inverse=True)
    src = a.copy()
    src[cross] = n + ghost.reshape(-1)
    shift = 1 if len(keys) else 0
    return _Placement(np.concatenate([row, keys // n]), np.concatenate([col + shift, np.zeros(len(keys), np.int64)]),
                      keys % n, np.stack([src, b, c], axis=1))


def wrap_rows(s: Summary, cols: int) -> Summary:
    """``s`` wrapped into rows of ``cols`` bands (with its layout work)."""
    out = replace(s, cols=cols)
    out.work = _place(out).work
    return out


def _levels_text(s: Summary, first_band: int, last_band: int | None = None) -> str:
    lo = max(first_band * s.band - s.offset, 0)
    hi = min(((first_band if last_band is None else last_band) + 1) * s.band - s.offset, s.n_levels) - 1
    return f"level {lo}" if lo == hi else f"levels {lo}–{hi}"


def _group_labels(g: DumpGraph, s: Summary) -> list[list[str]]:
    buf = np.bincount(s.group, weights=g.buffer_bytes, minlength=s.n_groups)
    nf = max(len(g.func_names), 1)
    variants = np.bincount(np.unique(s.group.astype(np.int64) * nf + g.func) // nf, minlength=s.n_groups)
    labels = []
    for k in range(s.n_groups):
        extra = f", {int(variants[k])} variants" if variants[k] > 1 else ""
        labels.append([f"{g.base_names[s.base_of[k]]} ×{int(s.count[k]):,}",
                       _levels_text(s, int(s.band_of[k])) + extra, f"buffers {human_bytes(int(buf[k]))} in all"])
    return labels


def _ghost_label(g: DumpGraph, s: Summary, k: int) -> list[str]:
    return [f"{g.base_names[s.base_of[k]]} ×{int(s.count[k]):,}", _levels_text(s, int(s.band_of[k]))]


def _stats_bound(g: DumpGraph) -> str:
    """A line as long as the stats line can be (levels and initial parallelism <= tasks)."""
    return f"{g.n_tasks:,} tasks · {g.n_edges:,} edges · {g.n_tasks:,} levels · initial parallelism {g.n_tasks:,}"


def _summary_size_in(g: DumpGraph, s: Summary, boxes: np.ndarray, why: str | None) -> tuple[float, float]:
    """Estimated page size in inches of ``s``; ``boxes`` holds the (width, height) of every group
    and ``why`` is the title's line on why it is not drawn per task."""
    p = _place(s)
    w = np.concatenate([boxes[:, 0], boxes[p.ghost_of, 0]])
    h = np.concatenate([boxes[:, 1], np.full(len(p.ghost_of), box_in(["", ""])[1])])
    graph = layered_in(p.row, p.col, w, h, p.edges[:, 0], p.edges[:, 1])
    return page_in(graph, title_size_in(g, [_stats_bound(g), *s.texts(g.n_tasks), why or ""]))


def fit_rows(g: DumpGraph, s: Summary, page: tuple[float, float] = PAGE_IN,
             why: str | None = None) -> tuple[Summary, tuple[float, float]]:
    """Wrap ``s`` into rows for ``page`` (a title with the line ``why``); returns it with its
    estimated page size in inches.

    One row when that fits and is no wider than a screen or at most ``MAX_ASPECT`` times wider
    than tall; else the number of rows whose drawing needs the smallest share of the page, so
    that its shape follows the page's."""
    boxes = np.array([box_in(lines) for lines in _group_labels(g, s)])
    one = wrap_rows(s, s.n_bands)
    size = _summary_size_in(g, one, boxes, why)
    if fits(size, page) and (size[0] <= SCREEN_IN[0] or size[0] <= MAX_ASPECT * size[1]):
        return one, size
    best = None
    for cols in sorted({-(-s.n_bands // r) for r in range(1, s.n_bands + 1)}, reverse=True):
        wrapped = wrap_rows(s, cols)
        size = _summary_size_in(g, wrapped, boxes, why)
        share = max(size[0] / page[0], size[1] / page[1])
        if best is None or share < best[0] * 0.98:  # more rows only where they clearly help
            best = (share, wrapped, size)
    return best[1], best[2]


def summary_dot(g: DumpGraph, levels: np.ndarray, s: Summary, why: str | None = None) -> str:
    """DOT text with one box per group (node ``g<band>_<function index>``) and one weighted
    arrow per pair of connected groups. Rows are clusters ``cluster_row<k>``; an edge into a later
    row starts at a dashed copy ``x<row>_<group node>`` of its source at the head of that row."""
    texts = [stats_line(g, levels), *s.texts(g.n_tasks)] + ([why] if why else [])
    lines = dot_header(title_label(g, texts), s.work, rows=s.rows > 1)
    names = [f"g{int(b)}_{int(f)}" for b, f in zip(s.band_of, s.base_of)]
    p = _place(s)
    ghosts = [f"x{int(r)}_{names[k]}" for r, k in zip(p.row[s.n_groups:], p.ghost_of)]
    for k, label in enumerate(_group_labels(g, s)):
        lines.append(f'  {names[k]} [label={join_label(label)}, fillcolor="{fill_color(int(s.base_of[k]))}"];')
    for name, k in zip(ghosts, p.ghost_of.tolist()):
        lines.append(f'  {name} [label={join_label(_ghost_label(g, s, k))}, style="filled,rounded,dashed", '
                     f'fillcolor="{fill_color(int(s.base_of[k]))}"];')
    nodes = names + ghosts
    if s.rows == 1:
        lines += rank_groups(p.col, nodes)
    else:
        # An invisible spine, one node per column chained left to right, gives every row the
        # same columns; one invisible anchor per row in the first column, all children of a hub
        # whose edges keep their order (ordering=out: top to bottom in a left-to-right layout),
        # stacks the rows in order (flat edges between the anchors do not order clusters).
        n_cols = int(p.col.max()) + 1
        spine = [f"c{c}" for c in range(n_cols)]
        anchors = [f"r{r}" for r in range(s.rows)]
        lines.append("  node [shape=point, style=invis, width=0, height=0];")
        lines.append("  " + " -> ".join(spine) + " [style=invis];" if n_cols > 1 else f"  {spine[0]};")
        lines.append("  hub [ordering=out];")
        lines += [f"  hub -> {a} [style=invis];" for a in anchors]
        for r in range(s.rows):
            members = " ".join(nodes[i] + ";" for i in np.flatnonzero(p.row == r))
            where = _levels_text(s, r * s.cols, min((r + 1) * s.cols, s.n_bands) - 1)
            lines.append(f'  subgraph cluster_row{r} {{ label="{where}"; fontsize={NODE_PT}; style=rounded; '
                         f'color="#bbbbbb"; {anchors[r]}; {members} }}')
        heads = {c: spine[c] for c in range(n_cols)}
        heads[0] += "; " + "; ".join(anchors)
        lines += rank_groups(p.col, nodes, heads)
    for a, b, c in p.edges.tolist():
        width = 0.8 + 0.6 * float(np.log10(c))
        # an xlabel is placed after layout; a plain label would add a rank between all ranks
        lines.append(f'  {nodes[a]} -> {nodes[b]} [xlabel="{c:,}", penwidth={width:.2f}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
