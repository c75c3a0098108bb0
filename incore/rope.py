"""Rotary position embedding (RoPE) of row tiles of q or k, every head at once.

Heads are column blocks of ``head_dim`` of a ``(seq, heads*head_dim)`` tensor; the cos/sin
tables are ``(seq, head_dim/2)`` and rows of a tile take the rows of their positions.
"""

from __future__ import annotations

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction


def rotate_half(k: InCore, out, tmp, halves, tables) -> None:
    """``out = (x1 c - x2 s, x2 c + x1 s)`` for the f32 tiles ``halves`` (x1, x2) and ``tables``
    (c, s), through the scratch tile ``tmp``: the rotate-half arithmetic every RoPE here shares."""
    (o1, o2), (a1, a2), (c, s) = out, halves, tables
    k.mul(o1, a1, c)
    k.mul(tmp, a2, s)
    k.sub(o1, o1, tmp)
    k.mul(o2, a2, c)
    k.mul(tmp, a1, s)
    k.add(o2, o2, tmp)


def rope_tile(dtype, rows: int, heads: int, head_dim: int, row_block: int = 32, target=None,
              name: str = "rope_tile") -> IncoreFunction:
    """Rotary embedding of an R x (heads*D) tile, rotate-half convention: with x1, x2 the two
    halves of a head and c, s the cos/sin of each row's position (R x D/2 tables),
    ``y1 = x1 c - x2 s`` and ``y2 = x2 c + x1 s``. Parallel over heads; rows in blocks. ``name``:
    a second function for another head count (grouped-query attention's k)."""
    k = InCore(name)
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    half = head_dim // 2
    x, cos, sin, y = (k.memref(n, dtype) for n in ("x", "cos", "sin", "y"))
    h = k.parallel("h", heads)
    x1, x2 = k.tile("x1", RB, half, dtype), k.tile("x2", RB, half, dtype)
    ct, st = k.tile("ct", RB, half, dtype), k.tile("st", RB, half, dtype)
    o1, o2, tmp = k.tile("o1", RB, half, f32), k.tile("o2", RB, half, f32), k.tile("tmp", RB, half, f32)
    f32_tiles = {}
    with k.for_range("rb", 0, R, RB) as rb:
        k.load(x1, x, rb, h * head_dim)
        k.load(x2, x, rb, h * head_dim + half)
        k.load(ct, cos, rb, 0)
        k.load(st, sin, rb, 0)
        for name, t in (("a1", x1), ("a2", x2), ("c", ct), ("s", st)):
            if name not in f32_tiles:
                f32_tiles[name] = k.tile(name, RB, half, f32) if dtype != f32 else None
            if f32_tiles[name] is not None:
                k.cast(f32_tiles[name], t)
        a1, a2, c, s = (f32_tiles[n] or t for n, t in (("a1", x1), ("a2", x2), ("c", ct), ("s", st)))
        rotate_half(k, (o1, o2), tmp, (a1, a2), (c, s))
        if dtype != f32:
            k.cast(x1, o1)
            k.cast(x2, o2)
            k.store(y, rb, h * head_dim, x1)
            k.store(y, rb, h * head_dim + half, x2)
        else:
            k.store(y, rb, h * head_dim, o1)
            k.store(y, rb, h * head_dim + half, o2)
    return k.build(target)
