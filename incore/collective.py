"""Collective tiles: a region summed over the ranks of a tensor-parallel mesh.

A call of one of these is a task of the graph like any other: it depends on the tasks that
wrote the partial results of its region and releases exactly that region to its consumers, so
a row tile's all-reduce starts as soon as that row tile's partial sums exist.

- :func:`allreduce_tile`: ``x = sum over ranks of x``, in place (an inout region);
- :func:`allreduce_residual_tile`: ``y = r + sum over ranks of x``: the row-parallel
  projections' all-reduce with the residual connection in its epilogue (the sum is kept in f32
  and rounded once, after the add).

Column blocks are the parallel axis, as in :mod:`.elementwise`; the whole row tile is one tile,
so a batch of tasks is one collective. These functions run through the torch evaluator (on the
GPU too); their tiles are small enough for any target's on-chip memory only so that the SRAM
check of every variant passes.
"""

from __future__ import annotations

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def allreduce_tile(dtype, rows: int, cols: int, block: int, acc=f32, target=None) -> IncoreFunction:
    """``x[R x cols] = sum over ranks of x``, summed in ``acc`` (f32, or ``dtype``: half the
    bytes on the wire for half-precision tensors)."""
    k = InCore("allreduce_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype)
    j = k.parallel("j", cdiv(cols, block))
    t = k.tile("t", R, block, dtype)
    k.load(t, x, 0, j * block)
    k.allreduce(t, t, acc=acc)
    k.store(x, 0, j * block, t)
    return k.build(target)


def allreduce_residual_tile(dtype, rows: int, cols: int, block: int, acc=f32, target=None) -> IncoreFunction:
    """``y = r + sum over ranks of x`` for R x cols row tiles: the partial sums ``x`` of a
    row-parallel projection, the residual ``r``; the sum stays in f32 until the add."""
    k = InCore("allreduce_residual_tile")
    R = k.dim("R", rows)
    x, r, y = k.memref("x", dtype), k.memref("r", dtype), k.memref("y", dtype)
    j = k.parallel("j", cdiv(cols, block))
    t, u = k.tile("t", R, block, dtype), k.tile("u", R, block, dtype)
    s = k.tile("s", R, block, f32)
    k.load(t, x, 0, j * block)
    k.allreduce(s, t, acc=acc)
    k.load(u, r, 0, j * block)
    k.add(s, s, u)
    k.cast(t, s)
    k.store(y, 0, j * block, t)
    return k.build(target)
