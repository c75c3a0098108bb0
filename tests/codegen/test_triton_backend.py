"""The Triton code generator and backend against the reference interpreter.

Without a GPU the generated kernels run under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1): every tile op (f32, and f16, which the interpreter rounds like a GPU),
masking and padding at region edges, batches of tasks with different regions, the parallel axis
with per-task loop trip counts, floor-division semantics of scalar expressions, and the
softmax and bgemm programs. Kernels are also compiled ahead of time for sm_90 (Triton's own
front end and ptxas, no GPU needed), which checks what the interpreter lets through (types of
loop-carried values, bf16).
"""

from __future__ import annotations

import math
import os
import random
import zlib

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from pto import InCore, emax, emin, eq, f32, land, lor, ne  # noqa: E402
from pto.backends.torch_backend import TorchBackend  # noqa: E402
from pto.backends.triton import TritonBackend, cache_dir, run_incore_triton  # noqa: E402
from pto.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.codegen.triton import RenderOptions, render, render_sources  # noqa: E402
from pto.errors import BuildError, UsageError  # noqa: E402
from pto.interp.incore import run_incore  # noqa: E402
from pto.interp.orchestration import iter_tasks, run_program  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from pto.ir.expr import evaluate, select  # noqa: E402
from pto.programs import get  # noqa: E402
from pto.target import get as target  # noqa: E402
from tests.opkit import f64, rand, triton_vs_interp  # noqa: E402
from tests.sm90 import compile_sm90  # noqa: E402

pytestmark = [pytest.mark.interpret,
              # these tests hand CPU tensors to the kernels: the Triton interpreter's mode. Where
              # Triton compiles for a GPU (CUDA present, TRITON_INTERPRET unset) run this file on
              # its own with TRITON_INTERPRET=1; tests/gpu/test_gpu.py covers the compiled kernels.
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs the Triton interpreter (TRITON_INTERPRET=1)"),
              # rows padded with -inf give (-inf) - (-inf) in softmax, as in the reference
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
R, C = 8, 16
# f32 everywhere; f16 too, which the interpreter rounds as the GPU does (its bf16 does not)
DTYPES = [DType.F32, DType.F16]


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    """Generated sources go to a temporary cache, not the user's."""
    old = os.environ.get("PTO_CACHE_DIR")
    os.environ["PTO_CACHE_DIR"] = str(tmp_path_factory.mktemp("pto-cache"))
    yield
    if old is None:
        os.environ.pop("PTO_CACHE_DIR", None)
    else:
        os.environ["PTO_CACHE_DIR"] = old


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


def _edge_fn(pad):
    k = InCore("edge")
    x, y = k.memref("x", f32), k.memref("y", f32)
    s = k.scalar("s")
    t = k.tile("t", 4, 4, f32)
    k.load(t, x, s // 2, s % 3, pad=pad)
    k.store(y, 0, 0, t)
    return k.build()


@pytest.mark.parametrize("pad", [-1.0, -math.inf, math.nan, 1e-45])
@pytest.mark.parametrize("s", [0, 1, -3, 5])
def test_load_pad_and_store_mask(pad, s):
    """Loads outside the valid extent (also before the region's start) read `pad` rounded to the
    memref's dtype; stores outside it leave the tensor alone."""
    fn = _edge_fn(pad)
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


def _run_batch(fn, mems, scalars, size, backend):
    backend.prepare(TaskBatch(fn, mems, scalars, size))()


def _clone_mems(mems):
    return {k: RegionBatch(v.tensor.clone(), v.row0, v.col0, v.rows, v.cols) for k, v in mems.items()}


def _compare_backends(fn, mems, scalars, size, outputs, backend=None):
    """Run the batch through the torch and Triton backends on copies; compare ``outputs``."""
    ref, got = _clone_mems(mems), _clone_mems(mems)
    _run_batch(fn, ref, scalars, size, TorchBackend())
    _run_batch(fn, got, scalars, size, backend or TritonBackend("cpu"))
    for name in outputs:
        torch.testing.assert_close(got[name].tensor, ref[name].tensor, rtol=1e-5, atol=1e-5, equal_nan=True)
    return got


def _rowwise_fn():
    """Row-normalize a 16x32 region with a scalar shift: loads with -inf padding, reductions,
    broadcasts, a scalar operand and a residual-aware column mask."""
    k = InCore("rowwise")
    x, y = k.memref("x", f32), k.memref("y", f32)
    s = k.scalar("s")
    t, m = k.tile("t", 16, 32, f32), k.tile("m", 16, 1, f32)
    k.load(t, x, 0, 0, pad=-math.inf)
    k.rowmax(m, t)
    k.rowexpandsub(t, t, m)
    k.exp(t, t)
    k.adds(t, t, s)
    k.mask_cols(t, t, x.cols, fill=0.0)
    k.store(y, 0, 0, t)
    return k.build()


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
    fn = _rowwise_fn()
    mems, scalars = _random_batch(37, seed=5, full=full)
    be = TritonBackend("cpu")
    launch = be.prepare(TaskBatch(fn, _clone_mems(mems), scalars, 37))
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
    fn = _rowwise_fn()
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
    fn = _rowwise_fn()
    mems, scalars = _random_batch(9, seed=11, full=True)
    a, b = _clone_mems(mems), _clone_mems(mems)
    _run_batch(fn, a, scalars, 9, TritonBackend("cpu"))
    _run_batch(fn, b, scalars, 9, TritonBackend("cpu", even=False, align=False))
    assert torch.equal(a["y"].tensor, b["y"].tensor)


def _pgemm_fn():
    """``c[:, j*16 : j*16+16] = a @ b[:, j*16 : ...]`` for j on the parallel axis (NB blocks per
    task), with the K loop's trip count per task, masking columns past the region's end."""
    k = InCore("pgemm")
    K, NB = k.scalar("K"), k.scalar("NB")
    a, b = k.memref("a", f32, shape=(16, K)), k.memref("b", f32, shape=(K, NB * 16))
    c = k.memref("c", f32)
    j = k.parallel("j", NB)
    ta, tb, acc = k.tile("ta", 16, 16, f32), k.tile("tb", 16, 16, f32), k.tile("acc", 16, 16, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, K, 16) as kk:
        k.load(ta, a, 0, kk)
        k.load(tb, b, kk, j * 16)
        k.matmul_acc(acc, ta, tb)
    k.mask_cols(acc, acc, c.cols - j * 16, fill=-2.0)
    k.store(c, 0, j * 16, acc)
    return k.build()


def test_parallel_axis_and_per_task_trip_counts():
    fn = _pgemm_fn()
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


def _scalar_exprs(s, o):
    return [s // 3, s % 4, (-s) // 4, s // -2, s % -3, (s * 5 - 1) // 7, emin(s, 2), emax(s, -2),
            select(s < 0, 10, 20), land(s > -5, s < 5), lor(s < -5, s > 5), eq(s, 0), ne(s, 0),
            s <= 1, s >= 1, o.rows * 2 - s]


def _scalars_fn(with_exprs=False):
    k = InCore("scalars")
    s = k.scalar("s")
    o = k.memref("o", f32)
    z, t = k.tile("z", 1, 16, f32), k.tile("t", 1, 16, f32)
    k.full(z, 0.0)
    exprs = _scalar_exprs(s, o)
    for i, e in enumerate(exprs):
        k.adds(t, z, e)
        k.store(o, i, 0, t)
    return (k.build(), exprs) if with_exprs else k.build()


@pytest.mark.parametrize("sv", [-7, -1, 0, 5, 9])
def test_scalar_expressions_follow_python_semantics(sv):
    """Floor `//` and `%` (also for negative operands), comparisons as 0/1, min/max, select,
    and/or, `x.rows`, as tile-scalar operands, each stored in its own row."""
    fn, exprs = _scalars_fn(with_exprs=True)
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


def _carry_fn():
    k = InCore("carry")
    n, m = k.scalar("n"), k.scalar("m")
    x, y = k.memref("x", f32, shape=(32, 16)), k.memref("y", f32)
    t, u, acc, tmp = (k.tile(nm, 4, 16, f32) for nm in ("t", "u", "acc", "tmp"))
    k.full(acc, 0.0)
    with k.for_range("i", 0, n) as i:
        k.load(t, x, i * 4, 0)
        k.mul(tmp, t, t)
        k.add(acc, acc, tmp)
    with k.for_range("i2", 0, m) as i2:
        k.load(tmp, x, i2 * 4 + 4, 0)
        k.muls(u, tmp, 2.0)
    k.add(acc, acc, t)
    k.add(acc, acc, u)
    k.store(y, 0, 0, acc)
    return k.build()


def _subnormal_fn():
    """Constants Triton would type as fp64 if written as plain Python floats."""
    k = InCore("subnormal")
    x = k.memref("x", f32)
    t = k.tile("t", 4, 16, f32)
    k.full(t, 1e-40)
    k.adds(t, t, 1e-42)
    k.mask_rows(t, t, 2, fill=3e-41)
    k.store(x, 0, 0, t)
    return k.build()


def test_subnormal_constants():
    out = [torch.zeros(4, 16), torch.zeros(4, 16)]
    run_incore(_subnormal_fn(), {"x": (out[0], 0, 0, 4, 16)})
    run_incore_triton(_subnormal_fn(), {"x": (out[1], 0, 0, 4, 16)})
    assert torch.equal(out[0], out[1]) and out[1][0, 0] > 0 and out[1][3, 0] > 0


def test_loop_carried_and_loop_local_tiles():
    """A tile first written in a loop and read after it, a temporary written in two loops, a
    loop that runs zero times (its tiles keep the reference's NaN poison)."""
    fn = _carry_fn()
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(2))
    for nv, mv in ((3, 2), (1, 0), (8, 5)):
        outs = []
        for runner in (run_incore, run_incore_triton):
            out = torch.zeros(4, 16)
            runner(fn, {"x": (x, 0, 0, 32, 16), "y": (out, 0, 0, 4, 16)}, {"n": nv, "m": mv})
            outs.append(out)
        torch.testing.assert_close(outs[1], outs[0], equal_nan=True)
        assert outs[1].isnan().all() == (mv == 0)


# programs -------------------------------------------------------------------------------------------


def _conflict(a, b) -> bool:
    """Do two tasks touch overlapping elements of a tensor, one of them writing?"""
    for ra in a.regions:
        for rb in b.regions:
            if ra.tensor != rb.tensor or (ra.direction == "in" and rb.direction == "in"):
                continue
            if (ra.row0 < rb.row0 + rb.rows and rb.row0 < ra.row0 + ra.rows and
                    ra.col0 < rb.col0 + rb.cols and rb.col0 < ra.col0 + ra.cols):
                return True
    return False


def _batches(module, scalars, tensors):
    """The program's tasks in order, cut into batches: runs of consecutive calls of one variant
    with the same tensor bindings where no task conflicts with another of its batch."""
    runs: list[list] = []
    for task in iter_tasks(module, scalars):
        key = (task.func, tuple((r.param, r.tensor) for r in task.regions))
        if runs and runs[-1][0] == key and not any(_conflict(task, t) for t in runs[-1][1]):
            runs[-1][1].append(task)
        else:
            runs.append((key, [task]))
    for (fn, binding), tasks in runs:
        mems = {}
        for i, (param, tensor) in enumerate(binding):
            regs = [t.regions[i] for t in tasks]
            mems[param] = RegionBatch(tensors[tensor], *(torch.tensor([getattr(r, f) for r in regs])
                                                        for f in ("row0", "col0", "rows", "cols")))
        sc = {name: torch.tensor([dict(t.scalars)[name] for t in tasks]) for name, _ in tasks[0].scalars}
        yield TaskBatch(fn, mems, sc, len(tasks))


def _program_cases():
    cases = [("softmax", 100, DType.F32, None), ("bgemm", 45, DType.F32, None),
             ("softmax", 33, DType.F16, None), ("bgemm", 20, DType.F16, None)]
    # every InCore function of the layer: the three attention modes
    cases += [pytest.param("llama7b", 40, DType.F32, mode, marks=pytest.mark.slow)
              for mode in ("fused", "pair", "split", "fused-nc", "pair-nc", "split-nc", "fused+fuse")]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("name,seq,dtype,attention", _program_cases())
def test_program_through_both_backends(name, seq, dtype, attention):
    """Every call of the program, batched, through the torch and Triton backends, against the
    reference interpreter run of the whole program."""
    prog = get(name)
    options = {}
    if attention is not None:
        mode = attention.removesuffix("-nc").removesuffix("+fuse")
        options = {"attention": mode, "causal": not attention.endswith("-nc"),
                   "fuse_norm_rope": attention.endswith("+fuse")}
    opts = prog.settings(dtype=dtype, target=target("x86_64"), **options)
    module = prog.build(opts)
    inputs = prog.inputs(opts, prog.shape(seq), "cpu", seed=seq)
    scalars = prog.scalars(opts, prog.shape(seq))
    ref = run_program(module, inputs, scalars).tensors
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == DType.F32 else dict(rtol=2e-3, atol=2e-3)
    for backend in (TorchBackend(), TritonBackend("cpu")):
        tensors = {k: (inputs[k].clone() if k in inputs else torch.full_like(v, float("nan")))
                   for k, v in ref.items()}
        for batch in _batches(module, scalars, tensors):
            backend.prepare(batch)()
        for out in prog.outputs:
            torch.testing.assert_close(tensors[out], ref[out], **tol)


# build errors, sources, launch parameters ------------------------------------------------------------


def test_too_large_a_tile_is_a_build_error():
    """Padded tiles are tests/codegen/test_triton_padding.py's; a block over Triton's limit is refused."""
    k = InCore("big")
    x = k.memref("x", f32)
    t = k.tile("t", 1024, 2048, f32)
    k.load(t, x, 0, 0)
    k.store(x, 0, 0, t)
    with pytest.raises(BuildError, match=r"^`big`: tile `t` is 1024x2048 = 2097152 elements; a Triton block "
                                         r"holds at most 1048576$"):
        render(k.build())


def test_sources_are_cached_by_content_hash():
    fn = specialize(_pgemm_fn())
    srcs = render_sources([fn, _rowwise_fn()])
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


def test_render_options_change_the_code_not_the_result():
    """Approximate division/sqrt and the broadcast-multiply matmul in place of tl.dot are
    options of the renderer; under the interpreter all variants agree with the reference."""
    k = InCore("opts")
    a, b, c = k.memref("a", f32), k.memref("b", f32), k.memref("c", f32)
    ta, tb, tc = k.tile("ta", 16, 32, f32), k.tile("tb", 32, 16, f32), k.tile("tc", 16, 16, f32)
    k.load(ta, a, 0, 0)
    k.load(tb, b, 0, 0)
    k.matmul(tc, ta, tb)
    k.abs(tc, tc)
    k.sqrt(tc, tc)
    k.recip(tc, tc)
    k.store(c, 0, 0, tc)
    fn = k.build()
    gen = torch.Generator().manual_seed(4)
    mems = {"a": torch.randn(16, 32, generator=gen), "b": torch.randn(32, 16, generator=gen),
            "c": torch.zeros(16, 16)}
    batch = {n: RegionBatch(t, *(torch.tensor([v]) for v in (0, 0, *t.shape))) for n, t in mems.items()}
    fast = RenderOptions(ieee_math=False, dot_min=64)
    src = render(fn, fast).source
    assert "tl.dot" not in src and "div_rn" not in src and "tl.sqrt(" in src
    assert "tl.dot" in render(fn).source and "div_rn" in render(fn).source
    # c = 1 / sqrt(|s|), s a sum of K = 32 f32 products that each side may add in its own order:
    # |s_a - s_b| <= 2 gamma_K sum|a b| (gamma_K = K u / (1 - K u), u = 2^-24), which moves c by
    # at most 0.5 |s|^-1.5 times that, plus a few roundings of c itself (sqrt and recip on both
    # sides, approximate ones with ``fast``: at most 2 ulp each)
    a64, b64 = mems["a"].double(), mems["b"].double()
    s = a64 @ b64
    u, K = 2.0 ** -24, 32
    ds = 2 * (K * u / (1 - K * u)) * (a64.abs() @ b64.abs())
    assert bool((s.abs() > 2 * ds).all()), "the inputs put a sum too close to zero for a bound"
    c = s.abs().rsqrt()
    tol = 0.5 * ds * (s.abs() - ds) ** -1.5 + 8 * u * c
    for backend in (TritonBackend("cpu", options=fast), TritonBackend("cpu")):
        ref, got = _clone_mems(batch), _clone_mems(batch)
        _run_batch(fn, ref, {}, 1, TorchBackend())
        _run_batch(fn, got, {}, 1, backend)
        err = (got["c"].tensor.double() - ref["c"].tensor.double()).abs()
        assert bool((err <= tol).all()), f"worst error / bound {float((err / tol).max()):.2f}"
        # the bound is not vacuous: tight where the sum does not nearly cancel
        assert float((tol / c).median()) < 1e-4


def test_launch_parameters_defaults_and_overrides():
    from pto.incore.matmul import gemm_tile

    small = specialize(gemm_tile(f32, 32, 64, 32))
    big = specialize(gemm_tile(f32, 128, 128, 64))
    be = TritonBackend("cpu", launch={"gemm_tile": {"num_stages": 4},
                                      big.variant_name: {"num_warps": 16}})
    assert render(small).launch == {"num_warps": 4, "num_stages": 3, "enable_fp_fusion": False}
    assert render(big).launch["num_warps"] == 8
    assert be.launch_config(small) == {"num_warps": 4, "num_stages": 4, "enable_fp_fusion": False}
    assert be.launch_config(big)["num_warps"] == 16
    assert not be.graph_capturable and TritonBackend("cuda").graph_capturable


# ahead-of-time compilation for the GPU (no GPU needed) -----------------------------------------------

# Runs in a fresh interpreter without TRITON_INTERPRET: Triton picks the interpreter or the
# compiler when its modules are imported, so one process cannot do both reliably.
def _jobs_sm90(pairs):
    """:func:`tests.sm90.compile_sm90`'s jobs for ``(kernel, flags)`` pairs: upper-case launch keys
    (GROUP) are constexpr arguments, the rest compiler options; every pointer 16-aligned."""
    return [{"source": kern.source, "name": kern.name, "signature": kern.signature(), "aligned": True,
             "constexprs": {**flags, **{k: v for k, v in kern.launch.items() if k.isupper()}},
             "options": {k: v for k, v in kern.launch.items() if not k.isupper()}} for kern, flags in pairs]


def _every_op_fn(dtype):
    """One kernel using every op group (and a K loop) in ``dtype``."""
    k = InCore("every_op")
    n = k.scalar("n")
    x, y = k.memref("x", dtype), k.memref("y", dtype)
    a, b = k.tile("a", 32, 64, dtype), k.tile("b", 32, 64, dtype)
    s, w = k.tile("s", 32, 32, f32), k.tile("w", 32, 32, dtype)
    r, cv = k.tile("r", 32, 1, f32), k.tile("cv", 1, 64, f32)
    small, sm2, sm3 = k.tile("small", 8, 64, dtype), k.tile("sm2", 8, 32, f32), k.tile("sm3", 8, 32, dtype)
    k.load(a, x, 0, 0, pad=-math.inf)
    k.full(s, 0.0)
    with k.for_range("i", 0, n) as i:
        k.load(b, x, i * 32, 64)
        k.matmul_acc(s, a, b, tb=True)
    k.cast(w, s)
    k.matmul(s, w, w, ta=True, acc="f16")
    k.load(small, x, 32, 0)
    k.matmul(sm2, small, b, tb=True)
    k.rowmax(r, a)
    k.rowexpandsub(a, a, r)
    k.exp(a, a)
    k.colsum(cv, a)
    k.colexpanddiv(a, a, cv)
    k.silu(a, a)
    k.maxs(a, a, n)
    k.mask_causal(a, a, n - 3)
    k.divs(a, a, 3.0)
    k.rsqrt(b, b)
    k.min(a, a, b)
    k.rowsum(r, s)
    k.rowexpand(b, r)
    k.add(a, a, b)
    k.store(y, 0, 0, a)
    k.cast(w, s)
    k.store(y, 32, 0, w)
    k.cast(sm3, sm2)
    k.store(y, 64, 0, sm3)
    return k.build()


def _aot_functions():
    from pto.incore.matmul import gemm_tile
    from pto.incore.softmax import softmax_tile

    yield from (_every_op_fn(d) for d in (DType.BF16, DType.F16, DType.F32))
    yield specialize(gemm_tile(DType.BF16, 64, 128, 64))
    yield specialize(softmax_tile(4096, DType.BF16, rows=32))
    yield from (_pgemm_fn(), _rowwise_fn(), _edge_fn(-math.inf), _edge_fn(1e-45), _subnormal_fn())
    yield from (_scalars_fn(), _carry_fn())
    from pto.incore.fused import Fold, Heads, matmul_norm_rope_tile, matmul_norm_swiglu_tile, matmul_norm_tile

    yield specialize(matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, 1e-6))
    yield specialize(matmul_norm_rope_tile(DType.BF16, 128, 512, Heads(4, 128), 64, 1e-6))
    yield specialize(matmul_norm_swiglu_tile(DType.BF16, 128, 512, 1024, 128, 64, 1e-6))
    stats = Fold(1e-6, "stats")
    yield specialize(matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, stats))
    yield specialize(matmul_norm_rope_tile(DType.BF16, 128, 512, Heads(4, 128, 2), 64, stats))
    yield specialize(matmul_norm_swiglu_tile(DType.BF16, 128, 512, 1024, 128, 64, stats))


@pytest.mark.slow
def test_kernels_compile_for_sm90(tmp_path):
    """The generated code passes Triton's compiler for an H100 (bf16 included, both the masked
    and the mask-free path), and the K loop of a bf16 GEMM becomes tensor-core MMAs."""
    jobs = []
    for fn in _aot_functions():
        kern = render(fn)
        for even in (False, True):
            jobs.append((kern, {f"{w}_{p.name}": even for w in ("EVEN", "ALIGN") for p in fn.memrefs}))
    results = compile_sm90(_jobs_sm90(jobs), tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    gemm = [r for r in results if r["name"].startswith("gemm_tile")]
    assert gemm and all("wgmma" in r["ptx"] or "mma.sync" in r["ptx"] for r in gemm)


@pytest.mark.parametrize("group", [0, 1, 2, 3, 8])
def test_grouped_program_order(group):
    """GROUP > 0 renumbers the programs (groups of tasks x every parallel index, for L2 reuse);
    every (task, parallel index) must still run exactly once."""
    from pto.incore.matmul import matmul_tile

    fn = specialize(matmul_tile(DType.F32, 16, 64, 96, 32, 32))  # 3 column blocks a task
    g = torch.Generator().manual_seed(group)
    x, w = torch.randn(80, 64, generator=g), torch.randn(64, 96, generator=g)
    y = torch.full((80, 96), float("nan"))
    starts = torch.arange(0, 80, 16)
    n = len(starts)

    def rb(t, r0, c0, nr, nc):
        return RegionBatch(t, *(torch.as_tensor(v, dtype=torch.int64).expand(n).clone() for v in (r0, c0, nr, nc)))

    be = TritonBackend("cpu", launch={"matmul_tile": {"GROUP": group}})
    be.prepare(TaskBatch(fn, {"x": rb(x, starts, 0, 16, 64), "w": rb(w, 0, 0, 64, 96),
                              "y": rb(y, starts, 0, 16, 96)}, {}, n))()
    assert torch.allclose(y, x @ w, rtol=1e-5, atol=1e-5)
