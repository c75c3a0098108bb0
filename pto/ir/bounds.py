"""Symbolic interval bounds of scalar expressions (:mod:`pto.ir.expr`): the region a memref
parameter touches, from its offsets' bounds over the loops."""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.expr import CMP_OPS, LOGIC_OPS, Attr, Bin, Const, Expr, Fn, Var, const_value, emax, emin, fold, format_expr


def bounds(e: Expr, ranges: dict[str, tuple[Expr, Expr]]) -> tuple[Expr, Expr]:
    """Symbolic lower and upper bound of ``e`` when each variable in ``ranges`` lies within its
    inclusive (lo, hi) bounds; other variables are taken as exact.

    Exact for expressions monotone in each variable (affine offsets with constant
    coefficients, floor division and modulo by positive constants, min and max), which is what
    tile offsets are; used to derive the region a memref parameter touches.
    """
    if isinstance(e, (Const, Attr)):
        return e, e
    if isinstance(e, Var):
        return ranges.get(e.name, (e, e))
    if isinstance(e, Fn):
        if e.name == "select":
            (_, _), (alo, ahi), (blo, bhi) = (bounds(a, ranges) for a in e.args)
            return fold(Bin("min", alo, blo)), fold(Bin("max", ahi, bhi))
        if all(bounds(a, ranges)[0] == bounds(a, ranges)[1] for a in e.args):
            return e, e
        raise BuildError(f"cannot bound `{format_expr(e)}`")
    if not isinstance(e, Bin):
        raise TypeError(e)
    (alo, ahi), (blo, bhi) = bounds(e.a, ranges), bounds(e.b, ranges)
    op = e.op
    if op == "+":
        return fold(Bin("+", alo, blo)), fold(Bin("+", ahi, bhi))
    if op == "-":
        return fold(Bin("-", alo, bhi)), fold(Bin("-", ahi, blo))
    if op == "*":
        cb = const_value(blo) if blo == bhi else None
        ca = const_value(alo) if alo == ahi else None
        if cb is not None:
            return (fold(Bin("*", alo, blo)), fold(Bin("*", ahi, bhi))) if cb >= 0 else \
                (fold(Bin("*", ahi, blo)), fold(Bin("*", alo, bhi)))
        if ca is not None:
            return (fold(Bin("*", alo, blo)), fold(Bin("*", ahi, bhi))) if ca >= 0 else \
                (fold(Bin("*", alo, bhi)), fold(Bin("*", alo, blo)))
        prods = [fold(Bin("*", x, y)) for x in (alo, ahi) for y in (blo, bhi)]
        return emin(*prods), emax(*prods)
    if op == "//":
        cb = const_value(blo) if blo == bhi else None
        if cb is not None and cb > 0:
            return fold(Bin("//", alo, blo)), fold(Bin("//", ahi, bhi))
        if cb is not None and cb < 0:  # (decreasing in the dividend)
            return fold(Bin("//", ahi, blo)), fold(Bin("//", alo, blo))
        if blo == bhi:  # a symbolic divisor of either sign: the quotients of both ends
            lo, hi = fold(Bin("//", alo, blo)), fold(Bin("//", ahi, blo))
            return (lo, hi) if lo == hi else (emin(lo, hi), emax(lo, hi))
    if op == "%":
        cb = const_value(blo) if blo == bhi else None
        if cb is not None and cb > 0:
            if alo == ahi:
                return fold(Bin("%", alo, blo)), fold(Bin("%", ahi, blo))
            return Const(0), Const(cb - 1)
    if op in ("min", "max"):
        return fold(Bin(op, alo, blo)), fold(Bin(op, ahi, bhi))
    if op in CMP_OPS or op in LOGIC_OPS:
        if alo == ahi and blo == bhi:
            v = fold(Bin(op, alo, blo))
            return v, v
        return Const(0), Const(1)
    raise BuildError(f"cannot bound `{format_expr(e)}`")


__all__ = ["bounds"]
