"""The persistent executor's plan split into segments by resource class (``PTO_MK_SPLIT``,
:mod:`pto.exec.segments`; docs/ARCHITECTURE.md, "The persistent executor"): the cut rule on
graphs whose answer is known by construction and on the real decode steps (the LM head's levels
cut off); the segments' plans (edges inside, items in queue order, their own branches); and
under the Triton interpreter, runs split at several places on a decode step, a layer and random
graphs bit-identical to the wave executor, a dependency never released in any segment reported
with its task, the trace of a split run keeping every dependency, and the sentinel's records
those of the uncut run."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pto.errors import ExecutionError, UsageError
from pto.exec.order import levels
from pto.exec.segments import MAX_SEGMENTS, auto_cuts, critical_path, parse_cuts, resolve_split
from tests.exec import split_programs

needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


def _graph(edges: list[tuple[int, int]], n: int):
    """Successors in CSR and levels of a DAG on tasks 0..n-1."""
    edges = sorted(edges)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount([a for a, _ in edges], minlength=n), out=ptr[1:])
    succ = np.array([b for _, b in edges], np.int64)
    return ptr, succ, levels(n, ptr, succ)


def _cuts(branch, occupancy, edges, cost=None, items=None):
    n = len(branch)
    ptr, succ, lv = _graph(edges, n)
    cost = np.ones(n) if cost is None else np.asarray(cost, float)
    items = np.ones(n) if items is None else np.asarray(items, float)
    names = [f"b{k}" for k in range(len(occupancy))]
    return auto_cuts(lv, np.asarray(branch), np.asarray(occupancy), ("threads", "shared memory"), cost, items,
                     ptr, succ, names), lv


def test_the_rule_cuts_off_the_hungriest_branch_at_the_end():
    """A chain of 12 levels of light work (branch 0, 16 programs a multiprocessor by each
    resource), then one task of branch 1 (8 by threads), then a one-item task of branch 2 (as
    light as 0): the heavy level and the tiny light level after it (under 1% of the work) are
    the last segment, cut before the heavy level."""
    n = 14
    branch = [0] * 12 + [1, 2]
    occ = [[16, 16], [8, 16], [16, 16]]
    items = [10] * 12 + [50, 1]
    split, lv = _cuts(branch, occ, [(i, i + 1) for i in range(n - 1)], items=items)
    assert split.cuts == (12,) and lv[12] == 12
    assert "threads: b1 (8 a multiprocessor)" in split.reason
    assert split.segment_of(lv).tolist() == [0] * 12 + [1, 1]


def test_a_class_in_every_layer_is_not_cut_but_the_tail_is():
    """Branch 1 needs the most shared memory and sits in every third level (a layer's gate/up
    projection): cutting it off would take more than MAX_SEGMENTS launches, so it is not; the
    tail's branch 2 needs the most threads (and as much shared memory as branch 1): cut off
    alone."""
    n = 3 * 6 + 1
    branch = [1 if i % 3 == 1 else 0 for i in range(n - 1)] + [2]
    occ = [[16, 4], [16, 1], [8, 1]]
    split, lv = _cuts(branch, occ, [(i, i + 1) for i in range(n - 1)])
    assert split.cuts == (n - 1,)
    assert "threads: b2" in split.reason and "shared memory" not in split.reason
    # with the threads equal, nothing cuts: the shared-memory class alone is in every layer
    split, _ = _cuts(branch, [[16, 4], [16, 1], [16, 1]], [(i, i + 1) for i in range(n - 1)])
    assert split.cuts == () and MAX_SEGMENTS < 7


def test_a_cut_that_would_lengthen_the_critical_path_is_refused():
    """A heavy task at level 0 (cost 20) that only the last task of a light chain of 10 (cost 1
    each) waits for: cut after level 0, the chain could not start before it ends (critical path
    20 + 9 against 21), so the rule does not cut; the same heavy task at the chain's end is
    cut off."""
    n = 11
    edges = [(i, i + 1) for i in range(9)] + [(10, 9)]
    branch = [0] * 10 + [1]
    cost = [1.0] * 10 + [20.0]
    ptr, succ, lv = _graph(edges, n)
    assert lv[10] == 0 and lv[9] == 9
    assert critical_path(np.asarray(cost), ptr, succ, lv) == 21
    assert critical_path(np.asarray(cost), ptr, succ, lv, (lv >= 1).astype(np.int64)) == 29
    split, _ = _cuts(branch, [[16, 16], [8, 16]], edges, cost=cost)
    assert split.cuts == ()
    split, _ = _cuts([0] * 10 + [1], [[16, 16], [8, 16]], [(i, i + 1) for i in range(10)], cost=cost)
    assert split.cuts == (10,)


def test_the_rule_cuts_a_heavy_middle_and_never_more_than_max_segments():
    """Heavy levels in the middle: three segments (light, heavy, light); two heavy ranges apart
    would make five: no cut."""
    n = 30
    chain = [(i, i + 1) for i in range(n - 1)]
    branch = [1 if 10 <= i < 20 else 0 for i in range(n)]
    split, _ = _cuts(branch, [[16, 16], [16, 2]], chain)
    assert split.cuts == (10, 20) and split.reason.startswith("auto by shared memory: b1")
    branch = [1 if 5 <= i < 10 or 20 <= i < 25 else 0 for i in range(n)]
    split, _ = _cuts(branch, [[16, 16], [16, 2]], chain)
    assert split.cuts == ()


def test_equal_classes_and_a_single_level_are_not_cut():
    split, _ = _cuts([0, 1, 0], [[16, 4], [16, 4]], [(0, 1), (1, 2)])
    assert split.cuts == ()
    split, _ = _cuts([0, 1], [[16, 4], [8, 1]], [])
    assert split.cuts == () and split.reason == "one level"


def test_forced_cuts_and_their_errors(monkeypatch):
    assert parse_cuts("5,9", 12) == (5, 9)
    assert parse_cuts("-2", 12) == (11,) and parse_cuts("-1,3,3", 12) == (3, 12)
    with pytest.raises(UsageError, match=r"split='0': level 0 cannot start a segment; this graph's levels are "
                                         r"0\.\.12, so a cut is one of 1\.\.12"):
        parse_cuts("0", 12)
    with pytest.raises(UsageError, match=r"PTO_MK_SPLIT='13'"):
        parse_cuts("13", 12, "PTO_MK_SPLIT")
    with pytest.raises(UsageError, match=r"split='tail': off, auto, or levels where a segment starts"):
        parse_cuts("tail", 12)
    with pytest.raises(UsageError, match=r"split='1': this graph has one dependency level"):
        parse_cuts("1", 0)
    monkeypatch.setenv("PTO_MK_SPLIT", "off")
    assert resolve_split(None) == "off" and resolve_split("auto") == "auto"
    monkeypatch.delenv("PTO_MK_SPLIT")
    assert resolve_split(None) == "auto"


def test_per_sm_is_per_segment(monkeypatch):
    from pto.backends.triton.megakernel import per_sm_of

    assert per_sm_of((2, 0), 0) == 2 and per_sm_of((2, 0), 1) is None and per_sm_of((2, 0), 5) is None
    assert per_sm_of(3, 4) == 3 and per_sm_of(0, 0) is None
    monkeypatch.setenv("PTO_PER_SM", "2,1")
    assert (per_sm_of(None, 0), per_sm_of(None, 1), per_sm_of(None, 2)) == (2, 1, 1)
    monkeypatch.setenv("PTO_PER_SM", "auto,0")
    assert (per_sm_of(None, 0), per_sm_of(None, 1)) == ("auto", None)
    monkeypatch.setenv("PTO_PER_SM", "more,2")  # (room for more while the kernel does not spill)
    assert (per_sm_of(None, 0), per_sm_of(None, 1)) == ("more", 2)
    monkeypatch.delenv("PTO_PER_SM")
    assert per_sm_of(None, 0) == per_sm_of(None, 3) == "auto" and per_sm_of(("auto", 2), 1) == 2
    monkeypatch.setenv("PTO_PER_SM", "0")  # as many as the compiled kernel allows, no room made
    assert per_sm_of(None, 0) is None
    for bad in ("two", "2,-1", "auto,x", "2,", "most"):
        monkeypatch.setenv("PTO_PER_SM", bad)
        with pytest.raises(UsageError, match=rf"PTO_PER_SM='{bad}': programs per multiprocessor"):
            per_sm_of(None, 0)


def _random_plan(seed: int):
    from pto.exec.plan import make_plan
    from pto.runtime.graph import CompiledProgram

    graph = CompiledProgram.get(split_programs.random_module(seed)).build_graph({})
    try:
        return make_plan(graph, list(graph.tensor_ids), {}, programs=3)
    finally:
        graph.close()


@pytest.mark.parametrize("seed", range(3))
def test_segment_plans_keep_their_edges_items_and_branches(seed):
    """Cut at random levels: every task in one segment, every edge inside a segment or to a
    later one; each segment's items are the queue's items of its tasks in the queue's order, its
    counters count its own predecessors only, its branches are those its tasks use."""
    from pto.exec.segments import Split

    plan = _random_plan(seed)
    lv = plan.levels()
    rng = np.random.default_rng(seed)
    cuts = tuple(sorted(rng.choice(np.arange(1, lv.max() + 1), size=3, replace=False).tolist()))
    seg = Split(cuts, "").segment_of(lv)
    src = plan.edge_sources
    assert (seg[src] <= seg[plan.succ]).all() and (seg[src] < seg[plan.succ]).any()
    segments = [plan.segment(seg == k) for k in range(len(cuts) + 1)]
    assert sum(s.n_items for s in segments) == plan.n_items
    queue = {tuple(map(int, it)): i for i, it in enumerate(plan.items)}
    for k, s in enumerate(segments):
        assert (s.tasks == (seg == k)).all()
        pos = [queue[tuple(map(int, it))] for it in s.items]
        assert pos == sorted(pos) and set(s.items[:, 0]) == set(np.nonzero(seg == k)[0])
        inner = (seg[src] == k) & (seg[plan.succ] == k)
        assert np.array_equal(s.pending, np.bincount(plan.succ[inner], minlength=plan.n_tasks))
        assert sorted(zip(s.edge_sources.tolist(), s.succ.tolist())) == \
            sorted(zip(src[inner].tolist(), plan.succ[inner].tolist()))
        used = sorted({plan.branches[b] for b in plan.task_branch[seg == k]}, key=plan.branches.index)
        assert s.branches == used
        assert all(s.branches[s.task_branch[t]] == plan.branches[plan.task_branch[t]] for t in np.nonzero(seg == k)[0])
        assert (s.nitems[seg != k] == 0).all() and np.array_equal(s.nitems[seg == k], plan.nitems[seg == k])


@pytest.mark.parametrize("config", ["smollm2-135m", pytest.param("llama3.2-1b", marks=pytest.mark.slow),
                                    pytest.param("llama3-8b", marks=pytest.mark.slow)])
def test_decode_steps_cut_off_the_lm_head(config):
    """The real decode steps (bf16, batch 1, a 1,024-slot cache, the persistent executor's tiles):
    ``auto`` makes the LM head's level and the argmax after it the last segment; the gate/up
    projection, which needs as much shared memory in the large models, is in every layer and
    not cut off."""
    from pto.exec.segments import split_plan

    plan, backend = split_programs.decode_plan(config)
    split, segments = split_plan(plan, backend, "auto")
    lv = plan.levels()
    head = next(b for b, br in enumerate(plan.branches) if br.fn.name == "lmhead_argmax_tile")
    (head_level,) = set(lv[plan.task_branch == head].tolist())
    assert split.cuts == (head_level,) and head_level == lv.max() - 1, split
    assert [b.fn.name for b in segments[1].branches] == ["lmhead_argmax_tile", "argmax_advance"]
    assert "lmhead_argmax_tile" not in {b.fn.name for b in segments[0].branches}
    names, occ = backend.megakernel_occupancy(plan)
    assert names == ("threads", "shared memory") and occ.shape == (len(plan.branches), 2)


def test_the_prefill_layer_cuts_off_its_attention():
    """The 7B prefill layer (fused attention, 1,537 rows, for an H100): its attention's
    pipelines need the most shared memory and hold one level, so ``auto`` makes that level a
    launch between the projections before and after it."""
    from pto import programs
    from pto.backends.triton import TritonBackend
    from pto.exec.plan import make_plan
    from pto.exec.segments import split_plan
    from pto.machine.target import get as target
    from pto.runtime.graph import CompiledProgram

    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", config="7b", dtype="bf16", target=target("cuda_h100"), attention="fused")
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, prog.shape(1537)))
    try:
        backend = TritonBackend("cpu")
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=backend.task_flags)
    finally:
        graph.close()
    split, segments = split_plan(plan, backend, "auto")
    lv = plan.levels()
    attn = {b for b, br in enumerate(plan.branches) if br.fn.name == "flash_fused"}
    (level,) = set(lv[np.isin(plan.task_branch, list(attn))].tolist())
    assert split.cuts == (level, level + 1) and "flash_fused" in split.reason
    assert {b.fn.name for b in segments[1].branches} == {"flash_fused"}


# -- under the Triton interpreter ------------------------------------------------------------------

def _run_module(module, x: dict, executor: str, split: str | None = None, **kw):
    """Run ``module`` (no scalars) once; returns (executor, tensors, graph: close it)."""
    from pto.backends import get_backend
    from pto.backends.triton import MegakernelSettings
    from pto.data.buffers import allocate, tensor_shapes
    from pto.exec import get_executor
    from pto.runtime.graph import CompiledProgram

    graph = CompiledProgram.get(module).build_graph({})
    try:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, {}), {k: v.clone() for k, v in x.items()}, "cpu")
        if executor == "persistent":
            kw["settings"] = MegakernelSettings(split=split, dispatch=kw.pop("dispatch", None))
        ex = get_executor(executor, get_backend("triton", "cpu"), tensors, **kw)
        ex.run(graph)
    except BaseException:
        graph.close()
        raise
    return ex, tensors, graph


@pytest.mark.interpret
@needs_interp
@pytest.mark.parametrize("seed,splits", [(0, ["1,2,3,4,5,6", "-1"]),
                                         pytest.param(1, ["3,7", "2", "auto"], marks=pytest.mark.slow),
                                         pytest.param(2, ["1,-3"], marks=pytest.mark.slow)])
@pytest.mark.parametrize("dispatch", ["static", pytest.param("queue", marks=pytest.mark.slow),
                                      pytest.param("stream", marks=pytest.mark.slow)])
def test_random_graphs_split_anywhere_are_bit_identical_to_waves(seed, splits, dispatch):
    """Random graphs of four InCore functions (one to three memrefs: segments whose widest
    branch is narrower than the graph's) cut at forced levels: the wave executor's bits, every
    segment a launch of its own branches."""
    module, x = split_programs.random_module(seed), split_programs.inputs(seed)
    ex, want, graph = _run_module(module, x, "waves")
    graph.close()
    for split in splits:
        ex, got, graph = _run_module(module, x, "persistent", split, dispatch=dispatch)
        try:
            assert len(ex.kernels) == len(ex.split.cuts) + 1 > (split != "auto")
            for k in want:
                assert torch.equal(got[k], want[k]), (split, k)
            assert sum(s.n_items for s in ex.segments) == ex.plan.n_items
            if len(ex.segments) > 1:
                assert {len(s.branches) for s in ex.segments} != {len(ex.plan.branches)}
            ex.check()
        finally:
            graph.close()


@pytest.mark.interpret
@needs_interp
@pytest.mark.slow
@pytest.mark.parametrize("program,shape,options,splits", [
    ("model", {"cache": 64, "batch": 1}, {"config": "tiny"}, ["auto", "-2", "5,9", "1,2,3,13"]),
    ("model", {"cache": 96, "batch": 3}, {"config": "tiny"}, ["auto"]),
    ("llama7b", 40, {"options": {"attention": "fused"}}, ["3", "2,6"]),
])
def test_decode_steps_and_layers_split_are_bit_identical_to_waves(program, shape, options, splits, monkeypatch):
    """The tiny model's decode step (auto: the LM head and the argmax in launches of their own)
    and the LLaMA layer, cut at several places: the wave executor's bits."""
    from pto.engine import Runner, resolve

    def run(executor):
        job = resolve(program, device="cpu", backend="triton", executor=executor, **options)
        runner = Runner(job, job.program.shape(shape))
        return runner, {k: v.clone() for k, v in runner(job.program.inputs(job.settings, job.program.shape(shape),
                                                                           "cpu", seed=4)).items()}

    rw, want = run("waves")
    rw.close()
    for split in splits:
        monkeypatch.setenv("PTO_MK_SPLIT", split)
        rp, got = run("persistent")
        try:
            assert rp.stats.launches == len(rp.executor.kernels) > 1, split
            for k in want:
                assert torch.equal(got[k], want[k]), (split, k)
            if program == "model" and split == "auto":
                names = [[b.fn.name for b in s.branches] for s in rp.executor.segments]
                assert "lmhead_argmax_tile" in names[1] and "lmhead_argmax_tile" not in names[0]
        finally:
            rp.close()


@pytest.mark.interpret
@needs_interp
@pytest.mark.parametrize("segment", [0, 1, 2])
def test_a_dependency_never_released_in_any_segment_is_reported(segment):
    """A predecessor counter one too high in segment k's kernel (the counter its first item
    waits on): its program gives up after max_polls and check() names the task; the other
    segments ran to the end."""
    ex, _, graph = _run_module(split_programs.random_module(0), split_programs.inputs(0), "persistent", "3,7")
    try:
        kernel, plan = ex.kernels[segment], ex.segments[segment]
        victim = int(np.nonzero(plan.pending)[0][-1])  # a task with a predecessor in its segment
        for k in ex.kernels:
            k.max_polls = 50
        counter = int(kernel.counters.counter[np.flatnonzero(plan.items[:, 0] == victim)[0]])
        assert kernel.counters.init[counter] > 0
        kernel.buf["pending0"][counter] += 1
        ex.replay()
        assert [k.gave_up() is not None for k in ex.kernels] == [k == segment for k in range(3)]
        with pytest.raises(ExecutionError, match=rf"predecessors of task {victim + plan.first_task} "
                                                 rf"\(`{plan.variants[victim].variant_name}`\)"):
            ex.check()
        assert all(k.gave_up() is None for k in ex.kernels)  # reported once: cleared for the next launch
    finally:
        graph.close()


@pytest.mark.interpret
@needs_interp
def test_a_split_run_traced_keeps_every_dependency_and_reports_each_segment():
    """The items of every segment (one logical clock for all) against the graph: every task
    after its predecessors, no conflicting accesses at once; the report's segments and the
    profile's shares; the one-branch estimates under the interpreter (nothing compiled)."""
    from pto.safety.trace_check import verify_schedule

    ex, _, graph = _run_module(split_programs.random_module(1), split_programs.inputs(1), "persistent", "2,5",
                               record=True)
    try:
        export = graph.runtime.export()
        recs = ex.trace_records()
        assert verify_schedule(export, recs).ok and len(recs) == ex.plan.n_items
        assert sorted({r.segment for r in recs}) == [0, 1, 2]
        lv = ex.plan.levels()
        assert all((lv[r.task - ex.plan.first_task] >= 2) == (r.segment >= 1) for r in recs)
        rep = ex.report()
        assert [s["items"] for s in rep["segments"]] == [s.n_items for s in ex.segments]
        assert [s["levels"] for s in rep["segments"]] == [[0, 1], [2, 4], [5, int(lv.max())]]
        assert rep["split"] == "levels 2,5" and rep["items"] == ex.plan.n_items
        prof = ex.profile()
        assert set(prof) == {fn.name for fn in ex.plan.variants}
        res = ex.branch_resources()
        assert [r["branch"] for r in res] == [b.fn.variant_name for b in ex.plan.branches]
        assert all("regs" not in r and set(r["estimate_per_sm"]) == {"threads", "shared memory"} for r in res)
        with pytest.raises(ValueError, match="split into 3 megakernels"):
            _ = ex.kernel
    finally:
        graph.close()


@pytest.mark.interpret
@needs_interp
def test_the_sentinel_across_segments_records_what_the_uncut_run_does():
    """The overflow program (scale, exp, normalize per row tile; a NaN and an infinity planted)
    cut after each level: the segments' device records and the host's scans of each segment's
    first tasks are the uncut run's records, task for task."""
    import math

    from pto.backends import get_backend
    from pto.backends.triton import MegakernelSettings
    from pto.data.buffers import allocate, tensor_shapes
    from pto.exec import get_executor
    from pto.runtime.graph import CompiledProgram
    from tests.safety import programs

    module, scalars = programs.overflow_module(), {"S": 100}
    x = programs.inputs(100, seed=8)
    x["x"][[5, 70, 99], [1, 2, 63]] = torch.tensor([math.nan, 30.0, -math.inf])
    flags = []
    for split in ("off", "1,2"):
        graph = CompiledProgram.get(module).build_graph(scalars)
        try:
            fn = module.entry_function
            tensors = allocate(fn, tensor_shapes(fn, scalars), {k: v.clone() for k, v in x.items()}, "cpu")
            ex = get_executor("persistent", get_backend("triton", "cpu"), tensors, sentinel=True,
                              settings=MegakernelSettings(split=split))
            ex.run(graph)
            assert len(ex.kernels) == (1 if split == "off" else 3)
            flags.append(ex.flags)
        finally:
            graph.close()
    assert (flags[0].read[:, 0] >= 0).sum() >= 3 and (flags[0].wrote[:, 0] >= 0).any()
    np.testing.assert_array_equal(flags[1].read, flags[0].read)
    np.testing.assert_array_equal(flags[1].wrote, flags[0].wrote)


@pytest.mark.interpret
@needs_interp
def test_a_bad_split_is_one_line_before_any_launch(monkeypatch):
    monkeypatch.setenv("PTO_MK_SPLIT", "99")
    with pytest.raises(UsageError, match=r"PTO_MK_SPLIT='99': level 99 cannot start a segment; this graph's levels "
                                         r"are 0\.\.\d+"):
        _run_module(split_programs.random_module(0), split_programs.inputs(0), "persistent")



def test_the_early_load_rule_is_chosen_and_checked(monkeypatch):
    """``PTO_MK_EARLY`` picks the rule (``preds`` by default; the settings' choice wins); a name
    not a rule is one line naming it, before any plan is made."""
    from pto.exec.plan import DEFAULT_EARLY, resolve_early

    monkeypatch.delenv("PTO_MK_EARLY", raising=False)
    assert resolve_early(None) == DEFAULT_EARLY == "preds"
    monkeypatch.setenv("PTO_MK_EARLY", "graph")
    assert resolve_early(None) == "graph" and resolve_early("preds") == "preds"
    monkeypatch.setenv("PTO_MK_EARLY", "early")
    with pytest.raises(UsageError, match="PTO_MK_EARLY='early': the megakernel's early-load rule is graph or preds"):
        resolve_early(None)
