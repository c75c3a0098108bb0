"""Drawing a dump end to end (:func:`draw`, :func:`visualize`): load it, choose the drawing,
let graphviz measure it, fall back to a coarser one that fits, and write the output.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pto.errors import UsageError
from pto.viz.choose import check_max_nodes, check_page, detail_refusal, summary_plans, too_big, why_line
from pto.viz.detail import detail_dot, detail_size_in
from pto.viz.dumpgraph import DumpGraph, compute_levels, load_dump
from pto.viz.output import check_output, dot_binary, resolve_format, run_dot
from pto.viz.sizes import PAGE_IN, fits
from pto.viz.summary import Summary, summary_dot


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
         page: tuple[float, float] = PAGE_IN, title: str | None = None) -> Drawing:
    """Draw the dump at ``dump`` into ``out`` (pdf, svg, png or dot), readable at 100% zoom,
    headed by ``title`` (default: the dump's file name).

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
    check_max_nodes(max_nodes)
    page = check_page(page)
    out = check_output(dump, out)
    fmt = resolve_format(out, fmt)
    exe = shutil.which("dot") if fmt == "dot" else dot_binary()
    g = load_dump(dump)
    if title:
        g.title = title
    levels = compute_levels(g.ptr, g.succ, g.path)
    refusal, _ = detail_refusal(g, levels, max_nodes, page)
    with tempfile.TemporaryDirectory(prefix="pto-viz-") as tmp:
        s = None
        if refusal is None:
            text = detail_dot(g, levels)
            size, drawing = run_dot(exe, text, fmt, tmp) if exe else (detail_size_in(g, levels), None)
            if not fits(size, page):  # measured larger than estimated
                refusal = too_big(size, page)
        if refusal is not None:
            why = why_line(refusal)
            for plan in summary_plans(g, levels, max_nodes, page, why):
                s, text = plan.summary, summary_dot(g, levels, plan.summary, why)
                size, drawing = run_dot(exe, text, fmt, tmp) if exe else (plan.size, None)
                if fits(size, page) or plan.last:
                    break
        if drawing is None:
            out.write_text(text)
        else:
            shutil.copyfile(drawing, out)
    texts = [] if s is None else [*s.texts(g.n_tasks), why_line(refusal)]
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
    if not fits(size, page):
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
    return check_page((w, h))
