"""The wave executor: concurrent build through a bounded window, any ready order, the number
of waves and launches."""

from __future__ import annotations

import pytest
import torch

from pto.backends import get_backend
from pto.data.buffers import allocate, tensor_shapes
from pto.exec.waves import WaveExecutor as Executor
from pto.interp.orchestration import run_program
from pto.machine.target import get as target
from pto.programs import get
from pto.runtime.graph import CompiledProgram


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


@pytest.mark.parametrize("config,merged", [("tiny", 2), ("tiny-gqa", 0)])
def test_projections_over_views_of_one_buffer_launch_as_one_batch(config, merged):
    """With the q, k and v weights in one buffer (LlamaProgram.packed_inputs: with as many
    key/value heads as query heads) the three projections are one launch per row-tile height;
    the result equals the reference interpreter's, as with separate buffers."""
    from pto.data.buffers import placeholders

    prog = get("llama7b")
    opts = prog.settings(config=config, target=target("x86_64"))
    module = prog.build(opts)
    scalars = prog.scalars(opts, prog.shape(200))
    inputs = prog.inputs(opts, prog.shape(200), "cpu", seed=3)
    want = run_program(module, inputs, scalars).tensors["y"]
    fn = module.entry_function
    shapes = tensor_shapes(fn, scalars)
    from pto.exec.order import wave_batches
    from pto.exec.waves import Views

    launches, counted = {}, {}
    for packed in ((), prog.packed_inputs(opts)):
        bufs = placeholders(fn, shapes, "cpu", packed)
        for k, v in inputs.items():
            bufs[k].copy_(v)
        tensors = allocate(fn, shapes, bufs, "cpu")
        g = CompiledProgram.get(module).build_graph(scalars)
        ex, batches = Executor(get_backend("torch", "cpu"), tensors), []
        ex.on_batch = batches.append
        launches[packed] = ex.run(g).launches
        # the auto executor's count of batches sees the views as the executor binds them
        by_id = {tid: tensors[n] for n, tid in g.tensor_ids.items()}
        counted[packed] = (wave_batches(g), wave_batches(g, Views(by_id).base))
        g.close()
        if packed and merged:  # a merged batch runs one weight's tasks together (L2), the larger tasks first
            b = max((b for b in batches if b.fn.name == "matmul_tile"), key=lambda b: b.size)
            rows, w0 = b.mems["x"].rows.tolist(), b.mems["w"].row0.tolist()
            assert rows == sorted(rows, reverse=True) and len(set(w0)) == merged + 1
            assert all(w0[k] <= w0[k + 1] for k in range(len(w0) - 1) if rows[k] == rows[k + 1])
        torch.testing.assert_close(tensors["y"], want, rtol=1e-5, atol=1e-5)
    # what the caller gives is not allocated again (the decode step gives a whole model)
    given = {"wq": inputs["wq"]}
    assert set(placeholders(fn, shapes, "cpu", prog.packed_inputs(opts), given)) == \
        {t.name for t in fn.tensors if t.role in ("input", "inout")} - {"wq"}
    heights = 2  # 200 rows: full row tiles and the clipped last one
    assert launches[()] - launches[prog.packed_inputs(opts)] == merged * heights
    (plain, seen), (plain_p, seen_p) = counted[()], counted[prog.packed_inputs(opts)]
    assert plain == seen == plain_p and plain_p - seen_p == merged * heights, counted
    assert (seen, seen_p) == (launches[()], launches[prog.packed_inputs(opts)])  # what the executor ran


def test_views_of_one_buffer_become_one_span_with_moved_regions():
    """Row and column views of one buffer with one row stride map to one span (their regions
    moved by the views' offsets); a tensor of its own, or a view of another stride, keeps its
    id; a view that is not a column slice (it wraps a row) is left alone."""
    import numpy as np

    from pto.exec.waves import Views

    buf = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    other = torch.zeros(4, 4)
    by_id = {0: buf[0:2, 0:3], 1: buf[2:6, 3:8], 2: other, 3: buf.view(-1)[8:32].view(4, 6),
             4: torch.as_strided(buf, (2, 6), (8, 1), 5)}
    views = Views(by_id)
    span = by_id[-1]
    assert span.shape == (6, 8) and span.data_ptr() == buf.data_ptr() and -2 not in by_id
    tens = np.array([[0, 1, 2, 3, 4]], np.int32)
    reg = np.array([[[1, 1, 1, 2], [0, 2, 3, 1], [0, 0, 4, 4], [0, 0, 1, 1], [0, 0, 2, 6]]], np.int64)
    views.remap(tens, reg, [0, 1, 2, 3, 4])
    assert tens.tolist() == [[-1, -1, 2, 3, 4]] and reg[0, 2:].tolist() == [[0, 0, 4, 4], [0, 0, 1, 1], [0, 0, 2, 6]]
    assert reg[0, :2].tolist() == [[1, 1, 1, 2], [2, 5, 3, 1]]
    for k in (0, 1):  # the moved region is the same memory
        r0, c0, r, c = (int(v) for v in [[1, 1, 1, 2], [0, 2, 3, 1]][k])
        R0, C0 = (int(v) for v in reg[0, k, :2])
        assert torch.equal(by_id[k][r0:r0 + r, c0:c0 + c], span[R0:R0 + r, C0:C0 + c])


def test_runner_is_cached_by_shape_and_replays_new_inputs():
    """With --repeat the prepared graph (a CUDA graph on the GPU) is reused while the shapes stay
    the same; replays read the new inputs from the runner's static buffers."""
    from pto import engine
    from pto.cli.commands.run import run

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
