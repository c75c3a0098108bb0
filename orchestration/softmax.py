"""Row softmax of an R x C tensor in row tiles (R any size; the last tile may be partial)."""

from __future__ import annotations

import torch
from pto.incore.softmax import softmax_tile

from pto import Orchestration, Var, cdiv, emin
from pto.machine.target import Target
from pto.passes.expansion.binary_expansion import tile_levels
from pto.passes.tiling import compute_tile_shape
from pto.program import Program, Settings, ShapeParam, seeded_randn

CONFIGS = {"tiny": 256, "7b": 4096}  # columns
CHUNK = 256  # columns a task holds on chip at a time


def fit_tiles(cols: int, dtype, target) -> tuple[int, int]:
    """(rows, chunk): chunks of at most CHUNK columns (and of the target's elementwise tile
    width), then the tallest power-of-two row count up to 64 whose tiles fit the target."""
    from pto.errors import SramError

    chunk = min(cols, CHUNK, compute_tile_shape(dtype, target)[1])
    rows = 64
    while rows >= 1:
        try:
            softmax_tile(cols, dtype, rows, chunk, target)
            return rows, chunk
        except SramError:
            rows //= 2
    raise SramError(f"softmax: no tile of {chunk} columns fits target {target.name}")


def build_module(cols: int, dtype, target: Target):
    top, chunk = fit_tiles(cols, dtype, target)
    base = min(top, 32)
    levels = tile_levels(base, top)
    f = softmax_tile(cols, dtype, rows=top, chunk=chunk, target=target)
    o = Orchestration("softmax")
    R = o.scalar("R")
    x = o.input("x", R, cols, dtype)
    y = o.output("y", R, cols, dtype)
    n = o.let("n", cdiv(R, base))
    attrs = dict(tile_levels=levels) if len(levels) == 1 else dict(tile_levels=levels, max_range=64, min_range=2)
    with o.for_loop("i", 0, n, **attrs) as i:
        rows = emin(i.rows, R - i * base)
        o.call(f, {"x": (x, i * base, 0, rows, cols), "y": (y, i * base, 0, rows, cols)}, dims={"R": i.rows})
    return o.module()


class SoftmaxProgram(Program):
    name = "softmax"
    description = "row softmax of a seq x C tensor (C = 256 tiny, 4096 7b)"
    configs = CONFIGS
    shape_params = (ShapeParam("seq", 100, "rows of x"),)
    outputs = ("y",)

    def build(self, s: Settings, shape=None):
        return build_module(CONFIGS[s.config], s.dtype, s.target)

    def scalar_exprs(self, s):
        return {"R": Var("seq")}

    def inputs(self, s, shape, device, seed=0):
        g = torch.Generator().manual_seed(seed)
        return {"x": seeded_randn((shape["seq"], CONFIGS[s.config]), s.dtype, device, g, scale=3.0)}

    def reference(self, s, shape, inputs):
        x = inputs["x"]
        return {"y": torch.softmax(x.float(), dim=-1).to(x.dtype)}

    def flops(self, s, shape):
        return 5.0 * shape["seq"] * CONFIGS[s.config]


PROGRAM = SoftmaxProgram()
