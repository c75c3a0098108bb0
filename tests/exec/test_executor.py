"""The wave executor: concurrent build through a bounded window, any ready order, the number
of waves and launches."""

from __future__ import annotations

import pytest
import torch

from pto.backends import get_backend
from pto.buffers import allocate, tensor_shapes
from pto.exec.waves import WaveExecutor as Executor
from pto.graph import CompiledProgram
from pto.interp.orchestration import run_program
from pto.programs import get
from pto.target import get as target


def _setup(attention: str, seq: int):
    prog = get("llama7b")
    opts = prog.settings(attention=attention, target=target("x86_64"), fuse=False)  # the written graph
    module = prog.build(opts)
    scalars = prog.scalars(opts, prog.shape(seq))
    inputs = prog.inputs(opts, prog.shape(seq), "cpu", seed=7)
    want = run_program(module, inputs, scalars).tensors["y"]
    fn = module.entry_function
    tensors = allocate(fn, tensor_shapes(fn, scalars), inputs, "cpu")
    return CompiledProgram.get(module), scalars, tensors, want


@pytest.mark.timeout(300)
@pytest.mark.parametrize("window", [4, 64])
def test_concurrent_build_through_a_small_window(window):
    """The orchestration runs on its own thread and blocks whenever the window is full; the
    executor drains it. Every task runs once, the result equals the in-order interpreter."""
    cp, scalars, tensors, want = _setup("split", 100)
    total = CompiledProgram.get(cp.module).build_graph(scalars, count_only=True).tasks
    stats = Executor(get_backend("torch", "cpu"), tensors).run_concurrent(cp, scalars, window=window)
    assert stats.tasks == total > window
    torch.testing.assert_close(tensors["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_ready_order(seed):
    cp, scalars, tensors, want = _setup("pair", 70)
    g = cp.build_graph(scalars)
    stats = Executor(get_backend("torch", "cpu"), tensors, order="random", seed=seed).run(g)
    g.close()
    assert stats.tasks == g.tasks
    torch.testing.assert_close(tensors["y"], want, rtol=1e-5, atol=1e-5)


def test_fused_layer_runs_in_few_waves_and_launches():
    """Waves follow the layer's dependency depth, not the number of tiles: the fused layer
    is 8 waves (rmsnorm, projections, rope, attention, o-projection, rmsnorm, gate/up, down), and
    each of its 11 calls per tile is at most one launch per tile-height variant (2 here: full
    tiles and the residual), whatever the number of tiles."""
    for seq in (100, 1000):
        cp, scalars, tensors, _ = _setup("fused", seq)
        g = cp.build_graph(scalars)
        stats = Executor(get_backend("torch", "cpu"), tensors).run(g)
        g.close()
        assert stats.waves == 8
        assert stats.launches <= 2 * 11 < g.tasks


def test_runner_is_cached_by_shape_and_replays_new_inputs():
    """With --repeat the prepared graph (a CUDA graph on the GPU) is reused while the shapes stay
    the same; replays read the new inputs from the runner's static buffers."""
    from pto import engine
    from pto.tools.run import run

    engine.clear_runners()
    try:
        a = run("llama7b", seq=64, config="tiny", device="cpu", repeat=2, check=True, seed=1)
        runner = next(iter(engine._RUNNERS.values()))
        b = run("llama7b", seq=64, config="tiny", device="cpu", repeat=2, check=True, seed=2)
        assert list(engine._RUNNERS.values()) == [runner]  # same shape: not rebuilt
        assert a["rel_err"] <= 1e-4 and b["rel_err"] <= 1e-4  # seed 2's inputs, replayed
        run("llama7b", seq=65, config="tiny", device="cpu", repeat=2)
        assert len(engine._RUNNERS) == 2  # a new shape: a new runner
    finally:
        engine.clear_runners()


class _Compiling:
    """The torch backend as a compiling backend sees it: every second batch's launch comes back
    with its compile still running (``pending``, a future the launch waits for), as
    :meth:`TritonBackend.prepare_ahead` returns a batch whose kernel compiles on a worker; the
    launches record the order they run in."""

    def __init__(self, fail_at: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.inner = get_backend("torch", "cpu")
        self.pool = ThreadPoolExecutor(1)
        self.prepared, self.ran, self.fail_at, self.futures = 0, [], fail_at, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prepare_ahead(self, batch):
        import threading

        real, k = self.inner.prepare(batch), self.prepared
        self.prepared += 1
        gate = threading.Event()

        def compile_():
            gate.wait(5)
            if k == self.fail_at:
                raise RuntimeError(f"compile {k} failed")
        future = self.pool.submit(compile_) if k % 2 else None
        if future is not None:
            self.futures.append(future)

        def launch():
            if future is not None:
                gate.set()
                future.result()
            self.ran.append(k)
            real()
        launch.count, launch.pending, launch.future = real.count, future is not None, future
        return launch


def test_launches_held_for_their_compiles_run_in_order_once():
    """A first run's launch whose kernel still compiles is held, and every launch after it,
    until the waves are planned; then all run, in the planned order, once: the result equals
    the in-order interpreter. A compile that fails raises from the run, and the compiles of
    the launches after it that never ran are cancelled."""
    cp, scalars, tensors, want = _setup("fused", 100)
    be = _Compiling()
    stats = Executor(be, tensors).run(cp.build_graph(scalars))
    assert be.ran == list(range(be.prepared)) and be.prepared > 2 and stats.exec_ms > 0
    torch.testing.assert_close(tensors["y"], want, rtol=1e-5, atol=1e-5)
    be = _Compiling(fail_at=1)
    with pytest.raises(RuntimeError, match="compile 1 failed"):
        Executor(be, tensors).run(cp.build_graph(scalars))
    assert be.ran == [0] and len(be.futures) > 2 and be.futures[-1].cancelled()
