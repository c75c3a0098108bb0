"""The prefill's GEMMs against quantized weights (``matmul_nk_tile``, ``matmul_nk_residual_tile``
and ``matmul_nk_swiglu_tile`` of incore/matmul.py): ``y = [r +] x @ dequant(w).T`` and ``y =
silu(x @ dequant(wg).T) * (x @ dequant(wu).T)`` for output-major ``[N, K]`` weights of every
quantized type, through the reference evaluator, the Triton backend (the interpreter) and
the C backend, against float64 products of the weights as the ``gguf`` package dequantizes
them (fp8, which GGUF does not have: pto's dequantization, tested in test_formats.py). The
shapes leave a short last row tile (M = 21 rows in tiles of 16), a short last block of outputs
(N = 40 in blocks of 16) and a K loop of three steps whose last overhangs the rows by a block
(K = 5 blocks in steps of 2)."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from pto.incore.matmul import matmul_nk_residual_tile, matmul_nk_swiglu_tile, matmul_nk_tile

from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import QUANTIZED, DType, bf16, f32
from pto.quant import QTensor
from tests.quant.test_formats import BY_GGUF, from_gguf, gguf_values, random_blocks

M, N, R, BN = 21, 40, 16, 16
#: f32's unit roundoff
U = 2.0 ** -24


def weights(dtype: DType, seed: int) -> tuple[QTensor, torch.Tensor]:
    """Random ``[N, 5 blocks]`` weights of ``dtype`` and their values as ``gguf`` dequantizes
    them (fp8: pto's; a GGUF type's blocks: random bytes with finite f16 scales)."""
    q = dtype.quant
    K = 5 * q.block
    if q.gguf is None:
        g = torch.Generator().manual_seed(seed)
        w = QTensor.quantize(dtype, torch.randn(N, K, generator=g) * 3)
        return w, w.dequantize()
    raw = random_blocks(q.gguf, N, 5, seed)
    return QTensor(dtype, from_gguf(BY_GGUF[q.gguf], torch.from_numpy(raw), K), K), gguf_values(q.gguf, raw)


KINDS = ("plain", "residual", "swiglu")
BUILD = {"plain": matmul_nk_tile, "residual": matmul_nk_residual_tile, "swiglu": matmul_nk_swiglu_tile}


def function(dtype: DType, kind: str, tdtype=f32, wdtype: DType | None = None):
    """The ``kind`` of GEMM on a weight of ``wdtype`` (by default ``dtype``) with blocks of
    ``dtype``'s: K = 5 blocks in steps of 2."""
    b = dtype.quant.block
    fn = BUILD[kind](tdtype, R, 5 * b, N, BN, 2 * b, wdtype=wdtype or dtype)
    return specialize(replace(fn, name=f"{fn.name.removesuffix('_tile')}_{dtype.short}"))


def run_tiles(run, fn, w: dict, x: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor:
    """``fn`` over the row tiles of x (the last one short), each a task run by ``run`` (the
    evaluator's ``run_incore`` signature), with the weights ``w`` (memref -> ``[N, K]``
    tensor): the output, NaN where nothing was stored."""
    K = x.shape[1]
    y = torch.full((M, N), float("nan"), dtype=x.dtype)
    for row in range(0, M, R):
        rows = min(R, M - row)
        regions = {"x": (x, row, 0, rows, K), "y": (y, row, 0, rows, N)}
        regions.update({n: (t, 0, 0, N, K) for n, t in w.items()})
        if r is not None:
            regions["r"] = (r, row, 0, rows, N)
        run(fn, regions, {})
    return y


def product(x: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x @ values.T`` in float64 and the bound on an f32 computation's error. x and the weights'
    values are exact in f32, so each output is a sum of K f32 products, which takes K roundings
    in any order of summation; the worst case, (K + 1) u times the sum of the terms' magnitudes,
    is a thousand times the errors seen and would let a wrong block through, so the bound is the
    probabilistic one (rounding errors independent and of mean zero: at most lambda sqrt(K + 1) u
    times the terms' magnitudes but with probability under 2 exp(-lambda^2 / 2), 4e-6 for lambda
    = 5: Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019), the inputs seeded."""
    K = x.shape[1]
    return x.double() @ values.double().T, 5 * math.sqrt(K + 1) * U * (x.double().abs() @ values.double().abs().T)


def check(got: torch.Tensor, x: torch.Tensor, values: dict, r: torch.Tensor | None) -> None:
    """Against the float64 result, within the f32 error bound of :func:`product`; for SwiGLU that
    bound carried through ``silu(g) * u`` (|silu'| < 1.1) plus a few roundings of silu and the
    product."""
    if "w" in values:
        want, bound = product(x, values["w"])
        if r is not None:
            want, bound = want + r.double(), bound + U * (want + r.double()).abs()  # the addition's rounding
    else:
        (g, eg), (u, eu) = product(x, values["wg"]), product(x, values["wu"])
        sg = torch.nn.functional.silu(g)
        want = sg * u
        bound = 1.1 * eg * (u.abs() + eu) + sg.abs() * eu + 8 * U * want.abs()
    assert not torch.isnan(got).any()
    err = (got.double() - want).abs()
    assert (err <= bound).all(), f"worst error {float((err / bound).max()):.2f} of the bound"


def inputs(dtype: DType, kind: str):
    """(quantized weights by memref, their values, x, r or None) of a ``kind`` of GEMM."""
    seed = len(str(dtype)) + dtype.quant.block
    names = ("wg", "wu") if kind == "swiglu" else ("w",)
    pairs = {n: weights(dtype, seed + i) for i, n in enumerate(names)}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, 5 * dtype.quant.block, generator=g)
    r = torch.randn(M, N, generator=g) * 100 if kind == "residual" else None
    if kind == "swiglu":  # the gate's values of a few units (silu's curve, not its asymptotes),
        # by a power of two (exact)
        rms = float((x @ pairs["wg"][1].T).square().mean().sqrt())
        x = x * 2.0 ** round(math.log2(4 / rms))
    return {n: q.data for n, (q, _) in pairs.items()}, {n: v for n, (_, v) in pairs.items()}, x, r


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_evaluators_gemm_is_the_product_with_ggufs_values(dtype, kind):
    w, values, x, r = inputs(dtype, kind)
    got = run_tiles(run_incore, function(dtype, kind), w, x, r)
    check(got, x, values, r)
    # the same as the function on the dense values, bit for bit (each tile load's values are
    # the gguf package's: the products are the same)
    assert torch.equal(got, run_tiles(run_incore, function(dtype, kind, wdtype=f32), values, x, r))


@pytest.mark.parametrize("dtype", [DType.Q4_K, DType.FP8], ids=str)
def test_a_half_precision_gemm_rounds_the_weights_as_a_dense_copy_would(dtype):
    """bf16 activations: the weight tiles are bf16 (the tensor-core dot's operands), each load
    rounding the exact dequantized values, so the product is the dense function's on the
    weights' values rounded to bf16 (what the prefill's dequantized copy holds), bit for bit."""
    w, values, x, r = inputs(dtype, "residual")
    x, r = x.to(torch.bfloat16), r.to(torch.bfloat16)
    got = run_tiles(run_incore, function(dtype, "residual", bf16), w, x, r)
    dense = {n: v.to(torch.bfloat16) for n, v in values.items()}
    assert torch.equal(got, run_tiles(run_incore, function(dtype, "residual", bf16, wdtype=bf16), dense, x, r))


def test_a_k_step_of_part_of_a_block_is_refused():
    from pto.errors import BuildError

    with pytest.raises(BuildError, match="whole blocks of 256 columns"):
        matmul_nk_tile(f32, R, 1024, N, BN, 128, wdtype=DType.Q4_K)


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("kind", ["plain", "swiglu"])  # the residual's epilogue: the evaluator's and C's tests
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_triton_gemm_is_the_product_with_ggufs_values(dtype, kind, tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from pto.codegen.triton import render
    from tests.opkit import run_incore_triton

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path))
    w, values, x, r = inputs(dtype, kind)
    fn = function(dtype, kind)
    check(run_tiles(run_incore_triton, fn, w, x, r), x, values, r)
    assert f"_pto_dq_{dtype.short}(" in render(fn).source  # the tiles' values, then the dot


@pytest.fixture(scope="module")
def c_module():
    """Every case's kernel in one compiled module: (module, index by function)."""
    from pto.backends.c.build import kernel_module

    fns = [function(d, kind) for d in QUANTIZED for kind in KINDS]
    return kernel_module(fns, "quant_matmul_tests"), {f: i for i, f in enumerate(fns)}


def run_c(c_module, fn, regions: dict, scalars: dict) -> None:
    from pto.backends.c.backend import region_table
    from pto.data.batch import RegionBatch, TaskBatch

    km, index = c_module
    mems = {n: RegionBatch(t, *(torch.tensor([v]) for v in rest)) for n, (t, *rest) in regions.items()}
    table = region_table(TaskBatch(fn, mems, {}, 1))
    ffi = km.module.ffi
    sc = np.zeros((1, 1), np.int64)
    assert km.run(index[fn], ffi.from_buffer("pto_region[]", table), ffi.from_buffer("int64_t[]", sc), 1) == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_c_gemm_is_the_product_with_ggufs_values(c_module, dtype, kind):
    w, values, x, r = inputs(dtype, kind)
    fn = function(dtype, kind)
    check(run_tiles(lambda *a: run_c(c_module, *a), fn, w, x, r), x, values, r)
    body = c_module[0].incore.source.split(f"static int k_{fn.variant_name}(")[1].split("\n}\n")[0]
    assert f"pto_dq_{dtype.short}(" in body  # a tile of the values, then the product
