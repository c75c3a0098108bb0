"""A loop's trips where its bounds are constants (pto.ir.facts.constant_trips): what the Triton
renderer's warps rule, the loops run once and the megakernel's shared-memory estimate count."""

from __future__ import annotations

import pytest

from pto.ir.expr import Bin, Const, Var
from pto.ir.facts import constant_trips
from pto.ir.nodes import ForRange


@pytest.mark.parametrize("lb,ub,step", [(0, 14336, 2048), (0, 4096, 2048), (3, 10, 4), (0, 1, 1), (5, 5, 1),
                                        (7, 2, 1), (0, 100, 7)])
def test_constant_bounds_give_pythons_range_length(lb, ub, step):
    loop = ForRange("k", Const(lb), Const(ub), Const(step), ())
    assert constant_trips(loop) == len(range(lb, ub, step))


def test_folded_constants_count_and_free_bounds_or_bad_steps_do_not():
    assert constant_trips(ForRange("k", Const(0), Bin("*", Const(2), Const(3)), Const(2), ())) == 3
    assert constant_trips(ForRange("k", Const(0), Var("K"), Const(64), ())) is None
    assert constant_trips(ForRange("k", Const(0), Const(8), Const(0), ())) is None
    assert constant_trips(ForRange("k", Const(0), Const(8), Const(-1), ())) is None
