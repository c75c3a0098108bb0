"""The Triton code generator and backend, continued (tests/codegen/test_triton_backend.py has the
ops, regions, batches, scalar expressions and loop-carried tiles): whole programs batched
through both backends against the reference interpreter, build errors, the source cache, render
options and launch parameters, ahead-of-time compilation for sm_90 (Triton's front end and
ptxas, no GPU needed), and the grouped program order."""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from pto import InCore, f32  # noqa: E402
from pto.backends.torch_backend import TorchBackend  # noqa: E402
from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.codegen.triton.common import FLAT_STAGES  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import BuildError  # noqa: E402
from pto.interp.orchestration import iter_tasks, run_program  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from pto.machine.target import get as target  # noqa: E402
from pto.programs import get  # noqa: E402
from tests.codegen.tritonkit import (  # noqa: E402,F401 (temp_cache_dir applies itself)
    INTERPRETER_ONLY,
    carry_fn,
    clone_mems,
    compile_both_paths_sm90,
    edge_fn,
    pgemm_fn,
    rowwise_fn,
    run_batch,
    scalars_fn,
    subnormal_fn,
    temp_cache_dir,
)

pytestmark = INTERPRETER_ONLY


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
        ref, got = clone_mems(batch), clone_mems(batch)
        run_batch(fn, ref, {}, 1, TorchBackend())
        run_batch(fn, got, {}, 1, backend)
        err = (got["c"].tensor.double() - ref["c"].tensor.double()).abs()
        assert bool((err <= tol).all()), f"worst error / bound {float((err / tol).max()):.2f}"
        # the bound is not vacuous: tight where the sum does not nearly cancel
        assert float((tol / c).median()) < 1e-4


def test_a_persistent_kernel_runs_every_task_once_and_keeps_its_schedule_key():
    """A kernel without a parallel axis loops over its tasks too (3 programs under the
    interpreter for 7 tasks); the persistent loop is a launch setting, so the schedule database's
    key (the arithmetic) is the plain kernel's; an unknown mode is refused."""
    k = InCore("absrows")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 16, 32, f32)
    k.load(t, x, 0, 0)
    k.abs(t, t)
    k.store(y, 0, 0, t)
    fn = k.build()
    xs = torch.randn(112, 32, generator=torch.Generator().manual_seed(7))
    ys = torch.full_like(xs, float("nan"))
    n = 7
    r0, zero = torch.arange(n) * 16, torch.zeros(n, dtype=torch.int64)
    mems = {m: RegionBatch(v, r0, zero, torch.full((n,), 16), torch.full((n,), 32)) for m, v in (("x", xs), ("y", ys))}
    TritonBackend("cpu", launch={"absrows": {"persistent": "loop"}}).prepare(TaskBatch(fn, mems, {}, n))()
    assert torch.equal(ys, xs.abs())
    plain, looped = render(fn), render(fn, RenderOptions(persistent="loop"))
    assert "tl.range(tl.program_id(0), NB, tl.num_programs(0))" in looped.source
    assert looped.schedule_digest == plain.schedule_digest and looped.digest != plain.digest
    flat = render(fn, RenderOptions(persistent="flat"))  # flattened and pipelined, FLAT_STAGES deep
    assert f"tl.range(tl.program_id(0), NB, tl.num_programs(0), num_stages={FLAT_STAGES}, flatten=True)" in flat.source
    assert flat.schedule_digest == plain.schedule_digest
    with pytest.raises(BuildError, match=r"RenderOptions.persistent='spin': one of loop, ws, flat, blocks "
                                         r"or '' \(off\)"):
        render(fn, RenderOptions(persistent="spin"))


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

# (compiled in a fresh interpreter without TRITON_INTERPRET: tests.codegen.tritonkit.compile_both_paths_sm90)
def _every_op_fn(dtype):
    """One kernel using every op group (and a K loop) in ``dtype``."""
    k = InCore("every_op")
    n = k.scalar("n")
    x, y, z = k.memref("x", dtype), k.memref("y", dtype), k.memref("z", f32)
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
    k.store_add(z, 0, 0, sm2)
    return k.build()


def _aot_functions():
    from pto.incore.matmul import gemm_tile
    from pto.incore.softmax import softmax_tile

    yield from (_every_op_fn(d) for d in (DType.BF16, DType.F16, DType.F32))
    yield specialize(gemm_tile(DType.BF16, 64, 128, 64))
    yield specialize(softmax_tile(4096, DType.BF16, rows=32))
    yield from (pgemm_fn(), rowwise_fn(), edge_fn(-math.inf), edge_fn(1e-45), subnormal_fn())
    yield from (scalars_fn(), carry_fn())
    from pto.incore.fused import Fold, Heads, matmul_norm_rope_tile, matmul_norm_swiglu_tile, matmul_norm_tile

    yield specialize(matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, 1e-6))
    yield specialize(matmul_norm_rope_tile(DType.BF16, 128, 512, Heads(4, 128), 64, 1e-6))
    yield specialize(matmul_norm_swiglu_tile(DType.BF16, 128, 512, 1024, 128, 64, 1e-6))
    stats = Fold(1e-6, "stats")
    yield specialize(matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, stats))
    yield specialize(matmul_norm_rope_tile(DType.BF16, 128, 512, Heads(4, 128, 2), 64, stats))
    yield specialize(matmul_norm_swiglu_tile(DType.BF16, 128, 512, 1024, 128, 64, stats))


@pytest.mark.sm90
@pytest.mark.slow
def test_kernels_compile_for_sm90(tmp_path):
    """The generated code passes Triton's compiler for an H100 (bf16 included, both the masked
    and the mask-free path), and the K loop of a bf16 GEMM becomes tensor-core MMAs."""
    results = compile_both_paths_sm90(_aot_functions(), tmp_path)
    gemm = [r for r in results if r["name"].startswith("gemm_tile")]
    assert gemm and all("wgmma" in r["ptx"] or "mma.sync" in r["ptx"] for r in gemm)


@pytest.mark.parametrize("persistent", ["", "loop", "ws", "flat", "blocks"])
@pytest.mark.parametrize("group", [0, 1, 2, 3, 8])
def test_grouped_program_order(group, persistent):
    """GROUP > 0 renumbers the programs (groups of tasks x every parallel index, for L2 reuse);
    a persistent kernel's programs (3 under the interpreter) loop over the same pairs ("blocks":
    2 programs a task, each over its task's indices; GROUP is then moot); every (task, parallel
    index) must still run exactly once."""
    from pto.incore.matmul import matmul_tile

    fn = specialize(matmul_tile(DType.F32, 16, 64, 96, 32, 32))  # 3 column blocks a task
    g = torch.Generator().manual_seed(group)
    x, w = torch.randn(80, 64, generator=g), torch.randn(64, 96, generator=g)
    y = torch.full((80, 96), float("nan"))
    starts = torch.arange(0, 80, 16)
    n = len(starts)

    def rb(t, r0, c0, nr, nc):
        return RegionBatch(t, *(torch.as_tensor(v, dtype=torch.int64).expand(n).clone() for v in (r0, c0, nr, nc)))

    be = TritonBackend("cpu", launch={"matmul_tile": {"GROUP": group, "persistent": persistent}})
    be.prepare(TaskBatch(fn, {"x": rb(x, starts, 0, 16, 64), "w": rb(w, 0, 0, 64, 96),
                              "y": rb(y, starts, 0, 16, 96)}, {}, n))()
    assert torch.allclose(y, x @ w, rtol=1e-5, atol=1e-5)
