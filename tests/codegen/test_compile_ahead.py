"""Compiling ahead (pto.backends.triton.ahead): the key of what a batch's launches compile, one
compile at a time per kernel on the worker threads, and a held launch that waits for its
compile and raises what compiling raised."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pto.backends.triton import ahead
from pto.backends.triton.launch import launcher
from pto.errors import ExecutionError, UsageError


def test_key_follows_what_triton_specializes_on():
    a, b = torch.zeros(64), torch.zeros(65)
    k = ahead.key("d1", [((1,), (a, 64), {"num_warps": 4})])
    assert k == ahead.key("d1", [((7,), (torch.ones(64), 128), {"num_warps": 4})])  # grid, values alike
    assert k != ahead.key("d2", [((1,), (a, 64), {"num_warps": 4})])  # another source
    assert k != ahead.key("d1", [((1,), (a, 64), {"num_warps": 8})])  # launch settings
    assert k != ahead.key("d1", [((1,), (b[1:], 64), {"num_warps": 4})])  # a pointer off 16 bytes
    assert k != ahead.key("d1", [((1,), (a, 65), {"num_warps": 4})])  # a stride not a multiple of 16
    assert k != ahead.key("d1", [((1,), (a.half(), 64), {"num_warps": 4})])  # dtype
    # the grid's extents are runtime integers: a new batch size is the same kernel, 1 or a
    # multiple of 16 another specialization
    grid = [ahead.key("d1", [((1,), (a, 64), {"num_warps": 4, "NB": nb, "NP": 2})]) for nb in (3, 5, 16, 1)]
    assert grid[0] == grid[1] and len({grid[0], grid[2], grid[3]}) == 3


def test_one_compile_at_a_time_per_kernel_and_the_key_recorded():
    jit_a, jit_b = object(), object()
    running, most = [0], [0]
    guard = threading.Lock()

    def fit(v):
        def run():
            with guard:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with guard:
                running[0] -= 1
            return v
        return run

    keys = [("serial", i) for i in range(4)]
    futures = [ahead.submit(k, jit_a, fit(i), torch.device("cpu")) for i, k in enumerate(keys)]
    assert [f.result() for f in futures] == [0, 1, 2, 3]
    assert most[0] == 1 and all(ahead.fitted(k) for k in keys)
    if ahead.workers() > 1:  # two kernels compile at once
        most[0] = 0
        fs = [ahead.submit(("two", j), jit, fit(j), torch.device("cpu")) for j, jit in enumerate((jit_a, jit_b))]
        [f.result() for f in fs]
        assert most[0] == 2
    assert not ahead.fitted(("never", 0))


def test_a_held_launch_waits_for_its_compile_and_raises_its_error():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def add_one(x, n, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1.0, mask=i < n)

    x = torch.arange(8, dtype=torch.float32)
    f = ahead.submit(("launch", 1), add_one, lambda: [((1,), (x, 5), {"B": 8})], torch.device("cpu"))
    run = launcher(add_one, None, ["one group"], "`add_one`", f)
    assert run.count == 1
    run()
    assert x.tolist() == [1, 2, 3, 4, 5, 5, 6, 7]

    def fail():
        raise ExecutionError("`add_one`: Triton failed with num_warps=4: out of registers")

    run = launcher(add_one, None, ["one group"], "`add_one`", ahead.submit(("launch", 2), add_one, fail,
                                                                         torch.device("cpu")))
    with pytest.raises(ExecutionError, match="out of registers"):
        run()
    assert x.tolist() == [1, 2, 3, 4, 5, 5, 6, 7]


def test_compile_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv("PTO_COMPILE_THREADS", "3")
    assert ahead.workers() == 3
    for bad in ("0", "many"):
        monkeypatch.setenv("PTO_COMPILE_THREADS", bad)
        with pytest.raises(UsageError, match="PTO_COMPILE_THREADS"):
            ahead.workers()


def test_a_kernel_fitted_once_is_refitted_from_its_depths():
    """A second batch of the same key takes the depths the first was fitted to (no compile
    query); another key, or another number of launches, is not answered."""
    a, b = torch.zeros(64), torch.zeros(64)
    asked = [((1,), (a, 64), {"num_warps": 4, "num_stages": 4}), ((2,), (a, 64), {"num_warps": 4})]
    k = ahead.key("refit-d1", asked)
    assert ahead.refit(k, asked) is None  # never fitted
    ahead.note(k, [(g, args, {**kw, "num_stages": 2} if "num_stages" in kw else kw) for g, args, kw in asked])
    later = [((3,), (b, 64), {"num_warps": 4, "num_stages": 4}), ((5,), (b, 64), {"num_warps": 4})]
    assert ahead.key("refit-d1", later) == k
    (g0, a0, kw0), (g1, a1, kw1) = ahead.refit(k, later)
    assert (g0, kw0["num_stages"], g1, "num_stages" in kw1) == ((3,), 2, (5,), False)
    assert a0[0] is b and later[0][2]["num_stages"] == 4  # the batch's own arguments, its launches untouched
    assert ahead.refit(k, later[:1]) is None
    assert ahead.refit(ahead.key("refit-d2", later), later) is None
