"""A merged call must cover the base tiles it replaces, in order (issue 20, section 4).

Independence is not enough: a read at a clamped offset conflicts with nothing, yet one taller
tile at iteration i's offset is not the base tiles. The issue's program is refused with one line
naming the loop, the call and the offset; offsets that only look non-affine (a clamp that never
takes effect in the loop's range) are proven and merged; extents must grow with the tile (or be
cut off at an end that stays put); the axis across the tile must not move; a region the callee
does not tile by the loop needs a scalar or a nested loop to locate it. Random programs with
affine, clamped, min/max, floor-divided and select offsets are refused or computed bit-exactly,
through the interpreter and through the graph.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import torch

from pto import InCore, Orchestration, cdiv, emax, emin, f32, format_module
from pto.backends import get_backend
from pto.engine import execute
from pto.errors import BuildError
from pto.exec import get_executor
from pto.interp.orchestration import run_program
from pto.ir.expr import format_expr
from pto.ir.nodes import RegionBinding
from pto.passes.expansion.binary_expansion import expand_binary, strip_adaptive
from pto.runtime.graph import CompiledProgram
from tests.passes.test_expansion_semantics import (
    REFUSAL,
    SAFE,
    _same,
    build,
    conflicts_at,
    inputs,
    random_plan,
    run,
)


def _halve(rows=4, cols=4):
    """y = x / 2 on an R x cols tile."""
    k = InCore("halve")
    R = k.dim("R", rows)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", R, cols, f32)
    k.load(t, x, 0, 0)
    k.muls(t, t, 0.5)
    k.store(y, 0, 0, t)
    return k.build()


def clamped_program():
    """The issue's program: y's tile i is half of x's rows from max(min(i * 4 - 3, S - 1), 0)."""
    o = Orchestration("clamped")
    S = o.scalar("S")
    x, y = o.input("x", S, 4, f32), o.output("y", S, 4, f32)
    with o.for_loop("i", 0, cdiv(S, 4), tile_levels={0: 4, 2: 8}) as i:
        rows = emin(i.rows, S - i * 4)
        o.call(_halve(), {"x": x[emax(emin(i * 4 - 3, S - 1), 0), 0, rows, 4], "y": y[i * 4, 0, rows, 4]},
               dims={"R": i.rows})
    return o.module()


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_the_issues_clamped_read_is_refused_naming_loop_call_and_offset():
    m = clamped_program()
    x = torch.arange(8.0).repeat(4, 1).T.contiguous()  # row r holds r
    want = run_program(m, {"x": x}, {"S": 8}).tensors["y"]
    assert want[:, 0].tolist() == [0, 0.5, 1, 1.5, 0.5, 1, 1.5, 2]
    # what the merge computed before: one 8-row tile at iteration 0's offset
    wrong = run_program(expand_binary(m, check=False), {"x": x}, {"S": 8}).tensors["y"]
    assert wrong[:, 0].tolist() == [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]
    line = m["clamped"].body[0].body[0].loc
    msg = (r"^`clamped`: adaptive loop `i`: call to `halve` \(" + re.escape(line) + r"\) reads `x` at row offset "
           r"`max\(min\(i \* 4 - 3, S - 1\), 0\)`, which is not `i \* 4` plus a part that does not move with `i`, "
           r"so one call over a taller tile at iteration i's offset would not cover the base tiles' rows in order; "
           r"drop tile_levels from loop `i` \(or lower with --no-adaptive\)$")
    with pytest.raises(BuildError, match=msg):
        expand_binary(m)
    with pytest.raises(BuildError, match=msg):  # the engine's pipeline refuses before any work
        execute(m, {"S": 8}, {"x": x}, device="cpu", backend="torch")
    # --no-adaptive needs no proof and computes the reference, on random data too
    for S in (8, 13, 29):
        xs = _randn(S, 4, seed=S)
        ref = run_program(m, {"x": xs}, {"S": S}).tensors["y"]
        assert torch.equal(execute(m, {"S": S}, {"x": xs}, device="cpu", backend="torch", adaptive=False)["y"], ref)
        assert torch.equal(run_program(strip_adaptive(m), {"x": xs}, {"S": S}).tensors["y"], ref)


def test_an_offset_bound_by_a_let_is_quoted_as_written_and_inlined():
    o = Orchestration("lets")
    S = o.scalar("S")
    x, y = o.input("x", S, 4, f32), o.output("y", S, 4, f32)
    with o.for_loop("i", 0, cdiv(S, 4), tile_levels={0: 4, 2: 8}) as i:
        start = o.let("start", emax(emin(i * 4 - 3, S - 1), 0))
        o.call(_halve(), {"x": x[start, 0, i.rows, 4], "y": y[i * 4, 0, i.rows, 4]}, dims={"R": i.rows})
    with pytest.raises(BuildError, match=r"reads `x` at row offset `start` \(= `max\(min\(i \* 4 - 3, S - 1\), 0\)`\), "
                                         r"which is not `i \* 4`"):
        expand_binary(o.module())


def _one_call(x_row, x_rows=None, x_col=0, y_rows=None, levels=None, reassociate=False):
    """y's tile i from x's region at ``x_row(i, S)``; extents default to the residual tile."""
    o = Orchestration("one")
    S = o.scalar("S")
    x, y = o.input("x", S + 16, 16, f32), o.output("y", S, 4, f32)
    with o.for_loop("i", 0, cdiv(S, 4), tile_levels=levels or {0: 4, 2: 8, 4: 16}, reassociate=reassociate) as i:
        rows = emin(i.rows, S - i * 4)
        xr = rows if x_rows is None else x_rows(i, S)
        o.call(_halve(), {"x": x[x_row(i, S), x_col if not callable(x_col) else x_col(i), xr, 4],
                          "y": y[i * 4, 0, rows if y_rows is None else y_rows(i, S), 4]}, dims={"R": i.rows})
    return o.module()


@pytest.mark.parametrize("x_row", [
    lambda i, S: emax(i * 4, 0),  # i >= 0: never clamps
    lambda i, S: emin(i * 4 + 3, i * 4 + 5),
    lambda i, S: emax(i * 4 + 2, 1),
], ids=["max_never", "min_never", "max_shifted"])
def test_offsets_equal_to_an_affine_one_over_the_range_are_proven_and_merged(x_row):
    m = _one_call(x_row)
    e = expand_binary(m)
    for S in (5, 16, 37):
        xs = _randn(S + 16, 16, seed=S)
        ref = run_program(m, {"x": xs}, {"S": S})
        got = run_program(e, {"x": xs}, {"S": S})
        assert torch.equal(got.tensors["y"], ref.tensors["y"])
        assert got.tasks < ref.tasks  # merged indeed


@pytest.mark.parametrize("x_row,shown", [
    (lambda i, S: (i // 2) * 4, "i // 2 * 4"),
    (lambda i, S: emin(i * 4, 8), "min(i * 4, 8)"),
    (lambda i, S: i * 2, "i * 2"),
    (lambda i, S: 0, "0"),  # read again by every iteration, each time as the top of a taller tile
])
def test_offsets_that_do_not_advance_by_the_base_stride_are_refused(x_row, shown):
    with pytest.raises(BuildError, match=r"^`one`: adaptive loop `i`: call to `halve` \(test_merged_tiles\.py:\d+\) "
                                         r"reads `x` at row offset `" + re.escape(shown) + r"`, which is not `i \* 4`"):
        expand_binary(_one_call(x_row))


def test_extents_must_grow_with_the_tile_or_end_where_the_base_tiles_end():
    ok = _one_call(lambda i, S: i * 4, x_rows=lambda i, S: emin(S + 4 - i * 4, i.rows))  # an end past S
    xs = _randn(53, 16, seed=1)
    assert torch.equal(run_program(expand_binary(ok), {"x": xs}, {"S": 37}).tensors["y"],
                       run_program(ok, {"x": xs}, {"S": 37}).tensors["y"])
    for x_rows, shown in ((lambda i, S: emin(i.rows, 8), "min(i.rows, 8)"), (lambda i, S: 4, "4"),
                          (lambda i, S: emin(i.rows, S - i * 2), "min(i.rows, S - i * 2)")):
        with pytest.raises(BuildError, match=r"call to `halve` \(.*\) reads `x` with rows `" + re.escape(shown) +
                                             r"`, which does not grow with the tile"):
            expand_binary(_one_call(lambda i, S: i * 4, x_rows=x_rows))


def test_the_axis_across_the_tile_must_not_move():
    with pytest.raises(BuildError, match=r"reads `x` in tiles of `i.rows` rows, but at col offset `i % 2 \* 4` moves "
                                         r"with `i` too"):
        expand_binary(_one_call(lambda i, S: i * 4, x_col=lambda i: (i % 2) * 4))


def test_a_tile_in_rows_and_columns_is_refused():
    k = InCore("square")
    R = k.dim("R", 4)
    z = k.memref("z", f32)
    t = k.tile("t", R, R, f32)
    k.load(t, z, 0, 0)
    k.adds(t, t, 1.0)
    k.store(z, 0, 0, t)
    o = Orchestration("diag")
    S = o.scalar("S")
    z = o.inout("z", S, S, f32)
    with o.for_loop("i", 0, S // 4, tile_levels={0: 4, 2: 8}) as i:
        o.call(k.build(), {"z": z[i * 4, i * 4, i.rows, i.rows]}, dims={"R": i.rows})
    with pytest.raises(BuildError, match=r"call to `square` \(.*\) updates `z` in a tile that grows with `i.rows` in "
                                         r"rows and in columns"):
        expand_binary(o.module())


def test_a_region_the_callee_does_not_tile_must_not_move_unless_located():
    """A one-row bias per tile: no scalar tells the callee which tile it works on, so a merged
    call would add tile i's bias row to every base tile."""
    k = InCore("add_bias")
    R = k.dim("R", 4)
    b_, y = k.memref("b", f32), k.memref("y", f32)
    t, r = k.tile("t", R, 4, f32), k.tile("r", 1, 4, f32)
    k.load(t, y, 0, 0)
    k.load(r, b_, 0, 0)
    k.colexpandadd(t, t, r)
    k.store(y, 0, 0, t)
    o = Orchestration("biased")
    S = o.scalar("S")
    bias, y = o.input("bias", S, 4, f32), o.inout("y", S * 4, 4, f32)
    with o.for_loop("i", 0, S, tile_levels={0: 4, 2: 8}) as i:
        o.call(k.build(), {"b": bias[i, 0], "y": y[i * 4, 0, i.rows, 4]}, dims={"R": i.rows})
    m = o.module()
    data = {"bias": _randn(6, 4, seed=2), "y": _randn(24, 4, seed=3)}
    want = run_program(m, {k: v.clone() for k, v in data.items()}, {"S": 6}).tensors["y"]
    wrong = run_program(expand_binary(m, check=False), {k: v.clone() for k, v in data.items()}, {"S": 6}).tensors["y"]
    assert not torch.equal(wrong, want)
    with pytest.raises(BuildError, match=r"call to `add_bias` \(.*\) reads `bias` at row offset `i`, which moves with "
                                         r"`i`, but `add_bias` does not tile `b` by `i.rows` and neither a scalar "
                                         r"argument of the call nor a loop nested in `i` moves with `i`"):
        expand_binary(m)


# ---------------------------------------------------------------------------------- random programs

PLACEMENT = re.compile(r"^`rand`: adaptive loop `(\w+)`: call to `(\w+)` \(test_expansion_semantics\.py:\d+\) "
                       r"(?:reads|writes|updates) `(\w+)` (?:at (?:row|col) offset|with (?:rows|cols)) `([^`]+)`")
UNDECIDED = re.compile(r"adaptive loop `(\w+)`: cannot prove that iterations .* touch disjoint parts of `(\w+)`")


def _forms(plan: dict) -> dict[tuple[str, str], set[str]]:
    """(callee, tensor) -> the forms of its moving regions that matter for the merged loops."""
    out: dict[tuple[str, str], set[str]] = {}
    for kind, regions in plan["calls"]:
        for r in regions.values():
            if r["row"][0] == "move":
                used = {r["form"], r["ext"]} | ({r["cform"]} if plan["shape"] != "1d" else set())
                out.setdefault((kind, r["tensor"]), set()).update(used)
    return out


def _written(m, callee: str, tensor: str) -> set[str]:
    """Every offset and extent expression the program wrote for ``callee`` on ``tensor``."""
    out = set()

    def visit(body):
        for s in body:
            if hasattr(s, "body"):
                visit(s.body)
            elif getattr(s, "func", None) == callee:
                for _, v in s.args:
                    if isinstance(v, RegionBinding) and v.tensor == tensor:
                        out.update(format_expr(e, bare=True) for e in (v.row, v.col, v.rows, v.cols) if e is not None)

    visit(m.entry_function.body)
    return out


def _refused(m, plan, msg: str, sizes, seen: Counter) -> None:
    """A refusal names what the user wrote and has a cause: a form that is not affine as
    written on that tensor, or (for an independence refusal) iterations that really conflict."""
    assert "\n" not in msg, msg
    forms = _forms(plan)
    got = PLACEMENT.search(msg)
    if got:
        var, callee, tensor, shown = got.groups()
        assert forms.get((callee, tensor), set()) - SAFE, f"refused an affine placement: {msg}"
        assert shown in _written(m, callee, tensor), msg
        seen["placement"] += 1
        return
    got = REFUSAL.search(msg)
    if got:
        var, d, tensor = got.group(1), int(got.group(2) or got.group(4)), got.group(3) or got.group(5)
    else:
        got = UNDECIDED.search(msg)
        assert got, msg
        var, d, tensor = got.group(1), 1, got.group(2)
    written_affine = all(f.endswith("residual") or f == "affine" for (_, t), fs in forms.items() if t == tensor
                         for f in fs)
    assert not written_affine or any(conflicts_at(m, S, var, tensor, d) for S in sizes), msg
    seen["independence"] += 1


def _graph_run(m, S: int, seed: int) -> dict[str, torch.Tensor]:
    g = CompiledProgram.get(m).build_graph({"S": S})
    tensors = inputs(m, S, seed)
    get_executor("waves", get_backend("torch", "cpu"), tensors, order="random", seed=seed).run(g)
    g.close()
    return tensors


def test_random_offsets_are_refused_or_computed_bit_exactly():
    """Every accepted program computes the reference through the interpreter; the first few whose
    offsets are not affine as written also through the graph (generated C, the runtime's
    dependencies, the executor in a random ready order), compiling one C library each."""
    rng = random.Random(20260520)
    seen: Counter = Counter()
    for p in range(100):
        plan = random_plan(rng, forms=True)
        m = build(plan)
        b = plan["b"]
        sizes = (rng.randint(2 * b, 6 * b), rng.randint(6 * b + 1, 12 * b))
        try:
            lowered = expand_binary(m)
        except BuildError as err:
            _refused(m, plan, str(err), sizes, seen)
            seen["unchecked_differs"] += not _same(run(expand_binary(m, check=False), sizes[1], p), run(m, sizes[1], p))
            continue
        seen["accepted"] += 1
        for S in sizes:
            assert _same(run(lowered, S, p), run(m, S, p)), f"program {p}, S={S}\n{format_module(m)}"
        if set().union(*_forms(plan).values()) - {"affine", "residual"}:
            seen["accepted_not_affine_as_written"] += 1
            if seen["graphs"] < 2:
                seen["graphs"] += 1
                assert _same(_graph_run(m, sizes[0], p), run(m, sizes[0], p)), f"program {p}: the graph differs"
    # accepted merges that looked non-affine, refusals of each kind, and refusals that prevented
    # a wrong result are all reached
    assert seen["accepted"] >= 8 and seen["placement"] >= 12 and seen["independence"] >= 20, seen
    assert seen["accepted_not_affine_as_written"] >= 3 and seen["unchecked_differs"] >= 25, seen
    assert seen["graphs"] == 2, seen
