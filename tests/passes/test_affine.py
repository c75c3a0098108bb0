"""The prover of ``e >= 0`` (pto.passes.affine): sound on random forms with floor divisions,
min and max over a ranged variable and an unranged one (a run-time scalar), checked by
evaluating them at every value of the range and at scalars from -15 to 15."""

from __future__ import annotations

import random

from pto.ir.expr import Const, Var, emax, emin, evaluate
from pto.passes.affine import Prover


def _form(rng: random.Random, depth: int = 0):
    x, n = Var("x"), Var("n")
    leaf = rng.choice((x, n, x - n, n - x, x * 2 - 3, 5 - n, x + n - 4, Const(rng.randint(-3, 3))))
    if depth >= 2:
        return leaf
    a, b = _form(rng, depth + 1), _form(rng, depth + 1)
    return rng.choice((a // rng.randint(1, 4), emax(a, 0) // rng.randint(1, 4) * rng.randint(1, 3), emax(a, b),
                       emin(a, b), a + b, a - b + rng.randint(-2, 2), a // 2 * 2 - b, emax(a, 0) // 2 + emax(b, 0)))


def test_the_prover_is_sound_on_floor_divisions_of_unknown_scalars():
    rng = random.Random(7)
    proven = 0
    for _ in range(1500):
        e = _form(rng)
        xs = range(0, rng.randint(1, 7))
        if Prover({"x": (Const(xs[0]), Const(xs[-1]))}).nonneg(e):
            proven += 1
            assert min(evaluate(e, {"x": x, "n": n}) for x in xs for n in range(-15, 16)) >= 0, e
    assert proven >= 50, proven  # the prover proves some, so the check above is not vacuous
    # what the rule is for: a count of whole merged steps of a span that may be negative
    n = Var("n")
    assert Prover({}).nonneg(emax(n - 3, 0) // 4 * 4)
    assert not Prover({}).nonneg((n - 3) // 4 * 4)
