"""Tensor-descriptor (TMA) loads in the batched kernels (``RenderOptions.tma``; sm_90 and later).

A memref qualifies (:func:`tma_memrefs`) when the function only loads it (with pad 0), always as
tiles of one shape without padding lanes (a descriptor has one block shape; several tiles of
that shape may share it, as the halves of each head in the q/k projection with RoPE in its
epilogue), at least once inside a loop that multiplies tiles and may run more than once (the K
loops of the GEMMs, the kv loop of attention: where the copy engine runs ahead of the tensor
cores), and the block is large (both dimensions 64 or more) and suits the hardware (each
dimension 256 elements or fewer). The decode step's small tiles lost with descriptors on an H100 (Llama-3-8B
at 8 sequences 13.3 ms a step against 8.3, the [16, 128] blocks of its projections; its
attention's one-trip key loop 2% at batch 1), the prefill layer's won 9-12%.

The batched kernel then takes, per such memref, a host-built descriptor ``D_<p>`` of the whole
tensor (block shape: the tile) and a constexpr ``TMA_<p>``; a load reads
``D_<p>.load([row0 + r, col0 + c])`` in the tensor's coordinates. The backend sets ``TMA_<p>``
only on a launch whose tasks all keep the memref's accesses inside their regions, or overhang
a region only where its end is the tensor's (a clipped last row tile: the descriptor reads
zeros there, as the masked load), and whose tensor the hardware takes (16-byte aligned base
and row stride); other tasks keep the pointer loads, since a descriptor's bounds are the
tensor's, not a region's. The megakernel
passes no descriptor (``TMA_<p>`` False).

Measured on an H100 (bench/gemm_probe.py, docs/PERF.md): the layer's GEMM shapes 4-7% faster
through descriptors than through pointer loads of the same tiles.
"""

from __future__ import annotations

from pto.codegen.triton.common import _loops, block_shape
from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.expr import Bin, const_value
from pto.ir.facts import loop_ranges, tile_shape
from pto.ir.nodes import IncoreFunction, walk_instrs
from pto.ir.ops import MATMUL, STORES, Op


def tma_memrefs(fn: IncoreFunction) -> dict[str, tuple[int, int]]:
    """Memref name -> the block shape of its descriptor, for the memrefs that qualify."""
    dims = dict(fn.variant)
    shapes: dict[str, set] = {}
    stored = set()
    for ins in walk_instrs(fn.body):
        if ins.op is Op.LOAD:
            shapes.setdefault(ins.srcs[0], set()).add(ins.dst)
            # a descriptor fills zeros past the tensor, and reads whole blocks of rows
            if float(ins.attr("pad")) != 0.0 or int(ins.attr("step")) != 1:
                stored.add(ins.srcs[0])
        elif ins.op in STORES:
            stored.add(ins.srcs[1])
    fed = set()  # memrefs loaded in a loop that multiplies tiles and may run more than once
    ranges = loop_ranges(fn)
    for loop in _loops(fn.body):
        ins = list(walk_instrs(loop.body))
        if any(i.op in MATMUL for i in ins) and not _one_trip(loop, ranges):
            fed |= {i.srcs[0] for i in ins if i.op is Op.LOAD}
    out = {}
    tiles = {t.name: t for t in fn.tiles}
    for p in fn.memrefs:
        if p.name in stored or p.name not in fed or p.dtype.is_quantized:  # (quantized: rows of bytes)
            continue
        logical = {tuple(tile_shape(tiles[t], dims)) for t in shapes[p.name]}
        if len(logical) != 1:  # tiles of several shapes: a descriptor has one block shape
            continue
        (logical,) = logical
        r, c = block_shape(logical)
        if (r, c) != logical or not (64 <= r <= 256 and 64 <= c <= 256):
            continue
        out[p.name] = (r, c)
    return out


def _one_trip(loop, ranges) -> bool:
    """Does ``loop`` run at most once (its range provably no longer than its step)?"""
    try:
        span = _upper(bounds(loop.ub - loop.lb, ranges)[1])
    except BuildError:
        return False
    step = const_value(loop.step)
    return span is not None and step is not None and span <= step


def _upper(e) -> int | None:
    """A constant no smaller than ``e`` where one shows (a constant, the smallest such bound of
    a ``min``'s arguments, the larger of a ``max``'s), else None."""
    c = const_value(e)
    if c is not None or not isinstance(e, Bin) or e.op not in ("min", "max"):
        return c
    a, b = _upper(e.a), _upper(e.b)
    if e.op == "min":
        return min((v for v in (a, b) if v is not None), default=None)
    return None if a is None or b is None else max(a, b)


__all__ = ["tma_memrefs"]
