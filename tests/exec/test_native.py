"""The native executor (pto/exec/native.py): whole programs compiled to C, run by the runtime's
worker threads while the orchestration submits.

Against the evaluator (the torch backend, the reference) every program: softmax, bgemm, the
LLaMA layer in every attention mode (fused and as written), the model's decode step (with float
and quantized weights). Each
task's kernel is the evaluator's arithmetic up to the order of f32 sums and products (rounding-
bounded per op: tests/codegen/test_c_incore.py), so whole programs agree to a relative error a
few times f32's unit roundoff times the depth of the sums (1e-5 for these sizes). The same run
at any thread count and any window gives the same bits (a task computes the same whatever runs
beside it; tasks that write one element run in program order). A graph larger than the window
runs in the window's memory; a region outside its tensor is the build's RegionError; Ctrl-C
cancels a run and leaves the executor usable.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from pto.engine import Runner, rel_err, resolve
from pto.errors import RegionError
from pto.exec.native import NativeExecutor, physical_cores

PROGRAMS = [
    ("softmax", {}, 200),
    ("bgemm", {}, 96),
    ("llama7b", {"attention": "fused"}, 100),
    ("llama7b", {"attention": "split"}, 100),
    ("llama7b", {"attention": "pair"}, 100),
    ("llama7b", {"attention": "split", "fuse": False}, 100),
    ("model", {}, None),
    ("model", {"quantize": "q4_1"}, None),  # quantized weights: the GEMVs take them as stored
    ("model", {"quantize": "q8_0"}, None),
]


def run(program: str, options: dict, shape, backend: str, seed: int = 3, **kw):
    job = resolve(program, device="cpu", backend=backend, options=options)
    runner = Runner(job, shape if shape is not None else job.program.shape())
    if kw:
        runner.executor.threads = kw.get("threads", runner.executor.threads)
        runner.executor.window = kw.get("window", runner.executor.window)
    inputs = job.program.inputs(job.settings, runner.shape, "cpu", seed=seed)
    try:
        return {k: v.clone() for k, v in runner(inputs).items()}, runner
    finally:
        runner.close()


@pytest.mark.parametrize("program,options,seq", PROGRAMS, ids=lambda v: str(v))
def test_program_against_the_evaluator(program, options, seq):
    got, runner = run(program, options, seq, "c")
    assert runner.executor.name == "native"
    want, _ = run(program, options, seq, "torch")
    for name in want:
        assert rel_err(got[name], want[name]) < 1e-5, name


def test_thread_counts_and_windows_give_the_same_bits():
    """1 to 4 threads (more than this machine's cores too), windows from 4 slots to the whole
    graph: every run the same bits."""
    base, _ = run("llama7b", {"attention": "split"}, 300, "c", threads=1, window=1 << 16)
    for threads, window in ((2, 1 << 16), (3, 64), (4, 4), (1, 4)):
        got, runner = run("llama7b", {"attention": "split"}, 300, "c", threads=threads, window=window)
        assert runner.executor.report() == {"threads": threads, "window": window}
        for name in base:
            assert torch.equal(got[name], base[name]), (threads, window, name)


def test_a_graph_larger_than_the_window_runs_in_its_memory():
    job = resolve("llama7b", device="cpu", backend="c", options={"attention": "split", "fuse": False})
    runner = Runner(job, 1000)
    try:
        inputs = job.program.inputs(job.settings, runner.shape, "cpu", seed=1)
        runner.executor.window = 16
        runner(inputs)
        small = runner.executor.runtime_stats
        runner.executor.window = 1 << 16
        runner.replay()
        whole = runner.executor.runtime_stats
    finally:
        runner.close()
    assert small["tasks_submitted"] == whole["tasks_submitted"] == runner.graph.tasks > 2000
    assert small["bytes_peak"] < whole["bytes_peak"] / 4


def test_region_outside_its_tensor_is_the_builds_error(monkeypatch):
    """The orchestration's run-time region check, reported as the graph build reports it (the
    call site named), after the tasks already submitted have drained."""
    from pto.incore.softmax import softmax_tile

    from pto import Orchestration, f32
    from pto.engine import execute

    f = softmax_tile(16, f32, rows=8)
    o = Orchestration("overrun")
    n = o.scalar("n")
    x, y = o.input("x", 32, 16, f32), o.output("y", 32, 16, f32)
    with o.for_loop("i", 0, n) as i:
        o.call(f, {"x": (x, i * 8, 0, 8, 16), "y": (y, i * 8, 0, 8, 16)})
    with pytest.raises(RegionError, match="softmax_tile"):
        execute(o.module(), {"n": 5}, {"x": torch.randn(32, 16)}, device="cpu", backend="c")


def test_ctrl_c_cancels_the_run():
    """SIGINT during a long run: the tasks not started complete without running, the build
    finishes through the window, KeyboardInterrupt reaches the caller promptly, and the next
    run is complete and correct."""
    job = resolve("llama7b", device="cpu", backend="c", options={"attention": "split", "fuse": False})
    # 4,000 rows: a run of about 0.15 s here, so that the signal's delivery and the cancel (a few
    # ms) are well inside it on a busy 2-core machine (2,000 rows ran 0.05 s and flaked)
    runner = Runner(job, 4000)
    try:
        inputs = job.program.inputs(job.settings, runner.shape, "cpu", seed=2)
        runner(inputs)  # compiled and run once
        t0 = time.perf_counter()
        runner.replay()
        full = time.perf_counter() - t0
        timer = threading.Timer(full / 4, signal.raise_signal, (signal.SIGINT,))
        # (Python's handler, as under a terminal: a suite started as a background job of a shell
        # without job control ignores SIGINT)
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            timer.start()
            t0 = time.perf_counter()
            with pytest.raises(KeyboardInterrupt):
                runner.replay()
            assert time.perf_counter() - t0 < full
            timer.join()
        finally:
            signal.signal(signal.SIGINT, before)
        runner.replay()  # a whole run again: the same outputs as the first
        want = {k: v.clone() for k, v in runner.tensors.items()}
        runner.replay()
        assert all(torch.equal(runner.tensors[k], want[k]) for k in want)
    finally:
        runner.close()


def test_default_threads(monkeypatch):
    monkeypatch.setenv("PTO_THREADS", "3")
    assert NativeExecutor(None, {}).threads == 3
    monkeypatch.delenv("PTO_THREADS")
    assert NativeExecutor(None, {}).threads == physical_cores() >= 1
    monkeypatch.setenv("PTO_THREADS", "zero")
    from pto.errors import UsageError

    with pytest.raises(UsageError, match="PTO_THREADS"):
        NativeExecutor(None, {})


def test_records_trace_the_run_and_follow_the_graph(tmp_path):
    """With records (--trace, --check-schedule, --profile) every task's run is recorded with its
    thread: each task once, after its predecessors ended, never beside a task it conflicts with
    (the schedule check against the graph); the trace has a lane per thread."""
    import json

    from pto.exec.trace import write_trace
    from pto.safety.trace_check import verify_schedule

    job = resolve("llama7b", device="cpu", backend="c", options={"attention": "split", "fuse": False})
    runner = Runner(job, 300, record=True)
    try:
        runner.executor.threads = 3
        runner(job.program.inputs(job.settings, runner.shape, "cpu", seed=4))
        records = runner.stats.records
        assert sorted(r.task for r in records) == list(range(runner.graph.tasks))
        assert {r.program for r in records} <= {0, 1, 2}
        assert verify_schedule(runner.graph.runtime.export(), records).ok
        info = write_trace(tmp_path / "t.json", records, runner.graph)
        assert info.tasks == runner.graph.tasks
        lanes = {e["args"]["name"] for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
                 if e.get("name") == "thread_name"}
        assert lanes <= {"program 0", "program 1", "program 2"}
        profile = runner.profile(1)
        assert set(profile) >= {"matmul_tile", "flash_score"} and all(ms > 0 for ms in profile.values())
    finally:
        runner.close()


def test_progress_counts_the_tasks_as_they_complete():
    """A progress callback (the command line's lines and bar) hears the completed tasks while the
    run goes on, never more than the graph's, and the whole graph at its end."""
    job = resolve("llama7b", device="cpu", backend="c", options={"attention": "split", "fuse": False})
    runner = Runner(job, 1000)
    heard = []
    try:
        runner.executor.progress = lambda done, total: heard.append((done, total))
        runner(job.program.inputs(job.settings, runner.shape, "cpu", seed=2))
        tasks = runner.executor.graph.tasks
    finally:
        runner.close()
    assert heard and heard[-1] == (tasks, tasks)
    assert all(total == tasks and 0 <= done <= tasks for done, total in heard)
    assert [d for d, _ in heard] == sorted(d for d, _ in heard)
