"""The persistent kernel's static dispatch (``PTO_DISPATCH=static``, ``MegakernelSettings.dispatch``:
program k runs items k, k + P, k + 2P, ... of the queue order, no queue atomic) under the Triton
interpreter: bit-identical to the wave executor, every item run once by the program its index
names (a wait that never ends: tests/exec/test_persistent.py, both dispatches); the items'
descriptors say which tasks wait at all; an unknown dispatch is one line."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from pto.backends.triton import MegakernelSettings  # noqa: E402
from pto.engine import Runner, resolve  # noqa: E402
from pto.errors import UsageError  # noqa: E402

pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs the Triton interpreter (TRITON_INTERPRET=1)")]


def _outputs(program, seq, options, executor, settings=None):
    job = resolve(program, device="cpu", backend="triton", executor=executor, options=options)
    runner = Runner(job, seq)
    if settings is not None:
        runner.executor.settings = settings
    inputs = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=5)
    return runner, {k: v.clone() for k, v in runner(inputs).items()}


@pytest.mark.parametrize("program,seq,options", [("llama7b", 40, {"attention": "fused"}), ("bgemm", 45, {})])
def test_static_dispatch_is_bit_identical_to_waves(program, seq, options, monkeypatch):
    """One program under the interpreter (a second would wait for an item of one not started):
    the queue order itself, every wait already satisfied (one kernel: test_megakernel_split runs
    split plans under static dispatch)."""
    monkeypatch.setenv("PTO_DISPATCH", "static")
    monkeypatch.setenv("PTO_MK_SPLIT", "off")
    rw, want = _outputs(program, seq, options, "waves")
    rw.close()
    rp, got = _outputs(program, seq, options, "persistent")
    try:
        assert rp.executor.kernel.dispatch == "static" and rp.executor.programs == 1
        assert "tl.atomic_add(nxt, 1" not in rp.executor.kernel.rendered.source
        for k in want:
            assert torch.equal(got[k], want[k]), k
        rp.executor.check()  # every item taken
    finally:
        rp.close()


def test_static_dispatch_over_several_programs_runs_every_item_where_its_index_says():
    """Tasks without dependencies (softmax's row tiles) on 3 programs, one after another under
    the interpreter: item i runs on program i mod 3, every item once, the rows right."""
    rw, want = _outputs("softmax", 300, {}, "waves")
    rw.close()
    rp, got = _outputs("softmax", 300, {}, "persistent", MegakernelSettings(programs=3, dispatch="static"))
    try:
        ex = rp.executor
        assert ex.programs == 3 and ex.plan.n_items > 3
        for k in want:
            assert torch.equal(got[k], want[k]), k
        ex._launch(trace=True)
        ex.check()
        assert ex.kernel.items_taken() == ex.plan.n_items  # each program counted its own, once
        records = ex.trace_records()
        order = {(int(t), int(p)): i for i, (t, p) in enumerate(ex.plan.items)}
        assert sorted(order.values()) == list(range(ex.plan.n_items))
        assert all(r.program == order[(r.task - ex.plan.first_task, r.p)] % 3 for r in records)
        assert all(r.sm == -1 for r in records)  # (the interpreter knows no multiprocessor)
    finally:
        rp.close()


def test_several_programs_of_a_graph_with_dependencies_are_refused_under_the_interpreter():
    """The interpreter runs programs one after another: with static dispatch a second program's
    items would be waited for before it starts. One line, before any work."""
    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": "fused"})
    runner = Runner(job, 40)
    runner.executor.settings = MegakernelSettings(programs=2, dispatch="static")
    try:
        with pytest.raises(UsageError, match=r"^static dispatch of 2 programs under the Triton interpreter: .*one "
                                             r"program\)$"):
            runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
    finally:
        runner.close()


@pytest.mark.parametrize("deps", ["task", "data"])
def test_the_descriptors_say_which_tasks_wait(monkeypatch, deps):
    """Column 4 of an item's descriptor: it waits for anything (an item that waits for nothing
    does not poll its counter); columns 6 and 7: the counter it waits on and the row of counters
    it releases, the plan's; with task dependencies its task's (its task's successors), with
    data dependencies a subset of the items its task waits for."""
    from pto.backends.triton.megakernel import item_descriptors

    monkeypatch.setenv("PTO_MK_DEPS", deps)
    runner, _ = _outputs("llama7b", 40, {"attention": "fused"}, "persistent")
    try:
        plan = runner.executor.plan
        d, c = item_descriptors(plan), plan.counters()
        assert d.shape == (plan.n_items, 8)
        assert (d[:, 5] == 1).all()  # (an item an index: no runs)
        assert np.array_equal(d[:, 4], c.waits) and np.array_equal(d[:, 6], c.counter)
        assert np.array_equal(d[:, 7], c.row)
        assert 0 < d[:, 4].sum() < plan.n_items
        task_waits = (plan.pending[plan.items[:, 0]] > 0).astype(np.int64)
        if deps == "task":
            assert np.array_equal(d[:, 4], task_waits)
            assert np.array_equal(d[:, 6], plan.items[:, 0]) and np.array_equal(d[:, 7], plan.items[:, 0])
        else:
            assert (d[:, 4] <= task_waits).all()
            assert (c.init[d[:, 6]] <= plan.pending_items[plan.items[:, 0]]).all()
    finally:
        runner.close()


def test_an_unknown_dispatch_is_one_line(monkeypatch):
    from pto.backends.triton.megakernel import resolve_dispatch

    monkeypatch.setenv("PTO_DISPATCH", "fastest")
    with pytest.raises(UsageError, match=r"^PTO_DISPATCH='fastest': the megakernel's dispatch is queue or static or "
                                         r"stream$"):
        resolve_dispatch(None)
    assert resolve_dispatch("static") == "static"
    with pytest.raises(UsageError, match=r"^dispatch='x'"):
        resolve_dispatch("x")
