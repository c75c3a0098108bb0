"""Binary loop expansion: the expanded program equals the unexpanded one, covers every row
exactly once, runs the closed-form number of tasks, expands nested loops, and keeps the
generated code linear in the number of loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pto import InCore, Orchestration, emin, f32
from pto.codegen.c_orch import generate_c
from pto.graph import CompiledProgram
from pto.interp.orchestration import iter_tasks, run_program
from pto.ir.expr import bx_blocks
from pto.passes.binary_expansion import (
    closed_form_iterations,
    expand_binary,
    has_adaptive,
    height_of_block,
    strip_adaptive,
)

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
        src = generate_c(expand_binary(o.module())).source
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
