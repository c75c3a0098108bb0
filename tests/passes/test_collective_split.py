"""The cut of a collective task at its all-reduce (pto.passes.collective) and the Triton backend's
launch of it (pto.backends.triton.collective): the two parts, with the sum buffer between them,
compute exactly what the one function computes on the torch evaluator.

With one rank the all-reduce is the identity, so the parts must give the same bits as the whole
function: the first part rounds ``src`` to the sum's dtype, the second rounds the buffer to
``dst``'s, as the evaluator's ``all_reduce`` does. A sum over two ranks runs in tests/dist
(gloo, the Triton backend under the interpreter) and tests/gpu/test_tp_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from pto.incore.collective import allreduce_residual_tile, allreduce_tile, matmul_allreduce_residual_tile

from pto import InCore
from pto.backends.triton.collective import capturable, native_split, parts
from pto.batch import RegionBatch, TaskBatch
from pto.collectives import SumBuffers
from pto.evaluator.machine import run_incore_batch
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType, bf16, f32
from pto.ir.verify_incore import verify_incore
from pto.passes.collective import split_collective


def _scaled_sum(dt, acc, rows=8, cols=24, block=16):
    """y = 2 * (sum over ranks of x * w) + r in a loop-free body around the sum, with a
    parallel axis over column blocks whose extent is a scalar's."""
    k = InCore("scaled_sum")
    R = k.dim("R", rows)
    n = k.scalar("n")
    x, w, r, y = (k.memref(m, dt) for m in "xwry")
    j = k.parallel("j", n)
    a, b, c = (k.tile(t, R, block, dt) for t in "abc")
    s = k.tile("s", R, block, f32)
    k.load(a, x, 0, j * block)
    k.load(b, w, 0, j * block)
    k.mul(a, a, b)
    k.allreduce(s, a, acc=acc)
    k.muls(s, s, 2.0)
    k.load(c, r, 0, j * block)
    k.add(s, s, c)
    k.cast(a, s)
    k.store(y, 0, j * block, a)
    return specialize(k.build(), {"R": rows}), -(-cols // block)


def _batch(fn, names: str, rows: int, cols: int, size: int, gen, dtype, scalars=None) -> TaskBatch:
    """``size`` tasks, task t on rows [t rows, (t + 1) rows) of every tensor (the last clipped to
    one row less, so masks matter); a ``w`` of a matmul (K, N declared) is one whole K x N
    weight every task reads, and its ``x`` K wide."""
    dims = dict(fn.variant)
    mems = {}
    for name in names:
        shared = name == "w" and "K" in dims
        width = dims["K"] if name == "x" and "K" in dims else cols
        height = dims["K"] if shared else size * rows
        r0 = torch.zeros(size, dtype=torch.int64) if shared else torch.arange(size, dtype=torch.int64) * rows
        nr = torch.full((size,), dims["K"] if shared else rows, dtype=torch.int64)
        if not shared:
            nr[-1] = rows - 1
        zeros, widths = torch.zeros(size, dtype=torch.int64), torch.full((size,), width, dtype=torch.int64)
        mems[name] = RegionBatch(torch.randn(height, width, generator=gen).to(dtype), r0, zeros, nr, widths)
    return TaskBatch(fn, mems, {k: torch.full((size,), v, dtype=torch.int64) for k, v in (scalars or {}).items()},
                     size)


def _copy(batch: TaskBatch) -> TaskBatch:
    return TaskBatch(batch.fn, {k: RegionBatch(v.tensor.clone(), v.row0, v.col0, v.rows, v.cols)
                                for k, v in batch.mems.items()}, batch.scalars, batch.size)


def _cases():
    out = []
    for dt in (f32, bf16):
        for acc in dict.fromkeys((f32, dt)):
            out.append((f"residual-{dt}-{acc}", specialize(allreduce_residual_tile(dt, 8, 48, 16, acc=acc), {"R": 8}),
                        "xry", 8, 48, {}))
            out.append((f"inplace-{dt}-{acc}", specialize(allreduce_tile(dt, 8, 40, 16, acc=acc), {"R": 8}),
                        "x", 8, 40, {}))
            fn = matmul_allreduce_residual_tile(dt, 8, 32, 48, 16, 16, acc=acc)
            out.append((f"matmul-{dt}-{acc}", specialize(fn, {"R": 8, "K": 32, "N": 48}), "xwry", 8, 48, {}))
            fn, n = _scaled_sum(dt, acc)
            out.append((f"scaled-{dt}-{acc}", fn, "xwry", 8, 24, {"n": n}))
    return out


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_parts_give_the_evaluators_bits_with_one_rank(case):
    _, fn, names, rows, cols, scalars = case
    split = split_collective(fn)
    assert split is not None
    verify_incore(split.pre)
    verify_incore(split.post)
    dtype = fn.memrefs[0].dtype.torch
    whole = _batch(fn, names, rows, cols, 5, torch.Generator().manual_seed(3), dtype, scalars)
    cut = _copy(whole)
    run_incore_batch(fn, whole.mems, whole.scalars, whole.size)
    from pto.backends.triton.tables import task_env

    p = parts(cut, split, task_env(cut))
    run_incore_batch(p.first.fn, p.first.mems, p.first.scalars, p.first.size)
    assert p.send.abs().sum() > 0 and p.recv is p.send  # the first part wrote the tiles to be summed
    run_incore_batch(p.second.fn, p.second.mems, p.second.scalars, p.second.size)
    for name in names:
        assert torch.equal(whole.mems[name].tensor, cut.mems[name].tensor), name


def _body_with(tiles_cross: bool = False, in_loop: bool = False, twice: bool = False, scalar_load: bool = False):
    k = InCore("refused")
    x, y = k.memref("x", f32), k.memref("y", f32)
    a, b = k.tile("a", 4, 8, f32), k.tile("b", 4, 8, f32)
    if scalar_load:
        p = k.load_scalar("p", x, 0, 0)
        k.load(a, x, p * 0, 0)
    else:
        k.load(a, x, 0, 0)
    k.load(b, x, 0, 0)
    if in_loop:
        with k.for_range("i", 0, 2):
            k.allreduce(a, a)
    else:
        k.allreduce(a, a)
    if twice:
        k.allreduce(a, a)
    k.add(a, a, b if tiles_cross else a)
    k.store(y, 0, 0, a)
    return k.build()


@pytest.mark.parametrize("why", ["tiles_cross", "in_loop", "twice", "scalar_load"])
def test_what_cannot_be_cut_stays_on_the_evaluator(why):
    fn = _body_with(**{why: True})
    assert split_collective(fn) is None
    assert native_split(fn) is None
    assert not capturable([fn])
    assert split_collective(_body_with()) is not None


def test_the_evaluator_mode_keeps_every_collective_off_the_kernels(monkeypatch):
    fn = specialize(allreduce_tile(DType.BF16, 8, 32, 16), {"R": 8})
    assert native_split(fn) is not None and capturable([fn])
    monkeypatch.setenv("PTO_COLLECTIVES", "evaluator")
    assert native_split(fn) is None and not capturable([fn])
    monkeypatch.setenv("PTO_COLLECTIVES", "nope")
    with pytest.raises(Exception, match="PTO_COLLECTIVES='nope': expected one of auto, group, symm, evaluator"):
        native_split(fn)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_chunk_count_is_one_line_naming_it(value, monkeypatch):
    from pto.backends.triton.collective import chunks
    from pto.errors import UsageError

    monkeypatch.setenv("PTO_COLLECTIVE_CHUNKS", value)
    with pytest.raises(UsageError, match=f"PTO_COLLECTIVE_CHUNKS='{value}': expected a positive integer"):
        chunks()


#: the cases without a matmul (a Triton dot sums in another order than torch's matmul)
EXACT = [c for c in CASES if not c[0].startswith("matmul")]


@pytest.mark.interpret
@pytest.mark.parametrize("chunks", ["1", "4"])
@pytest.mark.parametrize("case", EXACT, ids=[c[0] for c in EXACT])
def test_the_triton_backend_runs_the_parts_as_kernels(case, chunks, monkeypatch):
    """The backend's launch of a collective batch (two Triton kernels around the sum, under the
    interpreter; 5 tasks whole or in 4 chunks of 1 or 2 tasks, the last task clipped) against
    the torch evaluator: the same bits in f32. In bf16 the interpreter rounds to bf16 otherwise
    than torch does (toward zero), in the cut's casts as in every bf16 instruction of any kernel
    (a plain bf16 residual add differs from the evaluator the same way): each rounding may land
    a whole ulp (up to 2^-7 of the value) apart, and a case rounds at most twice on the way to
    its output, so within 2^-6 of the output's norm (the scaled case: 5e-3, its product rounded
    before a sum that cancels)."""
    from pto.backends.triton import TritonBackend

    monkeypatch.setenv("PTO_COLLECTIVE_CHUNKS", chunks)
    _, fn, names, rows, cols, scalars = case
    dtype = fn.memrefs[0].dtype.torch
    ref = _batch(fn, names, rows, cols, 5, torch.Generator().manual_seed(5), dtype, scalars)
    got = _copy(ref)
    run_incore_batch(fn, ref.mems, ref.scalars, ref.size)
    be = TritonBackend("cpu")
    launch = be.prepare(got)
    # two kernels a chunk (no evaluator), as the launch counts say
    assert launch.count == be.launches_per_batch(got) >= 2 * int(chunks)
    launch()
    for name in names:
        a, b = ref.mems[name].tensor, got.mems[name].tensor
        if dtype == torch.float32:
            assert torch.equal(a, b), name
        else:
            rel = ((a.double() - b.double()).norm() / a.double().norm()).item()
            assert rel <= 2.0**-6, (name, rel)


def test_a_failed_run_cancels_the_compiles_of_every_part():
    """A launch of a collective batch carries a ``future`` whose ``cancel`` reaches each part's
    queued compile (the wave executor cancels held launches when a run fails)."""
    from pto.backends.triton.collective import _Futures

    class Pending:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    parts_ = [type("L", (), {"future": Pending()})(), type("L", (), {"future": None})(),
              type("L", (), {"future": Pending()})()]
    _Futures(parts_).cancel()
    assert parts_[0].future.cancelled and parts_[2].future.cancelled


@pytest.mark.interpret
def test_the_triton_backend_runs_a_projection_with_its_sum():
    """matmul_allreduce_residual_tile in f32 through the backend's two kernels: the product in a
    Triton dot (another summation order), so within the f32 bound of a K = 32 term sum of
    standard normal products (u sqrt(K) relative per element, a few units of it)."""
    from pto.backends.triton import TritonBackend

    _, fn, names, rows, cols, scalars = next(c for c in CASES if c[0] == "matmul-f32-f32")
    ref = _batch(fn, names, rows, cols, 3, torch.Generator().manual_seed(6), torch.float32, scalars)
    got = _copy(ref)
    run_incore_batch(fn, ref.mems, ref.scalars, ref.size)
    TritonBackend("cpu").prepare(got)()
    torch.testing.assert_close(got.mems["y"].tensor, ref.mems["y"].tensor, rtol=0, atol=8 * 2.0**-24 * 32**0.5 * 8)


def test_the_batches_of_one_backend_share_one_sum_buffer():
    """Two batches through one pool: the second takes the front of the first one's buffer (or
    grows it), so a graph with many collective batches holds one buffer, not one per batch."""
    from pto.backends.triton.tables import task_env

    _, fn, names, rows, cols, scalars = next(c for c in CASES if c[0] == "residual-bf16-f32")
    split, pool = split_collective(fn), SumBuffers()
    small = _batch(fn, names, rows, cols, 2, torch.Generator().manual_seed(1), torch.bfloat16)
    big = _batch(fn, names, rows, cols, 5, torch.Generator().manual_seed(2), torch.bfloat16)
    a = parts(big, split, task_env(big), pool=pool).send
    b = parts(small, split, task_env(small), pool=pool).send
    assert a.shape == (5 * rows, cols) and b.shape == (2 * rows, cols)
    assert b.data_ptr() == a.data_ptr() and len(pool._flat) == 1
    more = _batch(fn, names, rows, cols, 7, torch.Generator().manual_seed(3), torch.bfloat16)
    c = parts(more, split, task_env(more), pool=pool).send
    assert c.shape[0] == 7 * rows and next(iter(pool._flat.values())).numel() == c.numel()
