"""Items run where their dependency ends (``PTO_MK_INLINE=on``, :mod:`pto.exec.inline`): which
items run inline (the lone waiter of a counter, one a release row), the table's layout (in no
program's stream), the deadlock-freedom argument on random graphs (a simulation of the kernel's
semantics, which fails when a release row could end two inline counters), and the megakernel
under the Triton interpreter: the wave executor's outputs bit for bit, every item run once."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pto.exec.inline import inline_items, inline_layout
from pto.exec.item_deps import Counters
from pto.exec.order import Dag, levels


def _counters(waits: list[int], init: list[int], rows: list[list[int]], row_of: list[int]) -> Counters:
    ptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    rel = np.array([c for r in rows for c in r], np.int32)
    return Counters(np.array(waits, np.int64), np.array(init, np.int32), np.array(row_of, np.int64), ptr, rel)


def test_an_inline_item_waits_alone_on_a_counter_with_a_count():
    """Items 0-1 wait on counter 0 (no count), item 2 alone on counter 1, items 3-4 on counter 2,
    item 5 alone on counter 3 (no count: nothing to wait for), item 6 alone on counter 4."""
    c = _counters(waits=[0, 0, 1, 2, 2, 3, 4], init=[0, 2, 2, 0, 1],
                  rows=[[1, 2], [1, 2], [4], [], [], [], []], row_of=[0, 1, 2, 3, 4, 5, 6])
    assert inline_items(c).tolist() == [-1, 2, -1, -1, 6]


def test_a_release_row_ends_one_inline_counter_at_most():
    """Items 2 and 3 wait alone on counters 1 and 2; item 0 releases both (so only the first of
    them stays inline), item 1 only counter 2."""
    c = _counters(waits=[0, 0, 1, 2], init=[0, 1, 2, 0], rows=[[1, 2], [2], [], []], row_of=[0, 1, 2, 3])
    assert inline_items(c).tolist() == [-1, 2, -1, -1]


def test_inline_items_follow_every_programs_stream():
    """Six items round robin on two programs, items 1 and 4 inline (waiting on counters 0 and 2):
    program 0 runs 0, 2; program 1 runs 3, 5; the inline items after both, in queue order."""
    order, start, table = inline_layout(np.arange(6) % 2, 2, np.array([1, -1, 4]))
    assert order.tolist() == [0, 2, 3, 5, 1, 4]
    assert start.tolist() == [0, 2, 4]
    assert table.tolist() == [4, -1, 5]


def _random_dag(rng, n: int, p: float) -> Dag:
    succ = [[j for j in range(i + 1, n) if rng.random() < p] for i in range(n)]
    ptr = np.cumsum([0] + [len(s) for s in succ]).astype(np.int64)
    flat = np.array([j for s in succ for j in s], np.int64)
    return Dag(ptr, flat, np.bincount(flat, minlength=n).astype(np.int32), levels(n, ptr, flat))


def _simulate(items: np.ndarray, c: Counters, inline: np.ndarray, worker: np.ndarray, programs: int,
              rng) -> bool:
    """The ranged kernel with inline items, one step at a time in a random interleaving: a
    program runs its stream's head once its counter is 0, or first the inline item its last
    release made ready (the item whose counter that release took from 1 to 0; at most one
    runs: the kernel's ``j``, the largest). True when every item ran exactly once."""
    order, start, table = inline_layout(worker, programs, inline)
    count = c.init.astype(np.int64).copy()
    head = start[:-1].copy()
    ran = np.zeros(len(items), np.int64)
    pending: list[int | None] = [None] * programs  # an inline item (queue index) to run next

    def release(i: int) -> int | None:
        j = -1
        r = c.row[i]
        for x in c.rel[c.rel_ptr[r]:c.rel_ptr[r + 1]]:
            count[x] -= 1
            if count[x] == 0 and table[x] >= 0:
                j = max(j, int(table[x]))
        return None if j < 0 else int(order[j])

    while True:
        ready = [k for k in range(programs)
                 if pending[k] is not None or (head[k] < start[k + 1] and count[c.counter[order[head[k]]]] == 0)]
        if not ready:
            return bool((head == start[1:]).all() and all(p is None for p in pending) and (ran == 1).all())
        k = int(rng.choice(ready))
        if pending[k] is not None:
            i, pending[k] = pending[k], None
        else:
            i = int(order[head[k]])
            head[k] += 1
        ran[i] += 1
        pending[k] = release(i)


def _task_counters(items: np.ndarray, dag: Dag, extent: np.ndarray) -> Counters:
    """A counter a task, each item releasing its task's successors (counts: their items)."""
    n = len(extent)
    init = np.zeros(n, np.int64)
    for t in range(n):
        for s in dag.succ[dag.succ_ptr[t]:dag.succ_ptr[t + 1]]:
            init[s] += extent[t]
    task = items[:, 0].astype(np.int64)
    return Counters(task, init.astype(np.int32), task, dag.succ_ptr.astype(np.int32), dag.succ.astype(np.int32))


@pytest.mark.parametrize("seed", range(6))
def test_inline_items_on_random_graphs_run_once_and_nothing_waits_forever(seed):
    """Random graphs of tasks of 1 to 3 items (the single-item ones whose counter one item waits
    on run inline), their items in level order on 2-5 programs round robin and at random, in
    random interleavings: every item runs exactly once. Without the one-a-row rule a release
    that ends two inline counters runs one of them and the other never: the check fails."""
    rng = np.random.default_rng(seed)
    n, programs = 40, int(rng.integers(2, 6))
    dag = _random_dag(rng, n, 0.15)
    extent = np.where(rng.random(n) < 0.5, 1, rng.integers(1, 4, n))
    items = np.array([(t, p) for t in np.argsort(dag.level, kind="stable") for p in range(extent[t])], np.int32)
    c = _task_counters(items, dag, extent)
    inline = inline_items(c)
    assert (inline >= 0).sum() > 3  # (the graph has inline items to speak of)
    for worker in (np.arange(len(items)) % programs, rng.integers(0, programs, len(items))):
        for _ in range(3):
            assert _simulate(items, c, inline, worker.astype(np.int64), programs, rng)
    # every lone waiter inline, rows that end two such counters included: some item never runs
    waiters = np.bincount(c.counter, minlength=len(c.init))
    lone = np.nonzero((waiters == 1) & (c.init > 0))[0]
    at = np.full(len(c.init), -1, np.int64)
    at[c.counter] = np.arange(len(c.counter))
    greedy = np.full(len(c.init), -1, np.int64)
    greedy[lone] = at[lone]
    rows = [c.rel[c.rel_ptr[t]:c.rel_ptr[t + 1]] for t in range(n)]
    assert any((greedy[r] >= 0).sum() > 1 for r in rows)
    assert not any(_simulate(items, c, greedy, np.arange(len(items)) % programs, programs, rng) for _ in range(3))


def _dispatch_loop(tmp_path, ahead: str = "held"):
    """The rendered kernel's own loop with inline items and no branches, each item run at once
    (the dispatch's ``ok`` set where a branch would: nothing to wait for or compute), under the
    interpreter: what takes items, releases counters and runs the inline ones (``ahead``: when
    it loads the next item's descriptor, ``PTO_MK_AHEAD``)."""
    import importlib.util

    from pto.codegen.triton.megakernel import render_megakernel

    src = render_megakernel([], dispatch="static", inline=True, ahead=ahead).source
    assert src.count("ok = tl.zeros((), dtype=tl.int32)") == 1
    path = tmp_path / f"loop_{ahead}.py"
    path.write_text(src.replace("ok = tl.zeros((), dtype=tl.int32)", "ok = tl.full((), 1, tl.int32)"))
    spec = importlib.util.spec_from_file_location("inline_loop", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.pto_persistent


def _drive(kernel, items: np.ndarray, c: Counters, worker: np.ndarray, programs: int, block: int) -> None:
    """Run every item of ``items`` (queue order) on ``programs`` programs by the loop ``kernel``
    with successor blocks of ``block``, traced: each item runs once, each program's stream in
    order on that program, each inline item on the program whose release ended its count, at
    the next tick of the logical clock."""
    from pto.exec.inline import row_inline

    inline = inline_items(c)
    order, start, table = inline_layout(worker, programs, inline)
    row_counter, row_item = row_inline(c, table)
    n = len(items)
    d = np.zeros((n, 8), np.int64)
    d[:, :2] = items[order]
    d[:, 4], d[:, 5], d[:, 6], d[:, 7] = c.waits[order], 1, c.counter[order], c.row[order]

    def t(a, dtype):
        return torch.tensor(np.asarray(a), dtype=dtype)

    i32, i64 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    nxt, err = torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    trace, clock = torch.full((n, 3), -1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    kernel[(programs,)](t(d, torch.int64), n, nxt, t(start, torch.int64), i32, i64, i32, i32, i64, i64, i64, i64,
                        t(c.init, torch.int32), i32, i32, t(c.rel_ptr, torch.int32),
                        t(c.rel if len(c.rel) else [0], torch.int32), err, trace, clock, 1,
                        t(row_counter if len(row_counter) else [-1], torch.int64),
                        t(row_item if len(row_item) else [-1], torch.int64),
                        MAXM=1, MAX_POLLS=16, SUCC_BLOCK=block, GPU_CLOCK=False, PREFETCH=0)
    tr = trace.numpy()
    end, program = tr[:, 1], tr[:, 2] & 0xFFFFFFFF
    assert int(err[0]) == 0 and (end >= 0).all() and int(nxt[0]) == n
    assert len(np.unique(end)) == n  # (one tick an item: each ran once)
    at = np.empty(n, np.int64)
    at[order] = np.arange(n)
    for k in range(programs):
        mine = np.arange(start[k], start[k + 1])
        assert (program[mine] == k).all() and (np.diff(end[mine]) > 0).all()
    for x in np.nonzero(table >= 0)[0]:
        releasers = [at[i] for i in range(n) if x in c.rel[c.rel_ptr[c.row[i]]:c.rel_ptr[c.row[i] + 1]]]
        last = max(releasers, key=lambda r: end[r])
        assert program[table[x]] == program[last] and end[table[x]] == end[last] + 1, x


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("ahead", ["held", "after"])
def test_the_kernels_loop_runs_each_inline_item_where_its_count_ends(tmp_path, ahead):
    """The rendered loop on random graphs (tasks of 1 to 3 items, counters a task), 1 to 6
    programs round robin or at random, successor blocks of 1, 2 and 32 (a row's counters over
    several blocks): every item once, streams in order, each inline item run next by the program
    whose release ended its count; and a chain, item 0's release ending item 1's count and item
    1's item 2's, both inline, after the one stream, a second program with none. The same with
    the next item's descriptor and the release row loaded after the item (``after``)."""
    kernel = _dispatch_loop(tmp_path, ahead)
    chain = _counters(waits=[0, 1, 2], init=[0, 1, 1], rows=[[1], [2], []], row_of=[0, 1, 2])
    assert inline_items(chain).tolist() == [-1, 1, 2]
    for block in (1, 32):
        _drive(kernel, np.array([(0, 0), (1, 0), (2, 0)], np.int32), chain, np.zeros(3, np.int64), 2, block)
    rng = np.random.default_rng(5)
    for case in range(12):
        n, programs = int(rng.integers(8, 24)), int(rng.integers(1, 7))
        dag = _random_dag(rng, n, 0.25)
        extent = np.where(rng.random(n) < 0.5, 1, rng.integers(1, 4, n))
        items = np.array([(t, p) for t in np.argsort(dag.level, kind="stable") for p in range(extent[t])], np.int32)
        c = _task_counters(items, dag, extent)
        worker = np.arange(len(items)) % programs if case % 2 else rng.integers(0, programs, len(items))
        _drive(kernel, items, c, worker.astype(np.int64), programs, (1, 2, 32)[case % 3])


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("program,seq,options,shape,deps", [
    ("model", None, {"config": "tiny"}, {"batch": 2, "cache": 128}, "data"),
    ("model", None, {"config": "tiny"}, {"batch": 1, "cache": 128}, "task"),
    ("llama7b", 40, {"attention": "split"}, None, "data"),
], ids=["decode-data", "decode-task", "split-data"])
def test_inline_items_give_the_waves_results(program, seq, options, shape, deps, monkeypatch):
    """The persistent executor with inline items (one kernel, static dispatch, one program under
    the interpreter): the wave executor's outputs bit for bit, every item taken once, the
    inline items (one attention combine a layer among them) after the program's stream in
    the table, and the kernel's releases acq_rel atomics."""
    from tests.exec.test_item_deps import persistent_against_waves

    rp, _, _ = persistent_against_waves(monkeypatch, program, seq, options, shape, PTO_MK_DEPS=deps,
                                        PTO_MK_INLINE="on")
    try:
        ex = rp.executor
        ex.check()  # (every item taken: each program counts the inline items it ran)
        (kernel,) = ex.kernels
        assert kernel.inline and "sem=\"acq_rel\"" in kernel.rendered.source
        lone = kernel.inline_items[kernel.inline_items >= 0]
        names = {kernel.plan.variants[t].name for t in kernel.plan.items[lone, 0]}
        assert len(lone) and (program != "model" or "decode_attn_combine_parts" in names), names
        # the inline items are the table's last rows, past the one program's stream
        assert kernel.buf["stream"].tolist() == [0, kernel.plan.n_items - len(lone)]
        assert sorted(kernel.order[-len(lone):].tolist()) == sorted(lone.tolist())
    finally:
        rp.close()


def test_inline_is_off_by_default_and_the_setting_is_checked(monkeypatch):
    from pto.backends.triton.megakernel import DEFAULT_INLINE, resolve_inline
    from pto.errors import UsageError

    monkeypatch.delenv("PTO_MK_INLINE", raising=False)
    assert DEFAULT_INLINE == "off" and resolve_inline(None) == "off" and resolve_inline("on") == "on"
    monkeypatch.setenv("PTO_MK_INLINE", "yes")
    with pytest.raises(UsageError, match=r"PTO_MK_INLINE='yes': the megakernel's inline is off or on"):
        resolve_inline(None)


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_inline_items_with_the_queue_are_one_line(monkeypatch):
    """The queue's atomic takes an index a program would drop to run an inline item first:
    refused, naming both settings, before anything runs."""
    from pto.errors import UsageError
    from tests.exec.test_item_deps import run_program

    monkeypatch.setenv("PTO_MK_INLINE", "on")
    monkeypatch.setenv("PTO_DISPATCH", "queue")
    with pytest.raises(UsageError, match=r"inline items \(PTO_MK_INLINE=on\) need ranged dispatch .*not the queue"):
        run_program("bgemm", "persistent", 45, None, None)


@pytest.mark.sm90
@pytest.mark.slow
def test_a_decode_steps_megakernel_with_inline_items_compiles_for_sm90(tmp_path):
    """The tiny model's decode step (data dependencies) rendered with inline items, compiled by
    Triton for an H100/H200 (sm_90): a row's inline counter released by an acq_rel atomic whose
    old count it reads (``atom...gpu.acq_rel.add``), its other counters by release atomics
    (``...gpu.release.add``), as the plain kernel releases all of them."""
    from pto.codegen.triton.megakernel import render_megakernel
    from tests.exec.test_item_deps import _decode_plan
    from tests.sm90 import compile_sm90, megakernel_job

    _, _, plan = _decode_plan("tiny", "data")
    stages = {b.fn.variant_name: 2 for b in plan.branches}
    opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
    kernels = [render_megakernel(plan.branches, dispatch="static", stages=stages, inline=on) for on in (True, False)]
    words = ["gpu.acq_rel.add", "gpu.release.add"]  # (Triton 3.6 spells a release `atom`, 3.9 `red`)
    res = compile_sm90([{**megakernel_job(k, opts, inline=on), "count": words}
                        for k, on in zip(kernels, (True, False))], tmp_path)
    assert all(r["ok"] for r in res), [r.get("error") for r in res]
    inline, plain = (r["counts"] for r in res)
    assert inline[words[0]] > 0 and inline[words[1]] > 0, inline
    assert plain[words[0]] == 0 and plain[words[1]] > 0, plain
