"""Elementwise tiles of two same-shaped row tiles: the residual add and SwiGLU's ``silu(a) * b``.

Computed in f32 and stored in the storage dtype; column blocks are the parallel axis, rows
are visited in blocks.
"""

from __future__ import annotations

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def _elementwise(name: str, dtype, rows: int, cols: int, block: int, body, row_block: int = 32,
                 target=None):
    """An R x cols elementwise function: column blocks on the parallel axis, rows in blocks."""
    k = InCore(name)
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    a, b, y = k.memref("a", dtype), k.memref("b", dtype), k.memref("y", dtype)
    j = k.parallel("j", cdiv(cols, block))
    ta, tb = k.tile("ta", RB, block, dtype), k.tile("tb", RB, block, dtype)
    fa = k.tile("fa", RB, block, f32) if dtype != f32 else ta
    fb = k.tile("fb", RB, block, f32) if dtype != f32 else tb
    with k.for_range("rb", 0, R, RB) as rb:
        k.load(ta, a, rb, j * block)
        k.load(tb, b, rb, j * block)
        if dtype != f32:
            k.cast(fa, ta)
            k.cast(fb, tb)
        out = body(k, fa, fb, RB, block)
        if dtype != f32:
            k.cast(ta, out)
            out = ta
        k.store(y, rb, j * block, out)
    return k.build(target)


def residual_add(dtype, rows: int, cols: int, block: int, target=None) -> IncoreFunction:
    """``y = a + b`` (the residual connection)."""

    def body(k, fa, fb, R, block):
        s = k.tile("s", R, block, f32)
        k.add(s, fa, fb)
        return s

    return _elementwise("residual_add", dtype, rows, cols, block, body, target=target)


def swiglu_tile(dtype, rows: int, cols: int, block: int, target=None) -> IncoreFunction:
    """``y = silu(gate) * up``."""

    def body(k, fa, fb, R, block):
        s = k.tile("s", R, block, f32)
        k.silu(s, fa)
        k.mul(s, s, fb)
        return s

    return _elementwise("swiglu_tile", dtype, rows, cols, block, body, target=target)
