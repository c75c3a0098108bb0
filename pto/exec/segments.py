"""The persistent executor's plan split into segments by resource class: consecutive ranges of
dependency levels, each its own megakernel launched after the one before it on the stream.

One ``if/elif`` over every InCore function takes the most warps, shared memory and registers of
all its branches, and the GPU holds as few programs of it as its hungriest branch allows. Where
the branches that ask for the most sit in a few levels of the graph (a decode step's LM head at
its end), those levels become a launch of their own (a *segment*), so the other segment's kernel
is compiled for its own branches alone and runs as many programs a multiprocessor as they allow.

A segment holds every task of its levels. An edge inside a segment is the megakernel's (its
counter, its release); an edge from an earlier segment is satisfied by the order of the launches
on the stream (a kernel starts after the one before it ended), so it counts in no counter. No
two segments ever run at once: persistent kernels that rely on each other's progress while
sharing the GPU can deadlock (the second may never become resident), so nothing here assumes
co-residency. A cut is a full barrier (every program of the segment before it finishes), so the
rule places few, and none that lengthens the critical path.

**The cut rule** (``auto``, :func:`auto_cuts`): from the backend's estimate, before compiling,
of how many programs a multiprocessor each branch alone allows by each resource
(:meth:`Backend.megakernel_occupancy <pto.backends.base.Backend.megakernel_occupancy>`: for
Triton, its threads and the shared memory its pipelined loops need), resource by resource: the
branches at the lowest count (where the counts differ) join the *heavy* set if the levels that
hold a heavy task still form at most :data:`MAX_SEGMENTS` ranges with the others (a range of
light levels whose estimated work is under :data:`MERGE_SHARE` of the graph's joins the heavy
range beside it instead of being a launch of its own), and if the barriers lengthen the estimated
critical path by at most :data:`SLACK`. The cuts are the boundaries of those ranges. Settings:
``split`` (``PTO_MK_SPLIT``): ``off``, ``auto``, or levels where a segment starts
(``181,182``; negative from the end, ``-2``: the last two levels are a segment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pto.errors import UsageError
from pto.exec.order import weighted_bottom

#: at most this many launches from ``auto`` (two cuts)
MAX_SEGMENTS = 3
#: a range of light levels with less than this share of the estimated work does not get a launch
MERGE_SHARE = 0.01
#: ``auto`` cuts only where the critical path (estimated) grows by at most this share
SLACK = 0.05
#: the split where the settings and the environment name none: ``auto`` (on an H200 the 7B
#: prefill layer's persistent run 2.27 -> 1.45 ms at 1,537 tokens and 4.00 -> 3.49 at 4,096, its
#: attention a launch of its own; SmolLM2's decode step 0.552 -> 0.505 ms, its LM head one;
#: Llama-3.2-1B's and Llama-3-8B's steps within 2%: docs/PERF.md)
DEFAULT_SPLIT = "auto"


@dataclass(frozen=True)
class Split:
    """Where a plan is cut: ``cuts``, the levels that start a new segment (ascending; none: one
    segment), and why (``reason``, for reports)."""

    cuts: tuple[int, ...]
    reason: str

    def segment_of(self, level: np.ndarray) -> np.ndarray:
        """Per task (``level``: its dependency level), the segment it runs in."""
        return np.searchsorted(np.asarray(self.cuts, np.int64), level, side="right").astype(np.int64)


def resolve_split(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_SPLIT``, else :data:`DEFAULT_SPLIT` (checked by :func:`parse_cuts`
    when a plan is split)."""
    return (choice or os.environ.get("PTO_MK_SPLIT") or DEFAULT_SPLIT).strip()


def parse_cuts(text: str, top: int, source: str = "split") -> tuple[int, ...]:
    """The levels of a forced split ``text`` (``5,9``; negative from the end: ``-1`` is the
    last level) for a graph of levels 0..``top``; UsageError naming ``source`` and the value
    when it is not a level that can start a segment (1..``top``)."""
    if top == 0:
        raise UsageError(f"{source}={text!r}: this graph has one dependency level, nothing to cut")
    out = set()
    for part in text.split(","):
        part = part.strip()
        try:
            lv = int(part)
        except ValueError:
            raise UsageError(f"{source}={text!r}: off, auto, or levels where a segment starts (e.g. 5,9 or -2)") \
                from None
        at = lv + top + 1 if lv < 0 else lv
        if not 1 <= at <= top:
            raise UsageError(f"{source}={text!r}: level {lv} cannot start a segment; this graph's levels are "
                             f"0..{top}, so a cut is one of 1..{top} (or -{top}..-1 from the end)")
        out.add(at)
    return tuple(sorted(out))


def critical_path(cost: np.ndarray, succ_ptr: np.ndarray, succ: np.ndarray, level: np.ndarray,
                  segment: np.ndarray | None = None) -> float:
    """The longest chain of estimated item times (``cost``, per task) through the graph; with
    ``segment`` (per task), the sum over segments of the longest chain inside each (launches in
    turn: a cut is a barrier)."""
    if len(cost) == 0:
        return 0.0
    if segment is None:
        return float(weighted_bottom(cost, succ_ptr, succ, level).max())
    src = np.repeat(np.arange(len(cost)), np.diff(succ_ptr))
    inner = segment[src] == segment[succ]
    ptr = np.zeros(len(cost) + 1, np.int64)
    np.cumsum(np.bincount(src[inner], minlength=len(cost)), out=ptr[1:])
    bottom = weighted_bottom(cost, ptr, succ[inner], level)
    return float(sum(bottom[segment == s].max() for s in np.unique(segment)))


def level_ranges(heavy_level: np.ndarray, work: np.ndarray) -> list[tuple[int, int]]:
    """The ranges ``[lo, hi)`` of consecutive levels that are all heavy or all light
    (``heavy_level``, per level), a light range of less than :data:`MERGE_SHARE` of the work
    (``work``, per level) merged into the heavy ranges beside it."""
    n = len(heavy_level)
    bounds = [0, *(np.nonzero(heavy_level[1:] != heavy_level[:-1])[0] + 1).tolist(), n]
    ranges = [(a, b, bool(heavy_level[a])) for a, b in zip(bounds, bounds[1:])]
    total = float(work.sum()) or 1.0
    small = [not h and len(ranges) > 1 and work[a:b].sum() < MERGE_SHARE * total for a, b, h in ranges]
    out: list[list] = []
    for (a, b, h), tiny in zip(ranges, small):
        kind = True if tiny else h  # a small light range counts as heavy: it joins its neighbours
        if out and out[-1][2] == kind:
            out[-1][1] = b
        else:
            out.append([a, b, kind])
    return [(a, b) for a, b, _ in out]


def auto_cuts(level: np.ndarray, task_branch: np.ndarray, occupancy: np.ndarray, names: tuple[str, ...],
              cost: np.ndarray, nitems: np.ndarray, succ_ptr: np.ndarray, succ: np.ndarray,
              branch_names: list[str] | None = None) -> Split:
    """The cut rule (module docstring) for a graph: per task its ``level`` and branch; per branch
    and resource (``names``) the programs a multiprocessor it allows alone (``occupancy``,
    ``[branches, resources]``); per task the estimated time of an item (``cost``, ns) and its
    items; the successors in CSR. ``branch_names``: for the reason."""
    top = int(level.max(initial=0))
    if top == 0 or occupancy.size == 0:
        return Split((), "one level" if top == 0 else "no resource estimate")
    work = np.bincount(level, weights=cost * nitems, minlength=top + 1)
    base = critical_path(cost, succ_ptr, succ, level)
    heavy = np.zeros(occupancy.shape[0], bool)
    found: tuple[tuple[int, int], ...] = ((0, top + 1),)
    why = []
    for r, name in enumerate(names):
        col = occupancy[:, r]
        if col.min() == col.max():
            continue
        trial = heavy | (col == col.min())
        heavy_level = np.bincount(level, weights=trial[task_branch].astype(np.float64), minlength=top + 1) > 0
        ranges = level_ranges(heavy_level, work)
        if len(ranges) == 1 or len(ranges) > MAX_SEGMENTS:
            continue
        cuts = tuple(a for a, _ in ranges[1:])
        seg = Split(cuts, "").segment_of(level)
        if critical_path(cost, succ_ptr, succ, level, seg) > base * (1 + SLACK):
            continue
        heavy, found = trial, tuple(ranges)
        who = sorted({(branch_names or [str(b) for b in range(len(col))])[b] for b in np.nonzero(col == col.min())[0]})
        why.append(f"{name}: {', '.join(who)} ({int(col.min())} a multiprocessor)")
    if len(found) == 1:
        return Split((), "no resource class that few levels hold")
    return Split(tuple(a for a, _ in found[1:]), "auto by " + "; ".join(why))


def split_plan(plan, backend, choice: str | None, stages: int | str | None = None) -> tuple[Split, list]:
    """``plan`` (:class:`pto.exec.plan.Plan`) cut as ``choice`` says (None: ``PTO_MK_SPLIT``,
    else :data:`DEFAULT_SPLIT`): the :class:`Split` and the segments' plans in launch order
    (``[plan]`` itself when uncut). ``auto`` reads ``backend``'s estimate
    (:meth:`Backend.megakernel_occupancy <pto.backends.base.Backend.megakernel_occupancy>`, at the
    megakernel settings' pipeline ``stages``)."""
    mode = resolve_split(choice)
    if mode == "off":
        return Split((), "off"), [plan]
    level = plan.levels()
    if mode == "auto":
        names, occ = backend.megakernel_occupancy(plan, stages)
        split = auto_cuts(level, plan.task_branch, occ, names, plan.cost if plan.cost is not None
                          else np.ones(plan.n_tasks), plan.nitems.astype(np.float64), plan.succ_ptr.astype(np.int64),
                          plan.succ.astype(np.int64), [b.fn.variant_name for b in plan.branches])
    else:
        split = Split(parse_cuts(mode, int(level.max(initial=0)), "PTO_MK_SPLIT" if not choice else "split"),
                      f"levels {mode}")
    if not split.cuts:
        return split, [plan]
    seg = split.segment_of(level)
    return split, [plan.segment(seg == k) for k in range(len(split.cuts) + 1)]


__all__ = ["Split", "auto_cuts", "split_plan", "parse_cuts", "resolve_split", "critical_path", "level_ranges",
           "MAX_SEGMENTS", "MERGE_SHARE", "SLACK", "DEFAULT_SPLIT"]
