"""An example program outside pto: ``y = silu(scale * x) * x`` over a rows x C tensor, in two
stages per row tile (``scale_tile`` writes ``h = scale * x``, ``gate_tile`` reads it back), so
every tile gives two tasks and one dependency.

It uses only pto's public pieces (the builders, :class:`pto.program.Program`) and registers
through its own ``pyproject.toml``::

    [project.entry-points."pto.programs"]
    example = "pto_example:PROGRAM"

after which ``pto run example --scale 2``, ``pto codegen example`` and ``pto estimate example``
work like the built-in programs.
"""

from __future__ import annotations

import torch

from pto import InCore, Orchestration, Var, cdiv, emin, f32
from pto.program import Option, Program, Settings, ShapeParam, seeded_randn

CONFIGS = {"tiny": 128, "wide": 512}  # columns
ROWS = 32  # rows per tile
BLOCK = 128  # columns per parallel block


def _tile(k: InCore, name: str, src, j, dtype):
    """Load a ROWS x BLOCK tile of ``src`` at column block ``j``, in f32."""
    t = k.tile(name, ROWS, BLOCK, dtype)
    k.load(t, src, 0, j * BLOCK)
    if dtype == f32:
        return t
    f = k.tile(name + "_f", ROWS, BLOCK, f32)
    k.cast(f, t)
    return f


def _store(k: InCore, dst, j, tile, dtype):
    if dtype != f32:
        out = k.tile("out", ROWS, BLOCK, dtype)
        k.cast(out, tile)
        tile = out
    k.store(dst, 0, j * BLOCK, tile)


def scale_tile(dtype, cols: int, scale: float, target=None):
    """``h = scale * x`` on a ROWS x cols region."""
    k = InCore("scale_tile")
    x, h = k.memref("x", dtype, shape=(ROWS, cols)), k.memref("h", dtype, shape=(ROWS, cols))
    j = k.parallel("j", cdiv(cols, BLOCK))
    t = _tile(k, "t", x, j, dtype)
    k.muls(t, t, scale)
    _store(k, h, j, t, dtype)
    return k.build(target)


def gate_tile(dtype, cols: int, target=None):
    """``y = silu(h) * x`` on a ROWS x cols region."""
    k = InCore("gate_tile")
    x, h = k.memref("x", dtype, shape=(ROWS, cols)), k.memref("h", dtype, shape=(ROWS, cols))
    y = k.memref("y", dtype, shape=(ROWS, cols))
    j = k.parallel("j", cdiv(cols, BLOCK))
    tx, th = _tile(k, "tx", x, j, dtype), _tile(k, "th", h, j, dtype)
    k.silu(th, th)
    k.mul(th, th, tx)
    _store(k, y, j, th, dtype)
    return k.build(target)


def build_module(cols: int, scale: float, dtype, target=None):
    scale_f, gate_f = scale_tile(dtype, cols, scale, target), gate_tile(dtype, cols, target)
    o = Orchestration("example")
    S = o.scalar("S")
    x, y = o.input("x", S, cols, dtype), o.output("y", S, cols, dtype)
    h = o.temp("h", S, cols, dtype)
    with o.for_loop("i", 0, cdiv(S, ROWS)) as i:
        rows = emin(ROWS, S - i * ROWS)  # the last tile may be partial
        o.call(scale_f, {"x": (x, i * ROWS, 0, rows, cols), "h": (h, i * ROWS, 0, rows, cols)})
        o.call(gate_f, {"x": (x, i * ROWS, 0, rows, cols), "h": (h, i * ROWS, 0, rows, cols),
                        "y": (y, i * ROWS, 0, rows, cols)})
    return o.module()


class ExampleProgram(Program):
    name = "example"
    description = "y = silu(scale * x) * x in two stages per 32-row tile (a plugin: tests/plugins)"
    configs = CONFIGS
    options = (Option("scale", 0.5, "the factor of the first stage"),)
    outputs = ("y",)
    # a shape parameter of its own name: every command takes --rows (estimate and bench sweep it)
    shape_params = (ShapeParam("rows", 100, "rows of x"),)

    def build(self, s: Settings, shape=None):
        return build_module(CONFIGS[s.config], float(s["scale"]), s.dtype, s.target)

    def scalar_exprs(self, s):
        return {"S": Var("rows")}

    def inputs(self, s, shape, device, seed=0):
        g = torch.Generator().manual_seed(seed)
        return {"x": seeded_randn((shape["rows"], CONFIGS[s.config]), s.dtype, device, g, scale=2.0)}

    def reference(self, s, shape, inputs):
        x = inputs["x"].double()
        y = torch.nn.functional.silu(float(s["scale"]) * x) * x
        return {"y": y.to(inputs["x"].dtype)}

    def flops(self, s, shape):
        return 6.0 * shape["rows"] * CONFIGS[s.config]

    def counts(self, s, shape, adaptive=True):
        tiles = -(-shape["rows"] // ROWS)
        return {"tasks": 2 * tiles, "edges": tiles}  # each gate task waits for its scale task


PROGRAM = ExampleProgram()
