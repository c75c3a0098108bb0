"""Tests of the C runtime through pto.runtime: dependency semantics against a brute-force
element-by-element oracle, execution order, windows and retirement, misuse, dumps.

Graphs are built from "programs": a list of tasks, each a list of region accesses
``(kind, tensor, row0, col0, rows, cols)`` with kind in ``in``/``out``/``inout``.
"""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pto.errors import ParseError, RuntimeStatusError
from pto.runtime import (
    ERR_INVALID,
    ERR_REGION,
    ERR_STATE,
    ERR_UNKNOWN_FUNC,
    ERR_UNKNOWN_TASK,
    ERR_UNKNOWN_TENSOR,
    ERR_WINDOW_FULL,
    TASK_COMPLETED,
    TASK_READY,
    TASK_RUNNING,
    TASK_SUBMITTED,
    Runtime,
    load_runtime_module,
)
from pto.runtime.dump import read_dump

Access = tuple[str, int, int, int, int, int]
Program = list[list[Access]]


@pytest.fixture(scope="module")
def mod():
    return load_runtime_module()


# ------------------------------------------------------------------------------------------
# helpers: building, the oracle, execution
# ------------------------------------------------------------------------------------------

def build(rt: Runtime, shapes: list[tuple[int, int]], program: Program) -> tuple[list[int], int]:
    """Register tensors t0.. and one function, submit every task; returns (tensor ids, func id)."""
    tids = [rt.register_tensor(f"t{i}", r, c, 4) for i, (r, c) in enumerate(shapes)]
    f = rt.register_func("f")
    for args in program:
        submit_task(rt, f, tids, args)
    return tids, f


def submit_task(rt: Runtime, f: int, tids: list[int], args: list[Access]) -> int:
    t = rt.task(f)
    for kind, tensor, r0, c0, nr, nc in args:
        add = {"in": rt.add_input, "out": rt.add_output, "inout": rt.add_inout}[kind]
        add(t, tids[tensor], r0, c0, nr, nc)
    rt.submit(t)
    return t


def oracle_edges(shapes: list[tuple[int, int]], program: Program) -> set[tuple[int, int]]:
    """Sequential task flow element by element: a reader depends on the last writer, a writer
    on the last writer and every reader since; regions resolve against the state before the task."""
    last = [np.full(s, -1, dtype=np.int64) for s in shapes]
    readers = [[[set() for _ in range(s[1])] for _ in range(s[0])] for s in shapes]
    edges: set[tuple[int, int]] = set()
    for tid, args in enumerate(program):
        deps: set[int] = set()
        for kind, t, r0, c0, nr, nc in args:
            for r in range(r0, r0 + nr):
                for c in range(c0, c0 + nc):
                    if last[t][r, c] >= 0:
                        deps.add(int(last[t][r, c]))
                    if kind != "in":
                        deps |= readers[t][r][c]
        for kind, t, r0, c0, nr, nc in args:
            if kind == "in":
                for r in range(r0, r0 + nr):
                    for c in range(c0, c0 + nc):
                        readers[t][r][c].add(tid)
        for kind, t, r0, c0, nr, nc in args:
            if kind != "in":
                last[t][r0:r0 + nr, c0:c0 + nc] = tid
                for r in range(r0, r0 + nr):
                    for c in range(c0, c0 + nc):
                        readers[t][r][c] = set()
        deps.discard(tid)
        edges |= {(d, tid) for d in deps}
    return edges


def run_task(state: list[np.ndarray], tid: int, args: list[Access]) -> None:
    """Reads every input element, then writes a hash of (task id, inputs) into its outputs."""
    seen = [tid]
    for kind, t, r0, c0, nr, nc in args:
        if kind != "out":
            seen.extend(state[t][r0:r0 + nr, c0:c0 + nc].ravel().tolist())
    h = hash(tuple(seen)) & 0x7FFFFFFFFFFF
    for k, (kind, t, r0, c0, nr, nc) in enumerate(args):
        if kind != "in":
            state[t][r0:r0 + nr, c0:c0 + nc] = h + k


def sequential_state(shapes, program) -> list[np.ndarray]:
    state = [np.arange(r * c, dtype=np.int64).reshape(r, c) for r, c in shapes]
    for tid, args in enumerate(program):
        run_task(state, tid, args)
    return state


def execute_random_order(rt: Runtime, shapes, program, seed: int) -> list[np.ndarray]:
    """Run tasks as the runtime releases them, picking a random ready task each time."""
    rng = random.Random(seed)
    state = [np.arange(r * c, dtype=np.int64).reshape(r, c) for r, c in shapes]
    pool: list[int] = []
    done = 0
    while done < len(program):
        pool.extend(rt.ready_pop().tolist())
        assert pool, f"no ready task after {done} of {len(program)} completed"
        tid = pool.pop(rng.randrange(len(pool)))
        run_task(state, tid, program[tid])
        rt.complete(tid)
        done += 1
    assert rt.ready_count() == 0
    return state


def exported_edges(rt: Runtime) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in rt.export().edges()}


def run_all_in_ready_order(rt: Runtime, n: int) -> list[int]:
    order = []
    while len(order) < n:
        ids = rt.ready_pop()
        assert len(ids) > 0, f"stuck after {len(order)} of {n}"
        order.extend(ids.tolist())
        rt.complete(ids)
    return order


# ------------------------------------------------------------------------------------------
# random programs against the oracle (hypothesis)
# ------------------------------------------------------------------------------------------

@st.composite
def programs(draw, max_tasks: int = 24):
    shapes = draw(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 16)), min_size=1, max_size=3))
    n_tasks = draw(st.integers(1, max_tasks))
    program: Program = []
    for _ in range(n_tasks):
        args = []
        for _ in range(draw(st.integers(1, 4))):
            t = draw(st.integers(0, len(shapes) - 1))
            rows, cols = shapes[t]
            r0 = draw(st.integers(0, rows - 1))
            c0 = draw(st.integers(0, cols - 1))
            nr = draw(st.integers(1, rows - r0))
            nc = draw(st.integers(1, cols - c0))
            args.append((draw(st.sampled_from(["in", "out", "inout"])), t, r0, c0, nr, nc))
        program.append(args)
    return shapes, program


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16))
def test_random_programs_match_oracle_and_sequential_execution(mod, case, seed):
    shapes, program = case
    with Runtime(lib=mod) as rt:
        build(rt, shapes, program)
        edges = exported_edges(rt)
        assert edges == oracle_edges(shapes, program)
        assert rt.stats()["edges"] == len(edges)
        final = execute_random_order(rt, shapes, program, seed)
    for got, want in zip(final, sequential_state(shapes, program)):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_tasks=40), st.integers(1, 6), st.integers(0, 2**16))
def test_random_programs_small_window_single_thread(mod, case, window, seed):
    """A window without sync hooks: build until it is full, then run ready tasks."""
    shapes, program = case
    rng = random.Random(seed)
    state = [np.arange(r * c, dtype=np.int64).reshape(r, c) for r, c in shapes]
    with Runtime(window=window, lib=mod) as rt:
        tids = [rt.register_tensor(f"t{i}", r, c, 4) for i, (r, c) in enumerate(shapes)]
        f = rt.register_func("f")
        pool: list[int] = []
        nxt = done = 0
        while done < len(program):
            if nxt < len(program) and rt.stats()["tasks_live"] < window:
                assert submit_task(rt, f, tids, program[nxt]) == nxt
                nxt += 1
                continue
            pool.extend(rt.ready_pop().tolist())
            assert pool, "window full and nothing ready"
            tid = pool.pop(rng.randrange(len(pool)))
            run_task(state, tid, program[tid])
            rt.complete(tid)
            done += 1
        assert rt.stats()["tasks_retired"] == len(program)
    for got, want in zip(state, sequential_state(shapes, program)):
        np.testing.assert_array_equal(got, want)


def run_concurrent(mod, shapes, program, window: int, seed: int, timeout: float = 20.0):
    """Orchestration on one thread (blocking in task() while the window is full), executor on
    another; returns the final state. A deadlock fails through the timeout."""
    state = [np.arange(r * c, dtype=np.int64).reshape(r, c) for r, c in shapes]
    errors: list[BaseException] = []
    rt = Runtime(window=window, concurrent=True, lib=mod)
    tids = [rt.register_tensor(f"t{i}", r, c, 4) for i, (r, c) in enumerate(shapes)]
    f = rt.register_func("f")

    def orchestrate():
        try:
            for args in program:
                submit_task(rt, f, tids, args)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def execute():
        rng = random.Random(seed)
        done = 0
        deadline = time.monotonic() + timeout
        try:
            while done < len(program):
                ids = rt.ready_pop().tolist()
                if not ids:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"executor: nothing ready after {done} completions")
                    time.sleep(0.0002)
                    continue
                rng.shuffle(ids)
                for tid in ids:
                    run_task(state, tid, program[tid])
                    rt.complete(tid)
                    done += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fn, daemon=True) for fn in (orchestrate, execute)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    hung = [th for th in threads if th.is_alive()]
    assert not hung, "orchestration/executor threads deadlocked"
    assert not errors, errors
    stats = rt.stats()
    rt.close()
    assert stats["tasks_completed"] == len(program)
    return state, stats


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_tasks=40), st.integers(1, 5), st.integers(0, 2**16))
def test_random_programs_concurrent_executor(mod, case, window, seed):
    shapes, program = case
    state, stats = run_concurrent(mod, shapes, program, window, seed)
    assert stats["tasks_live"] == 0
    for got, want in zip(state, sequential_state(shapes, program)):
        np.testing.assert_array_equal(got, want)


def test_concurrent_long_stream_small_window(mod):
    """Many tasks through a 4-slot window: alloc blocks, executor retires, final state exact."""
    rng = random.Random(7)
    shapes = [(8, 8), (8, 8)]
    program: Program = []
    for i in range(1500):
        r = rng.randrange(8)
        program.append([("in", i % 2, r, 0, 1, 8), ("inout", 1 - i % 2, rng.randrange(8), 0, 1, 8)])
    state, stats = run_concurrent(mod, shapes, program, window=4, seed=3)
    assert stats["bytes_peak"] < 400_000
    for got, want in zip(state, sequential_state(shapes, program)):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------------------
# shapes of graphs
# ------------------------------------------------------------------------------------------

def test_chain(mod):
    program = [[("inout", 0, 0, 0, 4, 4)] for _ in range(50)]
    with Runtime(lib=mod) as rt:
        build(rt, [(4, 4)], program)
        assert exported_edges(rt) == {(i, i + 1) for i in range(49)}
        assert run_all_in_ready_order(rt, 50) == list(range(50))


def test_diamond(mod):
    program = [[("out", 0, 0, 0, 2, 4)],
               [("in", 0, 0, 0, 2, 4), ("out", 1, 0, 0, 2, 4)],
               [("in", 0, 0, 0, 2, 4), ("out", 1, 2, 0, 2, 4)],
               [("in", 1, 0, 0, 4, 4)]]
    with Runtime(lib=mod) as rt:
        build(rt, [(2, 4), (4, 4)], program)
        assert exported_edges(rt) == {(0, 1), (0, 2), (1, 3), (2, 3)}
        order = run_all_in_ready_order(rt, 4)
        assert order[0] == 0 and order[-1] == 3


def test_binary_tree_reduction(mod):
    """Leaves write one row each; every level reads two rows and writes one row of the next."""
    n = 64
    shapes, program, level_base, width = [], [], [], n
    while width >= 1:
        shapes.append((width, 4))
        width //= 2
    for r in range(n):
        program.append([("out", 0, r, 0, 1, 4)])
    level_base.append(0)
    for lvl in range(1, len(shapes)):
        level_base.append(len(program))
        for r in range(shapes[lvl][0]):
            program.append([("in", lvl - 1, 2 * r, 0, 2, 4), ("out", lvl, r, 0, 1, 4)])
    with Runtime(lib=mod) as rt:
        build(rt, shapes, program)
        want = set()
        for lvl in range(1, len(shapes)):
            for r in range(shapes[lvl][0]):
                me = level_base[lvl] + r
                want |= {(level_base[lvl - 1] + 2 * r, me), (level_base[lvl - 1] + 2 * r + 1, me)}
        assert exported_edges(rt) == want == oracle_edges(shapes, program)
        order = run_all_in_ready_order(rt, len(program))
        pos = {t: i for i, t in enumerate(order)}
        assert all(pos[a] < pos[b] for a, b in want)


def test_one_producer_many_consumers(mod):
    n = 12_000
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 16, 16, 4)
        y = rt.register_tensor("y", n, 1, 4)
        f = rt.register_func("f")
        t = rt.task(f)
        rt.add_output(t, x, 0, 0, 16, 16)
        rt.submit(t)
        for i in range(n):
            t = rt.task(f)
            rt.add_input(t, x, 0, 0, 16, 16)
            rt.add_output(t, y, i, 0, 1, 1)
            rt.submit(t)
        ex = rt.export()
        assert ex.fanout_ptr[1] - ex.fanout_ptr[0] == n
        np.testing.assert_array_equal(ex.fanout_ids[: n], np.arange(1, n + 1))
        assert ex.fanin[0] == 0 and (ex.fanin[1:] == 1).all()
        assert rt.stats()["edges"] == n
        # one entry per row of y, and one for x: its writer and the n readers as one
        # run-length encoded run, not n entries
        assert rt.stats()["map_entries"] == n + 1
        # a writer after all of them depends on every reader (WAR) and on the producer (WAW)
        t = rt.task(f)
        rt.add_output(t, x, 0, 0, 16, 16)
        rt.submit(t)
        assert rt.task_info(t)["fanin"] == n + 1
        order = run_all_in_ready_order(rt, n + 2)
        assert order[0] == 0 and order[-1] == n + 1


def test_one_consumer_many_producers(mod):
    n = 12_000
    with Runtime(lib=mod) as rt:
        y = rt.register_tensor("y", n, 2, 4)
        f = rt.register_func("f")
        for i in range(n):
            t = rt.task(f)
            rt.add_output(t, y, i, 0, 1, 2)
            rt.submit(t)
        c = rt.task(f)
        rt.add_input(c, y, 0, 0, n, 2)
        rt.submit(c)
        info = rt.task_info(c)
        assert info["fanin"] == n and info["pending"] == n and info["state"] == TASK_SUBMITTED
        assert exported_edges(rt) == {(i, n) for i in range(n)}
        order = run_all_in_ready_order(rt, n + 1)
        assert order[-1] == n


# ------------------------------------------------------------------------------------------
# overlap semantics
# ------------------------------------------------------------------------------------------

def test_adaptive_tiles_64_row_read_depends_on_both_32_row_writers(mod):
    with Runtime(lib=mod) as rt:
        build(rt, [(128, 8)], [[("out", 0, 0, 0, 32, 8)], [("out", 0, 32, 0, 32, 8)],
                               [("in", 0, 0, 0, 64, 8)]])
        assert exported_edges(rt) == {(0, 2), (1, 2)}


def test_partial_overwrite_is_exact(mod):
    """W1 writes rows 0-63, W2 rows 0-31, W3 rows 32-63: R of rows 0-63 depends on W2, W3 only."""
    with Runtime(lib=mod) as rt:
        build(rt, [(64, 8)], [[("out", 0, 0, 0, 64, 8)], [("out", 0, 0, 0, 32, 8)],
                              [("out", 0, 32, 0, 32, 8)], [("in", 0, 0, 0, 64, 8)]])
        assert exported_edges(rt) == {(0, 1), (0, 2), (1, 3), (2, 3)}


def test_war_edges(mod):
    with Runtime(lib=mod) as rt:
        w0, r0, w1 = [("out", 0, 0, 0, 32, 32)], [("in", 0, 0, 0, 32, 32)], [("out", 0, 0, 0, 32, 32)]
        build(rt, [(32, 32)], [w0, r0, w1])
        assert exported_edges(rt) == {(0, 1), (0, 2), (1, 2)}


def test_column_blocks_and_small_tiles(mod):
    """Column-tiled writes, a row-band read across them, a read of a sub-tile inside one."""
    program = [[("out", 0, 0, 16 * j, 32, 16)] for j in range(4)]
    program += [[("in", 0, 8, 0, 8, 64)], [("in", 0, 4, 20, 2, 3)], [("out", 0, 0, 0, 64, 64)]]
    with Runtime(lib=mod) as rt:
        build(rt, [(64, 64)], program)
        assert exported_edges(rt) == oracle_edges([(64, 64)], program)


def test_no_self_dependency_and_duplicate_edges_collapse(mod):
    program = [[("out", 0, 0, 0, 8, 8), ("out", 1, 0, 0, 8, 8)],
               # reads and writes overlapping regions of t0 through different args, twice t1
               [("in", 0, 0, 0, 8, 8), ("out", 0, 2, 2, 4, 4),
                ("in", 1, 0, 0, 4, 8), ("inout", 1, 4, 0, 4, 8)],
               [("inout", 0, 0, 0, 8, 8)]]
    with Runtime(lib=mod) as rt:
        build(rt, [(8, 8), (8, 8)], program)
        edges = exported_edges(rt)
        assert edges == oracle_edges([(8, 8), (8, 8)], program) == {(0, 1), (0, 2), (1, 2)}
        ex = rt.export()
        assert ex.fanin.tolist() == [0, 1, 2]


def test_scalars_kept_in_order_with_regions(mod):
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 4, 4, 2)
        f = rt.register_func("g")
        t = rt.task(f, buffer_bytes=512)
        rt.add_scalar(t, -7)
        rt.add_input(t, x, 1, 2, 3, 2)
        rt.add_scalar(t, 2**40 + 3)
        rt.submit(t)
        assert rt.task_args(t) == [(3, -1, 0, 0, 0, 0, -7), (0, x, 1, 2, 3, 2, 0),
                                   (3, -1, 0, 0, 0, 0, 2**40 + 3)]
        ex = rt.export()
        assert ex.arg_kind.tolist() == [3, 0, 3]
        assert ex.arg_scalar.tolist() == [-7, 0, 2**40 + 3]
        assert ex.arg_region.tolist() == [[0, 0, 0, 0], [1, 2, 3, 2], [0, 0, 0, 0]]
        assert ex.buffer_bytes.tolist() == [512]
        assert rt.stats()["regions"] == 1 and rt.stats()["scalars"] == 2


# ------------------------------------------------------------------------------------------
# windows, retirement, memory
# ------------------------------------------------------------------------------------------

def stream(rt: Runtime, n: int, rows: int) -> list[int]:
    """Build a rolling graph, completing ready tasks whenever the window is full; returns the
    peak bytes after every 5000 tasks."""
    x = rt.register_tensor("x", rows, 64, 4)
    y = rt.register_tensor("y", 4, 64, 4)
    f = rt.register_func("step")
    peaks = []
    for i in range(n):
        while True:
            try:
                t = rt.task(f)
                break
            except RuntimeStatusError as exc:
                assert exc.status == ERR_WINDOW_FULL
                rt.complete(rt.ready_pop())
        rt.add_input(t, x, (i + rows - 1) % rows, 0, 1, 64)
        rt.add_input(t, y, 0, 0, 4, 64)
        rt.add_output(t, x, i % rows, 0, 1, 64)
        rt.submit(t)
        if i % 5000 == 4999:
            peaks.append(rt.stats()["bytes_peak"])
    return peaks


def test_windowed_memory_stays_bounded(mod):
    n = 40_000
    with Runtime(window=64, lib=mod) as rt:
        peaks = stream(rt, n, rows=100_000)
        s = rt.stats()
    assert s["tasks_submitted"] == n and s["tasks_retired"] >= n - 64
    # each task writes a new row of x: without reclaiming the entries of retired tasks the
    # map would hold one entry per task
    assert s["map_entries_peak"] < n // 2
    assert peaks[-1] == peaks[len(peaks) // 2], peaks


def test_window_zero_keeps_everything(mod):
    with Runtime(lib=mod) as rt:
        build(rt, [(4, 4)], [[("inout", 0, 0, 0, 4, 4)]] * 100)
        run_all_in_ready_order(rt, 100)
        s = rt.stats()
        assert s["tasks_retired"] == 0 and s["tasks_live"] == 100 and s["edges_live"] == 99
        assert rt.export().state.tolist() == [TASK_COMPLETED] * 100


def test_count_only_counts_in_constant_memory(mod):
    with Runtime(count_only=True, lib=mod) as rt:
        x = rt.register_tensor("x", 1 << 20, 128, 2)
        f = rt.register_func("f")
        for i in range(20_000):
            t = rt.task(f)
            rt.add_input(t, x, i, 0, 1, 128)
            rt.add_output(t, x, i + 1, 0, 1, 128)
            rt.add_scalar(t, i)
            rt.submit(t)
            if i == 99:
                early = rt.stats()["bytes"]
        s = rt.stats()
        assert (s["tasks_submitted"], s["regions"], s["scalars"], s["edges"]) == (20_000, 40_000, 20_000, 0)
        assert s["bytes"] == early
        with pytest.raises(RuntimeStatusError, match="outside the tensor") as err:
            t = rt.task(f)
            rt.add_input(t, x, 1 << 20, 0, 1, 128)
        assert err.value.status == ERR_REGION
        assert len(rt.ready_pop()) == 0


def test_reset_reuses_memory(mod):
    with Runtime(lib=mod) as rt:
        build(rt, [(64, 64)], [[("inout", 0, 0, 0, 8, 8)], [("in", 0, 0, 0, 64, 64)]] * 500)
        first = rt.stats()
        rt.reset()
        tids, _ = build(rt, [(64, 64)], [[("inout", 0, 0, 0, 8, 8)], [("in", 0, 0, 0, 64, 64)]] * 500)
        again = rt.stats()
        assert tids == [0]
        assert again["edges"] == first["edges"] and again["tasks_submitted"] == 1000
        # only the list of kept chunks is new; the graph itself reused the first one's memory
        assert again["bytes_peak"] - first["bytes_peak"] < 1024


# ------------------------------------------------------------------------------------------
# limits and misuse: status codes and messages
# ------------------------------------------------------------------------------------------

def expect(status: int, pattern: str):
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(RuntimeStatusError, match=pattern)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.cm.__exit__(*exc)
            assert self.info.value.status == status, (self.info.value.status, str(self.info.value))
            return handled

    return _Ctx()


def test_window_full_without_hooks(mod):
    with Runtime(window=2, lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        for _ in range(2):
            t = rt.task(f)
            rt.add_inout(t, x, 0, 0, 8, 8)
            rt.submit(t)
        with expect(ERR_WINDOW_FULL, r"window full: all 2 slots .*ids 0\.\.1.*oldest task 0 is ready"):
            rt.task(f)
        rt.complete(rt.ready_pop())
        t = rt.task(f)  # task 0 retired: a slot is free
        assert t == 2


def test_unknown_ids(mod):
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        with expect(ERR_UNKNOWN_FUNC, r"unknown function id 5 \(1 functions registered\)"):
            rt.task(5)
        t = rt.task(f)
        with expect(ERR_UNKNOWN_TENSOR, r"task 0: unknown tensor id 3 \(1 tensors registered\)"):
            rt.add_input(t, 3, 0, 0, 1, 1)
        with expect(ERR_UNKNOWN_TASK, r"unknown task id 9 \(1 tasks allocated\)"):
            rt.add_input(9, x, 0, 0, 1, 1)
        with expect(ERR_UNKNOWN_TASK, r"complete: unknown task id 42"):
            rt.complete(42)
        rt.submit(t)


def test_region_outside_tensor_names_tensor_shape_and_region(mod):
    with Runtime(lib=mod) as rt:
        q = rt.register_tensor("q_rope", 1000, 128, 2)
        f = rt.register_func("rope_tile")
        t = rt.task(f)
        with expect(ERR_REGION, r"task 0 \(rope_tile\) output on tensor 'q_rope': region rows 960\.\.1024 x "
                                r"cols 0\.\.128 is outside the tensor \(1000 x 128\)"):
            rt.add_output(t, q, 960, 0, 64, 128)
        with expect(ERR_REGION, r"region extent 0 x 128 must be positive"):
            rt.add_input(t, q, 0, 0, 0, 128)
        with expect(ERR_REGION, r"region extent 4 x -1 must be positive"):
            rt.add_input(t, q, 0, 0, 4, -1)
        with expect(ERR_REGION, r"rows -1\.\.3"):
            rt.add_inout(t, q, -1, 0, 4, 4)


I64_MAX, I64_MIN, I32_MAX = 2**63 - 1, -2**63, 2**31 - 1

# Regions no 8 x 8 tensor holds, at and near the int64 limits (ends past INT64_MAX are shown
# exactly, never wrapped), with negative or zero extents, and values that int32 truncation
# would turn into valid ones; the message after "task 0 (f) <kind> on tensor 'x': ".
EXTREME_REGIONS = [
    ((I64_MAX, 0, 1, 1), "region rows 9223372036854775807..9223372036854775808 x cols 0..1 is outside the tensor "
                         "(8 x 8)"),
    ((0, I64_MAX, 1, 1), "region rows 0..1 x cols 9223372036854775807..9223372036854775808 is outside"),
    ((I64_MAX, I64_MAX, I64_MAX, I64_MAX), "region rows 9223372036854775807..18446744073709551614 x cols "
                                           "9223372036854775807..18446744073709551614 is outside"),
    ((0, 0, I64_MAX, 1), "region rows 0..9223372036854775807 x cols 0..1 is outside"),
    ((1, 0, I64_MAX, 1), "region rows 1..9223372036854775808 x cols 0..1 is outside"),
    ((I64_MAX - 7, 0, 8, 8), "region rows 9223372036854775800..9223372036854775808 x cols 0..8 is outside"),
    ((I64_MIN, 0, 1, 1), "region rows -9223372036854775808..-9223372036854775807 x cols 0..1 is outside"),
    ((I64_MIN, I64_MIN, I64_MAX, I64_MAX), "region rows -9223372036854775808..-1 x cols -9223372036854775808..-1 "
                                           "is outside"),
    ((2**32, 0, 1, 1), "region rows 4294967296..4294967297 x cols 0..1 is outside"),
    ((0, 0, 2**32 + 8, 8), "region rows 0..4294967304 x cols 0..8 is outside"),
    ((-4, 0, 8, 8), "region rows -4..4 x cols 0..8 is outside"),
    ((7, 7, 2, 1), "region rows 7..9 x cols 7..8 is outside the tensor (8 x 8)"),
    ((0, 0, 0, 1), "region extent 0 x 1 must be positive"),
    ((0, 0, I64_MIN, I64_MIN), "region extent -9223372036854775808 x -9223372036854775808 must be positive"),
    ((I64_MAX, I64_MAX, I64_MIN, 1), "region extent -9223372036854775808 x 1 must be positive"),
    ((0, 0, 1, -(2**32) + 8), "region extent 1 x -4294967288 must be positive"),
]


@pytest.mark.parametrize("config", [{}, {"window": 2}, {"count_only": True}, {"concurrent": True}])
@pytest.mark.parametrize("kind", ["input", "output", "inout"])
def test_extreme_regions_are_refused_with_exact_messages(mod, config, kind):
    with Runtime(lib=mod, **config) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        t = rt.task(f)
        rt.add_output(t, x, 4, 4, 4, 4)  # a whole grid cell: arms the exact-cell fast path
        add = getattr(rt, f"add_{kind}")
        for region, text in EXTREME_REGIONS:
            with expect(ERR_REGION, "^" + re.escape(f"task 0 (f) {kind} on tensor 'x': {text}")):
                add(t, x, *region)
        rt.add_input(t, x, 0, 0, 4, 4)  # the open task is unharmed
        rt.submit(t)
        s = rt.stats()
        assert (s["tasks_submitted"], s["regions"], s["edges"]) == (1, 2, 0)
        if not config.get("count_only"):
            assert [a[2:6] for a in rt.task_args(t)] == [(4, 4, 4, 4), (0, 0, 4, 4)]


def test_huge_tensors(mod):
    """The largest shape: regions touching the last row and column resolve exactly; one more
    row is refused naming the region and the shape."""
    m, h = I32_MAX, 2**30
    with Runtime(lib=mod) as rt:
        with expect(ERR_INVALID, r"^tensor 'big': shape 2147483648 x 1 must be positive and at most 2147483647 per "
                                 r"dimension$"):
            rt.register_tensor("big", m + 1, 1, 4)
        x = rt.register_tensor("x", m, m, 8)
        f = rt.register_func("f")
        program = [[("out", 0, 0, 0, m, m)], [("in", 0, m - 1, m - 1, 1, 1)], [("out", 0, m - 1, 0, 1, m)],
                   [("in", 0, 0, 0, 1, 1)], [("in", 0, 0, 0, m, m)], [("inout", 0, h, h, h - 1, h - 1)]]
        for args in program:
            submit_task(rt, f, [x], args)
        t = rt.task(f)
        with expect(ERR_REGION, r"^task 6 \(f\) input on tensor 'x': region rows 2147483647\.\.2147483648 x cols "
                                r"0\.\.1 is outside the tensor \(2147483647 x 2147483647\)$"):
            rt.add_input(t, x, m, 0, 1, 1)
        rt.submit(t)
        # 5 overwrites the lower right quarter: after 0 (everywhere) and 2 (last row), and after
        # 4 read it; 1 read the last element before 2 overwrote it, so no edge 1 -> 5
        assert exported_edges(rt) == {(0, 1), (0, 2), (1, 2), (0, 3), (0, 4), (2, 4), (0, 5), (2, 5), (4, 5)}


def test_add_after_submit_and_submit_twice(mod):
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        t = rt.task(f)
        rt.add_output(t, x, 0, 0, 8, 8)
        rt.submit(t)
        with expect(ERR_STATE, r"add region: task 0 \(f\) was already submitted; its state is ready"):
            rt.add_input(t, x, 0, 0, 1, 1)
        with expect(ERR_STATE, r"add scalar: task 0 \(f\) was already submitted"):
            rt.add_scalar(t, 1)
        with expect(ERR_STATE, r"submit: task 0 \(f\) was already submitted"):
            rt.submit(t)
        t2 = rt.task(f)
        with expect(ERR_STATE, r"task 1 \(f\) is still open; submit it before allocating"):
            rt.task(f)
        rt.submit(t2)


def test_complete_misuse(mod):
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        ids = [submit_task(rt, f, [x], [("inout", 0, 0, 0, 8, 8)]) for _ in range(2)]
        assert rt.task_info(ids[0])["state"] == TASK_READY
        with expect(ERR_STATE, r"task 0 \(f\) is ready \(queued, not popped\); only tasks handed out by "
                               r"pto_ready_pop can complete"):
            rt.complete(0)
        with expect(ERR_STATE, r"task 1 \(f\) is not ready: 1 of its 1 predecessors have not completed"):
            rt.complete(1)
        rt.complete(rt.ready_pop())
        with expect(ERR_STATE, r"complete: task 0 \(f\) was already completed"):
            rt.complete(0)
        t = rt.task(f)
        with expect(ERR_STATE, r"task 2 \(f\) is open \(allocated, not submitted\)"):
            rt.complete(t)


def test_complete_twice_after_retirement(mod):
    with Runtime(window=4, lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        submit_task(rt, f, [x], [("inout", 0, 0, 0, 8, 8)])
        rt.complete(rt.ready_pop())
        with expect(ERR_STATE, r"task 0 was already completed \(it has retired\)"):
            rt.complete(0)
        with expect(ERR_UNKNOWN_TASK, r"task 0 has retired from the window"):
            rt.task_info(0)


def test_names_must_be_identifiers(mod):
    with Runtime(lib=mod) as rt:
        with expect(ERR_INVALID, r"tensor name 'my x' is not an identifier"):
            rt.register_tensor("my x", 4, 4, 4)
        with expect(ERR_INVALID, r"function name 'f\tg' is not an identifier"):
            rt.register_func("f\tg")
        with expect(ERR_INVALID, r"function name is empty"):
            rt.register_func("")
        with expect(ERR_INVALID, r"tensor name '9lives' is not an identifier"):
            rt.register_tensor("9lives", 4, 4, 4)
        x = rt.register_tensor("x", 4, 4, 4)
        with expect(ERR_INVALID, r"tensor 'x' is already registered \(id 0\)"):
            rt.register_tensor("x", 8, 8, 4)
        with expect(ERR_INVALID, r"tensor 'y': shape 0 x 4 must be positive"):
            rt.register_tensor("y", 0, 4, 4)
        assert rt.register_func("f") == rt.register_func("f") == 0
        assert x == 0


def test_status_codes_and_task_states_come_from_the_header(mod):
    """pto.runtime's OK/ERR_*/TASK_* are the header's enums, read from the compiled library, and
    the C status names agree with the enum (the header is the one place that defines them)."""
    import pto.runtime as binding

    header = (Path(binding.runtime_include_dir()) / "pto_runtime_api.h").read_text()
    for enum, prefix in (("pto_status", "PTO_(OK|ERR_)"), ("pto_task_state", "PTO_TASK_")):
        body = re.search(r"typedef enum \{([^}]*)\} " + enum + ";", header).group(1)
        declared = {name: int(value) for name, value in re.findall(r"(PTO_\w+) = (-?\d+)", body)}
        assert declared and all(re.match(prefix, name) for name in declared)
        assert mod.ffi.typeof(enum).relements == declared
        for name, value in declared.items():
            assert getattr(binding, name.removeprefix("PTO_")) == value == getattr(mod.lib, name)
            if enum == "pto_status":
                assert mod.ffi.string(mod.lib.pto_status_name(value)).decode() == name
    assert (binding.OK, binding.ERR_REGION, binding.TASK_READY) == (0, ERR_REGION, TASK_READY) == (0, -7, 3)
    with Runtime(lib=mod) as rt:
        assert rt.api.status_name(-11) == rt.api.status_name(1) == "PTO_ERR_UNKNOWN_STATUS"
    for gone in ("ARG_SCALAR", "ARG_KIND_NAMES", "ERR_NONE", "TASK_", "PTO_OK"):
        assert not hasattr(binding, gone)


def test_bad_config(mod):
    with pytest.raises(RuntimeStatusError, match="cannot create the runtime") as err:
        Runtime(window=-1, lib=mod)
    assert err.value.status == ERR_INVALID


# ------------------------------------------------------------------------------------------
# arguments the binding refuses before C sees them (ERR_INVALID, never a cffi exception)
# ------------------------------------------------------------------------------------------

I32 = r"does not fit int32_t \(-2147483648\.\.2147483647\)"
I64 = r"does not fit int64_t \(-9223372036854775808\.\.9223372036854775807\)"
BIG = 2**40


@pytest.fixture()
def open_task(mod):
    """A runtime with tensor x (8 x 8), function f and task 0 open."""
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        yield rt, x, f, rt.task(f)


@pytest.mark.parametrize("call,pattern", [
    (lambda rt, x, f, t: rt.register_tensor("y", 2**63, 4, 4), rf"tensor 'y': rows {2**63} {I64}"),
    (lambda rt, x, f, t: rt.register_tensor("y", 4, -2**63 - 1, 4), rf"tensor 'y': cols {-2**63 - 1} {I64}"),
    (lambda rt, x, f, t: rt.register_tensor("y", 4, 4, BIG), rf"tensor 'y': elem_size {BIG} {I32}"),
    (lambda rt, x, f, t: rt.task(BIG), rf"pto_task_alloc: function id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.task(f, buffer_bytes=2**31), rf"pto_task_alloc: buffer_bytes {2**31} {I32}"),
    (lambda rt, x, f, t: rt.add_input(BIG, x, 0, 0, 1, 1), rf"pto_task_add_input: task id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.add_output(t, -2**31 - 1, 0, 0, 1, 1),
     rf"pto_task_add_output: tensor id {-2**31 - 1} {I32}"),
    (lambda rt, x, f, t: rt.add_inout(t, x, 2**64, 0, 1, 1), rf"pto_task_add_inout: row0 {2**64} {I64}"),
    (lambda rt, x, f, t: rt.add_input(t, x, 0, 2**63, 1, 1), rf"pto_task_add_input: col0 {2**63} {I64}"),
    (lambda rt, x, f, t: rt.add_input(t, x, 0, 0, 2**70, 1), rf"pto_task_add_input: rows {2**70} {I64}"),
    (lambda rt, x, f, t: rt.add_input(t, x, 0, 0, 1, -2**70), rf"pto_task_add_input: cols {-2**70} {I64}"),
    (lambda rt, x, f, t: rt.add_scalar(BIG, 1), rf"pto_task_add_scalar: task id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.add_scalar(t, 2**63), rf"pto_task_add_scalar: value {2**63} {I64}"),
    (lambda rt, x, f, t: rt.add_scalar(t, np.uint64(2**64 - 1)), rf"pto_task_add_scalar: value {2**64 - 1} {I64}"),
    (lambda rt, x, f, t: rt.submit(BIG), rf"pto_task_submit: task id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.ready_pop(BIG), rf"pto_ready_pop: max {BIG} {I32}"),
    (lambda rt, x, f, t: rt.complete(BIG), rf"complete: task id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.task_info(BIG), rf"pto_task_query: task id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.task_args(-BIG), rf"pto_task_args: task id {-BIG} {I32}"),
    (lambda rt, x, f, t: rt.api.tensor_get(rt.ptr, BIG), rf"pto_tensor_get: tensor id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.api.func_get(rt.ptr, BIG), rf"pto_func_get: function id {BIG} {I32}"),
    (lambda rt, x, f, t: rt.api.status_name(BIG), rf"pto_status_name: status {BIG} {I32}"),
])
def test_out_of_range_integers(open_task, call, pattern):
    rt, x, f, t = open_task
    with expect(ERR_INVALID, "^" + pattern + "$"):
        call(rt, x, f, t)
    rt.add_output(t, x, 0, 0, 8, 8)  # the runtime is unharmed
    rt.submit(t)
    assert rt.stats()["tasks_submitted"] == 1


NOT_INT = "must be an integer, got"


@pytest.mark.parametrize("call,pattern", [
    (lambda rt, x, f, t: rt.register_tensor("y", 4.0, 4, 4), rf"tensor 'y': rows {NOT_INT} float 4\.0"),
    (lambda rt, x, f, t: rt.register_tensor("y", 4, 4, True), rf"tensor 'y': elem_size {NOT_INT} bool True"),
    (lambda rt, x, f, t: rt.task("0"), rf"pto_task_alloc: function id {NOT_INT} str '0'"),
    (lambda rt, x, f, t: rt.task(f, True), rf"pto_task_alloc: buffer_bytes {NOT_INT} bool True"),
    (lambda rt, x, f, t: rt.add_input(t, x, 0.5, 0, 1, 1), rf"pto_task_add_input: row0 {NOT_INT} float 0\.5"),
    (lambda rt, x, f, t: rt.add_input(t, x, 0, 0, np.float64(1), 1), rf"pto_task_add_input: rows {NOT_INT} float64"),
    (lambda rt, x, f, t: rt.add_inout(t, x, 0, 0, 1, np.True_), rf"pto_task_add_inout: cols {NOT_INT} bool"),
    (lambda rt, x, f, t: rt.add_scalar(t, 1.5), rf"pto_task_add_scalar: value {NOT_INT} float 1\.5"),
    (lambda rt, x, f, t: rt.add_scalar(t, False), rf"pto_task_add_scalar: value {NOT_INT} bool False"),
    (lambda rt, x, f, t: rt.submit(None), rf"pto_task_submit: task id {NOT_INT} NoneType None"),
    (lambda rt, x, f, t: rt.ready_pop(1.5), rf"pto_ready_pop: max {NOT_INT} float 1\.5"),
    (lambda rt, x, f, t: rt.task_info("0"), rf"pto_task_query: task id {NOT_INT} str '0'"),
])
def test_non_integer_arguments(open_task, call, pattern):
    rt, x, f, t = open_task
    with expect(ERR_INVALID, pattern):
        call(rt, x, f, t)
    assert rt.task_args(t) == []


def test_numpy_integers_and_int64_extremes_are_accepted(open_task):
    rt, x, f, t = open_task
    rt.add_input(np.int32(t), np.int64(x), np.uint8(0), np.int16(0), np.int64(8), np.uint64(8))
    rt.add_scalar(t, -2**63)
    rt.add_scalar(t, np.int64(2**63 - 1))
    rt.submit(np.int32(t))
    assert [a[6] for a in rt.task_args(t)] == [0, -2**63, 2**63 - 1]
    assert rt.task_info(np.int64(t))["n_args"] == 3
    assert rt.register_tensor("y", np.int64(2**31 - 1), 1, np.int8(2)) == 1


def test_window_out_of_range_or_not_an_integer(mod):
    with expect(ERR_INVALID, rf"^Runtime: window {BIG} {I32}$"):
        Runtime(window=BIG, lib=mod)
    with expect(ERR_INVALID, r"^Runtime: window must be an integer, got float 4\.0$"):
        Runtime(window=4.0, lib=mod)
    with expect(ERR_INVALID, r"^Runtime: window must be an integer, got bool True$"):
        Runtime(window=True, concurrent=True, lib=mod)
    with Runtime(window=np.int64(4), lib=mod) as rt:
        assert rt.stats()["window"] == 4


def test_names_with_nul_or_not_str(mod):
    rule = r"\(letters, digits and '_', not starting with a digit, no whitespace, at most 255 characters\)"
    with Runtime(lib=mod) as rt:
        with expect(ERR_INVALID, r"^tensor name 'a\\x00b' is not an identifier: it contains a NUL character " + rule):
            rt.register_tensor("a\0b", 4, 4, 4)
        with expect(ERR_INVALID, r"^function name 'f\\x00' is not an identifier: it contains a NUL character"):
            rt.register_func("f\0")
        with expect(ERR_INVALID, r"^tensor name '\\udcff' is not an identifier " + rule):
            rt.register_tensor("\udcff", 4, 4, 4)
        with expect(ERR_INVALID, r"^tensor name must be a str, got bytes b'a'$"):
            rt.register_tensor(b"a", 4, 4, 4)
        with expect(ERR_INVALID, r"^function name must be a str, got NoneType None$"):
            rt.register_func(None)
        # nothing was registered under the truncated names
        assert rt.register_tensor("a", 4, 4, 4) == 0
        assert rt.register_func("f") == 0
        assert rt.export().tensors == [("a", 4, 4, 4)] and rt.export().funcs == ["f"]


def _running_pair(rt: Runtime) -> list[int]:
    """Two independent tasks, popped (running)."""
    x = rt.register_tensor("x", 8, 8, 4)
    f = rt.register_func("f")
    ids = [submit_task(rt, f, [x], [("out", 0, 4 * i, 0, 4, 8)]) for i in range(2)]
    assert rt.ready_pop().tolist() == ids
    return ids


@pytest.mark.parametrize("ids,pattern", [
    (np.array([0.5]), r"^complete: task ids must be integers, got a float64 array \[0\.5\]$"),
    (np.array([0.0, 1.0]), r"^complete: task ids must be integers, got a float64 array \[0\. 1\.\]$"),
    (np.array([True]), r"^complete: task ids must be integers, got a bool array \[ True\]$"),
    (np.array([[0, 1]], np.int32), r"^complete: task ids must be a 1-D array, got shape \(1, 2\)$"),
    ([0, 0.5], r"^complete: task id must be an integer, got float 0\.5$"),
    ((0, True), r"^complete: task id must be an integer, got bool True$"),
    (0.5, r"^complete: task ids must be an integer or an iterable of integers, got float 0\.5$"),
    (np.float32(1.0), r"^complete: task ids must be an integer or an iterable of integers, got float32"),
    (np.array(0.0), r"^complete: task id must be an integer, got ndarray array\(0\.\)$"),
    (True, r"^complete: task id must be an integer, got bool True$"),
    ("0", r"^complete: task ids must be integers, got str '0'$"),
    ([0, BIG], rf"^complete: task id {BIG} {I32}$"),
    (np.array([0, BIG]), rf"^complete: task id {BIG} {I32}$"),
    (np.array([0, -BIG]), rf"^complete: task id {-BIG} {I32}$"),
    (np.array([0, 2**64 - 1], np.uint64), rf"^complete: task id {2**64 - 1} {I32}$"),
    (np.array([0, 2**70], dtype=object), rf"^complete: task id {2**70} {I32}$"),
])
def test_complete_refuses_non_integer_and_out_of_range_ids(mod, ids, pattern):
    with Runtime(lib=mod) as rt:
        running = _running_pair(rt)
        with expect(ERR_INVALID, pattern):
            rt.complete(ids)
        # refused before C: nothing completed (0.5 was not truncated to task 0)
        assert [rt.task_info(t)["state"] for t in running] == [TASK_RUNNING, TASK_RUNNING]
        rt.complete(np.array(running, np.int64))
        assert rt.stats()["tasks_completed"] == 2


@pytest.mark.parametrize("ids", [-1, np.int64(-1), [-1], np.array([-1], np.int32), np.array([-1], np.int64)])
def test_complete_negative_ids_reported_by_the_runtime(mod, ids):
    with Runtime(lib=mod) as rt:
        _running_pair(rt)
        with expect(ERR_UNKNOWN_TASK, r"^complete: unknown task id -1 \(2 tasks allocated\)$"):
            rt.complete(ids)


@pytest.mark.parametrize("ids", [np.array([1, 0], np.int32), np.array([1, 0], np.int32)[::-1][::-1],
                                 np.array([1, 0], np.uint16), np.array([1, 0], ">i4"), [np.int32(1), 0], (1, 0),
                                 iter([1, 0]), np.array([1, 0], dtype=object)])
def test_complete_accepts_integer_arrays_and_iterables(mod, ids):
    with Runtime(lib=mod) as rt:
        _running_pair(rt)
        rt.complete(ids)
        assert rt.stats()["tasks_completed"] == 2
        rt.complete([])
        rt.complete(np.empty(0, np.int32))


def test_ready_pop_with_a_huge_max_allocates_only_what_is_queued(mod):
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("x", 8, 8, 4)
        f = rt.register_func("f")
        for i in range(3):
            submit_task(rt, f, [x], [("out", 0, i, 0, 1, 8)])
        ids = rt.ready_pop(2**31 - 1)  # would be an 8 GiB buffer if sized by max
        assert ids.tolist() == [0, 1, 2] and ids.dtype == np.int32
        assert rt.ready_pop(np.int64(5)).tolist() == []


def test_dump_path_with_nul_or_not_a_path(mod, tmp_path: Path):
    with Runtime(lib=mod) as rt:
        bad = str(tmp_path / "g") + "\0.txt"
        with expect(ERR_INVALID, r"^dump: path '.*g\\x00\.txt' contains a NUL character$"):
            rt.dump(bad)
        with expect(ERR_INVALID, r"^dump: path must be a str or a path, got NoneType None$"):
            rt.dump(None)
        assert list(tmp_path.iterdir()) == []  # nothing written to the truncated path
        rt.dump(tmp_path / "g.txt")
        rt.dump(str(tmp_path / "h.txt").encode())
        assert read_dump(tmp_path / "h.txt").tasks == []


# ------------------------------------------------------------------------------------------
# dump
# ------------------------------------------------------------------------------------------

def test_dump_round_trip(mod, tmp_path: Path):
    program = [[("out", 0, 0, 0, 32, 16)], [("out", 0, 32, 0, 32, 16)],
               [("in", 0, 0, 0, 64, 16), ("out", 1, 0, 0, 4, 4)]]
    path = tmp_path / "graph.txt"
    with Runtime(lib=mod) as rt:
        x = rt.register_tensor("all_q_rope", 64, 16, 2)
        y = rt.register_tensor("scores", 4, 4, 4)
        fa, fb = rt.register_func("rope_tile"), rt.register_func("score_block")
        for i, args in enumerate(program):
            t = rt.task(fa if i < 2 else fb, buffer_bytes=1024 * (i + 1))
            for kind, tensor, r0, c0, nr, nc in args:
                getattr(rt, f"add_{'input' if kind == 'in' else 'output'}")(t, [x, y][tensor], r0, c0, nr, nc)
            if i == 2:
                rt.add_scalar(t, -12)
            rt.submit(t)
        rt.dump(path)
    text = path.read_text().splitlines()
    assert text[0] == "PTO-TASKGRAPH 1"
    assert "TENSOR 0 all_q_rope 64 16 2" in text and "FUNC 1 score_block" in text
    assert "TASK 0 0 1024 0 1 2" in text and "TASK 2 1 3072 2 0" in text
    assert "ARG 2 in 0 0 0 64 16" in text and "SCALAR 2 -12" in text
    assert text[-1] == "END 3 2"
    g = read_dump(path)
    assert [(t.name, t.rows, t.cols, t.elem_size) for t in g.tensors] == [
        ("all_q_rope", 64, 16, 2), ("scores", 4, 4, 4)]
    assert g.funcs == {0: "rope_tile", 1: "score_block"}
    assert [t.func for t in g.tasks] == ["rope_tile", "rope_tile", "score_block"]
    assert [t.buffer_bytes for t in g.tasks] == [1024, 2048, 3072]
    assert [t.fanin for t in g.tasks] == [0, 0, 2]
    assert g.edges() == [(0, 2), (1, 2)] and g.n_edges == 2
    assert [(a.kind, a.tensor, a.row0, a.col0, a.rows, a.cols) for a in g.tasks[2].args[:2]] == [
        ("in", 0, 0, 0, 64, 16), ("out", 1, 0, 0, 4, 4)]
    assert g.tasks[2].args[2].kind == "scalar" and g.tasks[2].args[2].value == -12


def test_read_dump_rejects_malformed(tmp_path: Path):
    p = tmp_path / "bad.txt"
    p.write_text("PTO-TASKGRAPH 1\nTASK 0 0 0 0 2 1\nEND 1 1\n")
    with pytest.raises(ParseError, match="line 2: 2 fanout ids announced, 1 given"):
        read_dump(p)
    p.write_text("PTO-TASKGRAPH 1\nFUNC 0 f\nTASK 0 0 0 0 0\n")
    with pytest.raises(ParseError, match="missing END"):
        read_dump(p)
    p.write_text("hello\n")
    with pytest.raises(ParseError, match="line 1"):
        read_dump(p)


def test_dump_to_unwritable_path(mod, tmp_path: Path):
    with Runtime(lib=mod) as rt, expect(-9, r"dump: cannot open '.*nope/graph.txt' for writing"):
        rt.dump(tmp_path / "nope" / "graph.txt")


# ------------------------------------------------------------------------------------------
# pto.cache.cbuild: the cached cffi compiler the runtime is loaded through
# ------------------------------------------------------------------------------------------

def test_cbuild_caches_and_reports_compiler_errors(tmp_path, monkeypatch):
    from pto.cache import cbuild
    from pto.errors import BuildError

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path))
    src = tmp_path / "twice.c"
    src.write_text("int twice(int x) { return 2 * x; }\n")
    mod = cbuild.load_cffi_module("twice", "int twice(int x);", "int twice(int x);", sources=[src])
    assert mod.lib.twice(21) == 42
    assert [p.name for p in (tmp_path / "cffi").iterdir() if not p.name.startswith(".")]
    # a warm start (new process: the in-process cache is empty) must not run the compiler
    def no_compiler(cmd, cwd):
        raise AssertionError(f"compiler run on a warm start: {cmd}")

    monkeypatch.setattr(cbuild, "_loaded", {})
    monkeypatch.setattr(cbuild, "_run", no_compiler)
    again = cbuild.load_cffi_module("twice", "int twice(int x);", "int twice(int x);", sources=[src])
    assert again.lib.twice(5) == 10
    monkeypatch.undo()
    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path))
    # any change of a source file is a new build; compiler errors come back with its output
    src.write_text("int twice(int x) { return 2 * x }\n")
    with pytest.raises(BuildError, match=r"C compilation failed[\s\S]*twice\.c.*expected"):
        cbuild.load_cffi_module("twice", "int twice(int x);", "int twice(int x);", sources=[src])
    with pytest.raises(BuildError, match="cannot parse"):
        cbuild.load_cffi_module("bad", "int broken(;", "")
