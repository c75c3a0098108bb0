"""Items run where their dependency ends (``PTO_MK_INLINE=on``, ``MegakernelSettings.inline``;
the backend's kernel runs them: :func:`pto.codegen.triton.megakernel.render_megakernel`).

With ranged dispatch every work item belongs to one program's stream, and an item whose
predecessors finish elsewhere waits for them by polling its counter: the last release reaches
the counter in L2, and the waiting program sees it one poll's round trip later (about a
microsecond a level on an H200: docs/PERF.md). A counter that exactly one item waits on need
not be polled at all: the release that brings it to zero is an atomic whose old value says so,
and the program that made it can run the waiting item right there, next, with nothing to poll
(its acquire was that atomic). Such an item is *inline*: it is in no program's stream (the uploaded
item table holds it after every stream's range), and the program whose release ends its
counter's count runs it. The kernel releases a row's inline counter by a scalar acq_rel atomic
and the row's other counters as before (release atomics whose old values nothing reads), so an
item whose row has no inline counter pays nothing for the feature (:func:`row_inline`).

A release row (the counters one item decrements) may end at most one inline counter, since the
program runs one item next: where a row would release several, all but the first of them are
polled as before (:func:`inline_items`). So a level gains only where each of its items is the
one inline counter of its last releaser's row: a decode step's attention combines (one a head)
are each alone on their counters, but every attention part's row ends several heads' combines,
so one combine a layer runs inline and the o projection, which waits for all of them, still
waits on the others' polls.

Measured on an H200 (docs/PERF.md, "Twenty-fourth session"), it is slower, so it is off by
default: SmolLM2's step 0.454-0.467 -> 0.536-0.540 ms, the 8B's 4.19 -> 4.30-4.32. The atomic
whose old value the program reads is an L2 round trip before the program can go on (a release
whose value nothing reads is posted), so the inline combine starts later than a poll would have
seen its counter, and the longer code around every release widens every item's gap.

Deadlock-freedom (docs/ARCHITECTURE.md, "Why it cannot deadlock", ranged dispatch): an inline
item never waits, so a program that runs one returns to its stream in bounded time; take the
unfinished item of the smallest queue index. If it is inline, its predecessors come earlier in
the queue, so they have finished, the last of them has released its counter, and the program
that did runs it. If it is in a stream, its program's earlier stream items have finished and the
program is at it (or running an inline item, which ends), its predecessors have finished, and it
runs. The queue's order is topological whoever runs an item, so the induction holds.
"""

from __future__ import annotations

import numpy as np

from pto.exec.item_deps import Counters
from pto.exec.order import streams


def inline_items(c: Counters) -> np.ndarray:
    """Per counter of ``c``, the queue index of the one item that waits on it where that item
    runs inline (the counter has a count, exactly one item waits on it, and no release row that
    decrements it ends another inline counter first), else -1; int64 ``[C]``."""
    n_counters = len(c.init)
    out = np.full(n_counters, -1, np.int64)
    if not n_counters or not len(c.counter):
        return out
    waiters = np.bincount(c.counter, minlength=n_counters)
    one = np.nonzero((waiters == 1) & (c.init > 0))[0]
    items = np.full(n_counters, -1, np.int64)
    items[c.counter] = np.arange(len(c.counter))  # (the waiter, where it is the only one)
    out[one] = items[one]
    # a release row ends at most one inline counter: the first in each row keeps it (one pass:
    # demoting a counter never makes another row hold more)
    for r in range(len(c.rel_ptr) - 1):
        row = c.rel[c.rel_ptr[r]:c.rel_ptr[r + 1]]
        marked = row[out[row] >= 0]
        if len(marked) > 1:
            out[marked[1:]] = -1
    return out


def inline_layout(workers: np.ndarray, programs: int, inline: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The uploaded item table's order with inline items: each program's stream of the other
    items (``workers``: the program of each queue index) in queue order, then the inline items
    (``inline``: :func:`inline_items`) in queue order; each program's offset into it
    (``[programs + 1]``); and per counter the table index of its inline item, or -1 (int64)."""
    run_inline = np.zeros(len(workers), bool)
    run_inline[inline[inline >= 0]] = True
    ranged = np.nonzero(~run_inline)[0]
    perm, start = streams(workers[ranged], programs)
    tail = np.nonzero(run_inline)[0]
    order = np.concatenate([ranged[perm], tail]).astype(np.int64)
    at = np.empty(len(workers), np.int64)
    at[order] = np.arange(len(order))
    table = np.where(inline >= 0, at[np.maximum(inline, 0)], -1).astype(np.int64)
    return order, start, table


def row_inline(c: Counters, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per release row of ``c``, its inline counter and that counter's item's table index
    (``table``: :func:`inline_layout`'s), or -1 and -1 (int64): what the kernel's release reads
    (:func:`inline_items` leaves at most one a row)."""
    rows = len(c.rel_ptr) - 1
    counter = np.full(max(rows, 0), -1, np.int64)
    item = np.full(max(rows, 0), -1, np.int64)
    if rows > 0 and len(c.rel):
        row_of = np.repeat(np.arange(rows), np.diff(c.rel_ptr))
        hit = table[c.rel] >= 0
        counter[row_of[hit]] = c.rel[hit]
        item[row_of[hit]] = table[c.rel[hit]]
    return counter, item


__all__ = ["inline_items", "inline_layout", "row_inline"]
