"""A loaded tile that a loop both multiplies and reads otherwise gets a second load for the other
readers (the Triton renderer's rewrite, before it walks a body).

Triton 3.6 software-pipelines a loop's loads through shared memory. When the tile a ``tl.dot``
takes from there is also read into registers by other instructions of the loop, the kernel
computed wrong results on an H100 with 2 or more pipeline stages (docs/PERF.md, eighth session:
a projection that summed the squares of its x tile in its K loop was 0.3-0.6 from float64, with
pointer loads and with tensor descriptors alike; right with one stage, and right when the
product's operand is computed from the loaded tile rather than loaded). The CPU suite cannot see
it: the evaluator and the Triton interpreter compute it right.

So that an InCore function means on the GPU what it means everywhere else, the renderer loads
such a tile twice: the product keeps its plain load, and the instructions that read the tile
after it in the loop read a copy (``<tile>__v``) loaded from the same place right after it, so
it holds the same values. The copy is a pointer load with a cache modifier of its own
(``.cg``): Triton merges identical loads (its CSE undid a plain second load, the PTX unchanged),
and never a tensor descriptor's. Left as they are: a loop that writes the tile otherwise, reads it
before the load (the previous iteration's value) or stores to the memref it loads from.
"""

from __future__ import annotations

from dataclasses import replace

from pto.ir.nodes import ForRange, IncoreFunction, Instr, Tile, walk_instrs
from pto.ir.ops import MATMUL, STORES, Op


def separate_operand_loads(fn: IncoreFunction) -> tuple[IncoreFunction, frozenset[str]]:
    """``fn`` with a second load for the non-product readers of each tile a loop both loads,
    multiplies and reads otherwise (the module docstring), and the copies' tile names (the
    renderer gives their loads a cache modifier of their own: Triton's CSE merges identical
    loads, which undid the rewrite); ``fn`` itself and no names where there is none."""
    tiles = {t.name: t for t in fn.tiles}
    extra: list[Tile] = []
    body = _rewrite(fn.body, tiles, extra)
    if not extra:
        return fn, frozenset()
    return replace(fn, tiles=fn.tiles + tuple(extra), body=body), frozenset(t.name for t in extra)


def _rewrite(body, tiles: dict, extra: list) -> tuple:
    out = []
    for s in body:
        if isinstance(s, ForRange):
            inner = _rewrite(s.body, tiles, extra)  # inner loops first: their own loads
            s = replace(s, body=_loop(inner, tiles, extra))
        out.append(s)
    return tuple(out)


def _loop(body: tuple, tiles: dict, extra: list) -> tuple:
    every = list(walk_instrs(body))
    operands = {src for i in every if i.op in MATMUL for src in i.srcs if isinstance(src, str)}
    written = {}
    for i in every:
        written[i.dst] = written.get(i.dst, 0) + 1
    stored = {i.srcs[1] for i in every if i.op in STORES}  # the memref a store writes
    out, copies = list(body), {}  # position of a load -> the copy's load, right after it
    for pos in range(len(body)):
        ins = body[pos]
        if not (isinstance(ins, Instr) and ins.op is Op.LOAD and ins.dst in operands and written[ins.dst] == 1):
            continue
        tile, mem = ins.dst, ins.srcs[0]
        if mem in stored or any(_reads(s, tile) for s in body[:pos]):
            continue
        later = [k for k in range(pos + 1, len(body)) if _reads(body[k], tile)]
        if not later:
            continue
        copy = _fresh(f"{tile}__v", tiles)
        t = tiles[tile]
        tiles[copy] = Tile(copy, t.rows, t.cols, t.dtype)
        extra.append(tiles[copy])
        for k in later:
            out[k] = _renamed(out[k], tile, copy)
        copies[pos] = replace(ins, dst=copy)
    return tuple(x for pos, s in enumerate(out) for x in ((s, copies[pos]) if pos in copies else (s,)))


def _reads(s, tile: str) -> bool:
    """Does ``s`` (an instruction or a loop) read ``tile`` other than as a product's operand?"""
    return any(i.op not in MATMUL and _names(i, tile) for i in walk_instrs((s,)))


def _names(ins: Instr, tile: str) -> bool:
    return any(isinstance(x, str) and x == tile for x in ins.srcs)


def _renamed(s, tile: str, copy: str):
    if isinstance(s, ForRange):
        return replace(s, body=tuple(_renamed(x, tile, copy) for x in s.body))
    if s.op in MATMUL or not _names(s, tile):
        return s
    return replace(s, srcs=tuple(copy if isinstance(x, str) and x == tile else x for x in s.srcs))


def _fresh(name: str, tiles: dict) -> str:
    n, k = name, 1
    while n in tiles:
        k += 1
        n = f"{name}{k}"
    return n


__all__ = ["separate_operand_loads"]
