"""SRAM-aware tiling: the target table, the seed's tile-size table, the flash-attention SRAM
model and the live-tile check."""

from __future__ import annotations

import pytest
from pto.orchestration.llama.tiling import flash_sram_bytes, flash_tile_rows

from pto import InCore, bf16, f16, f32
from pto.errors import SramError
from pto.machine.target import KiB, get
from pto.passes.tiling import check_sram, compute_tile_shape


@pytest.mark.parametrize("target,dtype,shape", [
    ("arm64", f32, (1, 4096)), ("arm64", f16, (1, 8192)), ("arm64", bf16, (1, 8192)),
    ("cuda_h100", f32, (1, 4096)), ("cuda_h100", f16, (1, 8192)),
    ("ascend910b", f32, (32, 128)), ("ascend910b", f16, (32, 256)),
])
def test_seed_tile_sizes_by_isa(target, dtype, shape):
    assert compute_tile_shape(dtype, get(target)) == shape


def test_seed_sram_analysis_256k():
    """d = 128, f32: 32 rows = 68 KiB, 64 rows = 144 KiB fit 256 KiB; 128 rows (320 KiB) do not."""
    assert flash_sram_bytes(32, 128, f32) == 68 * KiB
    assert flash_sram_bytes(64, 128, f32) == 144 * KiB
    assert flash_sram_bytes(128, 128, f32) == 320 * KiB
    assert flash_tile_rows(get("ascend910b"), 128, f32) == 64


def test_h100_bf16_takes_taller_tiles():
    assert flash_tile_rows(get("cuda_h100"), 128, f32) == 64
    assert flash_tile_rows(get("cuda_h100"), 128, bf16) == 128


def _flash_block(rows, d=128, dtype=f32):
    k = InCore("flash_block")
    q, kk, v, o = (k.memref(n, dtype) for n in ("q", "k", "v", "o"))
    Q, K, V, O = (k.tile(n, rows, d, dtype) for n in ("Q", "K", "V", "O"))
    S = k.tile("S", rows, rows, dtype)
    k.full(O, 0.0)  # the output accumulator lives across the whole block
    k.load(Q, q, 0, 0)
    k.load(K, kk, 0, 0)
    k.load(V, v, 0, 0)
    k.matmul(S, Q, K, tb=True, acc="f32")
    k.matmul_acc(O, S, V)
    k.store(o, 0, 0, O)
    return k


def test_build_rejects_tiles_over_sram_naming_them():
    with pytest.raises(SramError, match=r"`flash_block` needs 320.0 KiB of live tiles \(.*S 64.0 KiB.*\) "
                                        r"but target ascend910b has 256.0 KiB"):
        _flash_block(128).build(target=get("ascend910b"))
    fn = _flash_block(64).build(target=get("ascend910b"))
    assert check_sram(fn, get("ascend910b")) <= 144 * KiB


def test_liveness_frees_dead_tiles():
    """Tiles whose lives do not overlap do not add up."""
    k = InCore("seq")
    x, y = k.memref("x", bf16), k.memref("y", bf16)
    a = k.tile("a", 128, 256, bf16)
    b = k.tile("b", 128, 256, bf16)
    k.load(a, x, 0, 0)
    k.store(y, 0, 0, a)
    k.load(b, x, 0, 256)
    k.store(y, 0, 256, b)
    fn = k.build()
    assert check_sram(fn, get("arm64")) == 64 * KiB
