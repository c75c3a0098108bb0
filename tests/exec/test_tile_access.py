"""The torch backend's loads and stores (pto/evaluator/regions.py): a batch of tasks moves
exactly the elements a task-by-task numpy reference moves, whatever the layout of the regions
(one task, tasks whose tiles step evenly, irregular ones, partial tiles with padding and
inactive parallel instances) and whatever the offsets (ints, per-task scalars, the parallel
index, loop variables with bounds per task)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pto import InCore, cdiv, f32
from pto.data.batch import RegionBatch
from pto.evaluator.machine import run_incore_batch
from pto.ir.expr import Var, as_expr

RB, CB = 4, 8  # tile rows and columns
SHAPE = (40, 48)  # every tensor


def _shift_copy(load_col, store_col, parallel=True):
    """``y = x + 1`` tile by tile: rows in a loop to the scalar ``nr`` (bounds per task), column
    blocks up to the scalar ``nc`` on the parallel axis; the load at column ``load_col(j, s)``,
    the store at ``store_col(j, s)``."""
    k = InCore("shift_copy")
    x, y = k.memref("x", f32), k.memref("y", f32)
    nr = k.scalar("nr")
    j = k.parallel("j", cdiv(k.scalar("nc"), CB)) if parallel else 0
    s = Var("s")
    if any("s" in as_expr(f(j, s)).free_vars() for f in (load_col, store_col)):
        k.scalar("s")  # declared where used (an unused parameter is an error)
    t = k.tile("t", RB, CB, f32)
    with k.for_range("i", 0, nr, RB) as i:
        k.load(t, x, i, load_col(j, s), pad=-1.0)
        k.adds(t, t, 1.0)
        k.store(y, i, store_col(j, s), t)
    return k.build()


def _run(fn, regions, shifts):
    """One batch over ``regions`` ([(row0, col0, rows, cols)] per task, the same for x and y)."""
    x = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32).view(SHAPE) / 7
    y = torch.full(SHAPE, float("nan"))
    cols = [torch.tensor(v) for v in zip(*regions)]
    mems = {"x": RegionBatch(x, *cols), "y": RegionBatch(y, *cols)}
    scalars = {"s": torch.tensor(shifts), "nr": cols[2], "nc": cols[3]}
    run_incore_batch(fn, mems, {p.name: scalars[p.name] for p in fn.scalars}, len(regions))
    return x.numpy(), y


def _reference(x, regions, shifts, load_col, store_col):
    """Task by task, element by element: what each task's tiles move."""
    y = np.full(SHAPE, np.nan, dtype=np.float32)
    for (r0, c0, nr, nc), s in zip(regions, shifts):
        for j in range(-(-nc // CB)):
            for i in range(0, nr, RB):
                for a in range(RB):
                    for b in range(CB):
                        yr, yc = i + a, store_col(j, s) + b
                        if not (0 <= yr < nr and 0 <= yc < nc):
                            continue  # stores skip elements outside the region
                        xr, xc = i + a, load_col(j, s) + b
                        inside = 0 <= xr < nr and 0 <= xc < nc
                        v = x[r0 + xr, c0 + xc] if inside else np.float32(-1.0)
                        y[r0 + yr, c0 + yc] = np.float32(v) + np.float32(1.0)
    return torch.from_numpy(y)


LAYOUTS = {
    "one task": [(3, 5, 8, 16)],
    "stacked": [(4 * t, 0, 4, 24) for t in range(6)],  # consecutive row tiles: starts step evenly
    "scattered": [(0, 0, 8, 16), (12, 24, 4, 8), (8, 40, 8, 8), (24, 8, 12, 32)],
    "ragged": [(0, 0, 5, 11), (10, 20, 3, 17), (20, 1, 9, 8), (31, 30, 7, 18)],  # partial tiles
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("offsets", ["aligned", "overlapping", "same tile", "per-task shift"])
def test_batch_moves_what_tasks_move(layout, offsets):
    regions = LAYOUTS[layout]
    shifts = [t % 3 for t in range(len(regions))]
    load_col = {"aligned": lambda j, s: j * CB, "overlapping": lambda j, s: j * (CB // 2),
                "same tile": lambda j, s: 0, "per-task shift": lambda j, s: j * CB + s}[offsets]
    fn = _shift_copy(load_col, lambda j, s: j * CB)
    x, y = _run(fn, regions, shifts)
    want = _reference(x, regions, shifts, load_col, lambda j, s: j * CB)
    torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_equals_tasks_one_by_one(layout):
    """Each task alone (a batch of one: its region's first element an int) gives the same bits."""
    regions = LAYOUTS[layout]
    shifts = [1] * len(regions)
    fn = _shift_copy(lambda j, s: j * CB + s, lambda j, s: j * CB)
    _, batched = _run(fn, regions, shifts)
    alone = torch.full(SHAPE, float("nan"))
    for reg in regions:
        _, y = _run(fn, [reg], [1])
        r0, c0, nr, nc = reg
        alone[r0:r0 + nr, c0:c0 + nc] = y[r0:r0 + nr, c0:c0 + nc]
    torch.testing.assert_close(batched, alone, rtol=0, atol=0, equal_nan=True)


def test_tiles_of_one_row_band_store_side_by_side():
    """Without a parallel axis: the loop's tiles of different tasks stacked in one column band."""
    regions = [(8 * t, 16, 8, 8) for t in range(5)]
    fn = _shift_copy(lambda j, s: 0, lambda j, s: 0, parallel=False)
    x, y = _run(fn, regions, [0] * len(regions))
    want = _reference(x, regions, [0] * len(regions), lambda j, s: 0, lambda j, s: 0)
    torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)
