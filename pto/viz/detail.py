"""The drawing with one box per task: its DOT text and its estimated size."""

from __future__ import annotations

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
from pto.viz.sizes import CHAR_EM, LABEL_PAD_PT, NODE_MARGIN_IN, NODE_PT, box_in, layered_in, layout_work, page_in


def task_spans(g: DumpGraph, levels: np.ndarray) -> np.ndarray:
    """Levels every dependency spans (successor's level minus predecessor's), in edge order."""
    return levels[g.succ] - np.repeat(levels, np.diff(g.ptr))


def _task_label(g: DumpGraph, k: int) -> list[str]:
    return [f"task {int(g.ids[k])}", g.func_names[g.func[k]], human_bytes(int(g.buffer_bytes[k]))]


def detail_size_in(g: DumpGraph, levels: np.ndarray) -> tuple[float, float]:
    """Estimated page size in inches of the drawing with one box per task."""
    if not g.n_tasks:
        return page_in((0.0, 0.0), title_size_in(g, [stats_line(g, levels)]))
    name_len = np.array([len(n) for n in g.func_names])[g.func]
    chars = np.maximum(name_len, len(f"task {int(g.ids.max())}"))
    w = np.maximum(0.75, (chars * NODE_PT * CHAR_EM + 2 * LABEL_PAD_PT) / 72 + 2 * NODE_MARGIN_IN[0])
    h = np.full(g.n_tasks, box_in(["", "", ""])[1])
    src = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    graph = layered_in(np.zeros(g.n_tasks, np.int64), levels, w, h, src, g.succ)
    return page_in(graph, title_size_in(g, [stats_line(g, levels)]))


def detail_dot(g: DumpGraph, levels: np.ndarray) -> str:
    """DOT text with one box per task (node ``t<id>``) and one arrow per dependency."""
    work = layout_work(g.n_tasks, task_spans(g, levels))
    lines = dot_header(title_label(g, [stats_line(g, levels)]), work)
    names = [f"t{int(i)}" for i in g.ids]
    for k in range(g.n_tasks):
        label, color = join_label(_task_label(g, k)), fill_color(int(g.base[k]))
        lines.append(f'  {names[k]} [label={label}, fillcolor="{color}"];')
    lines += rank_groups(levels, names)
    src = np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))
    lines += [f"  {names[a]} -> {names[b]};" for a, b in zip(src.tolist(), g.succ.tolist())]
    lines.append("}")
    return "\n".join(lines) + "\n"
