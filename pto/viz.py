"""Draw a task-graph dump with graphviz (``pto visualize DUMP OUT.pdf``).

The drawing runs left to right; every task sits in the rank (column) of its dependency level,
the length of the longest predecessor chain that leads to it, so a column is a set of tasks that
may run together once everything to their left has finished. Boxes carry the task id, the
InCore function (variant) and the task's buffer size, filled with one color per InCore function;
the title gives task, edge and level counts, the initial parallelism (tasks without
predecessors) and a color legend.

Graphviz's layered layout turns an edge that spans ``k`` levels into ``k`` segments (``k - 1``
virtual nodes), and its time grows faster than linearly with nodes plus segments (about 1 s at
4,000, 5 s at 15,000 and a minute at 60,000 on one core). So a graph with more than
``max_nodes`` tasks, or whose layout would exceed ``LAYOUT_BUDGET`` nodes plus segments, is
summarized instead of drawn task by task: all tasks of one function in one level become one
node "function ×count", and the edges between two groups become one edge whose width grows with
the log of their count (the count is its label). When that still gives more than ``max_nodes``
groups or exceeds the budget, consecutive levels are merged into bands of 2, 4, 8, ... levels
until it fits. The title says so.

DOT text is generated here (no graphviz Python package needed); pdf, svg and png are rendered by
graphviz's ``dot`` binary in a subprocess, ``dot`` format is the DOT text itself.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pto.dump import read_dump
from pto.errors import ParseError, PTOError, UsageError

FORMATS = ("pdf", "svg", "png", "dot")
# nodes plus edge segments a drawing may have: a few seconds of `dot` (see the module docstring)
LAYOUT_BUDGET = 10_000
# above this many nodes plus segments, cap dot's crossing-minimization and positioning passes:
# a slightly less tidy picture instead of minutes of optimization
TUNE_ABOVE = 1_000
# a safety net only: summarized graphs render in seconds
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
# DOT text
# ------------------------------------------------------------------------------------------

def _color(base_index: int) -> str:
    return PALETTE[base_index % len(PALETTE)]


def _title(g: DumpGraph, n_levels: int, initial: int, note: str | None) -> str:
    """An HTML-like graph label: file, counts, summary note, color legend (6 functions a row)."""
    name = html.escape(Path(g.path).name)
    stats = (f"{g.n_tasks:,} tasks · {g.n_edges:,} edges · {n_levels:,} levels · "
             f"initial parallelism {initial:,}")
    rows = [f'<tr><td colspan="6"><b>{name}</b></td></tr>',
            f'<tr><td colspan="6">{stats}</td></tr>']
    if note:
        rows.append(f'<tr><td colspan="6">{html.escape(note)}</td></tr>')
    cells = [f'<td bgcolor="{_color(k)}">{html.escape(b)}</td>' for k, b in enumerate(g.base_names)]
    for i in range(0, len(cells), 6):
        rows.append("<tr>" + "".join(cells[i:i + 6]) + "</tr>")
    return '<<table border="0" cellspacing="4" cellpadding="3">' + "".join(rows) + "</table>>"


def _header(title: str, work: int) -> list[str]:
    tune = ", mclimit=0.1, nslimit=1, nslimit1=1" if work > TUNE_ABOVE else ""
    return [
        "digraph taskgraph {",
        "  graph [rankdir=LR, labelloc=t, fontname=Helvetica, nodesep=0.15, ranksep=0.6"
        f"{tune}, label={title}];",
        '  node [shape=box, style="filled,rounded", fontname=Helvetica, fontsize=10, margin="0.08,0.04"];',
        '  edge [color="#555555", arrowsize=0.5];',
    ]


def layout_work(n_nodes: int, spans: np.ndarray) -> int:
    """Nodes plus edge segments of a layered layout: an edge across ``k`` ranks is ``k``
    segments (a flat edge inside one rank counts as one)."""
    return n_nodes + int(np.maximum(spans, 1).sum())


def _task_spans(g: DumpGraph, levels: np.ndarray) -> np.ndarray:
    return levels[g.succ] - np.repeat(levels, np.diff(g.ptr))


def _rank_groups(keys: np.ndarray, names: list[str]) -> list[str]:
    """One ``{rank=same; ...}`` line per distinct key (level or band), in key order."""
    order = np.argsort(keys, kind="stable")
    lines = []
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for chunk in np.split(order, bounds):
        if len(chunk):
            lines.append("  { rank=same; " + " ".join(names[i] + ";" for i in chunk) + " }")
    return lines


def detail_dot(g: DumpGraph, levels: np.ndarray) -> str:
    """DOT text with one box per task (node ``t<id>``) and one arrow per dependency."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 0
    initial = int(np.count_nonzero(levels == 0))
    work = layout_work(g.n_tasks, _task_spans(g, levels))
    lines = _header(_title(g, n_levels, initial, None), work)
    names = [f"t{int(i)}" for i in g.ids]
    for k in range(g.n_tasks):
        label = f"task {int(g.ids[k])}\\n{g.func_names[g.func[k]]}\\n{human_bytes(int(g.buffer_bytes[k]))}"
        lines.append(f'  {names[k]} [label="{label}", fillcolor="{_color(int(g.base[k]))}"];')
    lines += _rank_groups(levels, names)
    src = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    lines += [f"  {names[a]} -> {names[b]};" for a, b in zip(src.tolist(), g.succ.tolist())]
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass
class Summary:
    """Tasks collapsed into groups of (band of ``band`` levels, InCore function)."""

    band: int
    group: np.ndarray       # group index of every task
    band_of: np.ndarray     # band index of every group
    base_of: np.ndarray     # InCore function (base index) of every group
    count: np.ndarray       # tasks per group
    edges: np.ndarray       # (E, 3): source group, target group, dependency count
    work: int               # nodes plus edge segments of its layout

    @property
    def n_groups(self) -> int:
        return len(self.count)


def summarize(g: DumpGraph, levels: np.ndarray, max_nodes: int, budget: int = LAYOUT_BUDGET) -> Summary:
    """Group tasks by (level band, InCore function), with bands of 1, 2, 4, ... levels: the
    narrowest that gives at most ``max_nodes`` groups and a layout within ``budget`` (see
    :func:`layout_work`), or one band for the whole graph."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    nb = max(len(g.base_names), 1)
    src_task = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    band = 1
    while True:
        key = (levels // band) * nb + g.base
        uniq, group = np.unique(key, return_inverse=True)
        group = group.reshape(-1)
        src, dst = group[src_task], group[g.succ]
        keep = src != dst  # dependencies inside a group are not drawn (its count covers them)
        n_groups = len(uniq)
        # one int64 key per group pair: a 1-D unique is much faster than unique(axis=0)
        pair_keys, counts = np.unique(src[keep].astype(np.int64) * n_groups + dst[keep], return_counts=True)
        pairs = np.stack([pair_keys // n_groups, pair_keys % n_groups], axis=1)
        band_of = uniq // nb
        work = layout_work(len(uniq), band_of[pairs[:, 1]] - band_of[pairs[:, 0]])
        if (len(uniq) <= max_nodes and work <= budget) or band >= n_levels:
            break
        band *= 2
    edges = np.concatenate([pairs, counts.reshape(-1, 1)], axis=1)
    return Summary(band, group, band_of, uniq % nb, np.bincount(group, minlength=len(uniq)), edges, work)


def summary_dot(g: DumpGraph, levels: np.ndarray, s: Summary) -> str:
    """DOT text with one box per group (node ``g<band>_<function index>``) and one weighted
    arrow per pair of connected groups."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 0
    initial = int(np.count_nonzero(levels == 0))
    how = "one per level and function" if s.band == 1 else f"one per function and band of {s.band} levels"
    note = f"summarized: {g.n_tasks:,} tasks in {s.n_groups:,} groups ({how})"
    lines = _header(_title(g, n_levels, initial, note), s.work)
    names = [f"g{int(b)}_{int(f)}" for b, f in zip(s.band_of, s.base_of)]
    buf = np.bincount(s.group, weights=g.buffer_bytes, minlength=s.n_groups)
    variants = np.zeros(s.n_groups, np.int64)
    pairs = np.unique(np.stack([s.group, g.func], axis=1), axis=0)
    np.add.at(variants, pairs[:, 0], 1)
    for k in range(s.n_groups):
        lo = int(s.band_of[k]) * s.band
        hi = min(lo + s.band, n_levels) - 1
        where = f"level {lo}" if lo == hi else f"levels {lo}–{hi}"
        extra = f", {int(variants[k])} variants" if variants[k] > 1 else ""
        label = (f"{g.base_names[s.base_of[k]]} ×{int(s.count[k]):,}\\n{where}{extra}\\n"
                 f"buffers {human_bytes(int(buf[k]))} in all")
        lines.append(f'  {names[k]} [label="{label}", fillcolor="{_color(int(s.base_of[k]))}"];')
    lines += _rank_groups(s.band_of, names)
    for a, b, c in s.edges.tolist():
        width = 0.8 + 0.6 * float(np.log10(c))
        # an xlabel is placed after layout; a plain label would add a rank between all ranks
        lines.append(f'  {names[a]} -> {names[b]} [xlabel="{c:,}", penwidth={width:.2f}, fontsize=8];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_dot(g: DumpGraph, max_nodes: int = 2000) -> tuple[str, Summary | None]:
    """The DOT text of a loaded dump, per task or summarized (then also the :class:`Summary`)."""
    if max_nodes < 1:
        raise UsageError(f"max_nodes must be positive, got {max_nodes}")
    levels = compute_levels(g.ptr, g.succ, g.path)
    if g.n_tasks <= max_nodes and layout_work(g.n_tasks, _task_spans(g, levels)) <= LAYOUT_BUDGET:
        return detail_dot(g, levels), None
    s = summarize(g, levels, max_nodes)
    return summary_dot(g, levels, s), s


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


def dot_binary() -> str:
    """Path of graphviz's ``dot``, or a PTOError saying how to do without it."""
    exe = shutil.which("dot")
    if exe is None:
        raise PTOError("graphviz's `dot` program is not installed (e.g. apt-get install graphviz); "
                       "--format dot writes the DOT text without it")
    return exe


def render(dot_text: str, out: str | Path, fmt: str) -> None:
    """Write ``dot_text`` to ``out``, rendered with ``dot -T<fmt>`` unless ``fmt`` is dot."""
    out = Path(out)
    if not out.parent.is_dir():
        raise UsageError(f"cannot write {out}: folder {out.parent} does not exist")
    if fmt == "dot":
        out.write_text(dot_text)
        return
    exe = dot_binary()
    try:
        r = subprocess.run([exe, f"-T{fmt}", "-o", str(out)], input=dot_text, capture_output=True,
                           text=True, timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PTOError(f"dot did not finish in {RENDER_TIMEOUT_S} s; use a smaller --max-nodes "
                       "or --format dot") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        raise PTOError(f"dot -T{fmt} failed (exit {r.returncode}): {lines[0] if lines else 'no message'}")


def visualize(dump: str | Path, out: str | Path, fmt: str | None = None, max_nodes: int = 2000) -> str:
    """Draw the dump at ``dump`` into ``out`` (pdf, svg, png or dot); returns the path written.

    Raises:
        UsageError: bad format or output folder, unreadable dump, ``max_nodes`` < 1.
        ParseError: a malformed dump (the message names the file and line).
        PTOError: ``dot`` is missing or failed.
    """
    fmt = resolve_format(out, fmt)
    g = load_dump(dump)
    text, _ = to_dot(g, max_nodes)
    render(text, out, fmt)
    return str(out)


__all__ = ["FORMATS", "DumpGraph", "Summary", "compute_levels", "detail_dot", "human_bytes",
           "layout_work", "load_dump", "render", "resolve_format", "summarize", "summary_dot", "to_dot",
           "visualize"]
