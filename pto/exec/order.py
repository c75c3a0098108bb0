"""Orders of a task graph for the persistent executor's queue.

The queue must be topological (every predecessor's items before any of its successors' items:
what makes the persistent kernel deadlock-free, docs/ARCHITECTURE.md). Within that, the order is
a priority: which ready work the GPU's programs take first.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def levels(n: int, succ_ptr: np.ndarray, succ: np.ndarray) -> np.ndarray:
    """The longest dependency chain ending at each task (0 without predecessors), by Kahn's
    algorithm one frontier at a time; ValueError on a cycle."""
    indeg = np.bincount(succ, minlength=n).astype(np.int64)
    level = np.zeros(n, np.int64)
    frontier = np.nonzero(indeg == 0)[0]
    seen = 0
    while len(frontier):
        seen += len(frontier)
        starts, ends = succ_ptr[frontier], succ_ptr[frontier + 1]
        counts = ends - starts
        if counts.sum() == 0:
            break
        idx = np.repeat(starts - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(counts.sum())
        targets = succ[idx]
        src_level = np.repeat(level[frontier], counts)
        np.maximum.at(level, targets, src_level + 1)
        np.subtract.at(indeg, targets, 1)
        uniq = np.unique(targets)
        frontier = uniq[indeg[uniq] == 0]
    if seen < n:
        raise ValueError(f"the task graph has a cycle ({n - seen} tasks never become ready)")
    return level


def _longest_down(succ_ptr: np.ndarray, succ: np.ndarray, level: np.ndarray, own: np.ndarray,
                  edge: float) -> np.ndarray:
    """``out[t] = own[t] + max(out[s] + edge for s in successors(t))`` (``own[t]`` for a sink),
    visiting tasks by decreasing level (every successor has a larger level)."""
    out = own.copy()
    for lv in range(int(level.max(initial=0)), -1, -1):
        ts = np.nonzero(level == lv)[0]
        counts = succ_ptr[ts + 1] - succ_ptr[ts]
        has = counts > 0
        if not has.any():
            continue
        ts, counts = ts[has], counts[has]
        idx = np.repeat(succ_ptr[ts] - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(counts.sum())
        best = np.zeros(len(ts), out.dtype)
        np.maximum.at(best, np.repeat(np.arange(len(ts)), counts), out[succ[idx]] + edge)
        out[ts] += best
    return out


def bottom_levels(n: int, succ_ptr: np.ndarray, succ: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The longest chain from each task to a sink, in tasks (0 for sinks)."""
    return _longest_down(succ_ptr, succ, level, np.zeros(n, np.int64), 1)


def item_order(level: np.ndarray, bottom: np.ndarray, branch: np.ndarray, extent: np.ndarray,
               group: np.ndarray, binding: np.ndarray | None = None, work: np.ndarray | None = None) -> np.ndarray:
    """Work items ``[k, 2]`` (task, parallel index) in queue order.

    Tasks by level (topological), then the longest remaining chain first (critical path), then
    by branch and by the tensors they are bound to (``binding``: tasks of one projection together,
    as the wave executor batches them), then the largest first (``work``: with causal attention
    the late q tiles do the most, so they must not be left for the end), then task id. Consecutive
    tasks of one branch and binding with ``group[t] > 0`` run their items in groups of ``group``
    tasks x every parallel index, the parallel index slowest within a group (the batched kernels'
    grouped order: programs running together share operand panels in L2).
    """
    n = len(level)
    binding = np.zeros(n, np.int64) if binding is None else binding
    work = np.zeros(n, np.int64) if work is None else work
    order = np.lexsort((np.arange(n), -work, binding, branch, -bottom, level))
    key = np.stack([level, -bottom, branch, binding], axis=1)[order]
    cuts = np.nonzero((key[1:] != key[:-1]).any(axis=1))[0] + 1
    out = []
    for run in np.split(order, cuts):
        if not len(run):
            continue
        g = int(group[run[0]])
        if g > 0 and extent[run].max() > 1:
            for c in range(0, len(run), g):
                chunk = run[c:c + g]
                for p in range(int(extent[chunk].max())):
                    live = chunk[extent[chunk] > p]
                    out.append(np.stack([live, np.full(len(live), p)], axis=1))
        else:
            ext = extent[run]
            out.append(np.stack([np.repeat(run, ext), np.arange(ext.sum()) - np.repeat(np.cumsum(ext) - ext, ext)],
                                axis=1))
    if not out:
        return np.zeros((0, 2), np.int32)
    return np.concatenate(out).astype(np.int32)


def wave_batches(graph, base: np.ndarray | None = None) -> int:
    """How many batches the wave executor runs for ``graph``: per wave (a level of Kahn's
    algorithm: every ready task at once), one per InCore variant and set of bound tensors;
    ``base``: each tensor id's buffer (:class:`pto.exec.waves.Views`: views of one buffer bind
    as one tensor, so their tasks share a batch)."""
    ex = graph.runtime.export()
    n = ex.n_tasks
    if n == 0:
        return 0
    succ = ex.fanout_ids.astype(np.int64) - ex.first_task
    lv = levels(n, ex.fanout_ptr.astype(np.int64), succ)
    counts = ex.arg_ptr[1:] - ex.arg_ptr[:-1]
    width = int(counts.max())
    tens = np.full((n, width), np.iinfo(np.int64).min, np.int64)  # no argument (a span's id is negative)
    for k in range(width):
        has = counts > k
        ids = ex.arg_tensor[ex.arg_ptr[:-1][has] + k]
        tens[has, k] = ids if base is None else base[ids]
    keys = np.concatenate([lv[:, None], ex.func[:, None].astype(np.int64), tens], axis=1)
    return len(np.unique(keys, axis=0))


def weighted_bottom(cost: np.ndarray, succ_ptr: np.ndarray, succ: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The critical path from each task to a sink in estimated time: its own item cost plus the
    longest of its successors'."""
    return _longest_down(succ_ptr, succ, level, cost.astype(np.float64), 0.0)


class Dag(NamedTuple):
    """A graph's edges as the schedule reads them: successors in CSR (``succ_ptr``, ``succ``),
    each task's predecessor count and its level."""

    succ_ptr: np.ndarray
    succ: np.ndarray
    pending: np.ndarray
    level: np.ndarray


class Affinity(NamedTuple):
    """Each work item's producers, by its row (task ``t``'s item ``k`` at ``base[t] + k``, the
    items' rows in :class:`pto.exec.item_deps.ItemBoxes`): the rows of the predecessor items it
    waits for (``ptr``, ``rows``: CSR), and ``narrow``, whether those are fewer than its task's
    predecessors' items (dependencies at the granularity of data that leave some out)."""

    base: np.ndarray
    ptr: np.ndarray
    rows: np.ndarray
    narrow: np.ndarray


def list_schedule(static_items: np.ndarray, cost: np.ndarray, extent: np.ndarray, dag: Dag, programs: int,
                  bucket: float = 0.05, affinity: Affinity | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The queue as a list schedule: simulate ``programs`` workers taking, whenever one is free,
    the ready item whose task has the longest estimated critical path to the end (``cost``:
    nanoseconds per item), and queue the items in the order the simulation starts them. Returns
    ``(items, worker)``: the items in that order and the worker that started each (the lowest
    free one), the per-program streams of :func:`streams`.

    A schedule only starts items whose predecessors have finished, so the order is topological.
    Priorities within ``bucket`` (relative) of each other count as equal and keep the order of
    ``static_items`` (:func:`item_order`: grouped, bound tensors together), so ties do not undo
    the L2-friendly grouping. Critical path first keeps the longest chains (the last q tiles of
    causal attention, the kv chains of the split and pair modes) moving, and starts a task's
    successors as soon as it is done, which keeps the data they read in L2.

    ``affinity``: an item that waits for only some of its task's predecessors' items
    (:attr:`Affinity.narrow`) starts on the free worker that ran the last queued of its own
    producers, where one is free, instead of the lowest: on the GPU it then waits for its data,
    not besides for an unrelated item that its program runs first (a decode step's RoPE item of
    one head after another head's projection item)."""
    import heapq

    n = len(cost)
    if n == 0:
        return static_items, np.zeros(len(static_items), np.int32)
    succ_ptr, succ, pending, level = dag
    b = weighted_bottom(cost, succ_ptr, succ, level)
    prio = -np.floor(np.log(np.maximum(b, 1.0)) / np.log1p(bucket)).astype(np.int64)
    base = np.concatenate([[0], np.cumsum(extent)[:-1]]).astype(np.int64)
    spos = np.empty(int(extent.sum()), np.int64)
    spos[base[static_items[:, 0]] + static_items[:, 1]] = np.arange(len(static_items))
    pend = pending.astype(np.int64).copy()
    left = extent.astype(np.int64).copy()
    ready: list = []

    def release(t: int) -> None:
        pr = int(prio[t])
        for p in range(int(extent[t])):
            heapq.heappush(ready, (pr, int(spos[base[t] + p]), t, p))

    for t in np.nonzero(pend == 0)[0]:
        release(int(t))
    running: list = []
    free, now = list(range(programs)), 0.0
    idle = np.ones(programs, bool)  # (``free`` is a heap of the idle workers and stale entries)
    n_idle = programs
    out = np.empty((len(static_items), 2), np.int32)
    worker = np.empty(len(static_items), np.int32)
    # per row of ``affinity``: the worker that ran it and its queue position (-1: not run here, a
    # task of another segment)
    ran_on = np.full(len(affinity.ptr) - 1 if affinity is not None else 0, -1, np.int64)
    queued = ran_on.copy()
    k = 0
    while ready or running:
        while ready and n_idle:
            _, _, t, p = heapq.heappop(ready)
            w, r = -1, (affinity.base[t] + p if affinity is not None else -1)
            if r >= 0 and affinity.narrow[r]:
                mine = affinity.rows[affinity.ptr[r]:affinity.ptr[r + 1]]
                mine = mine[(ran_on[mine] >= 0) & idle[np.maximum(ran_on[mine], 0)]]
                if len(mine):
                    w = int(ran_on[mine[np.argmax(queued[mine])]])
            if w < 0:
                while not idle[free[0]]:
                    heapq.heappop(free)
                w = heapq.heappop(free)
            idle[w] = False
            n_idle -= 1
            out[k] = (t, p)
            worker[k] = w
            if r >= 0:
                ran_on[r], queued[r] = w, k
            heapq.heappush(running, (now + float(cost[t]), t, w))
            k += 1
        now, t, w = heapq.heappop(running)
        idle[w] = True
        n_idle += 1
        heapq.heappush(free, w)
        left[t] -= 1
        if left[t] == 0:
            for s in succ[succ_ptr[t]:succ_ptr[t + 1]]:
                pend[s] -= 1
                if pend[s] == 0:
                    release(int(s))
    if k != len(out):
        raise ValueError(f"list schedule placed {k} of {len(out)} items (a cycle?)")
    return out, worker


def streams(worker: np.ndarray, programs: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-program streams of a queue whose item ``i`` runs on program ``worker[i]``: ``(perm,
    start)``, the queue indices grouped by program (each program's in queue order) and the
    offset of program k's range in it (``start[k]:start[k + 1]``). Static dispatch is
    ``worker = i mod programs``.

    Deadlock-free for any ``worker`` when the queue is topological and every program is resident:
    the unfinished item of the smallest queue index heads its program's stream (the program's
    earlier items have smaller indices, so they are finished) and its predecessors have smaller
    indices too, so it runs (docs/ARCHITECTURE.md). The worker only balances the programs' work."""
    perm = np.argsort(worker, kind="stable")
    start = np.zeros(programs + 1, np.int64)
    np.cumsum(np.bincount(worker, minlength=programs)[:programs], out=start[1:])
    return perm, start


__all__ = ["Affinity", "Dag", "levels", "bottom_levels", "item_order", "weighted_bottom", "list_schedule", "streams",
           "wave_batches"]
