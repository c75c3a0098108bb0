"""Tensor-descriptor (TMA) loads (``RenderOptions.tma``, pto.codegen.triton.tma): which memrefs
qualify, what the kernel renders, the descriptors the backend passes per launch (only where
every task keeps its accesses inside its region and the tensor suits the hardware), and the
PTX Triton makes of the descriptor path for an H100 (compiled without a GPU)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
from pto.incore.attention import flash_fused  # noqa: E402
from pto.incore.matmul import matmul_tile  # noqa: E402
from pto.incore.norm import rmsnorm_tile  # noqa: E402

from pto.backends.triton import TritonBackend, tma_mode  # noqa: E402
from pto.backends.triton.launch import LaunchConfig, LaunchGroup, calls, with_descriptors  # noqa: E402
from pto.backends.triton.tables import descriptor_masks, task_env  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.codegen.triton.tma import tma_memrefs  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import UsageError  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from tests.sm90 import compile_sm90  # noqa: E402

BF16 = DType.BF16


def _matmul(rows=128):
    return specialize(matmul_tile(BF16, rows, 256, 512, 256, 64), {"R": rows, "K": 256, "N": 512})


def test_the_operands_of_products_in_loops_qualify():
    """The K loop's x and w tiles qualify, not the stored output; attention's k and v (its kv
    loop), not q (loaded once, before it); nothing of a function without a product; not a
    tile with padding lanes (one descriptor block per memref)."""
    assert tma_memrefs(_matmul()) == {"x": (128, 64), "w": (64, 256)}
    fa = specialize(flash_fused(BF16, 4, 128, 64, 64), {"TQ": 64, "TK": 64})  # kv loop: many trips
    assert set(tma_memrefs(fa)) == {"k", "v"}
    assert tma_memrefs(specialize(rmsnorm_tile(256, BF16, 32, 16, 128, 1e-5))) == {}
    assert "x" not in tma_memrefs(_matmul(100))  # 100 rows: a 128-row block with padding lanes


def test_tiles_of_one_shape_share_a_descriptor_and_of_two_shapes_do_not():
    """A memref loaded in the K loop as two tiles of one shape qualifies (one block shape: the
    q/k projection's halves of each head); as tiles of two shapes it keeps pointer loads."""
    from pto import InCore, f32

    def two_loads(cols2):
        k = InCore("two")
        x, w, y = k.memref("x", BF16), k.memref("w", BF16), k.memref("y", f32)
        a = k.tile("a", 128, 64, BF16)
        b1, b2 = k.tile("b1", 64, 64, BF16), k.tile("b2", 64, cols2, BF16)
        c1, c2 = k.tile("c1", 128, 64, f32), k.tile("c2", 128, cols2, f32)
        k.full(c1, 0.0)
        k.full(c2, 0.0)
        with k.for_range("kk", 0, 512, 64) as kk:
            k.load(a, x, 0, kk)
            k.load(b1, w, kk, 0)
            k.load(b2, w, kk, 64)
            k.matmul_acc(c1, a, b1)
            k.matmul_acc(c2, a, b2)
        k.store(y, 0, 0, c1)
        k.store(y, 0, 64, c2)
        return specialize(k.build())

    assert tma_memrefs(two_loads(64)) == {"x": (128, 64), "w": (64, 64)}
    assert tma_memrefs(two_loads(128)) == {"x": (128, 64)}


def test_small_blocks_and_one_trip_loops_keep_pointer_loads():
    """The decode step's tiles: a projection's 16-row blocks are too small, and an attention
    task whose key loop runs once (a chunk of one key tile) has nothing to run ahead of; a
    chunk of several key tiles qualifies."""
    from pto.incore import decode as dk
    from pto.incore.gemv import gemv_norm_tile

    assert tma_memrefs(specialize(gemv_norm_tile(BF16, 16, 4096, 6144, 16, 128, 1e-5))) == {}
    assert tma_memrefs(specialize(dk.decode_attn_part(BF16, 4, 128, 64, 64))) == {}
    assert tma_memrefs(specialize(dk.decode_attn_part(BF16, 4, 128, 256, 64))) == {"kc": (64, 128),
                                                                                 "vc": (64, 128)}


def test_render_adds_the_descriptor_path_and_keeps_the_schedule_digest():
    plain, tma = render(_matmul()), render(_matmul(), RenderOptions(tma=True))
    assert "D_x" not in plain.source and plain.tma == {}
    assert "if TMA_x:" in tma.source and "D_x.load([" in tma.source and "D_w.load([" in tma.source
    assert "D_y" not in tma.source and tma.tma == {"x": (128, 64), "w": (64, 256)}
    # schedules hold with descriptors on or off; the loader tells the sources apart
    assert tma.schedule_digest == plain.schedule_digest == plain.digest != tma.digest
    assert tma.signature()["D_x"] == tma.signature()["TMA_x"] == "constexpr"


def _batch(fn, x, w, y, rows):
    n = len(rows)

    def rb(t, r0, nr, nc):
        return RegionBatch(t, torch.tensor(r0), torch.zeros(n, dtype=torch.int64), torch.tensor(nr),
                           torch.full((n,), nc))

    return TaskBatch(fn, {"x": rb(x, [128 * i for i in range(n)], rows, 256),
                          "w": rb(w, [0] * n, [256] * n, 512),
                          "y": rb(y, [128 * i for i in range(n)], rows, 512)}, {}, n)


def test_descriptors_where_every_read_stays_in_the_region_or_past_the_tensor():
    """A launch gets descriptors where each task's reads stay inside its region, or overhang it
    only past the tensor's end (a clipped last row tile: the descriptor reads zeros there, as
    the masked load does); a tile clipped inside the tensor keeps x's pointer loads (it would
    read the next rows), w's descriptor stays; a tensor whose rows are not 16-byte aligned
    gets none."""
    fn = _matmul()
    kern = render(fn, RenderOptions(tma=True))
    w, y = torch.zeros(256, 512, dtype=torch.bfloat16), torch.zeros(256, 512, dtype=torch.bfloat16)
    cfg = LaunchConfig(num_warps=8, num_stages=3)

    def kwargs(batch):
        safe = descriptor_masks(fn, task_env(batch), batch, kern.tma)
        group = LaunchGroup(torch.arange(batch.size), (batch.size, 2), {}, torch.zeros(1))
        return with_descriptors(kern, batch, [group], calls([group], (), cfg), safe)[0][2]

    x = torch.zeros(256, 256, dtype=torch.bfloat16)
    full = kwargs(_batch(fn, x, w, y, [128, 128]))
    assert full["TMA_x"] and full["TMA_w"] and full["D_x"].block_shape == [128, 64]
    assert list(full["D_w"].shape) == [256, 512] and full["D_w"].block_shape == [64, 256]
    at_end = kwargs(_batch(fn, torch.zeros(133, 256, dtype=torch.bfloat16), w, y, [128, 5]))
    assert at_end["TMA_x"] and at_end["TMA_w"]
    inside = kwargs(_batch(fn, x, w, y, [128, 5]))
    assert not inside["TMA_x"] and inside["D_x"] is None and inside["TMA_w"]
    odd = torch.zeros(256, 257, dtype=torch.bfloat16)[:, :256]  # rows 514 bytes apart
    bad = kwargs(_batch(fn, odd, w, y, [128, 128]))
    assert not bad["TMA_x"] and bad["D_x"] is None and bad["TMA_w"]


def test_tma_needs_a_compiled_sm90_kernel(monkeypatch):
    with pytest.raises(UsageError, match="compute capability 9.0"):
        TritonBackend("cpu", RenderOptions(tma=True))
    assert not TritonBackend("cpu").options.tma  # the default (on for sm_90) where it cannot hold
    monkeypatch.setenv("PTO_TMA", "on")  # the environment's wish where it cannot hold: pointer loads
    assert not TritonBackend("cpu").options.tma
    assert tma_mode((9, 0)) and not tma_mode((8, 0)) and not tma_mode((9, 0), compiles=False)
    monkeypatch.setenv("PTO_TMA", "off")
    assert not tma_mode((9, 0))
    monkeypatch.setenv("PTO_TMA", "maybe")
    with pytest.raises(UsageError, match="PTO_TMA='maybe': on or off"):
        TritonBackend("cpu")


def test_a_schedule_cannot_switch_descriptors_on():
    """Descriptors are the backend's (sm_90 and later): a launch override or schedule entry that
    names them is refused, never rendered under the interpreter."""
    be = TritonBackend("cpu", launch={"matmul_tile": {"tma": True}})
    with pytest.raises(UsageError, match="unknown launch setting 'tma'"):
        be.launch_config(_matmul())


@pytest.mark.sm90
@pytest.mark.slow
def test_descriptor_path_compiles_to_bulk_tensor_copies_for_sm90(tmp_path):
    """Triton turns the descriptor loads into TMA copies (``cp.async.bulk.tensor``)."""
    kern = render(_matmul(), RenderOptions(tma=True))
    flags = {f"{w}_{p.name}": True for w in ("EVEN", "ALIGN") for p in kern.fn.memrefs}
    sig = dict(kern.signature())
    sig.update({"D_x": "tensordesc<bf16[128, 64]>", "D_w": "tensordesc<bf16[64, 256]>",
                "TMA_x": "constexpr", "TMA_w": "constexpr"})
    job = {"source": kern.source, "name": kern.name, "signature": sig,
           "constexprs": {**flags, "TMA_x": True, "TMA_w": True, "GROUP": 0},
           "options": {k: v for k, v in kern.launch.items() if not k.isupper()}}
    (res,) = compile_sm90([job], tmp_path)
    assert res["ok"], res.get("error")
    assert "cp.async.bulk.tensor" in res["ptx"]


@pytest.mark.sm90
@pytest.mark.slow
def test_folded_norm_projections_feed_the_mma_from_shared_memory(tmp_path):
    """With the norm's gain in the weights and the rows' scale from a statistics task
    (``norm="stats"``) the folded projections' tensor-core operands both come from shared memory
    (``wgmma`` with two descriptors), as the plain GEMM's; multiplying the x tile by the gain in
    the K loop (``norm="loop"``) puts the left operand in registers."""
    from pto.incore.fused import Fold, Heads, matmul_norm_rope_tile, matmul_norm_swiglu_tile, matmul_norm_tile

    bf = DType.BF16
    stats = Fold(1e-6, "stats")
    fns = {"plain": _matmul(), "norm": matmul_norm_tile(bf, 128, 4096, 4096, 256, 64, stats),
           "rope": matmul_norm_rope_tile(bf, 128, 4096, Heads(32, 128, 2), 64, stats),
           "swiglu": matmul_norm_swiglu_tile(bf, 128, 4096, 11008, 128, 64, stats),
           "loop": matmul_norm_tile(bf, 128, 4096, 4096, 256, 64, 1e-6)}
    jobs = []
    for fn in fns.values():
        kern = render(specialize(fn), RenderOptions(tma=True))
        sig, flags = dict(kern.signature()), {"GROUP": 8}
        flags.update({f"{w}_{p.name}": True for w in ("EVEN", "ALIGN") for p in kern.fn.memrefs})
        for p, (r, c) in kern.tma.items():
            sig[f"D_{p}"], sig[f"TMA_{p}"], flags[f"TMA_{p}"] = f"tensordesc<bf16[{r}, {c}]>", "constexpr", True
        jobs.append({"source": kern.source, "name": kern.name, "signature": sig, "constexprs": flags,
                     "options": {"num_warps": 8, "num_stages": 3}})
    assert tma_memrefs(specialize(fns["rope"])) == {"x": (128, 64), "w": (64, 64)}  # every head's halves
    results = dict(zip(fns, compile_sm90(jobs, tmp_path)))
    for name, res in results.items():
        assert res["ok"], (name, res.get("error"))
        mma = re.findall(r"wgmma\.mma_async[^;]*;", res["ptx"])
        assert mma, name
        # the operands after the accumulator: "{a regs}, desc_b" (registers) or "desc_a, desc_b"
        a_in_registers = {m.split("}", 1)[1].lstrip(" ,").startswith("{") for m in mma}
        assert a_in_registers == {name == "loop"}, name
