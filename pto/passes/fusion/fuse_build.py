"""One fused InCore function from member calls (:mod:`pto.passes.fusion.fuse` decides which).

:func:`build` copies the members into one function (:mod:`pto.passes.fusion.inline`), keeps on chip
what they passed through memory (:mod:`pto.passes.fusion.promote`), wraps a chain's body in its loop,
and verifies the result like a written function; anything it cannot prove is refused
(:class:`pto.passes.fusion.inline.Refused`). In a chain, a read-only region the loop does not move is
loaded once before the loop.
"""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.analysis import param_access
from pto.ir.expr import Attr, Const, as_expr, fold, substitute
from pto.ir.nodes import Call, ForRange, IncoreFunction, Parallel, ScalarParam, Tile, walk_instrs
from pto.ir.ops import Op
from pto.ir.verify_incore import verify_incore
from pto.passes.fusion.chains import region_key
from pto.passes.fusion.inline import ChainLoop, Fusing, Member, Names, Refused, Scope, Slot, memref_params, mentions
from pto.passes.fusion.promote import Promoter, prune_masks, used_names
from pto.passes.fusion.union import slot_for


class Fused:
    """What :func:`build` made: the function, the call that replaces the members, and the
    tensors whose regions stay on chip (``on_chip``) or are no longer touched (``removed``)."""

    def __init__(self, fn: IncoreFunction, call: Call, on_chip: list[str], removed: list[str]):
        self.fn, self.call, self.on_chip, self.removed = fn, call, on_chip, removed


def _dims(calls, fns, chain: ChainLoop | None, names: Names):
    """Each member's dims in the fused function's names, the fused dims and their bindings."""
    seen: dict[tuple, str] = {}
    per: list[dict[str, str]] = []
    fdims, bind = [], {}
    for c, f in zip(calls, fns):
        cd = dict(c.dims)
        mine = {}
        for d, default in f.dims:
            b = as_expr(cd.get(d, Const(default)))
            grows = chain is not None and b == Attr(chain.var, "rows")
            if chain is not None:
                if chain.tile is not None:
                    b = fold(substitute(b, {f"{chain.var}.rows": Const(chain.tile)}))
                if mentions(b, chain.var):
                    raise Refused(f"dim `{d}` of `{f.name}` moves with loop `{chain.var}`")
            if (d, b, grows) not in seen:
                seen[(d, b, grows)] = n = names.fresh(d)
                fdims.append((n, default))
                bind[n] = b
                if grows:
                    chain.grown.add(n)
            mine[d] = seen[(d, b, grows)]
        per.append(mine)
    return per, fdims, bind


def _slots(calls, fns, scope: Scope, names: Names, full):
    """The fused function's memref parameters, and each member's (callee name -> slot)."""
    slots: dict[tuple, Slot] = {}
    written: dict[tuple, bool] = {}
    per = []
    for c, f in zip(calls, fns):
        args, acc, mine = dict(c.args), param_access(f), {}
        for p in f.memrefs:
            b = args[p.name]
            k = region_key(b)
            if k not in slots:
                slots[k] = slot_for(b, p.dtype, scope, names, full[b.tensor])
            if slots[k].dtype != p.dtype:
                raise Refused(f"`{b.tensor}` is {slots[k].dtype} in one member and {p.dtype} in another")
            written[k] = written.get(k, False) or (p.name in acc and acc[p.name].direction != "in")
            mine[p.name] = slots[k]
        per.append(mine)
    by_tensor: dict[str, list[tuple]] = {}
    for k in slots:
        by_tensor.setdefault(k[0], []).append(k)
    for t, ks in by_tensor.items():
        if len(ks) > 1 and any(written[k] for k in ks):
            raise Refused(f"the members write `{t}` and touch another region of it")
    return slots, per


def _shapes(members, fns, per_slots, scope: Scope) -> None:
    """The region each slot may touch: a chain's union (its extent, however many iterations
    run: none is still one row), or the shape the members declare, where every member that binds
    the slot declares the same one (any other mix is refused: one member's shape would clip
    another's accesses)."""
    declared: dict[int, set] = {}
    for m, f, mine in zip(members, fns, per_slots):
        for p in f.memrefs:
            s = mine[p.name]
            declared.setdefault(id(s), set()).add(None if p.shape is None else (m.ex(p.shape[0]), m.ex(p.shape[1])))
    for s in {id(x): x for mine in per_slots for x in mine.values()}.values():
        shapes = declared[id(s)]
        if s.variant:
            if shapes != {None}:
                raise Refused(f"a member declares the shape of `{s.binding.tensor}`, which moves with the loop")
            if s.binding.rows is None or s.binding.cols is None:
                raise Refused(f"a region of `{s.binding.tensor}` that moves with the loop has no extent")
            s.shape = (scope.tr(s.binding.rows), scope.tr(s.binding.cols))
        elif len(shapes) > 1:
            raise Refused(f"the members declare different shapes of `{s.binding.tensor}`")
        else:
            s.shape = next(iter(shapes))


def _members(calls, fns, ctx: Fusing, per_slots, per_dims) -> tuple[list[Member], Parallel | None]:
    members = [Member(i, c, f, ctx, per_slots[i], per_dims[i]) for i, (c, f) in enumerate(zip(calls, fns))]
    if ctx.pvar is None:
        return members, None
    exts = {m.ex(f.parallel.extent) for m, f in zip(members, fns)}
    if len(exts) > 1:
        raise Refused(f"the members' parallel axes differ ({', '.join(sorted(map(str, exts)))})")
    parallel = Parallel(ctx.pvar, exts.pop())
    ctx.ranges[ctx.pvar] = (Const(0), fold(parallel.extent - 1))
    return members, parallel


def _keep_on_chip(pro: Promoter, slots, chain: ChainLoop | None, dead: set[str]) -> tuple[list, list]:
    """Promote what the members write and read again; hoist a chain's loop-invariant loads."""
    on_chip, removed = [], []
    for s in slots:
        stores = [a for a in s.accesses if a[0].op is Op.STORE]
        if not stores:
            if chain is not None and not s.variant:
                pro.hoist(s, chain.it)
            continue
        if s.variant:
            raise Refused(f"the loop writes `{s.binding.tensor}` at a region that moves with it")
        if len(s.accesses) == 1 and chain is None:
            continue
        kept = pro.promote(s, s.binding.tensor in dead, chain is not None)
        (on_chip if kept == "on_chip" else removed).append(s.binding.tensor)
    pro.drop_row_pads(slots)
    pro.coalesce()
    return on_chip, removed


def _function(name: str, calls, fbody: tuple, tiles: list[Tile], slots, scope: Scope, parallel, dims):
    """The fused function (what it uses of the tiles, slots and scalars) and its call; ``dims``:
    the fused dims with their defaults, and their bindings."""
    fdims, bind = dims
    used = used_names(fbody, (), None)
    tiles = [t for t in tiles if t.name in used]
    used |= used_names((), tiles, parallel)
    kept = [s for s in slots if s.name in used]
    for s in kept:  # a declared shape's scalars are parameters too
        used |= set().union(*(e.free_vars() for e in s.shape)) if s.shape is not None else set()
    scalars = [n for n in scope.scalars if n in used]
    fn = IncoreFunction(name, tuple(memref_params(kept)) + tuple(ScalarParam(n) for n in scalars), tuple(fdims),
                        tuple(tiles), fbody, parallel, (), calls[0].loc)
    try:
        verify_incore(fn)
    except BuildError as e:
        raise Refused(f"the fused function does not verify: {e}") from None
    args = tuple((s.name, s.binding) for s in kept) + tuple((n, scope.scalars[n]) for n in scalars)
    return fn, Call(name, args, tuple(bind.items()), calls[0].loc)


def build(name: str, calls: list[Call], fns: list[IncoreFunction], chain: ChainLoop | None,
          dead: set[str], full: dict) -> Fused:
    """The fused function of ``calls`` (callees ``fns``; a chain: the loop inside), its call,
    and what stays on chip. ``dead``: tensors nothing outside the members reads; ``full``:
    each tensor's (rows, cols). Raises :class:`Refused` with the reason it cannot."""
    names = Names()
    for f in fns:  # its items' adds land in any order: no member of a loop or of a producer's chain
        adds = sorted({i.srcs[1] for i in walk_instrs(f.body) if i.op is Op.STORE_ADD})
        if adds:
            raise Refused(f"`{f.name}` adds into `{adds[0]}` (store_add): its programs' adds are not ordered")
    if len({f.parallel is None for f in fns}) > 1:
        raise Refused("some members have a parallel axis and some do not")
    pvar = names.fresh(fns[0].parallel.var) if fns[0].parallel is not None else None
    if chain is not None:
        names.used.add(chain.it)
    per_dims, fdims, bind = _dims(calls, fns, chain, names)
    scope = Scope(names, bind, chain)
    slots, per_slots = _slots(calls, fns, scope, names, full)
    ctx = Fusing(names, scope, {}, pvar)
    members, parallel = _members(calls, fns, ctx, per_slots, per_dims)
    _shapes(members, fns, per_slots, scope)
    body: list = []
    tiles: list[Tile] = []
    for m, d in zip(members, per_dims):
        body.extend(m.body())
        tiles.extend(m.tile_decls(d))
    pro = Promoter(body, {t.name: t for t in tiles}, names, ctx.ranges, scope)
    on_chip, removed = _keep_on_chip(pro, list(slots.values()), chain, dead)
    prune_masks(body, {t.name: t for t in tiles + pro.new_tiles}, ctx.ranges, scope.facts())
    if chain is not None:
        body = [ForRange(chain.it, scope.tr(chain.lb), scope.tr(chain.ub), scope.tr(chain.step), tuple(body))]
    fn, call = _function(name, calls, tuple(pro.pre + body + pro.post), tiles + pro.new_tiles, list(slots.values()),
                         scope, parallel, (fdims, bind))
    return Fused(fn, call, on_chip, removed)


def chain_loop(loop, it: str, multiples: dict[str, int], m: int = 1) -> ChainLoop:
    """The :class:`ChainLoop` of orchestration loop ``loop`` (``multiples``: the enclosing
    adaptive loops' bases), stepping ``m`` base tiles at a time (an adaptive loop that allows
    re-association; the caller gives it a whole number of steps)."""
    if not loop.adaptive:
        return ChainLoop(loop.var, it, loop.lb, loop.ub, loop.step, multiples=multiples)
    base = loop.base_rows
    return ChainLoop(loop.var, it, loop.lb, loop.ub, Const(m), Const(m * base), m * base, base,
                     {**multiples, loop.var: base})


__all__ = ["Fused", "build", "chain_loop"]
