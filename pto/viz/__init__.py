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

The modules, in pipeline order, each one job:

- :mod:`pto.viz.dumpgraph`: the dump as arrays (:func:`load_dump`) and the levels (:func:`compute_levels`);
- :mod:`pto.viz.sizes`: page, fonts and spacing; size estimates and the layout work;
- :mod:`pto.viz.dot`: the DOT text both drawings share (header, title and legend, colors, ranks);
- :mod:`pto.viz.detail`: the drawing with one box per task;
- :mod:`pto.viz.summary`: the summarized drawing (groups, rows, dashed copies);
- :mod:`pto.viz.choose`: which drawing, by estimate (:func:`summarize`, :func:`to_dot`);
- :mod:`pto.viz.output`: formats, output checks, running ``dot`` (:func:`render`);
- :mod:`pto.viz.drawing`: the whole job, measured by graphviz (:func:`draw`, :func:`visualize`).

Beside the drawings, :mod:`pto.viz.plotting` makes the figures of ``--plot`` (``pto estimate``,
``pto bench``) with matplotlib.
"""

from __future__ import annotations

from pto.viz.choose import summarize, to_dot
from pto.viz.detail import detail_dot, detail_size_in
from pto.viz.dot import PALETTE, human_bytes
from pto.viz.drawing import Drawing, draw, parse_page, visualize
from pto.viz.dumpgraph import DumpGraph, base_name, compute_levels, load_dump
from pto.viz.output import FORMATS, RENDER_TIMEOUT_S, check_output, dot_binary, render, resolve_format
from pto.viz.sizes import (
    CHAR_EM,
    CLUSTER_PAD_IN,
    EDGE_PT,
    LAYOUT_BUDGET,
    LINE_EM,
    MAX_ASPECT,
    MIN_FONT_PT,
    NODE_MARGIN_IN,
    NODE_PT,
    NODESEP,
    PAD_IN,
    PAGE_IN,
    RANKSEP,
    SCREEN_IN,
    TITLE_PT,
    TUNE_ABOVE,
    VIRTUAL_IN,
    layout_work,
)
from pto.viz.summary import Summary, fit_rows, group_tasks, summary_dot, wrap_rows

__all__ = ["FORMATS", "MIN_FONT_PT", "PAGE_IN", "Drawing", "DumpGraph", "Summary", "check_output",
           "compute_levels", "detail_dot", "detail_size_in", "draw", "fit_rows", "group_tasks", "human_bytes",
           "layout_work", "load_dump", "parse_page", "render", "resolve_format", "summarize", "summary_dot",
           "to_dot", "visualize", "wrap_rows"]
# also importable from here, as before the split: the other constants and helpers
__all__ += ["CHAR_EM", "CLUSTER_PAD_IN", "EDGE_PT", "LAYOUT_BUDGET", "LINE_EM", "MAX_ASPECT", "NODE_MARGIN_IN",
            "NODE_PT", "NODESEP", "PAD_IN", "PALETTE", "RANKSEP", "RENDER_TIMEOUT_S", "SCREEN_IN", "TITLE_PT",
            "TUNE_ABOVE", "VIRTUAL_IN", "base_name", "dot_binary"]
