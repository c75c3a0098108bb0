"""Tensor-descriptor (TMA) loads in the batched kernels (``RenderOptions.tma``; sm_90 and later).

A memref qualifies (:func:`tma_memrefs`) when the function only loads it, always as one tile
shape without padding lanes (a descriptor has one block shape), at least once inside a loop
that multiplies tiles (the K loops of the GEMMs, the kv loop of attention: what the copy engine
feeds the tensor cores), and the block suits the hardware (each dimension 256 elements or
fewer, rows of at least 16 bytes).

The batched kernel then takes, per such memref, a host-built descriptor ``D_<p>`` of the whole
tensor (block shape: the tile) and a constexpr ``TMA_<p>``; a load reads
``D_<p>.load([row0 + r, col0 + c])`` in the tensor's coordinates. The backend sets ``TMA_<p>``
only on a launch whose tasks all keep the memref's accesses inside their regions (``EVEN_<p>``)
and whose tensor the hardware takes (16-byte aligned base and row stride): a masked task keeps
the pointer loads, since a descriptor's bounds are the tensor's, not a region's. The megakernel
passes no descriptor (``TMA_<p>`` False).

Measured on an H100 (bench/gemm_probe.py, docs/PERF.md): the layer's GEMM shapes 4-7% faster
through descriptors than through pointer loads of the same tiles.
"""

from __future__ import annotations

from pto.codegen.triton.common import _instrs, _loops, block_shape
from pto.ir.analysis import tile_shape
from pto.ir.nodes import IncoreFunction
from pto.ir.ops import MATMUL, Op


def tma_memrefs(fn: IncoreFunction) -> dict[str, tuple[int, int]]:
    """Memref name -> the block shape of its descriptor, for the memrefs that qualify."""
    dims = dict(fn.variant)
    shapes: dict[str, set] = {}
    stored = set()
    for ins in _instrs(fn.body):
        if ins.op is Op.LOAD:
            shapes.setdefault(ins.srcs[0], set()).add(ins.dst)
        elif ins.op is Op.STORE:
            stored.add(ins.srcs[1])
    fed = set()  # memrefs loaded in a loop that multiplies tiles
    for loop in _loops(fn.body):
        ins = list(_instrs(loop.body))
        if any(i.op in MATMUL for i in ins):
            fed |= {i.srcs[0] for i in ins if i.op is Op.LOAD}
    out = {}
    tiles = {t.name: t for t in fn.tiles}
    for p in fn.memrefs:
        if p.name in stored or p.name not in fed or len(shapes.get(p.name, ())) != 1:
            continue
        (tile,) = shapes[p.name]
        logical = tile_shape(tiles[tile], dims)
        r, c = block_shape(logical)
        if (r, c) != tuple(logical) or r > 256 or c > 256 or c * p.dtype.itemsize < 16:
            continue
        out[p.name] = (r, c)
    return out


__all__ = ["tma_memrefs"]
