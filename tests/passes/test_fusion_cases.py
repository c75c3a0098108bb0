"""Fusion on small programs written to break it (a review's counterexamples, each once a wrong
result): the fused program computes what the written one computes, or the pass refuses it."""

from __future__ import annotations

import pytest
import torch

from pto import InCore, Orchestration, cdiv, emin, f32
from pto.errors import BuildError
from pto.interp.orchestration import run_program
from pto.ir.expr import evaluate
from pto.passes.binary_expansion import expand_binary
from pto.passes.fusion import fuse


def _same(m, scalars: dict, merge: bool = False):
    """Fuse ``m`` and run both on small integers: the tensors agree (NaN where neither run
    wrote); returns the report."""
    fm, rep = fuse(m, merge=merge)
    g = torch.Generator().manual_seed(0)
    x = {t.name: torch.randint(-4, 5, (int(evaluate(t.rows, scalars)), int(evaluate(t.cols, scalars))),
                               generator=g).float()
         for t in m.entry_function.tensors if t.role in ("input", "inout")}
    want = run_program(m, {k: v.clone() for k, v in x.items()}, scalars).tensors
    got = run_program(fm, {k: v.clone() for k, v in x.items()}, scalars).tensors
    roles = {t.name: t.role for t in m.entry_function.tensors}
    for t in want:
        if roles[t] == "temp" and t not in got:
            continue  # a temporary the fused program no longer needs
        assert t in got and torch.equal(want[t].isnan(), got[t].isnan()), t
        assert torch.equal(want[t].nan_to_num(), got[t].nan_to_num()), (t, rep.describe())
    return rep


def _tile_fn(name, mems, body):
    k = InCore(name)
    refs = {n: k.memref(n, f32, shape=shape) for n, shape in mems}
    body(k, refs)
    return k.build()


def _produce(shape=None, plus=1.0, rows_attr=False):
    def body(k, r):
        p = k.tile("p", 4, 4, f32)
        k.load(p, r["x"], 0, 0)
        k.adds(p, p, r["x"].rows if rows_attr else plus)
        k.store(r["s"], 0, 0, p)
    return _tile_fn("produce", (("x", None), ("s", shape)), body)


def test_a_copy_updated_in_place_does_not_change_another_copy_of_the_state():
    def body(k, r):
        d1, d2, o = k.tile("d1", 4, 4, f32), k.tile("d2", 4, 4, f32), k.tile("o", 4, 4, f32)
        k.load(d1, r["s"], 0, 0)
        k.load(d2, r["s"], 0, 0)
        k.adds(d1, d1, 1.0)
        k.add(o, d1, d2)
        k.store(r["y"], 0, 0, o)
    consume = _tile_fn("consume", (("s", None), ("y", None)), body)
    o = Orchestration("prog")
    X, S, Y = o.input("x", 4, 4, f32), o.temp("s", 4, 4, f32), o.output("y", 4, 4, f32)
    o.call(_produce(), {"x": X, "s": S})
    o.call(consume, {"s": S, "y": Y})
    assert _same(o.module(), {}).fused


def _carry_step(read_again: bool):
    def body(k, r):
        d, o = k.tile("d", 4, 4, f32), k.tile("o", 4, 4, f32)
        k.load(d, r["carry"], 0, 0)
        k.adds(d, d, 1.0)
        if read_again:
            e = k.tile("e", 4, 4, f32)
            k.load(e, r["carry"], 0, 0)  # the old carry, read after d's update
            k.add(o, d, e)
        else:
            k.mov(o, d)
        k.store(r["y"], 0, 0, o)
        k.store(r["carry"], 0, 0, d)
    return _tile_fn("step", (("carry", None), ("y", None)), body)


@pytest.mark.parametrize("n", [0, 1, 3])
@pytest.mark.parametrize("read_again", [True, False])
def test_a_chain_with_state_read_twice_or_no_trip(n, read_again):
    """The carry read again after an in-place update, and a loop that runs no iteration: the
    state after the loop is what the written loop leaves (for no trip, what was there)."""
    o = Orchestration("prog")
    N = o.scalar("n")
    C, Y = o.inout("carry", 4, 4, f32), o.inout("y", 4, 4, f32)
    with o.for_loop("i", 0, N):
        o.call(_carry_step(read_again), {"carry": C, "y": Y})
    assert _same(o.module(), {"n": n}).fused


def test_an_output_read_only_by_its_consumer_still_reaches_memory():
    def body(k, r):
        d = k.tile("d", 4, 4, f32)
        k.load(d, r["s"], 0, 0)
        k.muls(d, d, 2.0)
        k.store(r["y"], 0, 0, d)
    consume = _tile_fn("consume", (("s", None), ("y", None)), body)
    o = Orchestration("prog")
    X, S, Y = o.input("x", 4, 4, f32), o.output("s", 4, 4, f32), o.output("y", 4, 4, f32)
    o.call(_produce(), {"x": X, "s": S})
    o.call(consume, {"s": S, "y": Y})
    assert _same(o.module(), {}).fused


@pytest.mark.parametrize("shapes", [(None, (2, 4)), ((2, 4), None)])
def test_members_that_declare_different_shapes_of_a_region_are_refused(shapes):
    def body(k, r):
        d = k.tile("d", 4, 4, f32)
        k.load(d, r["s"], 0, 0, pad=7.0)
        k.store(r["y"], 0, 0, d)
    consume = _tile_fn("consume", (("s", shapes[1]), ("y", None)), body)
    o = Orchestration("prog")
    X, S, Y = o.input("x", 4, 4, f32), o.inout("s", 4, 4, f32), o.output("y", 4, 4, f32)
    o.call(_produce(shapes[0]), {"x": X, "s": S})
    o.call(consume, {"s": S, "y": Y})
    rep = _same(o.module(), {})
    assert not rep.fused and "different shapes of `s`" in rep.refused[0].reason


def test_a_members_rows_of_a_region_bound_without_extent_is_refused():
    def body(k, r):
        d = k.tile("d", 4, 4, f32)
        k.load(d, r["s"], 0, 0)
        k.store(r["y"], 0, 0, d)
    consume = _tile_fn("consume", (("s", None), ("y", None)), body)
    o = Orchestration("prog")
    X, S, Y = o.input("x", 8, 4, f32), o.temp("s", 4, 4, f32), o.output("y", 4, 4, f32)
    o.call(_produce(rows_attr=True), {"x": X, "s": S})
    o.call(consume, {"s": S, "y": Y})
    rep = _same(o.module(), {})
    assert not rep.fused and "`x.rows`" in rep.refused[0].reason


def test_a_member_with_a_strided_load_is_refused():
    """A strided load (every s-th row) of the region the producer wrote: the fused function
    would read its slot as contiguous rows, so the pass refuses the pair, says why, and the
    program is left as written (``_same`` checks its values)."""
    def body(k, r):
        d = k.tile("d", 2, 4, f32)
        k.load(d, r["s"], 0, 0, step=2)
        k.store(r["y"], 0, 0, d)
    consume = _tile_fn("consume", (("s", None), ("y", None)), body)
    o = Orchestration("prog")
    X, S, Y = o.input("x", 4, 4, f32), o.temp("s", 4, 4, f32), o.output("y", 2, 4, f32)
    o.call(_produce(), {"x": X, "s": S})
    o.call(consume, {"s": S, "y": Y})
    rep = _same(o.module(), {})
    assert not rep.fused and "loads a strided tile of `s` (a row in every 2" in rep.refused[0].reason


@pytest.mark.parametrize("tile_rows,row_off,pad", [(4, 0, 0.0), (8, 0, 0.0), (4, 2, 0.0), (4, 0, 5.0)])
@pytest.mark.parametrize("merge", [False, True])
def test_a_tiled_union_keeps_each_loads_own_padding(tile_rows, row_off, pad, merge):
    """An adaptive loop over base tiles of 4 rows (extent min(i.rows, N - 4i)): a member tile
    taller than its iteration, or a load at a row offset, must still read the pad past its own
    iteration's rows, not the next iteration's."""
    def body(k, r):
        t, u = k.tile("t", tile_rows, 4, f32), k.tile("u", tile_rows, 4, f32)
        k.load(t, r["x"], row_off, 0, pad=pad)
        k.load(u, r["acc"], 0, 0)
        k.add(u, u, t)
        k.store(r["acc"], 0, 0, u)
    step = _tile_fn("acc_step", (("x", None), ("acc", None)), body)
    o = Orchestration("prog")
    N = o.scalar("N")
    X, A = o.input("x", N, 4, f32), o.inout("acc", 8, 4, f32)
    with o.for_loop("i", 0, (N + 3) // 4, tile_levels={0: 4, 2: 8}, reassociate=True) as i:
        o.call(step, {"x": (X, i * 4, 0, emin(i.rows, N - i * 4), 4), "acc": (A, 0, 0, tile_rows, 4)})
    for n in (10, 12):
        assert _same(o.module(), {"N": n}, merge=merge).fused


# -- issue 42: trip counts, merged-step placements, empty loops, matmul_acc state -------------------

def _colsum_acc():
    """acc (one row) += the column sums of an R x 4 tile of x: a carried region every
    iteration reads and rewrites (re-associable)."""
    def body(k, r):
        R = k.dim("R", 2)
        t, c, a = k.tile("t", R, 4, f32), k.tile("c", 1, 4, f32), k.tile("a", 1, 4, f32)
        k.load(t, r["x"], 0, 0)
        k.colsum(c, t)
        k.load(a, r["acc"], 0, 0)
        k.add(a, a, c)
        k.store(r["acc"], 0, 0, a)
    return _tile_fn("colsum_acc", (("x", None), ("acc", None)), body)


def _reduction(lb, ub, row, rows, levels=None, reassociate=True, x_rows=None, acc_row=None):
    """``for j in lb .. ub: acc += colsum(x[row(j), rows(j)])`` over scalars S, L, T."""
    o = Orchestration("prog")
    S, L, T = o.scalar("S"), o.scalar("L"), o.scalar("T")
    X, A = o.input("x", x_rows(S) if x_rows else S + 16, 4, f32), o.inout("acc", 4, 4, f32)
    attrs = dict(tile_levels=levels, reassociate=reassociate) if levels else {}
    with o.for_loop("j", lb(S, L, T), ub(S, L, T), **attrs) as j:
        dims = {"R": j.rows} if levels else {}
        o.call(_colsum_acc(), {"x": (X, row(j), 0, rows(j, S), 4),
                               "acc": (A, acc_row(S, L, T) if acc_row else 0, 0, 1, 4)}, dims=dims)
    return o.module()


def test_a_merged_chain_with_a_negative_trip_count_runs_no_iteration():
    """``cdiv(S - 4, 2)`` trips is negative for S < 3: both the merged steps and the base-tile
    remainder run none (the split point is not below the lower bound), and acc is unchanged."""
    from tests.passes.fusion_check import check_fusion

    m = _reduction(lambda S, L, T: 0, lambda S, L, T: cdiv(S - 4, 2), lambda j: 4 + j * 2,
                   lambda j, S: emin(j.rows, S - 4 - j * 2), levels={0: 2, 2: 4, 4: 8})
    out = check_fusion(m, [{"S": s, "L": 0, "T": 0} for s in (0, 1, 2, 3, 4, 5, 9, 21)])
    assert out.fused and not out.invalid


@pytest.mark.parametrize("row,rows,levels,why", [
    (lambda j: j * 2, lambda j, S: emin(j.rows, 4), {0: 2, 2: 4, 4: 8}, "min(j.rows, 4)"),  # cut at a moving end
    (lambda j: j * 4, lambda j, S: j.rows, {0: 2, 2: 4}, "j * 4"),  # a stride other than the base height
    (lambda j: j * 2, lambda j, S: 2, {0: 2, 2: 4}, "with rows `2`"),  # a constant extent under a growing tile
])
def test_merged_steps_need_the_merged_tile_placement_rule(row, rows, levels, why):
    """What binary expansion refuses to merge, fusion does not merge either: the chain steps over
    base tiles (bit-exact) and the report says why the merged steps were refused."""
    from tests.passes.fusion_check import check_fusion

    m = _reduction(lambda S, L, T: 0, lambda S, L, T: cdiv(S, 2), row, rows, levels=levels,
                   x_rows=lambda S: 2 * S + 16)
    out = check_fusion(m, [{"S": s, "L": 0, "T": 0} for s in (1, 5, 8, 13)], merges=(True,))
    rep = out.reports[True]
    assert [f.kind for f in rep.fused] == ["chain"], rep.describe()
    assert any(r.kind == "chain" and "merged steps" in r.reason and why in r.reason for r in rep.refused), \
        rep.describe()
    with pytest.raises(BuildError, match="adaptive loop `j`"):
        expand_binary(m)


@pytest.mark.parametrize("lt", [(0, 0), (1, 0), (3, 1), (1, 3), (2, 5)])
def test_an_empty_loop_binds_no_region_before_its_tensor(lt):
    """``x[j * 2 - 2]`` over ``L .. T``: no iteration runs for L >= T, and the union of no
    iteration's rows must not be bound at row -2 (the written program binds nothing)."""
    from tests.passes.fusion_check import check_fusion

    m = _reduction(lambda S, L, T: L, lambda S, L, T: T, lambda j: j * 2 - 2, lambda j, S: 2)
    out = check_fusion(m, [{"S": 4, "L": lt[0], "T": lt[1]}])
    assert out.fused and not out.invalid


@pytest.mark.parametrize("n", [0, 1, 4])
def test_an_empty_loop_binds_no_state_region_outside_its_tensor(n):
    """The state at row ``T - 1``: outside ``acc`` when T = 0, when the loop runs no iteration.
    The fused call runs only when the loop has a trip."""
    from tests.passes.fusion_check import check_fusion

    m = _reduction(lambda S, L, T: 0, lambda S, L, T: T, lambda j: j * 2, lambda j, S: 2,
                   acc_row=lambda S, L, T: T - 1)
    out = check_fusion(m, [{"S": 8, "L": 0, "T": n}])
    assert out.fused and not out.invalid
    (why,) = out.reports[False].refused
    assert why.kind == "guard" and why.reason.startswith("`if T > 0`, as `acc` at row offset `T - 1`"), why
