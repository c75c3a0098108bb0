"""The persistent megakernel's design (docs/ARCHITECTURE.md, "The persistent executor"): per-program
item streams from the list schedule, deadlock-free for any assignment of a topological queue to
resident programs; the operands no task writes loaded (or prefetched into L2) before an item
waits for its predecessors; the tensors the graph never writes found from the tasks' stores."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from pto import programs
from pto.codegen.triton.megakernel import render_megakernel
from pto.errors import UsageError
from pto.exec.order import Dag, levels, list_schedule, streams
from pto.exec.plan import make_plan, written_tensors
from pto.machine.target import get as target
from pto.runtime.graph import CompiledProgram
from tests.exec.megakernel_source import called, device_function


def _random_dag(rng, n: int, p: float) -> Dag:
    """A random DAG over tasks 0..n-1 whose edges go from lower to higher ids."""
    succ = [[j for j in range(i + 1, n) if rng.random() < p] for i in range(n)]
    ptr = np.cumsum([0] + [len(s) for s in succ]).astype(np.int64)
    flat = np.array([j for s in succ for j in s], np.int64)
    pending = np.bincount(flat, minlength=n).astype(np.int32)
    return Dag(ptr, flat, pending, levels(n, ptr, flat))


def _simulate(items: np.ndarray, worker: np.ndarray, extent: np.ndarray, dag: Dag, programs: int) -> bool:
    """The ranged-dispatch kernel's semantics, one step at a time: each program runs its stream
    in order, an item starts once every item of its task's predecessors has finished. True when
    every item finishes (False: the programs wait on each other forever)."""
    perm, start = streams(worker, programs)
    left = extent.astype(np.int64).copy()  # items of each task not finished
    pend = np.zeros(len(extent), np.int64)  # predecessor items not finished, per task
    for t in range(len(extent)):
        for s in dag.succ[dag.succ_ptr[t]:dag.succ_ptr[t + 1]]:
            pend[s] += extent[t]
    head = start[:-1].copy()
    while True:
        moved = False
        for k in range(programs):
            if head[k] < start[k + 1]:
                t = int(items[perm[head[k]], 0])
                if pend[t] == 0:
                    head[k] += 1
                    left[t] -= 1
                    pend[dag.succ[dag.succ_ptr[t]:dag.succ_ptr[t + 1]]] -= 1
                    moved = True
        if not moved:
            return bool((head == start[1:]).all())


@pytest.mark.parametrize("seed", range(6))
def test_any_assignment_of_a_topological_queue_to_resident_programs_completes(seed):
    """The deadlock-freedom argument, checked on random graphs: the list schedule's streams,
    round robin and random assignments all run to the end; a queue that is not topological can
    deadlock, so the check can fail."""
    rng = np.random.default_rng(seed)
    n, programs = 40, int(rng.integers(2, 6))
    dag = _random_dag(rng, n, 0.15)
    extent = rng.integers(1, 4, n)
    cost = rng.uniform(1, 10, n)
    static = np.array([(t, p) for t in np.argsort(dag.level, kind="stable") for p in range(extent[t])], np.int32)
    items, worker = list_schedule(static, cost, extent, dag, programs)
    assert sorted(map(tuple, items.tolist())) == sorted(map(tuple, static.tolist()))
    for w in (worker, np.arange(len(items)) % programs, rng.integers(0, programs, len(items))):
        assert _simulate(items, w.astype(np.int32), extent, dag, programs)
    # the same items in reverse (successors first) on one program: never starts
    assert dag.pending.any()
    assert not _simulate(items[::-1].copy(), np.zeros(len(items), np.int32), extent, dag, 1)


def test_the_list_schedule_gives_a_free_program_the_next_item():
    """Two programs, four independent tasks of costs 10, 1, 1, 1: program 0 runs the long one,
    program 1 the three short ones in turn (the lowest free program takes the next ready item,
    longest critical path first)."""
    dag = Dag(np.zeros(5, np.int64), np.zeros(0, np.int64), np.zeros(4, np.int32), np.zeros(4, np.int64))
    static = np.array([(t, 0) for t in range(4)], np.int32)
    items, worker = list_schedule(static, np.array([10.0, 1, 1, 1]), np.ones(4, np.int64), dag, 2)
    assert items[:, 0].tolist() == [0, 1, 2, 3]
    assert worker.tolist() == [0, 1, 1, 1]
    perm, start = streams(worker, 2)
    assert perm.tolist() == [0, 1, 2, 3] and start.tolist() == [0, 1, 4]


def test_affinity_starts_an_item_on_the_program_of_its_last_producer():
    """Four programs; task 0's four items, then task 1's, item k of task 1 waiting only for items k
    and 3 - k of task 0 (data dependencies narrower than the task's): with affinity each starts on
    the program that ran the later queued of its producers while that program is free, else on the
    other's (items 0 and 1 take programs 3 and 2, item 2 finds program 2 taken and takes 1, item 3
    program 0), without it on the lowest free program. The queue is the same; deadlock-free
    either way (any assignment of a topological queue)."""
    from pto.exec.order import Affinity

    dag = Dag(np.array([0, 1, 1], np.int64), np.array([1], np.int64), np.array([0, 1], np.int32),
              np.array([0, 1], np.int64))
    extent, cost = np.array([4, 4], np.int64), np.array([1.0, 1.0])
    static = np.array([(0, p) for p in range(4)] + [(1, p) for p in range(4)], np.int32)
    # rows: task 0's items 0-3, task 1's 4-7; item k of task 1 (row 4 + k) waits for rows k and 3 - k
    ptr = np.r_[np.zeros(5, np.int64), 2 * np.arange(1, 5)]
    aff = Affinity(np.array([0, 4], np.int64), ptr, np.array([0, 3, 1, 2, 2, 1, 3, 0], np.int64),
                   np.r_[np.zeros(4, bool), np.ones(4, bool)])
    plain = list_schedule(static, cost, extent, dag, 4)
    items, worker = list_schedule(static, cost, extent, dag, 4, affinity=aff)
    assert items.tolist() == plain[0].tolist()

    def programs_of(w):
        return [int(x) for (t, _), x in zip(items.tolist(), w.tolist()) if t == 1]

    assert worker[:4].tolist() == [0, 1, 2, 3]
    assert programs_of(worker) == [3, 2, 1, 0] and programs_of(plain[1]) == [0, 1, 2, 3]
    for w in (worker, plain[1]):
        assert _simulate(items, w.astype(np.int32), extent, dag, 4)


def test_a_decode_steps_rope_items_follow_one_of_their_producers_with_affinity(monkeypatch):
    """The 1B shape's step in the persistent executor's tiles for an H200 (264 programs, data
    dependencies): with affinity every RoPE item runs right after one of its own q/k/v producers
    on its program (without, 16 of 512: the lowest free programs, after other heads' items); the
    counters the plan keeps are those computed afresh, in its new order, and every item's
    producers come before it in the queue; the plan's layers as a segment of their own keep it.
    ``PTO_MK_AFFINITY`` takes on or off, anything else is one line naming it."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.engine import build_module_graph
    from pto.exec.item_deps import data_counters
    from pto.exec.plan import resolve_affinity
    from pto.ir.dtypes import DType

    cfg, tg = CONFIGS["llama3.2-1b"], target("cuda_h200")
    built = build_module_graph(build_step(cfg, DType.BF16, tg, 1, tiling_for_executor(cfg, "persistent", tg),
                                          cache=1024), {"B": 1, "C": 1024})
    try:
        plans = {a: make_plan(built.graph, list(built.graph.tensor_ids), {}, programs=264, runs=264, deps="data",
                              affinity=a) for a in ("off", "on")}
    finally:
        built.graph.close()

    def after_a_producer(plan, member=None):
        c = plan.counters()
        w = plan.workers(264, "stream")
        producers: dict[int, set] = {}
        src = np.repeat(np.arange(len(c.rel_ptr) - 1), np.diff(c.rel_ptr.astype(np.int64)))
        for r, k in zip(src.tolist(), c.rel.tolist()):
            producers.setdefault(k, set()).add(r)
        last, got, n = {}, 0, 0
        for q in np.argsort(w, kind="stable").tolist():  # (each program's stream in queue order)
            t = int(plan.items[q, 0])
            if plan.variants[t].name == "rope_qkv_append" and (member is None or member[t]):
                n += 1
                got += last.get(int(w[q]), -1) in producers.get(int(c.counter[q]), ())
            last[int(w[q])] = int(c.row[q])
        return got, n

    assert after_a_producer(plans["off"]) == (16, 512)
    assert after_a_producer(plans["on"]) == (512, 512)
    on = plans["on"]
    fresh, kept = data_counters(on, on.boxes), on.counters()
    for f in ("counter", "init", "row", "rel_ptr", "rel"):
        assert np.array_equal(getattr(fresh, f), getattr(kept, f)), f
    position = np.empty(on.n_items, np.int64)
    position[kept.row] = np.arange(on.n_items)  # (each row's queue position)
    src = np.repeat(np.arange(len(kept.rel_ptr) - 1), np.diff(kept.rel_ptr.astype(np.int64)))
    waiting = {}
    for q, k in enumerate(kept.counter.tolist()):
        waiting.setdefault(k, []).append(q)
    for r, k in zip(src.tolist(), kept.rel.tolist()):
        assert all(position[r] < q for q in waiting.get(k, ()))
    layers = np.array([not v.name.startswith(("lmhead", "argmax")) for v in on.variants])
    segment = on.segment(layers)
    assert segment.data_counts is None and segment.affinity is on.affinity
    assert after_a_producer(segment, layers) == (512, 512)
    monkeypatch.setenv("PTO_MK_AFFINITY", "on")
    assert resolve_affinity(None) == "on" and resolve_affinity("off") == "off"
    monkeypatch.setenv("PTO_MK_AFFINITY", "yes")
    with pytest.raises(UsageError, match=r"^PTO_MK_AFFINITY='yes': the megakernel's affinity is off or on$"):
        resolve_affinity(None)


def test_the_tensors_no_task_writes_are_the_programs_inputs():
    """The LLaMA layer: the tensors its tasks never write are exactly the ones the program declares
    inputs (x, the weights and gains, the RoPE tables); every output and temporary is written."""
    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", dtype="bf16", target=target("cuda_h100"), config="tiny", attention="split")
    module = prog.build(s)
    graph = CompiledProgram.get(module, target=s.target).build_graph(prog.scalars(s, prog.shape(40)))
    try:
        names = list(graph.tensor_ids)
        ex = graph.runtime.export()
        written = written_tensors(ex, graph.variant_of_func_id(), {graph.tensor_ids[n]: i for i, n in enumerate(names)},
                                  len(names))
    finally:
        graph.close()
    roles = {t.name: t.role for t in module.entry_function.tensors}
    assert {n for n, w in zip(names, written) if not w} == {n for n in names if roles[n] == "input"}
    assert {n for n, w in zip(names, written) if w} == {n for n in names if roles[n] != "input"}


def test_operands_no_task_writes_load_before_the_wait():
    """In the decode step's megakernel (SmolLM2's shape, bf16), each projection loads its weights
    and gain before it waits for its predecessors (a one-step K loop: into registers) and its
    activations after; the LM head, whose K loop has several steps, prefetches its first steps'
    weights into L2 before the wait; attention, whose operands are all written by the step,
    loads nothing before it."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for

    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType

    cfg = CONFIGS["smollm2-135m"]
    built = build_module_graph(build_step(cfg, DType.BF16, target("cuda_h200"), 1, tiling_for(cfg), cache=1024),
                               {"B": 1, "C": 1024})
    try:  # (the graph's rule: ``preds``, the default, also loads attention's positions early)
        plan = make_plan(built.graph, list(built.graph.tensor_ids), {}, early="graph")
    finally:
        built.graph.close()
    by_name = {b.fn.name: b for b in plan.branches}
    assert by_name["gemv_norm_swiglu_tile"].early == ("wg", "wu", "g")
    assert by_name["decode_attn_part"].early == ()
    src = render_megakernel(plan.branches, dispatch="stream").source
    wait = "_ok, _t0 = _pto_wait("
    def function(name: str) -> str:  # the device function the branch of that InCore function calls
        return device_function(src, called(src, plan.branches.index(by_name[name])))

    swiglu = function("gemv_norm_swiglu_tile")
    assert swiglu.count(wait) == 1
    before, after = swiglu.split(wait)
    def loads(text: str, mem: str) -> bool:  # a tile load's addresses from memref ``mem``
        return re.search(rf"_p\d+ = P_{mem} \+ _r\d+", text) is not None

    assert loads(before, "wg") and loads(before, "wu") and loads(before, "g")
    assert not loads(before, "x") and loads(after, "x")
    head = function("lmhead_argmax_tile")
    before, after = head.split(wait)
    assert "if GPU and PREFETCH >= 1:" in before and "_prefetch_l2(" in before and "_prefetch_l2(" not in after
    part = function("decode_attn_part")
    before, _ = part.split(wait)
    assert "tl.load(_p" not in before and "_prefetch_l2(" not in before


@pytest.mark.parametrize("attention", ["fused", "split"])
def test_each_branch_runs_the_body_rendered_for_it(attention):
    """Branches of one InCore variant that load different memrefs before their wait (the 7B
    layer's first norm reads the layer's input, which no task writes, its second the residual
    sum, which a predecessor writes) call device functions of their own: each branch's call is
    to the function rendered for that branch alone, text for text. (One name for both had let a
    branch run another's body, loading before its wait what a predecessor writes.)"""
    from dataclasses import replace

    from pto.codegen.triton.body import BodyRenderer
    from pto.codegen.triton.common import RenderOptions

    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", dtype="bf16", target=target("cuda_h200"), config="tiny", attention=attention)
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, prog.shape(40)))
    try:
        plan = make_plan(graph, list(graph.tensor_ids), {})
    finally:
        graph.close()
    variants = {}
    for b in plan.branches:
        variants.setdefault(b.fn.variant_name, set()).add(b.early)
    assert any(len(e) > 1 for e in variants.values())  # the case this guards: one variant, two early sets
    src = render_megakernel(plan.branches).source
    for k, b in enumerate(plan.branches):
        name, lines = BodyRenderer(b.fn, replace(RenderOptions(), pre=b.early), None, megakernel=True,
                                   runs=b.runs, prefetch=b.prefetch).device_function()
        assert called(src, k) == name, (k, b.fn.variant_name, b.early)
        assert "\n".join(lines) in src, name


def test_prefetch_two_fetches_attentions_keys_before_its_wait():
    """``PREFETCH >= 2``: an item also prefetches into L2, before its wait, the first tiles of the
    memrefs its function only reads though a predecessor writes them. In SmolLM2's step with the
    default early rule (``preds``: the position loads before the wait, so the key loop's bounds
    are known there), attention's part prefetches its keys and values at level 2 and nothing at
    level 1; with the graph's rule the position comes after the wait, and there is nothing to
    prefetch before it."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for

    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType

    cfg = CONFIGS["smollm2-135m"]
    built = build_module_graph(build_step(cfg, DType.BF16, target("cuda_h200"), 1, tiling_for(cfg), cache=1024),
                               {"B": 1, "C": 1024})
    wait = "_ok, _t0 = _pto_wait("
    try:
        for rule, level2 in (("preds", True), ("graph", False)):
            plan = make_plan(built.graph, list(built.graph.tensor_ids), {}, early=rule)
            part = next(b for b in plan.branches if b.fn.name == "decode_attn_part")
            src = render_megakernel(plan.branches, dispatch="static").source
            before, _ = device_function(src, called(src, plan.branches.index(part))).split(wait)
            assert ("if GPU and PREFETCH >= 2:" in before) == level2, rule
            assert "PREFETCH >= 1" not in before
            assert (re.search(r"_fp\d+ = tl.where\(.*P_kc \+", before) is not None) == level2
            assert (re.search(r"_fp\d+ = tl.where\(.*P_vc \+", before) is not None) == level2
    finally:
        built.graph.close()


def test_the_light_rule_prefetches_only_after_tasks_that_are_not_gemvs(monkeypatch):
    """``PTO_MK_PREFETCH=light``: in the 1B shape's decode step (q/k/v and gate/up in runs, which
    load nothing into registers before their wait), the tasks that wait last for a GEMV (the down
    projection after gate/up, gate/up after o, the LM head after the last down projection, q/k/v
    after the previous layer's down) render no L2 prefetch before their wait, and the o
    projection, after attention's combine, does, as does the first layer's q/k/v, after the
    embedding; under ``all`` all of them prefetch.
    The tasks after GEMVs are found from the runtime's edges and levels, checked here one
    predecessor list at a time."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.engine import build_module_graph
    from pto.exec.plan import after_gemvs, resolve_prefetch_rule, takes_runs
    from pto.ir.dtypes import DType

    cfg = CONFIGS["llama3.2-1b"]
    tiling = tiling_for_executor(cfg, "persistent", target("cuda_h200"))
    built = build_module_graph(build_step(cfg, DType.BF16, target("cuda_h200"), 1, tiling, cache=1024),
                               {"B": 1, "C": 1024})
    try:
        graph = built.graph
        ex = graph.runtime.export()
        variants = graph.variant_of_func_id()
        gemv = [takes_runs(variants[int(f)]) for f in ex.func]
        preds = [[] for _ in range(ex.n_tasks)]
        for t in range(ex.n_tasks):
            for s in ex.fanout_ids[ex.fanout_ptr[t]:ex.fanout_ptr[t + 1]]:
                preds[int(s) - ex.first_task].append(t)
        level = [0] * ex.n_tasks  # (the runtime numbers tasks in a topological order)
        for t in range(ex.n_tasks):
            level[t] = max((level[p] + 1 for p in preds[t]), default=0)
        want = [any(gemv[p] and level[p] == level[t] - 1 for p in preds[t]) for t in range(ex.n_tasks)]
        assert after_gemvs(ex, variants, np.array(level)).tolist() == want and any(want) and not all(want)
        plans = {rule: make_plan(graph, list(graph.tensor_ids), {}, runs=264, prefetch=rule)
                 for rule in ("all", "light")}
    finally:
        built.graph.close()
    wait = "_ok, _t0 = _pto_wait("

    def prefetches(plan, name: str) -> set[bool]:  # per branch of the InCore variant ``name``
        src = render_megakernel(plan.branches, dispatch="static").source
        return {"if GPU and PREFETCH >= 1:" in device_function(src, called(src, k)).split(wait)[0]
                for k, b in enumerate(plan.branches) if b.fn.variant_name == name}

    light = plans["light"]
    o, down = "gemv_residual_tile__K2048_N2048_R1", "gemv_residual_tile__K8192_N2048_R1"
    assert prefetches(light, o) == {True}
    for name in (down, "lmhead_argmax_tile__R1", "gemv_norm_swiglu_tile__R1"):
        assert prefetches(light, name) == {False}, name
    assert prefetches(light, "gemv_norm_tile__R1") == {False, True}  # (the first layer's waits for the embedding)
    for name in (o, down, "lmhead_argmax_tile__R1", "gemv_norm_swiglu_tile__R1", "gemv_norm_tile__R1"):
        assert prefetches(plans["all"], name) == {True}, name
    monkeypatch.setenv("PTO_MK_PREFETCH", "light")
    assert resolve_prefetch_rule(None) == "light" and resolve_prefetch_rule(2) == "all"
    monkeypatch.setenv("PTO_MK_PREFETCH", "some")
    with pytest.raises(UsageError, match=r"PTO_MK_PREFETCH='some': the megakernel's prefetch is 0 or 1 or 2 or light"):
        resolve_prefetch_rule(None)


def _tiny_step_plan():
    """The persistent executor's plan of the tiny model's bf16 decode step for an H200 (batch 1,
    a 64-slot cache)."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for

    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType

    cfg = CONFIGS["tiny"]
    built = build_module_graph(build_step(cfg, DType.BF16, target("cuda_h200"), 1, tiling_for(cfg), cache=64),
                               {"B": 1, "C": 64})
    try:
        plan = make_plan(built.graph, list(built.graph.tensor_ids), {})
    finally:
        built.graph.close()
    return plan


@pytest.mark.sm90
@pytest.mark.slow
def test_the_early_loads_and_the_prefetch_compile_for_sm90(tmp_path):
    """The decode step's megakernel with its L2 prefetch compiles for an H100/H200 (no GPU
    needed), and its PTX prefetches."""
    from tests.sm90 import compile_sm90, megakernel_job

    plan = _tiny_step_plan()
    kernel = render_megakernel(plan.branches, dispatch="stream")
    opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
    jobs = [{**megakernel_job(kernel, opts, prefetch=f), "count": ["prefetch.global.L2"]} for f in (0, 1, 2)]
    off, on, more = compile_sm90(jobs, tmp_path)
    assert off["ok"] and on["ok"] and more["ok"], (off.get("error"), on.get("error"), more.get("error"))
    count = [r["counts"]["prefetch.global.L2"] for r in (off, on, more)]
    assert count[0] == 0 < count[1] < count[2], count  # (2: attention's keys and values too)


@pytest.mark.sm90
@pytest.mark.slow
def test_every_threads_poll_compiles_for_sm90(tmp_path):
    """``PTO_MK_POLL=every``: the decode step's megakernel for an H100/H200 (no GPU needed) polls
    with each thread's ``ld.acquire.gpu`` and ends each wait at one ``bar.red.and.pred``, where
    the default (``one``) takes Triton's one-thread acquire load (``ld.global.gpu.acquire``) and
    no reduction barrier."""
    from tests.sm90 import compile_sm90, megakernel_job

    plan = _tiny_step_plan()
    opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
    marks = ["ld.acquire.gpu.global", "ld.global.gpu.acquire", "bar.red.and.pred"]
    jobs = [{**megakernel_job(render_megakernel(plan.branches, dispatch="static", poll=p), opts), "count": marks}
            for p in ("one", "every")]
    one, every = compile_sm90(jobs, tmp_path)
    assert one["ok"] and every["ok"], (one.get("error"), every.get("error"))
    assert one["counts"]["ld.acquire.gpu.global"] == 0 == one["counts"]["bar.red.and.pred"]
    assert one["counts"]["ld.global.gpu.acquire"] > 0
    assert every["counts"]["ld.acquire.gpu.global"] > 0 and every["counts"]["bar.red.and.pred"] > 0


def test_the_poll_is_one_threads_unless_asked(monkeypatch):
    """``PTO_MK_POLL`` (or the settings' ``poll``) picks the wait's poll: ``one`` by default (the
    atomic poll), ``every`` renders each thread's acquire loads and the barrier that ANDs them;
    anything else is one error naming the variable."""
    from pto.backends.triton.megakernel import resolve_poll
    from tests.exec.split_programs import decode_plan

    plan, _ = decode_plan("smollm2-135m")
    every = render_megakernel(plan.branches, dispatch="static", poll="every").source
    one = render_megakernel(plan.branches, dispatch="static").source
    assert "bar.red.and.pred" in every and "ld.acquire.gpu.global" in every
    assert "bar.red" not in one and "inline_asm" not in one.split("def _pto_wait")[1].split("@triton.jit")[0]
    monkeypatch.delenv("PTO_MK_POLL", raising=False)
    assert resolve_poll(None) == "one" and resolve_poll("every") == "every"
    monkeypatch.setenv("PTO_MK_POLL", "every")
    assert resolve_poll(None) == "every"
    monkeypatch.setenv("PTO_MK_POLL", "warp")
    with pytest.raises(UsageError, match=r"PTO_MK_POLL='warp': the megakernel's poll is one or every"):
        resolve_poll(None)
    with pytest.raises(ValueError, match="unknown poll"):
        render_megakernel(plan.branches, poll="warp")


pytestmark_interpret = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                          reason="needs the Triton interpreter (TRITON_INTERPRET=1)")


@pytest.mark.interpret
@pytestmark_interpret
def test_stream_dispatch_runs_every_item_on_the_program_its_stream_names():
    """Softmax's independent row tiles on 3 programs, one after another under the interpreter:
    every item once, on the program the list schedule gave it, the rows the wave executor's
    (with ``poll="every"``, which the interpreter runs as the atomic poll)."""
    from pto.backends.triton import MegakernelSettings
    from pto.engine import Runner, resolve

    outs = {}
    for executor in ("waves", "persistent"):
        job = resolve("softmax", device="cpu", backend="triton", executor=executor)
        runner = Runner(job, 300)
        if executor == "persistent":  # (every thread's poll: the interpreter's is the atomic one)
            runner.executor.settings = MegakernelSettings(programs=3, dispatch="stream", poll="every")
        outs[executor] = {k: v.clone() for k, v in
                          runner(job.program.inputs(job.settings, job.program.shape(300), "cpu", seed=2)).items()}
        if executor == "waves":
            runner.close()
    try:
        for k in outs["waves"]:
            assert torch.equal(outs["persistent"][k], outs["waves"][k]), k
        ex = runner.executor
        assert ex.kernel.dispatch == "stream" and ex.programs == 3
        ex._launch(trace=True)
        ex.check()
        want = ex.plan.workers(3, "stream")
        index = {(int(t), int(p)): i for i, (t, p) in enumerate(ex.plan.items)}
        records = ex.trace_records()
        assert len(records) == ex.plan.n_items
        assert all(r.program == want[index[(r.task - ex.plan.first_task, r.p)]] for r in records)
    finally:
        runner.close()


@pytest.mark.slow
def test_tracing_is_a_run_time_switch_not_a_specialization(tmp_path):
    """The megakernel's ``tracing`` argument is not specialized (``do_not_specialize``): Triton
    would compile another kernel for ``tracing == 1`` (it specializes integers equal to 1), so
    the traced launch would time a kernel other than the replayed one and compile between a
    split plan's segments (the 1.19 s "between launches" of a critical path on an H200). Read
    from the JIT function Triton launches (compiled, not interpreted: a process without
    ``TRITON_INTERPRET``); ``n_items`` beside it is specialized as any integer is."""
    import subprocess
    import sys

    script = tmp_path / "params.py"
    script.write_text(
        "from pto.orchestration.model.decode import build_step\n"
        "from pto.orchestration.model.program import CONFIGS, tiling_for\n"
        "from pto.engine import build_module_graph\n"
        "from pto.ir.dtypes import DType\n"
        "from pto.machine.target import get\n"
        "from pto.exec.plan import make_plan\n"
        "from pto.codegen.triton.megakernel import render_megakernel\n"
        "from pto.backends.triton.loader import load_kernel\n"
        "cfg = CONFIGS['tiny']\n"
        "b = build_module_graph(build_step(cfg, DType.F32, get('cuda_h200'), 1, tiling_for(cfg), cache=64), "
        "{'B': 1, 'C': 64})\n"
        "plan = make_plan(b.graph, list(b.graph.tensor_ids), {})\n"
        "jit = load_kernel(render_megakernel(plan.branches, dispatch='static'))\n"
        "print({p.name: p.do_not_specialize for p in jit.params if p.name in ('tracing', 'n_items')})\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PTO_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "{'n_items': False, 'tracing': True}"
