"""Binary loop expansion (seed 004, "Recursive Binary Expansion" and "Dynamic Tiling").

An adaptive loop ``for i in range(lb, ub)`` with ``tile_levels`` counts base tiles of height
``tile_levels[0]``. Its ``n = ub - lb`` iterations are known only at run time; expansion splits
them into blocks (:func:`pto.ir.expr.bx_blocks`): ``n // max_range`` full blocks, one block per
set bit ``p`` of the remainder with ``min_range <= p < max_range``, and a residual below
``min_range``. A block of ``p`` base tiles runs with tile height ``h = tile_levels[k]`` for the
largest key ``k <= p`` (the base height for the residual), i.e. ``p / (h / base)`` iterations of
taller tiles. Nested adaptive loops are expanded recursively (the q and kv loops of attention).

The pass is a lowering to plain loops over a block index, so every later stage (interpreter,
C code generation, graph build) handles the result without knowing about expansion, and the
code stays linear in the number of loops::

    let i__n = max(ub - lb, 0)
    for i__b = 0 to bx_count(i__n, MAX, MIN) {
      let i__size = bx_size(i__n, i__b, MAX, MIN)
      let i__rows = select(i__size >= k_last, h_last, select(..., base))
      let i__scale = i__rows // base
      let i__start = lb + bx_start(i__n, i__b, MAX, MIN)
      for i__t = 0 to i__size // i__scale {
        let i = i__start + i__t * i__scale
        body   (with i.rows -> i__rows)
      }
    }

Merging base iterations into one taller tile is only the same program when they are
independent and each merged call covers the base calls' regions in order; :func:`expand_binary`
first proves both (:mod:`pto.passes.expansion.independence`, :mod:`pto.passes.expansion.merged_tiles`) and refuses
a loop it cannot prove, unless the loop opts in with ``reassociate`` for regions every
iteration updates alike.

:func:`strip_adaptive` is the other lowering (``--no-adaptive``): the loop keeps its base
tiles and ``i.rows`` becomes the base height.
"""

from __future__ import annotations

from dataclasses import replace

from pto.ir.expr import Const, Expr, Var, emax, fn, select, substitute
from pto.ir.names import fresh_name
from pto.ir.nodes import Call, If, Let, Loop, Module, OrchFunction, RegionBinding
from pto.passes.expansion.independence import check_adaptive_loops


def expand_binary(module: Module, check: bool = True) -> Module:
    """Lower every adaptive loop of every orchestration function by binary expansion.

    Merged iterations must be independent and each merged call must cover its base calls'
    regions in order (:func:`pto.passes.expansion.independence.check_adaptive_loops` proves it or raises
    BuildError naming the loop, the calls and the iterations, offset or extent); ``check=False``
    skips the proof, only to show what an unproven merge computes."""
    if check:
        check_adaptive_loops(module)
    return _map_orch(module, lambda f: _Expander(f, expand=True).run())


def strip_adaptive(module: Module) -> Module:
    """Lower every adaptive loop to a plain loop over base tiles (``i.rows`` = base height).
    Nothing is merged, so this is the loop's meaning and needs no independence proof."""
    return _map_orch(module, lambda f: _Expander(f, expand=False).run())


def has_adaptive(module: Module) -> bool:
    def visit(body):
        for s in body:
            if isinstance(s, Loop):
                if s.adaptive or visit(s.body):
                    return True
            elif isinstance(s, If) and (visit(s.then) or visit(s.orelse)):
                return True
        return False

    return any(visit(f.body) for f in module.orchestration_functions)


def _map_orch(module: Module, fn_) -> Module:
    funcs = tuple(fn_(f) if isinstance(f, OrchFunction) else f for f in module.functions)
    return Module(funcs, module.entry)


def height_of_block(tile_levels: tuple[tuple[int, int], ...], size: int) -> int:
    """Tile height used for a block of ``size`` base tiles."""
    levels = dict(tile_levels)
    keys = sorted(k for k in levels if 0 < k <= size)
    return levels[keys[-1]] if keys else levels[0]


class _Expander:
    def __init__(self, f: OrchFunction, expand: bool):
        self.f = f
        self.expand = expand
        self.taken: set[str] = set(f.scalars) | {t.name for t in f.tensors}
        self._collect_names(f.body)

    def _collect_names(self, body):
        for s in body:
            if isinstance(s, Let):
                self.taken.add(s.name)
            elif isinstance(s, Loop):
                self.taken.add(s.var)
                self._collect_names(s.body)
            elif isinstance(s, If):
                self._collect_names(s.then)
                self._collect_names(s.orelse)

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def run(self) -> OrchFunction:
        return replace(self.f, body=self.body(self.f.body, {}))

    def body(self, stmts, rows_map: dict[str, Expr]) -> tuple:
        out = []
        for s in stmts:
            out.extend(self.stmt(s, rows_map))
        return tuple(out)

    def stmt(self, s, rows_map) -> list:
        sub = (lambda e: substitute(e, rows_map)) if rows_map else (lambda e: e)
        if isinstance(s, Let):
            return [Let(s.name, sub(s.value))]
        if isinstance(s, If):
            return [If(sub(s.cond), self.body(s.then, rows_map), self.body(s.orelse, rows_map))]
        if isinstance(s, Call):
            return [self.call(s, sub)]
        if isinstance(s, Loop):
            if not s.adaptive:
                return [Loop(s.var, sub(s.lb), sub(s.ub), sub(s.step), self.body(s.body, rows_map))]
            if not self.expand:
                inner = {**rows_map, f"{s.var}.rows": Const(s.base_rows)}
                return [Loop(s.var, sub(s.lb), sub(s.ub), sub(s.step), self.body(s.body, inner))]
            return self.expand_loop(s, sub, rows_map)
        raise TypeError(s)

    def call(self, c: Call, sub) -> Call:
        args = []
        for k, v in c.args:
            if isinstance(v, RegionBinding):
                v = RegionBinding(v.tensor, sub(v.row), sub(v.col),
                                  None if v.rows is None else sub(v.rows),
                                  None if v.cols is None else sub(v.cols))
            else:
                v = sub(v)
            args.append((k, v))
        return Call(c.func, tuple(args), tuple((k, sub(e)) for k, e in c.dims), loc=c.loc)

    def expand_loop(self, s: Loop, sub, rows_map) -> list:
        v = s.var
        base = s.base_rows
        mx, mn = s.max_range, s.min_range
        n, b = self.fresh(f"{v}__n"), self.fresh(f"{v}__b")
        size, rows = self.fresh(f"{v}__size"), self.fresh(f"{v}__rows")
        scale, start, t = self.fresh(f"{v}__scale"), self.fresh(f"{v}__start"), self.fresh(f"{v}__t")
        lb, ub = sub(s.lb), sub(s.ub)
        # the height for a block size, largest key first: select(size >= k, h, ...)
        height: Expr = Const(base)
        for k, h in sorted(s.tile_levels):
            if k > 0:
                height = select(Var(size) >= k, h, height)
        inner_map = {**rows_map, f"{v}.rows": Var(rows)}
        body = (Let(v, Var(start) + Var(t) * Var(scale)),) + self.body(s.body, inner_map)
        block = (
            Let(size, fn("bx_size", Var(n), Var(b), mx, mn)),
            Let(rows, height),
            Let(scale, Var(rows) // base),
            Let(start, lb + fn("bx_start", Var(n), Var(b), mx, mn)),
            Loop(t, Const(0), Var(size) // Var(scale), Const(1), body),
        )
        return [
            Let(n, emax(ub - lb, 0)),
            Loop(b, Const(0), fn("bx_count", Var(n), mx, mn), Const(1), block),
        ]


def tile_levels(base: int, top: int) -> dict[int, int]:
    """The usual ``tile_levels``: blocks of p base tiles use tiles of min(p * base, top) rows,
    the residual the base height. A block takes the level of the largest key <= p, so only the
    block sizes where the height changes are listed ({0: 32, 2: 64, 4: 128} for 32 -> 128)."""
    levels = {0: base}
    p = 2
    while top > base and p * base // 2 < top:
        levels[p] = min(p * base, top)
        p *= 2
    return levels


def closed_form_iterations(n: int, max_range: int, min_range: int,
                           tile_levels: tuple[tuple[int, int], ...]) -> int:
    """Iterations an expanded loop runs for ``n`` base tiles: the sum over blocks of
    ``size / (height / base)``. With one task per iteration this is the task count."""
    from pto.ir.expr import bx_blocks

    base = dict(tile_levels)[0]
    total = 0
    for _, size in bx_blocks(n, max_range, min_range):
        h = height_of_block(tile_levels, size) if size >= min_range else base
        total += size // (h // base)
    return total


__all__ = ["expand_binary", "strip_adaptive", "has_adaptive", "closed_form_iterations",
           "height_of_block", "tile_levels"]
