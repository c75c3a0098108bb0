"""Graphs for the persistent executor's split tests: a random task graph (a seeded program of
calls to four small f32 InCore functions, one, two or three memrefs, some with a parallel axis
of two items, on random row blocks of a few tensors, so the runtime's dependencies, read after
write, write after read, write after write, make a DAG of many levels and branches), and the
plan of a real decode step."""

from __future__ import annotations

import random

import torch

from pto import InCore, Orchestration, f32

ROWS, COLS, BLOCKS = 4, 8, 4  # a row block's rows, every tensor's columns, row blocks per tensor
HALF = COLS // 2


def _copy():
    """``y = x``, two items (one per column half)."""
    k = InCore("copy_half")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", 2)
    t = k.tile("t", ROWS, HALF, f32)
    k.load(t, x, 0, h * HALF)
    k.store(y, 0, h * HALF, t)
    return k.build()


def axpy(rows: int = ROWS, cols: int = COLS, name: str = "axpy_block"):
    """``y += x / 2`` over ``rows`` x ``cols`` (y read and written), one item."""
    k = InCore(name)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t, u = k.tile("t", rows, cols, f32), k.tile("u", rows, cols, f32)
    k.load(t, x, 0, 0)
    k.load(u, y, 0, 0)
    k.muls(t, t, 0.5)
    k.add(u, u, t)
    k.store(y, 0, 0, u)
    return k.build()


def _mix():
    """``z = x * w - z / 4`` (three memrefs), two items."""
    k = InCore("mix_half")
    x, w, z = k.memref("x", f32), k.memref("w", f32), k.memref("z", f32)
    h = k.parallel("h", 2)
    a, b, c = (k.tile(n, ROWS, HALF, f32) for n in ("a", "b", "c"))
    k.load(a, x, 0, h * HALF)
    k.load(b, w, 0, h * HALF)
    k.load(c, z, 0, h * HALF)
    k.mul(a, a, b)
    k.muls(c, c, 0.25)
    k.sub(a, a, c)
    k.store(z, 0, h * HALF, a)
    return k.build()


def _negate():
    """``x = -x`` in place (one memref), one item."""
    k = InCore("negate_block")
    x = k.memref("x", f32)
    t = k.tile("t", ROWS, COLS, f32)
    k.load(t, x, 0, 0)
    k.muls(t, t, -1.0)
    k.store(x, 0, 0, t)
    return k.build()


COPY, AXPY, MIX, NEGATE = _copy(), axpy(), _mix(), _negate()


def random_module(seed: int, calls: int = 40):
    """The program of ``seed``: every block of the temporaries and the output copied from the
    input first (so nothing reads an unwritten element), then ``calls`` random calls."""
    rng = random.Random(seed)
    o = Orchestration(f"split_random_{seed}")
    n = ROWS * BLOCKS
    a = o.input("a", n, COLS, f32)
    written = [o.temp(name, n, COLS, f32) for name in ("b", "c", "d")] + [o.output("y", n, COLS, f32)]

    def block(t, i):
        return (t, i * ROWS, 0, ROWS, COLS)

    for t in written:
        for i in range(BLOCKS):
            o.call(COPY, {"x": block(a, i), "y": block(t, i)})
    for _ in range(calls):
        fn = rng.choice((COPY, AXPY, MIX, NEGATE))
        src = rng.choice([a, *written])
        dst = rng.choice(written)
        i, j, k = (rng.randrange(BLOCKS) for _ in range(3))
        if fn is NEGATE:
            o.call(fn, {"x": block(dst, i)})
        elif fn is MIX:
            o.call(fn, {"x": block(src, i), "w": block(rng.choice([a, *written]), j), "z": block(dst, k)})
        else:
            o.call(fn, {"x": block(src, i), "y": block(dst, k)})
    return o.module()


def inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.rand(ROWS * BLOCKS, COLS, generator=g) - 0.5}


def decode_plan(config: str, runs: int = 0, **tiles):
    """The persistent executor's plan of ``config``'s decode step (bf16, batch 1, a 1,024-slot
    cache, the executor's tiles, for an H200, ``tiles`` replaced in them; ``runs``:
    :func:`pto.exec.plan.make_plan`'s) with the Triton backend's specializations, and that
    backend (on the CPU: it estimates, it compiles nothing)."""
    from dataclasses import replace

    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.backends.triton import TritonBackend
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get as target

    cfg = CONFIGS[config]
    tiling = replace(tiling_for_executor(cfg, "persistent"), **tiles)
    built = build_module_graph(build_step(cfg, DType.BF16, target("cuda_h200"), 1, tiling, cache=1024),
                               {"B": 1, "C": 1024})
    try:
        backend = TritonBackend("cpu")
        return make_plan(built.graph, list(built.graph.tensor_ids), {}, flags=backend.task_flags, runs=runs), backend
    finally:
        built.graph.close()
