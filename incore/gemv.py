"""Projections of a few rows against weights stored output-major (``[N, K]``, as
``nn.Linear`` keeps them): the decode step's GEMVs.

A decode step multiplies one row per sequence by every weight once: the time is the weights'
bytes over the bandwidth the programs reach, and the programs are few when a block is many
columns of a ``[K, N]`` weight (each row of such a block is a short, strided read). Stored
``[N, K]``, a block of ``bn`` outputs is ``bn`` contiguous rows of the weight: narrow blocks
give every SM programs, and each reads long contiguous runs. The product is ``x @ w.T``
(``tb``), which the Triton renderer computes for a few rows as a multiply-sum along the rows'
contiguous axis (no transposed copy).

- :func:`gemv_norm_tile`: ``y = rmsnorm(x) @ w.T`` (the norm folded in, as
  :func:`pto.incore.fused.matmul_norm_tile`);
- :func:`gemv_residual_tile`: ``y = r + x @ w.T``;
- :func:`gemv_norm_swiglu_tile`: ``y = silu(xn @ wg.T) * (xn @ wu.T)``, ``xn = rmsnorm(x)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.incore.fused import RowNorm
from pto.incore.matmul import swiglu_epilogue

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


@dataclass(frozen=True)
class Gemv:
    """R rows of K columns against blocks of ``bn`` output rows of an output-major weight, in
    contraction steps of ``bk``."""

    R: object
    K: object
    bn: int
    bk: int
    dtype: object


def gemv_accumulate(k: InCore, x, weights: dict, g: Gemv, j, norm: RowNorm | None = None) -> list:
    """The f32 accumulators ``x @ w[j * bn: (j + 1) * bn].T`` of each weight (scaled by the
    folded norm's row factors with ``norm``, declared just before)."""
    a = k.tile("a", g.R, g.bk, g.dtype)
    blocks = {n: k.tile(f"b{n}", g.bn, g.bk, g.dtype) for n in weights}
    accs = {n: k.tile(f"acc{n}", g.R, g.bn, f32) for n in weights}
    for acc in accs.values():
        k.full(acc, 0.0)
    with k.for_range("kk", 0, g.K, g.bk) as kk:
        if norm is not None:
            norm.step(x, kk, a)
        else:
            k.load(a, x, 0, kk)
        for n, w in weights.items():
            k.load(blocks[n], w, j * g.bn, kk)
            k.matmul_acc(accs[n], a, blocks[n], tb=True)
    if norm is not None:
        norm.scale(*accs.values())
    return list(accs.values())


def gemv_norm_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float, target=None) -> IncoreFunction:
    """``y = rmsnorm(x; g, eps) @ w.T`` for R rows of K against an ``[N, K]`` weight, blocks of
    ``bn`` outputs on the parallel axis."""
    k = InCore("gemv_norm_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(N, K))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    (acc,) = gemv_accumulate(k, x, {"": w}, Gemv(R, K, bn, bk, dtype), j, RowNorm(k, R, bk, dtype, eps, K))
    out = k.tile("out", R, bn, dtype)
    k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def gemv_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = r + x @ w.T`` for R rows of K against an ``[N, K]`` weight (the residual in the
    epilogue); K and N are dims (a call binds them)."""
    k = InCore("gemv_residual_tile")
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)  # one function for every projection a call binds
    x = k.memref("x", dtype, shape=(R, KD))
    w = k.memref("w", dtype, shape=(ND, KD))
    r = k.memref("r", dtype, shape=(R, ND))
    y = k.memref("y", dtype, shape=(R, ND))
    j = k.parallel("j", cdiv(ND, bn))
    (acc,) = gemv_accumulate(k, x, {"": w}, Gemv(R, KD, bn, bk, dtype), j)
    out = k.tile("out", R, bn, dtype)
    k.load(out, r, 0, j * bn)
    k.add(acc, acc, out)
    k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def gemv_norm_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float,
                          target=None) -> IncoreFunction:
    """``y = silu(xn @ wg.T) * (xn @ wu.T)``, ``xn = rmsnorm(x; g, eps)``, against ``[N, K]``
    gate and up weights: the FFN's norm, gate and up projections and SwiGLU in one program per
    block of ``bn`` outputs."""
    k = InCore("gemv_norm_swiglu_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    wg = k.memref("wg", dtype, shape=(N, K))
    wu = k.memref("wu", dtype, shape=(N, K))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    g, u = gemv_accumulate(k, x, {"g": wg, "u": wu}, Gemv(R, K, bn, bk, dtype), j, RowNorm(k, R, bk, dtype, eps, K))
    swiglu_epilogue(k, g, u, y, j * bn, R, bn, dtype)
    return k.build(target)


__all__ = ["Gemv", "gemv_accumulate", "gemv_norm_tile", "gemv_residual_tile", "gemv_norm_swiglu_tile"]
