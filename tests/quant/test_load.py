"""Loads of quantized memrefs in the IR and the reference evaluator: a tile load dequantizes the
blocks it covers (the values of :func:`pto.quant.QTensor.dequantize`, bit for bit, ``pad``
outside the region, rounded to the tile's dtype), a GEMV against quantized weights computes
exactly what it computes against the dequantized ones, and the verifier, the text form and the
SRAM rule know the types."""

from __future__ import annotations

import pytest
import torch
from pto.incore.gemv import gemv_norm_tile, gemv_residual_tile

from pto import InCore, format_module, parse_module
from pto.errors import BuildError, ExecutionError, SramError
from pto.interp.incore import run_incore
from pto.ir.analysis import live_tiles_peak, specialize
from pto.ir.dtypes import QUANTIZED, DType, bf16, f32
from pto.machine.target import get as get_target
from pto.passes.tiling import check_sram
from pto.quant import QTensor
from tests.quant.test_formats import BY_GGUF, from_gguf, random_blocks


def random_qtensor(dtype: DType, rows: int, cols: int, seed: int) -> QTensor:
    """Random blocks of any format (GGUF's through their blocks, fp8 through pto's quantizer)."""
    q = dtype.quant
    if q.gguf is None:
        g = torch.Generator().manual_seed(seed)
        return QTensor.quantize(dtype, torch.randn(rows, cols, generator=g) * 3)
    raw = random_blocks(q.gguf, rows, cols // q.block, seed)
    return QTensor(dtype, from_gguf(BY_GGUF[q.gguf], torch.from_numpy(raw), cols), cols)


def copy_fn(wdtype: DType, tdtype: DType, R: int, C: int, K: int):
    """``y[:, :] = w[j * R:, kk:]`` tile by tile (a loop over K, row blocks on the axis)."""
    k = InCore("dq_copy")
    w = k.memref("w", wdtype)
    y = k.memref("y", tdtype)
    j = k.parallel("j", 2)
    t = k.tile("t", R, C, tdtype)
    with k.for_range("kk", 0, K, C) as kk:
        k.load(t, w, j * R, kk, pad=-7.0)
        k.store(y, j * R, kk, t)
    return k.build()


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_a_tile_load_dequantizes_its_blocks(dtype):
    b = dtype.quant.block
    K = 3 * b
    q = random_qtensor(dtype, 12, K + b, seed=5)
    full = q.dequantize()
    # the region: rows 1.., columns from the second block, one block short at the end of the
    # last tile (3 x 5 rows of which the region has 9: the rest padded)
    y = torch.full((10, K), float("nan"))
    run_incore(copy_fn(dtype, f32, 5, b, K), {"w": (q.data, 1, b, 9, K - b), "y": (y, 0, 0, 10, K)})
    want = torch.full((10, K), -7.0)
    want[:9, :K - b] = full[1:10, b:K]
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))


def test_a_tile_load_rounds_to_the_tiles_dtype():
    q = random_qtensor(DType.Q4_K, 4, 256, seed=1)
    y = torch.zeros(4, 256, dtype=torch.bfloat16)
    run_incore(copy_fn(DType.Q4_K, bf16, 2, 256, 256), {"w": (q.data, 0, 0, 4, 256), "y": (y, 0, 0, 4, 256)})
    assert torch.equal(y, q.dequantize(torch.bfloat16))


@pytest.mark.parametrize("dtype", [DType.Q4_1, DType.Q8_0, DType.Q6_K, DType.FP8], ids=str)
def test_a_gemv_against_quantized_weights_is_the_gemv_against_their_values(dtype):
    K, N = 512, 24
    q = random_qtensor(dtype, N, K, seed=7)
    g = torch.Generator().manual_seed(3)
    x, r, gain = torch.randn(2, K, generator=g), torch.randn(2, N, generator=g), torch.randn(1, K, generator=g)
    for build, extra in ((lambda **kw: gemv_residual_tile(f32, 2, K, N, 8, 256, **kw), {"r": r}),
                         (lambda **kw: gemv_norm_tile(f32, 2, K, N, 8, 256, 1e-5, **kw), {"g": gain})):
        outs = []
        for w, kw in ((q.data, {"wdtype": dtype}), (q.dequantize(), {})):
            fn = specialize(build(**kw))
            y = torch.full((2, N), float("nan"))
            regions = {"x": (x, 0, 0, 2, K), "w": (w, 0, 0, N, K), "y": (y, 0, 0, 2, N)}
            regions.update({n: (v, 0, 0, *v.shape) for n, v in extra.items()})
            run_incore(fn, regions, {})
            outs.append(y)
        assert torch.equal(outs[0], outs[1])


def test_a_load_off_the_blocks_fails_at_run_time():
    q = random_qtensor(DType.Q8_0, 4, 64, seed=2)
    y = torch.zeros(4, 64)
    with pytest.raises(ExecutionError, match="starts at column 16, not a multiple of its block of 32"):
        run_incore(copy_fn(DType.Q8_0, f32, 2, 32, 32), {"w": (q.data, 0, 16, 4, 48), "y": (y, 0, 0, 4, 64)})


def _fn(body, wdtype=DType.Q4_0, cols=64):
    k = InCore("bad")
    w = k.memref("w", wdtype)
    y = k.memref("y", f32)
    t = k.tile("t", 2, cols, f32)
    body(k, w, y, t)
    return k.build()


@pytest.mark.parametrize("body, message", [
    (lambda k, w, y, t: (k.load(t, w, 0, 0), k.store(w, 0, 0, t)), "never store into it"),
    (lambda k, w, y, t: (k.load(t, w, 0, 0, step=2), k.store(y, 0, 0, t)), "step 1"),
    (lambda k, w, y, t: (k.load(t, w, 0, 16), k.store(y, 0, 0, t)), "not shown to be a multiple of its block of 32"),
])
def test_the_verifier_refuses_what_a_quantized_memref_cannot_do(body, message):
    with pytest.raises(BuildError, match=message):
        _fn(body)


def test_the_verifier_refuses_quantized_tiles_and_partial_blocks():
    with pytest.raises(BuildError, match="whole blocks of 256 columns"):
        _fn(lambda k, w, y, t: (k.load(t, w, 0, 0), k.store(y, 0, 0, t)), DType.Q4_K, cols=128)
    with pytest.raises(BuildError, match="dequantizes into a tile of f32, f16 or bf16"):
        k = InCore("bad")
        w = k.memref("w", DType.Q4_0)
        t = k.tile("t", 2, 32, DType.Q4_0)
        k.load(t, w, 0, 0)
        k.build()
    with pytest.raises(BuildError, match="offset `%kk \\+ 1`"):
        def body(k, w, y, t):
            with k.for_range("kk", 0, 128, 32) as kk:
                k.load(t, w, 0, kk + 1)
                k.store(y, 0, kk, t)
        _fn(body, cols=32)


def test_text_form_and_sram_rule_know_quantized_memrefs():
    fn = gemv_residual_tile(bf16, 1, 4096, 4096, 4, 1024, wdtype=DType.Q4_K)
    from pto.builder.orchestration import Orchestration

    o = Orchestration("step")
    x, w, y = o.input("x", 1, 4096, bf16), o.input("w", 4096, 4096, DType.Q4_K), o.output("y", 1, 4096, bf16)
    o.call(fn, {"x": x, "w": w, "r": x, "y": y})
    m = o.module()
    text = format_module(m)
    assert "memref q4_k" in text and "tensor %w : [4096, 4096] q4_k input" in text
    assert format_module(parse_module(text)) == text
    # the packed blocks of a 4 x 1024 weight tile (4 rows of 4 blocks of 148 bytes) are live
    # while its load dequantizes it
    peak, names = live_tiles_peak(specialize(fn))
    assert "b (packed)" in names
    h100 = get_target("cuda_h100")
    assert check_sram(specialize(fn), h100) == peak
    # 96 rows: the bf16 tile (192 KiB) fits an H100's 227 KiB, with its packed blocks (96 x 4 x
    # 148 bytes) it does not
    with pytest.raises(SramError, match=r"b \(packed\) 55\.5 KiB"):
        check_sram(specialize(gemv_residual_tile(bf16, 1, 4096, 4096, 96, 1024, wdtype=DType.Q4_K)), h100)
    with pytest.raises(BuildError, match="an input"):
        o2 = Orchestration("bad")
        o2.temp("w", 4, 64, DType.Q8_0)


def test_on_a_cpu_a_gemvs_quantized_tile_counts_its_packed_blocks():
    """The c backend's GEMV never makes the quantized weight tile of a product of up to
    DOT_ROWS rows (it reads the rows as stored): on a CPU target the SRAM rule counts its packed
    blocks only, so a 32 x 1536 f32 tile (192 KiB, far past the x86_64 target's 48 KiB) of Q4_1
    weights fits as its 30 KiB of blocks, for 1 row and for 2 (their x tile beside it); a GPU
    target still counts the values (the Triton kernels hold them), and so does a CPU for a product
    of more rows (that C kernel dequantizes a tile)."""
    from pto.incore.gemv import gemv_residual_tile

    from pto.ir.analysis import DOT_ROWS

    cpu, h100 = get_target("x86_64"), get_target("cuda_h100")
    one = specialize(gemv_residual_tile(f32, 1, 1536, 576, 32, 1536, wdtype=DType.Q4_1))
    peak = check_sram(one, cpu)
    assert 32 * 1536 // 32 * 20 <= peak < 48 * 1024
    two = specialize(gemv_residual_tile(f32, 2, 1536, 576, 32, 1536, wdtype=DType.Q4_1))
    assert check_sram(two, cpu) == peak + 1536 * 4 + 32 * 4  # x's row more, and acc's
    with pytest.raises(SramError, match=r"b 192\.0 KiB"):
        check_sram(one, h100)
    with pytest.raises(SramError, match=r"b 192\.0 KiB"):
        check_sram(specialize(gemv_residual_tile(f32, DOT_ROWS + 1, 1536, 576, 32, 1536, wdtype=DType.Q4_1)), cpu)


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_the_values_part_in_their_fields_and_their_constant(dtype):
    """``dequantize_parts``: ``A * E`` and ``B`` of every format's affine form add up to the values
    (to f32 rounding of the sum), ``B`` is the values the blocks' scales give a field of zero
    (Q4_0's ``-8 d``, Q4_1's minimum, none for Q8_0 and fp8) and ``A * E`` is zero where the
    fields are."""
    from pto.quant.planes import dequantize_parts, dequantize_rows, row_values

    fmt = dtype.quant
    q = random_qtensor(dtype, 6, 2 * fmt.block, seed=3)
    fields, const = dequantize_parts(fmt, q.data, q.cols)
    whole = dequantize_rows(fmt, q.data, q.cols)
    torch.testing.assert_close(fields + const, whole, rtol=2 ** -23, atol=0)
    vals = row_values(fmt, q.data, q.cols)
    if dtype.short == "q4_0":
        assert torch.equal(const, -8 * vals["d"])
    elif dtype.short == "q4_1":
        assert torch.equal(const, vals["m"])
    elif dtype.short in ("q8_0", "fp8"):
        assert not bool(const.any())
    zero = torch.stack([vals[p.name] == 0 for p in fmt.planes if p.group == 1]).all(0)
    assert bool((fields[zero] == 0).all()) and (bool(zero.any()) or dtype.short == "fp8")  # (fp8: no zero drawn)
