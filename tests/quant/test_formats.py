"""The quantized formats against the ``gguf`` package: GGUF's blocks repacked into rows of planes
dequantize to ``gguf.quants.dequantize``'s values bit for bit (random blocks with finite scales,
every type), pto's q8_0 and q4_0 quantizers give the reference quantizer's blocks byte for byte,
fp8 round-trips within E4M3's rounding, and the row layout's sizes are what the docs say."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pto.errors import BuildError, UsageError
from pto.ir.dtypes import QUANTIZED, DType, dtype_of
from pto.ir.quant import BY_GGUF, FORMATS
from pto.quant import QTensor, dequantize_rows, dequantize_tiles, from_gguf, quantize

gguf = pytest.importorskip("gguf", reason="needs `gguf` (pip install 'pto[model]')")

#: where each GGUF block keeps its f16 scales (made finite: random bytes may be inf or NaN)
F16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random GGUF blocks (every byte random, but the f16 scales: normal, finite)."""
    fmt = BY_GGUF[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, blocks, fmt.gguf_block_bytes), dtype=np.uint8)
    for at in F16_AT[qtype]:
        raw[..., at:at + 2] = (rng.standard_normal((rows, blocks, 1)) * 2.0 ** rng.integers(-12, 6)) \
            .astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def gguf_values(qtype: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(raw.shape[0], -1))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.to(torch.float32).contiguous().view(torch.int32))


@pytest.mark.parametrize("qtype", sorted(BY_GGUF))
def test_repacked_rows_dequantize_to_ggufs_values_bit_for_bit(qtype):
    fmt = BY_GGUF[qtype]
    raw = random_blocks(qtype, 7, 5, seed=len(qtype) + fmt.block)
    cols = 5 * fmt.block
    rows = from_gguf(fmt, torch.from_numpy(raw), cols)
    assert rows.shape == (7, fmt.row_bytes(cols)) and rows.dtype == torch.uint8
    assert same_bits(dequantize_rows(fmt, rows, cols), gguf_values(qtype, raw))


@pytest.mark.parametrize("qtype", sorted(BY_GGUF))
def test_tiles_at_block_offsets_are_the_rows_values(qtype):
    """The evaluator's tile reads (rows and a block-aligned column start per instance) give the
    whole rows' values at those places."""
    fmt = BY_GGUF[qtype]
    cols = 6 * fmt.block
    raw = random_blocks(qtype, 9, 6, seed=3)
    data = from_gguf(fmt, torch.from_numpy(raw), cols)
    full = gguf_values(qtype, raw)
    rows = torch.tensor([[0, 4], [8, 1], [3, 3]])
    c0 = torch.tensor([0, 2 * fmt.block, 4 * fmt.block])
    got = dequantize_tiles(fmt, data, cols, rows, c0, 2 * fmt.block)
    for i in range(3):
        want = full[rows[i]][:, int(c0[i]):int(c0[i]) + 2 * fmt.block]
        assert same_bits(got[i], want)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_ptos_quantizer_is_the_reference_quantizers(qtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 320, generator=g) * torch.rand(48, 1, generator=g) * 3
    w[0, :32] = 0  # a zero block: scale 0
    w[1, 5], w[1, 9] = 4.0, -4.0  # ties of the largest magnitude: the first wins
    fmt = BY_GGUF[qtype]
    ref = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[qtype])
    assert torch.equal(quantize(fmt, w), from_gguf(fmt, torch.from_numpy(ref), 320))


def test_fp8_rows_round_to_e4m3_with_a_scale_per_row():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 64, generator=g) * torch.logspace(-3, 2, 16).view(16, 1)
    w[3] = 0.0
    q = QTensor.quantize("fp8", w)
    assert q.data.shape == (16, 16 + 64)
    back = q.dequantize()
    scale = w.abs().amax(1, keepdim=True) / 448
    # E4M3 keeps 3 bits: a relative rounding error of at most 2^-4 above its normal range's
    # bottom (2^-6 of the scale), an absolute 2^-10 of the scale below it
    err = (back - w).abs()
    assert (err <= torch.maximum(w.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 1e-6)).all()
    assert torch.equal(back[3], torch.zeros(64))
    # a row's largest magnitude takes E4M3's largest code, 448
    assert torch.equal(back.abs().amax(1), torch.where(w.abs().amax(1) == 0, 0.0, 448 * scale.view(-1)))


def test_qtensor_checks_its_buffer_and_keeps_rows_as_rows():
    w = torch.randn(8, 64)
    q = QTensor.quantize("q8_0", w)
    assert q.shape == (8, 64) and q.nbytes == 8 * FORMATS["q8_0"].row_bytes(64)
    assert torch.equal(q.take_rows(slice(2, 5)).dequantize(), q.dequantize()[2:5])
    perm = torch.tensor([3, 0, 7])
    assert torch.equal(q.take_rows(perm).dequantize(), q.dequantize()[perm])
    both = QTensor.cat([q, q.take_rows(perm)]).dequantize()
    assert torch.equal(both, torch.cat([q.dequantize(), q.dequantize()[perm]]))
    with pytest.raises(ValueError, match="uint8"):
        QTensor(DType.Q8_0, q.data[:, :-16], 64)
    with pytest.raises(BuildError, match="not whole blocks of 32"):
        QTensor.quantize("q4_0", torch.randn(2, 48))
    with pytest.raises(UsageError, match="not q4_k"):
        QTensor.quantize("q4_k", w)


def test_row_layout_sizes():
    """A row is whole blocks of every plane, 16-byte aligned; the same bytes as GGUF's blocks but
    for the padding and the k-quants' unpacked 6-bit scales."""
    for d in QUANTIZED:
        f = d.quant
        assert d.storage_shape(3, 4 * f.block) == (3, f.row_bytes(4 * f.block))
        assert f.row_bytes(f.block) % 16 == 0 and f.blocks_of_row(f.row_bytes(7 * f.block)) == 7
        if f.gguf:
            extra = {"Q4_K": 4, "Q5_K": 4}.get(f.gguf, 0)
            assert f.block_bytes == f.gguf_block_bytes + extra
    assert FORMATS["q4_k"].bits_per_weight == 4.625 and FORMATS["q6_k"].row_bytes(4096) == 16 * 210
    assert dtype_of("q4_k") is DType.Q4_K and DType.Q4_K.torch is torch.uint8
    with pytest.raises(BuildError, match="unknown dtype"):  # a buffer's uint8 is no compute type
        dtype_of(torch.uint8)


@pytest.mark.parametrize("qtype", ["q4_k", "q5_k"])
def test_a_pair_of_scale_planes_is_stored_interleaved(qtype):
    """Q4_K's and Q5_K's sub-block scale and minimum, and their block's d and dmin, are pairs:
    each group's two values side by side (one load of twice the width reads both), where
    ``plane_offset``, ``offset_code`` and ``stride`` say; every other plane as before; a pair of
    planes that are not neighbours, or not alike, is refused."""
    from pto.ir.quant import Plane, QuantFormat
    from pto.quant.planes import pack_rows

    fmt, rows, blocks = FORMATS[qtype], 3, 2
    cols = blocks * fmt.block
    g = torch.Generator().manual_seed(7)
    fields = {p.name: (torch.randint(0, 64, (rows, cols // p.group), generator=g).to(torch.uint8) if p.kind == "u"
                       else torch.rand(rows, cols // p.group, generator=g).to(torch.float16))
              for p in fmt.planes}
    data = pack_rows(fmt, fields, cols)
    assert fmt.pairs == (("sc", "m"), ("d", "dmin")) and fmt.stride("sc") == 2 and fmt.stride("d") == 4
    assert fmt.plane_offset("m", blocks) == fmt.plane_offset("sc", blocks) + 1
    assert fmt.plane_offset("dmin", blocks) == fmt.plane_offset("d", blocks) + 2
    for name in ("sc", "m"):
        at = fmt.plane_offset(name, blocks)
        assert torch.equal(data[:, at:at + 2 * cols // 32:2], fields[name])
        assert eval(fmt.offset_code()[name], {"nb": blocks}) == at
    for name in ("d", "dmin"):
        at = fmt.plane_offset(name, blocks)
        got = data[:, at:at + 4 * blocks].reshape(rows, blocks, 2, 2)[:, :, 0].contiguous().view(torch.float16)
        assert torch.equal(got.reshape(rows, blocks), fields[name])
        assert eval(fmt.offset_code()[name], {"nb": blocks}) == at
    # (the pairs right after the element planes, the row's bytes as before)
    assert fmt.plane_offset("sc", blocks) == blocks * sum(p.block_bytes(fmt.block) for p in fmt.planes if p.group == 1)
    assert data.shape[1] == fmt.row_bytes(cols)
    assert FORMATS["q4_1"].pairs == (("d", "m"),) and FORMATS["q4_1"].stride("m") == 4  # (Q4_1's d and m too)
    planes = (Plane("q", 4, 1, "u"), Plane("d", 16, 32, "f16"), Plane("m", 16, 32, "f16"), Plane("s", 8, 32, "u"),
              Plane("t", 8, 32, "u"), Plane("u", 16, 32, "u"))
    QuantFormat("x", 32, planes, fmt.dequantize, pairs=(("d", "m"), ("s", "t")))  # (a well-formed pair)
    for pairs in ((("m", "s"),),  # unlike planes
                  (("d", "s"),),  # not neighbours
                  (("d", "m"), ("m", "s")),  # a plane in two pairs
                  (("t", "u"),),  # unlike kinds and widths
                  (("d", "x"),)):  # no such plane
        with pytest.raises(ValueError, match="cannot be a pair"):
            QuantFormat("x", 32, planes, fmt.dequantize, pairs=pairs)
    with pytest.raises(ValueError, match="cannot be a pair"):  # 2-byte words after a plane of 1 byte a block
        QuantFormat("x", 8, (Plane("q", 1, 1, "u"), Plane("d", 8, 8, "u"), Plane("m", 8, 8, "u")), fmt.dequantize,
                    pairs=(("d", "m"),))
