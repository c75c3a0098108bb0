"""Split a task that all-reduces a tile into the part before the sum and the part after it.

A collective InCore function (``allreduce dst, src`` at its top level) cannot be one Triton
kernel: kernels do not talk to other ranks. :func:`split_collective` cuts it at the collective
into two functions that can:

- ``pre``: the instructions before it, then ``src`` (cast to the sum's dtype ``acc``) stored to
  a new memref parameter, the *sum buffer*, at the task's own place: rows ``[0, R)``, columns
  ``[p C, (p + 1) C)`` for parallel index ``p`` and an ``R x C`` tile;
- ``post``: ``dst`` loaded from the same place (cast to its dtype), then the instructions after.

Between the two, the backend sums the buffer over the ranks in place (one NCCL call for a whole
batch of tasks, each task bound to its own rows of the buffer). The result is the evaluator's:
``src`` rounded to ``acc``, summed over the ranks in ``acc``, rounded to ``dst``'s dtype.

Nothing else may cross the cut: a function whose later part reads a tile the earlier part
wrote (other than the sum), reads a scalar loaded from memory, or holds the collective inside a
loop or more than once is not split (None); it keeps running through the torch evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from pto.ir.analysis import instr_reads
from pto.ir.dtypes import dtype_of
from pto.ir.expr import Const, Expr, Var
from pto.ir.facts import tile_shape
from pto.ir.names import fresh_name
from pto.ir.nodes import ForRange, IncoreFunction, Instr, MemRefParam, Tile, walk_instrs
from pto.ir.ops import COLLECTIVE, Op


@dataclass(frozen=True)
class CollectiveSplit:
    """``fn`` as ``pre`` (writes the sum buffer ``buffer``), the sum over the ranks, ``post``
    (reads it). A task's place in the buffer is ``rows`` x (``cols`` x the parallel extent),
    of dtype ``acc``."""

    pre: IncoreFunction
    post: IncoreFunction
    buffer: str
    rows: int
    cols: int
    acc: object  # DType


def _reads_before_written(body) -> set[str]:
    """Tiles ``body`` reads before it writes them at its top level (a write inside a loop does
    not count: the loop may not run)."""
    written: set[str] = set()
    out: set[str] = set()
    for s in body:
        if isinstance(s, ForRange):
            out |= {t for x in walk_instrs(s.body) for t in instr_reads(x)} - written
            continue
        out |= instr_reads(s) - written
        if s.dst is not None:
            written.add(s.dst)
    return out


@lru_cache(maxsize=512)
def split_collective(fn: IncoreFunction) -> CollectiveSplit | None:
    """``fn`` (specialized: no dims left) cut at its one top-level collective, or None when it
    cannot be (see the module docstring)."""
    if fn.dims or sum(1 for x in walk_instrs(fn.body) if x.op in COLLECTIVE) != 1:
        return None
    if any(x.op is Op.LOAD_SCALAR for x in walk_instrs(fn.body)):
        return None
    cut = next((i for i, s in enumerate(fn.body) if isinstance(s, Instr) and s.op in COLLECTIVE), None)
    if cut is None:  # inside a loop
        return None
    ar = fn.body[cut]
    src, dst, acc = fn.tile(ar.srcs[0]), fn.tile(ar.dst), dtype_of(ar.attr("acc"))
    before, after = fn.body[:cut], fn.body[cut + 1:]
    if _reads_before_written(after) - {dst.name}:
        return None
    rows, cols = tile_shape(src, {})
    taken = {p.name for p in fn.params} | {t.name for t in fn.tiles} | ({fn.parallel.var} if fn.parallel else set())
    buffer = fresh_name("ranks_sum", taken)
    col = Var(fn.parallel.var) * cols if fn.parallel is not None else Const(0)
    params = fn.params + (MemRefParam(buffer, acc),)
    pre_tiles, post_tiles = list(fn.tiles), list(fn.tiles)
    send, recv = src.name, dst.name
    pre_tail, post_head = [], []
    if src.dtype != acc:
        send = fresh_name(f"{src.name}_{acc}", taken)
        pre_tiles.append(Tile(send, src.rows, src.cols, acc))
        pre_tail.append(Instr(Op.CAST, send, (src.name,), loc=ar.loc))
    pre_tail.append(Instr(Op.STORE, None, (send, buffer, Const(0), col), loc=ar.loc))
    if dst.dtype != acc:
        recv = fresh_name(f"{dst.name}_{acc}", taken)
        post_tiles.append(Tile(recv, dst.rows, dst.cols, acc))
        post_head.append(Instr(Op.CAST, dst.name, (recv,), loc=ar.loc))
    post_head.insert(0, Instr(Op.LOAD, recv, (buffer, Const(0), col), (("pad", 0.0),), loc=ar.loc))
    pre = _function(fn, "pre", params, pre_tiles, before + tuple(pre_tail))
    post = _function(fn, "post", params, post_tiles, tuple(post_head) + after)
    return CollectiveSplit(pre, post, buffer, rows, cols, acc)


def _loops(body):
    for s in body:
        if isinstance(s, ForRange):
            yield s
            yield from _loops(s.body)


def _function(fn: IncoreFunction, part: str, params, tiles, body) -> IncoreFunction:
    """One part of ``fn``: the parameters and tiles its body uses."""
    used = fn.parallel.extent.free_vars() if fn.parallel is not None else set()
    for s in _loops(body):
        used |= {s.var} | s.lb.free_vars() | s.ub.free_vars() | s.step.free_vars()
    for x in walk_instrs(body):
        used |= {x.dst} | {a for a in x.srcs if isinstance(a, str)}
        used |= {v for a in x.srcs if isinstance(a, Expr) for v in a.free_vars()}
    for p in params:
        if isinstance(p, MemRefParam) and p.name in used and p.shape is not None:
            used |= p.shape[0].free_vars() | p.shape[1].free_vars()
    return replace(fn, name=f"{fn.name}_{part}", params=tuple(p for p in params if p.name in used),
                   body=tuple(body), tiles=tuple(t for t in tiles if t.name in used))


__all__ = ["CollectiveSplit", "split_collective"]
