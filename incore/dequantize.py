"""A quantized matrix dequantized into a dense one: what the prefill's layer program takes, a
layer at a time, from the decode step's quantized weights (on the GPU the Triton backend's
helper of the format, in registers, as the GEMVs' loads; on the CPU the evaluator's)."""

from __future__ import annotations

from pto import InCore, cdiv
from pto.ir.nodes import IncoreFunction


def dequantize_rows(wdtype, dtype, rows: int, cols: int, bk: int, target=None, br: int = 16) -> IncoreFunction:
    """``y = w`` for a ``rows x cols`` matrix ``w`` of the quantized ``wdtype`` into ``dtype``:
    a program per tile of ``br`` rows and ``bk`` columns (whole blocks), the programs of a row
    block consecutive."""
    k = InCore("dequantize_rows")
    w = k.memref("w", wdtype, shape=(rows, cols))
    y = k.memref("y", dtype, shape=(rows, cols))
    steps = cdiv(cols, bk)
    j = k.parallel("j", cdiv(rows, br) * steps)
    r, c = (j // steps) * br, (j % steps) * bk
    t = k.tile("t", br, bk, dtype)
    k.load(t, w, r, c)
    k.store(y, r, c, t)
    return k.build(target)


def dequantize_tile_shape(block: int, cols: int, values: int = 8192) -> tuple[int, int]:
    """``(br, bk)`` of :func:`dequantize_rows` for a matrix of ``cols`` columns in blocks of
    ``block``: the widest power-of-two step up to 1024 that divides the columns (no program's
    tile overhangs them: on a GPU an overhanging tile takes the masked path, an element a store;
    SmolLM2's 576 in 64), else the widest of whole blocks up to 1024, and rows for about
    ``values`` values a tile (up to 32; at least 1)."""
    steps = [s for s in (1024, 512, 256, 128, 64, 32, 16) if s >= block and s % block == 0 and cols % s == 0]
    bk = steps[0] if steps else max(block, 1024 // block * block)
    return max(1, min(32, values // bk)), bk


__all__ = ["dequantize_rows", "dequantize_tile_shape"]
