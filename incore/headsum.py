"""One sequence's o projection split by query head, into the combine of the decode attention:
a layer's tasks one fewer.

``attn @ wo.T = sum_h attn_h @ wo[:, h].T`` (``attn_h`` head h's D columns of the attention
output, ``wo[:, h]`` the matching D columns of the output-major weight). So the task that
combines head h's partial states can also multiply the head by its slice of ``wo``, and the
layer's residual ``x2 = x + attn @ wo.T`` becomes ``x + sum_h p_h`` with ``p_h`` that task's
f32 row: the o projection is no task of its own, and its launch, a dependent kernel of a few
microseconds in a decode step of one sequence, is gone. The two tasks that read ``x2`` sum it
themselves:

- :func:`decode_combine_o_tile`: head h's output from its partial states, as
  :func:`~pto.incore.decode.decode_attn_combine_parts` computes it, times its slice of ``wo``:
  the row ``p_h`` (f32), in blocks of ``bn`` outputs;
- :func:`gemv_headsum_norm_swiglu_tile`: the FFN's norm, gate/up and SwiGLU
  (:func:`~pto.incore.gemv.gemv_norm_swiglu_tile`) of ``x2 = x + sum_h p_h``;
- :func:`gemv_headsum_residual_tile`: the down projection with that residual, ``x = x2 + h @
  wd.T``, in place (the block a program stores is the block it read).

Numerics: ``x2`` is rounded to the storage dtype, as the unsplit projection stores it; both
readers add the heads' rows one after another in head order, so both have the same bits. The
head's output is rounded to the storage dtype before its product, as the combine stores it.
The only difference to the unsplit layer is the order of the f32 sum over the o projection's
K (per head, then over heads).
"""

from __future__ import annotations

from pto.incore.fused import RowNorm
from pto.incore.gemv import Gemv, gemv_accumulate
from pto.incore.matmul import swiglu_epilogue

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def combined_head(k: InCore, o, ml, heads: int, D: int, parts: int):
    """One query head's attention output (f32 ``[1, D]`` tile) from its ``parts`` partial
    states, rows ``i * heads`` of ``o`` and ``ml`` read at once (strided loads): ``sum_i 2^(m_i -
    M) o_i / sum_i 2^(m_i - M) l_i``; the parts past the position have m = -inf (weight 0)."""
    m, lw, oh = k.tile("m", parts, 1, f32), k.tile("lw", parts, 1, f32), k.tile("oh", parts, D, f32)
    k.load(m, ml, 0, 0, pad=float("-inf"), step=heads)  # (-inf past the memref: weight 0)
    k.load(lw, ml, 0, 1, step=heads)
    k.load(oh, o, 0, 0, step=heads)
    top, lsum, av = k.tile("top", 1, 1, f32), k.tile("lsum", 1, 1, f32), k.tile("av", 1, D, f32)
    k.colmax(top, m)
    k.colexpandsub(m, m, top)
    k.exp2(m, m)
    k.mul(lw, lw, m)
    k.colsum(lsum, lw)
    k.rowexpandmul(oh, oh, m)
    k.colsum(av, oh)
    k.rowexpanddiv(av, av, lsum)
    return av


def decode_combine_o_tile(dtype, heads: int, head_dim: int, parts: int, N: int, bn: int,
                          target=None) -> IncoreFunction:
    """``y = attn_h @ w.T`` (f32 ``[1, N]``) for one query head h: ``attn_h`` combined from its
    partial states (:func:`combined_head`) and rounded to ``dtype``; ``w`` the head's ``[N, D]``
    slice of the output-major o weight (its columns ``h * D ..``), ``bn`` outputs a program."""
    k = InCore("decode_combine_o_tile")
    D = head_dim
    o = k.memref("o", f32, shape=((parts - 1) * heads + 1, D))
    ml = k.memref("ml", f32, shape=((parts - 1) * heads + 1, 2))
    w = k.memref("w", dtype, shape=(N, D))
    y = k.memref("y", f32, shape=(1, N))
    j = k.parallel("j", cdiv(N, bn))
    wb = k.tile("wb", bn, D, dtype)
    k.load(wb, w, j * bn, 0)  # (first: no load of it waits for the partial states)
    av = combined_head(k, o, ml, heads, D, parts)
    a = k.tile("a", 1, D, dtype)
    k.cast(a, av)
    acc = k.tile("acc", 1, bn, f32)
    k.full(acc, 0.0)
    k.matmul_acc(acc, a, wb, tb=True)
    k.store(y, 0, j * bn, acc)
    return k.build(target)


def _add_heads(k: InCore, xf, p, heads: int, col, cols: int, dtype) -> None:
    """``xf = round(xf + sum_h p[h, col:])`` (to ``dtype`` and back): the heads' rows added in
    head order, each loaded into a tile of its own so that the loads are in flight at once."""
    rows = [k.tile(f"ph{h}", 1, cols, f32) for h in range(heads)]
    for h, t in enumerate(rows):
        k.load(t, p, h, col)
    for t in rows:
        k.add(xf, xf, t)
    if dtype != f32:
        r = k.tile("x2r", 1, cols, dtype)
        k.cast(r, xf)
        k.cast(xf, r)


class HeadSumNorm(RowNorm):
    """:class:`RowNorm` of one row ``x2 = x + sum_h p[h]`` (``p``: the heads' f32 rows of the
    split o projection), rounded to the storage dtype as the unsplit projection stores x2."""

    def __init__(self, k: InCore, bk: int, dtype, eps: float, K: int, heads: int):
        super().__init__(k, 1, bk, dtype, eps, K)
        self.heads = heads
        self.p = k.memref("p", f32, shape=(heads, K))

    def row(self, x, kk) -> None:
        super().row(x, kk)
        _add_heads(self.k, self.xf, self.p, self.heads, kk, self.bk, self.dtype)


def gemv_headsum_norm_swiglu_tile(dtype, K: int, N: int, heads: int, bn: int, bk: int, eps: float,
                                  target=None) -> IncoreFunction:
    """``y = silu(xn @ wg.T) * (xn @ wu.T)``, ``xn = rmsnorm(x2; g, eps)``, ``x2 = x + sum_h
    p[h]``: :func:`~pto.incore.gemv.gemv_norm_swiglu_tile` of one row whose o projection came
    split by head (:func:`decode_combine_o_tile`)."""
    k = InCore("gemv_headsum_norm_swiglu_tile")
    x = k.memref("x", dtype, shape=(1, K))
    wg = k.memref("wg", dtype, shape=(N, K))
    wu = k.memref("wu", dtype, shape=(N, K))
    y = k.memref("y", dtype, shape=(1, N))
    j = k.parallel("j", cdiv(N, bn))
    norm = HeadSumNorm(k, bk, dtype, eps, K, heads)
    g, u = gemv_accumulate(k, x, {"g": wg, "u": wu}, Gemv(1, K, bn, bk, dtype), j, norm)
    swiglu_epilogue(k, g, u, y, j * bn, 1, bn, dtype)
    return k.build(target)


def gemv_headsum_residual_tile(dtype, K: int, N: int, heads: int, bn: int, bk: int,
                               target=None) -> IncoreFunction:
    """``x = x2 + h @ w.T`` with ``x2 = x + sum_h p[h]`` (rounded to ``dtype``), in place: one row
    of K against an ``[N, K]`` weight, ``bn`` outputs a program (each stores the block of ``x``
    it read)."""
    k = InCore("gemv_headsum_residual_tile")
    h = k.memref("h", dtype, shape=(1, K))
    w = k.memref("w", dtype, shape=(N, K))
    p = k.memref("p", f32, shape=(heads, N))
    x = k.memref("x", dtype, shape=(1, N))
    j = k.parallel("j", cdiv(N, bn))
    (acc,) = gemv_accumulate(k, h, {"": w}, Gemv(1, K, bn, bk, dtype), j)
    r, rf = k.tile("r", 1, bn, dtype), k.tile("rf", 1, bn, f32)
    k.load(r, x, 0, j * bn)
    k.cast(rf, r)
    _add_heads(k, rf, p, heads, j * bn, bn, dtype)
    k.add(acc, acc, rf)
    k.cast(r, acc)
    k.store(x, 0, j * bn, r)
    return k.build(target)


__all__ = ["combined_head", "decode_combine_o_tile", "HeadSumNorm", "gemv_headsum_norm_swiglu_tile",
           "gemv_headsum_residual_tile"]
