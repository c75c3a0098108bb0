"""Projections with the RMSNorm before them folded in, and RoPE in the Q/K projections' epilogue.

``rmsnorm(x) @ w = diag(r) ((x * g) @ w)`` with ``r = rsqrt(mean(x^2) + eps)`` per row: the K loop
that feeds the matmul loads every element of the row tile anyway, so it also sums the squares,
multiplies the tile by the norm weight ``g`` before the matmul, and the epilogue scales each row
of the accumulator by ``r``. No normalized copy of the activations is written or read, and no
separate norm task runs. RoPE mixes the two halves of each head (``y1 = a1 cos - a2 sin``,
``y2 = a2 cos + a1 sin``), so the Q/K projection computes a head's two halves in two accumulators
and rotates them before the store.

Numerics: the product ``x * g`` is rounded to the storage dtype before the matmul (as the norm's
output is in the unfused layer), the row scale is applied in f32 afterwards; the sum of squares
accumulates in f32. The difference to the unfused layer is one rounding per element, within the
storage dtype's tolerance.
"""

from __future__ import annotations

from pto.incore.matmul import swiglu_epilogue

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


class RowNorm:
    """The tiles and steps of the folded RMSNorm in a row-tile matmul's K loop: R rows of K
    columns in steps of ``bk``."""

    def __init__(self, k: InCore, R, bk: int, dtype, eps: float, K: int):
        self.k, self.dtype, self.eps, self.K, self.R, self.bk = k, dtype, eps, K, R, bk
        self.g = k.memref("g", dtype)
        self.xt = k.tile("xt", R, bk, dtype)
        self.xf = k.tile("xf", R, bk, f32)
        self.sq = k.tile("sq", R, bk, f32)
        self.gt = k.tile("gt", 1, bk, dtype)
        self.gf = k.tile("gf", 1, bk, f32)
        self.part = k.tile("part", R, 1, f32)
        self.ss = k.tile("ss", R, 1, f32)
        k.full(self.ss, 0.0)

    def step(self, x, kk, a) -> None:
        """Load the x tile at column ``kk``, add its squares to the row sums, ``a = x * g``."""
        k = self.k
        k.load(self.xt, x, 0, kk)
        k.load(self.gt, self.g, 0, kk)
        k.cast(self.xf, self.xt)
        k.mul(self.sq, self.xf, self.xf)
        k.rowsum(self.part, self.sq)
        k.add(self.ss, self.ss, self.part)
        k.cast(self.gf, self.gt)
        k.colexpandmul(self.xf, self.xf, self.gf)
        k.cast(a, self.xf)

    def scale(self, *accs) -> None:
        """``acc *= rsqrt(mean(x^2) + eps)`` per row."""
        k = self.k
        k.muls(self.ss, self.ss, 1.0 / self.K)
        k.adds(self.ss, self.ss, self.eps)
        k.rsqrt(self.ss, self.ss)
        for acc in accs:
            k.rowexpandmul(acc, acc, self.ss)


def normed_gemm(k: InCore, x, w, norm: RowNorm, bn: int, j):
    """The shared body of a row tile's projection with the RMSNorm folded in (``norm``, declared
    just before: its tiles come first): the R rows of ``x`` against column block ``j`` (``bn``
    wide) of ``w``, accumulated over K in the norm's steps and scaled by each row's
    rsqrt(mean(x^2) + eps); returns the f32 accumulator."""
    R, bk, dtype = norm.R, norm.bk, norm.dtype
    a = k.tile("a", R, bk, dtype)
    bt = k.tile("bt", bk, bn, dtype)
    acc = k.tile("acc", R, bn, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, norm.K, bk) as kk:
        norm.step(x, kk, a)
        k.load(bt, w, kk, j * bn)
        k.matmul_acc(acc, a, bt)
    norm.scale(acc)
    return acc


def matmul_norm_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float, target=None) -> IncoreFunction:
    """``y = rmsnorm(x; g, eps) @ w`` for an R x K row tile against a whole K x N weight, output
    column blocks of ``bn`` on the parallel axis."""
    k = InCore("matmul_norm_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(K, N))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    acc = normed_gemm(k, x, w, RowNorm(k, R, bk, dtype, eps, K), bn, j)
    out = k.tile("out", R, bn, dtype)
    k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def matmul_norm_rope_tile(dtype, rows: int, K: int, heads: int, head_dim: int, bk: int, eps: float,
                          target=None) -> IncoreFunction:
    """``y = rope(rmsnorm(x; g, eps) @ w)`` for the q or k projection: one head per index of the
    parallel axis, its two halves in two accumulators, rotated by the row tile's ``cos`` and
    ``sin`` (``rows x head_dim / 2``) before the store."""
    k = InCore("matmul_norm_rope_tile")
    _norm_rope(k, rows, K, heads, head_dim, bk, eps, dtype)
    return k.build(target)


def matmul_norm_rope_k_tile(dtype, rows: int, K: int, heads: int, head_dim: int, bk: int, eps: float,
                            target=None) -> IncoreFunction:
    """:func:`matmul_norm_rope_tile` as a second function for another head count (grouped-query
    attention's k)."""
    k = InCore("matmul_norm_rope_k_tile")
    _norm_rope(k, rows, K, heads, head_dim, bk, eps, dtype)
    return k.build(target)


def _norm_rope(k: InCore, rows: int, K: int, heads: int, head_dim: int, bk: int, eps: float, dtype) -> None:
    R = k.dim("R", rows)
    half = head_dim // 2
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(K, heads * head_dim))
    cos, sin = k.memref("cos", dtype), k.memref("sin", dtype)
    y = k.memref("y", dtype, shape=(R, heads * head_dim))
    h = k.parallel("h", heads)
    norm = RowNorm(k, R, bk, dtype, eps, K)
    a = k.tile("a", R, bk, dtype)
    b1, b2 = k.tile("b1", bk, half, dtype), k.tile("b2", bk, half, dtype)
    a1, a2 = k.tile("a1", R, half, f32), k.tile("a2", R, half, f32)
    k.full(a1, 0.0)
    k.full(a2, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        norm.step(x, kk, a)
        k.load(b1, w, kk, h * head_dim)
        k.load(b2, w, kk, h * head_dim + half)
        k.matmul_acc(a1, a, b1)
        k.matmul_acc(a2, a, b2)
    norm.scale(a1, a2)
    # bf16 rounding of the projection first, as the unfused layer stores q and k before RoPE
    ct, st = k.tile("ct", R, half, dtype), k.tile("st", R, half, dtype)
    cf, sf = k.tile("cf", R, half, f32), k.tile("sf", R, half, f32)
    t1, t2 = k.tile("t1", R, half, f32), k.tile("t2", R, half, f32)
    ob = k.tile("ob", R, half, dtype)
    if dtype != f32:
        k.cast(ob, a1)
        k.cast(a1, ob)
        k.cast(ob, a2)
        k.cast(a2, ob)
    k.load(ct, cos, 0, 0)
    k.load(st, sin, 0, 0)
    k.cast(cf, ct)
    k.cast(sf, st)
    k.mul(t1, a1, cf)
    k.mul(t2, a2, sf)
    k.sub(t1, t1, t2)  # y1 = a1 cos - a2 sin
    k.cast(ob, t1)
    k.store(y, 0, h * head_dim, ob)
    k.mul(t1, a2, cf)
    k.mul(t2, a1, sf)
    k.add(t1, t1, t2)  # y2 = a2 cos + a1 sin
    k.cast(ob, t1)
    k.store(y, 0, h * head_dim + half, ob)


def matmul_norm_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float,
                            target=None) -> IncoreFunction:
    """``y = silu(xn @ wg) * (xn @ wu)`` with ``xn = rmsnorm(x; g, eps)`` folded in: the FFN's
    norm, gate and up projections and SwiGLU in one program per column block."""
    k = InCore("matmul_norm_swiglu_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    wg = k.memref("wg", dtype, shape=(K, N))
    wu = k.memref("wu", dtype, shape=(K, N))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    norm = RowNorm(k, R, bk, dtype, eps, K)
    a = k.tile("a", R, bk, dtype)
    bg, bu = k.tile("bg", bk, bn, dtype), k.tile("bu", bk, bn, dtype)
    g, u = k.tile("gacc", R, bn, f32), k.tile("uacc", R, bn, f32)
    k.full(g, 0.0)
    k.full(u, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        norm.step(x, kk, a)
        k.load(bg, wg, kk, j * bn)
        k.load(bu, wu, kk, j * bn)
        k.matmul_acc(g, a, bg)
        k.matmul_acc(u, a, bu)
    norm.scale(g, u)
    swiglu_epilogue(k, g, u, y, j * bn, R, bn, dtype)
    return k.build(target)


__all__ = ["RowNorm", "normed_gemm", "matmul_norm_tile", "matmul_norm_rope_tile", "matmul_norm_rope_k_tile",
           "matmul_norm_swiglu_tile"]
