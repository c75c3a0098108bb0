"""The persistent executor under the Triton interpreter: bit-identical to the wave executor on
every program and attention mode, a topological queue that covers every work item once, replays
that reset the device counters, a bounded wait that names the task instead of hanging, and a
trace whose schedule respects every dependency."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from pto.engine import Runner, resolve  # noqa: E402
from pto.errors import BuildError, ExecutionError, UsageError  # noqa: E402

pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs the Triton interpreter (TRITON_INTERPRET=1)")]

CASES = [("softmax", 70, {}), ("bgemm", 45, {}),
         ("llama7b", 40, {"attention": "fused"}), ("llama7b", 40, {"attention": "pair"}),
         ("llama7b", 40, {"attention": "split"}), ("llama7b", 33, {"attention": "fused", "causal": False}),
         ("llama7b", 33, {"attention": "split", "causal": False}),
         ("llama7b", 40, {"attention": "fused", "fuse_norm_rope": True})]


def _run(program, seq, options, executor, seed=1):
    job = resolve(program, device="cpu", backend="triton", executor=executor, options=options)
    runner = Runner(job, seq)
    inputs = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=seed)
    out = {k: v.clone() for k, v in runner(inputs).items()}
    return job, runner, inputs, out


@pytest.mark.slow
@pytest.mark.parametrize("program,seq,options", CASES, ids=lambda x: str(x) if not isinstance(x, dict) else
                         "-".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_bit_identical_to_waves_and_close_to_the_reference(program, seq, options):
    from pto.engine import rel_err

    job, rw, inputs, want = _run(program, seq, options, "waves")
    rw.close()
    job, rp, _, got = _run(program, seq, options, "persistent")
    try:
        assert rp.stats.launches == len(rp.executor.segments)  # one launch a segment (the default split)
        for k in want:
            assert torch.equal(got[k], want[k]), k
        ref = job.program.reference(job.settings, job.program.shape(seq), inputs)
        assert max(rel_err(got[k], v) for k, v in ref.items()) <= 1e-4
        _check_queue(rp.executor.plan)
    finally:
        rp.close()


def _check_queue(plan):
    """Every (task, parallel index) once; every predecessor's items before any successor item."""
    items = plan.items
    want = {(t, p) for t in range(plan.n_tasks) for p in range(plan.nitems[t])}
    assert len(items) == len(want) and {tuple(map(int, x)) for x in items} == want
    first = np.full(plan.n_tasks, len(items))
    last = np.zeros(plan.n_tasks, np.int64)
    for pos, (t, _) in enumerate(items):
        first[t] = min(first[t], pos)
        last[t] = max(last[t], pos)
    for t in range(plan.n_tasks):
        for s in plan.succ[plan.succ_ptr[t]:plan.succ_ptr[t + 1]]:
            assert last[t] < first[s], (t, s)
    assert int(plan.pending.sum()) == len(plan.succ)
    # the megakernel's counts: every item of every predecessor releases its successor once
    items_before = np.zeros(plan.n_tasks, np.int64)
    for t in range(plan.n_tasks):
        for s in plan.succ[plan.succ_ptr[t]:plan.succ_ptr[t + 1]]:
            items_before[s] += plan.nitems[t]
    assert np.array_equal(plan.pending_items, items_before) and ((plan.pending_items > 0) == (plan.pending > 0)).all()


@pytest.mark.slow
def test_replays_reset_the_counters_and_read_new_inputs():
    job, runner, _, first = _run("llama7b", 40, {"attention": "pair"}, "persistent", seed=1)
    try:
        for seed in (2, 1):
            inputs = job.program.inputs(job.settings, job.program.shape(40), "cpu", seed=seed)
            out = runner(inputs)["y"]
            ref = job.program.reference(job.settings, job.program.shape(40), inputs)["y"]
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            runner.executor.check()
        assert torch.equal(out, first["y"])  # seed 1 again: the same bits
    finally:
        runner.close()


@pytest.mark.parametrize("dispatch", ["queue", "static", "stream"])
@pytest.mark.parametrize("deps", ["task", "data"])
def test_a_wait_that_never_ends_is_reported_with_its_task(dispatch, deps):
    """A dependency that is never released (a counter one too high: a task's, or with data
    dependencies one of its items') makes the waiting program give up after max_polls: an error
    naming the task, not a hung kernel; once reported, the next launch starts clean."""
    from pto.backends.triton import MegakernelSettings

    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": "fused"})
    runner = Runner(job, 40)
    # one kernel (test_megakernel_split plants one in each segment of a split plan)
    runner.executor.settings = MegakernelSettings(dispatch=dispatch, split="off", deps=deps)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
        ex = runner.executor
        assert (ex.plan.boxes is not None) == (deps == "data")
        ex.kernel.max_polls = 50
        victim = int(np.nonzero(ex.plan.pending)[0][-1])  # a task with predecessors
        counters = ex.kernel.counters
        counter = int(counters.counter[np.flatnonzero(ex.plan.items[:, 0] == victim)[0]])  # (its first item's)
        assert counters.init[counter] > 0 and (deps == "data" or counter == victim)
        ex.kernel.buf["pending0"][counter] += 1
        ex.replay()
        with pytest.raises(ExecutionError, match=rf"predecessors of task {victim + ex.plan.first_task} "
                                                 rf"\(`{ex.plan.variants[victim].variant_name}`\)"):
            ex.check()
        ex.kernel.buf["pending0"][counter] -= 1  # the dependency right again: the next launch runs
        ex.replay()  # whole, the reported give-up not carried into it
        ex.check()
    finally:
        runner.close()


@pytest.mark.parametrize("deps", ["task", "data"])
def test_the_item_path_follows_the_item_each_waited_for(deps):
    """The report's item-level critical path. Each item's waited-for item (the release its
    counter took last) is an item of a predecessor task that ended before it started; with task
    dependencies, the item of its task's predecessors that ended last (from the graph's edges,
    apart from the counters); an item of a task without predecessors waits for none. The path's
    waits, dispatch gaps and items add up to its length, within the run's span."""
    from pto.backends.triton import MegakernelSettings

    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": "fused"})
    runner = Runner(job, 40)
    runner.executor.settings = MegakernelSettings(split="off", deps=deps)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
        ex = runner.executor
        rep = ex.report()
        recs = ex.trace_records()
        pred = ex._waited_items(recs)
        plan = ex.plan
        task = np.array([r.task for r in recs]) - plan.first_task
        start = np.array([r.start_ns for r in recs])
        end = np.array([r.end_ns for r in recs])
        preds_of = [set(plan.edge_sources[plan.succ == t].tolist()) for t in range(plan.n_tasks)]
        for i in range(len(recs)):
            mine = preds_of[task[i]]
            if not mine:
                assert pred[i] == -1
                continue
            assert pred[i] >= 0 and task[pred[i]] in mine and end[pred[i]] < start[i]
            if deps == "task":
                of_preds = np.flatnonzero(np.isin(task, list(mine)))
                assert end[pred[i]] == end[of_preds].max()
        # one program under the interpreter: every item is held by the one before it, which is
        # a wait where it is the item it waited for, else the program's dispatch
        assert ex.programs == 1
        path = rep["item_path_ticks"]
        seq = np.argsort(start)
        assert path["items"] == len(recs) and path["total"] == end.max() - start.min()
        assert path["item"] == (end - start).sum() and path["launch"] == 0
        held_by_wait = [int(start[i] - end[j]) for j, i in zip(seq, seq[1:]) if pred[i] == j]
        assert path["wait"] == sum(held_by_wait)
        assert path["total"] == path["wait"] + path["dispatch"] + path["item"]
        assert sum(f["items"] for f in path["by_function"].values()) == path["items"]
    finally:
        runner.close()


@pytest.mark.slow
def test_trace_schedule_respects_every_dependency():
    """Traced run: every item has a start before its end on one program, items of a program do
    not overlap, and every item starts after every item of the task's predecessors ended."""
    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": "split"})
    runner = Runner(job, 40, record=True)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
        recs = runner.stats.records
        plan = runner.executor.plan
        assert len(recs) == plan.n_items
        end_of = {}
        for r in recs:
            assert r.start_ns < r.end_ns
            t = r.task - plan.first_task
            end_of[t] = max(end_of.get(t, -1), r.end_ns)
        by_prog = {}
        for r in recs:
            by_prog.setdefault(r.program, []).append((r.start_ns, r.end_ns))
        for spans in by_prog.values():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        for r in recs:
            t = r.task - plan.first_task
            preds = [p for p in range(plan.n_tasks) if t in plan.succ[plan.succ_ptr[p]:plan.succ_ptr[p + 1]]]
            assert all(end_of[p] < r.start_ns for p in preds)
        rep = runner.executor.report()
        assert rep["items"] == plan.n_items and rep["item_gap_ticks"] >= 0
        # a dependency's cost: every waiting task (with data dependencies, the default, every
        # waited counter of a launch: a task's items with the same waits) started after its last
        # predecessor (release) ended
        waits = runner.executor._release_waits(runner.executor.trace_records())
        waited = int((plan.pending > 0).sum())
        if plan.boxes is not None:
            waited = sum(len({c for c in k.counters.counter.tolist() if k.counters.init[c] > 0})
                         for k in runner.executor.kernels)
        assert len(waits) == waited > 0 and waits.min() > 0
        assert rep["dependency_wait_ticks"] == round(float(np.median(waits)), 3)
        # the critical path: a chain of dependencies from a task without predecessors to the
        # task that ended last, whose waits, items and spreads add up to its length
        cp = rep["critical_path_ticks"]
        assert 0 < cp["total"] <= max(r.end_ns for r in recs) - min(r.start_ns for r in recs)
        assert cp["total"] == pytest.approx(cp["wait"] + cp["item"] + cp["spread"] + cp["launch"], abs=1e-2)
        assert 1 < cp["tasks"] <= int(plan.levels().max()) + 1 and cp["wait"] > 0
        assert sum(f["tasks"] for f in cp["by_function"].values()) == cp["tasks"]
    finally:
        runner.close()


def test_the_stages_setting_deepens_every_loading_loop_and_keeps_the_bits(monkeypatch):
    """``PTO_MK_STAGES=N`` renders every pipelined loop of the megakernel at N stages in place of
    its schedule's (the rendered source and the kernel's stages say so; the interpreter, which
    runs no pipeline, computes the same bits: the GPU test checks them where the pipeline is
    real); anything but a whole number from 1 to 8, or ``schedule``, is one line naming it."""
    from pto.backends.triton.megakernel import MAX_STAGES, resolve_stages

    monkeypatch.delenv("PTO_MK_STAGES", raising=False)
    job, rd, _, want = _run("bgemm", 45, {}, "persistent")
    rd.close()
    plain = rd.executor.kernels[0].stages
    monkeypatch.setenv("PTO_MK_STAGES", "5")
    job, rp, _, got = _run("bgemm", 45, {}, "persistent")
    try:
        kernel = rp.executor.kernels[0]
        loading = {v for v, n in kernel.stages.items() if n > 1}
        assert loading and all(kernel.stages[v] == 5 for v in loading) and plain != kernel.stages
        assert "num_stages=5)" in kernel.rendered.source
        for k in want:
            assert torch.equal(got[k], want[k]), k
    finally:
        rp.close()
    assert resolve_stages(3) == 3 and resolve_stages(None) == 5 and resolve_stages("schedule") == "schedule"
    for bad in ("0", str(MAX_STAGES + 1), "deep", "2.5", "\u00b2", "\u0665"):
        monkeypatch.setenv("PTO_MK_STAGES", bad)
        with pytest.raises(UsageError, match=rf"^PTO_MK_STAGES='{bad}': the megakernel's pipeline stages are a whole "
                                             f"number from 1 to {MAX_STAGES}, or schedule$"):
            resolve_stages(None)


def test_the_warps_setting_sets_the_programs_warps_and_keeps_the_bits(monkeypatch):
    """``PTO_MK_WARPS=N`` launches the megakernel's programs with N warps in place of the most
    its branches' schedules ask for (the same bits under the interpreter); anything but one of
    :data:`WARPS` is one line naming it, before the plan is built."""
    from pto.backends.triton.megakernel import WARPS, resolve_warps

    monkeypatch.delenv("PTO_MK_WARPS", raising=False)
    job, rd, _, want = _run("bgemm", 45, {}, "persistent")
    rd.close()
    plain = rd.executor.kernels[0].config.num_warps
    asked = 2 if plain != 2 else 8
    monkeypatch.setenv("PTO_MK_WARPS", str(asked))
    job, rp, _, got = _run("bgemm", 45, {}, "persistent")
    try:
        kernel = rp.executor.kernels[0]
        assert kernel.config.num_warps == asked and kernel.consts()["num_warps"] == asked
        for k in want:
            assert torch.equal(got[k], want[k]), k
    finally:
        rp.close()
    assert resolve_warps(16) == 16 and resolve_warps(None) == asked
    for bad in ("0", "3", "32", "many", "\u00b2"):
        monkeypatch.setenv("PTO_MK_WARPS", bad)
        with pytest.raises(UsageError, match=rf"^PTO_MK_WARPS='{bad}': the megakernel's warps a program are one of "
                                             f"{', '.join(map(str, WARPS))}$"):
            resolve_warps(None)
        with pytest.raises(UsageError, match=r"^PTO_MK_WARPS="):
            _run("bgemm", 45, {}, "persistent")


def _step_plan(config: str, batch: int, spec="bf16"):
    """``config``'s decode step on an H200 in the persistent executor's tiles (cache 1,024), its
    weights bf16 or ``spec`` (``LAYERS/HEAD``: :meth:`WeightTypes.of_spec`, or the
    :class:`WeightTypes`) in the tiles the executor takes for them."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, megakernel_programs, tiling_for_executor
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, tg = CONFIGS[config], get("cuda_h200")
    wt = spec if isinstance(spec, WeightTypes) else WeightTypes() if spec == "bf16" else WeightTypes.of_spec(spec)
    tiling = for_weights(tiling_for_executor(cfg, "persistent", tg), wt, batch)
    m = build_step(cfg, DType.BF16, tg, batch, tiling, cache=1024, wtypes=wt)
    graph = build_module_graph(m, {"B": batch, "C": 1024}).graph
    try:
        return make_plan(graph, list(graph.tensor_ids), {}, programs=megakernel_programs(tg), runs=264)
    finally:
        graph.close()


def test_lone_dot_projections_are_the_few_row_dots_of_one_item_a_multiprocessor():
    """On an H200's 132 multiprocessors the 1B shape's step at 8 sequences runs its q/k/v, o and
    down projections in 96, 64 and 64 items (tensor-core dots of its rows padded to 16): those are
    lone dot projections, its gate/up (256 items) is not; the 8B's projections all take more
    items than multiprocessors, and a step of one sequence has GEMVs, not dots."""
    from pto.backends.triton.megakernel import lone_dots

    plan = _step_plan("llama3.2-1b", 8)
    items = {b.fn.variant_name: int(plan.nitems[plan.task_branch == k].max()) for k, b in enumerate(plan.branches)}
    lone = lone_dots(plan, 132)
    assert lone == {v for v in items if v.startswith(("gemv_residual_tile", "gemv_norm_tile"))} and len(lone) == 3
    assert sorted(items[v] for v in lone) == [64, 64, 96] and items["gemv_norm_swiglu_tile__R16"] == 256
    assert lone_dots(plan, 95) == {v for v in lone if v.startswith("gemv_residual_tile")}  # (q/k/v: 96 items)
    assert lone_dots(_step_plan("llama3-8b", 8), 132) == set()
    assert lone_dots(_step_plan("llama3.2-1b", 1), 132) == set()
    # the cut rule's shared-memory estimate takes the stages the kernel will (programs a
    # multiprocessor by shared memory: fewer for a lone projection at five stages, the rest alike)
    from pto.backends.triton import TritonBackend

    backend, plan.programs = TritonBackend("cpu"), 132
    names, deep = backend.megakernel_occupancy(plan)
    _, plain = backend.megakernel_occupancy(plan, "schedule")
    col = names.index("shared memory")
    for k, b in enumerate(plan.branches):
        assert (deep[k, col] < plain[k, col]) if b.fn.variant_name in lone else deep[k, col] == plain[k, col]


@pytest.mark.parametrize("config,spec", [("llama3-8b", "q4_k/q6_k"), ("llama3-8b", "fp8"),
                                         ("smollm2-135m", "q4_1/q8_0")])
def test_a_quantized_gemv_of_one_sequence_runs_unpipelined(monkeypatch, config, spec):
    """A step of one sequence on quantized weights: every GEMV (q/k/v, o, gate/up, down, the
    head) takes its weight tiles' blocks as stored, and the megakernel runs every loop at
    :data:`QUANT_GEMV_STAGES` (the GEMVs' runs would otherwise stage x and the norm's gain through
    shared memory every block), where attention's schedule asks for three. bf16 weights, eight
    sequences (tensor-core dots of dequantized tiles) and ``PTO_MK_STAGES`` keep the old rule."""
    from pto.orchestration.model.quantized import WeightTypes

    from pto.backends.triton import TritonBackend
    from pto.backends.triton.megakernel import (
        QUANT_GEMV_STAGES,
        STEPS_MAX_BITS,
        all_gemvs_quantized,
        branch_configs,
        branch_stages,
        gemv_weight_bits,
        quantized_gemvs,
        run_loop_of,
    )
    from pto.ir.dtypes import DType

    monkeypatch.delenv("PTO_MK_STAGES", raising=False)
    plan = _step_plan(config, 1, spec)
    quantized = quantized_gemvs(plan)
    gemvs = {v for v in (b.fn.variant_name for b in plan.branches) if "gemv" in v}
    assert quantized == gemvs and len(gemvs) == 5 and all_gemvs_quantized(plan), sorted(quantized)
    configs = branch_configs(TritonBackend("cpu"), plan)
    stages = branch_stages(plan, configs, 132)
    assert QUANT_GEMV_STAGES == 1 and set(stages.values()) == {QUANT_GEMV_STAGES}
    attention = next(k for k, b in enumerate(plan.branches) if b.fn.name == "decode_attn_part")
    assert configs[attention].num_stages == 3  # (what the rule changes: the schedules' pipelines)
    schedules = branch_stages(plan, configs, 132, "schedule")
    assert max(schedules[v] for v in quantized) == 3
    assert set(branch_stages(plan, configs, 132, 1).values()) == {1}
    assert set(branch_stages(plan, configs, 132, 4).values()) == {4}
    # (runs as loops over blocks, their K loops' steps ahead where the weights have under 8 bits:
    # auto's choice here, and what is asked where it is)
    bits = {"q4_k/q6_k": 6.5625, "fp8": 8.0, "q4_1/q8_0": 8.5}[spec]
    assert gemv_weight_bits(plan) == bits and STEPS_MAX_BITS == 8
    auto = "steps" if bits < 8 else "blocks"
    assert [run_loop_of(plan, a) for a in ("auto", "", "flat", "blocks", "steps")] == \
        [auto, auto, "flat", "blocks", "steps"]
    bf16 = _step_plan(config, 1)
    assert quantized_gemvs(bf16) == set() and not all_gemvs_quantized(bf16)
    assert max(branch_stages(bf16, branch_configs(TritonBackend("cpu"), bf16), 132).values()) == 3
    assert run_loop_of(bf16, "auto") == "flat" and run_loop_of(bf16, "blocks") == "blocks"
    # dense layers and a quantized head: the layers' GEMVs keep their pipelines and flat runs
    head = _step_plan(config, 1, WeightTypes((("lm_head", DType.Q8_0),)))
    assert quantized_gemvs(head) and not all_gemvs_quantized(head)
    assert max(branch_stages(head, branch_configs(TritonBackend("cpu"), head), 132).values()) == 3
    assert run_loop_of(head, "auto") == "flat"
    if config == "llama3-8b":
        eight = _step_plan(config, 8, spec)
        assert quantized_gemvs(eight) == set() and run_loop_of(eight, "auto") == "flat"


@pytest.mark.parametrize("quantize", ["q8_0", "q4_1"])
def test_the_quantized_step_on_the_megakernel_with_its_gemvs_unpipelined_is_the_waves_bit_for_bit(quantize):
    """The tiny model's quantized step of one sequence on the megakernel under the interpreter,
    every loop at one stage (its kernels' device functions rendered so, and none at more): the
    waves executor's bits, the float64 reference within f32 rounding."""
    import re

    from pto.cli.commands.run import run

    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="persistent",
              check=True, quantize=quantize)
    assert res["determinism"]["executors"] is True and res["rel_err"] <= 1e-5, res
    kernel = _tiny_megakernel(quantize, runs=0)
    assert set(kernel.stages.values()) == {1}
    assert {int(n) for n in re.findall(r"def d_\w*?__S(\d+)__mk", kernel.rendered.source)} == {1}
    assert max(_tiny_megakernel(None, runs=0).stages.values()) == 3  # (bf16: the schedules' pipelines)


def test_constant_strides_keep_the_bits_and_leave_no_stride_loads(monkeypatch):
    """``PTO_MK_STRIDES=constant``: every branch takes its memrefs' row strides as constants of
    its own (the plan's tensors), the megakernel loads none from the stride table, and the tiny
    model's Q4_1 step keeps the waves executor's bits; a branch a combination of strides (a
    variant whose tasks' tensors differ in stride is two branches); anything but ``table`` or
    ``constant`` is one line naming it."""
    from pto.cli.commands.run import run
    from pto.exec.plan import resolve_strides

    monkeypatch.setenv("PTO_MK_STRIDES", "constant")
    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="persistent",
              check=True, quantize="q4_1")
    assert res["determinism"]["executors"] is True and res["rel_err"] <= 1e-5, res
    # split in two kernels (each segment's table names the other's tasks as its branch 0's: the
    # check reads its own alone; the H200's split steps were refused before, 2026-12-05)
    monkeypatch.setenv("PTO_MK_SPLIT", "-2")
    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="persistent",
              check=True, quantize="q4_1")
    assert res["determinism"]["executors"] is True and res["rel_err"] <= 1e-5, res
    monkeypatch.delenv("PTO_MK_SPLIT")
    table, const = (_tiny_megakernel("q4_1", runs=0, strides=s) for s in (False, True))
    assert "tl.load(tstride + " in table.rendered.source and "tl.load(tstride + " not in const.rendered.source
    assert all(len(b.strides) == len(b.fn.memrefs) for b in const.rendered.branches)
    assert all(b.strides == () for b in table.rendered.branches)
    # each task's tensors have its branch's strides (so tasks of other strides are other branches)
    p = const.plan
    strides = np.array([const.tensors[n].stride(0) for n in p.tensor_names])
    for task in range(p.n_tasks):
        b = p.branches[p.task_branch[task]]
        got = tuple(int(v) for v in strides[p.task_tensor[task, :len(b.fn.memrefs)]])
        assert got == b.strides, (b.fn.variant_name, got, b.strides)
    # tensors of other strides than the plan's: refused before a launch, naming the tensor
    name = next(n for n in p.tensor_names if const.tensors[n].dim() == 2 and const.tensors[n].shape[1] > 1)
    const.tensors[name] = torch.zeros(const.tensors[name].shape[0], 2 * const.tensors[name].shape[1],
                                      dtype=const.tensors[name].dtype)[:, :const.tensors[name].shape[1]]
    with pytest.raises(BuildError, match=rf"tensor '{name}' has row stride \d+ where the kernel's branch of "):
        const._upload()
    assert resolve_strides("table") == "table" and resolve_strides(None) == "constant"
    monkeypatch.setenv("PTO_MK_STRIDES", "fixed")
    with pytest.raises(UsageError, match=r"^PTO_MK_STRIDES='fixed': the megakernel's strides' source is table or "
                                         r"constant$"):
        resolve_strides(None)


def _tiny_megakernel(quantize: str | None, runs: int, strides: bool = False):
    """The megakernel the persistent executor builds for the tiny model's step of one sequence
    (cache 64; ``quantize``: its layers' and head's weights in that type) on the CPU backend,
    its GEMV tasks in items of runs of up to ``runs`` indices (0: an item an index; ``strides``:
    its branches' strides constants, ``PTO_MK_STRIDES=constant``): built and rendered, not
    launched (its tensors zeros)."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import tiling_for_executor
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.backends.triton import TritonBackend
    from pto.backends.triton.megakernel import MegakernelSettings
    from pto.data.buffers import allocate, tensor_shapes
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, tg = mp.CONFIGS["tiny"], get("cuda_h200")
    wt = WeightTypes.of_spec(quantize) if quantize else WeightTypes()
    built = build_module_graph(build_step(cfg, DType.F32, tg, 1, for_weights(tiling_for_executor(cfg, "persistent", tg),
                                                                               wt, 1), cache=64, wtypes=wt),
                               {"B": 1, "C": 64})
    backend = TritonBackend("cpu")
    try:
        fn = built.module.entry_function
        shapes = tensor_shapes(fn, built.scalars)
        given = {t.name: torch.zeros(t.dtype.storage_shape(*shapes[t.name]), dtype=t.dtype.torch)
                 for t in fn.tensors if t.role in ("input", "inout")}
        tensors = allocate(fn, shapes, given, "cpu")
        names = list(built.graph.tensor_ids)
        plan = make_plan(built.graph, names, {}, programs=4, flags=backend.task_flags, runs=runs,
                         tensor_strides=np.array([tensors[n].stride(0) for n in names]) if strides else None)
        return backend.megakernel(plan, tensors, MegakernelSettings(dispatch="static", programs=1, split="off"))
    finally:
        built.graph.close()


def test_a_run_as_a_loop_over_blocks_hoists_x_and_loads_the_next_weights_ahead():
    """``RenderOptions(run_loop="blocks")``: the 8B's quantized step of one sequence, its GEMVs'
    runs rendered as the wave kernels' loop over blocks. q/k/v, whose K is one step, loads and
    normalizes x once after the wait, before the run's loop, and loads each index's weights an
    index ahead; the flat form loads x in the loop, each index."""
    import re

    from pto.codegen.triton.common import RenderOptions
    from pto.codegen.triton.megakernel import render_megakernel

    plan = _step_plan("llama3-8b", 1, "q4_k/q6_k")
    runs = [b for b in plan.branches if b.runs]
    assert {b.fn.name for b in runs} >= {"gemv_norm_tile", "gemv_norm_swiglu_tile", "gemv_residual_tile"}

    def qkv(run_loop: str) -> str:
        src = render_megakernel(plan.branches, RenderOptions(qgemv="auto", asm=True, run_loop=run_loop)).source
        start = re.search(r"def d_gemv_norm_tile\w*__run\w*\(", src)
        return src[start.start():src.index("return _ok, _t0", start.start())]

    blocks, flat = qkv("blocks"), qkv("flat")
    assert "__run__blocks(" in blocks and "__blocks" not in flat.split("(")[0]
    wait = blocks.index("_pto_wait(")
    loop = blocks.index("for _b in tl.range(0, n_run):")
    x_load = blocks.index("P_x + ", wait)
    assert wait < x_load < loop  # (x once a run, after its wait)
    assert "__n" in blocks[wait:loop] and "tl.where(_b + 1 < n_run," in blocks[loop:]
    assert flat.index("P_x + ", flat.index("for _r in tl.range(0, n_run")) > 0 and "__n" not in flat
    # "steps", every loop at one stage: the down projection's K loop (7 steps of 2,048) takes its
    # weights and x loaded a step ahead and loads the next step's (past the last, the next index's
    # first); blocks loads them in the step
    stages = {b.fn.variant_name: 1 for b in plan.branches}

    def down(run_loop: str) -> str:
        src = render_megakernel(plan.branches, RenderOptions(qgemv="auto", asm=True, run_loop=run_loop),
                                stages=stages).source
        start = re.search(r"def d_gemv_residual_tile__K14336\w*__run\w*\(", src)
        return src[start.start():src.index("return _ok, _t0", start.start())]

    steps, plain = down("steps"), down("blocks")
    index_loop = steps.index("for _b in tl.range(0, n_run):")
    k_loop = steps.index("for i_kk in tl.range(0, 14336, 2048")
    assert steps.index("t_b__k0__q, ") < index_loop < k_loop  # (the run's first step, before its loop)
    k_body = steps[k_loop:]
    assert k_body.index("t_b__q = t_b__k0__q") < k_body.index("t_b__k0__q, ") < k_body.index("_pto_dqx16_dot_q4_k(")
    assert "tl.where(_b + 1 < n_run, i_j + 1, i_j)" in k_body and "t_a = t_a__k0" in k_body
    assert "__k" not in plain and "__run__blocks_steps(" not in plain


@pytest.mark.parametrize("form", ["blocks", "steps"])
@pytest.mark.parametrize("quantize", ["q8_0", "q4_1", None])
def test_runs_as_loops_over_blocks_are_the_waves_bit_for_bit(monkeypatch, quantize, form):
    """The tiny model's step on the megakernel under the interpreter, its GEMV tasks in runs of
    consecutive indices (``PTO_MK_RUNS=3``) rendered as loops over blocks
    (``PTO_MK_RUNLOOP=blocks``), each index's weights loaded an index ahead, or (``steps``, every
    loop at one stage) with the K loops' next steps' weights loaded ahead too, past an index's
    last step the next index's first: the waves executor's bits, the float64 reference within
    f32 rounding; by default the quantized steps' runs render as blocks and bf16's flat; a value
    of ``PTO_MK_RUNLOOP`` that is no form is one line naming it."""
    import re
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    from pto.cli.commands.run import run

    # (blocks of 16 rows: four indices a task in runs of up to three, so a run's next weights load
    # ahead and a task's second run starts past its first index; K loops of more than one step:
    # the down projection's 160 in three of 64, the last masked, the LM head's 64 in two of 32)
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, bn=16, bk=64, qkv_bk=64, ffn_bk=64))
    monkeypatch.setenv("PTO_MK_RUNS", "3")
    monkeypatch.setenv("PTO_MK_RUNLOOP", form)
    if form == "steps":
        monkeypatch.setenv("PTO_MK_STAGES", "1")
    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="persistent",
              check=True, **({"quantize": quantize} if quantize else {}))
    assert res["determinism"]["executors"] is True and res["rel_err"] <= 1e-5, res
    src = _tiny_megakernel(quantize, runs=3).rendered.source
    # (a weight tile loaded ahead is ``t_<tile>__n``, a quantized one's planes ``t_<tile>__n__<plane>``;
    # a step ahead ``t_<tile>__k<loop>``)
    assert "__run__blocks" in src and re.search(r"\bt_\w+?__n(__\w+)? = ", src) and \
        "tl.where(_b + 1 < n_run," in src
    stepped = re.search(r"\bt_\w+?__k\d+(__\w+)? = ", src)
    assert bool(stepped) == (form == "steps") and ("__run__blocks_steps(" in src) == (form == "steps")
    if form == "blocks":
        # by default (auto) the quantized kernels' runs are loops over blocks (Q4_1's, of 5 bits a
        # weight, with their steps ahead; Q8_0's, of 8.5, without), bf16's flat
        monkeypatch.delenv("PTO_MK_RUNLOOP")
        monkeypatch.delenv("PTO_MK_STAGES", raising=False)
        src = _tiny_megakernel(quantize, runs=3).rendered.source
        assert ("__run__blocks" in src) == (quantize is not None)
        assert ("__run__blocks_steps(" in src) == (quantize == "q4_1")
    monkeypatch.setenv("PTO_MK_RUNLOOP", "block")
    with pytest.raises(UsageError, match="PTO_MK_RUNLOOP='block': one of auto, flat, blocks, steps"):
        run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="persistent")


def test_a_lone_dot_projection_takes_five_stages(monkeypatch):
    """The tiny model's step at 2 sequences in an H200's tiles (its rows padded to tensor-core dots
    of 16) as the megakernel of 4 programs under the interpreter: every projection of 4 items or
    fewer (all but gate/up) renders its K loop at :data:`LONE_DOT_STAGES` where its schedule asks
    for fewer, the other branches as their schedules say; ``PTO_MK_STAGES=schedule`` turns the
    rule off (the kernel's stages are its schedules' alone) and keeps the same bits."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.backends.triton import TritonBackend
    from pto.backends.triton.megakernel import LONE_DOT_STAGES, MegakernelSettings, lone_dots
    from pto.data.buffers import allocate, tensor_shapes
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, tg = CONFIGS["tiny"], get("cuda_h200")
    built = build_module_graph(build_step(cfg, DType.F32, tg, 2, tiling_for_executor(cfg, "persistent", tg),
                                          cache=128), {"B": 2, "C": 128})
    backend = TritonBackend("cpu")
    try:
        plan = make_plan(built.graph, list(built.graph.tensor_ids), {}, programs=4, flags=backend.task_flags)
        fn = built.module.entry_function
        outs = []
        for stages in (None, "schedule"):
            if stages:
                monkeypatch.setenv("PTO_MK_STAGES", stages)
            else:
                monkeypatch.delenv("PTO_MK_STAGES", raising=False)
            g, shapes = torch.Generator().manual_seed(5), tensor_shapes(fn, built.scalars)
            given = {t.name: (torch.randn(shapes[t.name], generator=g) * 0.1).to(t.dtype.torch)
                     if t.dtype.torch.is_floating_point else torch.zeros(shapes[t.name], dtype=t.dtype.torch)
                     for t in fn.tensors if t.role in ("input", "inout")}
            tensors = allocate(fn, shapes, given, "cpu")
            kernel = backend.megakernel(plan, tensors, MegakernelSettings(dispatch="static", programs=1, split="off"))
            lone = lone_dots(plan, 4)
            names = {b.fn.variant_name for b in plan.branches}
            if stages is None:
                assert {v.split("__")[0] for v in lone} == {"gemv_norm_tile", "gemv_residual_tile",
                                                            "lmhead_argmax_tile"}  # (gate/up: 5 items)
                assert all(kernel.stages[v] == LONE_DOT_STAGES for v in lone)
                assert all(kernel.stages[v] < LONE_DOT_STAGES for v in names - lone)
                assert kernel.rendered.source.count(f"num_stages={LONE_DOT_STAGES})") >= len(lone)
            else:
                assert all(n < LONE_DOT_STAGES for n in kernel.stages.values())
            kernel.launch()
            assert kernel.gave_up() is None
            outs.append({k: v.clone() for k, v in tensors.items()})
        for k in outs[0]:
            assert torch.equal(outs[0][k], outs[1][k]), k
    finally:
        built.graph.close()


def test_persistent_needs_the_triton_backend():
    """Refused when the job is resolved, before any graph is built."""
    with pytest.raises(UsageError, match="persistent executor runs Triton kernels; --backend torch needs"):
        resolve("softmax", device="cpu", backend="torch", executor="persistent")


@pytest.mark.parametrize("program,seq,options", [("model", None, {}), ("llama7b", 40, {"attention": "split"})],
                         ids=["decode-step", "llama7b-split"])
def test_early_loads_after_predecessors_read_nothing_a_task_before_writes(program, seq, options, monkeypatch):
    """``PTO_MK_EARLY=preds``: an item may load before its wait the memrefs of tensors none of its
    task's predecessors writes. Checked against the graph itself: no task the task depends on, at
    any distance, writes a region that overlaps the memref's region; more memrefs than the graph
    rule (``graph``: tensors no task writes) on the decode step (its positions, written by its
    last task); and the run's outputs are the wave executor's, bit for bit."""
    from pto.exec.plan import make_plan
    from pto.ir.analysis import param_access

    monkeypatch.setenv("PTO_MK_EARLY", "preds")
    job, rw, inputs, want = _run(program, seq, options, "waves")
    rw.close()
    job, rp, _, got = _run(program, seq, options, "persistent")
    try:
        for k in want:
            assert torch.equal(got[k], want[k]), k
        graph, plan = rp.graph, rp.executor.plan
        ex = graph.runtime.export()
        variants = graph.variant_of_func_id()
        n = ex.n_tasks
        # every task's ancestors (all its predecessors at any distance), in topological order
        preds = [[] for _ in range(n)]
        for a in range(n):
            for b in ex.fanout_ids[ex.fanout_ptr[a]:ex.fanout_ptr[a + 1]]:
                preds[int(b) - ex.first_task].append(a)
        order = np.argsort(plan.levels(), kind="stable")
        ancestors: list[set] = [set() for _ in range(n)]
        for t in order:
            for p in preds[t]:
                ancestors[t] |= ancestors[p] | {p}

        def regions(t, kind):  # (tensor id, row0, col0, rows, cols) of task t's memrefs: "in" or written
            fn = variants[int(ex.func[t])]
            access = param_access(fn)
            out = []
            for k, p in enumerate(fn.params):
                if p.name in access and (access[p.name].direction == "in") == (kind == "in"):
                    i = ex.arg_ptr[t] + k
                    out.append((p.name, int(ex.arg_tensor[i]), *(int(x) for x in ex.arg_region[i])))
            return out

        def overlap(a, b):
            return a[1] == b[1] and a[2] < b[2] + b[4] and b[2] < a[2] + a[4] and a[3] < b[3] + b[5] \
                and b[3] < a[3] + a[5]

        early_pairs = 0
        for t in range(n):
            branch = plan.branches[plan.task_branch[t]]
            early = set(branch.early)
            assert not early & {r[0] for r in regions(t, "out")}, t  # nothing it writes itself
            written_before = [w for a in ancestors[t] for w in regions(a, "out")]
            for r in regions(t, "in"):
                if r[0] in early:
                    early_pairs += 1
                    assert not any(overlap(r, w) for w in written_before), (t, r)
        graph_rule = make_plan(graph, list(graph.tensor_ids), {}, early="graph")
        base = sum(len(graph_rule.branches[graph_rule.task_branch[t]].early) for t in range(n))
        more = sum(len(plan.branches[plan.task_branch[t]].early) for t in range(n))
        assert early_pairs > 0 and more >= base
        if program == "model":
            assert more > base  # the positions the step's last task writes
    finally:
        rp.close()
