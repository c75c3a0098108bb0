"""The Triton code generator and backend against the reference interpreter.

Without a GPU the generated kernels run under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1): every tile op (f32, and f16, which the interpreter rounds like a GPU),
masking and padding at region edges, batches of tasks with different regions, the parallel axis
with per-task loop trip counts, floor-division semantics of scalar expressions and loop-carried
tiles. Whole programs, the source cache, render options and the ahead-of-time compilation for
sm_90 are tests/codegen/test_triton_programs.py's.
"""

from __future__ import annotations

import math
import random
import zlib

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from pto import InCore, f32  # noqa: E402
from pto.backends.torch_backend import TorchBackend  # noqa: E402
from pto.backends.triton import TritonBackend, cache_dir  # noqa: E402
from pto.codegen.triton import RenderOptions, render, render_sources  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import UsageError  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from pto.ir.expr import evaluate  # noqa: E402
from tests.codegen.tritonkit import (  # noqa: E402,F401 (temp_cache_dir applies itself)
    INTERPRETER_ONLY,
    carry_fn,
    clone_mems,
    edge_fn,
    pgemm_fn,
    rowwise_fn,
    run_batch,
    scalar_exprs,
    scalars_fn,
    subnormal_fn,
    temp_cache_dir,
)
from tests.opkit import f64, rand, run_incore_triton, triton_vs_interp  # noqa: E402

pytestmark = INTERPRETER_ONLY
R, C = 8, 16
# f32 everywhere; f16 too, which the interpreter rounds as the GPU does (its bf16 does not)
DTYPES = [DType.F32, DType.F16]


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


both = triton_vs_interp  # the Triton backend against the reference interpreter


# op kinds beyond tests/ir/test_ops.py (which runs every op through this backend too) ------------


@pytest.mark.parametrize("acc_op", ["matmul", "matmul_acc"])
@pytest.mark.parametrize("M", [8, 16])
def test_matmul_f16_accumulation(acc_op, M, rng):
    """acc="f16": the product is rounded to f16, then added to the destination in f16."""
    K, N = 32, 16
    a, b = rand((M, K), DType.F16, rng), rand((K, N), DType.F16, rng)
    init = rand((M, N), DType.F16, rng) if acc_op == "matmul_acc" else None
    both(acc_op, (M, N), [a, b], DType.F16, init_dst=init, acc="f16")


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.parametrize("dst", DTYPES, ids=str)
def test_cast_and_mov(src, dst, rng):
    a = rand((R, C), src, rng) * 3
    both("cast", (R, C), [a], src, dst_dtype=dst)
    if src == dst:
        assert np.array_equal(both("mov", (R, C), [a], src), f64(a))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("value", [2.5, -math.inf, 1e-40, 0.1])
def test_full(dtype, value):
    got = both("full", (R, C), [], dtype, scalars=(value,))
    want = torch.full((R, C), value).to(dtype.torch).double().numpy()
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("diag", [-3, 0, 5])
def test_mask_causal(diag, dtype, rng):
    a = rand((R, C), dtype, rng)
    got = both("mask_causal", (R, C), [a], dtype, scalars=(diag,))
    r, c = np.indices((R, C))
    assert np.array_equal(np.isneginf(got), c > r + diag)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,axis", [("mask_cols", 1), ("mask_rows", 0)])
def test_mask_edge(op, axis, dtype, rng):
    a = rand((R, C), dtype, rng)
    got = both(op, (R, C), [a], dtype, scalars=(5,), fill=-7.0)
    idx = np.indices((R, C))[axis]
    assert np.array_equal(got, np.where(idx < 5, f64(a), -7.0))


# regions: padding, store masks, negative offsets -------------------------------------------------


@pytest.mark.parametrize("pad", [-1.0, -math.inf, math.nan, 1e-45])
@pytest.mark.parametrize("s", [0, 1, -3, 5])
def test_load_pad_and_store_mask(pad, s):
    """Loads outside the valid extent (also before the region's start) read `pad` rounded to the
    memref's dtype; stores outside it leave the tensor alone."""
    fn = edge_fn(pad)
    src = torch.arange(1.0, 26.0).view(5, 5)
    outs = []
    for runner in (run_incore, run_incore_triton):
        dst = torch.full((5, 5), 99.0)
        runner(fn, {"x": (src, 1, 1, 3, 3), "y": (dst, 1, 0, 3, 2)}, {"s": s})
        outs.append(dst)
    torch.testing.assert_close(outs[0], outs[1], equal_nan=True, rtol=0, atol=0)
    assert torch.equal(outs[1][0], torch.full((5,), 99.0)) and (outs[1][:, 2:] == 99.0).all()


def test_store_with_negative_offset_is_masked():
    k = InCore("neg_store")
    x, y = k.memref("x", f32), k.memref("y", f32)
    s = k.scalar("s")
    t = k.tile("t", 4, 8, f32)
    k.load(t, x, 0, 0)
    k.store(y, s, s - 1, t)
    fn = k.build()
    src = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    outs = []
    for runner in (run_incore, run_incore_triton):
        dst = torch.full((6, 10), 7.0)
        runner(fn, {"x": (src, 0, 0, 4, 8), "y": (dst, 1, 1, 4, 8)}, {"s": -1})
        outs.append(dst)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[1][1:4, 1:7], src[1:, 2:])


# batches ---------------------------------------------------------------------------------------------


def _compare_backends(fn, mems, scalars, size, outputs, backend=None):
    """Run the batch through the torch and Triton backends on copies; compare ``outputs``."""
    ref, got = clone_mems(mems), clone_mems(mems)
    run_batch(fn, ref, scalars, size, TorchBackend())
    run_batch(fn, got, scalars, size, backend or TritonBackend("cpu"))
    for name in outputs:
        torch.testing.assert_close(got[name].tensor, ref[name].tensor, rtol=1e-5, atol=1e-5, equal_nan=True)
    return got


def _random_batch(size, seed, full=False):
    g = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(100, 120, generator=gen)
    y = torch.randn(16 * size, 40, generator=gen)  # random, so skipped stores show
    xr, yr = [], []
    for i in range(size):
        nr, nc = (16, 32) if full else (g.randint(1, 16), g.randint(1, 32))
        xr.append((g.randint(0, 100 - nr), g.randint(0, 120 - nc), nr, nc))
        yr.append((16 * i, g.randint(0, 40 - nc), nr, nc))

    def rb(t, regs):
        return RegionBatch(t, *(torch.tensor(v) for v in zip(*regs)))

    scalars = {"s": torch.tensor([g.randint(-3, 3) for _ in range(size)])}
    return {"x": rb(x, xr), "y": rb(y, yr)}, scalars


@pytest.mark.parametrize("full", [False, True], ids=["residual", "full"])
def test_batch_of_tasks_matches_torch_backend(full):
    fn = rowwise_fn()
    mems, scalars = _random_batch(37, seed=5, full=full)
    be = TritonBackend("cpu")
    launch = be.prepare(TaskBatch(fn, clone_mems(mems), scalars, 37))
    assert sorted(torch.cat([g.tasks for g in launch.groups]).tolist()) == list(range(37))
    for g in launch.groups:
        assert g.table.shape == (len(g.tasks), 4 * 2 + 1) and g.table.dtype == torch.int32
        for p in ("x", "y"):  # a mask-free launch holds full regions only
            if g.flags[f"EVEN_{p}"]:
                assert (mems[p].rows[g.tasks] == 16).all() and (mems[p].cols[g.tasks] == 32).all()
    if full:
        assert all(g.flags["EVEN_x"] and g.flags["EVEN_y"] for g in launch.groups)
    _compare_backends(fn, mems, scalars, 37, ["y"], be)


def test_split_modes_decide_which_tasks_launch_apart():
    """``split="masks"``: full, aligned tasks get a launch of their own, so a few clipped tiles
    do not put a whole batch on the masked path. ``"align"`` (the default): the clipped tiles
    join the full ones (one launch on the masked path: a second launch would run after the
    first); only unaligned regions (a first column or a width not a multiple of 16) launch
    apart. ``"none"``: one launch. Every mode computes the same."""
    fn = rowwise_fn()
    mems, scalars = _random_batch(12, seed=8, full=True)
    for name in ("x", "y"):
        mems[name].rows[[3, 7]] = torch.tensor([5, 9])
        mems[name].col0[:] = 16 * (mems[name].col0 // 16)
    batch = TaskBatch(fn, mems, scalars, 12)
    be = TritonBackend("cpu", split="masks")
    groups = be.groups(batch)
    assert [sorted(g.tasks.tolist()) for g in groups] == [[i for i in range(12) if i not in (3, 7)], [3, 7]]
    assert all(groups[0].flags.values()) and not groups[1].flags["EVEN_x"] and groups[1].flags["ALIGN_x"]
    assert be.launches_per_batch(batch) == 2
    (one,) = TritonBackend("cpu").groups(batch)
    assert not one.flags["EVEN_x"] and one.flags["ALIGN_x"] and one.flags["ALIGN_y"]
    assert TritonBackend("cpu", split="none").launches_per_batch(batch) == 1
    for mode in ("masks", "align", "none"):
        _compare_backends(fn, mems, scalars, 12, ["y"], TritonBackend("cpu", split=mode))
    # a region 8 columns narrower is not aligned (its width): it launches apart under "align"
    mems["x"].cols[5] -= 8
    groups = TritonBackend("cpu").groups(TaskBatch(fn, mems, scalars, 12))
    assert [sorted(g.tasks.tolist()) for g in groups] == [[i for i in range(12) if i != 5], [5]]
    assert groups[0].flags["ALIGN_x"] and not groups[1].flags["ALIGN_x"]
    _compare_backends(fn, mems, scalars, 12, ["y"], TritonBackend("cpu"))


def test_split_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("PTO_SPLIT", "masks")
    assert TritonBackend("cpu").split == "masks"
    assert TritonBackend("cpu", split="none").split == "none"
    monkeypatch.setenv("PTO_SPLIT", "sometimes")
    with pytest.raises(UsageError, match="PTO_SPLIT='sometimes': one of align, masks, none"):
        TritonBackend("cpu")


def test_mask_free_path_is_exact():
    """A batch of full regions gives the same bits with and without the EVEN specialization."""
    fn = rowwise_fn()
    mems, scalars = _random_batch(9, seed=11, full=True)
    a, b = clone_mems(mems), clone_mems(mems)
    run_batch(fn, a, scalars, 9, TritonBackend("cpu"))
    run_batch(fn, b, scalars, 9, TritonBackend("cpu", even=False, align=False))
    assert torch.equal(a["y"].tensor, b["y"].tensor)


def test_parallel_axis_and_per_task_trip_counts():
    fn = pgemm_fn()
    gen = torch.Generator().manual_seed(3)
    ks, nbs = [40, 16, 0, 33, 7], [3, 1, 2, 4, 1]
    n = len(ks)
    a = torch.randn(16 * n, 48, generator=gen)
    b = torch.randn(48, 64, generator=gen)
    c = torch.randn(16 * n, 64, generator=gen)
    rows = [16, 9, 16, 12, 5]
    mems = {
        "a": RegionBatch(a, torch.arange(n) * 16, torch.zeros(n, dtype=torch.long),
                         torch.tensor(rows), torch.tensor(ks)),
        "b": RegionBatch(b, torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                         torch.tensor(ks), torch.tensor(nbs) * 16 - 3),
        "c": RegionBatch(c, torch.arange(n) * 16, torch.zeros(n, dtype=torch.long),
                         torch.tensor(rows), torch.tensor(nbs) * 16 - 3),
    }
    scalars = {"K": torch.tensor(ks), "NB": torch.tensor(nbs)}
    got = _compare_backends(fn, mems, scalars, n, ["c"])
    # the task with K = 0 computes a zero product (columns past its end keep their old values)
    assert torch.equal(got["c"].tensor[32:48, :29], torch.zeros(16, 29))
    # and the result is the matrix product where the regions are valid
    want = a[16:25, :16] @ b[:16, :13]
    torch.testing.assert_close(got["c"].tensor[16:25, :13], want)


# scalar expressions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sv", [-7, -1, 0, 5, 9])
def test_scalar_expressions_follow_python_semantics(sv):
    """Floor `//` and `%` (also for negative operands), comparisons as 0/1, min/max, select,
    and/or, `x.rows`, as tile-scalar operands, each stored in its own row."""
    fn, exprs = scalars_fn(with_exprs=True)
    out = torch.full((len(exprs), 16), 99.0)
    run_incore_triton(fn, {"o": (out, 0, 0, len(exprs), 16)}, {"s": sv})
    env = {"s": sv, "o.rows": len(exprs)}
    want = torch.tensor([float(evaluate(e, env)) for e in exprs])
    assert torch.equal(out[:, 0], want), (out[:, 0], want)
    assert (out == out[:, :1]).all()


def test_int64_table():
    """Values beyond int32 switch the table (and the kernel's scalar arithmetic) to int64."""
    k = InCore("big")
    s = k.scalar("s")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 4, 16, f32)
    k.load(t, x, 0, 0)
    k.mask_cols(t, t, s - 3 * 2**32 + 5, fill=0.0)
    k.adds(t, t, s // 2**32)
    k.store(y, 0, 0, t)
    fn = k.build()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    mems = {n: RegionBatch(tt, *(torch.tensor([v]) for v in (0, 0, 4, 16)))
            for n, tt in (("x", x), ("y", torch.zeros(4, 16)))}
    scalars = {"s": torch.tensor([3 * 2**32])}
    launch = TritonBackend("cpu").prepare(TaskBatch(fn, mems, scalars, 1))
    assert launch.groups[0].table.dtype == torch.int64
    launch()
    want = torch.where(torch.arange(16) < 5, x, 0.0) + 3
    assert torch.equal(mems["y"].tensor, want)


# tile dataflow: loop-carried tiles -----------------------------------------------------------------


def test_subnormal_constants():
    out = [torch.zeros(4, 16), torch.zeros(4, 16)]
    run_incore(subnormal_fn(), {"x": (out[0], 0, 0, 4, 16)})
    run_incore_triton(subnormal_fn(), {"x": (out[1], 0, 0, 4, 16)})
    assert torch.equal(out[0], out[1]) and out[1][0, 0] > 0 and out[1][3, 0] > 0


def test_loop_carried_and_loop_local_tiles():
    """A tile first written in a loop and read after it, a temporary written in two loops, a
    loop that runs zero times (its tiles keep the reference's NaN poison)."""
    fn = carry_fn()
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(2))
    for nv, mv in ((3, 2), (1, 0), (8, 5)):
        outs = []
        for runner in (run_incore, run_incore_triton):
            out = torch.zeros(4, 16)
            runner(fn, {"x": (x, 0, 0, 32, 16), "y": (out, 0, 0, 4, 16)}, {"n": nv, "m": mv})
            outs.append(out)
        torch.testing.assert_close(outs[1], outs[0], equal_nan=True)
        assert outs[1].isnan().all() == (mv == 0)


# the source cache (here: the module whose temporary cache first receives these kernels; a kernel
# is loaded once a process) -------------------------------------------------------------------------


def test_sources_are_cached_by_content_hash():
    fn = specialize(pgemm_fn())
    srcs = render_sources([fn, rowwise_fn()])
    assert set(srcs) == {"pgemm.py", "rowwise.py"}
    for s in srcs.values():
        compile(s, "<kernel>", "exec")
    k = render(fn)
    assert "@triton.jit" in k.source and 'input_precision="ieee"' in k.source
    assert 'input_precision="tf32"' in render(fn, RenderOptions(input_precision="tf32")).source
    run_incore_triton(fn, {"a": (torch.ones(16, 16), 0, 0, 16, 16), "b": (torch.ones(16, 16), 0, 0, 16, 16),
                           "c": (torch.zeros(16, 16), 0, 0, 16, 16)}, {"K": 16, "NB": 1})
    path = cache_dir() / f"{k.digest}.py"
    assert path.read_text() == k.source
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
