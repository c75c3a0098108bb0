"""The quantized GEMV's integer dots (``PTO_QGEMV=int8`` and ``int16``,
pto.codegen.triton.quant_groups's ``render_dot_int``) through the Triton interpreter: x rounded
to 8- or 16-bit integers per group of the format's group (its largest magnitude over 127 or
32767 a step), each group's products an exact integer dot of the weights' fields and those
integers, the scales applied per group. Checked
against float64 of the same arithmetic (torch's rounding of x, the dequantized weights of the
reference routine) and against the unrounded product within the rounding's bound."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton.common import INT_DOT_BITS, QGEMV_INT_AUTO, RenderOptions  # noqa: E402
from pto.codegen.triton.quant_groups import group_of, int_dots_apply, render_int_dots  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import QUANTIZED, DType, dtype_of, f32  # noqa: E402
from pto.quant.planes import dequantize_parts  # noqa: E402
from tests.codegen.tritonkit import INTERPRETER_ONLY, temp_cache_dir  # noqa: E402,F401
from tests.quant.test_load import random_qtensor  # noqa: E402

INT8 = [d for d in QUANTIZED if int_dots_apply(d.quant)]


def int_reference(dtype: DType, w, x: torch.Tensor, skip: int, N: int, xbits: int):
    """float64 of what the integer dots compute for rows ``skip:skip + N`` of ``w`` and ``x [1,
    K]``: each group's x rounded (to nearest, ties to even) to integers of its step (its largest
    magnitude, at least 1e-30, over 2^(xbits-1) - 1), times the weights' values ``A * E``, plus
    their constant part ``B`` times x unrounded (the dot sums x itself for it); the bound of that
    from the unrounded product (half a step of each x times the magnitude of its weights' ``A *
    E``); and what a GPU may round otherwise (its division and fused multiply-add land within a
    few f32 ulps of the scaled x: where that is that close to a tie, a step times the weight's
    magnitude): (reference, bound, ties), each ``[1, N]``."""
    fmt, K = dtype.quant, x.shape[1]
    T = group_of(fmt)
    xg = x.view(-1, T).float()
    amax = xg.abs().amax(1, keepdim=True).clamp_min(1e-30)
    top = float((1 << (xbits - 1)) - 1)
    step = amax / top
    scaled = xg * (top / amax)
    xq = (torch.round(scaled) * step).double().view(1, K)
    near = ((scaled - scaled.floor() - 0.5).abs() <= 4 * torch.finfo(torch.float32).eps * scaled.abs().clamp_min(1))
    fields, const = (v.double() for v in dequantize_parts(fmt, w.data[skip:skip + N], K))  # A * E, B
    ref = xq @ fields.T + x.double() @ const.T
    steps = step.double().repeat_interleave(T).view(1, K)
    bound = (steps / 2) @ fields.abs().T
    ties = (steps * near.view(1, K)) @ fields.abs().T
    return ref, bound, ties


def int_gemv(dtype: DType, K: int, bk: int, device: str, qgemv: str, xscale: float = 1.0):
    """``y = x @ w.T + r`` of 36 rows of a random ``dtype`` matrix (its region from row 3, the last
    block of 8 rows past the region's end) by the residual GEMV in K steps of ``bk``, through a
    Triton backend on ``device`` reading by ``qgemv`` (x and r times ``xscale``): (y, the backend's
    kernel source, x, w, r)."""
    from pto.incore.gemv import gemv_residual_tile

    N, skip = 36, 3
    g = torch.Generator().manual_seed(5)
    w = random_qtensor(dtype, N + skip, K, seed=6)
    x, r = torch.randn(1, K, generator=g), torch.randn(1, N, generator=g)
    x[0, :dtype.quant.block] *= 40.0  # a group of large values: steps that differ by group
    T, xbits = group_of(dtype.quant), INT_DOT_BITS.get(qgemv, 16)
    x[0, T:2 * T] = 0.0  # a group of zeros
    top = (1 << (xbits - 1)) - 1  # a group of ties (times a power of two: x * top / largest is exact)
    ties = torch.tensor([top] + [k + 0.5 for k in range(T // 2 - 1)] + [-k - 0.5 for k in range(T // 2)])
    x[0, 2 * T:3 * T] = ties * 2.0 ** -10
    x *= xscale
    r *= xscale
    fn = specialize(gemv_residual_tile(f32, 1, K, N, 8, bk, wdtype=dtype))
    regions = {"x": (x, 0, 0, 1, K), "w": (w.data, skip, 0, N, K), "r": (r, 0, 0, 1, N),
               "y": (torch.full((1, N), float("nan")), 0, 0, 1, N)}
    backend = TritonBackend(device, options=RenderOptions(qgemv=qgemv))
    mems = {n: RegionBatch(t.to(device), *(torch.tensor([v], device=device) for v in rest))
            for n, (t, *rest) in regions.items()}
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    return mems["y"].tensor.cpu(), backend.kernel(fn).source, x, w, r


def interpreted(test):
    """``test`` with the marks of a module that runs the interpreter (tritonkit's)."""
    for mark in INTERPRETER_ONLY:
        test = mark(test)
    return test


@pytest.mark.parametrize("dtype", INT8, ids=str)
@pytest.mark.parametrize("K,bk", [(768, 512), (576, 576)], ids=["overhang", "padded"])
@pytest.mark.parametrize("xbits", [8, 16])
@interpreted
def test_integer_dots_are_the_rounded_arithmetic(dtype, K, bk, xbits):
    """Every format that takes integer dots, a K loop whose last step overhangs the rows (768
    columns in steps of 512) or one step of a padded block (576 in a block of 1,024: SmolLM2's
    rows; whole blocks of 32 only): the sums are float64's of x rounded per group to f32 summation
    order (the integer sums are exact; f32 rounds each group's scaled sum and the sum of groups),
    and within the rounding's bound of the unrounded product."""
    if K % dtype.quant.block:
        pytest.skip(f"{dtype}: {K} columns are not whole blocks")
    y, source, x, w, r = int_gemv(dtype, K, bk, "cpu", f"int{xbits}")
    assert f"_pto_dqx{xbits}_dot_{dtype.short}" in source and "inline_asm" not in source
    ref, bound, _ = int_reference(dtype, w, x, 3, 36, xbits)
    scale = float((x.abs() @ w.dequantize()[3:39].abs().T).max())
    torch.testing.assert_close(y.double(), ref + r.double(), rtol=1e-5, atol=2e-6 * scale)
    exact = x.double() @ w.dequantize()[3:39].double().T + r.double()
    assert bool(((y.double() - exact).abs() <= bound * 1.001 + 2e-6 * scale).all())
    assert float((y.double() - exact).abs().max()) > 0  # the rounding is there: x is not integers


@pytest.mark.parametrize("mode,bits", [("int8", 8), ("int16", 16), ("auto", 16)])
def test_which_formats_take_integer_dots_and_the_others_fall_back(mode, bits):
    """Planes of 1-, 2-, 4- or 8-bit integers, each scale's elements whole 32-bit words: Q4_0,
    Q4_1, Q8_0, Q4_K, Q6_K (two planes, scales per 16), Q5_0, Q5_1, Q5_K (a 1-bit plane, two
    16-bit words a group joined); fp8 by half dots (tests/codegen/test_triton_half_dots.py);
    "auto" (a GPU's default) takes 16-bit x for every format that allows it."""
    from pto.incore.gemv import gemv_residual_tile

    from pto.codegen.triton import render

    assert {d.short for d in INT8} == {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"}
    ptx = "dp4a.s32.s32" if bits == 8 else "dp2a.lo.s32.s32"
    for name in ("q6_k", "fp8", "q5_k", "q5_0", "q5_1", "q4_k", "q8_0"):
        ints = name != "fp8" and (mode != "auto" or name in QGEMV_INT_AUTO)
        dot = f"_pto_dqx{bits}_dot_{name}(" if ints else "_pto_dqh_dot_fp8(" if name == "fp8" else \
            f"_pto_dqg_dot_{name}("
        fn = specialize(gemv_residual_tile(f32, 1, 1024, 64, 8, 1024, wdtype=dtype_of(name)))
        src = render(fn, RenderOptions(qgemv=mode, asm=True)).source
        assert dot in src, name
        assert (ptx in src) == ints, name
        # the 5-bit formats' high bits spread into their nibbles' bytes (times 0x410410), no dots of their own
        assert ("* 4260880)" in src) == (ints and name.startswith("q5")), name


def test_the_interpreters_integer_dots_are_ptxs():
    """The interpreter's ``_pto_dp4a``, ``_pto_dp2a_lo`` and ``_hi`` (Triton's operators) on
    random words against PTX's definitions of ``dp4a.s32.s32`` (four signed bytes' products
    summed onto c) and ``dp2a.lo``/``.hi.s32.s32`` (a's two signed halves times b's bytes 0 and 1,
    or 2 and 3), modulo 2^32; the packs (``prmt``) against the words they make."""
    import numpy as np

    ns: dict = {}
    exec("\n".join(render_int_dots(False)).replace("@triton.jit\n", ""), ns)  # numpy runs the same operators
    g = np.random.default_rng(3)
    a, b, c = (g.integers(-2**31, 2**31, 1000, dtype=np.int64).astype(np.int32) for _ in range(3))
    sa, sb = (v.view(np.int8).reshape(-1, 4).astype(np.int64) for v in (a, b))
    ha = a.view(np.int16).reshape(-1, 2).astype(np.int64)
    wrap = lambda v: (c.astype(np.int64) + v + 2**31) % 2**32 - 2**31  # noqa: E731
    want = {"_pto_dp4a": wrap((sa * sb).sum(1)), "_pto_dp2a_lo": wrap((ha * sb[:, :2]).sum(1)),
            "_pto_dp2a_hi": wrap((ha * sb[:, 2:]).sum(1))}
    for name, value in want.items():
        with np.errstate(over="ignore"):
            got = ns[name](a, b, c)
        assert np.array_equal(got.astype(np.int64), value), name
    # the packs: the low 16 bits of a then b; the low bytes of a, b, c, d (PTX's prmt selectors)
    d = g.integers(-2**31, 2**31, 1000, dtype=np.int64).astype(np.int32)
    lo16 = lambda v: v.view(np.uint16).reshape(-1, 2)[:, 0].astype(np.int64)  # noqa: E731
    lo8 = lambda v: v.view(np.uint8).reshape(-1, 4)[:, 0].astype(np.int64)  # noqa: E731
    signed = lambda v: (v + 2**31) % 2**32 - 2**31  # noqa: E731
    with np.errstate(over="ignore"):
        assert np.array_equal(ns["_pto_pack2"](a, b).astype(np.int64), signed(lo16(a) | lo16(b) << 16))
        assert np.array_equal(ns["_pto_pack4"](a, b, c, d).astype(np.int64),
                              signed(lo8(a) | lo8(b) << 8 | lo8(c) << 16 | lo8(d) << 24))
    src = "\n".join(render_int_dots(True))
    assert all(f"{op}.s32.s32 $0, $1, $2, $3;" in src for op in ("dp4a", "dp2a.lo", "dp2a.hi"))
    assert "prmt.b32 $0, $1, $2, 0x5410;" in src


@pytest.mark.parametrize("mode", ["int8", "int16"])
def test_pto_qgemv_takes_the_integer_modes(monkeypatch, mode):
    monkeypatch.setenv("PTO_QGEMV", mode)
    assert TritonBackend("cpu").options.qgemv == mode
    assert not TritonBackend("cpu").options.asm  # the interpreter: no inline assembly


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["q4_0", "q4_k", "q6_k"])
@interpreted
def test_a_steps_error_from_xs_rounding_follows_its_step(quantize, monkeypatch):
    """The decode step through the interpreter with every GEMV's product as integer dots: the
    logits' error from the reference on the dequantized weights is x's rounding's, so it scales
    with the step of x's integers: 8-bit x's (1/127 of a group's largest magnitude) about 258
    times 16-bit x's (1/32767); a ratio within 4x of that (the errors are sums of many roundings:
    their ratio is the steps' only on average), and the 16-bit step's logits within 1e-3 of the
    reference's (half a step is 1.5e-5 of a group's largest x; a layer's few products and the
    norms amplify it by less than 100)."""
    from dataclasses import replace

    from pto.orchestration.llama.config import LlamaConfig
    from pto.orchestration.model import program as mp

    from pto.cli.commands.run import run

    config = "tiny"
    if quantize != "q4_0":  # whole 256-element blocks
        config = "tiny-256"
        monkeypatch.setitem(mp.CONFIGS, config, replace(mp.CONFIGS["tiny"], layers=1, layer=LlamaConfig(
            hidden=256, heads=4, head_dim=64, ffn=512, kv_heads=2)))
    err = {}
    for mode in ("int8", "int16"):
        monkeypatch.setenv("PTO_QGEMV", mode)
        res = run("model", config=config, cache=64, batch=1, device="cpu", backend="triton", check=True,
                  quantize=quantize)
        err[mode] = res["rel_err"]
    assert err["int16"] <= 1e-3, err
    assert 258 / 4 <= err["int8"] / err["int16"] <= 258 * 4, err
