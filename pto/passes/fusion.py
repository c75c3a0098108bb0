"""Automatic task fusion (issue 24): the written graph's chains and producer/consumer runs, each
fused into one InCore function whose intermediate state stays on chip.

:func:`fuse` rewrites a module's entry orchestration, innermost bodies first:

- **producers into consumers**: in a run of consecutive calls, a call that reads a region an
  earlier call of the run writes joins it, if every call that reads that tensor anywhere is in
  the same body (the intermediate has no reader the fusion could hide it from). The split
  attention's score, softmax update and output update become one function per (q, kv) pair;
- **chains**: a loop whose body is calls only and carries a region from iteration to
  iteration (:mod:`pto.passes.chains`: read first, then rewritten, at a place the loop does
  not move) becomes one call of a function with the loop inside. The online softmax's
  ``m``, ``l`` and ``acc`` then live in tiles for the whole kv loop. An adaptive loop that
  allows re-association (``reassociate``) steps over its widest merged tile.

Then the same rule joins the fused chain and the call after it (the normalization that reads
the chain's state), so the split and pair modes come out as one task per q tile, as the
hand-fused layer. What makes a fusion legal is in :mod:`pto.passes.fuse_build`; anything it
cannot prove is refused and reported (:class:`Refusal`), never a changed result. The new
functions are ordinary InCore functions: every backend, the estimator and the code generator
see them as written ones.

Trip counts are run-time values that may be zero or negative, and binary expansion runs after
fusion, so (issue 42):

- merged steps split from the base tiles left at ``lb + max(ub - lb, 0) // m * m``, and only
  where expansion's own proof (:func:`pto.passes.independence.check_merged_loop`: independence
  and the merged-tile placement rule) holds for the written loop; else base tiles;
- a loop that runs no iteration binds nothing as written: a moving region's union is clamped
  into its tensor (:func:`pto.passes.union.union_axis`), and where a region that does not move
  is not shown to lie in its tensor regardless, the fused call runs under ``if ub > lb``;
- no fusion inside an adaptive loop that expansion cannot merge as written (the fused call's
  scalars would make it pass the proof the written calls fail).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pto.errors import BuildError
from pto.ir.analysis import param_access
from pto.ir.expr import Attr, Expr, const_value, emax, fold, format_expr, substitute
from pto.ir.nodes import Call, If, IncoreFunction, Let, Loop, Module, OrchFunction, RegionBinding, walk_calls
from pto.ir.verify import verify_module
from pto.passes.affine import Prover
from pto.passes.chains import region_key
from pto.passes.fuse_build import build, chain_loop
from pto.passes.independence import check_merged_loop
from pto.passes.inline import Refused, mentions
from pto.passes.merged_tiles import fix


@dataclass(frozen=True)
class Fusion:
    """One fused function: ``kind`` "chain" (a loop moved inside) or "producer" (a run of
    producers and consumers), the written callees it replaces, the tensors whose regions it
    keeps on chip and those it no longer touches."""

    kind: str
    function: str
    calls: tuple[str, ...]
    loop: str | None
    on_chip: tuple[str, ...]
    removed: tuple[str, ...]
    loc: str | None = None

    def describe(self) -> str:
        what = f"loop {self.loop}: " if self.loop else ""
        keep = ", ".join(self.on_chip) or "none"
        gone = f"; no longer in memory: {', '.join(self.removed)}" if self.removed else ""
        return f"{what}{' + '.join(self.calls)} -> {self.function} (on chip: {keep}{gone})"


@dataclass(frozen=True)
class Refusal:
    """A fusion candidate left as written, and why; kind "guard": a chain fused to run only
    where its loop has a trip (the reason names the region that needs it), so that nothing after
    it joins it."""

    kind: str
    calls: tuple[str, ...]
    loop: str | None
    reason: str
    loc: str | None = None

    def describe(self) -> str:
        what = f"loop {self.loop}: " if self.loop else ""
        if self.kind == "guard":  # fused, but alone: it runs only where the loop has a trip
            return f"{what}{' + '.join(self.calls)} fused to run only under {self.reason}"
        return f"{what}{' + '.join(self.calls)} not fused: {self.reason}"


@dataclass(frozen=True)
class FusionReport:
    fused: tuple[Fusion, ...] = ()
    refused: tuple[Refusal, ...] = ()

    def to_json(self) -> dict:
        return {"fused": [dict(vars(f), calls=list(f.calls), on_chip=list(f.on_chip), removed=list(f.removed))
                          for f in self.fused],
                "refused": [dict(vars(r), calls=list(r.calls)) for r in self.refused]}

    def describe(self) -> list[str]:
        return [f.describe() for f in self.fused] + [r.describe() for r in self.refused]


def _inside(off: Expr, ext: Expr | None, full: Expr) -> bool:
    """``[off, off + ext)`` provably lies in ``[0, full)`` and is not empty, whatever the scalars."""
    if ext is None:
        return False
    p = Prover({})
    return p.nonneg(off) and p.nonneg(fold(ext - 1)) and p.nonneg(fold(full - off - ext))


def _name(base: str, taken) -> str:
    base = base[:48].rstrip("_")
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


class _Fuser:
    def __init__(self, module: Module, merge: bool, target=None):
        self.module, self.merge, self.target = module, merge, target
        self.heights: dict[str, int] = {}  # the enclosing adaptive loops' variables -> tallest tile
        self.multiples: dict[str, int] = {}  # the enclosing adaptive loops' variables -> base height
        self.reserved: set[str] = set()  # names given to fused functions, registered or not
        self.functions = {f.name: f for f in module.functions}
        entry = module.entry_function
        self.entry_name = entry.name
        self.lets: dict[str, Expr] = {}  # the lets in scope, each inlined
        self.enclosing: list[tuple[Loop, dict[str, Expr]]] = []  # the loops around, with the lets at each
        self.scopes: list[list] = []  # the statement lists being walked, outermost first
        self.expandable: dict[int, str | None] = {}  # id(written loop) -> why expansion cannot merge it, or None
        self.full = {t.name: (t.rows, t.cols) for t in entry.tensors}
        self.roles = {t.name: t.role for t in entry.tensors}
        self.origin: dict[int, frozenset[int]] = {}
        self.written: dict[int, tuple[str, ...]] = {}  # id(call) -> the written callees it stands for
        self.readers: dict[str, set[int]] = {}
        self._access: dict[str, dict] = {}
        for c in walk_calls(entry.body):
            self.origin[id(c)] = frozenset({id(c)})
            self.written[id(c)] = (c.func,)
            for t in self._reads(c):
                self.readers.setdefault(t, set()).add(id(c))
        self.fused: list[Fusion] = []
        self.refused: list[Refusal] = []

    def _dirs(self, c: Call) -> dict[str, str]:
        if c.func not in self._access:
            f = self.functions[c.func]
            self._access[c.func] = {p: a.direction for p, a in param_access(f).items()} \
                if isinstance(f, IncoreFunction) else {}
        return self._access[c.func]

    def _regions(self, c: Call, want: tuple[str, ...]) -> list[RegionBinding]:
        d = self._dirs(c)
        return [v for p, v in c.args if isinstance(v, RegionBinding) and d.get(p, "in") in want]

    def _reads(self, c: Call) -> set[str]:
        return {v.tensor for v in self._regions(c, ("in", "inout"))}

    # -- the walk -----------------------------------------------------------------------------
    def body(self, stmts) -> list:
        out: list = []
        lets = dict(self.lets)
        self.scopes.append(stmts)
        for s in stmts:
            if isinstance(s, Loop):
                outer = dict(self.multiples)
                outer_heights = dict(self.heights)
                if s.adaptive:
                    self.multiples[s.var] = s.base_rows
                    self.heights[s.var] = max(h for _, h in s.tile_levels)
                self.enclosing.append((s, dict(self.lets)))
                s = replace(s, body=tuple(self.body(s.body)))
                self.enclosing.pop()
                self.multiples, self.heights = outer, outer_heights
                out.extend(self.chain(s))
            elif isinstance(s, If):
                out.append(replace(s, then=tuple(self.body(s.then)), orelse=tuple(self.body(s.orelse))))
            else:
                if isinstance(s, Let):
                    self.lets[s.name] = substitute(s.value, self.lets)
                out.append(s)
        self.scopes.pop()
        self.lets = lets
        return self.producers(out)

    def producers(self, stmts: list) -> list:
        here = frozenset().union(*(self.origin.get(id(s), frozenset()) for s in stmts if isinstance(s, Call)))
        out: list = []
        i = 0
        while i < len(stmts):
            s = stmts[i]
            group, made, j = [s], None, i + 1
            while isinstance(s, Call) and j < len(stmts) and isinstance(stmts[j], Call) \
                    and self._linked(group, stmts[j], here):
                try:
                    made = self._build(group + [stmts[j]], None)
                except Refused as r:
                    self._refuse("producer", group + [stmts[j]], None, str(r))
                    break
                group.append(stmts[j])
                j += 1
            out.append(self._register(group, made, None) if made is not None else s)
            i = j if made is not None else i + 1
        return out

    def _linked(self, group: list[Call], c: Call, here: frozenset) -> bool:
        written = {region_key(v) for g in group for v in self._regions(g, ("out", "inout"))}
        return any(region_key(v) in written and self.readers.get(v.tensor, set()) <= here
                   for v in self._regions(c, ("in", "inout")))

    def chain(self, loop: Loop) -> list:
        """The loop as one fused call, or as written. An adaptive loop that allows re-association
        (with ``merge``) steps over its widest tile: a call over its whole steps, then one over
        the base tiles left (each function's tiles as tall as its steps, as binary expansion's
        merged and residual calls); the calls after them join them as producers."""
        calls = list(loop.body)
        if not calls or not all(isinstance(c, Call) for c in calls) or not self._carries(calls, loop.var):
            return [loop]
        m = loop.merge_factor if loop.adaptive and loop.reassociate and self.merge else 1
        made = None
        if m > 1 and self._mergeable(calls, loop):
            # whole merged steps, then the base tiles left; no trip in either where the loop has none
            mid = fold(loop.lb + (emax(loop.ub - loop.lb, 0) // m) * m)
            made = self._parts(calls, loop, [(replace(loop, ub=mid), m), (replace(loop, lb=mid), 1)])
        if made is None:  # base tiles: the written loop's arithmetic
            made = self._parts(calls, loop, [(loop, 1)])
        if made is None:
            return [loop]
        fused = [self._register(calls, f, ch) for f, ch in made]
        loose = self._unbound(calls, loop.var)
        if loose is None:
            return fused
        # a region of the loop's calls may lie outside its tensor exactly when the loop runs no
        # iteration (the written loop binds nothing then): the fused call runs only with a trip
        cond = fold(loop.ub > loop.lb)
        self._refuse("guard", calls, loop.var, f"`if {format_expr(cond, bare=True)}`, as {loose} is not shown to lie "
                     "in its tensor when the loop has no trip (the written loop binds nothing then); no call after "
                     "the loop joins it")
        return [If(cond, tuple(self.producers(fused)))]

    def _mergeable(self, calls: list[Call], loop: Loop) -> bool:
        """Whether binary expansion could merge the loop's base iterations as a merged step does:
        independent, each merged call covering its base calls' regions in order
        (:func:`pto.passes.independence.check_merged_loop`); a refusal names the rule."""
        try:
            check_merged_loop(self.functions.get, self.entry_name, loop, self.lets, tuple(self.enclosing))
        except BuildError as e:  # expansion's words, less the loop (the refusal names it) and its way out
            why = str(e).removeprefix(f"`{self.entry_name}`: adaptive loop `{loop.var}`: ")
            self._refuse("chain", calls, loop.var, "merged steps (the chain steps over base tiles): "
                         + why.removesuffix("; " + fix(loop.var)))
            return False
        return True

    def _unbound(self, calls: list[Call], var: str) -> str | None:
        """The first region of ``calls`` that does not move with loop ``var`` and is not shown to
        lie in its tensor whenever the loop's statement runs, trips or not (its description), or
        None. Shown, on each axis: provably, or because a call that runs whenever the loop does
        (a call of the statement list holding the loop or of one around it) binds the same offset
        and extent on a tensor of the same extent. (A region that moves with the loop is bound as
        the union of its iterations, inside its tensor for any trip count:
        :func:`pto.passes.union.union_axis`.)"""
        seen = [(self.full[v.tensor], v) for stmts in self.scopes for c in stmts if isinstance(c, Call)
                for _, v in c.args if isinstance(v, RegionBinding)]
        for c in calls:
            for _, v in c.args:
                if not isinstance(v, RegionBinding) or any(mentions(e, var) for e in (v.row, v.col, v.rows, v.cols)):
                    continue
                for axis, (off, ext) in enumerate(((v.row, v.rows), (v.col, v.cols))):
                    full = self.full[v.tensor][axis]
                    if not (_inside(off, ext, full) or any(
                            f[axis] == full and (w.row, w.rows, w.col, w.cols)[2 * axis:2 * axis + 2] == (off, ext)
                            for f, w in seen if ext is not None)):
                        size = "whole" if ext is None else f"`{format_expr(ext, bare=True)}`"
                        return (f"`{v.tensor}` at {('row', 'column')[axis]} offset `{format_expr(off, bare=True)}` "
                                f"with {('rows', 'columns')[axis]} {size}")
        return None

    def _parts(self, calls: list[Call], loop: Loop, parts) -> list | None:
        made = []
        for part, step in parts:
            ch = chain_loop(part, f"{loop.var}_f", self.multiples, step)
            try:
                made.append((self._build(calls, ch), ch))
            except Refused as r:
                self._refuse("chain", calls, loop.var, str(r))
                return None
        return made

    def _carries(self, calls: list[Call], var: str) -> bool:
        """Some region the loop does not move is read first, then written."""
        first: dict[tuple, str] = {}
        written = set()
        for c in calls:
            d = self._dirs(c)
            for p, v in c.args:
                if not isinstance(v, RegionBinding) or any(mentions(e, var) for e in (v.row, v.col, v.rows, v.cols)):
                    continue
                first.setdefault(region_key(v), d.get(p, "in"))
                if d.get(p, "in") != "in":
                    written.add(region_key(v))
        return any(first[k] != "out" for k in written)

    def _build(self, calls: list[Call], chain):
        members = frozenset().union(*(self.origin[id(c)] for c in calls))
        # a temporary that only the members read (the program's inputs and outputs always reach memory)
        dead = {t for t, r in self.readers.items() if r <= members and self.roles.get(t) == "temp"}
        fns = [self.functions[c.func] for c in calls]
        if not all(isinstance(f, IncoreFunction) for f in fns):
            raise Refused("a member is not an InCore function")
        self._expandable_around()
        parts = "_".join(dict.fromkeys(t for c in calls for w in self.written[id(c)] for t in w.split("_")))
        name = _name(("chain_" if chain is not None else "fused_") + parts, self.functions.keys() | self.reserved)
        self.reserved.add(name)
        made = build(name, calls, fns, chain, dead, self.full)
        if self.target is not None:
            self._fits(made)
        return made

    def _expandable_around(self) -> None:
        """Refuse a fusion inside an adaptive loop whose written iterations binary expansion cannot
        merge: the fused call passes the members' extents as scalars, and a scalar argument that
        moves with the loop is what expansion takes as the callee locating its region itself,
        so the fused program could pass the proof the written one fails."""
        for k, (loop, lets) in enumerate(self.enclosing):
            if id(loop) not in self.expandable:
                try:
                    check_merged_loop(self.functions.get, self.entry_name, loop, lets, tuple(self.enclosing[:k]))
                    self.expandable[id(loop)] = None
                except BuildError as e:
                    self.expandable[id(loop)] = str(e)
            why = self.expandable[id(loop)]
            if why is not None:
                raise Refused(f"binary expansion cannot merge the iterations of the loop around, as written ({why})")

    def _fits(self, made) -> None:
        """Refuse a fused function whose live tiles exceed the target's on-chip memory at the
        tallest tiles its call can bind (each member fits alone; together they may not)."""
        from pto.errors import SramError
        from pto.passes.tiling import check_sram

        dims = {}
        for d, b in made.call.dims:
            v = const_value(b)
            if v is None and isinstance(b, Attr) and b.field == "rows":
                v = self.heights.get(b.base)
            dims[d] = v if v is not None else dict(made.fn.dims)[d]
        try:
            check_sram(made.fn, self.target, dims)
        except SramError as e:
            raise Refused(str(e)) from None

    def _register(self, calls: list[Call], made, chain) -> Call:
        self.functions[made.fn.name] = made.fn
        self.origin[id(made.call)] = frozenset().union(*(self.origin[id(c)] for c in calls))
        written = tuple(w for c in calls for w in self.written[id(c)])
        self.written[id(made.call)] = written
        self.fused.append(Fusion("chain" if chain is not None else "producer", made.fn.name, written,
                                 chain.var if chain is not None else None, tuple(made.on_chip),
                                 tuple(made.removed), calls[0].loc))
        return made.call

    def _refuse(self, kind: str, calls: list[Call], loop: str | None, reason: str) -> None:
        written = tuple(w for c in calls for w in self.written.get(id(c), (c.func,)))
        self.refused.append(Refusal(kind, written, loop, reason, calls[0].loc))


def fuse(module: Module, merge: bool = True, target=None) -> tuple[Module, FusionReport]:
    """``module`` with its chains and producer/consumer runs fused (the module docstring), and
    the report of what was fused and what was refused. A module with nothing to fuse comes back
    unchanged. ``merge``: a chain over an adaptive loop that allows re-association steps over the
    loop's widest tile (False: over its base tiles, the same arithmetic as the written loop).
    ``target`` (a :class:`pto.target.Target`): a fused function whose tiles do not fit its on-chip
    memory is refused."""
    f = _Fuser(module, merge, target)
    entry = module.entry_function
    body = tuple(f.body(entry.body))
    report = FusionReport(tuple(f.fused), tuple(f.refused))
    if not f.fused:
        return module, report
    named = {v.tensor for c in walk_calls(body) for _, v in c.args if isinstance(v, RegionBinding)}
    tensors = tuple(t for t in entry.tensors if t.role != "temp" or t.name in named)
    new_entry = replace(entry, body=body, tensors=tensors)
    orch = [new_entry if g.name == entry.name else g for g in module.functions if isinstance(g, OrchFunction)]
    called = {c.func for g in orch for c in walk_calls(g.body)}
    incore = [g for n, g in f.functions.items() if isinstance(g, IncoreFunction) and n in called]
    fused = Module(tuple(incore) + tuple(orch), module.entry)
    try:  # each fused function was verified; the program around them is checked once more
        verify_module(fused)
    except BuildError as e:
        why = Refusal("module", tuple(x.function for x in report.fused), None, f"the fused module does not verify: {e}")
        return module, FusionReport((), report.refused + (why,))
    return fused, report


__all__ = ["Fusion", "FusionReport", "Refusal", "fuse"]
