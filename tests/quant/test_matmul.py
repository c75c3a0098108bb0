"""The prefill's GEMM against quantized weights (``matmul_nk_tile``, ``matmul_nk_residual_tile``
of incore/matmul.py): ``y = [r +] x @ dequant(w).T`` for an output-major ``[N, K]`` weight of
every quantized type, through the reference evaluator, the Triton backend (the interpreter) and
the C backend, against float64 products of the weights as the ``gguf`` package dequantizes
them (fp8, which GGUF does not have: pto's dequantization, tested in test_formats.py). The
shapes leave a short last row tile (M = 21 rows in tiles of 16), a short last block of outputs
(N = 40 in blocks of 16) and a K loop of three steps whose last overhangs the rows by a block
(K = 5 blocks in steps of 2)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from pto.incore.matmul import matmul_nk_residual_tile, matmul_nk_tile

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


def function(dtype: DType, residual: bool, tdtype=f32):
    b = dtype.quant.block
    build = matmul_nk_residual_tile if residual else matmul_nk_tile
    fn = build(tdtype, R, 5 * b, N, BN, 2 * b, wdtype=dtype)
    return specialize(replace(fn, name=f"{fn.name.removesuffix('_tile')}_{dtype.short}"))


def run_tiles(run, fn, w: torch.Tensor, x: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor:
    """``fn`` over the row tiles of x (the last one short), each a task run by ``run`` (the
    evaluator's ``run_incore`` signature): the output, NaN where nothing was stored."""
    K = x.shape[1]
    y = torch.full((M, N), float("nan"), dtype=x.dtype)
    for row in range(0, M, R):
        rows = min(R, M - row)
        regions = {"x": (x, row, 0, rows, K), "w": (w, 0, 0, N, K), "y": (y, row, 0, rows, N)}
        if r is not None:
            regions["r"] = (r, row, 0, rows, N)
        run(fn, regions, {})
    return y


def check(got: torch.Tensor, x: torch.Tensor, values: torch.Tensor, r: torch.Tensor | None) -> None:
    """Against the float64 product: x and the weights' values are exact in f32, so each output is
    a sum of K f32 products, off the exact one by at most (K + 1) u times the sum of the terms'
    magnitudes in any order of summation (each term takes at most K roundings, its product one),
    plus one rounding of the residual's addition."""
    K = x.shape[1]
    want = x.double() @ values.double().T
    size = x.double().abs() @ values.double().abs().T
    if r is not None:
        want, size = want + r.double(), size + r.double().abs()
    assert not torch.isnan(got).any()
    err = (got.double() - want).abs()
    bound = (K + 2) * U * size
    assert (err <= bound).all(), f"worst error {float((err / bound).max()):.2f} of the bound"


def inputs(dtype: DType, residual: bool):
    w, values = weights(dtype, seed=len(str(dtype)) + dtype.quant.block)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, w.shape[1], generator=g)
    r = torch.randn(M, N, generator=g) * 100 if residual else None
    return w, values, x, r


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_evaluators_gemm_is_the_product_with_ggufs_values(dtype, residual):
    w, values, x, r = inputs(dtype, residual)
    fn = function(dtype, residual)
    got = run_tiles(run_incore, fn, w.data, x, r)
    check(got, x, values, r)
    # the same as the function on the dense values, bit for bit (each tile load's values are
    # the gguf package's: the products are the same)
    dense = specialize(matmul_nk_residual_tile(f32, R, x.shape[1], N, BN, 2 * dtype.quant.block) if residual
                       else matmul_nk_tile(f32, R, x.shape[1], N, BN, 2 * dtype.quant.block))
    assert torch.equal(got, run_tiles(run_incore, dense, values, x, r))


@pytest.mark.parametrize("dtype", [DType.Q4_K, DType.FP8], ids=str)
def test_a_half_precision_gemm_rounds_the_weights_as_a_dense_copy_would(dtype):
    """bf16 activations: the weight tiles are bf16 (the tensor-core dot's operands), each load
    rounding the exact dequantized values, so the product is the dense function's on the
    weights' values rounded to bf16 (what the prefill's dequantized copy holds), bit for bit."""
    w, values, x, r = inputs(dtype, True)
    x, r = x.to(torch.bfloat16), r.to(torch.bfloat16)
    K = x.shape[1]
    got = run_tiles(run_incore, function(dtype, True, bf16), w.data, x, r)
    dense = specialize(matmul_nk_residual_tile(bf16, R, K, N, BN, 2 * dtype.quant.block))
    assert torch.equal(got, run_tiles(run_incore, dense, values.to(torch.bfloat16), x, r))


def test_a_k_step_of_part_of_a_block_is_refused():
    from pto.errors import BuildError

    with pytest.raises(BuildError, match="whole blocks of 256 columns"):
        matmul_nk_tile(f32, R, 1024, N, BN, 128, wdtype=DType.Q4_K)


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_triton_gemm_is_the_product_with_ggufs_values(dtype, residual, tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from pto.codegen.triton import render
    from tests.opkit import run_incore_triton

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path))
    w, values, x, r = inputs(dtype, residual)
    fn = function(dtype, residual)
    check(run_tiles(run_incore_triton, fn, w.data, x, r), x, values, r)
    assert f"_pto_dq_{dtype.short}(" in render(fn).source  # the tiles' values, then the dot


@pytest.fixture(scope="module")
def c_module():
    """Every case's kernel in one compiled module: (module, index by function)."""
    from pto.backends.c.build import kernel_module

    fns = [function(d, res) for d in QUANTIZED for res in (False, True)]
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


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_c_gemm_is_the_product_with_ggufs_values(c_module, dtype, residual):
    w, values, x, r = inputs(dtype, residual)
    fn = function(dtype, residual)
    check(run_tiles(lambda *a: run_c(c_module, *a), fn, w.data, x, r), x, values, r)
    body = c_module[0].incore.source.split(f"static int k_{fn.variant_name}(")[1].split("\n}\n")[0]
    assert f"pto_dq_{dtype.short}(" in body  # a tile of the values, then the product
