"""GEMM tile: C tile = A row block @ B column block, with the K reduction inside the function."""

from __future__ import annotations

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction


def gemm_tile(dtype=f32, tm: int = 32, tn: int = 64, tk: int = 32, target=None) -> IncoreFunction:
    """``c = a @ b`` for an TM x K block of A and a K x TN block of B; K is a scalar parameter,
    the loop over K runs inside the function and accumulates in f32. A K that is not a multiple
    of TK is handled by the masked (zero-padded) overhang of the last K tile."""
    k = InCore("gemm_tile")
    TM, TN, TK = k.dim("TM", tm), k.dim("TN", tn), k.dim("TK", tk)
    K = k.scalar("K")
    a = k.memref("a", dtype, shape=(TM, K))
    b = k.memref("b", dtype, shape=(K, TN))
    c = k.memref("c", dtype)
    ta = k.tile("ta", TM, TK, dtype)
    tb = k.tile("tb", TK, TN, dtype)
    acc = k.tile("acc", TM, TN, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, K, TK) as kk:
        k.load(ta, a, 0, kk)
        k.load(tb, b, kk, 0)
        k.matmul_acc(acc, ta, tb)
    if dtype != f32:
        out = k.tile("out", TM, TN, dtype)
        k.cast(out, acc)
        k.store(c, 0, 0, out)
    else:
        k.store(c, 0, 0, acc)
    return k.build(target)
