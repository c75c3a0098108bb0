"""Binary loop expansion: the expanded program equals the unexpanded one, covers every row
exactly once, runs the closed-form number of tasks, expands nested loops, and keeps the
generated code linear in the number of loops; merged iterations must be independent (a
recurrence, an accumulator without ``reassociate``, an offset the proof cannot decide and a
condition on the loop variable are refused, each with one line naming what the user wrote).
tests/passes/test_expansion_semantics.py checks the rule on random programs."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pto import InCore, Orchestration, emax, emin, f32, format_module, parse_module
from pto.codegen.c_orch import generate_c
from pto.errors import BuildError, ParseError
from pto.interp.orchestration import iter_tasks, run_program
from pto.ir.expr import bx_blocks
from pto.passes.expansion.binary_expansion import (
    closed_form_iterations,
    expand_binary,
    has_adaptive,
    height_of_block,
    strip_adaptive,
)
from pto.runtime.graph import CompiledProgram

BASE = 4
LEVELS = {0: BASE, 2: 8, 4: 16, 8: 16}
MX, MN = 8, 2


def _bump():
    """y += 1 on a tile of R x 8 (R a dim): a row written twice would read 2."""
    k = InCore("bump")
    R = k.dim("R", BASE)
    y = k.memref("y", f32)
    t = k.tile("t", R, 8, f32)
    k.load(t, y, 0, 0)
    k.adds(t, t, 1.0)
    k.store(y, 0, 0, t)
    return k.build()


def rows_program(levels=LEVELS, mx=MX, mn=MN):
    o = Orchestration("rows")
    R = o.scalar("R")
    y = o.inout("y", R, 8, f32)
    with o.for_loop("i", 0, (R + BASE - 1) // BASE, max_range=mx, min_range=mn, tile_levels=levels) as i:
        o.call(_bump(), {"y": (y, i * BASE, 0, emin(i.rows, R - i * BASE), 8)}, dims={"R": i.rows})
    return o.module()


def grid_program():
    """Two nested adaptive loops over a square (the q and kv loops of attention)."""
    k = InCore("bump2")
    QR, KR = k.dim("QR", BASE), k.dim("KR", BASE)
    z = k.memref("z", f32)
    t = k.tile("t", QR, KR, f32)
    k.load(t, z, 0, 0)
    k.adds(t, t, 1.0)
    k.store(z, 0, 0, t)
    f = k.build()
    o = Orchestration("grid")
    S = o.scalar("S")
    z = o.inout("z", S, S, f32)
    n = o.let("n", (S + BASE - 1) // BASE)
    with o.for_loop("i", 0, n, max_range=MX, min_range=MN, tile_levels=LEVELS) as i:
        with o.for_loop("j", 0, n, max_range=MX, min_range=MN, tile_levels=LEVELS) as j:
            o.call(f, {"z": (z, i * BASE, j * BASE, emin(i.rows, S - i * BASE), emin(j.rows, S - j * BASE))},
                   dims={"QR": i.rows, "KR": j.rows})
    return o.module()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4 * MX * BASE))
def test_rows_covered_exactly_once_and_closed_form(R):
    m = rows_program()
    n = (R + BASE - 1) // BASE
    for variant in (m, expand_binary(m)):
        y = torch.zeros(R, 8)
        res = run_program(variant, {"y": y}, {"R": R})
        assert torch.equal(res.tensors["y"], torch.ones(R, 8)), "every row exactly once"
    tasks = list(iter_tasks(expand_binary(m), {"R": R}))
    assert len(tasks) == closed_form_iterations(n, MX, MN, tuple(sorted(LEVELS.items())))
    # tile heights are the documented ones: block p uses the level of the largest key <= p
    heights = [t.func.variant[0][1] for t in tasks]
    want = []
    for _, size in bx_blocks(n, MX, MN):
        h = height_of_block(tuple(sorted(LEVELS.items())), size) if size >= MN else BASE
        want += [h] * (size // (h // BASE))
    assert heights == want


@pytest.mark.parametrize("n", range(1, 4 * MX + 1))
def test_closed_form_matches_c_graph(n):
    m = rows_program()
    g = CompiledProgram.get(m).build_graph({"R": n * BASE})
    assert g.tasks == closed_form_iterations(n, MX, MN, tuple(sorted(LEVELS.items())))
    g.close()


@pytest.mark.parametrize("S", [1, 5, 16, 37, 64, 100])
def test_nested_expansion_covers_every_pair_once(S):
    m = grid_program()
    e = expand_binary(m)
    z = torch.zeros(S, S)
    run_program(e, {"z": z}, {"S": S})
    assert torch.equal(z, torch.ones(S, S))
    n = (S + BASE - 1) // BASE
    per_axis = closed_form_iterations(n, MX, MN, tuple(sorted(LEVELS.items())))
    assert sum(1 for _ in iter_tasks(e, {"S": S})) == per_axis ** 2
    g = CompiledProgram.get(m).build_graph({"S": S})
    assert g.tasks == per_axis ** 2
    g.close()


def test_seed_reduction_for_attention_pairs():
    """With 64-row tiles over 32-row base tiles the N^2 pair term shrinks 4x (seed 004)."""
    levels = {0: 32, **{2 ** k: 64 for k in range(1, 13)}}
    n = 256
    it = closed_form_iterations(n, 4096, 2, tuple(sorted(levels.items())))
    assert it == n // 2 and it ** 2 * 4 == n ** 2


def test_generated_code_is_linear_in_loops():
    """Each extra nested adaptive loop adds a constant number of C lines (no copy of the body
    per block or per nesting level)."""

    def nested(depth):
        k = InCore("cell")
        dims = [k.dim(f"D{d}", BASE) for d in range(depth)]
        z = k.memref("z", f32)
        t = k.tile("t", dims[0], 8, f32)
        k.load(t, z, 0, 0)
        k.adds(t, t, 1.0)
        k.store(z, 0, 0, t)
        for d in dims[1:]:
            k.mask_rows(t, t, d, fill=0.0)
        f = k.build()
        o = Orchestration(f"n{depth}")
        S = o.scalar("S")
        z = o.inout("z", S * depth, 8, f32)
        loops, ctxs = [], []
        for d in range(depth):
            c = o.for_loop(f"i{d}", 0, S, max_range=MX, min_range=MN, tile_levels=LEVELS)
            ctxs.append(c)
            loops.append(c.__enter__())
        o.call(f, {"z": (z, loops[0] * 0, 0)}, dims={f"D{d}": loops[d].rows for d in range(depth)})
        for c in reversed(ctxs):
            c.__exit__(None, None, None)
        # only the code's size matters here: every iteration bumps the same region, which the
        # independence check rightly refuses to merge
        src = generate_c(expand_binary(o.module(), check=False)).source
        return len(src[src.index(f"int pto_n{depth}_build"):].splitlines())

    # the build function (the variant tables aside, which list the tile-height combinations)
    sizes = [nested(d) for d in (1, 2, 3, 4)]
    steps = {b - a for a, b in zip(sizes, sizes[1:])}
    assert len(steps) == 1 and steps.pop() < 12, sizes


def test_strip_and_expand_leave_no_adaptive_loops():
    m = grid_program()
    assert has_adaptive(m)
    assert not has_adaptive(expand_binary(m)) and not has_adaptive(strip_adaptive(m))
    S = 37
    n = (S + BASE - 1) // BASE
    assert sum(1 for _ in iter_tasks(strip_adaptive(m), {"S": S})) == n * n


# ------------------------------------------------------------------ independence of merged iterations


def _shift_half():
    """y = x / 2 + 1/2 on an R x 8 tile."""
    k = InCore("shift")
    R = k.dim("R", BASE)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", R, 8, f32)
    k.load(t, x, 0, 0)
    k.muls(t, t, 0.5)
    k.adds(t, t, 0.5)
    k.store(y, 0, 0, t)
    return k.build()


def chain_program(levels=None):
    """The issue's smallest case: tile i of z is computed from tile i - 1 (the first from itself)."""
    o = Orchestration("chain")
    S = o.scalar("S")
    z = o.inout("z", S, 8, f32)
    with o.for_loop("i", 0, S // BASE, tile_levels=levels or {0: BASE, 2: 2 * BASE}) as i:
        o.call(_shift_half(), {"x": (z, emax(i * BASE - BASE, 0), 0, i.rows, 8), "y": (z, i * BASE, 0, i.rows, 8)},
               dims={"R": i.rows})
    return o.module()


def _ints(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=g).float()


def test_loop_carried_recurrence_is_refused_naming_loop_call_tensor_and_iterations():
    m = chain_program()
    z = _ints(8, 8)
    want = run_program(m, {"z": z.clone()}, {"S": 8}).tensors["z"]
    # the reference: tile 1 is computed from tile 0 after tile 0 was updated
    assert torch.equal(want[4:], (want[:4] * 0.5 + 0.5))
    # merged unchecked, one 8-row task reads tile 0 before it is updated: another result
    wrong = run_program(expand_binary(m, check=False), {"z": z.clone()}, {"S": 8}).tensors["z"]
    assert not torch.equal(wrong, want)
    line = m["chain"].body[0].body[0].loc
    msg = (r"^`chain`: adaptive loop `i`: iteration i\+1 of call to `shift` \(" + re.escape(line) +
           r"\) reads `z` where iteration i of the same call writes it \(a loop-carried dependence\).*"
           r"drop tile_levels from loop `i` \(or lower with --no-adaptive\)$")
    with pytest.raises(BuildError, match=msg):
        expand_binary(m)
    with pytest.raises(BuildError, match=msg):  # the default pipeline lowers the same way
        CompiledProgram.get(m)
    assert "\n" not in msg
    # without merging, the lowering is the reference
    assert torch.equal(run_program(strip_adaptive(m), {"z": z.clone()}, {"S": 8}).tensors["z"], want)


def test_recurrence_farther_than_the_merge_is_accepted_and_nearer_is_refused():
    """A dependence 2 tiles back is outside blocks of 2 tiles, inside blocks of 4."""

    def program(levels):
        o = Orchestration("skip2")
        S = o.scalar("S")
        z = o.inout("z", S + 2 * BASE, 8, f32)
        with o.for_loop("i", 0, (S + BASE - 1) // BASE, tile_levels=levels) as i:
            rows = emin(i.rows, S - i * BASE)
            o.call(_shift_half(), {"x": (z, i * BASE, 0, rows, 8), "y": (z, i * BASE + 2 * BASE, 0, rows, 8)},
                   dims={"R": i.rows})
        return o.module()

    m = program({0: BASE, 2: 2 * BASE})
    for S in (9, 24, 37):
        z = _ints(S + 2 * BASE, 8, seed=S)
        want = run_program(m, {"z": z.clone()}, {"S": S}).tensors["z"]
        got = run_program(expand_binary(m), {"z": z.clone()}, {"S": S}).tensors["z"]
        assert torch.equal(got, want)
    with pytest.raises(BuildError, match=r"iteration i\+2 of call to `shift` .* reads `z` where iteration i of "
                                         r"the same call writes it"):
        expand_binary(program({0: BASE, 2: 2 * BASE, 4: 4 * BASE}))


def _accumulate():
    """acc (1 x 8) += column sums of x."""
    k = InCore("accum")
    R = k.dim("R", BASE)
    x, acc = k.memref("x", f32), k.memref("acc", f32)
    t, c, a = k.tile("t", R, 8, f32), k.tile("c", 1, 8, f32), k.tile("a", 1, 8, f32)
    k.load(t, x, 0, 0)
    k.colsum(c, t)
    k.load(a, acc, 0, 0)
    k.add(a, a, c)
    k.store(acc, 0, 0, a)
    return k.build()


def sum_program(reassociate: bool, carried: bool = False):
    """Column sums of x into one row of acc; with ``carried`` each tile of x is also bumped from
    the previous one, a recurrence that reassociate does not cover."""
    o = Orchestration("colsums")
    S = o.scalar("S")
    x, acc = o.inout("x", S + BASE, 8, f32), o.inout("acc", 1, 8, f32)
    with o.for_loop("i", 0, (S + BASE - 1) // BASE, tile_levels=LEVELS, max_range=MX, min_range=MN,
                    reassociate=reassociate) as i:
        rows = emin(i.rows, S - i * BASE)
        o.call(_accumulate(), {"x": (x, i * BASE, 0, rows, 8), "acc": acc}, dims={"R": i.rows})
        if carried:
            o.call(_shift_half(), {"x": (x, i * BASE, 0, rows, 8), "y": (x, i * BASE + BASE, 0, rows, 8)},
                   dims={"R": i.rows})
    return o.module()


def test_invariant_accumulator_is_merged_only_with_reassociate():
    with pytest.raises(BuildError, match=r"^`colsums`: adaptive loop `i`: iterations i and i\+1 touch the same region "
                                         r"of `acc` \(call to `accum` \(test_expansion.py:\d+\) updates it in every "
                                         r"iteration.*pass reassociate=True to the loop.*drop tile_levels"):
        expand_binary(sum_program(False))
    m = sum_program(True)
    for S in (3, 29, 64):
        x, acc = _ints(S + BASE, 8, seed=S), _ints(1, 8, seed=S + 1)
        want = run_program(m, {"x": x, "acc": acc.clone()}, {"S": S}).tensors["acc"]
        assert torch.equal(want, acc + x[:S].sum(0, keepdim=True))  # integers: every order sums exactly
        res = run_program(expand_binary(m), {"x": x, "acc": acc.clone()}, {"S": S})
        assert torch.equal(res.tensors["acc"], want)
        n = (S + BASE - 1) // BASE
        assert res.tasks == closed_form_iterations(n, MX, MN, tuple(sorted(LEVELS.items())))
        assert res.tasks < n or n == 1  # merged indeed


def test_reassociate_does_not_admit_a_recurrence():
    with pytest.raises(BuildError, match=r"iteration i\+1 of call to `accum` .* reads `x` where iteration i of "
                                         r"call to `shift` .* writes it \(a loop-carried dependence\)"):
        expand_binary(sum_program(True, carried=True))


def test_offsets_the_proof_cannot_decide_are_refused_with_the_reason():
    o = Orchestration("pairs")
    S = o.scalar("S")
    z = o.inout("z", S, 8, f32)
    with o.for_loop("i", 0, S // BASE, tile_levels={0: BASE, 2: 2 * BASE}) as i:
        o.call(_bump(), {"y": (z, (i // 2) * BASE, 0, i.rows, 8)}, dims={"R": i.rows})
    with pytest.raises(BuildError, match=r"^`pairs`: adaptive loop `i`: cannot prove that iterations i and i\+1 of "
                                         r"call to `bump` \(.*\) touch disjoint parts of `z`: `i // 2` is not affine "
                                         r"in `i`; drop tile_levels"):
        expand_binary(o.module())


def test_a_condition_on_the_loop_variable_is_refused():
    o = Orchestration("odd")
    S = o.scalar("S")
    z = o.inout("z", S, 8, f32)
    with o.for_loop("i", 0, S // BASE, tile_levels={0: BASE, 2: 2 * BASE}) as i:
        with o.if_(i % 2):
            o.call(_bump(), {"y": (z, i * BASE, 0, i.rows, 8)}, dims={"R": i.rows})
    with pytest.raises(BuildError, match=r"adaptive loop `i`: the condition `i % 2` depends on `i`, but a merged "
                                         r"iteration evaluates it once"):
        expand_binary(o.module())


def test_nested_loops_are_checked_each_against_its_own_variable():
    """Tile (i, j) of z reads tile (i, j - 1): independent across i, a recurrence along j."""
    k = InCore("left")
    QR, KR = k.dim("QR", BASE), k.dim("KR", BASE)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", QR, KR, f32)
    k.load(t, x, 0, 0)
    k.adds(t, t, 1.0)
    k.store(y, 0, 0, t)
    f = k.build()

    def program(j_levels):
        o = Orchestration("grid_rec")
        S = o.scalar("S")
        z = o.inout("z", S, S + BASE, f32)
        n = o.let("n", (S + BASE - 1) // BASE)
        with o.for_loop("i", 0, n, max_range=MX, min_range=MN, tile_levels=LEVELS) as i:
            with o.for_loop("j", 0, n, **({"tile_levels": j_levels} if j_levels else {})) as j:
                rows = emin(i.rows, S - i * BASE)
                width = j.rows if j_levels else BASE
                cols = emin(width, S - j * BASE)
                o.call(f, {"x": (z, i * BASE, j * BASE, rows, cols), "y": (z, i * BASE, j * BASE + BASE, rows, cols)},
                       dims={"QR": i.rows, "KR": width})
        return o.module()

    m = program(None)
    for S in (7, 30):
        z = _ints(S, S + BASE, seed=S)
        want = run_program(m, {"z": z.clone()}, {"S": S}).tensors["z"]
        assert torch.equal(run_program(expand_binary(m), {"z": z.clone()}, {"S": S}).tensors["z"], want)
    with pytest.raises(BuildError, match=r"adaptive loop `j`: iteration j\+1 of call to `left`"):
        expand_binary(program({0: BASE, 2: 2 * BASE}))


def test_reassociate_round_trips_through_the_text_form_and_needs_tile_levels():
    m = sum_program(True)
    text = format_module(m)
    assert "reassociate = true" in text and "reassociate" not in format_module(sum_program(False))
    assert parse_module(text) == m and parse_module(text) != sum_program(False)
    bad = text.replace("tile_levels = {0: 4, 2: 8, 4: 16, 8: 16}, ", "").replace("max_range = 8, min_range = 2, ", "")
    with pytest.raises(ParseError, match=r"line \d+: loop `%i`: reassociate .* needs tile_levels"):
        parse_module(bad)
    o = Orchestration("plain")
    with pytest.raises(BuildError, match=r"loop `i`: reassociate=True needs tile_levels"):
        with o.for_loop("i", 0, 4, reassociate=True):
            pass
