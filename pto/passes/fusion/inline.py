"""Calls inlined into one InCore function: the pieces :mod:`pto.passes.fusion.fuse` builds a fused
function from.

A fusion's members are calls of one orchestration body (a run of producers and consumers, or
the calls of a loop's body). Each member's callee is copied into the fused function's names:

- its tiles and loop variables get a prefix per member (``c0_S``, ``c1_S``), its parallel axis
  the fused function's one;
- its dims become the fused function's dims, shared where two members bind a dim of the same
  name to the same expression;
- its scalar parameters are replaced by the expressions the call passed, translated from the
  orchestration's names into the fused function's (:class:`Scope`): the orchestration scalars,
  lets and outer loop variables they use become scalar parameters of the fused function;
- its memref parameters become the fused function's :class:`Slot` s, one per region of the
  orchestration (two members that bind the same region share a slot).

In a chain (a loop fused with the loop inside, :class:`ChainLoop`), a region that moves with
the loop variable becomes the union of its iterations' regions (:func:`pto.passes.fusion.union.slot_for`,
which builds on this module), each iteration's loads shifted to its part and masked to its
extent, so that every load reads what it read before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pto.ir.expr import Attr, Bin, Const, Expr, Fn, Var, fold, substitute
from pto.ir.names import fresh_name
from pto.ir.nodes import Call, ForRange, IncoreFunction, Instr, MemRefParam, RegionBinding, Tile
from pto.ir.ops import COLLECTIVE, SCALAR_LOAD, Op
from pto.passes.expansion.affine import Prover


class Refused(Exception):
    """A fusion that cannot be proved to compute what the members compute (the reason)."""


class Names:
    """Fresh names of one fused function."""

    def __init__(self):
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.used, "_")


@dataclass
class ChainLoop:
    """The orchestration loop a chain fusion moves inside the fused function."""

    var: str  # the orchestration loop variable
    it: str  # the fused function's loop variable (the same values)
    lb: Expr  # orchestration bounds
    ub: Expr
    step: Expr  # the fused loop's step, in the orchestration variable's units
    rows: Expr | None = None  # ``var.rows`` (adaptive loops), an orchestration expression of ``var``
    tile: int | None = None  # ``var.rows`` where a dim binds it (the merged tile's height)
    base: int | None = None  # the adaptive loop's base tile height
    multiples: dict = field(default_factory=dict)  # enclosing adaptive loops' variables -> base height
    grown: set = field(default_factory=set)  # the fused dims bound to ``var.rows`` (the step's tile height)


def mentions(e: Expr | None, var: str) -> bool:
    return e is not None and bool({var, f"{var}.rows"} & e.free_vars())


class Scope:
    """Orchestration expressions in the fused function's names: the chain's variable becomes the
    fused loop's, anything else free becomes a scalar parameter bound at the fused call
    (``scalars``: name -> orchestration expression). Never a dim: a dim in a region's extent
    would make the region a tile of an enclosing adaptive loop. ``dims`` (the fused dims'
    bindings) only serve proofs (:meth:`facts`)."""

    def __init__(self, names: Names, dims: dict[str, Expr], chain: ChainLoop | None):
        self.names, self.dims, self.chain = names, dims, chain
        self.dim_of: dict[Expr, str] = {}
        self.scalars: dict[str, Expr] = {}
        self._named: dict[Expr, str] = {}

    def nonneg(self, e: Expr, ranges: dict) -> bool:
        """Whether ``e >= 0`` for every value of the variables in ``ranges`` and every positive
        value of the dims (tile extents), after :meth:`facts`."""
        dims = {d: (Const(1), Const(1 << 30)) for d in self.dims}
        return Prover({**dims, **ranges}).nonneg(fold(substitute(e, self.facts())))

    def facts(self) -> dict[str, Expr]:
        """What the fused call makes equal: a scalar bound to what a dim is bound to is that dim,
        a dim bound to a constant is the constant."""
        out: dict[str, Expr] = {d: b for d, b in self.dims.items() if isinstance(b, Const)}
        for n, e in self.scalars.items():
            for d, b in self.dims.items():
                if b == e:
                    out[n] = b if isinstance(b, Const) else Var(d)
        return out

    def _scalar(self, e: Expr, base: str) -> Var:
        name = self._named.get(e)
        if name is None:
            name = self._named[e] = self.names.fresh(base)
            self.scalars[name] = e
        return Var(name)

    def tr(self, e: Expr) -> Expr:
        if e in self.dim_of:
            return Var(self.dim_of[e])
        ch = self.chain
        if isinstance(e, Var):
            return Var(ch.it) if ch is not None and e.name == ch.var else self._scalar(e, e.name)
        if isinstance(e, Attr):
            if ch is not None and e.base == ch.var:
                if ch.rows is None:
                    raise Refused(f"`{e.base}.rows` of a loop that is not adaptive")
                return self.tr(ch.rows)
            return self._scalar(e, f"{e.base}_{e.field}")
        if isinstance(e, Bin):
            return fold(Bin(e.op, self.tr(e.a), self.tr(e.b)))
        if isinstance(e, Fn):
            return fold(Fn(e.name, tuple(self.tr(a) for a in e.args)))
        return e


@dataclass
class Slot:
    """One memref parameter of the fused function: the region the fused call binds, and per
    iteration (fused-function expressions) the shift of the members' region inside it and the
    members' extent (None: whole-tensor bindings, extent from the accesses)."""

    name: str
    dtype: object
    binding: RegionBinding
    variant: bool = False
    drow: Expr = Const(0)
    dcol: Expr = Const(0)
    rows: Expr | None = None
    cols: Expr | None = None
    axes: tuple[str, str] = ("still", "still")  # how each axis moves with a chain's loop (union.union_axis)
    shape: tuple[Expr, Expr] | None = None  # the region the fused function may touch (MemRefParam.shape)
    accesses: list = field(default_factory=list)  # (instr, top level) of the fused body


def covered(extent: Expr, off: Expr, size: Expr, ranges: dict, facts: dict | None = None) -> bool:
    """Whether ``off + size <= extent`` holds provably (then a load needs no mask); ``facts``:
    names the fused call makes equal to other expressions (:meth:`Scope.facts`)."""
    return Prover(ranges).nonneg(fold(substitute(extent - off - size, facts or {})))


@dataclass
class Fusing:
    """What every member of one fusion shares: the fused function's names, the scope of its
    orchestration expressions, its variables' ranges (filled before the bodies are copied) and
    its parallel axis."""

    names: Names
    scope: Scope
    ranges: dict
    pvar: str | None


class Member:
    """One member call, its callee copied into the fused function's names."""

    def __init__(self, idx: int, call: Call, fn: IncoreFunction, ctx: Fusing, slots: dict[str, Slot],
                 dims: dict[str, str]):
        scope, names, pvar = ctx.scope, ctx.names, ctx.pvar
        self.call, self.fn, self.scope, self.slots = call, fn, scope, slots
        self.ranges = ctx.ranges
        args = dict(call.args)
        self.tiles = {t.name: names.fresh(f"c{idx}_{t.name}") for t in fn.tiles}
        env: dict[str, Expr] = {d: Var(n) for d, n in dims.items()}
        for p in fn.scalars:
            env[p.name] = scope.tr(args[p.name])
        if fn.parallel is not None and pvar is not None:
            env[fn.parallel.var] = Var(pvar)
        used = _callee_names(fn)
        for m, s in slots.items():
            for f, ext in (("rows", s.rows), ("cols", s.cols)):
                if ext is None and f"{m}.{f}" in used:
                    raise Refused(f"`{fn.name}` reads `{m}.{f}` of a region bound without its extent")
                env[f"{m}.{f}"] = ext if ext is not None else Attr(s.name, f)
        self.env = env
        self._loops(fn.body, idx, names)
        for d, n in dims.items():
            self.env.setdefault(d, Var(n))

    def _loops(self, body, idx: int, names: Names) -> None:
        for s in body:
            if isinstance(s, ForRange):
                self.env[s.var] = Var(names.fresh(f"c{idx}_{s.var}"))
                self._loops(s.body, idx, names)

    def ex(self, e: Expr) -> Expr:
        return fold(substitute(e, self.env))

    def tile_decls(self, dims: dict[str, str]) -> list[Tile]:
        ren = {d: Var(n) for d, n in dims.items()}
        return [Tile(self.tiles[t.name], fold(substitute(t.rows, ren)), fold(substitute(t.cols, ren)), t.dtype)
                for t in self.fn.tiles]

    def body(self, stmts=None, top: bool = True) -> list:
        out: list = []
        for s in self.fn.body if stmts is None else stmts:
            if isinstance(s, ForRange):
                out.append(ForRange(self.env[s.var].name, self.ex(s.lb), self.ex(s.ub), self.ex(s.step),
                                    tuple(self.body(s.body, top=False))))
            elif s.op in SCALAR_LOAD or s.op in COLLECTIVE:
                raise Refused(f"`{self.fn.name}` uses {s.op} (not fused)")
            elif s.op in (Op.LOAD, Op.STORE):
                out.extend(self._access(s, top))
            else:
                srcs = tuple(self.tiles[x] if isinstance(x, str) else self.ex(x) for x in s.srcs)
                out.append(Instr(s.op, self.tiles[s.dst], srcs, s.attrs, s.loc))
        return out

    def _access(self, s: Instr, top: bool) -> list:
        if s.op is Op.LOAD and int(s.attr("step")) != 1:
            raise Refused(f"`{self.fn.name}` loads a strided tile of `{s.srcs[0]}` (a row in every "
                          f"{s.attr('step')}; not fused)")
        if s.op is Op.LOAD:
            mem, row, col = s.srcs
            tile = s.dst
        else:
            tile, mem, row, col = s.srcs
        slot = self.slots[mem]
        r, c = self.ex(row), self.ex(col)
        rr, cc = fold(r + slot.drow), fold(c + slot.dcol)
        if s.op is Op.STORE:
            ins = Instr(Op.STORE, None, (self.tiles[tile], slot.name, rr, cc), s.attrs, s.loc)
            slot.accesses.append((ins, top, r, c))
            return [ins]
        ins = Instr(Op.LOAD, self.tiles[tile], (slot.name, rr, cc), s.attrs, s.loc)
        slot.accesses.append((ins, top, r, c))
        out = [ins]
        if slot.variant:
            out.extend(self._iteration_masks(slot, tile, r, c, ins.attr("pad"), s.loc))
        return out

    def _iteration_masks(self, slot: Slot, tile: str, r: Expr, c: Expr, pad: float, loc) -> list[Instr]:
        """What keeps a load from a chain's union region to what it read of its own iteration's
        region: a mask past that region's extent on each axis that moves, unless the tile
        provably stays inside it (or, on a tiled axis, inside the iteration's whole tile, the
        union clipping the last one as the iteration's region did)."""
        t, facts, out = self.fn.tile(tile), self.scope.facts(), []
        along = ((Op.MASK_ROWS, r, self.ex(t.rows)), (Op.MASK_COLS, c, self.ex(t.cols)))
        for axis, (op, off, size) in enumerate(along):
            how = slot.axes[axis]
            if how == "still":
                continue
            ch = self.scope.chain
            if ch.tile is not None and ch.base is not None and ch.tile > ch.base \
                    and not (isinstance(size, Var) and size.name in ch.grown):
                raise Refused(f"a tile of `{slot.binding.tensor}` that does not grow with the loop's merged step")
            if not self.scope.nonneg(off, self.ranges):
                raise Refused(f"a load of `{slot.binding.tensor}` may start before its iteration's region")
            ext = slot.rows if axis == 0 else slot.cols
            cap = Const(self.scope.chain.tile) if how == "tiled" and self.scope.chain.tile is not None else ext
            if covered(cap, off, size, self.ranges, facts) or covered(ext, off, size, self.ranges, facts):
                continue
            out.append(Instr(op, self.tiles[tile], (self.tiles[tile], fold(ext - off)), (("fill", float(pad)),), loc))
        return out


def _callee_names(fn: IncoreFunction) -> set[str]:
    """Every name the expressions of ``fn`` use (``m.rows`` attributes included)."""
    out: set[str] = set()

    def visit(body):
        for x in body:
            if isinstance(x, ForRange):
                for e in (x.lb, x.ub, x.step):
                    out.update(e.free_vars())
                visit(x.body)
            else:
                for e in x.srcs:
                    if isinstance(e, Expr):
                        out.update(e.free_vars())

    visit(fn.body)
    return out


def pad_masks(tile: str, slot: Slot, r: Expr, c: Expr, pad: float, loc) -> list[Instr]:
    """What a load's region does to a tile outside it: ``pad`` in the rows and columns past the
    members' extent (the ones a mask to the union, or a forwarded tile, would not clear)."""
    out = []
    for op, ext, off in ((Op.MASK_ROWS, slot.rows, r), (Op.MASK_COLS, slot.cols, c)):
        if ext is not None:
            out.append(Instr(op, tile, (tile, fold(ext - off)), (("fill", float(pad)),), loc))
    return out


def memref_params(slots: list[Slot]) -> list[MemRefParam]:
    return [MemRefParam(s.name, s.dtype, s.shape) for s in slots]


__all__ = ["ChainLoop", "Fusing", "Member", "Names", "Refused", "Scope", "Slot", "covered", "memref_params",
           "mentions", "pad_masks"]
