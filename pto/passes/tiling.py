"""SRAM-aware tiling (seed 004, "Dynamic Tiling" and "SRAM Constraint Analysis").

A :class:`pto.machine.target.Target` says how much on-chip memory one InCore task may use and what its
vector unit looks like. From it:

- :func:`compute_tile_shape` picks the elementwise tile of a dtype (the seed's "Tile Sizes by
  ISA" table: one vector-friendly 16 KiB tile, 1 x N on ARM64 and CUDA, 32 x N on Ascend);
- :func:`check_sram` rejects an InCore function whose live tiles exceed the target's memory,
  naming the tiles and their bytes.

Programs size their own tiles from these (the LLaMA program's flash-attention model lives with
the program).
"""

from __future__ import annotations

from pto.errors import SramError
from pto.ir.analysis import DOT_ROWS, gemv_quantized_loads, live_tiles_peak, staged_bytes, tile_bytes, tile_shape
from pto.ir.dtypes import DType
from pto.ir.nodes import IncoreFunction, walk_instrs
from pto.machine.target import KiB, Target


def compute_tile_shape(dtype: DType, target: Target) -> tuple[int, int]:
    """The elementwise tile (rows, cols) of ``dtype`` on ``target``: ``tile_bytes`` of data in
    ``tile_rows`` rows (ARM64/CUDA 1 x 4096 f32; Ascend 910B 32 x 128 f32)."""
    if dtype.is_quantized:
        raise SramError(f"{dtype} is a quantized type of weights in memory, not a tile's (f32, f16, bf16)")
    return target.tile_rows, target.tile_bytes // (target.tile_rows * dtype.itemsize)


def _fmt(n: int) -> str:
    return f"{n / KiB:.1f} KiB" if n >= KiB else f"{n} B"


def check_sram(fn: IncoreFunction, target: Target, dims: dict[str, int] | None = None) -> int:
    """Raise SramError when the tiles live at the same time in ``fn`` exceed the target's
    on-chip memory; return the peak live bytes otherwise. On a CPU a GEMV's quantized weight tile
    (at most :data:`~pto.ir.analysis.DOT_ROWS` rows) is never made (the c backend's product reads
    the weight rows as stored, :func:`pto.ir.analysis.gemv_quantized_loads`): its packed blocks
    count, not its values."""
    as_stored = frozenset()
    if target.kind == "cpu":
        every = {**dict(fn.dims), **(dims or {})}
        tiles = {t.name: t for t in fn.tiles}
        as_stored = gemv_quantized_loads(fn, lambda a: tile_shape(tiles[a], every)[0] <= DOT_ROWS)
    peak, names = live_tiles_peak(fn, dims, as_stored)
    if peak > target.sram_bytes:
        sizes = tile_bytes(fn, dims)
        sizes.update({f"{i.dst} (packed)": staged_bytes(fn, i, dims) for i in walk_instrs(fn.body)
                      if staged_bytes(fn, i, dims)})
        sizes.update({t: sizes.pop(f"{t} (packed)") for t in as_stored})
        parts = ", ".join(f"{n} {_fmt(sizes[n])}" for n in sorted(names, key=lambda n: -sizes[n]))
        raise SramError(f"`{fn.variant_name}` needs {_fmt(peak)} of live tiles ({parts}) but target "
                        f"{target.name} has {_fmt(target.sram_bytes)} of on-chip memory")
    return peak
