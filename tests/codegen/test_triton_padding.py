"""Tiles whose dims are not powers of two on the Triton backend: each is held in a block of the
next powers of two whose padding lanes are masked (pto/codegen/triton/tileops.py).

Under the Triton interpreter, every op group on odd tiles (3x5, 12x20, 9x64, 1x576) with the
padding lanes poisoned (loads pad with NaN or an infinity, and the tensors hold the same poison
around each tile, so a padding lane that reached a logical lane would show) against

- the power-of-two kernel of the same op on the whole block, its extra lanes holding the
  neutral element of the op's reduction (0 for sums and products, -inf for max, +inf for min):
  bit-identical (the same numpy operation per lane, the same lanes reduced);
- the reference interpreter: bit-identical for correctly rounded ops, within the error bound of
  the arithmetic for sums and matmuls (both sides add the same terms in their own order) and a
  few ulps for the transcendental functions (numpy's and torch's libm each within about an ulp);

and stores that leave everything outside the logical tile alone. Then batches of residual
regions (the masked path), the softmax and bgemm programs at odd tile widths, and the LLaMA
layer end to end on both executors: at SmolLM2-135M's shape scaled down (hidden 192, 3 query
heads and 1 key/value head of 64, FFN 512: no padded tile, only the odd widths of the tensors)
and with heads of 48 (padded Q, K, V and RoPE tiles, a padded contraction in Q K^T). The padded
kernels also compile for sm_90 in bf16.
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from pto import InCore, f16, f32  # noqa: E402
from pto.backends.torch_backend import TorchBackend  # noqa: E402
from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton import render  # noqa: E402
from pto.codegen.triton.common import block_shape  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import BuildError  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from tests.codegen.tritonkit import clone_mems, run_batch, temp_cache_dir  # noqa: E402,F401 (applies itself)
from tests.opkit import rand, run_incore_triton  # noqa: E402

pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs the Triton interpreter (TRITON_INTERPRET=1)"),
              # the poisoned padding lanes compute on NaN and infinities, as they may
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]

SHAPES = [(3, 5), (12, 20), (9, 64), (1, 576)]
ULP = 2.0 ** -24  # unit roundoff of f32
SENTINEL = 7.0  # what the output tensor holds where no store may write


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _function(op, srcs, dst, pad, consts=(), dtype=f32, dst_dtype=f32, init=False, **attrs):
    """``op d, a0, a1, ..., *consts`` where tile ``a<i>`` (shape ``srcs[i]``) is loaded from
    memref ``in<i>`` with ``pad``, and ``d`` (shape ``dst``) is stored to ``out`` (loaded from it
    first with ``init``)."""
    k = InCore(f"pad_{op}")
    mems = [k.memref(f"in{i}", dtype) for i in range(len(srcs))]
    out = k.memref("out", dst_dtype)
    tiles = [k.tile(f"a{i}", r, c, dtype) for i, (r, c) in enumerate(srcs)]
    d = k.tile("d", *dst, dst_dtype)
    for t, m in zip(tiles, mems):
        k.load(t, m, 0, 0, pad=pad)
    if init:
        k.load(d, out, 0, 0, pad=pad)
    getattr(k, op)(d, *tiles, *consts, **attrs)
    k.store(out, 0, 0, d)
    return k.build()


def _embed(x: torch.Tensor, shape, fill: float) -> torch.Tensor:
    t = torch.full(shape, fill, dtype=x.dtype)
    t[:x.shape[0], :x.shape[1]] = x
    return t


def _run(fn, runner, datas, dst, around, init=None, whole=False):
    """Run ``fn`` with input ``i`` holding ``datas[i]`` in the top-left corner of a tensor of the
    block's shape, ``around`` elsewhere (the region: the data, or the whole tensor with
    ``whole``); the output region ``dst`` of a block-shaped tensor of SENTINEL (``init`` in its
    corner). Returns the output tensor."""
    regions = {}
    for i, x in enumerate(datas):
        t = _embed(x, block_shape(tuple(x.shape)), around)
        regions[f"in{i}"] = (t, 0, 0, *(t.shape if whole else x.shape))
    dt = fn.memrefs[-1].dtype.torch
    out = torch.full(block_shape(dst), SENTINEL, dtype=dt)
    if init is not None:
        out[:dst[0], :dst[1]] = init
    regions["out"] = (out, 0, 0, *(out.shape if whole else dst))
    runner(fn, regions, {})
    return out


def _check(op, srcs, dst, datas, neutral, tol, pad=math.nan, init=None, **kw):
    """The padded kernel against the power-of-two kernel of the block (bit-identical on the
    logical lanes) and the reference interpreter (``tol(got, want)``: the largest difference
    allowed per element, None: bit-identical); nothing written outside the logical tile."""
    fn = _function(op, srcs, dst, pad, init=init is not None, **kw)
    blocks = [block_shape(s) for s in srcs]
    full = _function(op, blocks, block_shape(dst), pad, init=init is not None, **kw)
    got = _run(fn, run_incore_triton, datas, dst, pad, init)
    r, c = dst
    outside = torch.ones_like(got, dtype=torch.bool)
    outside[:r, :c] = False
    assert (got[outside] == SENTINEL).all(), f"{op}: a store wrote outside the {r}x{c} tile"
    pinit = None if init is None else _embed(init, block_shape(dst), neutral)
    block = _run(full, run_incore_triton, datas, block_shape(dst), neutral, pinit, whole=True)
    torch.testing.assert_close(got[:r, :c], block[:r, :c], rtol=0, atol=0, equal_nan=True, msg=op)
    want = _run(fn, run_incore, datas, dst, pad, init)[:r, :c].double()
    got = got[:r, :c].double()
    assert torch.isfinite(want).all(), f"{op}: the reference is not finite; pick other inputs"
    if tol is None:
        assert torch.equal(got, want), f"{op}: differs from the reference, at most {(got - want).abs().max()}"
    else:
        err, bound = (got - want).abs(), tol(got, want)
        assert bool((err <= bound).all()), f"{op}: worst error / bound {(err / bound).max()}"


def _ulps(n):
    """``n`` ulps of the reference value (of the smallest normal near zero)."""
    def tol(got, want):
        return n * torch.from_numpy(np.spacing(np.abs(want.float().numpy()))).double().clamp_min(2.0 ** -126)
    return tol


def _rand(shape, rng, **kw):
    return rand(shape, DType.F32, rng, **kw)


# lane-wise ops: exact where both sides round correctly ------------------------------------------

EXACT_UNARY = ("neg", "abs", "relu", "recip")
# numpy's (the interpreter's) and torch's own approximations (torch's f32 sqrt on the CPU is not
# correctly rounded either: it is within an ulp)
ULPS_UNARY = ("sqrt", "exp", "exp2", "log", "rsqrt", "silu")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "min"])
def test_binary_and_tile_scalar(op, shape, rng):
    a, b = _rand(shape, rng), _rand(shape, rng, away_from_zero=(op == "div"))
    _check(op, [shape, shape], shape, [a, b], 1.0, None)
    _check(op + "s", [shape], shape, [a], 1.0, None, consts=(-1.5 if op == "div" else 0.75,))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", EXACT_UNARY + ULPS_UNARY)
def test_unary(op, shape, rng):
    a = _rand(shape, rng, positive=op in ("log", "sqrt", "rsqrt"), away_from_zero=(op == "recip"))
    _check(op, [shape], shape, [a], 1.0, None if op in EXACT_UNARY else _ulps(4))


# reductions: the padding lanes hold the neutral element ------------------------------------------

NEUTRAL = {"sum": 0.0, "max": -math.inf, "min": math.inf}


def _sum_bound(x: torch.Tensor, axis: int):
    """Both sides add the same n terms in their own order: each within (n - 1) u sum|x|."""
    n = x.shape[axis]
    s = x.double().abs().sum(dim=axis, keepdim=True)
    return lambda got, want: 2 * (n - 1) * ULP * s + 2.0 ** -149


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("pad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_reduce(axis, kind, pad, shape, rng):
    """An infinity in a padding lane would win a max or a min, a NaN spoil any of them."""
    a = _rand(shape, rng)
    ax = 1 if axis == "row" else 0
    dst = (shape[0], 1) if axis == "row" else (1, shape[1])
    _check(f"{axis}{kind}", [shape], dst, [a], NEUTRAL[kind], _sum_bound(a, ax) if kind == "sum" else None, pad=pad)


# broadcasts, masks, fill, cast: lane-wise ---------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", ""])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_broadcast(axis, op, shape, rng):
    vshape = (shape[0], 1) if axis == "row" else (1, shape[1])
    a, v = _rand(shape, rng), _rand(vshape, rng, away_from_zero=(op == "div"))
    if op:
        _check(f"{axis}expand{op}", [shape, vshape], shape, [a, v], 1.0, None)
    else:
        _check(f"{axis}expand", [vshape], shape, [v], 1.0, None)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_masks_fill_and_cast(shape, rng):
    """The mask ops keep their meaning on the logical lanes (their bounds inside the tile)."""
    r, c = shape
    a = _rand(shape, rng)
    _check("mask_causal", [shape], shape, [a], 1.0, None, consts=(c // 2 - r // 2,), fill=-3.0)
    _check("mask_cols", [shape], shape, [a], 1.0, None, consts=((c + 1) // 2,), fill=-3.0)
    _check("mask_rows", [shape], shape, [a], 1.0, None, consts=((r + 1) // 2,), fill=-3.0)
    _check("full", [], shape, [], 1.0, None, consts=(2.5,))
    _check("cast", [shape], shape, [a * 3], 1.0, None, dst_dtype=f16)


# matmul: the contraction's padding lanes are zero in both operands ---------------------------------

MKN = [(3, 5, 7), (12, 20, 24), (9, 64, 40), (1, 576, 3)]


@pytest.mark.parametrize("mkn", MKN, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pad", [math.nan, math.inf])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("acc_op", ["matmul", "matmul_acc"])
def test_matmul(acc_op, ta, tb, pad, mkn, rng):
    """Blocks of 16 and up in every dim take tl.dot (12x20x24, 9x64x40), the others the
    broadcast-multiply-sum; f32 products of f32 values round, so each side is within
    gamma_K sum|a||b| of the exact sum, and one more rounding of the accumulation."""
    M, K, N = mkn
    a = _rand((K, M) if ta else (M, K), rng)
    b = _rand((N, K) if tb else (K, N), rng)
    A, B = (a.T if ta else a).double(), (b.T if tb else b).double()
    init = _rand((M, N), rng) if acc_op == "matmul_acc" else None
    g = K * ULP / (1 - K * ULP)
    mag = A.abs() @ B.abs() + (0 if init is None else init.double().abs())

    def tol(got, want):
        return 2 * g * mag + 2 * ULP * want.abs() + 2.0 ** -149

    _check(acc_op, [tuple(a.shape), tuple(b.shape)], (M, N), [a, b], 0.0, tol, pad=pad, init=init, ta=ta, tb=tb)


@pytest.mark.parametrize("mkn", [(12, 20, 24), (9, 64, 40), (17, 33, 18)], ids=lambda s: "x".join(map(str, s)))
def test_matmul_f16_operands(mkn, rng):
    """Half-precision operands through tl.dot (exact products, f32 sums)."""
    M, K, N = mkn
    a, b = rand((M, K), DType.F16, rng), rand((K, N), DType.F16, rng)
    mag = a.double().abs() @ b.double().abs()

    def tol(got, want):
        return 2 * (K - 1) * ULP * mag + 2.0 ** -149

    _check("matmul", [(M, K), (K, N)], (M, N), [a, b], 0.0, tol, dtype=f16)


# the masked path: batches of residual regions -----------------------------------------------------------


def _odd_rowwise_fn():
    """A 12x20 row softmax with a 20x24 projection and a column sum: every padded axis reduced
    or contracted, loads padded with -inf (a residual region's columns drop out of the max and
    the sum; its rows, NaN after the softmax, are zeroed before the product)."""
    k = InCore("odd_rowwise")
    x, w, y, z = k.memref("x", f32), k.memref("w", f32), k.memref("y", f32), k.memref("z", f32)
    t, m = k.tile("t", 12, 20, f32), k.tile("m", 12, 1, f32)
    wt, p, cs = k.tile("wt", 20, 24, f32), k.tile("p", 12, 24, f32), k.tile("cs", 1, 24, f32)
    k.load(t, x, 0, 0, pad=-math.inf)
    k.rowmax(m, t)
    k.rowexpandsub(t, t, m)
    k.exp(t, t)
    k.rowsum(m, t)
    k.rowexpanddiv(t, t, m)
    k.mask_rows(t, t, x.rows, fill=0.0)
    k.load(wt, w, 0, 0)
    k.matmul(p, t, wt)
    k.colsum(cs, p)
    k.store(y, 0, 0, p)
    k.store(z, 0, 0, cs)
    return k.build()


@pytest.mark.parametrize("full", [False, True], ids=["residual", "full"])
def test_batch_of_odd_tiles_matches_torch_backend(full):
    g = torch.Generator().manual_seed(7 + full)
    size = 9
    x, w = torch.randn(60, 50, generator=g), torch.randn(20, 24, generator=g)
    y, z = torch.randn(12 * size, 30, generator=g), torch.randn(size, 30, generator=g)
    shapes = [(12, 20) if full or i % 3 == 0 else (1 + i, 3 + 2 * i) for i in range(size)]

    def rb(t, regs):
        return RegionBatch(t, *(torch.tensor(v) for v in zip(*regs)))

    mems = {"x": rb(x, [(4 * i, 2 * i, r, c) for i, (r, c) in enumerate(shapes)]),
            "w": rb(w, [(0, 0, c, 24) for _, c in shapes]),
            "y": rb(y, [(12 * i, 3, r, 24) for i, (r, _) in enumerate(shapes)]),
            "z": rb(z, [(i, 1, 1, 24) for i in range(size)])}
    ref, got = clone_mems(mems), clone_mems(mems)
    run_batch(_odd_rowwise_fn(), ref, {}, size, TorchBackend())
    be = TritonBackend("cpu")
    run_batch(_odd_rowwise_fn(), got, {}, size, be)
    if full:  # the mask-free path: only the padding lanes masked
        assert all(gr.flags["EVEN_x"] for gr in be.groups(TaskBatch(_odd_rowwise_fn(), mems, {}, size)))
    for name in ("y", "z"):
        torch.testing.assert_close(got[name].tensor, ref[name].tensor, rtol=1e-5, atol=1e-5)


# build errors ------------------------------------------------------------------------------------------


def test_a_block_beyond_tritons_limit_is_a_build_error():
    k = InCore("huge")
    x = k.memref("x", f32)
    t = k.tile("t", 3, 300000, f32)
    k.load(t, x, 0, 0)
    k.store(x, 0, 0, t)
    with pytest.raises(BuildError, match=r"^`huge`: tile `t` is 3x300000, held as a 4x524288 block of 2097152 "
                                         r"elements; a Triton block holds at most 1048576$"):
        render(k.build())
