"""Linear forms of integer scalar expressions and a small prover of ``e >= 0``.

The independence check of binary expansion (:mod:`pto.passes.independence`) has to show that
two tile regions cannot overlap for any value of the run-time scalars, i.e. that differences
such as ``(i + d) * 32 - (i * 32 + min(i.rows, S - i * 32))`` are never negative. Offsets are
affine in the loop variables in practice, with ``min``/``max`` clipping the residual tile, so:

- :func:`linear` writes an expression as ``sum(coeff * atom) + const`` with integer
  coefficients; an atom is a variable or a subexpression that is not affine (``min``, ``//``);
- :class:`Prover` decides ``e >= 0`` by case splits on ``min``/``max``/``select`` atoms (a
  ``max`` with a positive coefficient is at least either argument, so one case suffices; a
  ``min`` needs both) and then replaces each variable with a range by the end of its range
  that minimizes the form, innermost variable first (so that ``i - j`` with ``j <= i`` is
  still seen to be non-negative). Other atoms with ranged variables take the bounds of
  :func:`pto.ir.expr.bounds`; a floor division by a positive constant of a value shown
  non-negative is at least 0 (a count of whole merged steps).

The prover is sound and incomplete: True means proven for every value in the ranges, False
means not proven (unknown symbols left over, a step budget exhausted, an atom it cannot bound).
"""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.expr import Bin, Const, Expr, Fn, Var

Form = tuple[dict[Expr, int], int]  # atom -> coefficient, constant


def linear(e: Expr) -> Form:
    """``e`` as integer coefficients of atoms plus a constant."""
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {}, e.value
    if isinstance(e, Bin) and e.op in ("+", "-"):
        (ta, ca), (tb, cb) = linear(e.a), linear(e.b)
        return _add(ta, ca, tb, cb, 1 if e.op == "+" else -1)
    if isinstance(e, Bin) and e.op == "*":
        (ta, ca), (tb, cb) = linear(e.a), linear(e.b)
        if not ta:
            return _scale(tb, cb, ca)
        if not tb:
            return _scale(ta, ca, cb)
    return {e: 1}, 0


def _add(ta: dict, ca: int, tb: dict, cb: int, sign: int) -> Form:
    out = dict(ta)
    for k, v in tb.items():
        w = out.get(k, 0) + sign * v
        if w:
            out[k] = w
        else:
            out.pop(k, None)
    return out, ca + sign * cb


def _scale(t: dict, c: int, k: int) -> Form:
    if k == 0:
        return {}, 0
    return {a: v * k for a, v in t.items()}, c * k


def _replace(form: Form, atom: Expr, by: Expr) -> Form:
    """The form with ``coeff * atom`` replaced by ``coeff * by``."""
    terms, c = form
    k = terms[atom]
    rest = {a: v for a, v in terms.items() if a != atom}
    tb, cb = linear(by)
    return _add(rest, c, *_scale(tb, cb, k), 1)


def _is_split(atom: Expr) -> bool:
    return (isinstance(atom, Bin) and atom.op in ("min", "max")) or (
        isinstance(atom, Fn) and atom.name == "select")


class Prover:
    """Decides ``e >= 0`` for all values of the variables in ``ranges`` (name -> inclusive
    (lo, hi), listed outer to inner: a range may use the variables listed before it); other
    variables are unknown and must cancel."""

    def __init__(self, ranges: dict[str, tuple[Expr, Expr]], budget: int = 5000):
        self.ranges = ranges
        self.order = list(ranges)
        self.budget = budget

    def nonneg(self, e: Expr) -> bool:
        return self._nonneg(linear(e))

    def _nonneg(self, form: Form) -> bool:
        self.budget -= 1
        if self.budget < 0:
            return False
        terms, c = form
        if not terms:
            return c >= 0
        for atom, k in terms.items():
            if _is_split(atom):
                if isinstance(atom, Fn):  # select: either value
                    alts, both = atom.args[1:], True
                else:
                    alts, both = (atom.a, atom.b), (atom.op == "min") == (k > 0)
                cases = (self._nonneg(_replace(form, atom, alt)) for alt in alts)
                return all(cases) if both else any(cases)
        ranged = set(self.ranges)
        for atom, k in terms.items():
            if not isinstance(atom, Var) and atom.free_vars() & ranged:
                try:
                    lo, hi = bounds(atom, self.ranges)
                except BuildError:
                    return False
                pick = lo if k > 0 else hi
                if pick == atom:
                    return False
                return self._nonneg(_replace(form, atom, pick))
        for name in reversed(self.order):
            v = Var(name)
            if v in terms:
                lo, hi = self.ranges[name]
                return self._nonneg(_replace(form, v, lo if terms[v] > 0 else hi))
        for atom, k in terms.items():  # a floor division of a non-negative value is at least 0
            if k > 0 and isinstance(atom, Bin) and atom.op == "//" and isinstance(atom.b, Const) \
                    and isinstance(atom.b.value, int) and atom.b.value > 0 and self._nonneg(linear(atom.a)):
                return self._nonneg(_replace(form, atom, Const(0)))
        return False


def nonaffine_part(e: Expr, var: str) -> Expr | None:
    """The first subexpression of ``e`` through which ``e`` depends on ``var`` other than
    affinely with a constant coefficient (``min``/``max``/``select`` of affine parts count as
    affine: the prover splits them), or None."""
    if var not in e.free_vars():
        return None
    if isinstance(e, Var):
        return None
    if isinstance(e, Bin) and e.op in ("+", "-", "min", "max"):
        return _first(nonaffine_part(x, var) for x in (e.a, e.b))
    if isinstance(e, Bin) and e.op == "*":
        if isinstance(e.a, Const) and isinstance(e.a.value, int):
            return nonaffine_part(e.b, var)
        if isinstance(e.b, Const) and isinstance(e.b.value, int):
            return nonaffine_part(e.a, var)
        return e
    if isinstance(e, Fn) and e.name == "select":
        return _first(nonaffine_part(x, var) for x in e.args[1:])
    return e


def _first(xs) -> Expr | None:
    for x in xs:
        if x is not None:
            return x
    return None


__all__ = ["Prover", "linear", "nonaffine_part"]
