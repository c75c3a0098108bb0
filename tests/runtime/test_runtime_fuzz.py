"""10,000 random region programs through the C runtime, each checked against an oracle written
independently of it: 5,000 whole graphs, 3,000 through small windows (1 to 6 slots) and 2,000
built on a second thread while this one executes (half with a window of 1 to 4 slots); plus 30
programs of 1,000-3,000 tasks through windows, long enough that the runtime sweeps its tensor map.

A program is a list of tasks; a task is a list of arguments ``(kind, tensor, row0, col0, rows,
cols)`` (kind ``IN``/``OUT``/``INOUT``) or ``(SCALAR, value)``. The generator mixes whole-tile
accesses of tile-shaped tensors (the runtime's exact-cell path, reader runs), rectangles inside
one tile (cells of several entries), arbitrary rectangles (the general path, cut entries, large
entries), row and column bands, whole tensors and repeats of earlier regions.

The oracle (:func:`oracle_predecessors`) is the definition of the dependency semantics,
element by element, with numpy arrays over all elements of all tensors: a task depends on the
last writer of every element it reads or writes, and a writer also on every task that read the
element since that write. It shares nothing with the runtime's tensor map.

Checked per program: the exact edge set (whole graphs: the export; windows: the union of
exports taken before every round of completions, which must hold exactly the oracle's edges
whose predecessor had not retired when the successor was built; threads with no window: the
final export), every popped task's predecessors completed before it, and (single thread) after
every round the ready set is exactly the submitted tasks whose predecessors all completed.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from pto.runtime import Runtime, load_runtime_module

IN, OUT, INOUT, SCALAR = 0, 1, 2, 3
MAX_TASKS = 48
WHOLE, WINDOWED, THREADED = 5000, 3000, 2000
assert WHOLE + WINDOWED + THREADED >= 10_000


@pytest.fixture(scope="module")
def mod():
    return load_runtime_module()


# ------------------------------------------------------------------------------------------
# random programs
# ------------------------------------------------------------------------------------------

def random_program(seed: int) -> tuple[list[tuple[int, int]], list[list[tuple]]]:
    """(tensor shapes, tasks) of one random program."""
    rng = random.Random(seed)
    shapes, tiles = [], []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.6:  # tile-shaped: a grid of 1..6 x 1..6 tiles of 1..8 x 1..8
            th, tw = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4, 8))
            shapes.append((th * rng.randint(1, 6), tw * rng.randint(1, 6)))
            tiles.append((th, tw, rng.random() < 0.5))
        else:
            shapes.append((rng.randint(1, 16), rng.randint(1, 16)))
            tiles.append(None)
    seen: list[tuple[int, int, int, int, int]] = []
    touched = [False] * len(shapes)
    program = []
    for _ in range(rng.randint(1, MAX_TASKS)):
        args: list[tuple] = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.08:
                args.append((SCALAR, rng.randint(-2**63, 2**63 - 1)))
                continue
            kind = rng.choice((IN, IN, OUT, INOUT))
            if seen and rng.random() < 0.3:
                region = rng.choice(seen)
            else:
                region = random_region(rng, shapes, tiles, touched)
                seen.append(region)
            touched[region[0]] = True
            args.append((kind, *region))
        program.append(args)
    return shapes, program


def random_region(rng: random.Random, shapes, tiles, touched) -> tuple[int, int, int, int, int]:
    t = rng.randrange(len(shapes))
    rows, cols = shapes[t]
    style = rng.random()
    if tiles[t] is not None:
        th, tw, strict = tiles[t]
        i, j = rng.randrange(rows // th), rng.randrange(cols // tw)
        if strict:
            # single tiles (the first access sizes the grid's cells to the tile) and rectangles
            # inside one tile: every map entry stays inside its cell, so whole-tile accesses
            # take the exact-cell path against cells of one or several entries
            if style < 0.75 or not touched[t]:
                return t, i * th, j * tw, th, tw
            r0, c0 = rng.randrange(th), rng.randrange(tw)
            return t, i * th + r0, j * tw + c0, rng.randint(1, th - r0), rng.randint(1, tw - c0)
        if style < 0.6:  # one tile, or a few neighbouring tiles
            ni = 1 if rng.random() < 0.8 else rng.randint(1, rows // th - i)
            nj = 1 if rng.random() < 0.8 else rng.randint(1, cols // tw - j)
            return t, i * th, j * tw, ni * th, nj * tw
    if style < 0.7:
        return t, 0, 0, rows, cols
    if style < 0.8:  # a band of rows or of columns
        if rng.random() < 0.5:
            r0 = rng.randrange(rows)
            return t, r0, 0, rng.randint(1, rows - r0), cols
        c0 = rng.randrange(cols)
        return t, 0, c0, rows, rng.randint(1, cols - c0)
    r0, c0 = rng.randrange(rows), rng.randrange(cols)
    return t, r0, c0, rng.randint(1, rows - r0), rng.randint(1, cols - c0)


def long_program(seed: int) -> tuple[list[tuple[int, int]], list[list[tuple]]]:
    """1,000-3,000 tasks on small tiles of a 64 x 64 tensor (thousands of distinct live regions,
    so a windowed runtime sweeps its tensor map) and weight tiles of an 8 x 8 tensor read in
    strided runs (task i reads weight tile i % k) and now and then rewritten."""
    rng = random.Random(seed)
    th, tw, k = rng.choice((1, 2)), rng.choice((1, 2, 4)), rng.randint(1, 4)
    shapes = [(64, 64), (8, 8)]
    program = []
    for i in range(rng.randint(1000, 3000)):
        r0, c0 = rng.randrange(64 // th) * th, rng.randrange(64 // tw) * tw
        args: list[tuple] = [(rng.choice((IN, OUT, INOUT, INOUT)), 0, r0, c0, th, tw)]
        if rng.random() < 0.3:
            args.append((IN, 0, r0, 0, th, 64) if rng.random() < 0.5 else (IN, 0, 0, c0, 64, tw))
        w = i % k
        args.append((OUT if rng.random() < 0.03 else IN, 1, 4 * (w // 2), 4 * (w % 2), 4, 4))
        if rng.random() < 0.001:
            args.append((INOUT, 0, 0, 0, 64, 64))
        program.append(args)
    return shapes, program


# ------------------------------------------------------------------------------------------
# the oracle
# ------------------------------------------------------------------------------------------

def oracle_predecessors(shapes, program) -> list[set[int]]:
    """Predecessors of every task, element by element over all tensors' elements at once: the
    last writer of each element a task accesses, and for an element it writes also the readers
    since that write; all of a task's arguments see the state before the task."""
    offsets = np.cumsum([0] + [r * c for r, c in shapes])
    n_elems, words = int(offsets[-1]), (len(program) + 63) // 64
    last_writer = np.full(n_elems, -1, dtype=np.int64)
    # bit s of an element's row: task s read the element since its last write
    readers = np.zeros((n_elems, words), dtype=np.uint64)
    preds = []
    for task, args in enumerate(program):
        reads = np.zeros(n_elems, dtype=bool)
        writes = np.zeros(n_elems, dtype=bool)
        for arg in args:
            if arg[0] == SCALAR:
                continue
            kind, t, r0, c0, nr, nc = arg
            rows, cols = shapes[t]
            for mask, applies in ((reads, kind != OUT), (writes, kind != IN)):
                if applies:
                    mask[offsets[t]:offsets[t + 1]].reshape(rows, cols)[r0:r0 + nr, c0:c0 + nc] = True
        touched = last_writer[reads | writes]
        deps = set(np.unique(touched[touched >= 0]).tolist())
        if writes.any():
            since = np.bitwise_or.reduce(readers[writes], axis=0)
            deps.update(np.flatnonzero(np.unpackbits(since.astype("<u8").view(np.uint8), bitorder="little")).tolist())
        preds.append(deps)
        readers[reads & ~writes, task // 64] |= np.uint64(1 << task % 64)
        last_writer[writes] = task
        readers[writes] = 0
    return preds


def oracle_edges(preds: list[set[int]]) -> set[tuple[int, int]]:
    return {(s, t) for t, ps in enumerate(preds) for s in ps}


# ------------------------------------------------------------------------------------------
# driving the runtime
# ------------------------------------------------------------------------------------------

def register(rt: Runtime, shapes) -> tuple[list[int], int]:
    return [rt.register_tensor(f"t{i}", r, c, 4) for i, (r, c) in enumerate(shapes)], rt.register_func("f")


def build_task(rt: Runtime, func: int, tids: list[int], args: list[tuple]) -> int:
    task = rt.task(func)
    adds = (rt.add_input, rt.add_output, rt.add_inout)
    for arg in args:
        if arg[0] == SCALAR:
            rt.add_scalar(task, arg[1])
        else:
            kind, t, r0, c0, nr, nc = arg
            adds[kind](task, tids[t], r0, c0, nr, nc)
    rt.submit(task)
    return task


def recorded_edges(rt: Runtime) -> set[tuple[int, int]]:
    """Edges among the live submitted tasks (two C calls: sizes, then the fanout lists)."""
    api, ffi = rt.api, rt.ffi
    info = api.export_info(rt.ptr)
    ptr, ids = np.empty(info.n_tasks + 1, np.int64), np.empty(info.n_edges, np.int32)
    arrays = ffi.new("pto_export_arrays *")
    keep = (ffi.from_buffer("int64_t[]", ptr), ffi.from_buffer("int32_t[]", ids))
    arrays.fanout_ptr, arrays.fanout_ids = keep
    api.export_fill(rt.ptr, arrays)
    preds = np.repeat(np.arange(info.first_task, info.first_task + info.n_tasks), np.diff(ptr))
    return set(zip(preds.tolist(), ids.tolist()))


class Executor:
    """Completes popped tasks in a random order, checking that each one's predecessors (from
    the oracle) completed before it was handed out."""

    def __init__(self, rt: Runtime, preds: list[set[int]], rng: random.Random):
        self.rt, self.preds, self.rng = rt, preds, rng
        self.completed = [False] * len(preds)
        self.n_completed = 0
        self.pool: list[int] = []

    def pop(self) -> int:
        ids = self.rt.ready_pop().tolist()
        for t in ids:
            missing = [s for s in self.preds[t] if not self.completed[s]]
            assert not missing, f"task {t} handed out before its predecessors {missing} completed"
        self.pool.extend(ids)
        return len(ids)

    def complete_some(self, everything: bool = False) -> None:
        self.rng.shuffle(self.pool)
        k = len(self.pool) if everything else self.rng.randint(1, len(self.pool))
        done, self.pool = self.pool[:k], self.pool[k:]
        self.rt.complete(done)
        for t in done:
            self.completed[t] = True
        self.n_completed += len(done)

    def check_ready_set(self, first: int, submitted: int) -> None:
        """Every submitted task whose predecessors all completed is ready (or popped), and
        no other: the runtime's pending counts are exact (tasks below `first` completed)."""
        self.pop()
        want = {t for t in range(first, submitted)
                if not self.completed[t] and all(self.completed[s] for s in self.preds[t])}
        assert set(self.pool) == want, (sorted(self.pool), sorted(want))


def fail_message(mode: str, seed: int, shapes, program) -> str:
    return f"{mode} program seed {seed}: shapes {shapes}, {len(program)} tasks: {program}"


# ------------------------------------------------------------------------------------------
# the three kinds of runs
# ------------------------------------------------------------------------------------------

def run_whole(rt: Runtime, seed: int) -> None:
    """Whole graph kept: the export holds exactly the oracle's edges; then a random execution."""
    shapes, program = random_program(seed)
    preds = oracle_predecessors(shapes, program)
    tids, f = register(rt, shapes)
    for i, args in enumerate(program):
        assert build_task(rt, f, tids, args) == i
    want = oracle_edges(preds)
    got = recorded_edges(rt)
    assert got == want, (f"missing {sorted(want - got)}, extra {sorted(got - want)}: "
                         + fail_message("whole", seed, shapes, program))
    assert rt.stats()["edges"] == len(want)
    ex = Executor(rt, preds, random.Random(seed))
    ex.check_ready_set(0, len(program))
    while ex.n_completed < len(program):
        ex.complete_some()
        ex.check_ready_set(0, len(program))


def run_windowed(mod, seed: int, generate=random_program, windows: tuple[int, int] = (1, 6)) -> None:
    """A window (of 1-6 slots by default), no sync hooks: build until it is full, then complete
    a random part of the ready tasks. Edges into a task from predecessors that retired before
    it was built are not recorded; every other edge must be, and nothing else."""
    shapes, program = generate(seed)
    preds = oracle_predecessors(shapes, program)
    rng = random.Random(seed)
    window = rng.randint(*windows)
    n = len(program)
    with Runtime(window=window, lib=mod) as rt:
        tids, f = register(rt, shapes)
        ex = Executor(rt, preds, rng)
        retired, submitted = 0, 0
        built_after = [0] * n  # tasks retired when each task was built
        seen: set[tuple[int, int]] = set()
        while ex.n_completed < n:
            if submitted < n and submitted - retired < window:
                built_after[submitted] = retired
                assert build_task(rt, f, tids, program[submitted]) == submitted
                submitted += 1
                continue
            seen |= recorded_edges(rt)  # nothing retires between a build and here
            ex.check_ready_set(retired, submitted)
            assert ex.pool, "window full and nothing ready: " + fail_message("windowed", seed, shapes, program)
            ex.complete_some()
            while retired < n and ex.completed[retired]:
                retired += 1
        want = {(s, t) for s, t in oracle_edges(preds) if s >= built_after[t]}
        assert seen == want, (f"window {window}: missing {sorted(want - seen)}, extra {sorted(seen - want)}: "
                              + fail_message("windowed", seed, shapes, program))
        s = rt.stats()
        assert (s["tasks_retired"], s["tasks_live"], s["edges_live"], s["edges"]) == (n, 0, 0, len(want))


def run_threaded(mod, seed: int, window: int, timeout: float = 30.0) -> None:
    """The program is built on a second thread (blocking in pto_task_alloc while the window is
    full) while this thread pops and completes tasks as they become ready."""
    shapes, program = random_program(seed)
    preds = oracle_predecessors(shapes, program)
    rng = random.Random(seed)
    n = len(program)
    errors: list[BaseException] = []
    with Runtime(window=window, concurrent=True, lib=mod) as rt:
        tids, f = register(rt, shapes)

        def builder() -> None:
            try:
                for i, args in enumerate(program):
                    assert build_task(rt, f, tids, args) == i
            except BaseException as exc:  # reported by the executing thread
                errors.append(exc)

        th = threading.Thread(target=builder, daemon=True)
        th.start()
        ex = Executor(rt, preds, rng)
        deadline = time.monotonic() + timeout
        while ex.n_completed < n and not errors:
            if ex.pop() == 0 and not ex.pool:
                assert time.monotonic() < deadline, "nothing ready: " + fail_message("threaded", seed, shapes, program)
                time.sleep(0)
                continue
            ex.complete_some(everything=rng.random() < 0.5)
        th.join(timeout)
        assert not th.is_alive(), "builder thread hung"
        assert not errors, errors
        s = rt.stats()
        assert (s["tasks_submitted"], s["tasks_completed"]) == (n, n)
        if window == 0:
            # completed predecessors still get their edge: the graph is the oracle's exactly
            want = oracle_edges(preds)
            got = recorded_edges(rt)
            assert got == want, (f"missing {sorted(want - got)}, extra {sorted(got - want)}: "
                                 + fail_message("threaded", seed, shapes, program))
        else:
            assert (s["tasks_retired"], s["edges_live"]) == (n, 0)


# ------------------------------------------------------------------------------------------
# the tests (seeds differ per test, so the programs do too)
# ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_5000_random_programs_whole_graph_match_the_oracle(mod):
    """5,000 random programs, the whole graph kept (a runtime reused through pto_runtime_reset,
    a fresh one every 100): exact edges, then a random execution in dependency order."""
    rt = None
    for k in range(WHOLE):
        if k % 100 == 0:
            if rt is not None:
                rt.close()
            rt = Runtime(lib=mod)
        else:
            rt.reset()
        run_whole(rt, seed=k)
    rt.close()


@pytest.mark.slow
def test_3000_random_programs_small_windows_match_the_oracle(mod):
    """3,000 random programs through windows of 1 to 6 slots, single-threaded."""
    for k in range(WINDOWED):
        run_windowed(mod, seed=1_000_000 + k)


@pytest.mark.slow
def test_2000_random_programs_built_on_another_thread_match_the_oracle(mod):
    """2,000 random programs built on a second thread while this one executes them: 1,000
    with the whole graph kept (exact edges at the end), 1,000 through windows of 1 to 4 slots."""
    for k in range(THREADED):
        run_threaded(mod, seed=2_000_000 + k, window=0 if k % 2 == 0 else 1 + k // 2 % 4)


@pytest.mark.slow
def test_30_long_programs_through_windows_sweep_the_tensor_map(mod):
    """30 random programs of 1,000-3,000 tasks (45,000 in all) through windows of 2 to 64 slots:
    thousands of live regions make the runtime sweep retired entries from its tensor map and
    trim the retired front of reader runs; the edges stay exactly the oracle's."""
    for k in range(30):
        run_windowed(mod, seed=4_000_000 + k, generate=long_program, windows=(2, 64))


def test_the_oracle_agrees_with_the_element_by_element_one_of_test_runtime():
    """The numpy oracle here and the set-based one of tests/runtime/test_runtime.py, written apart,
    give the same edges on 300 of these programs."""
    from tests.runtime.test_runtime import oracle_edges as set_oracle

    names = ("in", "out", "inout")
    for seed in range(300):
        shapes, program = random_program(3_000_000 + seed)
        regions = [[(names[a[0]], *a[1:]) for a in args if a[0] != SCALAR] for args in program]
        assert oracle_edges(oracle_predecessors(shapes, program)) == set_oracle(shapes, regions)
