"""A few rows of x read quantized weights by groups (a decode step of a few sequences,
pto.codegen.triton.quant_groups's helpers with ``rows``: x ``[BM, BC]``, each thread's weights
unpacked once for every row) through the Triton interpreter: each row's sums are what the one-row
GEMV's arithmetic gives that row (the float dot: the evaluator's to f32 summation order; the
integer and half dots: float64 of x rounded per group and row, within the rounding's bound of the
unrounded product); rows past :data:`GROUPED_ROWS`, and the units' mode, keep the values and the
plain product."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton.common import GROUPED_ROWS, RenderOptions  # noqa: E402
from pto.codegen.triton.quant_groups import group_of, int_dots_apply  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import QUANTIZED, DType, dtype_of, f32  # noqa: E402
from tests.codegen.test_triton_half_dots import half_reference  # noqa: E402
from tests.codegen.test_triton_int_dots import int_reference, interpreted  # noqa: E402
from tests.codegen.tritonkit import temp_cache_dir  # noqa: E402,F401
from tests.quant.test_load import random_qtensor  # noqa: E402

N, SKIP = 36, 3


def rows_gemv(dtype: DType, R: int, K: int, bk: int, qgemv: str):
    """``y = x @ w.T + r`` for ``R`` rows of x against 36 rows of a random ``dtype`` matrix (from
    its row 3; the last block of 8 rows past the region's end) in K steps of ``bk``, through the
    interpreter's Triton backend reading by ``qgemv``, and through the evaluator: (y, the
    evaluator's y, the kernel's source, x, w, r). Each row of x has its own group of large
    values, a group of zeros and (the first) a group of exact halves at 16 bits."""
    from pto.incore.gemv import gemv_residual_tile

    g = torch.Generator().manual_seed(11)
    w = random_qtensor(dtype, N + SKIP, K, seed=12)
    x, r = torch.randn(R, K, generator=g), torch.randn(R, N, generator=g)
    T = group_of(dtype.quant)
    for m in range(R):
        x[m, (m % 3) * T:(m % 3 + 1) * T] *= 40.0  # groups whose steps differ by row
        x[m, ((m + 1) % 3) * T:((m + 1) % 3 + 1) * T] = 0.0
    ties = torch.tensor([32767.0] + [k + 0.5 for k in range(T // 2 - 1)] + [-k - 0.5 for k in range(T // 2)])
    x[0, 3 * T:4 * T] = ties * 2.0 ** -10
    fn = specialize(gemv_residual_tile(f32, R, K, N, 8, bk, wdtype=dtype))
    regions = {"x": (x, 0, 0, R, K), "w": (w.data, SKIP, 0, N, K), "r": (r, 0, 0, R, N),
               "y": (torch.full((R, N), float("nan")), 0, 0, R, N)}
    want = {n: (t.clone(), *rest) for n, (t, *rest) in regions.items()}
    run_incore(fn, want, {})
    backend = TritonBackend("cpu", options=RenderOptions(qgemv=qgemv))
    mems = {n: RegionBatch(t, *(torch.tensor([v]) for v in rest)) for n, (t, *rest) in regions.items()}
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    return mems["y"].tensor, want["y"][0], backend.kernel(fn).source, x, w, r


def steps(dtype: DType) -> tuple[int, int]:
    """A K loop whose last step overhangs the rows, in whole blocks."""
    return (768, 512) if 768 % dtype.quant.block == 0 else (1024, 512)


@interpreted
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("R", [3, GROUPED_ROWS])
def test_the_float_dot_of_a_few_rows_is_the_evaluators(dtype, R):
    """``qgemv="groups"``: every format's float dot of 3 rows (a block of 4, its last row
    padding) and of the most rows that read by groups, against the evaluator's sums to f32
    summation order, row by row."""
    K, bk = steps(dtype)
    y, want, source, x, w, _ = rows_gemv(dtype, R, K, bk, "groups")
    assert f"_pto_dqg_rows_{dtype.short}(" in source.split("def d_")[-1]
    scale = (x.abs() @ w.dequantize()[SKIP:SKIP + N].abs().T).amax(1, keepdim=True)
    assert bool(((y - want).abs() <= 1e-5 * want.abs() + 2e-6 * scale).all()), float((y - want).abs().max())


@interpreted
@pytest.mark.parametrize("dtype", [d for d in QUANTIZED if int_dots_apply(d.quant)], ids=str)
@pytest.mark.parametrize("xbits", [8, 16])
def test_the_integer_dots_of_a_few_rows_are_each_rows_rounded_arithmetic(dtype, xbits):
    """``qgemv="int8"``/``"int16"``, 5 rows (a block of 8): each row's sums are float64's of
    that row rounded per group (its own steps) to f32 summation order, and within the
    rounding's bound of the unrounded product."""
    K, bk = steps(dtype)
    y, _, source, x, w, r = rows_gemv(dtype, 5, K, bk, f"int{xbits}")
    assert f"_pto_dqx{xbits}_rows_{dtype.short}(" in source.split("def d_")[-1]
    dense = w.dequantize()[SKIP:SKIP + N].double()
    for m in range(5):
        ref, bound, _ = int_reference(dtype, w, x[m:m + 1], SKIP, N, xbits)
        scale = float((x[m:m + 1].abs().double() @ dense.abs().T).max())
        torch.testing.assert_close(y[m:m + 1].double(), ref + r[m:m + 1].double(), rtol=1e-5, atol=2e-6 * scale)
        exact = x[m:m + 1].double() @ dense.T + r[m:m + 1].double()
        assert bool(((y[m:m + 1].double() - exact).abs() <= bound * 1.001 + 2e-6 * scale).all()), m


@interpreted
@pytest.mark.parametrize("R", [2, 6])
def test_the_half_dots_of_a_few_rows_are_each_rows_rounded_arithmetic(R):
    """fp8 under ``qgemv="auto"``: the half dots of R rows, each row's sums numpy's f16 rounding
    of that row's chains (its own powers of two) to f32 summation order, within the roundings'
    bound of the unrounded product."""
    fp8 = dtype_of("fp8")
    y, _, source, x, w, r = rows_gemv(fp8, R, 768, 512, "auto")
    assert "_pto_dqh_rows_fp8(" in source.split("def d_")[-1]
    dense = w.dequantize()[SKIP:SKIP + N].double()
    for m in range(R):
        ref, bound = half_reference(w, x[m:m + 1], SKIP, N)
        scale = float((x[m:m + 1].abs().double() @ dense.abs().T).max())
        got = y[m:m + 1].double() - r[m:m + 1].double()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6 * scale)
        assert bool(((got - x[m:m + 1].double() @ dense.T).abs() <= bound + 2e-6 * scale).all()), m


@interpreted
@pytest.mark.parametrize("R,mode", [(GROUPED_ROWS + 1, "int16"), (3, "units")], ids=["many-rows", "units"])
def test_more_rows_or_the_units_keep_the_values_product(R, mode):
    """Past :data:`GROUPED_ROWS` rows of x (a block of 16), or under the units' mode, the GEMV
    loads the weights' values and multiplies them as it did (no helper of rows): the evaluator's
    sums to f32 summation order."""
    dtype = dtype_of("q4_k")
    y, want, source, x, w, _ = rows_gemv(dtype, R, 1024, 512, mode)
    assert "_rows_" not in source.split("def d_")[-1]
    scale = (x.abs() @ w.dequantize()[SKIP:SKIP + N].abs().T).amax(1, keepdim=True)
    assert bool(((y - want).abs() <= 1e-5 * want.abs() + 2e-6 * scale).all())


@pytest.mark.slow
@pytest.mark.parametrize("mode,tol", [("groups", 1e-5), ("int16", 1e-3)])
@interpreted
def test_a_step_of_three_sequences_reads_by_groups(mode, tol, monkeypatch):
    """The decode step of three sequences through the interpreter (a CPU's tiles: the batch's
    rows unpadded, so every GEMV's x has 3 rows and reads Q4_K weights by groups): the logits the
    reference's on the dequantized weights, to f32 summation order (the float dot) or within
    16-bit x's rounding (the integer dots; tests/codegen/test_triton_int_dots.py)."""
    from dataclasses import replace

    from pto.orchestration.llama.config import LlamaConfig
    from pto.orchestration.model import program as mp

    from pto.cli.commands.run import run

    monkeypatch.setitem(mp.CONFIGS, "tiny-256", replace(mp.CONFIGS["tiny"], layers=1, layer=LlamaConfig(
        hidden=256, heads=4, head_dim=64, ffn=512, kv_heads=2)))
    monkeypatch.setenv("PTO_QGEMV", mode)
    res = run("model", config="tiny-256", cache=64, batch=3, device="cpu", backend="triton", check=True,
              quantize="q4_k")
    assert res["rel_err"] <= tol, res
