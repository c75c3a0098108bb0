"""Normalization tiles: RMSNorm of row tiles (any transformer's pre-attention and pre-FFN norm).

Rows are ``(seq, hidden)`` activations; the sum of squares is an f32 statistic whatever the
storage dtype, and the row never has to fit on chip (two passes over column chunks).
"""

from __future__ import annotations

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def _row_scale(k: InCore, x, row, tiles, hidden: int, chunk: int, eps: float, dtype) -> None:
    """``ss = rsqrt(mean(x^2) + eps)`` of the rows of ``x`` from ``row`` (the tiles: the x chunk,
    its squares, a partial sum, ``ss``), in a pass over column chunks; f32 whatever the dtype."""
    xt, sq, part, ss = tiles
    k.full(ss, 0.0)
    with k.for_range("c", 0, hidden, chunk) as c:
        k.load(xt, x, row, c)
        if dtype == f32:
            k.mul(sq, xt, xt)
        else:
            k.cast(sq, xt)
            k.mul(sq, sq, sq)
        k.rowsum(part, sq)
        k.add(ss, ss, part)
    k.muls(ss, ss, 1.0 / hidden)
    k.adds(ss, ss, eps)
    k.rsqrt(ss, ss)


def rms_scale_tile(hidden: int, dtype, rows: int, row_block: int, chunk: int, eps: float = 1e-6,
                   target=None) -> IncoreFunction:
    """``r = rsqrt(mean(x^2) + eps)`` per row of an R x hidden row tile (``r``: R x 1, f32): the
    statistics of RMSNorm alone, for projections with the norm's gain folded into their weights
    that scale their rows in the epilogue (:class:`pto.incore.fused.RowScale`). One pass over
    column chunks; a parallel axis over blocks of rows."""
    k = InCore("rms_scale_tile")
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    x, r = k.memref("x", dtype), k.memref("r", f32)
    b = k.parallel("b", cdiv(R, RB))
    xt = k.tile("xt", RB, chunk, dtype)
    sq = k.tile("sq", RB, chunk, f32)
    part = k.tile("part", RB, 1, f32)
    ss = k.tile("ss", RB, 1, f32)
    _row_scale(k, x, b * RB, (xt, sq, part, ss), hidden, chunk, eps, dtype)
    k.store(r, b * RB, 0, ss)
    return k.build(target)


def rmsnorm_tile(hidden: int, dtype, rows: int, row_block: int, chunk: int, eps: float = 1e-6,
                 target=None) -> IncoreFunction:
    """``y = x * rsqrt(mean(x^2) + eps) * g`` over R x hidden rows; two passes over column
    chunks (the row never has to fit on chip); a parallel axis over blocks of rows."""
    k = InCore("rmsnorm_tile")
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    x, g, y = k.memref("x", dtype), k.memref("g", dtype), k.memref("y", dtype)
    b = k.parallel("b", cdiv(R, RB))
    xt = k.tile("xt", RB, chunk, dtype)
    gt = k.tile("gt", 1, chunk, dtype)
    ss = k.tile("ss", RB, 1, f32)
    part = k.tile("part", RB, 1, f32)
    sq = k.tile("sq", RB, chunk, f32)
    _row_scale(k, x, b * RB, (xt, sq, part, ss), hidden, chunk, eps, dtype)
    gf = k.tile("gf", 1, chunk, f32) if dtype != f32 else gt
    with k.for_range("c2", 0, hidden, chunk) as c2:
        k.load(xt, x, b * RB, c2)
        k.load(gt, g, 0, c2)
        if dtype != f32:
            k.cast(sq, xt)
            k.cast(gf, gt)
            k.rowexpandmul(sq, sq, ss)
            k.colexpandmul(sq, sq, gf)
            k.cast(xt, sq)
        else:
            k.rowexpandmul(xt, xt, ss)
            k.colexpandmul(xt, xt, gt)
        k.store(y, b * RB, c2, xt)
    return k.build(target)
