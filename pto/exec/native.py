"""The native executor: a whole task graph on the CPU, in C, with no Python per task.

The program is compiled once into one shared object (the ``c`` backend's
:func:`~pto.backends.c.build.program_module`: the runtime, the generated orchestration, the InCore
functions as C and the worker pool of ``runtime_c/pto_native.c``). Each run creates a runtime
with a bounded window whose sync hooks are the pool's, starts the workers, and runs the
orchestration's ``build`` on a helper thread: the workers take tasks from the runtime's ready
queue and call their kernels while it is still submitting, completions release successors in C,
and a graph larger than the window runs in the window's memory (the orchestration waits for
room, running ready tasks itself meanwhile). When the build returns, that thread works too
until every task has completed. Python only starts it and waits (the calls release the GIL);
Ctrl-C cancels (tasks not started complete without running, the build runs to its end) and
re-raises; a failure is one :class:`pto.errors.ExecutionError` (or the build's RegionError).

Threads: ``PTO_THREADS``, else one per physical core this process may run on (the
orchestration thread is one of them); torch runs on one thread meanwhile, so the two never
hold more threads than cores. A replay is another run (the graph is built again as it executes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import torch

from pto.errors import ExecutionError, ResourceError, RuntimeStatusError, UsageError
from pto.exec.base import ExecStats, Executor, ItemRecord, Progress
from pto.ir.analysis import has_collective
from pto.runtime import Runtime
from pto.runtime.graph import Graph

#: task slots of the native runtime's window (about 120 bytes each: 2 MB)
DEFAULT_WINDOW = 16384
#: a run shorter than this (the last one's milliseconds) runs on the calling thread
DIRECT_MS = 50.0


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyperthreads of one core count
    once; Linux's topology files), at least 1."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)
    cores = set()
    for cpu in cpus:
        top = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((top / "physical_package_id").read_text().strip(), (top / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(len(cores), 1)


def default_threads() -> int:
    """``PTO_THREADS`` (a positive integer), else :func:`physical_cores`."""
    text = os.environ.get("PTO_THREADS", "").strip()
    if not text:
        return physical_cores()
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"PTO_THREADS must be a positive integer, got {text!r}")
    return int(text)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` meanwhile."""
    prev = torch.get_num_threads()
    if prev != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if prev != n:
            torch.set_num_threads(prev)


class _Pool:
    """The thin layer over ``pto_native_*``: statuses become RuntimeStatusError."""

    def __init__(self, module, threads: int):
        self.ffi, self.lib = module.ffi, module.lib
        self.threads = threads
        self.ptr = self.ffi.NULL

    def install(self, cfg) -> None:
        """The pool's hooks into a new runtime's ``cfg``: a new pool, or the one of the last run
        (its workers parked: a run starts no thread)."""
        if self.ptr != self.ffi.NULL:
            self._check(self.lib.pto_native_reuse(self.ptr, cfg), "reuse")
            return
        out = self.ffi.new("pto_native **")
        self._check(self.lib.pto_native_create(cfg, self.threads, out), "create")
        self.ptr = out[0]

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            name = self.ffi.string(self.lib.pto_status_name(status)).decode()
            raise RuntimeStatusError(f"native pool: {what}: {name}", status)

    def attach(self, rt: Runtime) -> None:
        self._check(self.lib.pto_native_attach(self.ptr, rt.ptr), "attach")

    def bind_tensor(self, tid: int, t: torch.Tensor, ld: int, packed: bool = False) -> None:
        """``t`` as tensor ``tid``, rows ``ld`` elements apart (``packed``: rows of quantized
        blocks, ``ld`` bytes apart)."""
        bind = self.lib.pto_native_bind_rows if packed else self.lib.pto_native_bind_tensor
        self._check(bind(self.ptr, tid, self.ffi.cast("void *", t.data_ptr()), ld), f"tensor {tid}")

    def bind_kernel(self, fid: int, info) -> None:
        self._check(self.lib.pto_native_bind_kernel(self.ptr, fid, info), f"function {fid}")

    def progress(self) -> tuple[int, int, int, int]:
        """(tasks completed, failed task, its function id, status)"""
        out = self.ffi.new("int64_t *"), self.ffi.new("int32_t *"), self.ffi.new("int32_t *"), self.ffi.new("int32_t *")
        self.lib.pto_native_progress(self.ptr, *out)
        return tuple(int(p[0]) for p in out)

    def destroy(self) -> None:
        if self.ptr != self.ffi.NULL:
            self.lib.pto_native_destroy(self.ptr)
            self.ptr = self.ffi.NULL

    def __del__(self) -> None:
        self.destroy()


class _Helper(threading.Thread):
    """The thread that builds, then works; ``done`` is set when it ends. Waiting is on the
    event, not ``join``: CPython 3.11's ``join`` interrupted by Ctrl-C may mark a running thread
    as stopped (bpo-45274's fix releases the lock the thread holds), and the pool must not be
    freed under a thread that still uses it."""

    def __init__(self, body):
        super().__init__(name="pto-native-build", daemon=True)
        self.body, self.done = body, threading.Event()

    def run(self) -> None:
        try:
            self.body()
        finally:
            self.done.set()

    def wait_out(self) -> None:
        """Wait until it has ended, whatever interrupts arrive meanwhile."""
        while not self.done.is_set():
            try:
                self.done.wait()
            except KeyboardInterrupt:
                continue


class NativeExecutor(Executor):
    """Runs whole graphs with the ``c`` backend's compiled program (see the module docstring)."""

    name = "native"

    def __init__(self, backend, tensors: dict[str, torch.Tensor], record: bool = False,
                 progress: Progress | None = None, sentinel: bool = False, threads: int | None = None,
                 window: int = DEFAULT_WINDOW):
        super().__init__(backend, tensors, record, progress)
        self.sentinel = sentinel
        self.threads = default_threads() if threads is None else threads
        if self.threads < 1:
            raise UsageError(f"the native executor needs at least one thread, got {self.threads}")
        self.window = window
        self.graph: Graph | None = None
        self.program = None
        self.last_ms = 0.0
        self.runtime_stats: dict = {}  # the runtime's counters after the last run (memory, tasks)
        self._helper: _Helper | None = None
        self._pool: _Pool | None = None  # the last run's pool: its workers wait for the next run

    def run(self, graph: Graph) -> ExecStats:
        if "native" not in self.backend.capabilities:
            raise ResourceError(f"the native executor runs compiled programs; the {self.backend.name} backend has none")
        if self.sentinel:
            raise ResourceError("the non-finite sentinel scans between waves, which the native executor does not have")
        if any(has_collective(v) for v in graph.variants):
            raise ResourceError("the native executor runs no collectives (every rank must issue them in one order)")
        self.graph = graph
        t0 = time.perf_counter()
        self.program = self.backend.program(graph.program.corch)  # compiled or loaded once, then kept
        t1 = time.perf_counter()
        records = self._execute(record=self.record)
        return ExecStats(graph.tasks, 1, 1, (time.perf_counter() - t1) * 1e3, records or [],
                         kernel_compile_ms=(t1 - t0) * 1e3)

    def replay(self) -> None:
        if self.graph is None:
            raise ExecutionError("replay before the first run")
        self._execute()

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Milliseconds per InCore function: its tasks' kernel times summed over a run (on every
        thread: with several, the sum exceeds the run's wall clock), the median of ``repeat``."""
        runs: list[dict[str, float]] = []
        for _ in range(max(repeat, 1)):
            acc: dict[str, float] = {}
            for r in self._execute(record=True):
                acc[r.func] = acc.get(r.func, 0.0) + (r.end_ns - r.start_ns) * 1e-6
            runs.append(acc)
        names = {v.name: v for v in self.graph.variants}
        per_fn: dict[str, list[float]] = {}
        for acc in runs:
            by_fn: dict[str, float] = {}
            for variant, ms in acc.items():
                fn = next((n for n in names if variant == n or variant.startswith(n + "__")), variant)
                by_fn[fn] = by_fn.get(fn, 0.0) + ms
            for fn, ms in by_fn.items():
                per_fn.setdefault(fn, []).append(ms)
        out = {fn: round(sorted(v)[len(v) // 2], 4) for fn, v in per_fn.items()}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def report(self) -> dict:
        return {"threads": self.threads, "window": self.window}

    # -- one run -------------------------------------------------------------------------------
    def _execute(self, record: bool = False) -> list[ItemRecord] | None:
        """One run; with ``record``, every task's record (its thread as the lane). The pool of
        the last run is reused (its threads parked), unless the thread count changed."""
        graph, pm = self.graph, self.program
        pool = self._pool
        if pool is None or pool.threads != self.threads or pool.lib is not pm.module.lib:
            if pool is not None:
                pool.destroy()
            pool = self._pool = _Pool(pm.module, self.threads)
        rt, ok = None, False
        try:
            rt = Runtime(window=self.window, lib=pm.module, hooks=pool.install)
            pool.attach(rt)
            tensor_ids, func_ids, build = graph.program.start(graph.scalars, rt, lib=pm.module)
            self._bind(pool, tensor_ids, func_ids)
            if record:
                pool._check(pool.lib.pto_native_record(pool.ptr, graph.tasks), "record")
            pool._check(pool.lib.pto_native_start(pool.ptr), "start")
            with torch_threads(1):
                self._drive(pool, build, func_ids)
            self.runtime_stats = rt.stats()
            records = self._records(pool, func_ids) if record else None
            ok = True
            return records
        finally:  # the run is over (a helper interrupted before it ended is cancelled and waited for)
            helper, self._helper = self._helper, None
            if helper is not None and not helper.done.is_set():
                pool.lib.pto_native_cancel(pool.ptr)
                helper.wait_out()
            try:
                if rt is not None:
                    rt.close()
            finally:
                if not ok:  # whatever failed, the next run starts from a new pool
                    pool.destroy()
                    self._pool = None

    def close(self) -> None:
        """Stop the pool's parked workers (also when the executor is collected)."""
        if self._pool is not None:
            self._pool.destroy()
            self._pool = None

    def _records(self, pool: _Pool, func_ids: list[int]) -> list[ItemRecord]:
        import numpy as np

        n = pool.ffi.new("int64_t *")
        pool.lib.pto_native_records(pool.ptr, pool.ffi.NULL, 0, n)
        buf = np.zeros((n[0], 5), np.int64)
        pool.lib.pto_native_records(pool.ptr, pool.ffi.cast("int64_t *", buf.ctypes.data), n[0], n)
        names = dict(zip(func_ids, (v.variant_name for v in self.graph.variants)))
        return [ItemRecord(int(t), 0, int(th), int(a), int(b), names[int(f)]) for t, f, th, a, b in buf.tolist()]

    def _bind(self, pool: _Pool, tensor_ids: dict[str, int], func_ids: list[int]) -> None:
        decls = {t.name: t for t in self.graph.program.module.entry_function.tensors}
        for name, tid in tensor_ids.items():
            t = self.tensors[name]
            dtype = decls[name].dtype
            pool.bind_tensor(tid, t, self.backend.row_stride(t, f"tensor `{name}`", dtype), dtype.is_quantized)
        kernel = self.program.fn("kernel")
        for k, fid in enumerate(func_ids):
            pool.bind_kernel(fid, kernel(k))

    def _drive(self, pool: _Pool, build, func_ids: list[int]) -> None:
        """Build then work (C calls that release the GIL). A run that took more than
        :data:`DIRECT_MS` last time (or has not run yet) does so on a helper thread and waits
        here, so that Ctrl-C reaches Python at once: it cancels the run, and is raised once the
        helper has finished; a shorter one runs on this thread (no thread to start: a replay of a
        small graph costs less; Ctrl-C waits for its end, milliseconds)."""
        errors: list[BaseException] = []
        status = [0]

        def helper():
            try:
                build()
            except BaseException as e:  # the build failed: drain what it submitted
                errors.append(e)
                pool.lib.pto_native_cancel(pool.ptr)
            status[0] = pool.lib.pto_native_work(pool.ptr)

        t0 = time.perf_counter()
        total = self.graph.tasks
        if 0 < self.last_ms < DIRECT_MS and self.progress is None:
            helper()
        else:
            th = self._helper = _Helper(helper)
            try:
                th.start()
                while not th.done.wait(0.05):
                    if self.progress is not None:
                        self.progress(min(pool.progress()[0], total), total)
            except BaseException:  # Ctrl-C (or a failing progress callback): cancel, wait for the run
                pool.lib.pto_native_cancel(pool.ptr)
                th.wait_out()
                raise
        self.last_ms = (time.perf_counter() - t0) * 1e3
        if errors:
            raise errors[0]
        if status[0] != 0:
            _, task, fid, st = pool.progress()
            names = dict(zip(func_ids, (v.variant_name for v in self.graph.variants)))
            what = pool.ffi.string(pool.lib.pto_status_name(st or status[0])).decode()
            if task >= 0:
                raise ExecutionError(f"task {task} (`{names.get(fid, fid)}`) failed in its compiled kernel: {what}")
            raise ExecutionError(f"the native run failed: {what}")
        if self.progress is not None:
            self.progress(total, total)


__all__ = ["NativeExecutor", "DEFAULT_WINDOW", "default_threads", "physical_cores", "torch_threads"]
