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
from pto.codegen.triton import render  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import QUANTIZED, DType, f32  # noqa: E402
from tests.codegen.tritonkit import INTERPRETER_ONLY, temp_cache_dir  # noqa: E402,F401
from tests.opkit import run_incore_triton  # noqa: E402
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


def tile_case(dtype: DType, where: str, seed: int):
    """A copy of random blocks of ``dtype`` (:func:`copy_fn`), its width and the weights' region:
    ``full``, ``edges`` (the region's last rows and block missing: pad there) or ``padded`` (tiles
    of 3 blocks in a block of 4, and 3 rows in 4)."""
    b = dtype.quant.block
    q = random_qtensor(dtype, 10, 4 * b, seed=seed)
    if where == "padded":
        return copy_fn(dtype, 3, 3 * b, 3 * b), 3 * b, (q.data, 4, b, 6, 3 * b)
    if where == "edges":
        return copy_fn(dtype, 4, b, 4 * b), 4 * b, (q.data, 3, 0, 7, 3 * b)
    return copy_fn(dtype, 4, 2 * b, 4 * b), 4 * b, (q.data, 2, 0, 8, 4 * b)


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("where", ["full", "edges", "padded"])
def test_tile_loads_are_the_evaluators_bit_for_bit(dtype, where):
    fn, K, region = tile_case(dtype, where, 11)
    y = torch.full((8, K), float("nan"))
    got, want = both(fn, {"w": region, "y": (y, 0, 0, 8, K)}, "y")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert "_pto_dq_" + dtype.short in render(fn).source


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q5_1, DType.Q5_K, DType.FP8], ids=str)
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


@pytest.mark.parametrize("span", [1, 2, 3])
@pytest.mark.parametrize("launches", [True, False])
def test_the_prefills_dequantization_in_spans_of_layers(span, launches):
    """The prefill's dense copies of a layer's quantized matrices (``LayerDequantizer``), through
    the Triton backend's launches (prepared once and replayed) or the routine on whole rows, in
    spans of as many layers as the budget holds (3 layers: spans of one, of two and a last one of
    one, all three): each layer's values, as ``[in, out]``, bit for bit, whichever span the
    buffers held before; one launch per kind and span."""
    from dataclasses import replace

    from pto.orchestration.model.program import CONFIGS, random_weights, stack_weights
    from pto.orchestration.model.quantized import LayerDequantizer, WeightTypes, dense_weights, quantize_weights

    from pto.backends.triton import TritonBackend

    cfg = replace(CONFIGS["tiny"], layers=3)
    w = quantize_weights(random_weights(cfg, torch.float32, torch.Generator().manual_seed(2)), "q4_0")
    step = stack_weights(w, True, False)
    layer_bytes = sum(v.rows * v.cols for v in w.layers[0].values() if hasattr(v, "rows")) * 4
    dq = LayerDequantizer(TritonBackend("cpu"), WeightTypes.of(w), step, cfg, f32, launches=launches,
                          budget=span * layer_bytes + layer_bytes // 2)
    assert dq.span == span
    assert dq.nbytes == span * layer_bytes  # (a span's matrices, in f32: what pto generate reports)
    made = []  # the spans made dense, a kind at a time
    dequantize = dq._dequantize
    dq._dequantize = lambda kind, first, layers: (made.append((first, layers)), dequantize(kind, first, layers))
    want = dense_weights(w)
    for layer in (1, 1, 0, 2, 1):
        got = dq(layer)
        assert set(got) == {"wq", "wk", "wv", "wo", "wg", "wu", "wd"}
        for k, v in got.items():
            assert torch.equal(v, want.layers[layer][k]), (layer, k)
    # a layer of the span the buffers hold makes nothing dense again
    spans = {1: [(1, 1), (0, 1), (2, 1), (1, 1)], 2: [(0, 2), (2, 1), (0, 2)], 3: [(0, 3)]}[span]
    assert made == [s for s in spans for _ in range(5)]
    assert len(dq.launches) == (5 * -(-3 // span) if launches else 0)


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("runner", ["torch", "triton"])
def test_dequantize_rows_tiles_cover_the_matrix_once(dtype, runner):
    """``dequantize_rows`` a program per tile: 37 rows in tiles of 8 (the last past the end) and
    768 columns in steps of 512 (the last overhanging), the matrix's region not at the tensor's
    first row: every value the format's own dequantization's, bit for bit, nothing written past
    the region."""
    from pto.incore.dequantize import dequantize_rows

    from pto.backends.torch_backend import TorchBackend
    from pto.backends.triton import TritonBackend
    from pto.data.batch import RegionBatch, TaskBatch
    from tests.quant.test_load import random_qtensor

    if 768 % dtype.quant.block:
        pytest.skip(f"{dtype}: 768 columns are not whole blocks")
    rows, skip, bk = 37, 2, max(512, dtype.quant.block)
    w = random_qtensor(dtype, rows + skip + 3, 768, seed=9)
    y = torch.full((rows + 4, 768), float("nan"))
    fn = specialize(dequantize_rows(dtype, f32, rows, 768, bk, br=8))
    mems = {"w": RegionBatch(w.data, *(torch.tensor([v]) for v in (skip, 0, rows, 768))),
            "y": RegionBatch(y, *(torch.tensor([v]) for v in (0, 0, rows, 768)))}
    backend = TorchBackend() if runner == "torch" else TritonBackend("cpu")
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    assert torch.equal(y[:rows], w.dequantize()[skip:skip + rows].float())
    assert torch.isnan(y[rows:]).all()


@pytest.mark.parametrize("block,cols,shape", [(32, 576, (32, 64)), (32, 1536, (16, 512)), (256, 14336, (8, 1024)),
                                              (256, 4096, (8, 1024)), (32, 96, (32, 32)), (256, 2816, (32, 256)),
                                              (256, 768, (32, 256))])
def test_dequantizing_tiles_divide_the_columns(block, cols, shape):
    """The prefill's dequantizing tiles: the widest power-of-two step up to 1024 that divides the
    columns in whole blocks (SmolLM2's 576 in 64: no program overhangs them), rows for about 8,192
    values a tile (up to 32)."""
    from pto.incore.dequantize import dequantize_tile_shape

    assert dequantize_tile_shape(block, cols) == shape


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("K,bk", [(768, 512), (576, 576)], ids=["overhang", "padded"])
def test_a_gemv_reading_its_weights_by_groups_agrees_with_the_evaluator(dtype, K, bk):
    """``RenderOptions(qgemv="groups")`` (pto.codegen.triton.quant_groups): every format, a K
    loop whose last step overhangs the rows (K = 3 x 256, steps of 512) or one step of a padded
    block (576 columns in a block of 1,024: SmolLM2's rows; whole blocks of 32 only), and a
    last block of rows past the region's end (36 rows in blocks of 8), the weights' region not
    at the tensor's first row; the residual epilogue's sums against the evaluator's to f32
    summation order."""
    from pto.incore.gemv import gemv_residual_tile

    from pto.backends.triton import TritonBackend
    from pto.codegen.triton.common import RenderOptions
    from pto.data.batch import RegionBatch, TaskBatch

    if K % dtype.quant.block:
        pytest.skip(f"{dtype}: {K} columns are not whole blocks")
    N, skip = 36, 3
    g = torch.Generator().manual_seed(5)
    w = random_qtensor(dtype, N + skip, K, seed=6)
    x, r = torch.randn(1, K, generator=g), torch.randn(1, N, generator=g)
    fn = specialize(gemv_residual_tile(f32, 1, K, N, 8, bk, wdtype=dtype))
    regions = {"x": (x, 0, 0, 1, K), "w": (w.data, skip, 0, N, K), "r": (r, 0, 0, 1, N),
               "y": (torch.full((1, N), float("nan")), 0, 0, 1, N)}
    want = {n: (t.clone(), *rest) for n, (t, *rest) in regions.items()}
    run_incore(fn, want, {})
    backend = TritonBackend("cpu", options=RenderOptions(qgemv="groups"))
    mems = {n: RegionBatch(t, *(torch.tensor([v]) for v in rest)) for n, (t, *rest) in regions.items()}
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    assert "_pto_dqg_dot_" + dtype.short in backend.kernel(fn).source
    got = regions["y"][0]
    # f32 sums of K products in another order (and through 1 + field / 2^bits): a few ulps of
    # the largest partial sum's magnitude
    scale = float((x.abs() @ w.dequantize().abs().T).max())
    torch.testing.assert_close(got, want["y"][0], rtol=1e-5, atol=2e-6 * scale)


@pytest.mark.parametrize("bk", [1024, 2048])
def test_a_q6k_lm_head_in_k_steps_is_the_evaluators(bk):
    """The LM head's GEMV of a Q6_K head (its folded norm, the argmax's first stage) as a GPU
    reads it (integer dots of 16-bit x, ``qgemv="int16"``) in K steps of 1,024 (the default
    since quantized.HEAD_STEPS: two steps of a 2,048-wide row, the norm's statistics over both)
    and in one of 2,048: its logits against the evaluator's within x's rounding, each block's
    best logit and column the evaluator's where its top two are apart beyond that."""
    from pto.incore.decode import lmhead_argmax_gemv_tile

    from pto.backends.triton import TritonBackend
    from pto.codegen.triton.common import RenderOptions
    from pto.data.batch import RegionBatch, TaskBatch

    K, N, bn = 2048, 64, 16
    g = torch.Generator().manual_seed(bk)
    w = random_qtensor(DType.Q6_K, N, K, seed=7)
    x, gain = torch.randn(1, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    fn = specialize(lmhead_argmax_gemv_tile(f32, 1, K, N, bn, bk, 1e-5, wdtype=DType.Q6_K))
    blocks = N // bn
    regions = {"x": (x, 0, 0, 1, K), "g": (gain, 0, 0, 1, K), "w": (w.data, 0, 0, N, K),
               "y": (torch.full((1, N), float("nan")), 0, 0, 1, N),
               "best": (torch.full((1, blocks), float("nan")), 0, 0, 1, blocks),
               "index": (torch.full((1, blocks), float("nan")), 0, 0, 1, blocks)}
    want = {n: (t.clone(), *rest) for n, (t, *rest) in regions.items()}
    run_incore(fn, want, {})
    backend = TritonBackend("cpu", options=RenderOptions(qgemv="int16"))
    mems = {n: RegionBatch(t, *(torch.tensor([v]) for v in rest)) for n, (t, *rest) in regions.items()}
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    assert "_pto_dqx16_dot_q6_k" in backend.kernel(fn).source
    got, ref = regions["y"][0], want["y"][0]
    # the normalized x rounded to 16-bit integers a group of T: half a step (its group's largest
    # |x| / 32767) of each x times its weights' magnitudes, and f32 sums in another order
    from pto.codegen.triton.quant_groups import group_of

    xn = (x * torch.rsqrt(x.pow(2).mean() + 1e-5) * gain).double()
    step = xn.view(-1, group_of(DType.Q6_K.quant)).abs().amax(1, keepdim=True) / 32767
    mags = w.dequantize(torch.float32).abs().double()
    bound = float(((step / 2).expand(-1, group_of(DType.Q6_K.quant)).reshape(1, K) @ mags.T).max())
    bound += 1e-5 * float((xn.abs() @ mags.T).max())
    torch.testing.assert_close(got, ref, rtol=0, atol=bound)
    top2 = ref.view(blocks, bn).topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bound
    assert clear.sum() >= 2
    assert torch.equal(regions["index"][0].view(-1)[clear], want["index"][0].view(-1)[clear])
    torch.testing.assert_close(regions["best"][0], want["best"][0], rtol=0, atol=bound)


def test_the_backend_reads_how_from_pto_qgemv(monkeypatch):
    """``PTO_QGEMV`` sets the backend's ``RenderOptions.qgemv`` (units by default; explicit
    options win); a value not a mode is one line naming it."""
    from pto.backends.triton import TritonBackend
    from pto.backends.triton.modes import qgemv_mode
    from pto.codegen.triton.common import RenderOptions, reads_by_groups
    from pto.errors import UsageError

    monkeypatch.delenv("PTO_QGEMV", raising=False)
    assert TritonBackend("cpu").options.qgemv == "units"  # the interpreter's default
    assert qgemv_mode(compiles=True) == "auto"  # a GPU's: by groups (integer, half or float dots)
    assert [reads_by_groups(m) for m in ("auto", "groups", "int8", "int16", "units", "")] == [True] * 4 + [False] * 2
    monkeypatch.setenv("PTO_QGEMV", "groups")
    assert TritonBackend("cpu").options.qgemv == "groups"
    assert TritonBackend("cpu", options=RenderOptions(qgemv="units")).options.qgemv == "units"
    monkeypatch.setenv("PTO_QGEMV", "lanes")
    with pytest.raises(UsageError, match="PTO_QGEMV='lanes': one of auto, units, groups"):
        TritonBackend("cpu")


def test_pto_qgemv_warps_sets_the_fewest_warps_of_a_grouped_gemv():
    """``PTO_QGEMV_WARPS`` (``RenderOptions.qgemv_warps``): a GEMV that reads by groups takes at
    least that many warps a program, the rule's count where it gives more (a warp per 1,024
    columns, per 8 rows past 8, four where its weights stream over two K steps or more, four for
    a plain GEMV of one row of x: nothing reduced but its product); by default the rule's alone."""
    from pto.incore.gemv import gemv_norm_swiglu_tile, gemv_residual_tile

    from pto.codegen.triton import render
    from pto.codegen.triton.common import RenderOptions
    from pto.errors import UsageError

    small = specialize(gemv_residual_tile(f32, 1, 576, 64, 4, 1024, wdtype=DType.Q4_1))  # SmolLM2's o: plain
    wide = specialize(gemv_residual_tile(f32, 1, 4096, 64, 8, 4096, wdtype=DType.Q4_1))  # the 8B model's
    # SmolLM2's gate/up: x normalized in the program (a row sum), so not plain: a warp a 1,024 columns
    swiglu = specialize(gemv_norm_swiglu_tile(f32, 1, 576, 1536, 8, 1024, 1e-5, wdtype=DType.Q4_1))
    # x of two rows (two sequences, read by groups): not plain, the rule's count
    pair = specialize(gemv_residual_tile(f32, 2, 576, 64, 4, 1024, wdtype=DType.Q4_1))
    for fn, rule in ((small, 4), (wide, 4), (swiglu, 1), (pair, 1)):
        for warps in (0, 1, 2, 4, 8):
            kern = render(fn, RenderOptions(qgemv="int16", qgemv_warps=warps))
            assert kern.launch["num_warps"] == max(rule, warps), (fn.name, warps)
        # the units' GEMVs keep their own warps
        units = render(fn, RenderOptions(qgemv="units")).launch
        assert render(fn, RenderOptions(qgemv="units", qgemv_warps=8)).launch == units
    # a program that streams its weights over two K steps or more (the 8B model's down
    # projection: 14,336 columns in steps of 2,048; the 1B's Q6_K LM head, 2,048 in steps of
    # 1,024) takes at least four warps; one step, the rule's (the count alone, as for x of several
    # rows: these one-row GEMVs are plain, four)
    from pto.codegen.triton.kernel import grouped_warps

    for k, rule in ((14336, 4), (8192, 4), (4096, 4), (2048, 2)):
        down = specialize(gemv_residual_tile(f32, 1, k, 64, 8, 2048, wdtype=DType.Q4_K))
        for warps in (0, 2, 8):
            assert grouped_warps(down, {"b": (8, 2048)}, warps) == max(rule, warps), (k, warps)
            assert render(down, RenderOptions(qgemv="auto", qgemv_warps=warps)).launch["num_warps"] == max(4, warps)
    # a launch's own num_warps is its warps: a schedule or override naming the floor is refused,
    # not taken and lost (the launch's warps come from the kernel rendered without it)
    from pto.backends.triton.launch import LaunchConfig

    with pytest.raises(UsageError, match="unknown launch setting 'qgemv_warps'"):
        LaunchConfig.of({"num_warps": 4, "qgemv_warps": 4})


def test_pto_qgemv_warps_by_function_overrides_the_floor_for_that_function_alone(monkeypatch):
    """``PTO_QGEMV_WARPS=N,NAME=M`` (``RenderOptions.qgemv_warps_by``): the function of that
    generic name takes at least M warps in place of N, every other grouped GEMV N (the rule's
    count where it gives more); the environment's entries reach the backend's options, and an
    entry that is not ``NAME=`` one of the counts is one line naming the variable."""
    from pto.incore.gemv import gemv_norm_swiglu_tile, gemv_residual_tile

    from pto.backends.triton import TritonBackend
    from pto.codegen.triton import render
    from pto.codegen.triton.common import RenderOptions
    from pto.errors import UsageError

    # SmolLM2's gate/up (x normalized in the program: the rule's 1) and o (plain: the rule's 4)
    swiglu = specialize(gemv_norm_swiglu_tile(f32, 1, 576, 1536, 8, 1024, 1e-5, wdtype=DType.Q4_1))
    o = specialize(gemv_residual_tile(f32, 1, 576, 64, 4, 1024, wdtype=DType.Q4_1))
    assert (swiglu.name, o.name) == ("gemv_norm_swiglu_tile", "gemv_residual_tile")
    by = (("gemv_norm_swiglu_tile", 2),)
    assert render(swiglu, RenderOptions(qgemv="int16", qgemv_warps_by=by)).launch["num_warps"] == 2
    assert render(swiglu, RenderOptions(qgemv="int16", qgemv_warps=4, qgemv_warps_by=by)).launch["num_warps"] == 2
    assert render(swiglu, RenderOptions(qgemv="int16", qgemv_warps=8, qgemv_warps_by=by)).launch["num_warps"] == 2
    other = (("gemv_residual_tile", 8),)
    assert render(swiglu, RenderOptions(qgemv="int16", qgemv_warps=2, qgemv_warps_by=other)).launch["num_warps"] == 2
    assert render(o, RenderOptions(qgemv="int16", qgemv_warps_by=other)).launch["num_warps"] == 8
    # an entry asks for the fewest: the rule's four for a plain GEMV stand above an entry of one
    assert render(o, RenderOptions(qgemv="int16", qgemv_warps_by=(("gemv_residual_tile", 1),))).launch[
        "num_warps"] == 4
    # the kernel's text is the same: the launch's warps alone
    assert render(swiglu, RenderOptions(qgemv="int16", qgemv_warps_by=by)).source == \
        render(swiglu, RenderOptions(qgemv="int16")).source

    monkeypatch.setenv("PTO_QGEMV_WARPS", "2, gemv_residual_tile_o=4,gemv_residual_tile=8")
    opts = TritonBackend("cpu").options
    assert (opts.qgemv_warps, opts.qgemv_warps_by) == (2, (("gemv_residual_tile_o", 4), ("gemv_residual_tile", 8)))
    monkeypatch.setenv("PTO_QGEMV_WARPS", "gemv_residual_tile=4")
    opts = TritonBackend("cpu").options
    assert (opts.qgemv_warps, opts.qgemv_warps_by) == (1, (("gemv_residual_tile", 4),))
    for bad in ("gemv_residual_tile=3", "4,2", "=4", "gemv residual=4", "1,gemv_residual_tile"):
        monkeypatch.setenv("PTO_QGEMV_WARPS", bad)
        with pytest.raises(UsageError, match=f"PTO_QGEMV_WARPS='{bad}': one of 1, 2, 4, 8 .every grouped GEMV's., "
                           "then or instead FUNCTION=N entries"):
            TritonBackend("cpu")


def test_pto_qgemv_cols_gives_each_warp_of_a_grouped_gemv_more_groups():
    """``PTO_QGEMV_COLS`` (``RenderOptions.qgemv_cols``): the rule's warp per 1,024 columns of a K
    step becomes a warp per 2,048 or 4,096 (each thread two or four groups of a row), the streaming
    floor and ``qgemv_warps`` still applying; the kernel's text does not change (the launch's warps
    alone: Triton lays a tensor over the warps it has)."""
    from pto.incore.gemv import gemv_residual_tile

    from pto.codegen.triton import render
    from pto.codegen.triton.common import RenderOptions
    from pto.errors import UsageError

    wide = specialize(gemv_residual_tile(f32, 1, 4096, 64, 8, 4096, wdtype=DType.Q4_K))  # the 8B model's o
    tall = specialize(gemv_residual_tile(f32, 1, 4096, 64, 16, 4096, wdtype=DType.Q4_K))  # 16 rows: a warp per 8
    down = specialize(gemv_residual_tile(f32, 1, 14336, 64, 8, 2048, wdtype=DType.Q4_K))  # streams 7 K steps
    for fn, counts in ((wide, (4, 2, 1)), (tall, (8, 4, 2)), (down, (4, 4, 4))):
        for cols, warps in zip((1024, 2048, 4096), counts):
            kern = render(fn, RenderOptions(qgemv="int16", qgemv_cols=cols))
            assert kern.launch["num_warps"] == warps, (fn.name, cols)
            assert kern.source == render(fn, RenderOptions(qgemv="int16")).source
        assert render(fn, RenderOptions(qgemv="int16", qgemv_cols=4096, qgemv_warps=8)).launch["num_warps"] == 8
    assert render(wide, RenderOptions(qgemv="int16")).launch["num_warps"] == 4  # rendered directly: 1,024
    from pto.backends.triton.launch import LaunchConfig

    with pytest.raises(UsageError, match="unknown launch setting 'qgemv_cols'"):
        LaunchConfig.of({"num_warps": 4, "qgemv_cols": 2048})


@pytest.mark.parametrize("env,field,default,value,given,bad,allowed", [
    ("PTO_QGEMV_WARPS", "qgemv_warps", 1, 4, 2, "3", "1, 2, 4, 8"),
    ("PTO_QGEMV_COLS", "qgemv_cols", 1024, 2048, 4096, "512", "1024, 2048, 4096"),
    ("PTO_QSCALES", "qscales", "groups", "units", "groups", "group", "groups, units"),
])
def test_the_grouped_gemvs_settings_come_from_the_environment(monkeypatch, env, field, default, value, given, bad,
                                                              allowed):
    """The backend's grouped-GEMV settings: the default where the environment says nothing, the
    environment's value, the backend's options over it; a value not allowed is one line naming
    the variable, the value and what it may be."""
    from pto.backends.triton import TritonBackend
    from pto.codegen.triton.common import RenderOptions
    from pto.errors import UsageError

    monkeypatch.delenv(env, raising=False)
    assert getattr(TritonBackend("cpu").options, field) == default
    monkeypatch.setenv(env, str(value))
    assert getattr(TritonBackend("cpu").options, field) == value
    assert getattr(TritonBackend("cpu", options=RenderOptions(**{field: given})).options, field) == given
    monkeypatch.setenv(env, bad)
    with pytest.raises(UsageError, match=f"{env}='{bad}': one of {allowed}"):
        TritonBackend("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["q4_0", "q5_1", "q4_k"])
def test_a_step_reading_its_weights_by_groups_is_the_reference_on_its_values(quantize, monkeypatch):
    """The decode step through the Triton interpreter with ``PTO_QGEMV=groups``: every GEMV's
    product by groups (q4_k: a one-layer model of hidden 256, whole 256-element blocks), the
    logits the reference's on the dequantized weights but for the order of the sums."""
    from dataclasses import replace

    from pto.orchestration.llama.config import LlamaConfig
    from pto.orchestration.model import program as mp

    from pto.cli.commands.run import run

    monkeypatch.setenv("PTO_QGEMV", "groups")
    config = "tiny"
    if quantize == "q4_k":
        config = "tiny-256"
        monkeypatch.setitem(mp.CONFIGS, config, replace(mp.CONFIGS["tiny"], layers=1, layer=LlamaConfig(
            hidden=256, heads=4, head_dim=64, ffn=512, kv_heads=2)))
    res = run("model", config=config, cache=64, batch=1, device="cpu", backend="triton", check=True, quantize=quantize)
    assert res["rel_err"] <= 1e-5, res


def test_the_quantized_helpers_are_the_same_code_in_every_process():
    """The dots' and loads' source for every format (Triton's units and groups, integer and half
    dots; the C renderer's) does not depend on the process's string hashing (``PYTHONHASHSEED``):
    the format's affine form once iterated a set of plane names, so Q5_K's and Q6_K's kernels
    differed from process to process (each compiling its own, the caches missing)."""
    import os
    import subprocess
    import sys

    code = ("from pto.codegen.triton import quant, quant_groups as g\n"
            "from pto.codegen import c_quant\n"
            "from pto.ir.quant import FORMATS\n"
            "for f in FORMATS.values():\n"
            "    print(*quant.render_helpers(f), *g.render_helpers(f, 16 if g.int_dots_apply(f) else 0,\n"
            "          g.half_dots_apply(f)), *c_quant.render_helpers(f), sep='\\n')\n")
    outs = set()
    for seed in range(4):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        env.pop("TRITON_INTERPRET", None)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        outs.add(run.stdout)
    assert len(outs) == 1 and len(next(iter(outs))) > 10000


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
@pytest.mark.parametrize("where", ["full", "edges", "padded"])
@pytest.mark.parametrize("qscales", ["groups", "units"])
def test_scales_loaded_a_value_a_group_or_a_unit_are_the_evaluators_bit_for_bit(dtype, where, qscales):
    """``RenderOptions(qscales="groups")`` (the default): a scale plane whose group spans four
    units or more is loaded once a group and broadcast to its units; "units" loads it a value a
    unit. Either way the tile's values are the evaluator's bit for bit, over a region's edges and
    in a padded block."""
    from pto.backends.triton import TritonBackend
    from pto.codegen.triton.common import RenderOptions
    from pto.codegen.triton.quant import unit_of
    from pto.data.batch import RegionBatch, TaskBatch

    fn, K, region = tile_case(dtype, where, 12)
    regions = {"w": region, "y": (torch.full((8, K), float("nan")), 0, 0, 8, K)}
    want = {n: (t.clone(), *rest) for n, (t, *rest) in regions.items()}
    run_incore(fn, want, {})
    backend = TritonBackend("cpu", options=RenderOptions(qscales=qscales))
    mems = {n: RegionBatch(t, *(torch.tensor([v]) for v in rest)) for n, (t, *rest) in regions.items()}
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    assert torch.equal(regions["y"][0].view(torch.int32), want["y"][0].view(torch.int32))
    # the formats with a group of four units or more load those planes by groups
    wide = [p for p in dtype.quant.planes if not p.header and p.group >= 4 * unit_of(dtype.quant)]
    assert ("tl.broadcast_to(" in backend.kernel(fn).source) == (bool(wide) and qscales == "groups")
