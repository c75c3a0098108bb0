"""The schedule checker on the CPU: real traces of the wave executor (whole waves and random
ready orders, every program) and of the persistent executor under the interpreter pass; traces
with a planted mistake (a task moved before its predecessor, two conflicting tasks made
concurrent, a task left out or run twice) fail, and the conflicts found are exactly those an
element-by-element reference finds; ``pto run --check-schedule`` reports the check."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pto.backends import get_backend
from pto.data.buffers import allocate, tensor_shapes
from pto.engine import Runner, resolve
from pto.errors import ExecutionError
from pto.exec.base import LaunchRecord
from pto.exec.waves import WaveExecutor
from pto.runtime.graph import CompiledProgram
from pto.safety.trace_check import check_schedule, task_intervals, verify_schedule

PROGRAMS = [("softmax", {}), ("bgemm", {}), ("llama7b", {"attention": "fused"}), ("llama7b", {"attention": "pair"}),
            ("llama7b", {"attention": "split"}), ("llama7b", {"attention": "split", "causal": False})]


def _trace(program, options, seq, order="waves", seed=0):
    """(export, launch records) of a recorded wave-executor run."""
    job = resolve(program, device="cpu", backend="torch", options=options)
    p, s = job.program, job.settings
    module = p.build(s)
    scalars = p.scalars(s, p.shape(seq))
    graph = CompiledProgram.get(module, target=s.target).build_graph(scalars)
    try:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), p.inputs(s, p.shape(seq), "cpu", seed=1), "cpu")
        stats = WaveExecutor(get_backend("torch", "cpu"), tensors, record=True, order=order, seed=seed).run(graph)
        return graph.runtime.export(), stats.records
    finally:
        graph.close()


def _conflicts(ex) -> set[tuple[int, int]]:
    """Every pair of task rows that touch a common element, at least one writing: painted
    element by element (the reference)."""
    shapes = {tid: (t[1], t[2]) for tid, t in enumerate(ex.tensors)}
    touch: dict[int, list] = {}
    for row in range(ex.n_tasks):
        for a in range(ex.arg_ptr[row], ex.arg_ptr[row + 1]):
            if ex.arg_kind[a] == 3:
                continue
            m = np.zeros(shapes[int(ex.arg_tensor[a])], bool)
            r0, c0, nr, nc = ex.arg_region[a]
            m[r0:r0 + nr, c0:c0 + nc] = True
            touch.setdefault(int(ex.arg_tensor[a]), []).append((row, ex.arg_kind[a] != 0, m))
    out = set()
    for acc in touch.values():
        for i, (ti, wi, mi) in enumerate(acc):
            for tj, wj, mj in acc[i + 1:]:
                if ti != tj and (wi or wj) and (mi & mj).any():
                    out.add((min(ti, tj), max(ti, tj)))
    return out


@pytest.mark.parametrize("program,options", PROGRAMS, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()) or "default")
@pytest.mark.parametrize("order,seed", [("waves", 0), ("random", 1), ("random", 2)])
def test_real_wave_traces_pass(program, options, order, seed):
    ex, records = _trace(program, options, 45, order, seed)
    rep = verify_schedule(ex, records)
    assert rep.ok and rep.tasks == ex.n_tasks and rep.dependencies == len(ex.edges())
    start, end, runs = task_intervals(ex, records)
    assert (runs == 1).all() and (start < end).all()


def test_a_predecessor_overtaken_is_found():
    """The first launch of the second wave moved before the first wave: every one of its tasks
    with a predecessor in wave 0 is reported, with both tasks named."""
    ex, records = _trace("llama7b", {"attention": "split"}, 40)
    bad = copy.deepcopy(records)
    moved = next(r for r in bad if r.wave == 1)
    moved.start_ns, moved.end_ns = bad[0].start_ns - 2000, bad[0].start_ns - 1000
    rep = check_schedule(ex, bad)
    edges = ex.edges()
    want = int(np.isin(edges[:, 1], moved.tasks).sum())
    assert want > 0 and rep.found == want, rep.violations[:3]
    assert "started at" in rep.violations[0] and "before its predecessor task" in rep.violations[0]
    with pytest.raises(ExecutionError, match=r"schedule check: task \d+ \(`\w+`\) started at"):
        verify_schedule(ex, bad)


def test_concurrent_conflicts_are_exactly_the_reference_ones():
    """Every launch stretched over the whole run: all tasks overlap in time, so the violations of
    exclusion are all conflicting pairs, as painted element by element."""
    ex, records = _trace("llama7b", {"attention": "pair"}, 40)
    lo, hi = min(r.start_ns for r in records), max(r.end_ns for r in records)
    flat = [LaunchRecord(r.wave, r.func, r.tasks, lo, hi) for r in records]
    rep = check_schedule(ex, flat, limit=10**6)
    pairs = set()
    for line in rep.violations:
        if "overlapping" in line:  # "task A (`f`) and task B (`g`) ran at overlapping times ..."
            a, b = (int(part.split()[0]) - ex.first_task for part in line.split("task ")[1:3])
            pairs.add((min(a, b), max(a, b)))
    assert pairs == _conflicts(ex)
    # one line per conflicting pair of accesses; and every edge is broken too (each successor
    # now starts before its predecessor ends)
    overlaps = sum("overlapping" in line for line in rep.violations)
    assert overlaps >= len(pairs) and rep.found == overlaps + len(ex.edges()) == len(rep.violations)


def test_missing_and_repeated_tasks_are_found():
    ex, records = _trace("softmax", {}, 100)
    rec = records[0]
    short = [LaunchRecord(rec.wave, rec.func, rec.tasks[1:], rec.start_ns, rec.end_ns)]
    rep = check_schedule(ex, short)
    assert rep.found == 1 and rep.violations[0].endswith("ran 0 times, not once")
    twice = [rec, LaunchRecord(rec.wave + 1, rec.func, rec.tasks[:1], rec.end_ns + 1, rec.end_ns + 2)]
    rep = check_schedule(ex, twice)
    assert rep.violations[0].startswith(f"task {int(rec.tasks[0])} ") and "ran 2 times" in rep.violations[0]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
def test_persistent_item_traces_pass(attention):
    """The persistent executor's items (logical clock under the interpreter) against the graph;
    the same items with one successor item moved before its predecessor's fail."""
    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": attention})
    runner = Runner(job, 40, record=True)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
        ex = runner.graph.runtime.export()
        recs = runner.stats.records
        rep = verify_schedule(ex, recs)
        assert rep.ok and rep.tasks == ex.n_tasks
        p, s = ex.edges()[-1]
        bad = copy.deepcopy(recs)
        first = min(r.start_ns for r in recs if r.task == p)
        for r in bad:
            if r.task == s:
                r.start_ns, r.end_ns = first - 2, first - 1
        assert not check_schedule(ex, bad).ok
    finally:
        runner.close()


def test_cli_check_schedule():
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama7b", "--seq", "40", "--device", "cpu",
                        "--attention", "split", "--check-schedule", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["schedule"]["ok"] and res["schedule"]["tasks"] == res["tasks"]
    assert res["schedule"]["dependencies"] == res["edges"] and res["schedule"]["violations"] == 0
