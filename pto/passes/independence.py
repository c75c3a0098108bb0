"""What an adaptive loop means, and the proof binary expansion needs before it merges iterations.

An adaptive loop ``for i`` (one with ``tile_levels``) means the plain loop over base tiles: the
reference interpreter and ``--no-adaptive`` run it so. Binary expansion runs ``k`` consecutive
base iterations (``k`` = tile height / base height, up to the largest level / base) as one
iteration with the taller tile ``i.rows``: every call of the body runs once over the union of
the k calls' regions. That is the same program only when those iterations are independent (no
region that one iteration writes overlaps a region that another iteration of the same block
reads or writes) and when each merged call covers exactly the regions of the base calls it
replaces, in their order. :func:`check_adaptive_loops` proves both for every adaptive loop,
symbolically (the trip count is a run-time scalar), before the loop is lowered; independence:

- for every ordered pair of regions (A, B) on one tensor in the loop body (A and B from the same
  call or from two calls, at least one writing), iteration ``i``'s region of A must be disjoint
  from iteration ``i + d``'s region of B for ``1 <= d < k``, in rows or in columns. Lets are
  inlined; ``i.rows`` is the base height (the meaning being proven is the base-tile loop);
  loops nested inside take every value of their range, independently in the two iterations;
  enclosing loops are the same in both, their adaptive heights anything up to their tallest
  level (they may be merged already). :class:`pto.passes.affine.Prover` decides the offset
  inequalities.
- A conflict is refused with a BuildError naming the loop, the calls (callee and source line),
  the tensor and the two iterations, in three kinds: a region that moves with ``i`` and meets
  a neighbouring iteration's (a recurrence: never merged); a region that does not move with
  ``i`` (an accumulator or scratch every iteration updates), merged only when the loop says
  ``reassociate=True`` (the author's promise that one call over the merged tiles equals the
  sequence up to floating-point re-association, as for an online softmax over kv tiles); and an
  offset that is not affine in ``i`` (the prover cannot decide). An ``if`` whose condition
  depends on ``i`` is refused too: a merged iteration evaluates it once for the whole tile.

Then the placements (:mod:`pto.passes.merged_tiles`): a region the callee tiles by the loop
(its extent uses a dim bound to ``i.rows``) must advance by exactly the base stride,
``off(i + d) == off(i) + d * m * base`` over the loop's range for an extent ``m * i.rows + c``
(possibly cut off at an end that stays put: the residual tile), its other axis still; a
clamped, min/max, select or floor-divided offset passes only where the prover shows it equal to
such an offset. A region the callee does not tile must not move with ``i`` unless a scalar
argument or a loop nested in ``i`` moves with it. A failed proof is refused with one line naming
the loop, the call and the offset or extent as written.

So expansion gives the reference interpreter's result or a refusal before any work, as far as
the orchestration shows; what it cannot see stays the author's: that the callee computes each row of a
taller tile as it would in the base tile holding it, that a region located by scalars or by a
nested loop is found through them (attention's kv rows, positions and masks), and
``reassociate``. ``strip_adaptive`` runs the base iterations one by one and needs no proof.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from pto.errors import BuildError
from pto.ir.analysis import param_access
from pto.ir.expr import Attr, Bin, Const, Expr, Fn, Var, format_expr, substitute
from pto.ir.nodes import Call, If, IncoreFunction, Let, Loop, Module, RegionBinding
from pto.passes.affine import Prover, nonaffine_part
from pto.passes.merged_tiles import LoopFacts, Placement, check_placements, fix, verb, who

_D = "@d"  # the iteration distance; '@' keeps these names apart from the program's


@dataclass(frozen=True)
class _Inner:
    """A loop nested in the checked loop, around a call: its variable takes every value in
    ``[lb, ub)`` independently in the two iterations compared."""

    var: str
    lb: Expr
    ub: Expr
    base: int | None  # base height when adaptive (its ``.rows`` in the base-tile meaning)


@dataclass(frozen=True)
class _Region:
    """One region of one call in the body of the checked loop, lets inlined."""

    call: Call
    tensor: str
    direction: str  # in | out | inout
    row: Expr
    col: Expr
    rows: Expr
    cols: Expr
    inner: tuple[_Inner, ...]

    @property
    def writes(self) -> bool:
        return self.direction != "in"

    @property
    def exprs(self) -> tuple[Expr, ...]:
        return (self.row, self.col, self.rows, self.cols)


@dataclass(frozen=True)
class _Outer:
    var: str
    lb: Expr
    ub: Expr
    loop: Loop


def check_adaptive_loops(module: Module) -> None:
    """Raise BuildError unless binary expansion can merge the iterations of every adaptive loop
    without changing what the program computes (see the module docstring)."""
    access: dict[str, dict] = {}
    for f in module.orchestration_functions:
        _Walker(module.get, f.name, access).visit(f.body, {}, ())


def check_merged_loop(lookup: Callable[[str], object], fname: str, loop: Loop, lets: dict[str, Expr],
                      enclosing: tuple[tuple[Loop, dict[str, Expr]], ...]) -> None:
    """Raise BuildError unless ``loop``'s base iterations can be merged as binary expansion
    merges them (the module docstring), in its place in orchestration function ``fname``:
    ``lets`` the lets in scope there (each already inlined), ``enclosing`` the loops around it,
    outermost first, each with the lets in scope at it; ``lookup`` finds a callee by name. The
    fusion pass asks this before it steps a chain over merged tiles."""
    if not (loop.adaptive and loop.merge_factor > 1):
        return
    outer = tuple(_Outer(o.var, substitute(o.lb, env), substitute(o.ub, env), o) for o, env in enclosing)
    _LoopCheck(_Walker(lookup, fname, {}), loop, dict(lets), outer).run()


class _Walker:
    def __init__(self, lookup: Callable[[str], object], fname: str, access: dict):
        self.lookup = lookup
        self.fname = fname
        self.access = access

    def visit(self, body, env: dict[str, Expr], outer: tuple[_Outer, ...]) -> None:
        env = dict(env)
        for s in body:
            if isinstance(s, Let):
                env[s.name] = substitute(s.value, env)
            elif isinstance(s, If):
                self.visit(s.then, env, outer)
                self.visit(s.orelse, env, outer)
            elif isinstance(s, Loop):
                o = _Outer(s.var, substitute(s.lb, env), substitute(s.ub, env), s)
                if s.adaptive and s.merge_factor > 1:
                    _LoopCheck(self, s, env, outer).run()
                self.visit(s.body, env, outer + (o,))

    def callee_access(self, c: Call) -> tuple[IncoreFunction, dict]:
        f = self.lookup(c.func)
        if not isinstance(f, IncoreFunction):
            raise BuildError(f"`{self.fname}`: call to unknown InCore function `{c.func}`")
        if c.func not in self.access:
            self.access[c.func] = param_access(f)
        return f, self.access[c.func]


class _LoopCheck:
    def __init__(self, w: _Walker, loop: Loop, env: dict[str, Expr], outer: tuple[_Outer, ...]):
        self.w = w
        self.loop = loop
        self.env = env
        self.outer = outer
        self.k = loop.merge_factor
        self.v = loop.var
        self.regions: list[_Region] = []
        self.placements: list[Placement] = []

    # collecting ---------------------------------------------------------------------------------
    def run(self) -> None:
        self.collect(self.loop.body, self.env, ())
        for a in self.regions:
            for b in self.regions:
                if a.tensor == b.tensor and (a.writes or b.writes):
                    self.check_pair(a, b)
        ranges, dist = self.ranges(None)
        facts = LoopFacts(self.v, self.loop.base_rows, self.loop.reassociate, ranges, dist, self.refuse)
        check_placements(facts, self.placements)

    def collect(self, body, env: dict[str, Expr], inner: tuple[_Inner, ...]) -> None:
        env = dict(env)
        for s in body:
            if isinstance(s, Let):
                env[s.name] = substitute(s.value, env)
            elif isinstance(s, If):
                cond = substitute(s.cond, env)
                if self.v in self.own(cond, inner).free_vars():
                    self.refuse(f"the condition `{format_expr(s.cond, bare=True)}` depends on `{self.v}`, but a merged "
                                "iteration evaluates it once for its whole tile; move the condition out of the "
                                f"loop or drop tile_levels from loop `{self.v}`")
                self.collect(s.then, env, inner)
                self.collect(s.orelse, env, inner)
            elif isinstance(s, Loop):
                it = _Inner(s.var, substitute(s.lb, env), substitute(s.ub, env), s.base_rows)
                self.collect(s.body, env, inner + (it,))
            elif isinstance(s, Call):
                self.add_call(s, env, inner)

    def add_call(self, c: Call, env: dict[str, Expr], inner: tuple[_Inner, ...]) -> None:
        f, access = self.w.callee_access(c)
        # the callee's extents are expressions of its dims and scalar parameters
        binds: dict[str, Expr] = {k: Const(v) for k, v in f.dims}
        binds.update({k: e for k, e in c.dims})
        binds.update({k: e for k, e in c.args if not isinstance(e, RegionBinding)})
        height = f"{self.v}.rows"
        grown = {k for k, e in c.dims if height in substitute(e, env).free_vars()}
        scalars_move = any(self.v in x.free_vars() or height in x.free_vars()
                           for x in (self.own(substitute(e, env), inner, keep=True)
                                     for _, e in c.args if not isinstance(e, RegionBinding)))
        for k, v in c.args:
            if not isinstance(v, RegionBinding) or k not in access:
                continue
            acc = access[k]
            rows = substitute(acc.rows, binds) if v.rows is None else v.rows
            cols = substitute(acc.cols, binds) if v.cols is None else v.cols
            inlined = [substitute(e, env) for e in (v.row, v.col, rows, cols)]
            self.regions.append(_Region(c, v.tensor, acc.direction, *(self.own(e, inner) for e in inlined), inner))
            tiled = (bool(acc.rows.free_vars() & grown), bool(acc.cols.free_vars() & grown))
            exprs = tuple(self.own(e, inner, keep=True) for e in inlined)
            located = scalars_move or self.nested_locates(exprs[:2], inner)
            self.placements.append(Placement(c, k, acc.direction, v, exprs, tiled, located))

    def nested_locates(self, offsets: tuple[Expr, ...], inner: tuple[_Inner, ...]) -> bool:
        """An offset moves with a loop nested in this one whose range moves with this loop (the
        kv tiles of attention for the q tile): the merged iteration runs that loop over the range
        of its taller tile."""
        height = f"{self.v}.rows"
        used = set().union(*(e.free_vars() for e in offsets))
        for it in inner:
            bounds = (self.own(e, inner, keep=True) for e in (it.lb, it.ub))
            if it.var in used and any(self.v in b.free_vars() or height in b.free_vars() for b in bounds):
                return True
        return False

    def own(self, e: Expr, inner: tuple[_Inner, ...], keep: bool = False) -> Expr:
        """``e`` with this loop's and nested adaptive loops' heights at their base (the
        base-tile meaning), enclosing loops' heights as variables with a range; with ``keep``,
        this loop's height stays the variable ``i.rows`` (what a merged call changes)."""
        m: dict[str, Expr] = {} if keep else {f"{self.v}.rows": Const(self.loop.base_rows)}
        for it in inner:
            if it.base is not None:
                m[f"{it.var}.rows"] = Const(it.base)
        for o in self.outer:
            if o.loop.adaptive:
                m[f"{o.var}.rows"] = Var(f"{o.var}.rows")
        return _attrs_as_vars(substitute(e, m))

    # proving ------------------------------------------------------------------------------------
    def moves(self, r: _Region) -> bool:
        if any(self.v in e.free_vars() for e in r.exprs):
            return True
        return any(self.v in self.own(e, r.inner).free_vars() for it in r.inner for e in (it.lb, it.ub))

    def check_pair(self, a: _Region, b: _Region) -> None:
        if self.disjoint(a, b, None):
            return
        for d in range(1, self.k):
            if not self.disjoint(a, b, d):
                self.conflict(a, b, d)
                return

    def ranges(self, d: int | None) -> tuple[dict[str, tuple[Expr, Expr]], Expr]:
        """The ranges of the enclosing loops, of the distance between two iterations (all
        ``1 <= d < k`` when ``d`` is None) and of the loop variable, and the distance."""
        ranges: dict[str, tuple[Expr, Expr]] = {}
        for o in self.outer:
            ranges[o.var] = (self.own(o.lb, ()), self.own(o.ub, ()) - 1)
            if o.loop.adaptive:
                h = [h for _, h in o.loop.tile_levels]
                ranges[f"{o.var}.rows"] = (Const(min(h)), Const(max(h)))
        dist: Expr = Const(d) if d is not None else Var(_D)
        if d is None:
            ranges[_D] = (Const(1), Const(self.k - 1))
        lb, ub = (self.own(e, ()) for e in (self.loop.lb, self.loop.ub))
        ranges[self.v] = (lb, ub - 1 - dist)
        return ranges, dist

    def disjoint(self, a: _Region, b: _Region, d: int | None) -> bool:
        """Iteration i's region ``a`` and iteration i+d's region ``b`` never overlap (all
        ``1 <= d < k`` when ``d`` is None)."""
        ranges, dist = self.ranges(d)
        ea = self.side(a, Var(self.v), "@a", ranges)
        eb = self.side(b, Var(self.v) + dist, "@b", ranges)
        (ra, ca, nra, nca), (rb, cb, nrb, ncb) = ea, eb

        def before(x0, nx, y0) -> bool:  # [x0, x0 + nx) ends at or before y0
            return Prover(ranges).nonneg(y0 - x0 - nx)

        return (before(ra, nra, rb) or before(rb, nrb, ra)
                or before(ca, nca, cb) or before(cb, ncb, ca))

    def side(self, r: _Region, i: Expr, tag: str, ranges: dict) -> tuple[Expr, ...]:
        """The region in one of the two iterations: ``i`` for the loop variable, the nested loop
        variables renamed apart (and given their ranges)."""
        m: dict[str, Expr] = {self.v: i}
        for it in r.inner:
            lo = substitute(self.own(it.lb, r.inner), m)
            hi = substitute(self.own(it.ub, r.inner), m) - 1
            m[it.var] = Var(it.var + tag)
            ranges[it.var + tag] = (lo, hi)
        return tuple(substitute(e, m) for e in r.exprs)

    # refusing -----------------------------------------------------------------------------------
    def refuse(self, msg: str) -> NoReturn:
        raise BuildError(f"`{self.w.fname}`: adaptive loop `{self.v}`: {msg}")

    def conflict(self, a: _Region, b: _Region, d: int) -> None:
        v, t = self.v, a.tensor
        it0, it1 = f"iterations {v} and {v}+{d}", f"iteration {v}+{d}"
        ca, cb = who(a.call), who(b.call)
        way_out = fix(v)
        if not self.moves(a) and not self.moves(b):
            if self.loop.reassociate:
                return
            parties = f"{ca} {verb(a.direction)} it" if a.call is b.call and a.direction == b.direction else \
                f"{ca} {verb(a.direction)} it and {cb} {verb(b.direction)} it"
            self.refuse(f"{it0} touch the same region of `{t}` ({parties} in every iteration: an accumulator or "
                        "scratch that does not move with the loop), and a merged iteration runs each call once "
                        "over the taller tile; pass reassociate=True to the loop if one call over the merged "
                        "tiles equals the calls it replaces up to floating-point re-association (a reduction "
                        f"such as an online softmax), or {way_out}")
        for e in a.exprs + b.exprs:
            bad = nonaffine_part(e, v)
            if bad is not None:
                calls = ca if a.call is b.call else f"{ca} and {cb}"
                self.refuse(f"cannot prove that {it0} of {calls} touch disjoint parts of `{t}`: "
                            f"`{format_expr(bad, bare=True)}` is not affine in `{v}`; {way_out}")
        same = "the same call" if a.call is b.call else ca
        self.refuse(f"{it1} of {cb} {verb(b.direction)} `{t}` where iteration {v} of {same} {verb(a.direction)} it "
                    "(a loop-carried dependence), so merging the iterations into one taller tile would change "
                    f"the result; {way_out}")


def _attrs_as_vars(e: Expr) -> Expr:
    """Attributes (``i.rows`` of an enclosing loop) as variables named ``i.rows``, so that
    ranges and bounds treat them like any variable."""
    if isinstance(e, Attr):
        return Var(f"{e.base}.{e.field}")
    if isinstance(e, Bin):
        a, b = _attrs_as_vars(e.a), _attrs_as_vars(e.b)
        return e if a is e.a and b is e.b else Bin(e.op, a, b)
    if isinstance(e, Fn):
        return Fn(e.name, tuple(_attrs_as_vars(x) for x in e.args))
    return e


__all__ = ["check_adaptive_loops", "check_merged_loop"]
