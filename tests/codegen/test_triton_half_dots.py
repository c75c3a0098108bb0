"""fp8's half dots (``PTO_QGEMV=auto``, ``int8`` or ``int16`` on fp8 weights,
pto.codegen.triton.quant_groups's ``render_dot_half``) through the Triton interpreter: x scaled
per group of 16 by a power of two and rounded to f16, each group's products two chains of f16
fused multiply-adds (even and odd elements) of the e4m3 values and those halves, their f32 sum
times the power of two, times the row's scale. Checked against numpy's float16 rounding of float64
(each product and sum exact, one rounding a step: PTX's ``fma.rn.f16x2``) of the same chains and
against the unrounded product within the roundings' bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from pto.codegen.triton.common import RenderOptions  # noqa: E402
from pto.codegen.triton.quant_groups import half_dots_apply, render_half_dots  # noqa: E402
from pto.ir.dtypes import QUANTIZED, dtype_of, f32  # noqa: E402
from pto.quant.planes import row_values  # noqa: E402
from tests.codegen.test_triton_int_dots import int_gemv, interpreted  # noqa: E402

FP8 = dtype_of("fp8")
#: f16's unit roundoff: a rounding to nearest moves a normal value by at most this much of itself
U16 = 2.0 ** -11


def half_reference(w, x: torch.Tensor, skip: int, N: int):
    """float64 of what the half dots compute for rows ``skip:skip + N`` of the fp8 matrix ``w``
    and ``x [1, K]``, and the roundings' bound from the unrounded product (x's rounding to f16 and
    each of a chain's eight roundings, at most 2^-11 of what they round, each partial sum at most
    the sum of its terms' magnitudes): (reference, bound), each ``[1, N]``."""
    fmt, K = FP8.quant, x.shape[1]
    vals = row_values(fmt, w.data[skip:skip + N], K)
    q, s = vals["q"].double().numpy(), vals["s"][:, 0].double().numpy()
    xg = x.view(-1, 16).float()
    amax = xg.abs().amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    e = (amax.view(torch.int32) >> 23).clamp_max(253)
    inv, unit = ((254 - e) << 23).view(torch.float32), (e << 23).view(torch.float32)
    # [groups, 16]: f32 * 2^k is exact; numpy rounds f32 (and float64 below) to f16 once, where
    # torch's .half() of a float64 rounds through f32 first (twice)
    xh = (xg * inv).numpy().astype(np.float16).astype(np.float64)
    qg = q.reshape(N, -1, 16)
    lo = np.zeros(qg.shape[:2], np.float16)
    hi = np.zeros(qg.shape[:2], np.float16)
    for j in range(8):  # word j // 2's bytes: 4v, 4v + 1 onto the halves, then 4v + 2, 4v + 3
        lo = (qg[:, :, 2 * j] * xh[None, :, 2 * j] + lo.astype(np.float64)).astype(np.float16)
        hi = (qg[:, :, 2 * j + 1] * xh[None, :, 2 * j + 1] + hi.astype(np.float64)).astype(np.float16)
    sums = (lo.astype(np.float32) + hi.astype(np.float32)) * unit.numpy().reshape(1, -1)  # f32, as the kernel
    ref = torch.from_numpy((sums.astype(np.float64) * s[:, None]).sum(1)).view(1, N)
    terms = x.double().abs() @ (torch.from_numpy(np.abs(q) * s[:, None])).T
    return ref, 9 * U16 * terms


@interpreted
@pytest.mark.parametrize("K,bk,xscale", [(768, 512, 1.0), (576, 576, 1.0), (768, 512, 1e-36)],
                         ids=["overhang", "padded", "tiny"])
@pytest.mark.parametrize("mode", ["int16", "int8"])
def test_half_dots_are_the_rounded_arithmetic(K, bk, xscale, mode):
    """The residual GEMV of tests/codegen/test_triton_int_dots.py on fp8 weights (a group of large
    values, one of zeros, one of exact halves), a K loop whose last step overhangs the rows or one
    step of a padded block, or x of magnitudes about 1e-36 (its groups' powers of two past 2^100:
    the scaled values must stay f16-normal): float64's rounding of the same chains to f32
    summation order, and within the roundings' bound of the unrounded product (fp8 takes half
    dots under either integer mode: its values are floats)."""
    y, source, x, w, r = int_gemv(FP8, K, bk, "cpu", mode, xscale)
    assert "_pto_dqh_dot_fp8(" in source and "inline_asm" not in source
    ref, bound = half_reference(w, x, 3, 36)
    dense = w.dequantize()[3:39].double()
    scale = float((x.abs().double() @ dense.abs().T).max())
    got = y.double() - r.double()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6 * scale)
    exact = x.double() @ dense.T
    assert bool(((got - exact).abs() <= bound + 2e-6 * scale).all())
    assert float((got - exact).abs().max()) > 1e-4 * scale  # x's f16 rounding is there


_HELPERS_KERNEL = """
@triton.jit
def _halves(W, F, XA, GOT, SUM, N: tl.constexpr):
    i = tl.arange(0, N)
    xa = _pto_h2pack(tl.load(F + i * 6), tl.load(F + i * 6 + 1))
    xb = _pto_h2pack(tl.load(F + i * 6 + 2), tl.load(F + i * 6 + 3))
    c = _pto_h2pack(tl.load(F + i * 6 + 4), tl.load(F + i * 6 + 5))
    got = _pto_hfma4(tl.load(W + i), xa, xb, c)
    tl.store(XA + i, xa)
    tl.store(GOT + i, got)
    tl.store(SUM + i, _pto_h2sum(got))
"""


@interpreted
def test_the_interpreters_half_dots_are_ptxs(tmp_path):
    """The interpreter's ``_pto_h2pack``, ``_pto_hfma4`` and ``_pto_h2sum`` on random words and
    values against PTX's definitions: ``cvt.rn.f16x2.f32`` (the first operand to the high half),
    ``cvt.rn.f16x2.e4m3x2`` (byte 1 to the high half, exact), ``fma.rn.f16x2`` (each half's
    product and sum rounded once to f16), ``cvt.f32.f16`` and ``add.rn.f32``."""
    import importlib.util

    path = tmp_path / "halves.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n".join(render_half_dots(False))
                    + _HELPERS_KERNEL)
    spec = importlib.util.spec_from_file_location("halves", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = np.random.default_rng(7)
    n = 1024
    b = g.integers(0, 256, (n, 4)).astype(np.uint8)
    b[(b & 0x7F) == 0x7F] &= 0xFE  # no NaN (0x7F, 0xFF): pto's quantizer writes finite values
    w = torch.from_numpy(b.copy()).view(torch.int32).reshape(n)
    vals = torch.from_numpy(b.copy()).view(torch.float8_e4m3fn).double().numpy()
    f = (g.standard_normal((n, 6)) * 4).astype(np.float32)
    xa, got, total = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32), torch.empty(n)
    mod._halves[(1,)](w, torch.from_numpy(f), xa, got, total, N=n)
    halves = f.astype(np.float16)
    xa, got = xa.numpy().view(np.uint32), got.numpy().view(np.uint32)
    assert np.array_equal(xa & 0xFFFF, halves[:, 0].view(np.uint16))
    assert np.array_equal(xa >> 16, halves[:, 1].view(np.uint16))
    h = halves.astype(np.float64)
    lo = (vals[:, 2] * h[:, 2] + (vals[:, 0] * h[:, 0] + h[:, 4]).astype(np.float16)).astype(np.float16)
    hi = (vals[:, 3] * h[:, 3] + (vals[:, 1] * h[:, 1] + h[:, 5]).astype(np.float16)).astype(np.float16)
    assert np.array_equal(got & 0xFFFF, lo.view(np.uint16))
    assert np.array_equal(got >> 16, hi.view(np.uint16))
    assert np.array_equal(total.numpy(), lo.astype(np.float32) + hi.astype(np.float32))


def test_which_formats_take_half_dots():
    """fp8 only (e4m3 values); under "units" and "groups" fp8 keeps those reads, under "auto" (a
    GPU's default) and the integer modes its products are half dots."""
    from pto.incore.gemv import gemv_residual_tile

    from pto.codegen.triton import render
    from pto.ir.analysis import specialize

    assert [d for d in QUANTIZED if half_dots_apply(d.quant)] == [FP8]
    for mode, dot in (("auto", "_pto_dqh_dot_fp8("), ("int16", "_pto_dqh_dot_fp8("), ("int8", "_pto_dqh_dot_fp8("),
                      ("groups", "_pto_dqg_dot_fp8("), ("units", "_pto_dq_dot_fp8(")):
        fn = specialize(gemv_residual_tile(f32, 1, 1024, 64, 8, 1024, wdtype=FP8))
        src = render(fn, RenderOptions(qgemv=mode, asm=True)).source
        assert dot in src, mode
        assert ("cvt.rn.f16x2.e4m3x2" in src) == (dot == "_pto_dqh_dot_fp8("), mode
