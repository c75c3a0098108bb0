"""What an InCore function's body says directly: the value range of each loop variable, every
load and store with the region rows it spans, and a tile's shape under given dims.

The verifiers check a function with these (:mod:`pto.ir.verify_incore`, :mod:`pto.ir.verify_instr`)
and the derived facts build on them (:mod:`pto.ir.analysis`: directions, extents,
specialization, liveness), so both import this module and neither imports the other's.
"""

from __future__ import annotations

from dataclasses import replace

from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.expr import Const, Expr, const_value, evaluate, fold
from pto.ir.nodes import ForRange, IncoreFunction, Tile
from pto.ir.ops import STORES, Op


def loop_ranges(fn: IncoreFunction, parallel: tuple[Expr, Expr] | None = None) -> dict[str, tuple[Expr, Expr]]:
    """Inclusive value range of every loop variable and of the parallel axis (``parallel``: the
    parallel index's range in its place, e.g. one work item's indices; by default its extent)."""
    ranges: dict[str, tuple[Expr, Expr]] = {}
    if fn.parallel is not None:
        ranges[fn.parallel.var] = parallel or (Const(0), fold(fn.parallel.extent - 1))

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                lo, _ = bounds(s.lb, ranges)
                # last value taken: lb + ((ub - lb - 1) // step) * step
                last = s.lb + ((s.ub - s.lb - 1) // s.step) * s.step
                _, hi = bounds(last, ranges)
                ranges[s.var] = (lo, hi)
                visit(s.body)

    visit(fn.body)
    return ranges


def constant_trips(loop: ForRange) -> int | None:
    """The trips of ``loop`` where its bounds are constants (None where a dim or a scalar sets
    one, or its step is not positive)."""
    lb, ub, step = (const_value(e) for e in (loop.lb, loop.ub, loop.step))
    if None in (lb, ub, step) or step <= 0:
        return None
    return max(0, -(-(ub - lb) // step))


def spanned(tile: Tile, step: int) -> Tile:
    """The rows of its region a tile loaded with row ``step`` spans: ``(rows - 1) * step + 1``
    (the tile itself for step 1)."""
    if step == 1:
        return tile
    return replace(tile, rows=fold(tile.rows * Const(step) - Const(step - 1)))


def memref_accesses(fn: IncoreFunction):
    """Yield (memref name, instr, row expr, col expr, tile) for every load and store (a
    ``store_add`` too, which reads its region as well as writing it: :func:`reads_memref`); a
    load_scalar reads a 1 x 1 tile of its memref's dtype; a strided load the rows it spans
    (:func:`spanned`)."""

    tiles = {t.name: t for t in fn.tiles}
    dtypes = {p.name: p.dtype for p in fn.memrefs}

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                yield from visit(s.body)
            elif s.op is Op.LOAD:
                mem, row, col = s.srcs
                yield mem, s, row, col, spanned(tiles[s.dst], int(s.attr("step")))
            elif s.op in STORES:
                tile, mem, row, col = s.srcs
                yield mem, s, row, col, tiles[tile]
            elif s.op is Op.LOAD_SCALAR:
                mem, row, col = s.srcs
                yield mem, s, row, col, Tile(s.dst, Const(1), Const(1), dtypes[mem])

    yield from visit(fn.body)


def reads_memref(ins) -> bool:
    """Does this access of :func:`memref_accesses` read its memref (a load, or a ``store_add``,
    which adds to what is there)?"""
    return ins.op is not Op.STORE


def writes_memref(ins) -> bool:
    """Does this access of :func:`memref_accesses` write its memref (a store or ``store_add``)?"""
    return ins.op in STORES


def tile_shape(tile: Tile, dims: dict[str, int]) -> tuple[int, int]:
    """Concrete (rows, cols) of a tile under the given dim values."""
    try:
        r, c = evaluate(tile.rows, dims), evaluate(tile.cols, dims)
    except BuildError as e:
        raise BuildError(f"tile `{tile.name}`: its shape needs {e}") from None
    return int(r), int(c)


__all__ = ["constant_trips", "loop_ranges", "memref_accesses", "reads_memref", "spanned", "tile_shape",
           "writes_memref"]
