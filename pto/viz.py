"""Draw a task-graph dump with graphviz (``pto visualize DUMP OUT.pdf``).

The drawing runs left to right; every task sits in the rank (column) of its dependency level,
the length of the longest predecessor chain that leads to it, so a column is a set of tasks that
may run together once everything to their left has finished. Boxes carry the task id, the
InCore function (variant) and the task's buffer size, filled with one color per InCore function;
the title gives task, edge and level counts, the initial parallelism (tasks without
predecessors), what was summarized, and a color legend.

**Readable at 100% zoom, whatever the graph's size.** A drawing fits a page of at most
:data:`PAGE_IN` (60 x 36 in: about three by three full-HD screens at 100% zoom, 96 dpi) and its
smallest text is :data:`MIN_FONT_PT` (10 pt; boxes 12 pt, title 14 pt). Graphviz never scales
it (no ``size`` attribute), so the fonts on the page are the fonts set here. A graph is drawn
task by task only when that drawing fits the page (and has at most ``max_nodes`` tasks, when a
limit is given). Otherwise the tasks of one InCore function in one band of levels become one
node "function ×count", with the narrowest band (1, 2, 4, ... levels) whose drawing fits, and
the edges between two groups become one edge labelled with their count, its width growing with
the count's log. A long chain of bands is wrapped into rows stacked top to bottom (one cluster
per row, all rows sharing the columns). A dependency into a later row starts at a dashed copy of
its source group at the head of that row, so no arrow runs back across the page.

Sizes are first estimated from the labels (cheap), then measured: ``dot`` lays out the chosen
drawing once, writing the output and its ``-Tplain`` layout in the same run, and a drawing that
turns out larger than the page is replaced by the next coarser one. Graphviz's layered layout
turns an edge that spans ``k`` ranks into ``k`` segments, and its time grows faster than linearly
with nodes plus segments (about 1 s at 4,000, 5 s at 15,000 and a minute at 60,000 on one core),
so a drawing above ``LAYOUT_BUDGET`` of them is not attempted.

DOT text is generated here (no graphviz Python package needed); pdf, svg and png are rendered by
graphviz's ``dot`` binary in a subprocess, ``dot`` format is the DOT text itself.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pto.dump import read_dump
from pto.errors import ParseError, PTOError, UsageError

FORMATS = ("pdf", "svg", "png", "dot")
# The largest page, in inches: 60 x 36 in is 5,760 x 3,456 px at 100% zoom (96 dpi), three
# full-HD screens across and about three down.
PAGE_IN = (60.0, 36.0)
# Font sizes in points; nothing on the page is smaller than MIN_FONT_PT (10 pt is 13 px at 100%).
TITLE_PT, NODE_PT, EDGE_PT = 14, 12, 10
MIN_FONT_PT = min(TITLE_PT, NODE_PT, EDGE_PT)
# graphviz spacing (inches) between boxes of one rank and between ranks
NODESEP, RANKSEP = 0.15, 0.6
# nodes plus edge segments a drawing may have: a few seconds of `dot` (see the module docstring)
LAYOUT_BUDGET = 10_000
# above this many nodes plus segments, cap dot's crossing-minimization and positioning passes:
# a slightly less tidy picture instead of minutes of optimization
TUNE_ABOVE = 1_000
# a safety net only: drawings that fit the page render in seconds
RENDER_TIMEOUT_S = 300

# Fill colors (light, so black text stays readable), assigned to InCore functions in the order
# their first variant was registered, which makes the colors stable for a given program.
PALETTE = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
           "#9edae5", "#d9d9d9", "#fdd0a2", "#bcbddc")


@dataclass
class DumpGraph:
    """The parts of a dump a drawing needs, as arrays indexed by task position (id order).

    ``succ[ptr[i]:ptr[i+1]]`` are the positions of the successors of task ``i``; ``func[i]``
    indexes ``func_names`` (variant names, e.g. ``matmul_tile__K256_N256_R32``) and
    ``base[i]`` indexes ``base_names`` (the InCore function, e.g. ``matmul_tile``).
    """

    path: str
    ids: np.ndarray
    func: np.ndarray
    func_names: list[str]
    base: np.ndarray
    base_names: list[str]
    buffer_bytes: np.ndarray
    ptr: np.ndarray
    succ: np.ndarray

    @property
    def n_tasks(self) -> int:
        return len(self.ids)

    @property
    def n_edges(self) -> int:
        return len(self.succ)


def base_name(variant: str) -> str:
    """The InCore function of a variant name (``rope_tile__R32`` -> ``rope_tile``)."""
    return variant.split("__", 1)[0]


def load_dump(path: str | Path) -> DumpGraph:
    """Read a dump (``pto.runtime.read_dump``) into arrays.

    Raises:
        UsageError: the file cannot be read.
        ParseError: it is not a well-formed dump, or an edge names a task the dump lacks.
    """
    try:
        dump = read_dump(path)
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not a task-graph dump (binary data at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"cannot read task-graph dump {path}: {exc.strerror or exc}") from None
    tasks = dump.tasks
    n = len(tasks)
    ids = np.fromiter((t.id for t in tasks), np.int64, n)
    # func ids index the FUNC table; keep a dense local numbering in registration order
    fids = sorted(dump.funcs)
    local = {fid: k for k, fid in enumerate(fids)}
    func_names = [dump.funcs[f] for f in fids]
    unknown = [t for t in tasks if t.func_id not in local]
    if unknown:
        raise ParseError(f"{path}: task {unknown[0].id} uses function id {unknown[0].func_id}, "
                         "which has no FUNC line")
    func = np.fromiter((local[t.func_id] for t in tasks), np.int32, n)
    base_names: list[str] = []
    base_of_func = []
    for name in func_names:
        b = base_name(name)
        if b not in base_names:
            base_names.append(b)
        base_of_func.append(base_names.index(b))
    base = np.asarray(base_of_func, np.int32)[func] if n else np.zeros(0, np.int32)
    buffer_bytes = np.fromiter((t.buffer_bytes for t in tasks), np.int64, n)
    counts = np.fromiter((len(t.fanout) for t in tasks), np.int64, n)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    succ_ids = np.fromiter((s for t in tasks for s in t.fanout), np.int64, int(ptr[-1]))
    # task ids ascend through the dump, so a binary search maps ids to positions
    if n and np.any(np.diff(ids) <= 0):
        raise ParseError(f"{path}: task ids are not strictly increasing")
    pos = np.searchsorted(ids, succ_ids)
    bad = (pos >= n) | (ids[np.minimum(pos, max(n - 1, 0))] != succ_ids) if n else succ_ids >= 0
    if np.any(bad):
        k = int(np.argmax(bad))
        owner = int(ids[np.searchsorted(ptr, k, side="right") - 1])
        raise ParseError(f"{path}: task {owner} has successor {int(succ_ids[k])}, which is not in the dump")
    return DumpGraph(str(path), ids, func, func_names, base, base_names, buffer_bytes, ptr,
                     pos.astype(np.int64))


def compute_levels(ptr: np.ndarray, succ: np.ndarray, path: str = "graph") -> np.ndarray:
    """Dependency level of every task: 0 without predecessors, else 1 + the highest level of
    its predecessors (the longest path to it).

    Kahn's algorithm, one whole frontier at a time: every edge is looked at exactly once, when
    its source enters the frontier, so the cost is linear in tasks plus edges (numpy per level).

    Raises:
        ParseError: the edges contain a cycle (not a task graph).
    """
    n = len(ptr) - 1
    indeg = np.bincount(succ, minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    level = np.full(n, -1, np.int64)
    owner = np.empty(n, np.int64)
    frontier = np.nonzero(indeg == 0)[0]
    depth = 0
    while len(frontier):
        level[frontier] = depth
        starts, counts = ptr[frontier], ptr[frontier + 1] - ptr[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        # positions of all outgoing edges of the frontier, without a Python loop
        offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        targets = succ[offsets + np.arange(total)]
        np.subtract.at(indeg, targets, 1)
        ready = targets[indeg[targets] == 0]
        # a task reached by several frontier edges appears several times: keep one copy
        # (the index written last for each task wins, whichever that is; no sort needed)
        owner[ready] = np.arange(len(ready))
        frontier = ready[owner[ready] == np.arange(len(ready))]
        depth += 1
    if np.any(level < 0):
        stuck = int(np.argmax(level < 0))
        raise ParseError(f"{path}: the dependencies contain a cycle (through task position {stuck})")
    return level


def human_bytes(n: int) -> str:
    """``512 B``, ``4.0 KiB``, ``1.5 MiB`` ..."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------
# sizes: estimates that choose a drawing before graphviz measures it
# ------------------------------------------------------------------------------------------

# Helvetica (Liberation Sans) averages 0.56-0.58 em on names, digits and underscores and dot's
# lines are about 1.1 em apart; both rounded up, so that estimates err on the large side.
CHAR_EM, LINE_EM = 0.6, 1.2
NODE_MARGIN_IN = (0.08, 0.04)
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


def _box_in(lines: list[str], pt: float = NODE_PT) -> tuple[float, float]:
    """Estimated size in inches of a box with these label lines (graphviz's minimum is 0.75 x 0.5)."""
    chars = max(len(s) for s in lines)
    return (max(0.75, chars * pt * CHAR_EM / 72 + 2 * NODE_MARGIN_IN[0]),
            max(0.5, len(lines) * pt * LINE_EM / 72 + 2 * NODE_MARGIN_IN[1]))


def _capacity(page: tuple[float, float]) -> int:
    """The most boxes of the minimum size a page can hold: more never fit."""
    return int((page[0] + RANKSEP) // (0.75 + RANKSEP)) * int((page[1] + NODESEP) // (0.5 + NODESEP))


def _layered_in(row: np.ndarray, col: np.ndarray, w: np.ndarray, h: np.ndarray, src: np.ndarray,
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


def _title_in(texts: list[str], legend: list[str]) -> tuple[float, float]:
    """Estimated size in inches of the title table: text rows, then legend rows of 6 cells."""
    cell = (TITLE_PT * LINE_EM + 10) / 72  # text, cellpadding 3 pt twice, cellspacing 4 pt
    width = max(len(t) for t in texts) * TITLE_PT * CHAR_EM / 72
    for i in range(0, len(legend), 6):
        width = max(width, sum(len(b) * TITLE_PT * CHAR_EM / 72 + 10 / 72 for b in legend[i:i + 6]))
    return width + 0.2, cell * (len(texts) + math.ceil(len(legend) / 6)) + 0.1


def _page_in(graph: tuple[float, float], title: tuple[float, float]) -> tuple[float, float]:
    return max(graph[0], title[0]) + 2 * PAD_IN, graph[1] + title[1] + 2 * PAD_IN


def _fits(size: tuple[float, float], page: tuple[float, float]) -> bool:
    return size[0] <= page[0] and size[1] <= page[1]


# ------------------------------------------------------------------------------------------
# DOT text
# ------------------------------------------------------------------------------------------

def _color(base_index: int) -> str:
    return PALETTE[base_index % len(PALETTE)]


def _stats(g: DumpGraph, levels: np.ndarray) -> str:
    n_levels = int(levels.max()) + 1 if g.n_tasks else 0
    return (f"{g.n_tasks:,} tasks · {g.n_edges:,} edges · {n_levels:,} levels · "
            f"initial parallelism {int(np.count_nonzero(levels == 0)):,}")


def _title(g: DumpGraph, texts: list[str]) -> str:
    """An HTML-like graph label: the file name, ``texts`` one a row, the color legend (6 a row)."""
    rows = [f'<tr><td colspan="6"><b>{html.escape(Path(g.path).name)}</b></td></tr>']
    rows += [f'<tr><td colspan="6">{html.escape(t)}</td></tr>' for t in texts]
    cells = [f'<td bgcolor="{_color(k)}">{html.escape(b)}</td>' for k, b in enumerate(g.base_names)]
    for i in range(0, len(cells), 6):
        rows.append("<tr>" + "".join(cells[i:i + 6]) + "</tr>")
    return '<<table border="0" cellspacing="4" cellpadding="3">' + "".join(rows) + "</table>>"


def _title_texts_in(g: DumpGraph, texts: list[str]) -> tuple[float, float]:
    return _title_in([Path(g.path).name, *texts], g.base_names)


def _header(title: str, work: int, rows: bool = False) -> list[str]:
    tune = ", mclimit=0.1, nslimit=1, nslimit1=1" if work > TUNE_ABOVE else ""
    # newrank lets a rank=same group take nodes from several clusters (the rows)
    newrank = ", newrank=true" if rows else ""
    return [
        "digraph taskgraph {",
        f"  graph [rankdir=LR, labelloc=t, fontname=Helvetica, fontsize={TITLE_PT}, nodesep={NODESEP}, "
        f"ranksep={RANKSEP}{newrank}{tune}, label={title}];",
        f'  node [shape=box, style="filled,rounded", fontname=Helvetica, fontsize={NODE_PT}, '
        f'margin="{NODE_MARGIN_IN[0]},{NODE_MARGIN_IN[1]}"];',
        f'  edge [color="#555555", arrowsize=0.5, fontname=Helvetica, fontsize={EDGE_PT}];',
    ]


def layout_work(n_nodes: int, spans: np.ndarray) -> int:
    """Nodes plus edge segments of a layered layout: an edge across ``k`` ranks is ``k``
    segments (a flat edge inside one rank counts as one)."""
    return n_nodes + int(np.maximum(spans, 1).sum())


def _task_spans(g: DumpGraph, levels: np.ndarray) -> np.ndarray:
    return levels[g.succ] - np.repeat(levels, np.diff(g.ptr))


def _rank_groups(keys: np.ndarray, names: list[str], extra: dict[int, str] | None = None) -> list[str]:
    """One ``{rank=same; ...}`` line per distinct key (level or column), in key order, starting
    with ``extra[key]`` where given."""
    order = np.argsort(keys, kind="stable")
    lines = []
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for chunk in np.split(order, bounds):
        if len(chunk):
            first = f"{extra[int(keys[chunk[0]])]}; " if extra else ""
            lines.append("  { rank=same; " + first + " ".join(names[i] + ";" for i in chunk) + " }")
    return lines


def _task_label(g: DumpGraph, k: int) -> list[str]:
    return [f"task {int(g.ids[k])}", g.func_names[g.func[k]], human_bytes(int(g.buffer_bytes[k]))]


def detail_size_in(g: DumpGraph, levels: np.ndarray) -> tuple[float, float]:
    """Estimated page size in inches of the drawing with one box per task."""
    if not g.n_tasks:
        return _page_in((0.0, 0.0), _title_texts_in(g, [_stats(g, levels)]))
    name_len = np.array([len(n) for n in g.func_names])[g.func]
    chars = np.maximum(name_len, len(f"task {int(g.ids.max())}"))
    w = np.maximum(0.75, chars * NODE_PT * CHAR_EM / 72 + 2 * NODE_MARGIN_IN[0])
    h = np.full(g.n_tasks, _box_in(["", "", ""])[1])
    src = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    graph = _layered_in(np.zeros(g.n_tasks, np.int64), levels, w, h, src, g.succ)
    return _page_in(graph, _title_texts_in(g, [_stats(g, levels)]))


def detail_dot(g: DumpGraph, levels: np.ndarray) -> str:
    """DOT text with one box per task (node ``t<id>``) and one arrow per dependency."""
    work = layout_work(g.n_tasks, _task_spans(g, levels))
    lines = _header(_title(g, [_stats(g, levels)]), work)
    names = [f"t{int(i)}" for i in g.ids]
    for k in range(g.n_tasks):
        lines.append(f'  {names[k]} [label="{_join(_task_label(g, k))}", fillcolor="{_color(int(g.base[k]))}"];')
    lines += _rank_groups(levels, names)
    src = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    lines += [f"  {names[a]} -> {names[b]};" for a, b in zip(src.tolist(), g.succ.tolist())]
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# summaries
# ------------------------------------------------------------------------------------------

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

    @property
    def n_groups(self) -> int:
        return len(self.count)

    @property
    def n_bands(self) -> int:
        return -(-self.n_levels // self.band)

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
        texts = [f"summarized: {n_tasks:,} tasks in {self.n_groups:,} groups: {per}"]
        if self.rows > 1:
            unit = "levels" if self.band == 1 else "bands"
            texts.append(f"{self.rows} rows of {self.cols} {unit}; a dashed box repeats a group of an earlier row")
        return texts


def group_tasks(g: DumpGraph, levels: np.ndarray, band: int) -> Summary:
    """Tasks grouped by (band of ``band`` levels, InCore function), all bands in one row."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    nb = max(len(g.base_names), 1)
    key = (levels // band) * nb + g.base
    uniq, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    src_task = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    src, dst = group[src_task], group[g.succ]
    keep = src != dst  # dependencies inside a group are not drawn (its count covers them)
    n_groups = len(uniq)
    # one int64 key per group pair: a 1-D unique is much faster than unique(axis=0)
    pair_keys, counts = np.unique(src[keep].astype(np.int64) * n_groups + dst[keep], return_counts=True)
    edges = np.stack([pair_keys // n_groups, pair_keys % n_groups, counts], axis=1)
    s = Summary(band, group, uniq // nb, uniq % nb, np.bincount(group, minlength=n_groups), edges, n_levels, 1)
    return wrap_rows(s, s.n_bands)


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
    lo = first_band * s.band
    hi = min(((first_band if last_band is None else last_band) + 1) * s.band, s.n_levels) - 1
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
    h = np.concatenate([boxes[:, 1], np.full(len(p.ghost_of), _box_in(["", ""])[1])])
    graph = _layered_in(p.row, p.col, w, h, p.edges[:, 0], p.edges[:, 1])
    return _page_in(graph, _title_texts_in(g, [_stats_bound(g), *s.texts(g.n_tasks), why or ""]))


def fit_rows(g: DumpGraph, s: Summary, page: tuple[float, float] = PAGE_IN,
             why: str | None = None) -> tuple[Summary, tuple[float, float]]:
    """Wrap ``s`` into rows for ``page`` (a title with the line ``why``); returns it with its
    estimated page size in inches.

    One row when that fits and is no wider than a screen or at most ``MAX_ASPECT`` times wider
    than tall; else the number of rows whose drawing needs the smallest share of the page, so
    that its shape follows the page's."""
    boxes = np.array([_box_in(lines) for lines in _group_labels(g, s)])
    one = wrap_rows(s, s.n_bands)
    size = _summary_size_in(g, one, boxes, why)
    if _fits(size, page) and (size[0] <= SCREEN_IN[0] or size[0] <= MAX_ASPECT * size[1]):
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
    texts = [_stats(g, levels), *s.texts(g.n_tasks)] + ([why] if why else [])
    lines = _header(_title(g, texts), s.work, rows=s.rows > 1)
    names = [f"g{int(b)}_{int(f)}" for b, f in zip(s.band_of, s.base_of)]
    p = _place(s)
    ghosts = [f"x{int(r)}_{names[k]}" for r, k in zip(p.row[s.n_groups:], p.ghost_of)]
    for k, label in enumerate(_group_labels(g, s)):
        lines.append(f'  {names[k]} [label="{_join(label)}", fillcolor="{_color(int(s.base_of[k]))}"];')
    for name, k in zip(ghosts, p.ghost_of.tolist()):
        lines.append(f'  {name} [label="{_join(_ghost_label(g, s, k))}", style="filled,rounded,dashed", '
                     f'fillcolor="{_color(int(s.base_of[k]))}"];')
    nodes = names + ghosts
    if s.rows == 1:
        lines += _rank_groups(p.col, nodes)
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
        lines += _rank_groups(p.col, nodes, heads)
    for a, b, c in p.edges.tolist():
        width = 0.8 + 0.6 * float(np.log10(c))
        # an xlabel is placed after layout; a plain label would add a rank between all ranks
        lines.append(f'  {nodes[a]} -> {nodes[b]} [xlabel="{c:,}", penwidth={width:.2f}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _join(lines: list[str]) -> str:
    return "\\n".join(lines)


# ------------------------------------------------------------------------------------------
# choosing the drawing
# ------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    """A summary to try, its estimated page size in inches, and whether it is the last resort
    (one band: one box per InCore function)."""

    summary: Summary
    size: tuple[float, float]
    last: bool = False


def _check_max_nodes(max_nodes: int | None) -> None:
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise UsageError(f"max_nodes must be a positive integer or None, got {max_nodes!r}")


def _check_page(page: tuple[float, float]) -> tuple[float, float]:
    try:
        w, h = (float(x) for x in page)
    except (TypeError, ValueError):
        raise UsageError(f"page must be (width, height) in inches, got {page!r}") from None
    if not (w >= 1 and h >= 1 and math.isfinite(w * h)):
        raise UsageError(f"page {w:g} x {h:g} in: both sides must be at least 1 inch")
    return w, h


def _detail_refusal(g: DumpGraph, levels: np.ndarray, max_nodes: int | None,
                    page: tuple[float, float]) -> tuple[str | None, tuple[float, float] | None]:
    """Why the graph cannot be drawn task by task (None when it may be, by estimate), and the
    estimated page size when that was the reason."""
    if max_nodes is not None and g.n_tasks > max_nodes:
        return f"more than max_nodes = {max_nodes:,} tasks", None
    size = detail_size_in(g, levels)
    if not _fits(size, page):
        return _too_big(size, page), size
    work = layout_work(g.n_tasks, _task_spans(g, levels))
    if work > LAYOUT_BUDGET:
        return (f"its layout would have {work:,} nodes plus edge segments "
                f"(more than {LAYOUT_BUDGET:,}: minutes of graphviz)"), size
    return None, size


def _too_big(size: tuple[float, float], page: tuple[float, float]) -> str:
    return (f"it would be about {size[0]:.0f} x {size[1]:.0f} in, more than the {page[0]:g} x {page[1]:g} in "
            f"page that keeps {MIN_FONT_PT} pt text readable at 100% zoom")


def _summary_plans(g: DumpGraph, levels: np.ndarray, max_nodes: int | None, page: tuple[float, float],
                   why: str | None) -> Iterator[_Plan]:
    """Summaries with bands of 1, 2, 4, ... levels that may fit (by count, budget and estimate),
    then the one-band summary whatever its size."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    band = 1
    while band < n_levels:
        s = group_tasks(g, levels, band)
        if s.n_groups <= min(max_nodes or s.n_groups, _capacity(page)):
            s, size = fit_rows(g, s, page, why)
            if s.work <= LAYOUT_BUDGET and _fits(size, page):
                yield _Plan(s, size)
        band *= 2
    s, size = fit_rows(g, group_tasks(g, levels, n_levels), page, why)
    yield _Plan(s, size, last=True)


def summarize(g: DumpGraph, levels: np.ndarray, max_nodes: int | None = None,
              page: tuple[float, float] = PAGE_IN, why: str | None = None) -> Summary:
    """The narrowest summary (bands of 1, 2, 4, ... levels) with at most ``max_nodes`` groups
    whose estimated drawing, wrapped into rows, fits ``page`` (inches) under a title with the
    line ``why``, or one band for the whole graph."""
    return next(_summary_plans(g, levels, max_nodes, _check_page(page), why)).summary


def to_dot(g: DumpGraph, max_nodes: int | None = None,
           page: tuple[float, float] = PAGE_IN) -> tuple[str, Summary | None]:
    """The DOT text of a loaded dump, chosen by estimated size alone (:func:`draw` also measures):
    per task when that fits ``page`` and ``max_nodes``, else summarized (then also the
    :class:`Summary`)."""
    _check_max_nodes(max_nodes)
    page = _check_page(page)
    levels = compute_levels(g.ptr, g.succ, g.path)
    refusal, size = _detail_refusal(g, levels, max_nodes, page)
    if refusal is None:
        return detail_dot(g, levels), None
    s = summarize(g, levels, max_nodes, page, _why(refusal))
    return summary_dot(g, levels, s, _why(refusal)), s


def _why(refusal: str) -> str:
    return f"not drawn per task: {refusal}"


# ------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------

def resolve_format(out: str | Path, fmt: str | None) -> str:
    """``fmt`` if given, else from the suffix of ``out`` (``.gv`` is dot; none means pdf)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        return fmt
    suffix = Path(out).suffix.lower().lstrip(".")
    if not suffix:
        return "pdf"
    if suffix == "gv":
        return "dot"
    if suffix not in FORMATS:
        raise UsageError(f"cannot tell the format from {str(out)!r}; use a .pdf/.svg/.png/.dot name "
                         "or --format")
    return suffix


def check_output(dump: str | Path, out: str | Path) -> Path:
    """Refuse, before any work, an output that cannot be written or that is the dump itself
    (same path, or the same file through a link or another path)."""
    if not str(out).strip():
        raise UsageError("the output path is empty")
    out = Path(out)
    same = (os.path.samefile(dump, out) if os.path.exists(dump) and os.path.exists(out)
            else os.path.realpath(dump) == os.path.realpath(out))
    if same:
        raise UsageError(f"output {out} is the dump {dump} itself: drawing it would overwrite the input")
    if out.is_dir():
        raise UsageError(f"cannot write {out}: it is a folder")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {out}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UsageError(f"cannot write {out}: permission denied")
    return out


def dot_binary() -> str:
    """Path of graphviz's ``dot``, or a PTOError saying how to do without it."""
    exe = shutil.which("dot")
    if exe is None:
        raise PTOError("graphviz's `dot` program is not installed (e.g. apt-get install graphviz); "
                       "--format dot writes the DOT text without it")
    return exe


def _run_dot(exe: str, dot_text: str, fmt: str, folder: str) -> tuple[tuple[float, float], str | None]:
    """Lay out ``dot_text`` once, writing the layout (``-Tplain``) and, unless ``fmt`` is dot,
    the drawing into ``folder``. Returns the page size in inches and the drawing's path."""
    plain = os.path.join(folder, "layout.plain")
    drawing = None if fmt == "dot" else os.path.join(folder, f"drawing.{fmt}")
    cmd = [exe, "-Tplain", "-o", plain] + ([] if drawing is None else [f"-T{fmt}", "-o", drawing])
    try:
        r = subprocess.run(cmd, input=dot_text, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PTOError(f"dot did not finish in {RENDER_TIMEOUT_S} s; use a smaller --max-nodes "
                       "or --format dot") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        raise PTOError(f"dot -T{fmt} failed (exit {r.returncode}): {lines[0] if lines else 'no message'}")
    with open(plain, encoding="utf-8") as f:
        head = f.readline().split()  # "graph <scale> <width> <height>", inches without the margin
    return (float(head[2]) + 2 * PAD_IN, float(head[3]) + 2 * PAD_IN), drawing


def render(dot_text: str, out: str | Path, fmt: str) -> tuple[float, float] | None:
    """Write ``dot_text`` to ``out``, rendered with ``dot -T<fmt>`` unless ``fmt`` is dot; returns
    the page size in inches (None for dot text)."""
    out = Path(out)
    if not out.absolute().parent.is_dir():
        raise UsageError(f"cannot write {out}: folder {out.absolute().parent} does not exist")
    if fmt == "dot":
        out.write_text(dot_text)
        return None
    exe = dot_binary()
    with tempfile.TemporaryDirectory(prefix="pto-viz-") as tmp:
        size, drawing = _run_dot(exe, dot_text, fmt, tmp)
        shutil.copyfile(drawing, out)
    return size


@dataclass
class Drawing:
    """What :func:`draw` wrote."""

    path: str
    fmt: str
    n_tasks: int
    summary: Summary | None          # None: one box per task
    width_in: float                  # the page, measured by graphviz (estimated for dot text
    height_in: float                 # without graphviz installed)
    measured: bool
    texts: list[str]                 # the title's lines about what was drawn
    note: str | None                 # one line for the user when max_nodes was not honoured


def draw(dump: str | Path, out: str | Path, fmt: str | None = None, max_nodes: int | None = None,
         page: tuple[float, float] = PAGE_IN) -> Drawing:
    """Draw the dump at ``dump`` into ``out`` (pdf, svg, png or dot), readable at 100% zoom.

    One box per task when that drawing fits ``page`` (inches; default :data:`PAGE_IN`) and the
    graph has at most ``max_nodes`` tasks (None: no limit); otherwise a summary by (band of
    levels, InCore function), wrapped into rows, with at most ``max_nodes`` groups (or one per
    InCore function, the coarsest). ``note`` says why, when the graph has at most ``max_nodes``
    tasks and was still summarized, or when even the coarsest drawing exceeds the page.

    Raises:
        UsageError: bad format, ``max_nodes`` or page; an output that cannot be written or is the
            dump itself (all checked before the dump is read); an unreadable dump.
        ParseError: a malformed dump (the message names the file and line).
        PTOError: ``dot`` is missing or failed.
    """
    _check_max_nodes(max_nodes)
    page = _check_page(page)
    out = check_output(dump, out)
    fmt = resolve_format(out, fmt)
    exe = shutil.which("dot") if fmt == "dot" else dot_binary()
    g = load_dump(dump)
    levels = compute_levels(g.ptr, g.succ, g.path)
    refusal, _ = _detail_refusal(g, levels, max_nodes, page)
    with tempfile.TemporaryDirectory(prefix="pto-viz-") as tmp:
        s = None
        if refusal is None:
            text = detail_dot(g, levels)
            size, drawing = _run_dot(exe, text, fmt, tmp) if exe else (detail_size_in(g, levels), None)
            if not _fits(size, page):  # measured larger than estimated
                refusal = _too_big(size, page)
        if refusal is not None:
            why = _why(refusal)
            for plan in _summary_plans(g, levels, max_nodes, page, why):
                s, text = plan.summary, summary_dot(g, levels, plan.summary, why)
                size, drawing = _run_dot(exe, text, fmt, tmp) if exe else (plan.size, None)
                if _fits(size, page) or plan.last:
                    break
        if drawing is None:
            out.write_text(text)
        else:
            shutil.copyfile(drawing, out)
    texts = [] if s is None else [*s.texts(g.n_tasks), _why(refusal)]
    return Drawing(str(out), fmt, g.n_tasks, s, size[0], size[1], exe is not None, texts,
                   _note(g, s, max_nodes, refusal, size, page))


def _note(g: DumpGraph, s: Summary | None, max_nodes: int | None, refusal: str | None,
          size: tuple[float, float], page: tuple[float, float]) -> str | None:
    notes = []
    if s is not None and max_nodes is not None and g.n_tasks <= max_nodes:
        notes.append(f"drew {g.n_tasks:,} tasks as {s.n_groups:,} groups, not one box per task as "
                     f"max_nodes = {max_nodes:,} allows: {refusal}")
    if s is not None and max_nodes is not None and s.n_groups > max_nodes:
        notes.append(f"drew {s.n_groups:,} groups, more than max_nodes = {max_nodes:,}: one per InCore "
                     "function is the coarsest summary")
    if not _fits(size, page):
        notes.append(f"the drawing is {size[0]:.0f} x {size[1]:.0f} in, more than the {page[0]:g} x {page[1]:g} "
                     "in page")
    return "; ".join(notes) or None


def visualize(dump: str | Path, out: str | Path, fmt: str | None = None, max_nodes: int | None = None,
              page: tuple[float, float] = PAGE_IN) -> str:
    """:func:`draw`, returning only the path written."""
    return draw(dump, out, fmt, max_nodes, page).path


def parse_page(text: str) -> tuple[float, float]:
    """``"60x36"`` -> (60.0, 36.0): a page size in inches as a command line writes it."""
    try:
        w, h = (float(x) for x in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"page {text!r}: expected WIDTHxHEIGHT in inches, e.g. 60x36") from None
    return _check_page((w, h))


__all__ = ["FORMATS", "MIN_FONT_PT", "PAGE_IN", "Drawing", "DumpGraph", "Summary", "check_output",
           "compute_levels", "detail_dot", "detail_size_in", "draw", "fit_rows", "group_tasks", "human_bytes",
           "layout_work", "load_dump", "parse_page", "render", "resolve_format", "summarize", "summary_dot",
           "to_dot", "visualize", "wrap_rows"]
