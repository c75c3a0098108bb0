"""Dependencies at the granularity of data (``PTO_MK_DEPS=data``): which work items of its
predecessor tasks each work item of the persistent megakernel waits for.

The runtime's graph links tasks whose bound regions overlap; every item of a successor then
waits for every item of its predecessors (``task``, the default). An item touches less than its
task's region: a decode step's RoPE item of one head reads that head's q/k/v columns, which a
few of the projection's items wrote. Here each item's accesses are bounded on the host from its
function's load and store offsets (:func:`pto.ir.bounds.bounds` over its loops, the parallel
index over the item's own indices), and an item waits only for the predecessor items whose
accesses conflict with its own (they overlap in one tensor and one of them writes).

Items of a task with the same predecessor items share one counter; each predecessor item
decrements the counters it feeds. Where an item's accesses cannot be bounded (offsets read from
device data, a loop bound that is not an expression of the task's scalars) its whole bound
region counts; an edge that no shared tensor explains, or whose successor's counters a
predecessor item would have to decrement more than :data:`MAX_FANOUT` times on average, keeps
the task's dependency whole. Either way an item waits for a subset of what it waited for before,
so the queue's order proves the kernel deadlock-free as before (docs/ARCHITECTURE.md).

Correctness also needs the edges the runtime left out: its tensor map takes a task as writing
its memref's whole bound region and hides the entries inside it, so an edge that the writer
orders (A before the writer before C) is not in the graph. Every element of the writer's region
must then be written by one of its items, or C's items could pass A's through the rest: where a
task's stores leave part of a region unwritten, every item of that task takes the whole region
as one store (:func:`item_boxes`), and the chain A, the writer's item, C orders each element.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from pto.errors import BuildError, UsageError
from pto.ir.bounds import bounds
from pto.ir.expr import Var, evaluate, fold
from pto.ir.facts import loop_ranges, memref_accesses, reads_memref, writes_memref
from pto.ir.nodes import IncoreFunction

#: the dependency granularities (``PTO_MK_DEPS``, ``MegakernelSettings.deps``)
DEPS = ("task", "data")
DEFAULT_DEPS = "data"
#: a successor task keeps one counter when its counters would take more than this many
#: decrements a predecessor item on average (a causal attention's key tiles feed every later
#: query tile: n^2 / 2 atomics where one counter takes n)
MAX_FANOUT = 4

_LO, _HI = "__item_lo", "__item_hi"


def resolve_deps(asked: str | None) -> str:
    """``asked`` (None: ``$PTO_MK_DEPS``, else :data:`DEFAULT_DEPS`), checked."""
    src = "deps" if asked is not None else "PTO_MK_DEPS"
    text = (asked if asked is not None else os.environ.get("PTO_MK_DEPS", DEFAULT_DEPS)).strip().lower()
    if text not in DEPS:
        raise UsageError(f"{src}={text!r}: the megakernel's dependencies are task or data")
    return text


@dataclass
class ItemBoxes:
    """Per work item of a plan, the parts of each memref's region it may read and write: for the
    items of task ``t`` (its item ``k`` at row ``ptr[t] + k``), ``box[row, j, a]`` is the box of
    memref ``j``'s access ``a`` (a load or store of its function: first row, end row, first
    column, end column in its tensor's coordinates; empty, all 0, past the function's accesses),
    and ``read[t, j]`` / ``write[t, j]`` whether the task's function loads or stores that
    memref (``accesses[t, j]``: how many of its boxes are not empty). One box an access, not
    their union: a RoPE item of one head reads its q columns and its key/value head's, far
    apart in one row."""

    ptr: np.ndarray  # [n + 1] int64
    box: np.ndarray  # [items, maxm, accesses, 4] int64
    read: np.ndarray  # [n, maxm] bool
    write: np.ndarray  # [n, maxm] bool
    accesses: np.ndarray  # [n, maxm] int64: the boxes each memref of a task's items has


def _value(e, env, like: torch.Tensor) -> torch.Tensor:
    v = evaluate(fold(e), env)
    return torch.as_tensor(v, dtype=torch.int64).expand_as(like) if not torch.is_tensor(v) else v.to(torch.int64)


def _span(offset, extent, ranges: dict, env: dict, size: np.ndarray) -> np.ndarray:
    """``[items, 2]``: the first and end index an access at ``offset`` of ``extent`` along one
    dimension of a region of ``size`` may touch, per item (a tile overhanging the region is
    masked: clipped to it); the whole dimension where ``offset`` cannot be bounded (a name with
    no value here, a scalar loaded from device data: a cache row at the sequence's position)."""
    try:
        lo, hi = bounds(offset, ranges)
        out = torch.stack([_value(lo, env, env[_LO]), _value(hi + extent, env, env[_LO])], dim=1).numpy()
    except (BuildError, KeyError, TypeError, ValueError, RuntimeError):
        return np.stack([np.zeros_like(size), size], axis=1)
    return np.clip(out, 0, size[:, None])


def variant_boxes(fn: IncoreFunction, region: np.ndarray, values: np.ndarray, first: np.ndarray,
                  count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The boxes of items of ``fn``'s tasks: ``region`` ``[items, params, 4]`` (row0, col0, rows,
    cols of each memref parameter's binding, the item's task's) and ``values`` ``[items,
    params]`` (each scalar parameter's value), the runtime's export per parameter; ``first`` /
    ``count`` the parallel indices each item runs. Returns ``box [items, memrefs, accesses, 4]``,
    ``read`` and ``write`` ``[memrefs]``, ``accesses`` ``[memrefs]`` (the boxes each has) and
    ``stores`` ``[memrefs, accesses]`` (the box is a store's); a memref one of whose accesses
    cannot be bounded (an offset read from device data, a loop bound that is not an expression
    of the scalars) is its whole region, one box that is a store's if the function stores it."""
    mems = {p.name for p in fn.memrefs}
    mem_k = [k for k, p in enumerate(fn.params) if p.name in mems]
    reg = region[:, mem_k, :].astype(np.int64)
    r0, c0, rows, cols = (reg[:, :, k] for k in range(4))
    m, size = len(mem_k), len(first)
    read, write = np.zeros(m, bool), np.zeros(m, bool)
    slot = {p.name: j for j, p in enumerate(fn.memrefs)}
    env: dict = {p.name: torch.from_numpy(values[:, k].astype(np.int64))
                 for k, p in enumerate(fn.params) if p.name not in mems}
    for j, p in enumerate(fn.memrefs):
        env[f"{p.name}.rows"] = torch.from_numpy(rows[:, j].copy())
        env[f"{p.name}.cols"] = torch.from_numpy(cols[:, j].copy())
    env[_LO] = torch.from_numpy(first.astype(np.int64))
    env[_HI] = torch.from_numpy((first + np.maximum(count, 1) - 1).astype(np.int64))
    try:
        ranges = loop_ranges(fn, (Var(_LO), Var(_HI)))
    except (BuildError, TypeError, ValueError, KeyError):
        ranges = None
    found: list[list[np.ndarray]] = [[] for _ in range(m)]
    stored: list[list[bool]] = [[] for _ in range(m)]
    whole = set()
    for mem, ins, row, col, tile in memref_accesses(fn):
        j = slot[mem]
        write[j] |= writes_memref(ins)
        read[j] |= reads_memref(ins)
        if ranges is None or j in whole:
            whole.add(j)
            continue
        b = np.stack([_span(row, tile.rows, ranges, env, rows[:, j]),
                      _span(col, tile.cols, ranges, env, cols[:, j])], axis=1).reshape(size, 4)
        # (in the tensor's coordinates)
        found[j].append(b + np.stack([r0[:, j], r0[:, j], c0[:, j], c0[:, j]], axis=1))
        stored[j].append(writes_memref(ins))
    accesses = np.array([1 if j in whole else len(found[j]) for j in range(m)], np.int64)
    box = np.zeros((size, m, max([1, *accesses]), 4), np.int64)
    stores = np.zeros((m, box.shape[2]), bool)
    for j in range(m):
        if j in whole:
            box[:, j, 0] = np.stack([r0[:, j], r0[:, j] + rows[:, j], c0[:, j], c0[:, j] + cols[:, j]], axis=1)
            stores[j, 0] = write[j]
        elif found[j]:
            box[:, j, :len(found[j])] = np.stack(found[j], axis=1)
            stores[j, :len(found[j])] = stored[j]
    return box, read, write, accesses, stores


#: the most cells of the grid :func:`_covers` marks (more: the region counts as not covered)
_MAX_CELLS = 1 << 22


def _covers(boxes: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> bool:
    """Do the boxes ``[k, 4]`` (row0, row1, col0, col1) cover the region ``[r0, r1) x [c0,
    c1)`` whole? On the grid of their edges: each box marks its cells (a difference array)."""
    if r1 <= r0 or c1 <= c0:
        return True
    b = boxes[(boxes[:, 0] < boxes[:, 1]) & (boxes[:, 2] < boxes[:, 3])]
    if not len(b):
        return False
    b = np.stack([np.clip(b[:, 0], r0, r1), np.clip(b[:, 1], r0, r1), np.clip(b[:, 2], c0, c1),
                  np.clip(b[:, 3], c0, c1)], axis=1)
    rs, cs = np.unique(np.r_[r0, r1, b[:, 0], b[:, 1]]), np.unique(np.r_[c0, c1, b[:, 2], b[:, 3]])
    if len(rs) * len(cs) > _MAX_CELLS:
        return False
    i0, i1 = np.searchsorted(rs, b[:, 0]), np.searchsorted(rs, b[:, 1])
    j0, j1 = np.searchsorted(cs, b[:, 2]), np.searchsorted(cs, b[:, 3])
    d = np.zeros((len(rs), len(cs)), np.int64)
    for rr, cc, v in ((i0, j0, 1), (i1, j0, -1), (i0, j1, -1), (i1, j1, 1)):
        np.add.at(d, (rr, cc), v)
    return bool((d.cumsum(axis=0).cumsum(axis=1)[:-1, :-1] > 0).all())


def item_boxes(variants: list, extent: np.ndarray, run: np.ndarray, parallel: np.ndarray,
               maxm: int) -> ItemBoxes:
    """:class:`ItemBoxes` of a plan's tasks: ``variants`` lists ``(fn, tasks, regions, values)``
    (the runtime's export of those tasks' parameters, as :func:`variant_boxes` takes them per
    item); a task's items as the plan makes them (``extent`` of them, each ``run`` consecutive
    indices of its ``parallel`` extent).

    The runtime's tensor map records a task as writing its memref's whole bound region, and a
    later writer's region hides the writers and readers inside it: their edges to the tasks
    after it are left out, ordered through it. So a task whose items' stores leave part of a
    memref's region unwritten (a region that runs from the binding's origin to the furthest
    access, holes between accesses) would let an item after it run before an item before it
    that the left-out edge ordered: there every item of the task takes the memref's whole
    region, one box, as a store."""
    n = len(extent)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(extent, out=ptr[1:])
    read, write = np.zeros((n, maxm), bool), np.zeros((n, maxm), bool)
    accesses = np.zeros((n, maxm), np.int64)
    parts = []
    for fn, idx, region, values in variants:
        per = extent[idx].astype(np.int64)
        task = np.repeat(np.arange(len(idx)), per)
        k = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
        first = k * run[idx][task]
        count = np.minimum(run[idx][task], parallel[idx][task] - first)
        b, r, w, a, st = variant_boxes(fn, region[task], values[task], first, count)
        m = len(fn.memrefs)
        mem_k = [i for i, p in enumerate(fn.params) if p.name in {q.name for q in fn.memrefs}]
        a = np.broadcast_to(a, (len(idx), m)).copy()
        starts = np.r_[0, np.cumsum(per)]
        for j in np.flatnonzero(w):
            for i in range(len(idx)):
                mine = b[starts[i]:starts[i + 1], j][:, st[j]].reshape(-1, 4)
                row0, col0, nrows, ncols = (int(v) for v in region[i, mem_k[j]])
                if not _covers(mine, row0, row0 + nrows, col0, col0 + ncols):
                    b[starts[i]:starts[i + 1], j] = 0
                    b[starts[i]:starts[i + 1], j, 0] = (row0, row0 + nrows, col0, col0 + ncols)
                    a[i, j] = 1
        rows = np.concatenate([np.arange(ptr[t], ptr[t + 1]) for t in idx]) if len(idx) else np.zeros(0, np.int64)
        parts.append((rows, b))
        read[idx, :m], write[idx, :m], accesses[idx, :m] = r, w, a
    box = np.zeros((int(ptr[-1]), maxm, max([1] + [b.shape[2] for _, b in parts]), 4), np.int64)
    for rows, b in parts:
        box[rows, :b.shape[1], :b.shape[2]] = b
    return ItemBoxes(ptr, box, read, write, accesses)


@dataclass
class Counters:
    """What the megakernel's items wait on and release: item ``i`` (queue order) waits until
    ``counter[i]``'s count (``init`` before a launch) is 0, then decrements, with release, the
    counters ``rel[rel_ptr[row[i]]:rel_ptr[row[i] + 1]]``."""

    counter: np.ndarray  # [k] int64
    init: np.ndarray  # [C] int32
    row: np.ndarray  # [k] int64
    rel_ptr: np.ndarray  # [R + 1] int32
    rel: np.ndarray  # int32

    @property
    def waits(self) -> np.ndarray:
        """[k] bool: the item has something to wait for."""
        return self.init[self.counter] > 0

    def by_row(self) -> np.ndarray:
        """Per item row (data counters': :attr:`rel_ptr` a row each), the counter it waits on."""
        of_row = np.empty(len(self.rel_ptr) - 1, np.int64)
        of_row[self.row] = self.counter
        return of_row

    def reordered(self, row: np.ndarray) -> Counters:
        """These counters for a queue of the same items in another order (``row``: each queued
        item's row): each item keeps its counter, each row its releases."""
        return Counters(self.by_row()[row], self.init, np.asarray(row, np.int64), self.rel_ptr, self.rel)


def task_counters(plan, pending: np.ndarray) -> Counters:
    """A counter a task (``pending`` its count), each item releasing its task's successors."""
    task = plan.items[:, 0].astype(np.int64) if plan.n_items else np.zeros(0, np.int64)
    return Counters(task, pending.astype(np.int32), task, plan.succ_ptr.astype(np.int32),
                    plan.succ.astype(np.int32))


#: the most elements of one comparison :func:`_overlap` makes at once (items of one side in chunks)
_MAX_PAIRS = 1 << 24


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(a), len(b)] bool: some box (row0, row1, col0, col1) of ``a`` ``[na, accesses, 4]``
    intersects some box of ``b`` ``[nb, accesses, 4]`` (an empty box intersects none); in chunks
    of ``a``'s items so that no comparison holds more than :data:`_MAX_PAIRS` elements."""
    step = max(1, _MAX_PAIRS // max(1, a.shape[1] * b.shape[0] * b.shape[1]))
    q = b[None, None, :, :, :]
    out = []
    for k in range(0, len(a), step):
        p = a[k:k + step, :, None, None, :]
        hit = (p[..., 0] < q[..., 1]) & (q[..., 0] < p[..., 1]) & (p[..., 2] < q[..., 3]) & (q[..., 2] < p[..., 3])
        out.append(hit.any(axis=(1, 3)))
    return np.concatenate(out) if out else np.zeros((0, len(b)), bool)


def _waits_on(plan, boxes: ItemBoxes, s: int, preds: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``[items of s, items of preds]`` bool (``cols``: each predecessor's first column): the
    pairs whose accesses conflict (one tensor, one of them writes, the boxes intersect); all of a
    predecessor's columns where no tensor both use, one of them writing, explains the edge, or
    where both tasks are one item. One comparison per memref of ``s`` against every predecessor
    access of its tensor at once."""
    nit = plan.nitems.astype(np.int64)
    npi = nit[preds]
    dep = np.zeros((int(nit[s]), int(npi.sum())), bool)
    explained = np.zeros(len(preds), bool)
    used = boxes.read[preds] | boxes.write[preds]  # [preds, maxm]
    bs = boxes.box[boxes.ptr[s]:boxes.ptr[s + 1]]
    for i in np.flatnonzero(boxes.read[s] | boxes.write[s]).tolist():
        hit_pj = used & (plan.task_tensor[preds] == plan.task_tensor[s, i])
        if not boxes.write[s, i]:
            hit_pj &= boxes.write[preds]
        pi, j = np.nonzero(hit_pj)
        if not len(pi):
            continue
        explained[pi] = True
        per = npi[pi]
        k = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
        rows = np.repeat(boxes.ptr[preds[pi]], per) + k
        a = int(boxes.accesses[preds[pi], j].max())  # (the boxes past a memref's accesses are empty)
        hit = _overlap(bs[:, i, :boxes.accesses[s, i]], boxes.box[rows, np.repeat(j, per), :a])
        np.logical_or.at(dep.T, np.repeat(cols[pi], per) + k, hit.T)
    whole = ~explained | ((nit[s] == 1) & (npi == 1))
    for q in np.flatnonzero(whole).tolist():
        dep[:, cols[q]:cols[q] + npi[q]] = True
    return dep


def data_counters(plan, boxes: ItemBoxes) -> Counters:
    """The counters of :class:`Counters` at the granularity of data (module docstring), over the
    edges of ``plan`` (a segment's: the edges among its tasks)."""
    nit = plan.nitems.astype(np.int64)
    ibase = boxes.ptr  # task t's item k is global item ibase[t] + k
    src, dst = plan.edge_sources, plan.succ.astype(np.int64)
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    cut = np.flatnonzero(np.diff(dst)) + 1
    counter_of = np.full(int(ibase[-1]), -1, np.int64)  # per global item of a waiting task
    init: list[int] = []
    pairs_g: list[np.ndarray] = []  # (predecessor item, counter) pairs
    pairs_c: list[np.ndarray] = []
    for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(dst)]):
        if lo == hi:
            continue
        s = int(dst[lo])
        preds = src[lo:hi]
        first = np.r_[0, np.cumsum(nit[preds])[:-1]]
        dep = _waits_on(plan, boxes, s, preds, first)  # [items of s, items of all preds]
        cols = np.repeat(ibase[preds] - first, nit[preds]) + np.arange(dep.shape[1])
        _, first_row, inv = np.unique(np.packbits(dep, axis=1), axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        cls = dep[first_row]  # [classes, pred items]
        if len(cls) > 1 and cls.sum() > MAX_FANOUT * dep.shape[1]:
            cls, inv = np.ones((1, dep.shape[1]), bool), np.zeros(len(inv), np.int64)  # (one counter)
        base = len(init)
        init += cls.sum(axis=1).tolist()
        counter_of[ibase[s] + np.arange(nit[s])] = base + inv
        c, g = np.nonzero(cls)
        pairs_g.append(cols[g])
        pairs_c.append(base + c)
    # the items that wait for nothing (and those of tasks outside a segment): one counter of 0
    counter_of[counter_of < 0] = len(init)
    init.append(0)
    g = np.concatenate(pairs_g) if pairs_g else np.zeros(0, np.int64)
    c = np.concatenate(pairs_c) if pairs_c else np.zeros(0, np.int64)
    by = np.argsort(g, kind="stable")
    rel_ptr = np.zeros(int(ibase[-1]) + 1, np.int64)
    np.cumsum(np.bincount(g, minlength=int(ibase[-1])), out=rel_ptr[1:])
    task, k = (plan.items[:, 0].astype(np.int64), plan.items[:, 1].astype(np.int64)) if plan.n_items else \
        (np.zeros(0, np.int64), np.zeros(0, np.int64))
    row = ibase[task] + k
    if len(init) and max(init) > np.iinfo(np.int32).max or len(c) > np.iinfo(np.int32).max:
        raise UsageError("PTO_MK_DEPS=data: more dependencies than the megakernel's int32 tables hold; use task")
    return Counters(counter_of[row], np.asarray(init, np.int32), row, rel_ptr.astype(np.int32),
                    c[by].astype(np.int32))


__all__ = ["DEPS", "DEFAULT_DEPS", "MAX_FANOUT", "resolve_deps", "ItemBoxes", "variant_boxes", "item_boxes", "Counters",
           "task_counters", "data_counters"]
