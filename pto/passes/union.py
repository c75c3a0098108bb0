"""The region a chain's fused call binds for a region that moves with the loop
(:mod:`pto.passes.inline`): the union of its iterations' regions, with as simple an extent as
binary expansion can still reason about, and whether each iteration's loads need a mask of
their own to read what they read before."""

from __future__ import annotations

from pto.ir.expr import Attr, Bin, Const, Expr, Var, const_value, emax, emin, fold, substitute
from pto.passes.affine import Prover, linear
from pto.passes.inline import ChainLoop, Refused, mentions


def _upper(e: Expr) -> int | None:
    """A constant upper bound of ``e`` where a simple one exists."""
    v = const_value(e)
    if v is not None:
        return v
    if isinstance(e, Bin) and e.op == "min":
        known = [u for u in (_upper(e.a), _upper(e.b)) if u is not None]
        return min(known) if known else None
    if isinstance(e, Bin) and e.op == "+":
        a, b = _upper(e.a), _upper(e.b)
        return a + b if a is not None and b is not None else None
    return None


def union_axis(off: Expr, ext: Expr | None, full: Expr, ch: ChainLoop) -> tuple[Expr, Expr, str]:
    """The extent a chain's fused call binds on one axis of a region that may move with the
    loop (offset ``off``, extent ``ext``, the tensor's ``full`` extent): (offset, extent, how the
    axis moves: "still" (not at all), "tiled" (base tiles end to end, clipped once at the end:
    a load inside its iteration's ``v.rows`` needs no mask of its own) or "moves")."""
    v = ch.var
    if not mentions(off, v):
        if mentions(ext, v):
            raise Refused("a region whose extent, not its offset, moves with the loop")
        return off, ext, "still"
    if ext is None:
        raise Refused("a region that moves with the loop has no extent")
    if f"{v}.rows" in off.free_vars():
        raise Refused(f"a region offset that uses `{v}.rows`")
    terms, stride = linear(fold(substitute(off, {v: Var(v) + 1}) - off))
    if terms or stride <= 0:
        raise Refused(f"a region offset `{off}` that is not increasing by a constant step of `{v}`")
    # inside the tensor even where no iteration runs (an empty loop binds nothing as written);
    # where one runs, it starts there
    start = fold(substitute(off, {v: ch.lb}))
    lo = min_of(start, full - 1)
    if not Prover({}).nonneg(start):
        lo = emax(lo, 0)
    # the iterations tile [off(v), end) with one clip at the end (ext = min(v.rows, end - off(v))
    # with base tiles of the stride): the union ends there and its own mask is the members'
    if ch.base == stride and isinstance(ext, Bin) and ext.op == "min":
        for a, b in ((ext.a, ext.b), (ext.b, ext.a)):
            end = fold(b + off)
            if a == Attr(v, "rows") and not any(mentions(t, v) for t in linear(end)[0]):
                end = fold(substitute(end, {v: Const(0)}))
                stop = _tiled_stop(end, off, ch, stride)
                hi = min_of(stop, full) if stop is not None else min_of(end, substitute(off, {v: ch.ub}), full)
                rows = fold(hi - lo)
                return lo, fold(emax(1, rows)), "tiled"  # a loop with no whole step: one row, unread
    u = _upper(substitute(ext, {f"{v}.rows": Const(ch.tile)}) if ch.tile is not None else ext)
    hi = emin(full, fold(substitute(off, {v: ch.ub - 1}) + u)) if u is not None else full
    return lo, fold(emax(1, hi - lo)), "moves"


def _same(a: Expr, b: Expr) -> bool:
    return linear(fold(a - b)) == ({}, 0)


def _multiple(e: Expr, k: int, multiples: dict[str, int]) -> bool:
    """Whether ``e`` is a multiple of ``k`` for every value: an integer combination of loop
    variables, constants and tile heights of adaptive loops whose base height ``k`` divides."""
    terms, c = linear(e)
    if c % k:
        return False
    for atom, coef in terms.items():
        if isinstance(atom, Var) and coef % k == 0:
            continue
        if isinstance(atom, Attr) and atom.field == "rows" and (coef * multiples.get(atom.base, 1)) % k == 0:
            continue
        return False
    return True


def _min_args(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == "min":
        return _min_args(e.a) + _min_args(e.b)
    return [e]


def min_of(*xs: Expr) -> Expr:
    """``min`` of ``xs``, nested mins flattened and repeated arguments dropped."""
    args: list[Expr] = []
    for x in xs:
        for p in _min_args(fold(x)):
            if not any(_same(p, q) for q in args):
                args.append(p)
    return args[0] if len(args) == 1 else emin(*args)


def _tiled_stop(end: Expr, off: Expr, ch: ChainLoop, stride: int) -> Expr | None:
    """``min(end, off(ub))`` without its ceiling division where the loop counts the tiles of
    [0, X): ``off = v * stride``, ``ub = cdiv(X, stride)``. Then ``off(ub)`` is X rounded up, and
    every argument of a ``min`` in X is either ``end`` (rounding it up changes nothing under the
    ``min`` with ``end``) or a multiple of the stride (rounding changes nothing)."""
    ub = ch.ub
    if linear(off) != ({Var(ch.var): stride}, 0) or const_value(ch.lb) != 0:
        return None
    if not (isinstance(ub, Bin) and ub.op == "//" and const_value(ub.b) == stride):
        return None
    terms, c = linear(ub.a)
    x = next(iter(terms)) if c == stride - 1 and list(terms.values()) == [1] else fold(ub.a - (stride - 1))
    kept = []
    for p in _min_args(x):
        if _same(p, end):
            continue
        if not _multiple(p, stride, ch.multiples):
            return None
        kept.append(p)
    return min_of(end, *kept)


__all__ = ["min_of", "union_axis"]
