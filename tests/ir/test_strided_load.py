"""A strided load (``load(..., step=s)``: every s-th row of the region from the offset) against
numpy slicing on seeded random data: inside the region, overhanging its last row (the pad), at
a loop-varying offset, through the reference interpreter and the Triton backend (under the
Triton interpreter); and the rules around it (the region it spans, no descriptor, no fusion)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pto import InCore, f32
from pto.errors import BuildError
from pto.interp.incore import run_incore


def strided(rows: int, cols: int, step: int, start: int, region_rows: int, pad: float):
    """``y[r] = x[start + r * step]`` for ``rows`` rows (``pad`` past the region's rows)."""
    k = InCore("strided")
    x = k.memref("x", f32, shape=(region_rows, cols))
    y = k.memref("y", f32, shape=(rows, cols))
    t = k.tile("t", rows, cols, f32)
    k.load(t, x, start, 0, pad=pad, step=step)
    k.store(y, 0, 0, t)
    return k.build()


def want_of(src: np.ndarray, rows: int, step: int, start: int, pad: float) -> np.ndarray:
    idx = start + step * np.arange(rows)
    out = np.full((rows, src.shape[1]), pad, np.float32)
    inside = idx < src.shape[0]
    out[inside] = src[idx[inside]]
    return out


CASES = [  # rows, step, start, region rows: inside, overhanging, a tile of 3 rows (padded to 4)
    (4, 3, 0, 12),
    (4, 9, 2, 27),
    (8, 5, 1, 20),
    (3, 4, 3, 16),
]


def _runners():
    out = [("interp", run_incore)]
    if os.environ.get("TRITON_INTERPRET") == "1":
        from tests.opkit import run_incore_triton
        out.append(("triton", run_incore_triton))
    return out


@pytest.mark.parametrize("rows,step,start,region", CASES)
@pytest.mark.parametrize("runner", [pytest.param("interp"), pytest.param("triton", marks=pytest.mark.interpret)])
def test_strided_load_reads_every_step_th_row(rows, step, start, region, runner):
    if runner == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    run = dict(_runners())[runner]
    g = torch.Generator().manual_seed(rows * 100 + step)
    src = torch.randn(region, 16, generator=g)
    fn = strided(rows, 16, step, start, region, pad=float("-inf"))
    dst = torch.randn(rows, 16, generator=g)
    run(fn, {"x": (src, 0, 0, region, 16), "y": (dst, 0, 0, rows, 16)})
    assert np.array_equal(dst.numpy(), want_of(src.numpy(), rows, step, start, float("-inf")))


def test_strided_load_in_a_loop_and_from_an_offset_region():
    """A loop-varying offset into a region that starts inside a larger tensor: row h of every
    group of ``step`` rows (the decode combine's read of one head's partial states)."""
    heads, chunks, D = 3, 5, 8
    k = InCore("per_head")
    x = k.memref("x", f32)
    y = k.memref("y", f32)
    t = k.tile("t", 8, D, f32)
    s = k.tile("s", 1, D, f32)
    with k.for_range("h", 0, heads) as h:
        k.load(t, x, h, 0, step=heads)
        k.colsum(s, t)
        k.store(y, h, 0, s)
    fn = k.build()
    g = torch.Generator().manual_seed(11)
    big = torch.randn(2 + chunks * heads + 4, D, generator=g)
    out = torch.zeros(heads, D)
    run_incore(fn, {"x": (big, 2, 0, chunks * heads, D), "y": (out, 0, 0, heads, D)})
    region = big[2:2 + chunks * heads].double().numpy()
    want = np.stack([region[h::heads].sum(0) for h in range(heads)])
    np.testing.assert_allclose(out.double().numpy(), want, rtol=1e-6, atol=1e-6)


def test_the_region_a_strided_load_spans():
    """The rows a strided load reaches are ``(rows - 1) * step + 1`` from its offset: the
    extent the analysis derives for a memref without a declared shape."""
    from pto.ir.analysis import param_access

    k = InCore("span")
    x = k.memref("x", f32)
    y = k.memref("y", f32)
    t = k.tile("t", 4, 16, f32)
    k.load(t, x, 2, 0, step=3)
    k.store(y, 0, 0, t)
    acc = param_access(k.build())
    assert (int(acc["x"].rows.value), int(acc["y"].rows.value)) == (2 + 3 * 3 + 1, 4)


@pytest.mark.parametrize("step", [0, -2, 1.5, True])
def test_a_step_that_is_not_a_positive_integer_is_refused(step):
    k = InCore("bad")
    x = k.memref("x", f32)
    t = k.tile("t", 4, 16, f32)
    with pytest.raises(BuildError, match="step must be a positive integer"):
        k.load(t, x, 0, 0, step=step)


def test_a_strided_load_prints_and_parses():
    from pto.ir.nodes import Module
    from pto.text import format_module, parse_module

    fn = strided(4, 16, 3, 1, 12, pad=0.0)
    mod = Module((fn,), fn.name)
    text = format_module(mod)
    assert "{step = 3}" in text
    assert parse_module(text, verify=False) == mod


def test_a_strided_load_takes_no_descriptor():
    """A tensor descriptor reads whole blocks of rows: a strided load keeps the pointer load."""
    from pto.codegen.triton.tma import tma_memrefs

    k = InCore("loop")
    x = k.memref("x", f32)
    w = k.memref("w", f32)
    y = k.memref("y", f32)
    a, b, acc = k.tile("a", 64, 64, f32), k.tile("b", 64, 64, f32), k.tile("acc", 64, 64, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, 256, 64) as kk:
        k.load(a, x, 0, kk, step=2)
        k.load(b, w, kk, 0)
        k.matmul_acc(acc, a, b)
    k.store(y, 0, 0, acc)
    qualified = tma_memrefs(k.build())
    assert "x" not in qualified and "w" in qualified
