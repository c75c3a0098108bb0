"""The persistent megakernel fits the device's shared memory by construction: each variant's
loops keep the pipelining depth its schedule asks for, lowered (deepest and costliest first)
until the compiled kernel fits; when nothing fits, one error names the branches. Compiled for an
H100 (sm_90) by Triton's own compiler, no GPU needed (tests/sm90.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pto import programs
from pto.backends.triton import TritonBackend
from pto.backends.triton.schedules import ScheduleDB
from pto.codegen.triton.megakernel import fit_megakernel, render_megakernel, stage_bytes
from pto.errors import ResourceError
from pto.exec.plan import make_plan
from pto.machine.target import get as target
from pto.runtime.graph import CompiledProgram
from tests.exec.split_programs import decode_plan
from tests.sm90 import compile_sm90, megakernel_job

H100_SHARED = 232448  # bytes of shared memory a block may opt in to on an H100 (227 KiB)
OPTIONS = {"num_warps": 8, "num_stages": 1, "enable_fp_fusion": True}


def _plan(program: str, config: str, seq: int, **options):
    prog = programs.get(program)
    s = prog.settings(device="cuda", config=config, dtype="bf16", target=target("cuda_h100"), **options)
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, prog.shape(seq)))
    try:
        return make_plan(graph, list(graph.tensor_ids), {}, flags=TritonBackend("cpu").task_flags)
    finally:
        graph.close()


def _compiler(tmp_path):
    """Shared memory of a kernel as Triton compiles it for sm_90 (one subprocess per kernel)."""
    sizes = []

    def shared(kernel) -> int:
        folder = tmp_path / f"k{len(sizes)}"
        folder.mkdir()
        (r,) = compile_sm90([megakernel_job(kernel, OPTIONS)], folder)
        assert r["ok"], r.get("error")
        sizes.append(r["shared"])
        return r["shared"]

    return shared, sizes


@pytest.mark.sm90
@pytest.mark.slow
def test_shipped_h100_schedules_fit_the_7b_megakernel(tmp_path):
    """The crash of `pto run llama7b --seq 1537` on an H100: the shipped schedules ask for 4
    stages for some GEMMs; the kernel-wide maximum (the old rule) needs more shared memory than
    an H100 has, the fitted kernel fits and keeps every depth that fits."""
    plan = _plan("llama7b", "7b", 1537, attention="fused")
    db = ScheduleDB("NVIDIA H100 80GB HBM3", user_dir=tmp_path / "user", shipped=programs.get("llama7b").schedules)
    db.triton = "3.6.0"  # the shipped entries apply as on the H100 (measured with Triton 3.6)
    backend = TritonBackend("cpu", schedules=db)
    tasks = np.bincount(plan.task_branch, minlength=len(plan.branches))
    want: dict[str, int] = {}
    for b, n in zip(plan.branches, tasks):
        want[b.fn.variant_name] = max(want.get(b.fn.variant_name, 1), backend.launch_config(b.fn, int(n))["num_stages"])
    assert max(want.values()) == 4
    shared, sizes = _compiler(tmp_path)
    deepest = max(want.values())
    old = shared(render_megakernel(plan.branches, stages={v: deepest for v in want}))
    assert old > H100_SHARED
    kernel, stages, need = fit_megakernel(plan.branches, want, shared, H100_SHARED)
    assert need <= H100_SHARED and need == sizes[-1]
    assert all(1 <= stages[v] <= max(want[v], 1) for v in want)
    # a depth is lowered only when the kernel with the asked depths did not fit
    fns = {b.fn.variant_name: b.fn for b in plan.branches}
    lowered = {v for v in want if stages[v] < want[v] and stage_bytes(fns[v])}
    assert not lowered or sizes[1] > H100_SHARED
    assert "num_stages=" in kernel.source


@pytest.mark.sm90
@pytest.mark.slow
def test_a_kernel_that_never_fits_is_one_error_naming_its_branches(tmp_path):
    plan = _plan("llama7b", "tiny", 300, attention="fused")
    shared, sizes = _compiler(tmp_path)
    with pytest.raises(ResourceError, match=r"persistent kernel: needs [\d,]+ bytes of shared memory with one "
                                            r"pipeline stage per loop \(the device allows 16\); its largest "
                                            r"branches: `"):
        fit_megakernel(plan.branches, {b.fn.variant_name: 3 for b in plan.branches}, shared, 16)
    assert len(sizes) >= 1


def test_stage_bytes_counts_the_tiles_a_loop_loads():
    plan = _plan("llama7b", "7b", 1537, attention="fused")
    by_name = {b.fn.variant_name: b.fn for b in plan.branches}
    gemm = by_name["matmul_tile__K4096_N4096_R128"]
    # a 128 x 64 activation tile and a 64 x N-block weight tile per K step, bf16
    a = next(t for t in gemm.tiles if t.name == "a")
    bt = next(t for t in gemm.tiles if t.name == "bt")
    from pto.ir.facts import tile_shape

    expect = sum(np.prod(tile_shape(t, dict(gemm.variant))) * 2 for t in (a, bt))
    assert stage_bytes(gemm) == expect


def test_the_shared_estimate_counts_only_loops_that_pipeline():
    """SmolLM2's decode step: a GEMV whose K loop is one step of 1024 over 576 columns loads
    into registers (nothing estimated); the LM head's K loop over 576 in steps of 64 buffers
    stages - 1 weight tiles of 64 x 256 bf16 and its 1 x 64 activation and gain tiles."""
    from pto.codegen.triton.megakernel import shared_estimate

    plan, _ = decode_plan("smollm2-135m")
    by_name = {b.fn.name: b for b in plan.branches}
    gemv = by_name["gemv_norm_swiglu_tile"].fn
    assert stage_bytes(gemv) > 0 and stage_bytes(gemv, pipelined=True) == 0 and shared_estimate(gemv, 3) == 0
    head = by_name["lmhead_argmax_tile"].fn
    per_stage = 64 * 256 * 2 + 2 * (64 * 2)
    assert stage_bytes(head, pipelined=True) == per_stage
    assert [shared_estimate(head, s) for s in (1, 2, 3)] == [0, per_stage, 2 * per_stage]


def test_a_run_branch_is_estimated_with_its_one_step_k_loops():
    """The 1B shape's step with runs (264 items a task at most), gate/up in one K step of 2,048:
    its run branch pipelines that one-step K loop through the run's loop, so its estimate buffers
    every tile that loop loads; as an item an index it loads into registers (nothing estimated).
    The occupancy the split rule reads counts it."""
    from pto.backends.triton.megakernel import branch_configs, occupancy, sram_per_sm
    from pto.codegen.triton.megakernel import shared_estimate

    plan, backend = decode_plan("llama3.2-1b", runs=264, ffn_bk=2048)
    (b,) = [b for b in plan.branches if b.runs and b.fn.name == "gemv_norm_swiglu_tile"]
    assert stage_bytes(b.fn, pipelined=True) == 0 and shared_estimate(b.fn, 2) == 0
    assert shared_estimate(b.fn, 2, runs=True) == stage_bytes(b.fn) > 0
    k = plan.branches.index(b)
    stages = branch_configs(backend, plan)[k].num_stages
    _, occ = occupancy(backend, plan)
    sram = sram_per_sm(backend.device)
    assert occ[k, 1] == max(1, min(32, (sram + 1024) // (shared_estimate(b.fn, stages, runs=True) + 1024))) < 32


@pytest.mark.sm90
@pytest.mark.slow
def test_a_run_branchs_shared_memory_is_what_triton_compiles(tmp_path):
    """The 1B shape's run branches (q/k/v and gate/up in runs), each compiled alone in a
    one-branch megakernel for sm_90 at two stages (no GPU needed): shared memory within 1 KiB of
    the estimate with ``runs``."""
    from pto.codegen.triton.megakernel import shared_estimate

    plan, _ = decode_plan("llama3.2-1b", runs=264)
    run = [b for b in plan.branches if b.runs]
    assert run
    jobs = [megakernel_job(render_megakernel([b], stages={b.fn.variant_name: 2}, dispatch="static"),
                           {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}) for b in run]
    for b, r in zip(run, compile_sm90(jobs, tmp_path)):
        assert r["ok"], (b.fn.variant_name, r.get("error"))
        assert abs(r["shared"] - shared_estimate(b.fn, 2, runs=True)) <= 1024, (b.fn.variant_name, r["shared"])


@pytest.mark.sm90
@pytest.mark.slow
def test_the_shared_estimate_is_what_triton_compiles(tmp_path):
    """Each branch of SmolLM2's decode step compiled alone in a one-branch megakernel for sm_90
    at its schedule's depth (no GPU needed): the GEMVs' and the LM head's shared memory within
    1 KiB of the estimate the cut rule reads; attention's at least the estimate (its tl.dot
    operands add a layout-conversion buffer)."""
    from pto.backends.triton.megakernel import branch_configs
    from pto.codegen.triton.megakernel import shared_estimate

    plan, backend = decode_plan("smollm2-135m")
    jobs, want = [], []
    for b, cfg in zip(plan.branches, branch_configs(backend, plan)):
        name = b.fn.name
        kernel = render_megakernel([b], stages={b.fn.variant_name: cfg.num_stages}, dispatch="static")
        jobs.append(megakernel_job(kernel, {"num_warps": cfg.num_warps, "num_stages": 1, "enable_fp_fusion": True}))
        want.append((name, shared_estimate(b.fn, cfg.num_stages)))
    results = compile_sm90(jobs, tmp_path)
    for (name, estimate), r in zip(want, results):
        assert r["ok"], (name, r.get("error"))
        if name.startswith("decode_attn"):
            assert r["shared"] >= estimate, (name, r["shared"], estimate)
        else:
            assert abs(r["shared"] - estimate) <= 1024, (name, r["shared"], estimate)
    assert max(e for _, e in want) == dict(want)["lmhead_argmax_tile"] > 0
