"""A batch of collective tasks on the GPU without the host: two kernels and one NCCL call.

:func:`pto.passes.collective.split_collective` cuts a collective InCore function at its
all-reduce. The batch's launch is the first part's kernel (every task writes its tile, in the
sum's dtype, to its own rows of one buffer), one ``all_reduce`` of the whole buffer over the
ranks in place (:func:`pto.dist.all_reduce_`), and the second part's kernel (every task reads its
summed tile back and goes on). Nothing waits for the host, so a CUDA graph captures the batch
with the rest of the step when the process group's backend can be captured (NCCL). A function
the pass does not split runs through the torch evaluator as before.

``PTO_COLLECTIVES=evaluator`` keeps every collective on the evaluator (to compare);
``PTO_COLLECTIVE_CHUNKS`` sets how many parts a batch's sum goes in (:func:`chunks`).
"""

from __future__ import annotations

import os

import torch

from pto import dist
from pto.batch import RegionBatch, TaskBatch
from pto.errors import UsageError
from pto.ir.analysis import has_collective
from pto.ir.expr import evaluate
from pto.passes.collective import CollectiveSplit, split_collective

MODES = ("native", "evaluator")


def mode() -> str:
    """``PTO_COLLECTIVES``: native (the default) or evaluator."""
    m = os.environ.get("PTO_COLLECTIVES", "native")
    if m not in MODES:
        raise UsageError(f"PTO_COLLECTIVES={m!r}: expected native or evaluator")
    return m


def native_split(fn) -> CollectiveSplit | None:
    """How the Triton backend runs collective ``fn`` natively, or None (the evaluator)."""
    return split_collective(fn) if has_collective(fn) and mode() == "native" else None


def capturable(variants) -> bool:
    """Can a CUDA graph capture the collective tasks of a graph with these variants? Every one
    native, and the process group's collectives capturable (NCCL, or no group at all)."""
    talking = [f for f in variants if has_collective(f)]
    if not talking:
        return True
    if any(native_split(f) is None for f in talking):
        return False
    return not dist.initialized() or dist.backend() == "nccl"


def parts(batch: TaskBatch, split: CollectiveSplit, env: dict, allocate: bool = True, pool: dict | None = None):
    """(the sum buffer, the first part's batch, the second part's batch) of ``batch`` (its
    function cut as ``split``; ``env`` its task environment): task t's place in the buffer is
    rows ``[t R, (t + 1) R)``. ``allocate=False``: an empty tensor (to count launches).

    ``pool`` (dtype, device) -> a flat tensor: the buffer is the front of that tensor, grown when
    too small, so that the batches of one backend share one buffer: a batch's second part has
    read it (on the executor's stream, after every chunk's sum) before the next batch's first
    part writes it."""
    size, fn = batch.size, batch.fn
    device = next(iter(batch.mems.values())).tensor.device
    extent = 1
    if fn.parallel is not None:
        extent = int(torch.as_tensor(evaluate(fn.parallel.extent, env)).max())
    width = split.cols * extent
    shape = (size * split.rows, width) if allocate else (0, 0)
    need, key = shape[0] * shape[1], (split.acc, str(device))
    flat = None if pool is None else pool.get(key)
    if flat is None or flat.numel() < need:
        flat = torch.zeros(need, dtype=split.acc.torch, device=device)
        if pool is not None and allocate:
            pool[key] = flat
    buffer = flat[:need].view(shape)
    ones = torch.ones(size, dtype=torch.int64)
    region = RegionBatch(buffer, torch.arange(size, dtype=torch.int64) * split.rows, ones * 0, ones * split.rows,
                         ones * width)
    mems = {**batch.mems, split.buffer: region}

    def part(f):
        return TaskBatch(f, {p.name: mems[p.name] for p in f.memrefs},
                         {p.name: batch.scalars[p.name] for p in f.scalars}, size)

    return buffer, part(split.pre), part(split.post)


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


def chunked(first: TaskBatch, second: TaskBatch) -> list[tuple[TaskBatch, TaskBatch, int, int]]:
    """``(first part's tasks, second part's tasks, lo, hi)`` of each chunk of consecutive tasks
    (:func:`chunks` of them where they run: see :func:`_overlapped`; at most one per task)."""
    size = first.size
    device = first.mems[first.fn.memrefs[0].name].tensor.device
    n = min(chunks(), size) if device.type == "cpu" or _overlapped(device) else 1
    edges = [size * c // n for c in range(n + 1)]
    return [(_tasks(first, lo, hi), _tasks(second, lo, hi), lo, hi) for lo, hi in zip(edges, edges[1:])]


class _Futures:
    """The compiles queued for a collective launch's parts: ``cancel`` cancels them all (the
    wave executor cancels a held launch's compile when the run fails)."""

    def __init__(self, launches):
        self.futures = [f for f in (getattr(x, "future", None) for x in launches) if f is not None]

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


def collective_launch(prepare, batch: TaskBatch, split: CollectiveSplit, env: dict, pool: dict | None = None):
    """The launch of ``batch`` (see :func:`parts`, also for ``pool``): ``prepare`` makes each
    part's kernel launch (the backend's own), chunk by chunk (:func:`chunked`). With NCCL chunk
    c's sum runs on a second stream while chunk c + 1's first part runs, and every second part
    waits for its own chunk's sum; a CUDA graph captures the two streams' order as edges."""
    buffer, first, second = parts(batch, split, env, pool=pool)
    steps = [(prepare(a), buffer[lo * split.rows:hi * split.rows], prepare(b))
             for a, b, lo, hi in chunked(first, second)]
    comm = torch.cuda.Stream(buffer.device) if len(steps) > 1 and _overlapped(buffer.device) else None

    def launch():
        if comm is None:
            for pre, view, post in steps:
                pre()
                dist.all_reduce_(view)
                post()
            return
        main, done = torch.cuda.current_stream(buffer.device), []
        for pre, view, _ in steps:
            pre()
            comm.wait_stream(main)
            with torch.cuda.stream(comm):
                dist.all_reduce_(view)
                done.append(torch.cuda.Event())
                done[-1].record(comm)
        for (_, _, post), event in zip(steps, done):
            main.wait_event(event)
            post()

    launch.count = sum(pre.count + post.count for pre, _, post in steps)
    launch.pending = any(getattr(f, "pending", False) for pre, _, post in steps for f in (pre, post))
    launch.future = _Futures([f for pre, _, post in steps for f in (pre, post)])
    launch.buffer = buffer  # the bytes each rank sends (and inspection)
    return launch


__all__ = ["MODES", "mode", "native_split", "capturable", "parts", "chunks", "chunked", "collective_launch"]
