"""Persistent loops over a task's parallel indices (``RenderOptions.persistent == "blocks"``,
``PTO_PERSISTENT=blocks``): which statements run once a program (:func:`block_invariant`), the
rendered loop, and the same bits as the plain grid's under the interpreter, a GEMV alone (several
tasks, fewer programs than blocks) and a whole decode step through the wave executor."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from pto.incore.gemv import gemv_norm_swiglu_tile, gemv_residual_tile  # noqa: E402

from pto import InCore, f32  # noqa: E402
from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.codegen.triton.body import _flat, block_invariant, step_weights  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from pto.ir.nodes import ForRange, walk_instrs  # noqa: E402
from pto.ir.ops import Op  # noqa: E402
from tests.codegen.tritonkit import step_kernels, temp_cache_dir, tiny_decode_runner  # noqa: E402,F401 (applies itself)


def _ops(stmts) -> list[tuple[Op, str]]:
    return [(i.op, i.srcs[0] if i.op in (Op.LOAD, Op.LOAD_SCALAR) else i.dst) for i in walk_instrs(stmts)]


def test_a_gemvs_x_and_norm_run_once_and_its_weights_products_and_stores_each_block():
    fn = specialize(gemv_norm_swiglu_tile(DType.F32, 1, 64, 96, 16, 64, 1e-6))
    once, each = block_invariant(_flat(fn.body), fn.parallel.var)
    assert (Op.LOAD, "x") in _ops(once) and (Op.LOAD, "g") in _ops(once)  # x, the norm's gain
    assert Op.RSQRT in {op for op, _ in _ops(once)}  # the norm's row factor
    assert {(Op.LOAD, "wg"), (Op.LOAD, "wu")} <= set(_ops(each)) and (Op.STORE, None) in _ops(each)
    # the accumulators start afresh each block: their fills run there, and nothing once names j
    accs = {i.dst for i in walk_instrs(each) if i.op is Op.MATMUL_ACC}
    assert accs and all(any(i.op is Op.FULL and i.dst == a for i in walk_instrs(each)) for a in accs)
    assert not any(fn.parallel.var in e.free_vars() for i in walk_instrs(once) for e in i.srcs
                   if hasattr(e, "free_vars"))
    assert len(once) + len(each) == len(_flat(fn.body))


def test_a_k_loops_weights_load_a_step_ahead_only_in_a_loop_of_constant_trips():
    """:func:`step_weights`: in a residual GEMV's K loop (7 steps), x and the weights, addressed by
    the step and the index alone, load a step ahead (of the memrefs the function only reads); a
    loop whose bounds a scalar sets, or of no trip, loads nothing ahead."""
    fn = specialize(gemv_residual_tile(DType.F32, 1, 7 * 64, 96, 16, 64))
    loop = next(s for s in _flat(fn.body) if isinstance(s, ForRange))
    assert [(i.srcs[0], i.dst) for i in step_weights(loop, "j", frozenset({"x", "w"}))] == [("x", "a"), ("w", "b")]
    assert [i.dst for i in step_weights(loop, "j", frozenset({"w"}))] == ["b"]  # (x written in the graph)

    k = InCore("bounded")
    x, y, n = k.memref("x", f32, shape=(1, 256)), k.memref("y", f32), k.memref("n", f32)
    j = k.parallel("j", 4)
    a, acc = k.tile("a", 1, 16, f32), k.tile("acc", 1, 16, f32)
    k.full(acc, 0.0)
    m = k.load_scalar("m", n, 0, 0)
    for ub in (m, 64, 0):
        with k.for_range(f"kk{ub}" if isinstance(ub, int) else "kkm", 0, ub, 16) as kk:
            k.load(a, x, 0, kk)
            k.add(acc, acc, a)
    k.store(y, j, 0, acc)
    fn = k.build()
    by_scalar, constant, empty = [s for s in _flat(fn.body) if isinstance(s, ForRange)]
    assert step_weights(by_scalar, "j", frozenset({"x"})) == ()
    assert [i.srcs[0] for i in step_weights(constant, "j", frozenset({"x"}))] == ["x"]
    assert step_weights(empty, "j", frozenset({"x"})) == ()


def test_two_k_loops_loading_one_tile_load_it_ahead_under_names_of_their_own():
    """("steps") Two K loops of a run that both load tile ``a`` (weights, then x) each load their
    next step into a tile of their own, the first steps of both before the run's loop; a loop that
    stores loads nothing ahead (its next step's load would pass its store)."""
    from pto.codegen.triton.body import BodyRenderer

    k = InCore("two_loops")
    x, w, y = k.memref("x", f32, shape=(1, 128)), k.memref("w", f32, shape=(4, 128)), k.memref("y", f32, shape=(4, 16))
    j = k.parallel("j", 4)
    a, acc, acc2 = k.tile("a", 1, 16, f32), k.tile("acc", 1, 16, f32), k.tile("acc2", 1, 16, f32)
    k.full(acc, 0.0)
    k.full(acc2, 0.0)
    with k.for_range("kk", 0, 64, 16) as kk:
        k.load(a, w, j, kk)
        k.add(acc, acc, a)
    with k.for_range("ll", 64, 128, 16) as ll:
        k.load(a, x, 0, ll)
        k.add(acc2, acc2, a)
    with k.for_range("mm", 0, 32, 16) as mm:  # (stores: not ahead)
        k.load(a, w, j, mm)
        k.store(y, j, 0, a)
    k.add(acc, acc, acc2)
    k.store(y, j, 0, acc)
    fn = specialize(k.build())
    _, lines = BodyRenderer(fn, RenderOptions(run_loop="steps"), 1, megakernel=True, runs=True,
                            prefetch=False).device_function()
    src = "\n".join(lines)
    run = src.index("for _b in tl.range(0, n_run):")
    assert src.index("t_a__k0 = ") < run and src.index("t_a__k1 = ") < run
    first, second, third = (src.index(f"for i_{v} in ") for v in ("kk", "ll", "mm"))
    assert "t_a = t_a__k0" in src[first:second] and "t_a__k0 = " in src[first:second]
    assert "t_a = t_a__k1" in src[second:third] and "t_a__k1 = " in src[second:third] and "__k0" not in src[second:]
    assert "__k2" not in src and "__k" not in src[third:]


def test_a_scalar_an_index_loads_and_a_tile_an_index_rewrites_make_their_readers_each_blocks():
    """A scalar loaded at the index taints what its value addresses; a tile the index's statements
    write is written afresh each block, its earlier writer too; a loop with anything of the index
    in it runs each block whole."""
    k = InCore("taint")
    x, y, idx = k.memref("x", f32, shape=(1, 64)), k.memref("y", f32), k.memref("idx", f32)
    j = k.parallel("j", 4)
    a, b, c = k.tile("a", 1, 16, f32), k.tile("b", 1, 16, f32), k.tile("c", 1, 16, f32)
    k.load(a, x, 0, 0)  # once
    k.full(b, 1.0)  # b is rewritten each block below: each
    p = k.load_scalar("p", idx, 0, j)  # the index's scalar
    k.load(c, x, 0, p)  # addressed by it: each
    k.add(b, b, c)
    k.add(a, a, a)  # only a: once
    with k.for_range("kk", 0, 2):  # a loop that stores: each
        k.store(y, j, 0, a)
    k.store(y, j, 16, b)
    fn = k.build()
    once, each = block_invariant(_flat(fn.body), "j")
    assert _ops(once) == [(Op.LOAD, "x"), (Op.ADD, "a")]
    assert [op for op, _ in _ops(each)] == [Op.FULL, Op.LOAD_SCALAR, Op.LOAD, Op.ADD, Op.STORE, Op.STORE]
    assert any(isinstance(s, ForRange) for s in each)


def _plain_and_blocks(fn, tensors: dict, out: str, qgemv: str = "", cols: dict | None = None) -> list[torch.Tensor]:
    """``out`` after one task of ``fn`` on the plain grid and in "blocks" form (each memref's
    region its whole tensor, of ``cols[m]`` columns where given: a quantized matrix's logical
    columns; ``tensors`` may bind one tensor to two memrefs; ``qgemv``: how the GEMVs read
    quantized weights, the interpreter's by default)."""
    outs = []
    for mode in ("", "blocks"):
        ts = {}
        for m, t in tensors.items():  # (a tensor bound twice stays one tensor)
            ts[m] = next((ts[o] for o in ts if tensors[o] is t), None)
            ts[m] = t.clone() if ts[m] is None else ts[m]
        z = torch.zeros(1, dtype=torch.int64)
        mems = {m: RegionBatch(t, z, z, z + t.shape[0], z + (cols or {}).get(m, t.shape[1])) for m, t in ts.items()}
        TritonBackend("cpu", options=RenderOptions(qgemv=qgemv), launch={fn.name: {"persistent": mode}}).prepare(
            TaskBatch(fn, mems, {}, 1))()
        outs.append(ts[out])
    return outs


def test_a_tile_rewritten_after_a_block_read_it_is_rewritten_in_the_block():
    """``a`` is read by a block's statement and then loaded again from other memory: neither of
    its writes may move out of the loop, or the block reads the second value (the plain grid's
    bits, x + x2 + w)."""
    k = InCore("war")
    x, x2, w, y = (k.memref(n, f32) for n in ("x", "x2", "w", "y"))
    j = k.parallel("j", 4)
    a, b, c, d = (k.tile(n, 1, 16, f32) for n in "abcd")
    k.load(a, x, 0, 0)
    k.load(b, w, j, 0)
    k.add(c, a, b)
    k.load(a, x2, 0, 0)
    k.add(d, a, c)
    k.store(y, j, 0, d)
    fn = k.build()
    once, each = block_invariant(_flat(fn.body), "j")
    assert _ops(once) == [] and len(each) == 6
    g = torch.Generator().manual_seed(0)
    xs, x2s, ws = torch.randn(1, 16, generator=g), torch.randn(1, 16, generator=g), torch.randn(4, 16, generator=g)
    plain, blocks = _plain_and_blocks(fn, {"x": xs, "x2": x2s, "w": ws, "y": torch.full((4, 16), float("nan"))}, "y")
    assert torch.equal(plain, blocks) and torch.allclose(plain, xs + x2s + ws)


def test_a_load_after_a_store_stays_in_the_block_where_two_memrefs_may_bind_one_tensor():
    """An in-place update (``y`` is ``r``) then a load of ``r`` that names no index: the load
    reads what the store wrote, so it stays after it (the plain grid's bits)."""
    k = InCore("alias")
    r, y, z = k.memref("r", f32), k.memref("y", f32), k.memref("z", f32)
    j = k.parallel("j", 1)
    a, b = k.tile("a", 1, 16, f32), k.tile("b", 1, 16, f32)
    k.load(a, r, 0, j * 16)
    k.adds(a, a, 1.0)
    k.store(y, 0, j * 16, a)
    k.load(b, r, 0, 0)
    k.muls(b, b, 2.0)
    k.store(z, 0, j * 16, b)
    fn = k.build()
    once, each = block_invariant(_flat(fn.body), "j")
    assert once == ()
    rs = torch.arange(16, dtype=torch.float32)[None]
    plain, blocks = _plain_and_blocks(fn, {"r": rs, "y": rs, "z": torch.zeros(1, 16)}, "z")
    assert torch.equal(plain, blocks) and torch.equal(plain, 2 * (rs + 1))


def test_a_task_extent_from_a_scalar_hoists_nothing_and_runs_each_tasks_own_blocks():
    """A parallel extent given per task (a scalar): a program past its task's extent, or a task of
    none, must run nothing, so nothing moves out of the loop nor loads ahead; tasks of 5, 0, 2
    and 3 blocks, 2 programs each under the interpreter: the plain grid's bits."""
    k = InCore("byext")
    n = k.scalar("n")
    x, y = k.memref("x", f32), k.memref("y", f32)
    j = k.parallel("j", n)
    a, b = k.tile("a", 1, 16, f32), k.tile("b", 1, 16, f32)
    k.load(a, x, 0, 0)
    k.load(b, x, 0, j * 16)
    k.add(b, b, a)
    k.store(y, 0, j * 16, b)
    fn = k.build()
    src = render(fn, RenderOptions(persistent="blocks")).source
    dev = src[src.index("def d_"):]
    assert dev.index("for _b in tl.range") < dev.index("tl.load(_p") and "__n" not in dev
    extents = torch.tensor([5, 0, 2, 3])
    outs = []
    for mode in ("", "blocks"):
        xs = torch.arange(4 * 80, dtype=torch.float32).reshape(4, 80)
        ys = torch.full((4, 80), -1.0)
        rows, z = torch.arange(4), torch.zeros(4, dtype=torch.int64)
        mems = {"x": RegionBatch(xs, rows, z, z + 1, z + 80), "y": RegionBatch(ys, rows, z, z + 1, z + 80)}
        TritonBackend("cpu", launch={fn.name: {"persistent": mode}}).prepare(TaskBatch(fn, mems, {"n": extents}, 4))()
        outs.append(ys)
    assert torch.equal(outs[0], outs[1]) and bool((outs[0][1] == -1).all()) and bool((outs[0][0] != -1).all())


def _gemv_batch(fn, n: int, K: int, N: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    shapes = {"x": (n, K), "wg": (N, K), "wu": (N, K), "y": (n, N), "g": (1, K)}
    tensors = {m: torch.randn(*s, generator=g) for m, s in shapes.items()}
    tensors["y"].fill_(float("nan"))
    rows = {"x": torch.arange(n), "y": torch.arange(n)}

    def rb(m):
        t = tensors[m]
        r0 = rows.get(m, torch.zeros(n, dtype=torch.int64))
        return RegionBatch(t, r0, torch.zeros(n, dtype=torch.int64), torch.full((n,), 1 if m in rows else t.shape[0]),
                           torch.full((n,), t.shape[1]))

    return {m: rb(m) for m in shapes}


def test_a_gemv_looping_over_its_blocks_computes_the_plain_grids_bits():
    """Three tasks of 6 blocks each, 2 programs a task under the interpreter (3 blocks a program):
    the outputs are the plain kernel's, bit for bit; the kernel takes a (task, program) grid."""
    fn = specialize(gemv_norm_swiglu_tile(DType.F32, 1, 64, 96, 16, 64, 1e-6))
    outs = []
    for mode in ("", "blocks"):
        mems = _gemv_batch(fn, 3, 64, 96, seed=5)
        TritonBackend("cpu", launch={fn.name: {"persistent": mode}}).prepare(TaskBatch(fn, mems, {}, 3))()
        outs.append(mems["y"].tensor)
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    src = render(fn, RenderOptions(persistent="blocks")).source
    assert "for _b in tl.range(0, tl.cdiv(6 - i_j0, NPJ)):" in src and "i_j = i_j0 + _b * NPJ" in src
    assert "tl.program_id(1), tl.num_programs(1)" in src


def test_a_residual_gemv_with_k_steps_loops_over_its_blocks_too():
    """The down projection's form (K in steps, each block's loop whole in the indices' loop), in
    place (the output the residual's tensor): the plain grid's bits."""
    fn = specialize(gemv_residual_tile(DType.F32, 1, 128, 64, 8, 32))
    g = torch.Generator().manual_seed(2)
    x, w, r = torch.randn(1, 128, generator=g), torch.randn(64, 128, generator=g), torch.randn(1, 64, generator=g)
    plain, blocks = _plain_and_blocks(fn, {"x": x, "w": w, "r": r, "y": r}, "y")
    assert torch.equal(plain, blocks) and torch.allclose(plain, r + x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qgemv", ["units", "groups", "int16"])
@pytest.mark.parametrize("dtype", [DType.Q4_K, DType.Q5_K], ids=str)
def test_the_k_quants_paired_scales_give_the_dequantized_product_on_every_path(dtype, qgemv):
    """Q4_K's and Q5_K's scale and minimum, and d and dmin, stored as pairs (one load of twice the
    width by groups): the residual GEMV read by units, by groups and by 16-bit integer dots,
    plain and in "blocks" form, is ``r + x w^T`` on the ``gguf``-exact dequantized weights:
    f32 sums of 512 products (a few ulps of the largest) by units and groups; x rounded to 16
    bits a group of 32 for the integer dots (half a step, 1/65534 of a group's largest |x|, times
    the weights' magnitudes)."""
    from tests.quant.test_load import random_qtensor

    K, N = 512, 16
    fn = specialize(gemv_residual_tile(f32, 1, K, N, 8, K, wdtype=dtype))
    g = torch.Generator().manual_seed(6)
    w, x, r = random_qtensor(dtype, N, K, seed=3), torch.randn(1, K, generator=g), torch.randn(1, N, generator=g)
    plain, blocks = _plain_and_blocks(fn, {"x": x, "w": w.data, "r": r, "y": r}, "y", qgemv, {"w": K})
    dense = w.dequantize().double()
    want, scale = r.double() + x.double() @ dense.T, float((x.abs().double() @ dense.abs().T).max())
    tol = 2e-5 * scale if qgemv == "int16" else 1e-6 * scale
    assert torch.equal(plain, blocks) and float((plain.double() - want).abs().max()) <= tol
    src = render(fn, RenderOptions(qgemv=qgemv)).source
    if qgemv != "units":  # the pairs' words: the scale and minimum of a group, d and dmin of a block
        load = src[src.index(f"def _pto_dqg_load_{dtype.short}("):]
        load = load[:load.index("\n\n")]  # (its masked and unmasked loads)
        assert load.count("(c0 // 32) * 2).to(tl.pointer_type(tl.uint16))") == 2
        assert load.count("(c0 // 256) * 4).to(tl.pointer_type(tl.uint32))") == 2 and "tl.float16)" not in load


def test_a_decode_step_with_every_gemv_looping_over_its_blocks_computes_the_same_bits(monkeypatch):
    """The tiny model's decode step through the wave executor on the Triton interpreter, the
    backend's kernels with a parallel axis in "blocks" form (PTO_PERSISTENT=blocks's), against
    the plain grid: the same logits and caches."""
    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, bk=512))
    run = tiny_decode_runner(seed=4)
    outs = [run(TritonBackend("cpu", options=RenderOptions(persistent=mode))) for mode in ("", "blocks")]
    for name in ("logits", "tok", "pos", "k_cache", "v_cache"):
        assert torch.equal(outs[0][name], outs[1][name]), name


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # (SwiGLU's exp of large random sums)
@pytest.mark.parametrize("qgemv", ["units", "groups"])
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.FP8], ids=str)
def test_a_quantized_gemv_looping_over_its_blocks_takes_the_next_blocks_planes_ahead(dtype, qgemv):
    """The weights' planes of the next block loaded before this block's product (``__n`` tiles,
    the first block's before the loop) and taken as the block's own: the plain grid's bits,
    whether the product reads by units or by groups; two tasks of 5 blocks, 2 programs each."""
    from tests.quant.test_load import random_qtensor

    K, N, n = 256, 40, 2
    fn = specialize(gemv_norm_swiglu_tile(f32, 1, K, N, 8, K, 1e-5, wdtype=dtype))
    g = torch.Generator().manual_seed(3)
    wg, wu = random_qtensor(dtype, N, K, seed=1), random_qtensor(dtype, N, K, seed=2)
    x, gain = torch.randn(n, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    outs = []
    for mode in ("", "blocks"):
        y = torch.full((n, N), float("nan"))
        rows = torch.arange(n)
        z, one = torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)
        mems = {"x": RegionBatch(x, rows, z, one, one * K), "g": RegionBatch(gain, z, z, one, one * K),
                "wg": RegionBatch(wg.data, z, z, one * N, one * K), "wu": RegionBatch(wu.data, z, z, one * N, one * K),
                "y": RegionBatch(y, rows, z, one, one * N)}
        backend = TritonBackend("cpu", options=RenderOptions(qgemv=qgemv), launch={fn.name: {"persistent": mode}})
        backend.prepare(TaskBatch(fn, mems, {}, n))()
        outs.append(y)
        src = backend.kernel(fn, backend.render_options(fn, backend.launch_config(fn, n))).source
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    loop = src[src.index("for _b in tl.range"):]
    assert "t_bg__n__" in src[:src.index("for _b in tl.range")]
    assert re.search(r"(_next\d+) = tl.where\(i_j \+ NPJ < 5, i_j \+ NPJ, i_j\)", loop)  # (past its last: its own)


def test_the_first_blocks_weights_load_before_the_pdl_wait_and_the_rest_after():
    """With PDL and the weights and gain as ``pre`` memrefs: the first block's weights before
    the wait (the kernel's ``early``), x, the gain and the norm after it, once; each block's
    next weights in the loop."""
    fn = specialize(gemv_norm_swiglu_tile(DType.F32, 1, 64, 96, 16, 64, 1e-6))
    k = render(fn, RenderOptions(persistent="blocks", pdl="late", pre=("wg", "wu", "g")))
    dev = k.source[k.source.index("def d_"):k.source.index(f"def {k.name}(")]
    wait, loop = dev.index("_gdc_wait()"), dev.index("for _b in tl.range")
    assert k.early == frozenset({"wg", "wu"}) and k.waits
    assert dev.index("t_bg__n = tl.load") < wait < dev.index("t_xt = tl.load") < dev.index("rsqrt") < loop
    assert dev.count("t_bg__n = tl.load") == 4 and dev.index("t_bg = t_bg__n") > loop  # (each with its masked twin)
    assert "_gdc_wait()" not in k.source[k.source.index(f"def {k.name}("):]


@pytest.mark.sm90
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [DType.Q4_K, DType.Q8_0, DType.FP8], ids=str)
def test_the_block_loops_of_the_quantized_gemvs_compile_for_sm90(dtype, tmp_path):
    """The 8B-shaped gate/up and residual GEMVs in "blocks" form as a GPU step renders them (the
    integer or half dots in PTX, PDL with the weights early), both paths, at BLOCK_MAXNREG
    registers: Triton compiles them for sm_90 (the next block's planes carried by the loop)."""
    from pto.codegen.triton.common import BLOCK_MAXNREG
    from tests.codegen.tritonkit import jobs_sm90, path_flags
    from tests.sm90 import compile_sm90

    fns = [specialize(gemv_norm_swiglu_tile(DType.BF16, 1, 4096, 512, 4, 4096, 1e-5, wdtype=dtype)),
           specialize(gemv_residual_tile(DType.BF16, 1, 4096, 512, 8, 4096, wdtype=dtype))]
    pairs = []
    for fn in fns:
        pre = tuple(p.name for p in fn.memrefs if p.name.startswith("w"))
        kern = render(fn, RenderOptions(persistent="blocks", qgemv="auto", asm=True, pdl="late", pre=pre))
        assert kern.early == frozenset(pre) and "__n__" in kern.source
        pairs += [(kern, path_flags(fn, even)) for even in (False, True)]
    jobs = [dict(j, options={**j["options"], "maxnreg": BLOCK_MAXNREG}) for j in jobs_sm90(pairs)]
    failed = [f"{r['name']}: {r['error'][:300]}" for r in compile_sm90(jobs, tmp_path) if not r["ok"]]
    assert not failed, "\n".join(failed)


def test_a_kernel_carrying_the_next_blocks_weights_compiles_to_at_most_block_maxnreg_registers(monkeypatch):
    """The backend's settings of a kernel's form (``kernel_settings``, what a launch and pto
    tune's fit check compile): BLOCK_MAXNREG for a "blocks" kernel that loads the next block
    ahead, 4 warps or fewer, on a GPU; not for the plain kernel, nor where the launch settings
    name their own, nor at 8 warps, nor under the interpreter."""
    from pto.backends.triton.launch import LaunchConfig
    from pto.codegen.triton.common import BLOCK_MAXNREG

    fn = specialize(gemv_norm_swiglu_tile(DType.F32, 1, 64, 96, 16, 64, 1e-6))
    blocks, plain = render(fn, RenderOptions(persistent="blocks")), render(fn)
    cfg = LaunchConfig.of(blocks.launch)
    assert blocks.block_ahead and not plain.block_ahead and cfg.num_warps <= 4
    interpreter = TritonBackend("cpu")
    assert dict(interpreter.kernel_settings(blocks, cfg).extra) == {}
    gpu = TritonBackend("cpu")
    monkeypatch.setattr(TritonBackend, "compiles", property(lambda self: self is gpu))  # (as on a GPU)
    assert dict(gpu.kernel_settings(blocks, cfg).extra) == {"maxnreg": BLOCK_MAXNREG}
    assert dict(gpu.kernel_settings(plain, cfg).extra) == {}
    assert dict(gpu.kernel_settings(blocks, cfg.updated({"maxnreg": 96})).extra) == {"maxnreg": 96}
    assert dict(gpu.kernel_settings(blocks, cfg.updated({"num_warps": 8})).extra) == {}


# the "auto" policy (PTO_PERSISTENT's default): the 4-bit gate/up GEMVs in "blocks" form ------------


@pytest.mark.parametrize("spec", ["q4_k/q6_k", "q4_0", "q4_1", "q8_0", "q6_k", "fp8"])
def test_the_auto_policy_takes_the_gate_up_gemv_of_4bit_weights_only(spec):
    """``RenderedKernel.blocks_auto`` in the 8B step as a GPU renders it: the gate/up GEMV of
    Q4_K, Q4_0 or Q4_1 weights (two weight tensors by integer dots in one K step); not q/k/v (one
    tensor), o, the down projection (K in steps), the LM head, nor any kernel of Q8_0, Q6_K or
    fp8 weights (measured slower so); at batch 8 none; SmolLM2's q/k/v with RoPE (one tensor
    loaded as two halves) neither."""
    kernels = step_kernels("llama3-8b", spec)
    looped = {name for name, k in kernels.items() if k.blocks_auto}
    assert looped == ({"gate_up"} if spec.split("/")[0] in ("q4_k", "q4_0", "q4_1") else set())
    assert {"gate_up", "qkv", "proj", "lm"} <= set(kernels)
    assert not any(k.blocks_auto for k in step_kernels("llama3-8b", spec, batch=8).values())
    if spec == "q4_0":
        smol = step_kernels("smollm2-135m", spec)
        assert smol["qkv_rope"].fn.parallel is not None and not smol["qkv_rope"].blocks_auto
    # the interpreter's reading by units takes no integer dots: nothing is looped there
    assert not render(kernels["gate_up"].fn, RenderOptions(qgemv="units")).blocks_auto


@pytest.mark.parametrize("spec", ["q5_k", "q5_0", "q5_1"])
def test_a_5bit_gate_up_loops_where_its_format_is_asked(spec):
    """The 5-bit formats' gate/up GEMV (integer dots since their high bits go into the 4-bit
    fields) has the blocks form's shape (``RenderedKernel.blocks_formats``); "auto" loops it
    where its format is among those asked (``PTO_BLOCKS_FORMATS``): by default Q5_K (measured
    faster on the 8B), not Q5_0 or Q5_1 (within noise on SmolLM2)."""
    from pto.codegen.triton.common import BLOCKS_AUTO_FORMATS

    kernels = step_kernels("llama3-8b", spec)
    assert kernels["gate_up"].blocks_formats == {spec}
    assert kernels["gate_up"].blocks_auto == (spec == "q5_k")
    assert kernels["gate_up"].blocks_auto_in(BLOCKS_AUTO_FORMATS | {spec})
    assert not kernels["gate_up"].blocks_auto_in(BLOCKS_AUTO_FORMATS - {spec})
    assert not any(k.blocks_formats for name, k in kernels.items() if name != "gate_up")


def test_the_formats_the_blocks_form_takes_from_the_environment(monkeypatch):
    from pto.backends.triton.modes import blocks_formats
    from pto.codegen.triton.common import BLOCKS_AUTO_FORMATS
    from pto.errors import UsageError

    monkeypatch.delenv("PTO_BLOCKS_FORMATS", raising=False)
    assert blocks_formats() == BLOCKS_AUTO_FORMATS == {"q4_0", "q4_1", "q4_k", "q5_k"}
    monkeypatch.setenv("PTO_BLOCKS_FORMATS", "+q5_1, q5_0")
    assert blocks_formats() == BLOCKS_AUTO_FORMATS | {"q5_1", "q5_0"}
    monkeypatch.setenv("PTO_BLOCKS_FORMATS", "q4_k")
    assert blocks_formats() == {"q4_k"}
    for bad in ("q9", "+", "q4_k,bf16"):
        monkeypatch.setenv("PTO_BLOCKS_FORMATS", bad)
        with pytest.raises(UsageError, match=rf"PTO_BLOCKS_FORMATS='{re.escape(bad)}': quantized formats"):
            blocks_formats()
        with pytest.raises(UsageError, match="PTO_BLOCKS_FORMATS"):
            TritonBackend("cpu")


def _gate_up_run(monkeypatch, dtype: DType, N: int, env: str, launch: dict | None = None):
    """A gate/up GEMV of two sequences, K 256 and N outputs in blocks of 8, of ``dtype`` weights
    read by integer dots under ``PTO_PERSISTENT=env`` on the interpreter: its outputs and the
    persistent form the backend gave it."""
    from tests.quant.test_load import random_qtensor

    K, n = 256, 2
    monkeypatch.setenv("PTO_PERSISTENT", env)
    fn = specialize(gemv_norm_swiglu_tile(f32, 1, K, N, 8, K, 1e-5, wdtype=dtype))
    g = torch.Generator().manual_seed(N)
    wg, wu = random_qtensor(dtype, N, K, seed=1), random_qtensor(dtype, N, K, seed=2)
    x, gain = torch.randn(n, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    y = torch.full((n, N), float("nan"))
    rows, z, one = torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)
    mems = {"x": RegionBatch(x, rows, z, one, one * K), "g": RegionBatch(gain, z, z, one, one * K),
            "wg": RegionBatch(wg.data, z, z, one * N, one * K), "wu": RegionBatch(wu.data, z, z, one * N, one * K),
            "y": RegionBatch(y, rows, z, one, one * N)}
    backend = TritonBackend("cpu", options=RenderOptions(qgemv="int16"), launch=launch)
    backend.prepare(TaskBatch(fn, mems, {}, n))()
    return y, backend.render_options(fn, backend.launch_config(fn, n)).persistent


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # (SwiGLU's exp of large random sums)
def test_the_auto_policy_loops_a_4bit_gate_up_of_enough_blocks_with_the_plain_grids_bits(monkeypatch):
    """The backend's "auto" (``PTO_PERSISTENT``'s default) renders a Q4_0 gate/up GEMV read by
    integer dots (``qgemv`` "int16") in "blocks" form where a program takes BLOCKS_AUTO_MIN of
    its blocks or more (5 blocks, 2 programs under the interpreter), and computes the plain
    grid's bits (``PTO_PERSISTENT=off``); 3 blocks stay a plain grid; so does a launch setting
    ``persistent: ""``."""
    from pto.codegen.triton.common import BLOCKS_AUTO_MIN

    def run(N: int, env: str, launch: dict | None = None):
        return _gate_up_run(monkeypatch, DType.Q4_0, N, env, launch)

    assert BLOCKS_AUTO_MIN * TritonBackend("cpu").block_programs() == 4
    (auto, mode), (off, plain) = run(40, "auto"), run(40, "off")
    assert (mode, plain) == ("blocks", "") and not off.isnan().any() and torch.equal(auto, off)
    assert run(24, "auto")[1] == ""  # (3 blocks of 8: fewer than 2 a program)
    assert run(40, "auto", {"gemv_norm_swiglu_tile": {"persistent": ""}})[1] == ""


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
def test_the_auto_policy_loops_a_5bit_gate_up_where_its_format_is_asked(monkeypatch):
    """A Q5_K gate/up GEMV (5 blocks, 2 programs under the interpreter) takes the "blocks" form
    under "auto" by default (Q5_K is among the formats measured faster so), with the plain grid's
    bits, and stays a plain grid where ``PTO_BLOCKS_FORMATS`` leaves it out."""
    monkeypatch.setenv("PTO_BLOCKS_FORMATS", "q4_k")
    assert _gate_up_run(monkeypatch, DType.Q5_K, 40, "auto")[1] == ""
    monkeypatch.delenv("PTO_BLOCKS_FORMATS", raising=False)
    (auto, mode), (off, plain) = _gate_up_run(monkeypatch, DType.Q5_K, 40, "auto"), \
        _gate_up_run(monkeypatch, DType.Q5_K, 40, "off")
    assert (mode, plain) == ("blocks", "") and not off.isnan().any() and torch.equal(auto, off)


def test_the_functions_the_blocks_form_takes_from_the_environment(monkeypatch):
    """``PTO_BLOCKS_FUNCTIONS``: none by default; InCore function names separated by commas;
    anything else is one line naming it, from the backend's construction on."""
    from pto.backends.triton.modes import blocks_functions
    from pto.errors import UsageError

    monkeypatch.delenv("PTO_BLOCKS_FUNCTIONS", raising=False)
    assert blocks_functions() == frozenset()
    monkeypatch.setenv("PTO_BLOCKS_FUNCTIONS", " gemv_residual_tile, gemv_residual_tile_o ")
    assert blocks_functions() == {"gemv_residual_tile", "gemv_residual_tile_o"}
    for bad in ("gemv-residual", "a,b c"):
        monkeypatch.setenv("PTO_BLOCKS_FUNCTIONS", bad)
        with pytest.raises(UsageError, match=rf"PTO_BLOCKS_FUNCTIONS='{re.escape(bad)}': InCore function names"):
            TritonBackend("cpu")


@pytest.mark.parametrize("bk", [512, 256])
def test_a_function_named_in_the_environment_loops_over_its_blocks_with_the_plain_grids_bits(monkeypatch, bk):
    """A Q4_K residual GEMV (the decode step's down projection, one weight tensor: never looped by
    format) read by integer dots stays a plain grid under "auto", and takes the "blocks" form
    where ``PTO_BLOCKS_FUNCTIONS`` names it, with the plain grid's bits: its K in one step (the
    next block's weights loaded ahead) and in two (the K loop inside each block); naming another
    function changes nothing."""
    from tests.quant.test_load import random_qtensor

    K, N, n = 512, 40, 2
    fn = specialize(gemv_residual_tile(f32, 1, K, N, 8, bk, wdtype=DType.Q4_K))
    w = random_qtensor(DType.Q4_K, N, K, seed=3)
    g = torch.Generator().manual_seed(bk)
    x, r = torch.randn(n, K, generator=g), torch.randn(n, N, generator=g)
    rows, z, one = torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)

    def run(names: str):
        monkeypatch.setenv("PTO_PERSISTENT", "auto")
        monkeypatch.setenv("PTO_BLOCKS_FUNCTIONS", names)
        y = torch.full((n, N), float("nan"))
        mems = {"x": RegionBatch(x, rows, z, one, one * K), "w": RegionBatch(w.data, z, z, one * N, one * K),
                "r": RegionBatch(r, rows, z, one, one * N), "y": RegionBatch(y, rows, z, one, one * N)}
        backend = TritonBackend("cpu", options=RenderOptions(qgemv="int16"))
        backend.prepare(TaskBatch(fn, mems, {}, n))()
        return y, backend.render_options(fn, backend.launch_config(fn, n)).persistent

    (plain, mode), (other, other_mode), (looped, looped_mode) = \
        run(""), run("gemv_residual_tile_o"), run("gemv_residual_tile")
    assert (mode, other_mode, looped_mode) == ("", "", "blocks")
    assert not plain.isnan().any() and torch.equal(other, plain) and torch.equal(looped, plain)
    ref = r + x @ w.dequantize(torch.float32).t()
    assert torch.allclose(plain, ref, rtol=1e-3, atol=1e-3)
