"""bench/gluon_q4.py's operands on the CPU (its kernels need a GPU: ``dp4a`` and Gluon): the
float64 reference it checks the kernels against is the product of the weights dequantized
(``d * q + m`` a group of 32) and x dequantized (``dx * xq``), unpacked here from the bytes
independently of the script; the kernels' arithmetic, emulated in numpy word by word (each
weight word's low nibbles against x's even word, its high nibbles against the odd one), gives
the same sums exactly; the ``tiled`` repacking puts each block's chunk where the ring's offsets
(restated here: the ring itself needs a GPU) read it; and the ``read`` kernel, under the
interpreter, sums every word once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

_BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("gluon_q4_bench", _BENCH / "gluon_q4.py")
q4 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(q4)

N, K = 64, 2 * q4.BK


@pytest.fixture(scope="module")
def ops():
    return q4.Operands(N, K, copies=1, seed=5, device="cpu")


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.uint8)


def test_the_reference_is_the_dequantized_product(ops):
    wb = _bytes(ops.Q[0]).reshape(N, K // 2)  # byte k of a row: values 2k (low nibble) and 2k + 1
    q = np.stack([wb & 15, wb >> 4], axis=-1).reshape(N, K).astype(np.float64)
    dm = _bytes(ops.SC[0]).view(np.float16).reshape(N, K // 32, 2).astype(np.float64)
    w = dm[:, :, :1] * q.reshape(N, K // 32, 32) + dm[:, :, 1:]
    xq = np.stack([_bytes(ops.XLO).view(np.int8).reshape(K // 8, 4),
                   _bytes(ops.XHI).view(np.int8).reshape(K // 8, 4)], axis=-1).reshape(K).astype(np.float64)
    dx = ops.DX.double().numpy()
    assert (np.abs(xq.reshape(K // 32, 32)).max(axis=1) == 127).all()  # (every group's largest at 127)
    np.testing.assert_allclose(ops.SX.double().numpy(), dx * xq.reshape(K // 32, 32).sum(axis=1), rtol=1e-6)
    y = (w * (dx[:, None] * xq.reshape(K // 32, 32))[None]).sum(axis=(1, 2))
    ref = ops.ref.numpy()
    assert np.abs(ref).max() > 0
    np.testing.assert_allclose(ref, y, rtol=0, atol=1e-6 * np.abs(ref).max())


def test_the_kernels_word_pairing_gives_the_reference(ops):
    w = ops.Q[0].numpy().view(np.uint32)
    lo = ((w & 0x0F0F0F0F)[..., None] >> np.array([0, 8, 16, 24], dtype=np.uint32)) & 0xFF
    hi = (((w >> 4) & 0x0F0F0F0F)[..., None] >> np.array([0, 8, 16, 24], dtype=np.uint32)) & 0xFF
    xlo = _bytes(ops.XLO).view(np.int8).reshape(K // 8, 4).astype(np.int64)
    xhi = _bytes(ops.XHI).view(np.int8).reshape(K // 8, 4).astype(np.int64)
    words = (lo.astype(np.int64) * xlo).sum(-1) + (hi.astype(np.int64) * xhi).sum(-1)  # two dp4a a word
    idot = words.reshape(N, K // 32, 4).sum(-1)
    dm = _bytes(ops.SC[0]).view(np.float16).reshape(N, K // 32, 2).astype(np.float64)
    y = (dm[..., 0] * ops.DX.double().numpy() * idot + dm[..., 1] * ops.SX.double().numpy()).sum(axis=1)
    np.testing.assert_allclose(y, ops.ref.numpy(), rtol=0, atol=1e-12 * np.abs(y).max())


@pytest.mark.parametrize("R", [8, 16])
def test_tiled_puts_each_blocks_chunk_where_the_ring_reads_it(ops, R):
    (Qt,), (St,) = ops.tiled(R)
    flat_q, flat_s = Qt.reshape(-1), St.reshape(-1)
    nk, wpc, gpc = K // q4.BK, q4.BK // 8, q4.BK // 32
    for block in (0, N // R - 1):
        for kk in range(nk):
            base = (block * nk + kk) * R  # the ring's (block * NK + kk) * R * (BK // 8), in chunk rows
            got = flat_q[base * wpc:(base + R) * wpc].reshape(R, wpc)
            assert torch.equal(got, ops.Q[0][block * R:(block + 1) * R, kk * wpc:(kk + 1) * wpc])
            got = flat_s[base * gpc:(base + R) * gpc].reshape(R, gpc)
            assert torch.equal(got, ops.SC[0][block * R:(block + 1) * R, kk * gpc:(kk + 1) * gpc])


@pytest.mark.interpret
def test_the_read_kernel_reads_every_word_once():
    g = torch.Generator().manual_seed(2)
    # (sums of 64 words that fit in int32: Triton 3.6's interpreter sums in int64 and refuses to
    # narrow a sum past int32, where a GPU and Triton 3.9 wrap)
    Q = torch.randint(-2 ** 24, 2 ** 24, (3 * 64 + 5,), dtype=torch.int32, generator=g)
    SC = torch.randint(-2 ** 24, 2 ** 24, (64 + 9,), dtype=torch.int32, generator=g)
    block = 64
    out = torch.zeros(-(-Q.numel() // block) - (-SC.numel() // block), dtype=torch.int32)
    q4.read_words[(out.numel(),)](Q, SC, out, NQ=Q.numel(), NS=SC.numel(), BLOCK=block)
    want = torch.cat([Q, torch.zeros(-Q.numel() % block, dtype=torch.int32), SC,
                      torch.zeros(-SC.numel() % block, dtype=torch.int32)]).reshape(-1, block).long().sum(dim=1)
    assert torch.equal(out.long() % 2 ** 32, want % 2 ** 32)
