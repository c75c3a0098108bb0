"""Choosing the drawing: per task when it fits the page and ``max_nodes``, else the narrowest
summary that does; the arguments that steer the choice (``max_nodes``, ``page``) are checked here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pto.errors import UsageError
from pto.viz.detail import detail_dot, detail_size_in, task_spans
from pto.viz.dumpgraph import DumpGraph, compute_levels
from pto.viz.sizes import LAYOUT_BUDGET, MIN_FONT_PT, PAGE_IN, capacity, fits, layout_work
from pto.viz.summary import Summary, find_period, fit_rows, group_tasks, summary_dot


@dataclass
class Plan:
    """A summary to try, its estimated page size in inches, and whether it is the last resort
    (one band: one box per InCore function)."""

    summary: Summary
    size: tuple[float, float]
    last: bool = False


def check_max_nodes(max_nodes: int | None) -> None:
    """Refuse a ``max_nodes`` that is not None or a positive integer."""
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise UsageError(f"max_nodes must be a positive integer or None, got {max_nodes!r}")


def check_page(page: tuple[float, float]) -> tuple[float, float]:
    """``page`` as (width, height) in inches, both at least 1 inch, or a UsageError."""
    try:
        w, h = (float(x) for x in page)
    except (TypeError, ValueError):
        raise UsageError(f"page must be (width, height) in inches, got {page!r}") from None
    if not (w >= 1 and h >= 1 and math.isfinite(w * h)):
        raise UsageError(f"page {w:g} x {h:g} in: both sides must be at least 1 inch")
    return w, h


def detail_refusal(g: DumpGraph, levels: np.ndarray, max_nodes: int | None,
                   page: tuple[float, float]) -> tuple[str | None, tuple[float, float] | None]:
    """Why the graph cannot be drawn task by task (None when it may be, by estimate), and the
    estimated page size when that was the reason."""
    if max_nodes is not None and g.n_tasks > max_nodes:
        return f"more than max_nodes = {max_nodes:,} tasks", None
    size = detail_size_in(g, levels)
    if not fits(size, page):
        return too_big(size, page), size
    work = layout_work(g.n_tasks, task_spans(g, levels))
    if work > LAYOUT_BUDGET:
        return (f"its layout would have {work:,} nodes plus edge segments "
                f"(more than {LAYOUT_BUDGET:,}: minutes of graphviz)"), size
    return None, size


def too_big(size: tuple[float, float], page: tuple[float, float]) -> str:
    """Why a drawing of ``size`` inches is refused for ``page``."""
    return (f"it would be about {size[0]:.0f} x {size[1]:.0f} in, more than the {page[0]:g} x {page[1]:g} in "
            f"page that keeps {MIN_FONT_PT} pt text readable at 100% zoom")


def summary_plans(g: DumpGraph, levels: np.ndarray, max_nodes: int | None, page: tuple[float, float],
                  why: str | None) -> Iterator[Plan]:
    """Summaries with bands of 1, 2, 4, ... levels that may fit (by count, budget and estimate),
    then the one-band summary whatever its size. A graph that repeats itself every p levels (the
    layers of a model) gets bands of p, 2p, 4p, ... levels aligned to its repeats instead of the
    powers of two from p on, so a band is whole layers."""
    n_levels = int(levels.max()) + 1 if g.n_tasks else 1
    period, offset = find_period(g, levels)
    band = 1
    while band < n_levels:
        if period and band > period // 2 and band % period:
            band = period  # from here on, whole periods
        aligned = period and band % period == 0
        s = group_tasks(g, levels, band, offset if aligned else 0, period)
        if s.n_groups <= min(max_nodes or s.n_groups, capacity(page)):
            s, size = fit_rows(g, s, page, why)
            if s.work <= LAYOUT_BUDGET and fits(size, page):
                yield Plan(s, size)
        band *= 2
    s, size = fit_rows(g, group_tasks(g, levels, n_levels), page, why)
    yield Plan(s, size, last=True)


def summarize(g: DumpGraph, levels: np.ndarray, max_nodes: int | None = None,
              page: tuple[float, float] = PAGE_IN, why: str | None = None) -> Summary:
    """The narrowest summary (bands of 1, 2, 4, ... levels) with at most ``max_nodes`` groups
    whose estimated drawing, wrapped into rows, fits ``page`` (inches) under a title with the
    line ``why``, or one band for the whole graph."""
    return next(summary_plans(g, levels, max_nodes, check_page(page), why)).summary


def to_dot(g: DumpGraph, max_nodes: int | None = None,
           page: tuple[float, float] = PAGE_IN) -> tuple[str, Summary | None]:
    """The DOT text of a loaded dump, chosen by estimated size alone (:func:`draw` also measures):
    per task when that fits ``page`` and ``max_nodes``, else summarized (then also the
    :class:`Summary`)."""
    check_max_nodes(max_nodes)
    page = check_page(page)
    levels = compute_levels(g.ptr, g.succ, g.path)
    refusal, size = detail_refusal(g, levels, max_nodes, page)
    if refusal is None:
        return detail_dot(g, levels), None
    s = summarize(g, levels, max_nodes, page, why_line(refusal))
    return summary_dot(g, levels, s, why_line(refusal)), s


def why_line(refusal: str) -> str:
    """The title's line on why the graph is not drawn per task."""
    return f"not drawn per task: {refusal}"
