"""The wave executor: run a task graph with a backend, a handful of launches per wave.

Repeatedly: take every ready task, group by (function variant, tensors bound to each memref
parameter), launch one batched kernel per group, complete the tasks. On one CUDA stream launch
order is completion order, so a task counts as complete once its batch is enqueued. The
launches of the first run are kept: :meth:`WaveExecutor.replay` runs them again, and
:meth:`WaveExecutor.capture` records them into a CUDA graph (Python launches cost ~17 µs on an H100;
graph nodes ~1 µs).

Per-task arguments come from one bulk export of the runtime (numpy arrays), so grouping costs
numpy operations per wave, not Python per task. ``order="random"`` executes random subsets of
the ready tasks instead of whole waves (tests: any ready order must give the same result).
With ``sentinel=True`` the host checks every task's regions for NaN and infinities between waves
(:class:`pto.exec.sentinel.TaskFlags`, in ``flags`` after :meth:`WaveExecutor.run`); without it
the loop does nothing more.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from pto.backends.base import Backend
from pto.data.batch import RegionBatch, TaskBatch
from pto.errors import ExecutionError
from pto.exec.base import ExecStats, Executor, LaunchRecord, Progress
from pto.exec.sentinel import TaskFlags, declared_infinities
from pto.exec.timing import median_ms
from pto.ir.analysis import has_collective, param_access, specialize
from pto.ir.expr import const_value
from pto.ir.nodes import IncoreFunction, MemRefParam
from pto.runtime import Runtime
from pto.runtime.graph import CompiledProgram, Graph


class _Args:
    """Per-task arguments, from a bulk export (fast) or per-task queries (windowed runs)."""

    def __init__(self, runtime: Runtime, bulk: bool):
        self.rt = runtime
        self.bulk = bulk
        if bulk:
            ex = self.export = runtime.export()
            self.first = ex.first_task
            self.func = ex.func
            self.arg_ptr = ex.arg_ptr
            self.arg_tensor = ex.arg_tensor
            self.arg_region = ex.arg_region
            self.arg_scalar = ex.arg_scalar

    def funcs(self, ids: np.ndarray) -> np.ndarray:
        if self.bulk:
            return self.func[ids - self.first]
        return np.array([self.rt.task_info(int(t))["func"] for t in ids], dtype=np.int32)

    def table(self, ids: np.ndarray, nargs: int):
        """(tensor ids [B, nargs], regions [B, nargs, 4], scalars [B, nargs])"""
        if self.bulk:
            base = self.arg_ptr[ids - self.first][:, None] + np.arange(nargs)[None, :]
            return self.arg_tensor[base], self.arg_region[base], self.arg_scalar[base]
        tens = np.zeros((len(ids), nargs), np.int32)
        reg = np.zeros((len(ids), nargs, 4), np.int64)
        sca = np.zeros((len(ids), nargs), np.int64)
        for i, t in enumerate(ids):
            for k, (_kind, tensor, r0, c0, nr, nc, s) in enumerate(self.rt.task_args(int(t))):
                tens[i, k], reg[i, k], sca[i, k] = tensor, (r0, c0, nr, nc), s
        return tens, reg, sca


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Views:
    """Tensors that are 2-D views of one buffer with one row stride (weights allocated as blocks of
    one buffer, as the LLaMA layer's q, k and v: :meth:`pto.program.Program.packed_inputs`) are
    bound to memrefs as one tensor, the buffer's span, each region moved by its view's offset: a
    batch of one function over several of them is one launch. ``by_id`` gains the spans (ids
    below 0); :meth:`remap` rewrites a wave's tensor ids and regions."""

    def __init__(self, by_id: dict[int, torch.Tensor]):
        groups: dict[tuple, list[int]] = {}
        for tid, t in by_id.items():
            if t.dim() == 2 and t.stride(1) == 1 and t.numel() > 0:
                groups.setdefault((_storage(t), t.dtype, t.device, t.stride(0)), []).append(tid)
        size = max(by_id, default=-1) + 1
        self.base = np.arange(size, dtype=np.int32)
        self.offset = np.zeros((size, 2), np.int64)  # (rows, cols) of each view in its span
        self.merged = False
        for (_, _, _, stride), tids in groups.items():
            offs = {tid: divmod(by_id[tid].storage_offset(), stride) for tid in tids}
            # a view that wraps a row is not a column slice: it keeps its own id; nor is a column
            # offset into a quantized tensor's bytes (uint8: its rows are packed blocks) a column
            offs = {tid: (r, c) for tid, (r, c) in offs.items() if c + by_id[tid].shape[1] <= stride
                    and (c == 0 or by_id[tid].dtype != torch.uint8)}
            if len(offs) < 2:
                continue
            row0 = min(r for r, _ in offs.values())
            rows = max(r + by_id[tid].shape[0] for tid, (r, _) in offs.items()) - row0
            cols = max(c + by_id[tid].shape[1] for tid, (_, c) in offs.items())
            t = by_id[next(iter(offs))]
            if (row0 + rows - 1) * stride + cols > t.untyped_storage().nbytes() // t.element_size():
                continue
            span = -1 - len([k for k in by_id if k < 0])
            by_id[span] = torch.as_strided(t, (rows, cols), (stride, 1), row0 * stride)
            for tid, (r, c) in offs.items():
                self.base[tid], self.offset[tid] = span, (r - row0, c)
            self.merged = True

    def remap(self, tens: np.ndarray, reg: np.ndarray, mem_idx: list[int]) -> None:
        """In place: the memrefs' tensor ids [B, nargs] to their spans, the regions [B, nargs, 4]
        to the spans' coordinates."""
        if not self.merged or not mem_idx:
            return
        ids = tens[:, mem_idx]
        tens[:, mem_idx] = self.base[ids]
        reg[:, mem_idx, :2] += self.offset[ids]


def directions(fn: IncoreFunction) -> tuple[dict[str, str], bool]:
    """Per memref parameter of ``fn``: "in", "out" or "inout"; and does a batch of it surely
    launch (a parallel axis whose extent may be 0 for every task launches nothing). Cached."""
    d = _DIRECTIONS.get(fn)
    if d is None:
        spec = specialize(fn) if fn.dims else fn
        extent = None if spec.parallel is None else const_value(spec.parallel.extent)
        d = _DIRECTIONS[fn] = ({p: a.direction for p, a in param_access(fn).items()},
                               spec.parallel is None or (extent is not None and extent > 0))
    return d


_DIRECTIONS: dict = {}


@dataclass(eq=False)
class _Seen:
    """A batch as the PDL policies see it: the storages of the memrefs it only reads (``ins``)
    and of those it writes, whether it surely launches, and ``running``: what the launches that
    may still run when it starts write (None: not known, the run's first batch). A batch starts
    once its predecessor has signalled: after the predecessor's wait (so every launch before the
    predecessor is done), or never, a predecessor that may launch nothing (then whatever may run
    when that one starts may run still)."""

    ins: dict[str, int]
    writes: set[int]
    launches: bool
    running: set[int] | None = None

    def follow(self, before: _Seen | None) -> None:
        if before is None:
            self.running = None
        elif not before.launches:
            self.running = None if before.running is None else before.writes | before.running
        else:
            self.running = set(before.writes)

    def readonly(self) -> frozenset[str]:
        """What the batch may load before its wait: what it only reads and no launch that may
        still run writes."""
        if self.running is None:
            return frozenset()
        return frozenset(p for p, s in self.ins.items() if s not in self.running)


class WaveExecutor(Executor):
    """Runs one graph's tasks on ``tensors`` (name -> torch tensor) with ``backend``."""

    name = "waves"

    def __init__(self, backend: Backend, tensors: dict[str, torch.Tensor], record: bool = False,
                 progress: Progress | None = None, order: str = "waves", seed: int = 0,
                 sync_each_launch: bool = False, sentinel: bool = False):
        if order not in ("waves", "random"):
            raise ExecutionError(f"unknown execution order {order!r}")
        super().__init__(backend, tensors, record, progress)
        self.order = order
        self.on_batch = None  # called with every TaskBatch before it is prepared
        self.rng = np.random.default_rng(seed)
        self.sync_each_launch = sync_each_launch
        self.sentinel = sentinel
        self.flags: TaskFlags | None = None  # the sentinel's records of the last run
        # PDL "auto": a batch is issued once the next is known (whether it loads early decides
        # where the first signals); not with per-launch records, syncs or the sentinel's scans
        self._defer = getattr(backend, "pdl", "") == "auto" and not (record or sync_each_launch or sentinel)
        self._reset()

    def _reset(self) -> None:
        self.launches: list = []  # prepared launches of the last run, in order
        self.launch_funcs: list[IncoreFunction] = []  # the variant each one runs
        self.device_launches = 0
        self.records: list[LaunchRecord] = []
        self._held: list | None = None  # launches held back while their kernels compile (run)
        #: the batch whose issue waits for the next one (_defer; at most one): [wave, ids, batch]
        self._pending: list[list] = []
        self._last: _Seen | None = None  # what the last batch seen writes and may leave running
        self._inputs: set[int] = set()  # storages of the graph's input tensors (weights)

    # -- one graph, fully built ------------------------------------------------------------
    def run(self, graph: Graph) -> ExecStats:
        """Execute a fully built graph (window 0)."""
        self._reset()
        self._inputs = self._input_storages(graph.program.module)
        args = _Args(graph.runtime, bulk=True)
        if self.sentinel:
            self.flags = TaskFlags(args.export, {tid: self.tensors[n] for n, tid in graph.tensor_ids.items()},
                                   declared_infinities(graph.variants))
        # launches whose kernels compile on workers wait, in order, until every wave is planned
        # (a first run's compiles overlap); not with per-launch records, syncs or the sentinel
        hold = not (self.record or self.sync_each_launch or self.sentinel or self.on_batch is not None)
        self._held = [] if hold else None
        t0 = time.perf_counter()
        try:
            stats = self._drive(graph.runtime, args, graph.variant_of_func_id(), graph.tensor_ids,
                                total=lambda: graph.tasks, done_building=lambda: True)
            while self._held:
                self._held.pop(0)()
        finally:
            for launch in self._held or ():  # not run (an error): their queued compiles are not needed
                future = getattr(launch, "future", None)
                if future is not None:
                    future.cancel()
            self._held = None
        # the held launches too (and the waits for their compiles); the backend's own compiles apart
        stats.exec_ms = (time.perf_counter() - t0) * 1e3 - stats.kernel_compile_ms
        return stats

    # -- build and execute concurrently (bounded window) -------------------------------------
    def run_concurrent(self, program: CompiledProgram, scalars: dict[str, int], window: int,
                       timeout_s: float = 600.0) -> ExecStats:
        """Build on a second thread through a ``window``-slot runtime while executing here."""
        self._reset()
        if self.sentinel:
            raise ExecutionError("the non-finite sentinel needs a fully built graph (run, not run_concurrent)")
        if any(has_collective(v.func) for v in program.variants):
            # tasks are batched as the build thread submits them, differently on every rank
            raise ExecutionError("a graph with collectives runs fully built (run, not run_concurrent): every rank "
                                 "must issue the same collectives in the same order")
        rt = Runtime(window=window, concurrent=True, lib=program.lib)
        try:
            tensor_ids, func_ids, build = program.start(scalars, rt)
            self._inputs = self._input_storages(program.module)
            variants = {fid: v.func for fid, v in zip(func_ids, program.variants)}
            errors: list[BaseException] = []

            def worker():
                try:
                    build()
                except BaseException as e:  # reported on the executing thread
                    errors.append(e)

            th = threading.Thread(target=worker, daemon=True)
            th.start()
            deadline = time.monotonic() + timeout_s

            def done_building():
                if errors:
                    raise errors[0]
                if time.monotonic() > deadline:
                    raise ExecutionError(f"concurrent build did not finish in {timeout_s:.0f} s")
                return not th.is_alive()

            stats = self._drive(rt, _Args(rt, bulk=False), variants, tensor_ids,
                                total=lambda: int(rt.stats()["tasks_submitted"]), done_building=done_building)
            th.join(timeout=1.0)
            if errors:
                raise errors[0]
            return stats
        finally:
            rt.close()

    # -- the loop ------------------------------------------------------------------------------
    def _drive(self, rt: Runtime, args: _Args, variants: dict[int, IncoreFunction],
               tensor_ids: dict[str, int], total, done_building) -> ExecStats:
        by_id = {tid: self.tensors[name] for name, tid in tensor_ids.items()}
        self._views = Views(by_id)
        t0, compiled = time.perf_counter(), self.backend.compile_ms
        pool = np.empty(0, np.int32)
        done = waves = 0
        idle_spins = 0
        while True:
            fresh = rt.ready_pop()
            if len(fresh):
                pool = np.concatenate([pool, fresh.astype(np.int32)])
            if len(pool) == 0:
                finished = done_building()
                if finished and done >= total():
                    break
                if finished and rt.ready_count() == 0:
                    raise ExecutionError(f"no task is ready but only {done} of {total()} completed "
                                         "(a dependency cycle or a lost completion)")
                idle_spins += 1
                time.sleep(0 if idle_spins < 100 else 1e-4)
                continue
            idle_spins = 0
            if self.order == "random" and len(pool) > 1:
                self.rng.shuffle(pool)
                k = int(self.rng.integers(1, len(pool) + 1))
                ids, pool = pool[:k], pool[k:]
            else:
                ids, pool = pool, np.empty(0, np.int32)
            if self.flags is not None:
                self.flags.scan(ids, writes=False)
            self._wave(waves, ids, args, variants, by_id)
            if self.flags is not None:
                self.flags.scan(ids, writes=True)
            rt.complete(ids)
            done += len(ids)
            waves += 1
            if self.progress is not None:
                self.progress(done, total())
        while self._pending:  # (the last batch)
            self._issue_first()
        if self.sync_each_launch or self.record:
            self.sync()
        compiled = self.backend.compile_ms - compiled  # (the backend's kernels compiled as prepared)
        ms = (time.perf_counter() - t0) * 1e3 - compiled
        return ExecStats(done, waves, self.device_launches, ms, self.records, kernel_compile_ms=compiled)

    def _wave(self, wave: int, ids: np.ndarray, args: _Args, variants, by_id) -> None:
        funcs = args.funcs(ids)
        # sorted(set()), not np.unique: numpy's first 1-D unique imports numpy.ma (0.1-0.5 s)
        for fid in sorted(set(funcs.tolist())):
            sel = ids[funcs == fid]
            fn = variants[fid]
            nargs = len(fn.params)
            tens, reg, sca = args.table(sel, nargs)
            mem_idx = [k for k, p in enumerate(fn.params) if isinstance(p, MemRefParam)]
            views = tens[:, mem_idx].copy() if self._views.merged else None  # the tensors before remap
            self._views.remap(tens, reg, mem_idx)
            keys = tens[:, mem_idx]
            if len(sel) > 1 and (keys != keys[0]).any():
                uniq, inv = np.unique(keys, axis=0, return_inverse=True)
                groups = [np.nonzero(inv.reshape(-1) == g)[0] for g in range(len(uniq))]
            else:
                groups = [np.arange(len(sel))]
            # largest tasks first (by elements their regions cover): with causal attention the
            # late q tiles do the most work, and a GPU runs the first programs first
            work = (reg[:, mem_idx, 2] * reg[:, mem_idx, 3]).sum(axis=1)
            for g in groups:
                if views is None:
                    g = g[np.argsort(-work[g], kind="stable")]
                else:  # among tasks of one size, one view's together (its weight shared in L2 by the grouped order)
                    g = g[np.lexsort((*views[g].T[::-1], -work[g]))]
                self._launch(wave, fn, sel[g], tens[g], reg[g], sca[g], by_id)

    def _launch(self, wave, fn: IncoreFunction, ids, tens, reg, sca, by_id) -> None:
        mems, scalars = {}, {}
        for k, p in enumerate(fn.params):
            if isinstance(p, MemRefParam):
                # (row0, col0, rows, cols) as four contiguous vectors
                r = torch.from_numpy(np.ascontiguousarray(reg[:, k, :].T))
                mems[p.name] = RegionBatch(by_id[int(tens[0, k])], *r.unbind(0))
            else:
                scalars[p.name] = torch.from_numpy(np.ascontiguousarray(sca[:, k]))
        seen = self._see(fn, mems)
        batch = TaskBatch(fn, mems, scalars, len(ids), seen.readonly())
        if not self._defer:
            self._issue(wave, ids, batch)
            return
        self._pending.append([wave, ids, batch])
        if len(self._pending) > 1:  # the one before this: its successor is known now
            self._issue_first()

    def _issue_first(self) -> None:
        """Issue the first pending batch, signalling right after its wait where the batch after
        it loads a weight early ("chain")."""
        wave, ids, batch = self._pending.pop(0)
        if self._pending:
            batch.chain = self._weights_early(self._pending[0][2])
        self._issue(wave, ids, batch)

    def _input_storages(self, module) -> set[int]:
        return {_storage(self.tensors[t.name]) for t in module.entry_function.tensors
                if t.role == "input" and t.name in self.tensors}

    def _weights_early(self, batch: TaskBatch) -> bool:
        """Does ``batch`` load inputs (weights) before its wait? Then the batch before it signals
        right after its own wait, so that those loads overlap its work ("chain"). Not for early
        loads of other memory (a residual, a position): a few bytes, where a launch made resident
        early costs its predecessor more (on an H100 the 8B step at 8 sequences 8.03 against 7.15
        ms, SmolLM2's at one 0.490 against 0.457; docs/PERF.md, "Tenth session")."""
        early = self.backend.loads_early(batch)
        return any(_storage(batch.mems[p].tensor) in self._inputs for p in early)

    def _settled(self, fn: IncoreFunction, mems: dict[str, RegionBatch]) -> frozenset[str]:
        """The memrefs ``fn`` only reads whose tensors the previous batch does not write: when a
        launch starts (PDL), every launch before its predecessor has completed (each waits for
        its own predecessor before it lets the next start), so these may load before the wait.
        None for the run's first batch (its predecessor is whatever ran before). Tensors are told
        apart by storage (views of one buffer are one). A task's own stores are the renderer's
        to respect (no load moves above one: :func:`~pto.codegen.triton.body.early_loads`); the
        other tasks of its batch write no region it reads (they would depend on each other)."""
        return self._see(fn, mems).readonly()

    def _see(self, fn: IncoreFunction, mems: dict[str, RegionBatch]) -> _Seen:
        """The next batch's :class:`_Seen`, after the last one seen."""
        io, launches = directions(fn)
        seen = _Seen({p: _storage(mems[p].tensor) for p, d in io.items() if d == "in"},
                     {_storage(mems[p].tensor) for p, d in io.items() if d != "in"}, launches)
        seen.follow(self._last)
        self._last = seen
        return seen

    def _issue(self, wave, ids, batch: TaskBatch) -> None:
        fn = batch.fn
        if self.on_batch is not None:  # pto tune collects the batches it times
            self.on_batch(batch)
        ahead = self._held is not None
        launch = self.backend.prepare_ahead(batch) if ahead else self.backend.prepare(batch)
        self.device_launches += launch.count
        self.launches.append(launch)
        self.launch_funcs.append(fn)
        if ahead and (self._held or getattr(launch, "pending", False)):
            self._held.append(launch)  # its kernel compiles on a worker: it and what follows wait
            return
        rec = None
        if self.record:
            self.sync()
            rec = LaunchRecord(wave, fn.variant_name, np.array(ids), time.perf_counter_ns())
        launch()
        if self.sync_each_launch or rec is not None:
            self.sync()
        if rec is not None:
            rec.end_ns = time.perf_counter_ns()
            self.records.append(rec)

    # -- replays -----------------------------------------------------------------------------
    def replay(self) -> None:
        """Run the recorded launches again, in order."""
        for launch in self.launches:
            launch()

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Milliseconds per InCore function: each recorded launch timed on its own (warmed up,
        median of ``repeat``; CUDA events on the GPU), summed per function. The first run
        compiled the kernels, so this is kernel time, not compile time."""
        acc: dict[str, float] = {}
        for launch, fn in zip(self.launches, self.launch_funcs):
            acc[fn.name] = acc.get(fn.name, 0.0) + median_ms(launch, repeat, warmup=1, cuda=self.cuda)
        return {k: round(v, 4) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}
