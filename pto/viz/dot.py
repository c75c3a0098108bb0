"""The parts of DOT text both drawings share: the graph header, the title with its color
legend, rank groups, fill colors and label text.
"""

from __future__ import annotations

import html

import numpy as np

from pto.viz.dumpgraph import DumpGraph
from pto.viz.sizes import (
    EDGE_PT,
    LABEL_PAD_PT,
    NODE_MARGIN_IN,
    NODE_PT,
    NODESEP,
    RANKSEP,
    TITLE_PT,
    TUNE_ABOVE,
    title_in,
)

# Fill colors (light, so black text stays readable), assigned to InCore functions in the order
# their first variant was registered, which makes the colors stable for a given program.
PALETTE = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
           "#9edae5", "#d9d9d9", "#fdd0a2", "#bcbddc")


def human_bytes(n: int) -> str:
    """``512 B``, ``4.0 KiB``, ``1.5 MiB`` ..."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fill_color(base_index: int) -> str:
    """The fill color of an InCore function (its index in ``base_names``)."""
    return PALETTE[base_index % len(PALETTE)]


def stats_line(g: DumpGraph, levels: np.ndarray) -> str:
    """The title's line of task, edge and level counts and the initial parallelism."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 0
    return (f"{g.n_tasks:,} tasks · {g.n_edges:,} edges · {n_levels:,} levels · "
            f"initial parallelism {int(np.count_nonzero(levels == 0)):,}")


def title_label(g: DumpGraph, texts: list[str]) -> str:
    """An HTML-like graph label: the graph's title, ``texts`` one a row, the color legend (6 a row)."""
    rows = [f'<tr><td colspan="6"><b>{html.escape(g.title)}</b></td></tr>']
    rows += [f'<tr><td colspan="6">{html.escape(t)}</td></tr>' for t in texts]
    cells = [f'<td bgcolor="{fill_color(k)}">{html.escape(b)}</td>' for k, b in enumerate(g.base_names)]
    for i in range(0, len(cells), 6):
        rows.append("<tr>" + "".join(cells[i:i + 6]) + "</tr>")
    return '<<table border="0" cellspacing="4" cellpadding="3">' + "".join(rows) + "</table>>"


def title_size_in(g: DumpGraph, texts: list[str]) -> tuple[float, float]:
    """Estimated size in inches of :func:`title_label`'s table."""
    return title_in([g.title, *texts], g.base_names)


def dot_header(title: str, work: int, rows: bool = False) -> list[str]:
    """The opening lines of a drawing: graph, node and edge attributes; ``work`` (nodes plus edge
    segments) decides whether dot's optimization passes are capped."""
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


def rank_groups(keys: np.ndarray, names: list[str], extra: dict[int, str] | None = None) -> list[str]:
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


def join_label(lines: list[str]) -> str:
    """Label lines as one HTML-like DOT label (``label=<...>``): a borderless table, a row a line,
    padded by :data:`LABEL_PAD_PT` (lines joined by ``\\n`` touch: the underscores of
    ``softmax_tile__C256_R32`` ran into the buffer size below)."""
    cells = "".join(f"<tr><td>{html.escape(line)}</td></tr>" for line in lines)
    return f'<<table border="0" cellspacing="0" cellpadding="{LABEL_PAD_PT}">{cells}</table>>'
