"""Row softmax of a tile, numerically safe, over column chunks (the row never has to fit on
chip): pass 1 keeps a running row max and rescaled row sum (online softmax), pass 2 writes
``exp(x - max) / sum``."""

from __future__ import annotations

import math

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction


def softmax_tile(cols: int, dtype=f32, rows: int = 32, chunk: int | None = None, target=None) -> IncoreFunction:
    """``y = softmax(x)`` along rows for an R x ``cols`` region in chunks of ``chunk`` columns
    (all of them by default); f32 statistics."""
    chunk = min(chunk or cols, cols)
    k = InCore("softmax_tile")
    R = k.dim("R", rows)
    C = k.dim("C", cols)
    x = k.memref("x", dtype, shape=(R, C))
    y = k.memref("y", dtype, shape=(R, C))
    t = k.tile("t", R, chunk, dtype)
    tf = k.tile("tf", R, chunk, f32) if dtype != f32 else t
    m, s = k.tile("m", R, 1, f32), k.tile("s", R, 1, f32)
    mc, part = k.tile("mc", R, 1, f32), k.tile("part", R, 1, f32)
    k.full(m, -math.inf)
    k.full(s, 0.0)
    with k.for_range("c", 0, C, chunk) as c:
        # columns past a residual edge read -inf: they add nothing to the max or the sum
        k.load(t, x, 0, c, pad=-math.inf)
        if tf is not t:
            k.cast(tf, t)
        k.rowmax(mc, tf)
        k.max(mc, mc, m)
        k.sub(part, m, mc)  # rescale the sum so far to the new max
        k.exp(part, part)
        k.mul(s, s, part)
        k.rowexpandsub(tf, tf, mc)
        k.exp(tf, tf)
        k.rowsum(part, tf)
        k.add(s, s, part)
        k.mov(m, mc)
    with k.for_range("c2", 0, C, chunk) as c2:
        k.load(t, x, 0, c2, pad=-math.inf)
        if tf is not t:
            k.cast(tf, t)
        k.rowexpandsub(tf, tf, m)
        k.exp(tf, tf)
        k.rowexpanddiv(tf, tf, s)
        if tf is not t:
            k.cast(t, tf)
        k.store(y, 0, c2, t)
    return k.build(target)
