"""Row softmax of a tile: numerically safe (subtract the row max before exp)."""

from __future__ import annotations

import math

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction


def softmax_tile(cols: int, dtype=f32, rows: int = 32) -> IncoreFunction:
    """``y = softmax(x)`` along rows for an R x ``cols`` region; f32 statistics."""
    k = InCore("softmax_tile")
    R = k.dim("R", rows)
    C = k.dim("C", cols)
    x = k.memref("x", dtype)
    y = k.memref("y", dtype)
    t = k.tile("t", R, C, dtype)
    tf = k.tile("tf", R, C, f32) if dtype != f32 else t
    m = k.tile("m", R, 1, f32)
    s = k.tile("s", R, 1, f32)
    # columns beyond a residual edge read -inf: they add nothing to the max or the sum
    k.load(t, x, 0, 0, pad=-math.inf)
    if tf is not t:
        k.cast(tf, t)
    k.rowmax(m, tf)
    k.rowexpandsub(tf, tf, m)
    k.exp(tf, tf)
    k.rowsum(s, tf)
    k.rowexpanddiv(tf, tf, s)
    if tf is not t:
        k.cast(t, tf)
    k.store(y, 0, 0, t)
    return k.build()
