"""The other half of the merge proof: one call over a taller tile covers its base tiles in order.

Independence (:mod:`pto.passes.expansion.independence`) shows that the k base iterations a merged
iteration replaces do not conflict; it does not show that the merged call, which runs once
with iteration i's offsets and the taller ``i.rows``, touches what those k calls touch. A read
at a clamped offset such as ``max(min(i * 4 - 3, S - 1), 0)`` conflicts with nothing, yet the
8-row tile at iteration i's offset is not the two 4-row tiles at iterations i and i+1. So, for
every call in the loop body and every region it binds, :func:`check_placements` proves:

- An axis (rows or columns) of a region is a *tile* of the loop when the callee's extent of
  that parameter along the axis uses a dim the call binds to an expression of ``i.rows`` (its
  tile grows with the merged height). Along a tile axis the merged region must be the base
  regions laid end to end: the extent is ``m * i.rows + c``, or the minimum of that and ends
  ``e`` with ``e(i + d) + d * s == e(i)`` (a residual tile cut off where the tensor ends, as
  ``min(i.rows, S - i * 32)``); and the offset satisfies ``off(i + d) == off(i) + d * s`` for
  ``1 <= d < k`` over the loop's range, with the stride ``s = m * base``
  (:class:`pto.passes.expansion.affine.Prover` decides it, so a clamp that never takes effect in the
  loop's range passes). The other axis must not move with ``i``, and a region cannot be a tile
  along both axes (the merged square would hold every pair of base tiles, not its diagonal).
- A region the callee does not tile by the loop but that moves with ``i`` (the kv rows of
  attention, read whole through the positions the call passes) needs a scalar argument that
  moves with ``i``: without one the callee cannot tell the merged tiles apart and would use
  iteration i's region for all of them.
- A region that does not move with ``i`` in a loop marked ``reassociate`` is the author's (an
  accumulator or scratch every iteration updates alike); without ``reassociate`` a tile of the
  loop at a fixed offset is refused like any other that does not advance with the tile.

A failed proof raises a one-line BuildError naming the loop, the call (callee and source line),
the tensor and the expression as written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from pto.ir.expr import Bin, Expr, Var, format_expr, substitute
from pto.ir.nodes import Call, RegionBinding
from pto.passes.expansion.affine import Prover, linear

AXES = ("row", "col")


@dataclass(frozen=True)
class Placement:
    """Where one call puts one region, as the merged call and the base calls see it."""

    call: Call
    param: str
    direction: str  # in | out | inout
    written: RegionBinding  # as the user wrote it, for messages
    exprs: tuple[Expr, Expr, Expr, Expr]  # row, col, rows, cols; lets inlined, `i.rows` a variable
    tiled: tuple[bool, bool]  # the callee's rows / cols of it grow with `i.rows`
    located: bool  # a scalar argument of the call, or a nested loop, moves with the loop

    @property
    def tensor(self) -> str:
        return self.written.tensor


@dataclass(frozen=True)
class LoopFacts:
    """The loop being merged: its variable, base height, whether it says ``reassociate``, the
    ranges of the variables (with ``dist`` the distance ``d`` between two of its iterations,
    ``1 <= d < k``, and the loop variable in ``[lb, ub - 1 - d]``) and how to refuse."""

    var: str
    base: int
    reassociate: bool
    ranges: dict
    dist: Expr
    refuse: Callable[[str], NoReturn]

    @property
    def height(self) -> str:
        return f"{self.var}.rows"


def check_placements(loop: LoopFacts, placements: list[Placement]) -> None:
    """Raise BuildError unless every merged call covers the base calls it replaces (see the
    module docstring)."""
    for p in placements:
        v, h = loop.var, loop.height
        moves = any(v in e.free_vars() for e in p.exprs[:2])
        if not moves and loop.reassociate:
            continue
        if all(p.tiled):
            loop.refuse(f"{_act(p)} in a tile that grows with `{h}` in rows and in columns, so "
                        "a merged call would cover the whole square of its base tiles' rows and columns, not the base "
                        "tiles on its diagonal; " + fix(v))
        if any(p.tiled):
            axis = p.tiled.index(True)
            _check_tile_axis(loop, p, axis)
            _check_still_axis(loop, p, 1 - axis)
        elif not p.located:
            _check_unmoved(loop, p)


def _check_tile_axis(loop: LoopFacts, p: Placement, axis: int) -> None:
    """Along the tile axis, the merged region is the base regions end to end, in order."""
    v, h = loop.var, loop.height
    off, ext = p.exprs[axis], p.exprs[2 + axis]
    s = _stride(loop, ext)
    if s is None:
        n = "rows" if axis == 0 else "cols"
        loop.refuse(f"{_act(p)} {_where(p, 2 + axis)}, which does not grow "
                    f"with the tile as `{h}` (times a constant, plus a part that does not move with `{v}`) or as "
                    f"`min({h}, END - {v} * {loop.base})`, so one call over a taller tile would not cover the "
                    f"base tiles' {n} in order; " + fix(v))
    if h not in off.free_vars() and _shifts_by(loop, off, s):
        return
    loop.refuse(f"{_act(p)} {_where(p, axis)}, which is not "
                f"`{v} * {s}` plus a part that does not move with `{v}`, so one call over a taller tile at "
                f"iteration {v}'s offset would not cover the base tiles' {AXES[axis]}s in order; " + fix(v))


def _stride(loop: LoopFacts, ext: Expr) -> int | None:
    """``m * base`` for an extent ``m * i.rows + c`` (``c`` not moving with the loop), possibly
    cut off by ends that stay put as the tiles advance (``e(i + d) == e(i) - d * m * base``);
    None for any other extent."""
    v, h = loop.var, loop.height
    args = _min_args(ext)
    grow = [a for a in args if h in a.free_vars()]
    if len(grow) != 1:
        return None
    terms, _ = linear(grow[0])
    m = terms.get(Var(h))
    if not isinstance(m, int) or m < 1:
        return None
    if any(v in a.free_vars() or h in a.free_vars() for a in terms if a != Var(h)):
        return None
    s = m * loop.base
    ends = [a for a in args if a is not grow[0]]
    return s if all(_shifts_by(loop, e, -s) for e in ends) else None


def _check_still_axis(loop: LoopFacts, p: Placement, axis: int) -> None:
    """The axis across the tile must not move: the merged call uses iteration i's."""
    v, h = loop.var, loop.height
    for k in (axis, 2 + axis):
        e = p.exprs[k]
        if v in e.free_vars() or h in e.free_vars():
            loop.refuse(f"{_act(p)} in tiles of `{h}` {AXES[1 - axis]}s, but {_where(p, k)} "
                        f"moves with `{v}` too, and a merged call would use iteration {v}'s for every base tile; "
                        + fix(v))


def _check_unmoved(loop: LoopFacts, p: Placement) -> None:
    """A region that is not a tile of the loop, and that neither a scalar argument nor a nested
    loop locates, must not move with the loop."""
    v, h = loop.var, loop.height
    for k, e in enumerate(p.exprs):
        if v in e.free_vars() or h in e.free_vars():
            loop.refuse(f"{_act(p)} {_where(p, k)}, which moves with `{v}`, but "
                        f"`{p.call.func}` does not tile `{p.param}` by `{h}` and neither a scalar argument of the "
                        f"call nor a loop nested in `{v}` moves with `{v}`, so a merged call would use iteration "
                        f"{v}'s region for every base tile; " + fix(v))


def _shifts_by(loop: LoopFacts, e: Expr, s: int) -> bool:
    """``e(i + d) == e(i) + d * s`` for every distance and every ``i`` in the loop's range."""
    v, d = loop.var, loop.dist
    diff = substitute(e, {v: Var(v) + d}) - e - d * s
    return Prover(dict(loop.ranges)).nonneg(diff) and Prover(dict(loop.ranges)).nonneg(0 - diff)


def _min_args(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == "min":
        return _min_args(e.a) + _min_args(e.b)
    return [e]


def _act(p: Placement) -> str:
    """``call to `f` (file.py:12) reads `x```."""
    return f"{who(p.call)} {verb(p.direction)} `{p.tensor}`"


def _where(p: Placement, k: int) -> str:
    """``at row offset `...``` or ``with rows `...``` for expression ``k`` of the placement."""
    if k < 2:
        return f"at {AXES[k]} offset {_quote(p, k, p.exprs[k])}"
    return f"with {('rows', 'cols')[k - 2]} {_quote(p, k, p.exprs[k])}"


def _quote(p: Placement, k: int, inlined: Expr) -> str:
    """The expression as written, and what it stands for when lets were inlined."""
    w = p.written
    mine = (w.row, w.col, w.rows, w.cols)[k]
    text = f"`{format_expr(inlined, bare=True)}`"
    if mine is None or format_expr(mine, bare=True) == format_expr(inlined, bare=True):
        return text
    return f"`{format_expr(mine, bare=True)}` (= {text})"


def who(c: Call) -> str:
    """A call as messages name it: callee and source line."""
    return f"call to `{c.func}`" + (f" ({c.loc})" if c.loc else "")


def verb(direction: str) -> str:
    return {"in": "reads", "out": "writes", "inout": "updates"}[direction]


def fix(v: str) -> str:
    """The way out every refusal of an adaptive loop offers."""
    return f"drop tile_levels from loop `{v}` (or lower with --no-adaptive)"


__all__ = ["Placement", "LoopFacts", "check_placements", "who", "verb", "fix"]
