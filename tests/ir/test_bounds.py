"""``pto.ir.bounds.bounds``: the interval of an offset expression over its variables' ranges,
which the runtime's regions and the megakernel's data dependencies rest on. Checked against
brute force (every value of every variable) on seeded random expressions of the forms tile
offsets take: sums, differences, products and floor divisions by constants of either sign,
modulo by positive constants, min and max."""

from __future__ import annotations

import itertools
import random

import pytest

from pto.ir.bounds import bounds
from pto.ir.expr import Bin, Const, Var, evaluate


def _random_expr(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.25:
        return Var(rng.choice("ijk")) if rng.random() < 0.7 else Const(rng.randint(-9, 9))
    op = rng.choice(["+", "-", "*c", "//c", "%c", "min", "max"])
    a = _random_expr(rng, depth - 1)
    if op == "*c":
        return Bin("*", a, Const(rng.choice([-3, -2, -1, 2, 3, 4])))
    if op == "//c":
        return Bin("//", a, Const(rng.choice([-4, -3, -2, -1, 1, 2, 3, 5])))
    if op == "%c":
        return Bin("%", a, Const(rng.choice([2, 3, 4, 7])))
    return Bin(op, a, _random_expr(rng, depth - 1))


@pytest.mark.parametrize("seed", range(8))
def test_bounds_contain_every_value(seed):
    """Every value the expression takes lies within its bounds."""
    rng = random.Random(seed)
    for _ in range(60):
        e = _random_expr(rng, 3)
        ranges = {v: tuple(sorted((rng.randint(-6, 6), rng.randint(-6, 6)))) for v in "ijk"}
        lo, hi = bounds(e, {v: (Const(a), Const(b)) for v, (a, b) in ranges.items()})
        lo, hi = evaluate(lo, {}), evaluate(hi, {})
        values = [evaluate(e, dict(zip("ijk", point)))
                  for point in itertools.product(*(range(a, b + 1) for a, b in ranges.values()))]
        assert lo <= min(values) and max(values) <= hi, (e, ranges, lo, hi, min(values), max(values))


def test_floor_division_by_a_negative_constant():
    """``(j - 7) // -1`` for j in [0, 1] is 7 down to 6: the bounds are (6, 7), not an empty
    interval (the interval of a division by a negative constant is the dividend's reversed)."""
    e = Bin("//", Bin("-", Var("j"), Const(7)), Const(-1))
    lo, hi = bounds(e, {"j": (Const(0), Const(1))})
    assert (evaluate(lo, {}), evaluate(hi, {})) == (6, 7)


def test_floor_division_by_a_scalar_of_either_sign():
    """``(j - 7) // s`` for j in [0, 1]: a scalar divisor may be negative at run time; the
    bounds evaluated at either sign contain the values (s = -1: 6 and 7; s = 2: -4 and -3)."""
    e = Bin("//", Bin("-", Var("j"), Const(7)), Var("s"))
    lo, hi = bounds(e, {"j": (Const(0), Const(1))})
    for s in (-1, 2):
        values = [evaluate(e, {"j": j, "s": s}) for j in (0, 1)]
        assert evaluate(lo, {"s": s}) <= min(values) and max(values) <= evaluate(hi, {"s": s})
