"""Every tile op of the ISA against a float64 numpy reference on seeded random inputs, for every
dtype the reference interpreter supports on the CPU (f32, f16, bf16); the elementwise, unary,
reduction and broadcast ops also through the Triton backend (f32 and f16 under the Triton
interpreter, which must agree with the reference interpreter)."""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import pytest
import torch

from pto.ir.dtypes import DType
from pto.ir.ops import GROUPS, Op
from tests.opkit import BINARY_REF, UNARY_REF, assert_close, f64, one_op, rand, triton_vs_interp

DTYPES = [DType.F32, DType.F16, DType.BF16]
R, C = 8, 16
@pytest.fixture(params=["interp", pytest.param("triton", marks=pytest.mark.interpret)])
def run_op(request):
    """``one_op`` through the reference interpreter, or through the Triton backend checked
    against the reference interpreter (the Triton interpreter rounds bf16 unlike a GPU: skipped)."""
    if request.param == "interp":
        return one_op
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":  # CPU tensors: the Triton interpreter's mode
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")

    def both(op, dst_shape, srcs, dtype, **kw):
        if DType.BF16 in (dtype, kw.get("dst_dtype")):
            pytest.skip("bf16 under the Triton interpreter")
        return triton_vs_interp(op, dst_shape, srcs, dtype, **kw)

    return both


@pytest.fixture
def rng(request):
    # a stable seed per test (str hashes change between processes)
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary(op, dtype, rng, run_op):
    a = rand((R, C), dtype, rng)
    b = rand((R, C), dtype, rng, away_from_zero=(op == "div"))
    got = run_op(op, (R, C), [a, b], dtype)
    assert_close(got, BINARY_REF[op](f64(a), f64(b)), dtype, op)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_tile_scalar(op, dtype, rng, run_op):
    a = rand((R, C), dtype, rng)
    s = 0.75 if op != "div" else -1.5
    got = run_op(op + "s", (R, C), [a], dtype, scalars=(s,))
    assert_close(got, BINARY_REF[op](f64(a), s), dtype, op + "s")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary(op, dtype, rng, run_op):
    positive = op in ("log", "sqrt", "rsqrt")
    a = rand((R, C), dtype, rng, positive=positive, away_from_zero=(op == "recip"))
    got = run_op(op, (R, C), [a], dtype)
    assert_close(got, UNARY_REF[op](f64(a)), dtype, op)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_reduce(axis, kind, dtype, rng, run_op):
    a = rand((R, C), dtype, rng)
    ref = {"sum": np.sum, "max": np.max, "min": np.min}[kind](f64(a), axis=1 if axis == "row" else 0,
                                                              keepdims=True)
    shape = (R, 1) if axis == "row" else (1, C)
    got = run_op(f"{axis}{kind}", shape, [a], dtype, dst_dtype=DType.F32)
    # f32 accumulation of values exact in f32: sums differ from float64 only by f32 rounding
    # (relative to the largest |sum|; a 16-term sum stays well inside 1e-5)
    assert_close(got, ref, DType.F32, f"{axis}{kind}") if kind != "sum" else \
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5 * max(np.abs(ref).max(), 1.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", ""])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_broadcast(axis, op, dtype, rng, run_op):
    a = rand((R, C), dtype, rng)
    vshape = (R, 1) if axis == "row" else (1, C)
    v = rand(vshape, dtype, rng, away_from_zero=(op == "div"))
    name = f"{axis}expand{op}"
    if op:
        got = run_op(name, (R, C), [a, v], dtype)
        ref = BINARY_REF[op](f64(a), f64(v))
    else:
        got = run_op(name, (R, C), [v], dtype)
        ref = np.broadcast_to(f64(v), (R, C))
    assert_close(got, ref, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("acc_op", ["matmul", "matmul_acc"])
@pytest.mark.parametrize("mkn", [(8, 32, 16), (16, 32, 16)], ids=["8rows", "16rows"])
def test_matmul(mkn, acc_op, ta, tb, dtype, rng, run_op):
    """Through the Triton backend, 8-row products take the broadcast-multiply fallback and
    16-row ones tl.dot."""
    M, K, N = mkn
    a = rand((K, M) if ta else (M, K), dtype, rng)
    b = rand((N, K) if tb else (K, N), dtype, rng)
    A = f64(a).T if ta else f64(a)
    B = f64(b).T if tb else f64(b)
    ref = A @ B
    init = None
    if acc_op == "matmul_acc":
        init = rand((M, N), DType.F32, rng)
        ref = ref + f64(init)
    got = run_op(acc_op, (M, N), [a, b], dtype, dst_dtype=DType.F32, init_dst=init, ta=ta, tb=tb)
    # products of dtype values are exact in f32; only the f32 accumulation rounds
    assert_close(got, ref, DType.F32 if dtype == DType.F32 else DType.F16, acc_op)


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.parametrize("dst", DTYPES, ids=str)
def test_cast(src, dst, rng):
    a = rand((R, C), src, rng)
    got = one_op("cast", (R, C), [a], src, dst_dtype=dst)
    coarser = dst if dst.itemsize < src.itemsize or dst == DType.BF16 else src
    assert_close(got, f64(a), coarser if coarser != DType.F32 else DType.F32, "cast")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mov(dtype, rng):
    a = rand((R, C), dtype, rng)
    got = one_op("mov", (R, C), [a], dtype)
    assert np.array_equal(got, f64(a))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full(dtype):
    got = one_op("full", (R, C), [], dtype, scalars=(2.5,))
    assert np.array_equal(got, np.full((R, C), 2.5))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("diag", [-3, 0, 5])
def test_mask_causal(diag, dtype, rng):
    a = rand((R, C), dtype, rng)
    got = one_op("mask_causal", (R, C), [a], dtype, scalars=(diag,))
    r, c = np.indices((R, C))
    ref = np.where(c <= r + diag, f64(a), -math.inf)
    assert np.array_equal(np.isinf(got), np.isinf(ref))
    assert_close(np.where(np.isinf(ref), 0, got), np.where(np.isinf(ref), 0, ref), dtype, "mask_causal")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,axis", [("mask_cols", 1), ("mask_rows", 0)])
def test_mask_edge(op, axis, dtype, rng):
    a = rand((R, C), dtype, rng)
    n = 5
    got = one_op(op, (R, C), [a], dtype, scalars=(n,), fill=-7.0)
    idx = np.indices((R, C))[axis]
    assert np.array_equal(got, np.where(idx < n, f64(a), -7.0))


def test_load_pad_and_store_mask():
    """Loads outside the region's valid extent read `pad`; stores outside it are skipped."""
    from pto import InCore, f32
    from pto.interp.incore import run_incore

    k = InCore("edge")
    x = k.memref("x", f32)
    y = k.memref("y", f32)
    t = k.tile("t", 4, 4, f32)
    k.load(t, x, 0, 0, pad=-1.0)
    k.store(y, 0, 0, t)
    fn = k.build()
    src = torch.arange(16, dtype=torch.float32).view(4, 4)
    dst = torch.full((4, 4), 99.0)
    run_incore(fn, {"x": (src, 1, 1, 2, 3), "y": (dst, 0, 0, 3, 2)})
    want = torch.full((4, 4), 99.0)
    want[:2, :2] = src[1:3, 1:3]
    want[2, :2] = -1.0  # padded rows that fall inside y's valid 3x2 region
    assert torch.equal(dst, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("acc", ["f32", "own"])
def test_allreduce_one_rank(dtype, acc, rng):
    """With one rank (no process group) the sum over the ranks is the source itself, through
    ``acc`` and rounded to the destination's dtype (the sum over several ranks: tests/dist)."""
    a = rand((R, C), dtype, rng)
    for dst in (dtype, DType.F32):
        got = one_op("allreduce", (R, C), [a], dtype, dst_dtype=dst, acc="f32" if acc == "f32" else dtype.short)
        assert np.array_equal(got, f64(a))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rowargmax_and_rowtakemax(dtype, rng, run_op):
    """rowargmax: the column of each row's largest element, the first of equal ones (a tie is
    planted in row 0); rowtakemax: a second tile's element at that column."""
    a = rand((R, C), dtype, rng)
    a[0, 3] = a[0, 11] = a[0].max() + 1
    b = rand((R, C), dtype, rng)
    ref = np.argmax(f64(a), axis=1)[:, None]  # numpy's argmax also returns the first maximum
    assert ref[0, 0] == 3
    assert np.array_equal(run_op("rowargmax", (R, 1), [a], dtype, dst_dtype=DType.F32), ref)
    took = run_op("rowtakemax", (R, 1), [a, b], dtype)
    assert np.array_equal(took, np.take_along_axis(f64(b), ref, axis=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("part", [0, 1])
@pytest.mark.parametrize("cols", [16, 12], ids=["block", "padded"])
def test_deinterleave(cols, part, dtype, rng, run_op):
    """Every other column from ``part``: exact (a padded tile's block splits into its half's)."""
    a = rand((R, cols), dtype, rng)
    got = run_op("deinterleave", (R, cols // 2), [a], dtype, dst_dtype=DType.F32, part=part)
    assert np.array_equal(got, f64(a)[:, part::2])


@pytest.mark.parametrize("shape,part,error", [
    ((8, 6), 0, r"every other column of `a` \(8x16\) needs a 8x8 destination; `d` is 8x6"),
    ((8, 8), 2, "attribute `part` must be 0 \\(even columns\\) or 1 \\(odd\\), not 2")])
def test_deinterleave_errors_name_the_tiles(shape, part, error):
    from pto import InCore, f32
    from pto.errors import BuildError

    k = InCore("bad")
    x = k.memref("x", f32)
    a, d = k.tile("a", 8, 16, f32), k.tile("d", *shape, f32)
    k.load(a, x, 0, 0)
    with pytest.raises(BuildError, match=error):
        k.deinterleave(d, a, part)


def test_load_scalar_moves_a_load():
    """load_scalar reads an integer from memory when the task runs; a load offset by it reads
    the row it names (a decode step's position), and a store offset by it writes there."""
    from pto import InCore, f32
    from pto.interp.incore import run_incore

    k = InCore("at_pos")
    pos = k.memref("pos", f32)
    x = k.memref("x", f32, shape=(8, 4))
    y = k.memref("y", f32, shape=(8, 4))
    t = k.tile("t", 1, 4, f32)
    p = k.load_scalar("p", pos, 0, 0)
    k.load(t, x, p, 0)
    k.muls(t, t, 2.0)
    k.store(y, p + 1, 0, t)
    fn = k.build()
    g = torch.Generator().manual_seed(5)
    src = torch.randn(8, 4, generator=g)
    for at in (0, 3, 6):
        dst = torch.zeros(8, 4)
        run_incore(fn, {"pos": (torch.tensor([[float(at)]]), 0, 0, 1, 1), "x": (src, 0, 0, 8, 4),
                        "y": (dst, 0, 0, 8, 4)})
        want = torch.zeros(8, 4)
        want[at + 1] = src[at] * 2
        assert torch.equal(dst, want)


def test_every_op_is_tested():
    """The ISA and this file stay in step: the ops the tests above are parametrized over (and
    the ones they name directly) are exactly the ops of the vocabulary."""
    tested = {Op(o) for o in BINARY_REF} | {Op(o + "s") for o in BINARY_REF} | {Op(o) for o in UNARY_REF}
    tested |= {Op(f"{a}{k}") for a in ("row", "col") for k in ("sum", "max", "min")}
    tested |= {Op(f"{a}expand{o}") for a in ("row", "col") for o in ("add", "sub", "mul", "div", "")}
    tested |= {Op.MATMUL, Op.MATMUL_ACC, Op.CAST, Op.MOV, Op.FULL, Op.MASK_CAUSAL, Op.MASK_COLS,
               Op.MASK_ROWS, Op.LOAD, Op.STORE, Op.ALLREDUCE, Op.ROWARGMAX, Op.ROWTAKEMAX, Op.LOAD_SCALAR,
               Op.DEINTERLEAVE}
    tested.add(Op.STORE_ADD)  # tests/codegen/test_store_add.py, on every backend
    assert set().union(*GROUPS.values()) == set(Op)
    assert tested == set(Op), f"ops without a test: {sorted(o.value for o in set(Op) - tested)}"
