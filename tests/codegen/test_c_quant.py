"""Quantized loads rendered to C (pto/codegen/c_quant.py): a tile load of every format
dequantizes to the reference evaluator's values bit for bit (each format's routine is exact in
f32 up to its one last rounding: pto/ir/quant.py), over a full region, over its edges (the pad),
in a half-precision tile and in a padded block; GEMVs against quantized weights (the weights
dequantized into the dot products, the tile never made) agree with the evaluator's to f32
summation order, of one row and of several (each weight computed once for them, every row's
sums its one-row GEMV's, bit for bit); a start inside a block fails the task. Every kernel
compiles into one module."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from pto.incore.gemv import gemv_norm_swiglu_tile

from pto.backends.c.backend import region_table
from pto.backends.c.build import kernel_module
from pto.data.batch import RegionBatch, TaskBatch
from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import QUANTIZED, DType, bf16, f32
from tests.codegen.test_c_incore import _strict_compile
from tests.quant.test_load import copy_fn, random_qtensor

GEMV_TYPES = (DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q5_K, DType.Q6_K, DType.FP8)


def named(fn, name: str):
    """``fn`` specialized, under its own name (one module holds every case's kernel)."""
    return specialize(replace(fn, name=name))


def copy_case(dtype: DType, where: str):
    """(function, w's tensor, w's region, y's shape) of a tile-by-tile copy of quantized w."""
    b = dtype.quant.block
    q = random_qtensor(dtype, 12, 4 * b, seed=11)
    name = f"copy_{dtype.short}_{where}"
    if where == "padded":  # tiles of 3 rows in 2 x 3 + 1 rows of region: the last rows padded
        return named(copy_fn(dtype, f32, 3, 3 * b, 3 * b), name), q, (4, b, 5, 3 * b), (6, 3 * b)
    if where == "edges":  # the region one block short of the last tile, its rows short of the last
        return named(copy_fn(dtype, f32, 5, b, 3 * b), name), q, (1, b, 9, 2 * b + b // 2), (10, 3 * b)
    if where == "half":
        return named(copy_fn(dtype, bf16, 4, 2 * b, 4 * b), name), q, (2, 0, 8, 4 * b), (8, 4 * b)
    return named(copy_fn(dtype, f32, 4, 2 * b, 4 * b), name), q, (2, 0, 8, 4 * b), (8, 4 * b)


def gemv_case(dtype: DType, K: int = 512, N: int = 40, bk: int = 256, rows: int = 1):
    suffix = f"_R{rows}" if rows > 1 else ""
    return named(gemv_norm_swiglu_tile(f32, rows, K, N, 8, bk, 1e-5, wdtype=dtype), f"gemv_{dtype.short}_{K}{suffix}")


COPIES = [(d, w) for d in QUANTIZED for w in ("full", "edges", "padded", "half")]
#: GEMVs of several rows: 2, 3 (a block of their own), 5 (a block of 4 and one) and 16 (DOT_ROWS,
#: four blocks of 4); the vector form (Q4_1, Q8_0) and the lanes' (Q6_K, fp8)
ROWS = [(d, r) for d in (DType.Q4_1, DType.Q8_0, DType.Q6_K, DType.FP8) for r in (2, 3, 5, 16)]


@pytest.fixture(scope="module")
def module():
    """Every kernel of this file in one compiled module: (module, index by case)."""
    fns = [copy_case(d, w)[0] for d, w in COPIES] + [gemv_case(d) for d in GEMV_TYPES]
    fns += [gemv_case(d, rows=r) for d, r in ROWS]
    fns.append(gemv_case(DType.Q4_1, K=480, bk=256))  # a weight tile partly past its region
    index, unique = {}, []
    for f in fns:
        if f not in index:
            index[f] = len(unique)
            unique.append(f)
    return kernel_module(unique, "quant_tests"), index


def run_c(km, index, fn, regions: dict, out: str) -> tuple[torch.Tensor, int]:
    """``fn`` as one task on ``regions`` (memref -> (tensor, row0, col0, rows, cols)): the output
    tensor and the kernel's status."""
    mems = {}
    for p in fn.memrefs:
        t, *reg = regions[p.name]
        mems[p.name] = RegionBatch(t, *(torch.tensor([v]) for v in reg))
    table = region_table(TaskBatch(fn, mems, {}, 1))
    ffi = km.module.ffi
    sc = np.zeros((1, 1), np.int64)
    st = km.run(index[fn], ffi.from_buffer("pto_region[]", table), ffi.from_buffer("int64_t[]", sc), 1)
    return regions[out][0], st


def both(module, fn, regions: dict, out: str) -> tuple[torch.Tensor, torch.Tensor]:
    km, index = module
    mine = {n: (t.clone() if n == out else t, *rest) for n, (t, *rest) in regions.items()}
    got, st = run_c(km, index, fn, mine, out)
    assert st == 0
    ref = {n: (t.clone() if n == out else t, *rest) for n, (t, *rest) in regions.items()}
    run_incore(fn, ref, {})
    return got, ref[out][0]


def gemv_regions(dtype: DType, rows: int, seed: int, K: int = 512, N: int = 40, wseeds=(1, 2)) -> dict:
    """A GEMV case's regions: seeded weights (whole blocks past K, the region K wide), ``rows``
    rows of x and a norm gain, y all NaN."""
    g = torch.Generator().manual_seed(seed)
    b = dtype.quant.block
    wg, wu = (random_qtensor(dtype, N, -(-K // b) * b, seed=s) for s in wseeds)
    x, gain = torch.randn(rows, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    return {"x": (x, 0, 0, rows, K), "g": (gain, 0, 0, 1, K), "wg": (wg.data, 0, 0, N, K),
            "wu": (wu.data, 0, 0, N, K), "y": (torch.full((rows, N), float("nan")), 0, 0, rows, N)}


@pytest.mark.parametrize("dtype,where", COPIES, ids=lambda v: str(v))
def test_tile_loads_are_the_evaluators_bit_for_bit(module, dtype, where):
    fn, q, region, shape = copy_case(dtype, where)
    tdtype = bf16 if where == "half" else f32
    y = torch.full(shape, float("nan")).to(tdtype.torch)
    got, want = both(module, fn, {"w": (q.data, *region), "y": (y, 0, 0, *shape)}, "y")
    assert torch.equal(got.view(torch.int16 if tdtype is bf16 else torch.int32),
                       want.view(torch.int16 if tdtype is bf16 else torch.int32))
    assert not torch.isnan(got.float()).any()


@pytest.mark.parametrize("dtype", GEMV_TYPES, ids=str)
def test_a_gemv_against_quantized_weights_agrees_with_the_evaluator(module, dtype):
    fn = gemv_case(dtype)
    got, want = both(module, fn, gemv_regions(dtype, 1, seed=4), "y")
    # the weights dequantized into the dot products (no tile of them): f32 sums of 512 products
    # in another order than the evaluator's, then silu(g) * u
    source = module[0].incore.source
    body = source.split(f"static int k_{fn.variant_name}(")[1].split("\n}\n")[0]
    assert f"pto_dqdot_{dtype.short}(" in body
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("dtype,rows", ROWS, ids=str)
def test_a_gemv_of_several_rows_is_each_rows_gemv(module, dtype, rows):
    """R rows against quantized weights (``pto_dqdots_<format>``: each weight row's values
    computed once for a block of rows): the evaluator's products to f32 summation order, and each
    row's output exactly the one-row kernel's on that row (the same products summed in the same
    order: a batch's row gets what it would alone)."""
    regions = gemv_regions(dtype, rows, seed=6)
    fn = gemv_case(dtype, rows=rows)
    got, want = both(module, fn, regions, "y")
    body = module[0].incore.source.split(f"static int k_{fn.variant_name}(")[1].split("\n}\n")[0]
    assert f"pto_dqdots_{dtype.short}(" in body and f"pto_dqdot_{dtype.short}(" not in body
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    x, *_, K = regions["x"]
    for i in range(rows):
        alone, st = run_c(*module, gemv_case(dtype), {**regions, "x": (x, i, 0, 1, K),
                                                        "y": (torch.full((1, 40), float("nan")), 0, 0, 1, 40)}, "y")
        assert st == 0
        assert torch.equal(alone[0].view(torch.int32), got[i].view(torch.int32)), f"row {i}"


def test_a_gemv_whose_weight_tile_overhangs_its_region(module):
    """K = 480 in tiles of 256: the second tile's last 32 columns are the pad (0) in x and in
    the weights; the C product dequantizes that row's blocks and pads it."""
    fn = gemv_case(DType.Q4_1, K=480, bk=256)
    got, want = both(module, fn, gemv_regions(DType.Q4_1, 1, seed=5, K=480, wseeds=(3, 4)), "y")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_a_load_starting_inside_a_block_fails_the_task(module):
    """A region whose first column is not a block's (the orchestration's mistake, not the
    kernel's offsets): PTO_ERR_REGION, nothing read."""
    from pto.runtime import ERR_REGION

    fn, q, _, shape = copy_case(DType.Q4_0, "full")
    km, index = module
    y = torch.full(shape, float("nan"))
    _, st = run_c(km, index, fn, {"w": (q.data, 2, 16, 8, 96), "y": (y, 0, 0, *shape)}, "y")
    assert st == ERR_REGION
    assert torch.isnan(y).all()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("flags", [(), ("-DPTO_NO_VECTOR_EXTENSIONS",)], ids=["vectors", "plain"])
def test_the_quantized_kernels_are_strict_c99(module, tmp_path, flags):
    """Every kernel of this file (the loads, the GEMVs of one row and of several, each format's
    helpers) compiles warning-free as strict C99, with and without GCC's vector extensions."""
    _strict_compile(tmp_path, module[0].incore.source, *flags)
