"""Quantized loads in the Triton backend (the interpreter, TRITON_INTERPRET=1): a tile load of
every format dequantizes to the reference evaluator's values bit for bit, on the mask-free path
(a full region), over a region's edges and in a padded block; GEMVs against quantized weights
(their product from the planes, never the values) agree with the evaluator's to f32 summation
order."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from pto.incore.gemv import gemv_norm_swiglu_tile  # noqa: E402

from pto import InCore  # noqa: E402
from pto.backends.triton import run_incore_triton  # noqa: E402
from pto.codegen.triton import render  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import QUANTIZED, DType, f32  # noqa: E402
from tests.codegen.tritonkit import INTERPRETER_ONLY, temp_cache_dir  # noqa: E402,F401
from tests.quant.test_load import random_qtensor  # noqa: E402

pytestmark = INTERPRETER_ONLY


def copy_fn(wdtype: DType, R: int, C: int, K: int):
    """``y = w`` tile by tile (tiles of R x C; a K loop; row blocks on the axis)."""
    k = InCore("dq_copy")
    w, y = k.memref("w", wdtype), k.memref("y", f32)
    j = k.parallel("j", 2)
    t = k.tile("t", R, C, f32)
    with k.for_range("kk", 0, K, C) as kk:
        k.load(t, w, j * R, kk, pad=-3.0)
        k.store(y, j * R, kk, t)
    return specialize(k.build())


def both(fn, regions: dict, out: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The output of ``fn`` through the Triton backend and through the evaluator."""
    res = []
    for run in (run_incore_triton, run_incore):
        regs = {n: (t.clone() if n == out else t, *rest) for n, (t, *rest) in regions.items()}
        run(fn, regs, {})
        res.append(regs[out][0])
    return res[0], res[1]


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("where", ["full", "edges", "padded"])
def test_tile_loads_are_the_evaluators_bit_for_bit(dtype, where):
    b = dtype.quant.block
    q = random_qtensor(dtype, 10, 4 * b, seed=11)
    if where == "padded":  # tiles of 3 blocks in a block of 4 (and 3 rows in 4)
        fn, K, region = copy_fn(dtype, 3, 3 * b, 3 * b), 3 * b, (q.data, 4, b, 6, 3 * b)
    elif where == "edges":  # the region's last rows and block missing: pad there
        fn, K, region = copy_fn(dtype, 4, b, 4 * b), 4 * b, (q.data, 3, 0, 7, 3 * b)
    else:
        fn, K, region = copy_fn(dtype, 4, 2 * b, 4 * b), 4 * b, (q.data, 2, 0, 8, 4 * b)
    y = torch.full((8, K), float("nan"))
    got, want = both(fn, {"w": region, "y": (y, 0, 0, 8, K)}, "y")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert "_pto_dq_" + dtype.short in render(fn).source


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q5_K, DType.FP8], ids=str)
def test_a_gemv_against_quantized_weights_agrees_with_the_evaluator(dtype):
    K, N = 512, 40
    g = torch.Generator().manual_seed(4)
    wg, wu = random_qtensor(dtype, N, K, seed=1), random_qtensor(dtype, N, K, seed=2)
    x, gain = torch.randn(1, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    fn = specialize(gemv_norm_swiglu_tile(f32, 1, K, N, 8, 256, 1e-5, wdtype=dtype))
    y = torch.full((1, N), float("nan"))
    got, want = both(fn, {"x": (x, 0, 0, 1, K), "g": (gain, 0, 0, 1, K), "wg": (wg.data, 0, 0, N, K),
                          "wu": (wu.data, 0, 0, N, K), "y": (y, 0, 0, 1, N)}, "y")
    # the product takes the planes (the fused dot: each unit's sum from its fields, the scales
    # once per unit): f32 sums of 512 products in another order, a few ulps of the largest
    # term's magnitude
    assert f"_pto_dq_dot_{dtype.short}(" in render(fn).source.split("def d_")[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_the_prefills_dequantization_through_the_triton_backend():
    """The prefill's dense copies of a layer's quantized matrices (``LayerDequantizer``) through
    the Triton backend's launches, prepared once and replayed: the layer's values, as ``[in,
    out]``, bit for bit."""
    from pto.orchestration.model.program import CONFIGS, random_weights, stack_weights
    from pto.orchestration.model.quantized import LayerDequantizer, WeightTypes, dense_weights, quantize_weights

    from pto.backends.triton import TritonBackend

    w = quantize_weights(random_weights(CONFIGS["tiny"], torch.float32, torch.Generator().manual_seed(2)), "q4_0")
    step = stack_weights(w, True, False)
    dq = LayerDequantizer(TritonBackend("cpu"), WeightTypes.of(w), step, w.config, f32, launches=True)
    want = dense_weights(w)
    for layer in (1, 1):
        got = dq(layer)
        assert set(got) == {"wq", "wk", "wv", "wo", "wg", "wu", "wd"}
        for k, v in got.items():
            assert torch.equal(v, want.layers[layer][k]), (layer, k)
    assert len(dq.launches) == 5  # prepared once per kind and layer
