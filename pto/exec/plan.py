"""A fully built graph as the persistent megakernel's tables (:class:`Plan`).

Per task: its branch (the InCore variant and the specializations its regions allow, as the
backend decides them: :meth:`TritonBackend.task_flags <pto.backends.triton.backend.TritonBackend.task_flags>`),
its table row, the tensor of each memref parameter, its number of work items (parallel-axis
blocks), its predecessor count and its successors; and the queue of work items in a topological
priority order (:mod:`pto.exec.order`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from pto.codegen.triton.megakernel import Branch
from pto.errors import BuildError, ExecutionError, UsageError
from pto.exec.cost import item_costs
from pto.exec.inline import inline_items, inline_layout, row_inline
from pto.exec.item_deps import DEFAULT_DEPS, DEPS, Counters, ItemBoxes, data_counters, item_boxes, task_counters
from pto.exec.order import Affinity, Dag, bottom_levels, item_order, levels, list_schedule, streams
from pto.ir.analysis import param_access
from pto.ir.expr import evaluate
from pto.ir.facts import tile_shape
from pto.ir.nodes import IncoreFunction, walk_instrs
from pto.ir.ops import MATMUL

_INT32_MAX = 2**31 - 1
#: (function, per-task environment of int64 vectors, regions [size, memrefs, 4]) -> per-task
#: (every access inside the region, the region column-aligned) [size, memrefs] bool each
FlagRule = Callable[[IncoreFunction, dict, np.ndarray], tuple[np.ndarray, np.ndarray]]


def takes_runs(fn: IncoreFunction) -> bool:
    """May ``fn``'s work items be runs (:func:`make_plan`'s ``runs``)? It has a parallel axis and
    its products are multiply-sums (each product's left tile under 16 rows: a GEMV's), whose
    loads Triton pipelines only in a flattened loop; a tensor-core product's loop is pipelined
    already, and flattening a GEMM's made the 7B layer's residual projection 60 times slower
    (docs/PERF.md, "Twelfth session")."""
    if fn.parallel is None:
        return False
    tiles, dims = {t.name: t for t in fn.tiles}, dict(fn.variant)
    products = [i for i in walk_instrs(fn.body) if i.op in MATMUL]
    try:
        return bool(products) and all(tile_shape(tiles[i.srcs[0]], dims)[0] < 16 for i in products)
    except BuildError:  # a tile of unbound rows: not a GEMV's
        return False


def no_flags(fn: IncoreFunction, env: dict, regions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """No specialization: every task takes the masked, unaligned path."""
    shape = (len(regions), len(fn.memrefs))
    return np.zeros(shape, bool), np.zeros(shape, bool)


@dataclass
class Plan:
    """A graph as the megakernel's tables (numpy; the backend uploads them)."""

    branches: list[Branch]
    items: np.ndarray  # [k, 2] int32: (task, parallel index), queue order
    task_branch: np.ndarray  # [n] int32
    task_row: np.ndarray  # [n] int64
    tab: np.ndarray  # int32 or int64
    task_tensor: np.ndarray  # [n, maxm] int32: index into ``tensor_names``
    tensor_names: list[str]
    pending: np.ndarray  # [n] int32: predecessors
    nitems: np.ndarray  # [n] int32
    succ_ptr: np.ndarray  # [n + 1] int32
    succ: np.ndarray  # int32
    first_task: int  # runtime id of task 0
    variants: list[IncoreFunction]  # per task index: its variant (for reports)
    group_of: dict[str, int]  # InCore function -> GROUP used in the order
    cost: np.ndarray | None = None  # [n] estimated ns per item (pto.exec.cost)
    programs: int = 1  # the programs the order was scheduled for
    worker: np.ndarray | None = None  # [k] int32: the program of each item in the list schedule
    #: [n] bool: the tasks this plan runs (a segment of a split plan, :meth:`segment`); None: all
    member: np.ndarray | None = None
    #: [n] int64: the consecutive parallel indices a work item of each task runs (a run branch's
    #: run, :func:`make_plan`'s ``runs``; 1 for every other), and each task's parallel extent
    #: (at least 1); None: 1 everywhere, the extents the items
    run: np.ndarray | None = None
    parallel: np.ndarray | None = None
    #: each work item's accesses (:class:`pto.exec.item_deps.ItemBoxes`), with dependencies at
    #: the granularity of data (``make_plan(deps="data")``); None: a task's items wait for every
    #: item of its predecessors
    boxes: ItemBoxes | None = None
    #: the list schedule's affinity (:class:`pto.exec.order.Affinity`: each item's producers,
    #: :func:`item_affinity`), which :meth:`workers` keeps when it simulates the schedule again;
    #: None: every item to the lowest free program
    affinity: Affinity | None = None
    #: the data counters of this plan's edges (:func:`pto.exec.item_deps.data_counters`), in the
    #: queue order they were computed for: :meth:`counters` reorders them for :attr:`items`
    #: (a segment, whose edges are its own, computes its own)
    data_counts: Counters | None = None

    @property
    def n_tasks(self) -> int:
        """Tasks of the whole graph (a segment keeps the graph's task indices)."""
        return len(self.task_branch)

    @property
    def tasks(self) -> np.ndarray:
        """[n] bool: the tasks this plan runs."""
        return np.ones(self.n_tasks, bool) if self.member is None else self.member

    def levels(self) -> np.ndarray:
        """Per task, the longest dependency chain ending at it (:func:`pto.exec.order.levels`)."""
        return levels(self.n_tasks, self.succ_ptr.astype(np.int64), self.succ.astype(np.int64))

    def segment(self, member: np.ndarray) -> Plan:
        """The plan of the tasks ``member`` (``[n]`` bool) alone, one launch of a split plan
        (:mod:`pto.exec.segments`): their items in this plan's queue order, the branches they use
        (renumbered, so the segment's kernel dispatches only those), and the edges among them; an
        edge from a task outside is satisfied by the order of the launches on the stream, so it
        counts in no pending counter and releases nothing. Task indices stay the graph's; a task
        outside has no items and no edges."""
        member = np.asarray(member, bool)
        src = self.edge_sources
        keep = member[src] & member[self.succ]
        succ = self.succ[keep]
        succ_ptr = np.zeros(self.n_tasks + 1, np.int64)
        np.cumsum(np.bincount(src[keep], minlength=self.n_tasks), out=succ_ptr[1:])
        used = np.unique(self.task_branch[member])
        renumber = np.zeros(len(self.branches), np.int32)
        renumber[used] = np.arange(len(used), dtype=np.int32)
        return replace(self, branches=[self.branches[b] for b in used],
                       items=self.items[member[self.items[:, 0]]] if len(self.items) else self.items,
                       task_branch=np.where(member, renumber[self.task_branch], 0).astype(np.int32),
                       pending=np.bincount(succ, minlength=self.n_tasks).astype(np.int32),
                       nitems=np.where(member, self.nitems, 0).astype(np.int32),
                       succ_ptr=succ_ptr.astype(np.int32), succ=succ.astype(np.int32), worker=None,
                       member=member, data_counts=None)

    @property
    def edge_sources(self) -> np.ndarray:
        """The predecessor of each edge (``succ[e]``'s): the CSR rows expanded."""
        return np.repeat(np.arange(self.n_tasks), np.diff(self.succ_ptr))

    @property
    def pending_items(self) -> np.ndarray:
        """Per task, the work items of all its predecessors: the count the megakernel's items
        release one by one (each item of a predecessor releases its successors itself)."""
        src = self.edge_sources
        counts = np.bincount(self.succ, weights=self.nitems[src].astype(np.float64), minlength=self.n_tasks)
        if len(counts) and counts.max() > np.iinfo(np.int32).max:
            raise ExecutionError(f"a task waits for {int(counts.max()):,} work items of its predecessors: more than "
                                 "the megakernel's int32 counters hold")
        return counts.astype(np.int32)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def reordered(self, order: np.ndarray) -> Plan:
        """This plan with its items in the queue order ``order`` (queue indices; a tool for
        checking an order that only the data dependencies allow: a ranged dispatch's programs
        run their items in it, so it must be topological under :meth:`counters`)."""
        return replace(self, items=self.items[np.asarray(order)], worker=None)

    def counters(self, sentinel: bool = False) -> Counters:
        """What each item waits on and releases (:class:`pto.exec.item_deps.Counters`): with
        :attr:`boxes`, the predecessor items whose data its own conflicts with
        (:func:`pto.exec.item_deps.data_counters`); else, or with the sentinel (whose task's
        last item releases its successors), a counter a task: its predecessor tasks' items
        (:attr:`pending_items`), or with the sentinel the tasks (:attr:`pending`)."""
        if sentinel:
            return task_counters(self, self.pending)
        if self.boxes is None:
            return task_counters(self, self.pending_items)
        if self.data_counts is not None:
            return self.data_counts.reordered(self.rows(self.items))
        return data_counters(self, self.boxes)

    @property
    def row_base(self) -> np.ndarray:
        """[n] int64: each task's first item row (the items of the tasks before it: the rows of
        :class:`pto.exec.item_deps.ItemBoxes` and :class:`Counters`)."""
        base = np.zeros(self.n_tasks, np.int64)
        np.cumsum(self.nitems[:-1], out=base[1:])
        return base

    def rows(self, items: np.ndarray) -> np.ndarray:
        """Each item's row (task ``t``'s item ``k`` at :attr:`row_base` ``[t] + k``)."""
        return self.row_base[items[:, 0].astype(np.int64)] + items[:, 1].astype(np.int64)

    def item_indices(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per item of ``items`` (rows of :attr:`items`: task, item index), the first parallel
        index it runs and how many from it (a run's; 1 for every other item), int64."""
        task, k = items[:, 0].astype(np.int64), items[:, 1].astype(np.int64)
        if self.run is None:
            return k, np.ones_like(k)
        run = self.run[task]
        return k * run, np.minimum(run, self.parallel[task] - k * run)

    @property
    def dag(self) -> Dag:
        return Dag(self.succ_ptr.astype(np.int64), self.succ.astype(np.int64), self.pending, self.levels())

    def workers(self, programs: int, dispatch: str) -> np.ndarray:
        """The program of each queued item for ``programs`` programs: round robin (``static``)
        or the list schedule's (``stream``: :func:`pto.exec.order.list_schedule`, simulated again
        when the launch has another number of programs than the plan was made for)."""
        if dispatch == "stream" and self.cost is not None:
            if programs == self.programs and self.worker is not None:
                return self.worker
            return list_schedule(self.items, self.cost, self.nitems.astype(np.int64), self.dag, programs,
                                 affinity=self.affinity)[1]
        return (np.arange(self.n_items) % max(programs, 1)).astype(np.int32)

    def streams(self, programs: int, dispatch: str) -> tuple[np.ndarray, np.ndarray]:
        """The programs' streams of ranged dispatch (:func:`pto.exec.order.streams` of
        :meth:`workers`): the queue indices grouped by program, and each program's offset."""
        return streams(self.workers(programs, dispatch), programs)

    def inline_items(self, counters: Counters) -> np.ndarray:
        """Per counter of ``counters`` (:meth:`counters`), the queue index of the item run where
        its count ends, or -1 (:func:`pto.exec.inline.inline_items`)."""
        return inline_items(counters)

    def inline_streams(self, programs: int, dispatch: str, counters: Counters,
                       inline: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`streams` without the ``inline`` items (:meth:`inline_items` of ``counters``),
        which follow every program's range in the table (:func:`pto.exec.inline.inline_layout`),
        and per release row of ``counters`` its inline counter and that item's table index, or -1
        (:func:`pto.exec.inline.row_inline`): order, offsets, row counters, row items."""
        order, start, table = inline_layout(self.workers(programs, dispatch), programs, inline)
        return (order, start, *row_inline(counters, table))


def _task_tables(fn: IncoreFunction, tens: np.ndarray, reg: np.ndarray, sca: np.ndarray, flags: FlagRule):
    """Per task of one variant: (rows of its table, parallel extent, EVEN and ALIGN per memref,
    estimated nanoseconds per item)."""
    size = len(tens)
    mem_names = {m.name for m in fn.memrefs}
    env, regions = {}, {}
    for k, p in enumerate(fn.params):
        if p.name in mem_names:
            regions[p.name] = reg[:, k, :]
            env[f"{p.name}.rows"] = torch.from_numpy(reg[:, k, 2].copy())
            env[f"{p.name}.cols"] = torch.from_numpy(reg[:, k, 3].copy())
        else:
            env[p.name] = torch.from_numpy(sca[:, k].copy())
    cols = [regions[m.name][:, j] for m in fn.memrefs for j in range(4)]
    cols += [env[s.name].numpy() for s in fn.scalars]
    rows = np.stack(cols, axis=1) if cols else np.zeros((size, 0), np.int64)
    if fn.parallel is not None:
        ext = np.broadcast_to(np.asarray(evaluate(fn.parallel.extent, env), dtype=np.int64), (size,)).copy()
    else:
        ext = np.ones(size, np.int64)
    mem_regions = np.stack([regions[m.name] for m in fn.memrefs], axis=1) if fn.memrefs \
        else np.zeros((size, 0, 4), np.int64)
    even, align = flags(fn, env, mem_regions)
    return rows.astype(np.int64), ext, even, align, item_costs(fn, env, size)


class _Tables:
    """The per-task tables of :func:`make_plan`, filled one variant at a time."""

    def __init__(self, n: int, maxm: int):
        self.task_branch = np.zeros(n, np.int32)
        self.task_row = np.zeros(n, np.int64)
        self.extent = np.ones(n, np.int64)
        self.group = np.zeros(n, np.int64)
        self.task_tensor = np.zeros((n, maxm), np.int32)
        self.variant: list[IncoreFunction | None] = [None] * n
        self.work = np.zeros(n, np.int64)  # elements of a task's regions: the wave executor's "largest first"
        self.run = np.ones(n, np.int64)  # parallel indices an item runs
        self.parallel = np.ones(n, np.int64)  # a task's parallel extent
        self.cost = np.zeros(n)  # estimated ns per item
        self.branches: list[Branch] = []
        self.branch_ids: dict[tuple, int] = {}
        self.chunks: list[np.ndarray] = []
        self.offset = 0

    def add_variant(self, fid: int, fn, idx, args, tensor_index, tensor_flags, flags, group: int,
                    early: np.ndarray | None = None, runs: int = 0, l2: np.ndarray | None = None,
                    tensor_strides: np.ndarray | None = None) -> None:
        """The tables of ``fn``'s tasks ``idx`` (``args``: their tensors, regions and scalars;
        ``tensor_flags``: per tensor, ``(aligned, read-only in the graph)``, the branch keys it
        adds to the task's own specializations, ``flags``; ``early``: per task and tensor, no
        predecessor writes it, in place of read-only for the early loads; ``runs``: a GEMV's
        (:func:`takes_runs`) tasks' indices in at most that many runs of consecutive ones, a run
        an item of a run branch; 0: an item an index; ``l2``: per task, whether it may prefetch
        into L2 before its wait, :attr:`Branch.prefetch`, all by default; ``tensor_strides``:
        per tensor, its row stride, which the branch keys add, :attr:`Branch.strides`; None: none)."""
        tens, reg, sca = args
        rows, ext, even, align, cost = _task_tables(fn, tens, reg, sca, flags)
        mem_k = [k for k, p in enumerate(fn.params) if p.name in {m.name for m in fn.memrefs}]
        self.work[idx] = (reg[:, mem_k, 2] * reg[:, mem_k, 3]).sum(axis=1)
        ext = np.maximum(ext, 1)  # a task with nothing to do still completes (one no-op item)
        run = -(-ext // runs) if runs and takes_runs(fn) else np.ones_like(ext)
        self.run[idx], self.parallel[idx] = run, ext
        self.extent[idx] = -(-ext // run)  # its items
        self.cost[idx] = cost * run
        self.group[idx] = group
        width = rows.shape[1]
        self.task_row[idx] = self.offset + np.arange(len(idx)) * width
        self.offset += len(idx) * width
        self.chunks.append(rows.reshape(-1))
        for j, k in enumerate(mem_k):
            self.task_tensor[idx, j] = np.vectorize(tensor_index.__getitem__, otypes=[np.int32])(tens[:, k])
        m = len(fn.memrefs)
        own = self.task_tensor[idx, :m]
        pre = tensor_flags[own, 1]
        if early is not None:  # (a memref the function itself writes is never loaded early: its own
            access = param_access(fn)  # stores may come before its loads)
            reads = np.array([access[p.name].direction == "in" if p.name in access else False
                              for p in fn.memrefs], bool)
            pre = np.take_along_axis(early, own.astype(np.int64), axis=1) & reads[None, :]
        # (a run loads none of them into registers before its wait, but prefetches them into L2
        # there: pto.codegen.triton.body.BodyRenderer.run_prefetch)
        # (a task with nothing to prefetch keeps the key of those that may: no branch of its own)
        l2 = np.ones(len(idx), bool) if l2 is None else l2 | ~pre.any(axis=1)
        keys = [even, align, tensor_flags[own, 0], pre, (run > 1)[:, None], l2[:, None]]
        if tensor_strides is not None:  # (a branch a combination of its memrefs' strides)
            keys.append(tensor_strides[own])
        uniq, inv = np.unique(np.concatenate([k.astype(np.int64) for k in keys], axis=1), axis=0, return_inverse=True)
        for u, row in enumerate(uniq):
            key = (fid, tuple(int(x) for x in row))
            if key not in self.branch_ids:
                self.branch_ids[key] = len(self.branches)
                parts = [tuple(bool(x) for x in row[k * m:(k + 1) * m]) for k in range(4)]
                strides = tuple(int(x) for x in row[4 * m + 2:]) if tensor_strides is not None else ()
                self.branches.append(Branch(fn, *parts, runs=bool(row[4 * m]), prefetch=bool(row[4 * m + 1]),
                                            strides=strides))
            self.task_branch[idx[inv.reshape(-1) == u]] = self.branch_ids[key]
        for t in idx:
            self.variant[t] = fn

    def table(self) -> np.ndarray:
        tab = np.concatenate(self.chunks) if self.chunks else np.zeros(1, np.int64)
        if len(tab) == 0:
            tab = np.zeros(1, np.int64)
        return tab.astype(np.int32) if np.abs(tab).max() <= _INT32_MAX else tab


def written_tensors(ex, variants: dict[int, IncoreFunction], tensor_index: dict[int, int], count: int) -> np.ndarray:
    """Per tensor (``tensor_index``: runtime id -> index), does any task of the export ``ex``
    write it (a memref its variant stores to)? A tensor no task writes (weights, tables) holds the
    same values for the whole launch: an item may read it before its predecessors are done."""
    return writes_by_task(ex, variants, tensor_index, count).any(axis=0)


def writes_by_task(ex, variants: dict[int, IncoreFunction], tensor_index: dict[int, int], count: int) -> np.ndarray:
    """``[n_tasks, count]`` bool: does task t write tensor k (a memref its variant stores to)?"""
    out = np.zeros((ex.n_tasks, count), bool)
    for fid in np.unique(ex.func):
        fn = variants[int(fid)]
        access = param_access(fn)
        slots = [k for k, p in enumerate(fn.params) if p.name in access and access[p.name].direction != "in"]
        if not slots:
            continue
        idx = np.nonzero(ex.func == fid)[0]
        ids = ex.arg_tensor[ex.arg_ptr[idx][:, None] + np.array(slots)[None, :]]
        known = np.vectorize(lambda i: tensor_index.get(int(i), -1), otypes=[np.int64])(ids)
        rows = np.repeat(idx, known.shape[1])
        keep = known.reshape(-1) >= 0
        out[rows[keep], known.reshape(-1)[keep]] = True
    return out


def predecessor_writes(ex, variants: dict[int, IncoreFunction], tensor_index: dict[int, int],
                       count: int) -> np.ndarray:
    """``[n_tasks, count]`` bool: does a direct predecessor of task t write tensor k? Where none
    does, no task before t writes what t reads there: the runtime orders every writer of an
    overlapping region before its reader (a direct edge from the last such writer) or after it
    (a writer submitted later waits for the reader), so t may read it before its wait."""
    writes = writes_by_task(ex, variants, tensor_index, count)
    src = np.repeat(np.arange(ex.n_tasks), np.diff(ex.fanout_ptr.astype(np.int64)))
    dst = ex.fanout_ids.astype(np.int64) - ex.first_task
    out = np.zeros_like(writes)
    np.logical_or.at(out, dst, writes[src])
    return out


#: which memrefs a megakernel item may load before its wait (``PTO_MK_EARLY``): ``graph``, those
#: of tensors no task of the graph writes (weights, tables); ``preds``, per task, those of tensors
#: none of its predecessors writes (also, e.g., a decode step's positions, written after it by
#: the step's last task: :func:`predecessor_writes`)
EARLY_RULES = ("graph", "preds")
#: the rule where the settings and the environment name none: ``preds``, 0.9-1.5% faster than
#: ``graph`` on SmolLM2's and the 1B model's steps on an H200 in each of four pairs in one call
#: (docs/PERF.md, "The lookahead, the early loads by predecessors")
DEFAULT_EARLY = "preds"


def resolve_early(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_EARLY``, else :data:`DEFAULT_EARLY`; UsageError naming an
    unknown one."""
    from pto.backends.triton.megakernel import env_choice

    return env_choice(choice, "PTO_MK_EARLY", DEFAULT_EARLY, EARLY_RULES, "early-load rule")


#: runs where the settings and the environment name none: ``auto``, 4% faster on the 1B shape's
#: step and 7% on the 8B's on an H200, SmolLM2's unchanged (its tasks have fewer items than a round)
#: (docs/PERF.md, "Runs measured, and on by default")
DEFAULT_RUNS = "auto"


#: which tasks prefetch into L2 before their wait where the megakernel's ``PREFETCH`` asks
#: (``PTO_MK_PREFETCH``: 1 or 2 for ``all``; ``light``, level 1 for the ``light`` ones): ``all``,
#: or ``light``, the tasks that wait last for no GEMV (:func:`after_gemvs`; a GEMV keeps the
#: memory busy while its successors wait): a decode step's o projection after attention's
#: combine, whose weights stream into L2 while the memory would be idle
PREFETCH_RULES = ("all", "light")


def resolve_prefetch_rule(choice: int | str | None) -> str:
    """The :data:`PREFETCH_RULES` entry the megakernel's prefetch setting (the settings', else
    ``PTO_MK_PREFETCH``) means: ``light`` for ``light``, else ``all``; UsageError naming an
    unknown one."""
    from pto.backends.triton.megakernel import resolve_prefetch

    return "light" if resolve_prefetch(choice) == "light" else "all"


def after_gemvs(ex, variants: dict[int, IncoreFunction], level: np.ndarray) -> np.ndarray:
    """Per task of the exported graph ``ex``: whether a predecessor on the level just before its
    own (``level``: each task's, :func:`pto.exec.order.levels`; the predecessors it waits for
    last) is a GEMV's task (:func:`takes_runs`). (A decode step's o projection also reads the
    residual stream the previous layer's down projection wrote, long done when it waits.)"""
    n = ex.n_tasks
    funcs, of_task = np.unique(ex.func, return_inverse=True)
    gemv = np.array([takes_runs(variants[int(f)]) for f in funcs], bool)[of_task.reshape(-1)]
    ptr = ex.fanout_ptr.astype(np.int64)
    source = np.repeat(np.arange(n), np.diff(ptr))
    succ = ex.fanout_ids.astype(np.int64) - ex.first_task
    out = np.zeros(n, bool)
    out[succ[gemv[source] & (level[source] == level[succ] - 1)]] = True
    return out


def item_affinity(plan: Plan, c: Counters) -> Affinity:
    """Each item's producers in ``plan`` by its row, for the list schedule
    (:class:`pto.exec.order.Affinity`), from its counters ``c`` (:meth:`Plan.counters` with
    :attr:`Plan.boxes`: dependencies at the granularity of data): the predecessor items whose
    release its counter counts, and whether they are fewer than every item of its task's
    predecessors."""
    # (producer row, counter) pairs, by counter
    src = np.repeat(np.arange(len(c.rel_ptr) - 1), np.diff(c.rel_ptr.astype(np.int64)))
    by = np.argsort(c.rel, kind="stable")
    src, cnt = src[by], c.rel[by].astype(np.int64)
    cptr = np.zeros(len(c.init) + 1, np.int64)
    np.cumsum(np.bincount(cnt, minlength=len(c.init)), out=cptr[1:])
    counter = c.by_row()
    n_of_row = cptr[counter + 1] - cptr[counter]
    ptr = np.zeros(len(counter) + 1, np.int64)
    np.cumsum(n_of_row, out=ptr[1:])
    starts = np.repeat(cptr[counter], n_of_row)
    rows = src[starts + np.arange(int(ptr[-1])) - np.repeat(ptr[:-1], n_of_row)]
    task = np.repeat(np.arange(plan.n_tasks), plan.nitems.astype(np.int64))
    narrow = (n_of_row > 0) & (n_of_row < plan.pending_items.astype(np.int64)[task])
    return Affinity(plan.row_base, ptr, rows, narrow)


#: the list schedule's affinity (``PTO_MK_AFFINITY``, :func:`make_plan`'s ``affinity``)
AFFINITY = ("off", "on")
#: the affinity where the settings and the environment name none: off, measured no faster on an
#: H200 (the 8B's step 4.2146 against 4.2148 ms, the 1B's within a call's spread: docs/PERF.md,
#: "Thirtieth session"), and an 8B plan builds seconds longer with it
DEFAULT_AFFINITY = "off"


def resolve_affinity(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_AFFINITY``, else :data:`DEFAULT_AFFINITY`; UsageError naming an
    unknown one."""
    from pto.backends.triton.megakernel import env_choice

    return env_choice(choice, "PTO_MK_AFFINITY", DEFAULT_AFFINITY, AFFINITY, "affinity")


#: where a branch takes its memrefs' row strides (``PTO_MK_STRIDES``, :func:`make_plan`'s
#: ``tensor_strides``): ``table``, loaded from its task's row of the stride table; ``constant``,
#: a constant of the branch where every task of it has the same (:attr:`Branch.strides`)
STRIDES = ("table", "constant")
#: the strides where the settings and the environment name none: the table (compiled for sm_90,
#: the 8B's Q4_K step's megakernel with constants has 13% fewer SASS instructions, its GEMV loops
#: 7-16% fewer, at the same 255 registers: docs/PERF.md, "Thirty-seventh session"; timed on an
#: H200 the quantized steps 3-6% faster, the 8B's Q4_K 2.368 against 2.447 ms, the 1B's 0.756
#: against 0.803, SmolLM2's Q4_1 0.464 against 0.493: "Thirty-ninth session"; the default once
#: the bf16 steps and the smoke check have run with it)
DEFAULT_STRIDES = "table"


def resolve_strides(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_STRIDES``, else :data:`DEFAULT_STRIDES`; UsageError naming an
    unknown one."""
    from pto.backends.triton.megakernel import env_choice

    return env_choice(choice, "PTO_MK_STRIDES", DEFAULT_STRIDES, STRIDES, "strides' source")


def runs_auto(asked: int | str | None) -> bool:
    """``asked`` (the settings', else ``PTO_MK_RUNS``, else :data:`DEFAULT_RUNS`) is ``auto``:
    the runs follow the programs (:func:`resolve_runs`)."""
    return (str(asked if asked is not None else os.environ.get("PTO_MK_RUNS", "")).strip() or DEFAULT_RUNS) == "auto"


def resolve_runs(asked: int | str | None, multiprocessors: int, share: int = 2) -> int:
    """The most work items a task's parallel indices become (0: an item an index) that ``asked``
    (the settings', else ``PTO_MK_RUNS``: a count, ``auto`` or 0, off; else :data:`DEFAULT_RUNS`)
    means for a schedule of ``multiprocessors`` programs (a multiprocessor each unless
    ``PTO_PROGRAMS`` says; ``auto``: ``share`` each, the programs a multiprocessor the kernel
    holds); UsageError naming anything else."""
    text = str(asked if asked is not None else os.environ.get("PTO_MK_RUNS", "")).strip() or DEFAULT_RUNS
    if text == "auto":
        return share * multiprocessors
    if not text.isdigit():
        src = "runs" if asked is not None else "PTO_MK_RUNS"
        raise UsageError(f"{src}={text!r}: the most work items of a task's runs, a count, auto or 0 (off)")
    return int(text)


def make_plan(graph, tensor_names: list[str], launch_group: dict[str, int], tensor_aligned: np.ndarray | None = None,
              programs: int = 132, order: str = "list", flags: FlagRule = no_flags, early: str = DEFAULT_EARLY,
              runs: int = 0, prefetch: str = "all", deps: str = DEFAULT_DEPS, affinity: str = DEFAULT_AFFINITY,
              tensor_strides: np.ndarray | None = None) -> Plan:
    """The device tables of a fully built graph (``launch_group``: GROUP per InCore function;
    ``tensor_aligned``: per tensor, a row stride that is a multiple of 16 elements and a 16-byte
    aligned base; all by default; ``order``: ``list`` (a list schedule for ``programs``
    programs, :func:`pto.exec.order.list_schedule`) or ``levels`` (:func:`pto.exec.order.item_order`
    alone); ``flags``: the specializations each task allows, the backend's rule; ``early``: which
    memrefs an item loads before its wait, :data:`EARLY_RULES`; ``runs``: a task of a GEMV
    (:func:`takes_runs`) in at most that many work items of consecutive indices, each a run its branch loops
    over, pipelined, after one wait (:attr:`pto.codegen.triton.megakernel.Branch.runs`; 0: an
    item an index); ``prefetch``: which tasks' branches may prefetch into L2 before their wait,
    :data:`PREFETCH_RULES`; ``deps``: what an item waits for, every item of its task's
    predecessors (``task``) or those whose data its own conflicts with (``data``,
    :mod:`pto.exec.item_deps`); ``affinity``: ``on``, with data dependencies the list schedule
    starts an item that waits for some of its task's predecessors' items on the program of its
    last producer where that is free (:class:`pto.exec.order.Affinity`), ``off`` on the lowest
    free one); ``tensor_strides``: per tensor, its row stride, each branch's constants where its
    tasks' tensors share one (:attr:`~pto.codegen.triton.megakernel.Branch.strides`; None: every
    stride loaded from the stride table)."""
    if order not in ("list", "levels"):
        raise UsageError(f"unknown queue order {order!r} (choose list or levels)")
    if early not in EARLY_RULES:
        raise UsageError(f"unknown early-load rule {early!r} (choose {' or '.join(EARLY_RULES)})")
    if prefetch not in PREFETCH_RULES:
        raise UsageError(f"unknown prefetch rule {prefetch!r} (choose {' or '.join(PREFETCH_RULES)})")
    if deps not in DEPS:
        raise UsageError(f"unknown dependencies {deps!r} (choose {' or '.join(DEPS)})")
    if affinity not in AFFINITY:
        raise UsageError(f"unknown affinity {affinity!r} (choose {' or '.join(AFFINITY)})")
    if tensor_aligned is None:
        tensor_aligned = np.ones(len(tensor_names), bool)
    ex = graph.runtime.export()
    n = ex.n_tasks
    variants = graph.variant_of_func_id()
    tensor_index = {graph.tensor_ids[name]: i for i, name in enumerate(tensor_names)}
    t = _Tables(n, max((len(f.memrefs) for f in variants.values()), default=1) or 1)
    written = written_tensors(ex, variants, tensor_index, len(tensor_names))
    tensor_flags = np.stack([tensor_aligned, ~written], axis=1)
    before = predecessor_writes(ex, variants, tensor_index, len(tensor_names)) if early == "preds" else None
    succ_ptr = ex.fanout_ptr.astype(np.int64)
    succ = (ex.fanout_ids.astype(np.int64) - ex.first_task).astype(np.int64)
    lv = levels(n, succ_ptr, succ)
    light = ~after_gemvs(ex, variants, lv) if prefetch == "light" else None
    exported = []  # (fn, tasks, regions, scalars) per variant, for the items' boxes
    for fid in np.unique(ex.func):
        fn = variants[int(fid)]
        idx = np.nonzero(ex.func == fid)[0]
        base = ex.arg_ptr[idx][:, None] + np.arange(len(fn.params))[None, :]
        args = ex.arg_tensor[base], ex.arg_region[base], ex.arg_scalar[base]
        t.add_variant(int(fid), fn, idx, args, tensor_index, tensor_flags, flags, launch_group.get(fn.name, 0),
                      None if before is None else ~before[idx], runs, None if light is None else light[idx],
                      tensor_strides)
        exported.append((fn, idx, args[1], args[2]))
    boxes = item_boxes(exported, t.extent, t.run, t.parallel, t.task_tensor.shape[1]) if deps == "data" else None
    pending = np.bincount(succ, minlength=n).astype(np.int32)
    bottom = bottom_levels(n, succ_ptr, succ, lv)
    _, binding = np.unique(t.task_tensor, axis=0, return_inverse=True)
    items = item_order(lv, bottom, t.task_branch, t.extent, t.group, binding.reshape(-1), t.work)
    if len(succ) > _INT32_MAX or len(items) > _INT32_MAX // 2:
        raise ExecutionError(f"the graph has {len(succ):,} edges and {len(items):,} work items: more than the "
                             "persistent kernel's int32 indices hold; use --executor waves")
    plan = Plan(t.branches, items, t.task_branch, t.task_row, t.table(), t.task_tensor, tensor_names, pending,
                t.extent.astype(np.int32), succ_ptr.astype(np.int32), succ.astype(np.int32), int(ex.first_task),
                t.variant, dict(launch_group), t.cost, programs, None, member=None,
                run=t.run if (t.run > 1).any() else None, parallel=t.parallel, boxes=boxes)
    if order != "list":
        return plan
    counts = plan.counters() if boxes is not None and affinity == "on" else None
    aff = item_affinity(plan, counts) if counts is not None else None
    items, worker = list_schedule(items, t.cost, t.extent, Dag(succ_ptr, succ, pending, lv), programs, affinity=aff)
    return replace(plan, items=items, worker=worker, affinity=aff, data_counts=counts)


__all__ = ["AFFINITY", "DEFAULT_AFFINITY", "resolve_affinity", "item_affinity", "Plan", "make_plan", "no_flags",
           "FlagRule", "written_tensors", "writes_by_task", "predecessor_writes",
           "EARLY_RULES", "DEFAULT_EARLY", "resolve_early", "resolve_runs", "runs_auto", "takes_runs", "PREFETCH_RULES",
           "resolve_prefetch_rule", "after_gemvs"]
