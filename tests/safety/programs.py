"""Small programs whose non-finite values the tests plant or provoke, with what the blame must
say about them (known by construction, not from pto)."""

from __future__ import annotations

import torch

from pto import InCore, Orchestration, cdiv, emin, f32

ROWS, COLS = 32, 64  # one row tile


def _tile(name: str, op: str | None, arg=None):
    """``y = op(x)`` on a 32 x 64 tile (``muls`` with ``arg``, or a unary op)."""
    k = InCore(name)
    R = k.dim("R", ROWS)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", R, COLS, f32)
    k.load(t, x, 0, 0)
    if op == "muls":
        k.muls(t, t, arg)
    else:
        getattr(k, op)(t, t)
    k.store(y, 0, 0, t)
    return k.build()


def _norm():
    """``y = x / rowsum(x)`` (inf / inf is NaN)."""
    k = InCore("norm_tile")
    R = k.dim("R", ROWS)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t, s = k.tile("t", R, COLS, f32), k.tile("s", R, 1, f32)
    k.load(t, x, 0, 0)
    k.rowsum(s, t)
    k.rowexpanddiv(t, t, s)
    k.store(y, 0, 0, t)
    return k.build()


SCALE = _tile("scale_tile", "muls", 10.0)
EXP = _tile("exp_tile", "exp")
NORM = _norm()
#: the calls of one iteration, in program order (task 3 i + k is call k of iteration i)
CALLS = ("scale_tile", "exp_tile", "norm_tile")


def overflow_module(adaptive: bool = False):
    """Per row tile i: h = 10 x, e = exp(h), y = e / rowsum(e). An x of 10 or more overflows
    exp in f32 (exp(100) > 3.4e38): exp_tile makes the infinity, norm_tile turns it into NaN."""
    o = Orchestration("overflow")
    S = o.scalar("S")
    x, y = o.input("x", S, COLS, f32), o.output("y", S, COLS, f32)
    h, e = o.temp("h", S, COLS, f32), o.temp("e", S, COLS, f32)
    levels = {"tile_levels": {0: ROWS, 2: 2 * ROWS}} if adaptive else {}
    with o.for_loop("i", 0, cdiv(S, ROWS), **levels) as i:
        rows = emin(i.rows if adaptive else ROWS, S - i * ROWS)
        dims = {"R": i.rows} if adaptive else {}
        for f, src, dst in ((SCALE, x, h), (EXP, h, e), (NORM, e, y)):
            o.call(f, {"x": (src, i * ROWS, 0, rows, COLS), "y": (dst, i * ROWS, 0, rows, COLS)}, dims=dims)
    return o.module()


def inputs(seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.rand(seq, COLS, generator=g) - 0.5}


def unwritten_module():
    """Row tile i of y = exp(h) where tile 1 of the temporary h is never written: the NaN every
    run's buffers start with."""
    o = Orchestration("unwritten")
    S = o.scalar("S")
    x, y = o.input("x", S, COLS, f32), o.output("y", S, COLS, f32)
    h = o.temp("h", S, COLS, f32)
    with o.for_loop("i", 0, cdiv(S, ROWS)) as i:
        rows = emin(ROWS, S - i * ROWS)
        with o.if_("i != 1"):
            o.call(SCALE, {"x": (x, i * ROWS, 0, rows, COLS), "y": (h, i * ROWS, 0, rows, COLS)})
        o.call(EXP, {"x": (h, i * ROWS, 0, rows, COLS), "y": (y, i * ROWS, 0, rows, COLS)})
    return o.module()


def interruptible() -> None:
    """``preexec_fn`` of a child the tests interrupt: SIGINT back to its default, as a terminal
    gives it (a shell's background job, a CI runner's included, inherits it ignored, and Python
    then installs no KeyboardInterrupt handler, so the child would never see the Ctrl-C)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
