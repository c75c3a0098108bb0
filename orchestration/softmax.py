"""Row softmax of an R x C tensor in row tiles (R any size; the last tile may be partial)."""

from __future__ import annotations

import torch
from pto.incore.softmax import softmax_tile

from pto import Orchestration, Var, cdiv, emin
from pto.programs import Program, RunOptions, seeded_randn

CONFIGS = {"tiny": 256, "7b": 4096}  # columns
TILE_ROWS = 32
TILE_LEVELS = {0: 32, 4: 64, 8: 64}


def build_module(cols: int, dtype, tile_levels=None):
    levels = dict(tile_levels or TILE_LEVELS)
    f = softmax_tile(cols, dtype, rows=levels[0])
    o = Orchestration("softmax")
    R = o.scalar("R")
    x = o.input("x", R, cols, dtype)
    y = o.output("y", R, cols, dtype)
    n = o.let("n", cdiv(R, levels[0]))
    with o.for_loop("i", 0, n, tile_levels=levels) as i:
        rows = emin(i.rows, R - i * levels[0])
        o.call(f, {"x": (x, i * levels[0], 0, rows, cols), "y": (y, i * levels[0], 0, rows, cols)},
               dims={"R": i.rows})
    return o.module()


class SoftmaxProgram(Program):
    name = "softmax"
    description = "row softmax of a seq x C tensor (C = 256 tiny, 4096 7b)"
    default_seq = 100
    outputs = ("y",)

    def build(self, opts: RunOptions):
        self.check_options(opts)
        return build_module(CONFIGS[opts.config], opts.dtype)

    def scalar_exprs(self, opts):
        return {"R": Var("seq")}

    def inputs(self, opts, seq, device, seed=0):
        g = torch.Generator().manual_seed(seed)
        return {"x": seeded_randn((seq, CONFIGS[opts.config]), opts.dtype, device, g, scale=3.0)}

    def reference(self, opts, seq, inputs):
        x = inputs["x"]
        return {"y": torch.softmax(x.float(), dim=-1).to(x.dtype)}

    def flops(self, opts, seq):
        return 5.0 * seq * CONFIGS[opts.config]


PROGRAM = SoftmaxProgram()
