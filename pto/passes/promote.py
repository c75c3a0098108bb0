"""Keeping on chip what a fusion's members passed through memory (:mod:`pto.passes.fuse_build`
builds the fused body, this module rewrites it).

A region that the members write and read again (a producer's output its consumer reads, or a
chain's state each iteration reads and rewrites) must be accessed at one place with one tile
shape, outside the members' own loops; it becomes a state tile:

- a load from it becomes a copy of the state tile, masked past the region's extent with the
  load's pad value where the region may not cover the tile (what the load would have read);
- a store to it becomes a copy into the state tile;
- if the first access is a load, the state tile is loaded once before (a chain: before the loop);
- if it is written and anything outside the fusion may read it, or the fusion read it from
  memory, the state tile is stored once after.

Then the copies are folded away where that changes nothing (a member's tile that only holds the
state becomes the state tile; a stored tile is computed in it), and masks that keep the whole
tile, or give padding rows that no row of the function ever reaches, are dropped.
"""

from __future__ import annotations

from pto.ir.analysis import instr_reads
from pto.ir.expr import Const, Expr, substitute
from pto.ir.nodes import ForRange, Instr, Tile, walk_instrs
from pto.ir.ops import COL_BROADCAST, COL_REDUCE, MATMUL, Op
from pto.passes.inline import Names, Refused, Scope, Slot, covered, pad_masks


def _offsets(ins: Instr):
    return ins.srcs[1:3] if ins.op is Op.LOAD else ins.srcs[2:4]


def _tile_of(ins: Instr) -> str:
    return ins.dst if ins.op is Op.LOAD else ins.srcs[0]


class Promoter:
    """Keeps on chip the slots written and read again (the module docstring)."""

    def __init__(self, body: list, tiles: dict[str, Tile], names: Names, ranges: dict, scope: Scope):
        self.body, self.tiles, self.names, self.ranges, self.scope = body, tiles, names, ranges, scope
        self.pre: list = []
        self.post: list = []
        self.new_tiles: list[Tile] = []
        self.forwarded: list[tuple[str, str]] = []  # (a member's tile, the state tile it copies)
        self.stored: list[tuple[str, str]] = []  # (a member's tile, the state tile a store copies it to)
        self.live_out: set[str] = set()  # state tiles read after the body or carried across iterations
        self.row_pads: list[Instr] = []  # masks giving forwarded tiles the rows past the region a load pads

    def drop_row_pads(self, slots) -> None:
        """Drop the forwarded tiles' row masks where no row of a tile they touch reaches another
        row: every product takes them as its left operand (not transposed), no column reduction
        or broadcast reads them, and each store of them goes to a region of the same rows. Rows
        past the region then stay in rows that no store writes."""
        bounds = {m.srcs[1] for m in self.row_pads}
        if len(bounds) != 1:
            return
        bound = bounds.pop()
        rows = {m.dst for m in self.row_pads} | {st for _, st in self.forwarded}
        code = list(walk_instrs(self.pre + self.body + self.post))
        grew = True
        while grew:
            grew = False
            for x in code:
                if x.dst is not None and x.dst not in rows and x.op not in (Op.LOAD, Op.FULL) \
                        and instr_reads(x) & rows:
                    rows.add(x.dst)
                    grew = True
        by_name = {sl.name: sl for sl in slots}
        for x in code:
            if x.op in MATMUL and (x.srcs[1] in rows or (x.attr("ta") and x.srcs[0] in rows)):
                return
            if x.op in COL_REDUCE | COL_BROADCAST and instr_reads(x) & rows:
                return
            if x.op is Op.STORE and x.srcs[0] in rows:
                sl = by_name[x.srcs[1]]
                if sl.rows != bound or x.srcs[2] != Const(0):
                    return
        pads = {id(m) for m in self.row_pads}
        self.body[:] = [x for x in self.body if id(x) not in pads]

    def coalesce(self) -> None:
        """A member's tile that only holds the state (copied from it, updated in place, copied
        back) becomes the state tile itself: one tile on chip, not two (see :func:`_rename`)."""
        for d, st in self.forwarded:
            _rename(self.body, d, st, self.live_out)
        for src, st in self.stored:
            _rename_source(self.body, src, st)

    def promote(self, s: Slot, dead: bool, chain: bool) -> str:
        """Rewrite ``s``'s accesses; 'removed' (no memory access left) or 'on_chip'. In a chain
        (``chain``), a state that is stored after the loop is loaded before it even when the
        loop writes it first: a loop that runs no iteration stores back what was there."""
        first = s.accesses[0][0]
        rr, cc = _offsets(first)
        shape = (self.tiles[_tile_of(first)].rows, self.tiles[_tile_of(first)].cols)
        for ins, top, _, _ in s.accesses:
            t = self.tiles[_tile_of(ins)]
            if not top or tuple(_offsets(ins)) != (rr, cc) or (t.rows, t.cols) != shape:
                raise Refused(f"`{s.binding.tensor}` is accessed at different places or with different shapes")
        if s.shape is not None:
            raise Refused(f"`{s.binding.tensor}` is written and read again inside a declared shape")
        if not all(self.scope.nonneg(e, self.ranges) for e in s.accesses[0][2:4]):
            raise Refused(f"`{s.binding.tensor}` is accessed at an offset that may lie before its region")
        st = self.names.fresh(f"{s.name}_st")
        self.new_tiles.append(Tile(st, shape[0], shape[1], s.dtype))
        stores_after = any(a[0].op is Op.STORE for a in s.accesses) and not (dead and first.op is not Op.LOAD)
        loaded = first.op is Op.LOAD or (chain and stores_after)
        if loaded:
            self.pre.append(Instr(Op.LOAD, st, (s.name, rr, cc), first.attrs if first.op is Op.LOAD else (),
                                  first.loc))
        stored = False
        for ins, _, r, c in s.accesses:
            i = next(j for j, x in enumerate(self.body) if x is ins)
            if ins.op is Op.STORE:
                stored = True
                self.stored.append((ins.srcs[0], st))
                self.body[i] = Instr(Op.MOV, st, (ins.srcs[0],), (), ins.loc)
                continue
            self.forwarded.append((ins.dst, st))
            rep = [Instr(Op.MOV, ins.dst, (st,), (), ins.loc)]
            for m in pad_masks(ins.dst, s, r, c, ins.attr("pad"), ins.loc):
                ext, off = (s.rows, r) if m.op is Op.MASK_ROWS else (s.cols, c)
                size = shape[0] if m.op is Op.MASK_ROWS else shape[1]
                if not covered(ext, off, size, self.ranges, self.scope.facts()):
                    rep.append(m)
                    if m.op is Op.MASK_ROWS and r == Const(0):
                        self.row_pads.append(m)
            self.body[i:i + 1] = rep
        if stored and not (dead and not loaded):
            self.post.append(Instr(Op.STORE, None, (st, s.name, rr, cc), (), first.loc))
            self.live_out.add(st)
        if loaded:
            self.live_out.add(st)
        return "on_chip" if loaded or self.post and self.post[-1].srcs[1] == s.name else "removed"

    def hoist(self, s: Slot, it: str) -> None:
        """Load a read-only region the loop does not move once, before the loop."""
        for ins, top, _, _ in s.accesses:
            if not top or it in set().union(*(e.free_vars() for e in _offsets(ins))):
                continue
            if sum(1 for x in walk_instrs(self.body) if x.dst == ins.dst) != 1:
                continue
            self.body[:] = [x for x in self.body if x is not ins]
            self.pre.append(ins)


def _tiles_of(x: Instr) -> set[str]:
    return {t for t in (x.dst, *x.srcs) if isinstance(t, str)}


def _rename(body: list, d: str, st: str, live_out: set[str]) -> None:
    """Use state tile ``st`` for tile ``d`` from the copy ``mov d, st`` on, where that changes
    nothing: ``d`` appears at the top level only, the copy is its first use, later writes of
    ``d`` update it in place, nothing else reads or writes ``st`` until ``d``'s last use (a
    copy of ``d`` back into it aside), and
    an in-place update of ``d`` is copied back into ``st`` after it, or ``st`` is not read after
    it (``live_out``: the state tiles read after the body, or from one iteration to the next)."""
    if any(isinstance(x, ForRange) and d in used_names(x.body, (), None) for x in body):  # noqa: SIM102
        return
    uses = [i for i, x in enumerate(body) if isinstance(x, Instr) and d in _tiles_of(x)]
    first = uses[0] if uses else None
    if first is None or body[first].op is not Op.MOV or body[first].dst != d or body[first].srcs != (st,):
        return
    last_use = uses[-1]
    updated = -1
    for i in uses[1:]:
        x = body[i]
        if x.dst == d:
            if d not in instr_reads(x):
                return  # a new value: d holds something else from here
            updated = i
    for x in body[first + 1:last_use + 1]:  # st is d's alone while d lives (a copy back of d aside)
        if isinstance(x, ForRange) and st in used_names(x.body, (), None):
            return
        if isinstance(x, Instr) and st in _tiles_of(x) and not (x.op is Op.MOV and x.dst == st and x.srcs == (d,)):
            return
    copied_back = any(isinstance(x, Instr) and x.op is Op.MOV and x.dst == st and x.srcs == (d,)
                      for x in body[updated + 1:])
    # an update not copied back: only where nothing reads st after it (st is not live out)
    if updated >= 0 and not copied_back and (st in live_out or _reads_after(body, updated, st)):
        return
    _retarget(body, uses, d, st)


def prune_masks(body: list, tiles: dict[str, Tile], ranges: dict, facts: dict) -> None:
    """Drop the row and column masks that keep the whole tile (their bound provably reaches its
    extent): a no-op whatever their fill, once the fused call's facts are known (a step's tile
    height as a constant, a scalar that equals a dim)."""
    for i, x in enumerate(body):
        if isinstance(x, ForRange):
            inner = list(x.body)
            prune_masks(inner, tiles, ranges, facts)
            body[i] = ForRange(x.var, x.lb, x.ub, x.step, tuple(inner))
    keep = []
    for x in body:
        if isinstance(x, Instr) and x.op in (Op.MASK_ROWS, Op.MASK_COLS) and x.dst == x.srcs[0]:
            t = tiles[x.dst]
            size = t.rows if x.op is Op.MASK_ROWS else t.cols
            if covered(x.srcs[1], Const(0), substitute(size, facts), ranges, facts):
                continue
        keep.append(x)
    body[:] = keep


def _reads_after(body: list, i: int, t: str) -> bool:
    return any(isinstance(x, ForRange) and t in used_names(x.body, (), None)
               or isinstance(x, Instr) and t in instr_reads(x) for x in body[i + 1:])


def _rename_source(body: list, src: str, st: str) -> None:
    """Compute ``src`` in state tile ``st`` where ``mov st, src`` is its last use: ``src`` appears
    at the top level only and starts as a new value, and ``st`` is not read or written from there
    to the copy."""
    if any(isinstance(x, ForRange) and src in used_names(x.body, (), None) for x in body):
        return
    uses = [i for i, x in enumerate(body) if isinstance(x, Instr) and src in _tiles_of(x)]
    movs = [i for i in uses if body[i].op is Op.MOV and body[i].dst == st and body[i].srcs == (src,)]
    if not movs or movs[0] != uses[-1]:
        return
    first, last = uses[0], uses[-1]
    x0 = body[first]
    if x0.dst != src or src in instr_reads(x0):
        return
    for x in body[first:last]:
        if isinstance(x, ForRange) and st in used_names(x.body, (), None):
            return
        if isinstance(x, Instr) and st in _tiles_of(x):
            return
    _retarget(body, uses, src, st)


def _retarget(body: list, uses: list[int], old: str, new: str) -> None:
    """Tile ``old`` becomes ``new`` in the instructions at ``uses``; copies of a tile onto itself go."""
    for i in uses:
        x = body[i]
        body[i] = Instr(x.op, new if x.dst == old else x.dst, tuple(new if y == old else y for y in x.srcs), x.attrs,
                        x.loc)
    body[:] = [x for x in body if not (isinstance(x, Instr) and x.op is Op.MOV and x.dst == x.srcs[0])]


def used_names(fn_body, tiles, parallel) -> set[str]:
    used: set[str] = set()
    exprs: list[Expr] = []
    for t in tiles:
        exprs += [t.rows, t.cols]
    if parallel is not None:
        exprs.append(parallel.extent)

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                exprs.extend((s.lb, s.ub, s.step))
                visit(s.body)
            else:
                exprs.extend(x for x in s.srcs if isinstance(x, Expr))
                used.update(x for x in s.srcs if isinstance(x, str))
                if s.dst is not None:  # a tile only written (matmul_acc's accumulator reads it too)
                    used.add(s.dst)

    visit(fn_body)
    for e in exprs:
        used |= e.free_vars()
    return used


__all__ = ["Promoter", "prune_masks", "used_names"]
