"""A batch of collective tasks on the GPU without the host: two kernels and one sum.

:func:`pto.passes.collective.split_collective` cuts a collective InCore function at its
all-reduce. The batch's launch is the first part's kernel (every task writes its tile, in the
sum's dtype, to its own rows of one buffer), one sum of the whole buffer over the ranks
(:func:`pto.collectives.all_reduce`: by the message's size symmetric memory's one-shot or
two-shot all-reduce, or the process group's NCCL), and the second part's kernel (every task
reads its summed tile back and goes on). Nothing waits for the host, so a CUDA graph captures
the batch with the rest of the step when the process group's backend can be captured (NCCL).
A function the pass does not split runs through the torch evaluator as before.

``PTO_COLLECTIVES`` (:func:`pto.collectives.mode`) forces an algorithm, or ``evaluator`` keeps
every collective on the evaluator (to compare); ``PTO_COLLECTIVE_CHUNKS`` sets how many parts a
batch's sum goes in (:func:`chunks`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from pto import collectives, dist
from pto.batch import RegionBatch, TaskBatch
from pto.errors import UsageError
from pto.ir.analysis import has_collective
from pto.ir.expr import evaluate
from pto.passes.collective import CollectiveSplit, split_collective

MODES = collectives.MODES


def mode() -> str:
    """``PTO_COLLECTIVES`` (:func:`pto.collectives.mode`)."""
    return collectives.mode()


def native_split(fn) -> CollectiveSplit | None:
    """How the Triton backend runs collective ``fn`` natively, or None (the evaluator)."""
    return split_collective(fn) if has_collective(fn) and mode() != "evaluator" else None


def capturable(variants) -> bool:
    """Can a CUDA graph capture the collective tasks of a graph with these variants? Every one
    native, and the process group's collectives capturable (NCCL, or no group at all)."""
    talking = [f for f in variants if has_collective(f)]
    if not talking:
        return True
    if any(native_split(f) is None for f in talking):
        return False
    return not dist.initialized() or dist.backend() == "nccl"


@dataclass
class CollectiveParts:
    """A collective batch cut in two: the first part's batch writes ``send`` (task t rows ``[t R,
    (t + 1) R)``), the sum leaves the result in ``recv`` (``send`` itself but for one-shot), the
    second part's batch reads it; the sum by ``algorithm`` (:data:`pto.collectives.ALGORITHMS`)."""

    send: torch.Tensor
    recv: torch.Tensor
    first: TaskBatch
    second: TaskBatch
    algorithm: str = collectives.GROUP


def parts(batch: TaskBatch, split: CollectiveSplit, env: dict, allocate: bool = True,
          pool: collectives.SumBuffers | None = None, algorithm: str = collectives.GROUP) -> CollectiveParts:
    """``batch`` (its function cut as ``split``; ``env`` its task environment) as two batches
    around a sum by ``algorithm`` (:class:`CollectiveParts`). ``allocate=False``: empty buffers
    (to count launches).

    ``pool``: the buffers are the front of the pool's (:class:`pto.collectives.SumBuffers`),
    grown when too small, so that the batches of one backend share them: a batch's second part
    has read them (on the executor's stream, after every chunk's sum) before the next batch's
    first part writes them. Symmetric memory's algorithms send from its buffer; one-shot sums
    into a plain one (its peers read the buffer it sends while it sums)."""
    size = batch.size
    device = next(iter(batch.mems.values())).tensor.device
    shape, dtype = _shape(batch, split, env), split.acc.torch
    if not allocate:
        shape = (0, 0)
        send = recv = torch.zeros(shape, dtype=dtype, device=device)
    else:
        pool = pool if pool is not None else collectives.SumBuffers()
        need = shape[0] * shape[1]
        send = pool.get(need, dtype, device, algorithm != collectives.GROUP).view(shape)
        recv = pool.get(need, dtype, device).view(shape) if algorithm == collectives.ONE_SHOT else send
    ones = torch.ones(size, dtype=torch.int64)

    def region(t):
        return RegionBatch(t, torch.arange(size, dtype=torch.int64) * split.rows, ones * 0, ones * split.rows,
                           ones * shape[1])

    def part(f, buffer):
        mems = {**batch.mems, split.buffer: region(buffer)}
        return TaskBatch(f, {p.name: mems[p.name] for p in f.memrefs},
                         {p.name: batch.scalars[p.name] for p in f.scalars}, size)

    return CollectiveParts(send, recv, part(split.pre, send), part(split.post, recv), algorithm)


def _shape(batch: TaskBatch, split: CollectiveSplit, env: dict) -> tuple[int, int]:
    """The sum buffer's shape: a task's rows for each task, the tile's columns for each program
    of the parallel axis."""
    fn, extent = batch.fn, 1
    if fn.parallel is not None:
        extent = int(torch.as_tensor(evaluate(fn.parallel.extent, env)).max())
    return batch.size * split.rows, split.cols * extent


def algorithm(batch: TaskBatch, split: CollectiveSplit, env: dict) -> str:
    """The sum's algorithm for ``batch`` (:func:`pto.collectives.choose`): one for all its
    chunks, chosen by the largest chunk's bytes, symmetric memory only where every chunk's view
    of the buffer is aligned for it and its kernels sum the dtype. Every rank chooses the same
    (the same batches, the same group)."""
    if dist.world_size() == 1 or batch.size == 0:
        return collectives.GROUP
    device = next(iter(batch.mems.values())).tensor.device
    rows, width = _shape(batch, split, env)
    row_bytes = width * split.acc.itemsize * split.rows  # one task's share of the buffer
    bounds = _chunk_bounds(batch.size, device)
    sizes = [(hi - lo) * row_bytes for lo, hi in zip(bounds, bounds[1:])]
    ok = all(collectives.aligned(n, lo * row_bytes) for n, lo in zip(sizes, bounds))
    how = mode()
    symmetric = device.type == "cuda" and how in ("auto", "symm") and split.acc.torch in collectives.SYMMETRIC_DTYPES \
        and collectives.symmetric_memory().usable
    return collectives.choose(max(sizes), symmetric, ok, how)


def chunks() -> int:
    """``PTO_COLLECTIVE_CHUNKS``: how many parts a batch's sum is sent in (default 4)."""
    v = os.environ.get("PTO_COLLECTIVE_CHUNKS", "4")
    if not v.isdigit() or int(v) < 1:
        raise UsageError(f"PTO_COLLECTIVE_CHUNKS={v!r}: expected a positive integer")
    return int(v)


def _tasks(batch: TaskBatch, lo: int, hi: int) -> TaskBatch:
    """Tasks ``[lo, hi)`` of ``batch``."""
    return TaskBatch(batch.fn, {k: RegionBatch(v.tensor, v.row0[lo:hi], v.col0[lo:hi], v.rows[lo:hi], v.cols[lo:hi])
                                for k, v in batch.mems.items()},
                     {k: v[lo:hi] for k, v in batch.scalars.items()}, hi - lo)


def _overlapped(device: torch.device) -> bool:
    """Do a batch's chunks overlap (their sums on a second stream)? On a GPU with NCCL and
    other ranks; a GPU otherwise (gloo sums through the host; one rank sums nothing) takes the
    batch whole. On the CPU the chunks run one after another."""
    return device.type == "cuda" and dist.world_size() > 1 and dist.backend() == "nccl"


def _chunk_bounds(size: int, device: torch.device) -> list[int]:
    """The first task of each chunk of a batch of ``size`` tasks on ``device``, and ``size``:
    :func:`chunks` of them where they run (see :func:`_overlapped`; at most one per task)."""
    n = min(chunks(), size) if device.type == "cpu" or _overlapped(device) else 1
    return [size * c // n for c in range(n + 1)]


def chunked(first: TaskBatch, second: TaskBatch) -> list[tuple[TaskBatch, TaskBatch, int, int]]:
    """``(first part's tasks, second part's tasks, lo, hi)`` of each chunk of consecutive tasks
    (:func:`_chunk_bounds`)."""
    device = first.mems[first.fn.memrefs[0].name].tensor.device
    edges = _chunk_bounds(first.size, device)
    return [(_tasks(first, lo, hi), _tasks(second, lo, hi), lo, hi) for lo, hi in zip(edges, edges[1:])]


class _Futures:
    """The compiles queued for a collective launch's parts: ``cancel`` cancels them all (the
    wave executor cancels a held launch's compile when the run fails)."""

    def __init__(self, launches):
        self.futures = [f for f in (getattr(x, "future", None) for x in launches) if f is not None]

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


@dataclass
class _Chunk:
    """One chunk of a collective launch: its first part's launch, its views of the buffers the
    sum reads and writes, its second part's launch."""

    pre: object
    send: torch.Tensor
    recv: torch.Tensor
    post: object


def collective_launch(prepare, batch: TaskBatch, split: CollectiveSplit, env: dict,
                      pool: collectives.SumBuffers | None = None):
    """The launch of ``batch`` (see :func:`parts`, also for ``pool``; the sum's algorithm by
    :func:`algorithm`): ``prepare`` makes each part's kernel launch (the backend's own), chunk by
    chunk (:func:`chunked`). With NCCL chunk c's sum runs on a second stream while chunk c + 1's
    first part runs, and every second part waits for its own chunk's sum; a CUDA graph captures
    the two streams' order as edges."""
    collectives.check()
    how = algorithm(batch, split, env)
    cut = parts(batch, split, env, pool=pool, algorithm=how)
    steps = [_Chunk(prepare(a), cut.send[lo * split.rows:hi * split.rows], cut.recv[lo * split.rows:hi * split.rows],
                    prepare(b)) for a, b, lo, hi in chunked(cut.first, cut.second)]
    device = cut.send.device
    comm = torch.cuda.Stream(device) if len(steps) > 1 and _overlapped(device) else None

    def launch():
        if comm is None:
            for c in steps:
                c.pre()
                collectives.all_reduce(c.send, c.recv, how)
                c.post()
            return
        main, done = torch.cuda.current_stream(device), []
        for c in steps:
            c.pre()
            comm.wait_stream(main)
            with torch.cuda.stream(comm):
                collectives.all_reduce(c.send, c.recv, how)
                done.append(torch.cuda.Event())
                done[-1].record(comm)
        for c, event in zip(steps, done):
            main.wait_event(event)
            c.post()

    launch.count = sum(c.pre.count + c.post.count for c in steps)
    launch.pending = any(getattr(f, "pending", False) for c in steps for f in (c.pre, c.post))
    launch.future = _Futures([f for c in steps for f in (c.pre, c.post)])
    launch.buffer = cut.send  # the bytes each rank sends (and inspection)
    launch.algorithm = how
    return launch


__all__ = ["MODES", "mode", "native_split", "capturable", "CollectiveParts", "parts", "algorithm", "chunks", "chunked",
           "collective_launch"]
