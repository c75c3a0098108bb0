"""A quantized matrix dequantized into a dense one: what the prefill's layer program takes, a
layer at a time, from the decode step's quantized weights (on the GPU the Triton backend's
helper of the format, in registers, as the GEMVs' loads; on the CPU the evaluator's)."""

from __future__ import annotations

from pto import InCore, cdiv
from pto.ir.nodes import IncoreFunction


def dequantize_rows(wdtype, dtype, rows: int, cols: int, bk: int, target=None) -> IncoreFunction:
    """``y = w`` for a ``rows x cols`` matrix ``w`` of the quantized ``wdtype`` into ``dtype``:
    blocks of ``16`` rows on the parallel axis, ``bk`` columns (whole blocks) a step."""
    k = InCore("dequantize_rows")
    w = k.memref("w", wdtype, shape=(rows, cols))
    y = k.memref("y", dtype, shape=(rows, cols))
    j = k.parallel("j", cdiv(rows, 16))
    t = k.tile("t", 16, bk, dtype)
    with k.for_range("kk", 0, cols, bk) as kk:
        k.load(t, w, j * 16, kk)
        k.store(y, j * 16, kk, t)
    return k.build(target)


__all__ = ["dequantize_rows"]
