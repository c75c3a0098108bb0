"""Collective tiles: a region summed over the ranks of a tensor-parallel mesh.

A call of one of these is a task of the graph like any other: it depends on the tasks that
wrote the partial results of its region and releases exactly that region to its consumers, so
a row tile's all-reduce starts as soon as that row tile's partial sums exist.

- :func:`allreduce_tile`: ``x = sum over ranks of x``, in place (an inout region);
- :func:`allreduce_residual_tile`: ``y = r + sum over ranks of x``: the row-parallel
  projections' all-reduce with the residual connection in its epilogue (the sum is kept in f32
  and rounded once, after the add);
- :func:`matmul_allreduce_residual_tile`: ``y = r + sum over ranks of (x @ w)``: the
  row-parallel projection itself, its partial product rounded to the storage dtype (as a
  stored partial would be), summed, the residual added;
- :func:`gemv_allreduce_residual_tile`: the same against an output-major (``[N, K]``) weight,
  the decode step's row-parallel GEMVs (:mod:`.gemv`).

Column blocks are the parallel axis, as in :mod:`.elementwise`; a batch of tasks is one
collective. The Triton backend cuts each at its all-reduce (:mod:`pto.passes.collective`):
the part before is one kernel, the sum one NCCL call over the batch (in chunks, so that the
product of one chunk runs while the previous chunk is summed), the part after a second kernel
(under the interpreter on the CPU the same, around gloo). The torch backend runs them through
the tile evaluator.
"""

from __future__ import annotations

from pto.incore.gemv import Gemv, gemv_accumulate

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
    _sum_and_add(k, (s, t, u), r, y, j * block, acc)
    return k.build(target)


def matmul_allreduce_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, acc=f32,
                                   target=None) -> IncoreFunction:
    """``y = r + sum over ranks of round(x @ w)`` for an R x K row tile against this rank's
    K x N row shard of a row-parallel weight: the product accumulated in f32 and rounded to
    ``dtype`` (the partial sum the unfused layer stores), summed in ``acc``, plus ``r``."""
    k = InCore("matmul_allreduce_residual_tile")
    R, KD, ND, (x, w, r, y), j = _row_parallel(k, dtype, (rows, K, N), bn, output_major=False)
    a, bt = k.tile("a", R, bk, dtype), k.tile("bt", bk, bn, dtype)
    p, out = k.tile("p", R, bn, f32), k.tile("out", R, bn, dtype)
    k.full(p, 0.0)
    with k.for_range("kk", 0, KD, bk) as kk:
        k.load(a, x, 0, kk)
        k.load(bt, w, kk, j * bn)
        k.matmul_acc(p, a, bt)
    k.cast(out, p)
    _sum_and_add(k, (p, out, out), r, y, j * bn, acc)
    return k.build(target)


def gemv_allreduce_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, acc=f32,
                                 target=None) -> IncoreFunction:
    """``y = r + sum over ranks of round(x @ w.T)`` for R rows of K against this rank's ``[N, K]``
    shard of a row-parallel weight stored output-major (its K columns are the rank's: the heads or
    FFN columns it holds), blocks of ``bn`` outputs; rounded, summed and added as
    :func:`matmul_allreduce_residual_tile`."""
    k = InCore("gemv_allreduce_residual_tile")
    R, KD, ND, (x, w, r, y), j = _row_parallel(k, dtype, (rows, K, N), bn, output_major=True)
    (p,) = gemv_accumulate(k, x, {"": w}, Gemv(R, KD, bn, bk, dtype), j)
    out = k.tile("out", R, bn, dtype)
    k.cast(out, p)
    _sum_and_add(k, (p, out, out), r, y, j * bn, acc)
    return k.build(target)


def _row_parallel(k: InCore, dtype, sizes, bn: int, output_major: bool):
    """The declarations of a row-parallel projection with its sum: dims R, K, N (``sizes``: their
    defaults), memrefs x, w (``[K, N]``, or ``[N, K]`` when ``output_major``), r, y, and the
    parallel axis over blocks of ``bn`` outputs."""
    R = k.dim("R", sizes[0])
    KD, ND = k.dim("K", sizes[1]), k.dim("N", sizes[2])
    x = k.memref("x", dtype, shape=(R, KD))
    w = k.memref("w", dtype, shape=(ND, KD) if output_major else (KD, ND))
    r, y = k.memref("r", dtype, shape=(R, ND)), k.memref("y", dtype, shape=(R, ND))
    return R, KD, ND, (x, w, r, y), k.parallel("j", cdiv(ND, bn))


def _sum_and_add(k: InCore, tiles, r, y, col, acc) -> None:
    """``y[:, col:] = r[:, col:] + sum over ranks of t``: the sum into the f32 tile ``s``, the
    residual loaded into ``u``, the result rounded into ``t`` (``tiles``: s, t, u)."""
    s, t, u = tiles
    k.allreduce(s, t, acc=acc)
    k.load(u, r, 0, col)
    k.add(s, s, u)
    k.cast(t, s)
    k.store(y, 0, col, t)
