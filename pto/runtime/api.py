"""The Pythonic layer of the runtime binding: :class:`Runtime` and :class:`GraphExport`.

:class:`Runtime` owns one C runtime (a context manager; closed on exit), takes and returns ints,
numpy arrays and dicts, and calls C through the thin layer :class:`pto.runtime.RuntimeLib`, so
its arguments are checked as that layer checks them (:mod:`pto.runtime.checks`).
:meth:`Runtime.export` hands the whole live graph out as one :class:`GraphExport` of numpy arrays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pto.errors import RuntimeStatusError
from pto.runtime.checks import check_i32
from pto.runtime.lib import RuntimeLib
from pto.runtime.loader import load_runtime_module


@dataclass
class GraphExport:
    """All live submitted tasks of a runtime as numpy arrays (see :meth:`Runtime.export`).

    Row ``i`` of the per-task arrays is task id ``first_task + i``. Arguments of task ``i`` are
    rows ``arg_ptr[i]:arg_ptr[i+1]`` of the per-argument arrays, in call order; ``arg_region``
    holds ``(row0, col0, rows, cols)`` (zeros for scalars), ``arg_tensor`` is -1 and
    ``arg_scalar`` the value for scalars. Successors of task ``i`` are
    ``fanout_ids[fanout_ptr[i]:fanout_ptr[i+1]]`` (task ids, ascending).
    """

    first_task: int
    func: np.ndarray
    buffer_bytes: np.ndarray
    fanin: np.ndarray
    state: np.ndarray
    arg_ptr: np.ndarray
    arg_kind: np.ndarray
    arg_tensor: np.ndarray
    arg_region: np.ndarray
    arg_scalar: np.ndarray
    fanout_ptr: np.ndarray
    fanout_ids: np.ndarray
    tensors: list[tuple[str, int, int, int]] = field(default_factory=list)
    funcs: list[str] = field(default_factory=list)

    @property
    def n_tasks(self) -> int:
        """Number of exported tasks."""
        return len(self.func)

    @property
    def task_ids(self) -> np.ndarray:
        """Task id of every row."""
        return np.arange(self.first_task, self.first_task + self.n_tasks, dtype=np.int32)

    def edges(self) -> np.ndarray:
        """All edges as an ``(E, 2)`` int32 array of ``(predecessor, successor)`` ids."""
        counts = np.diff(self.fanout_ptr)
        preds = np.repeat(self.task_ids, counts)
        return np.stack([preds, self.fanout_ids.astype(np.int32)], axis=1)


class Runtime:
    """A PTO runtime: register tensors and functions, build tasks, pop and complete them.

    Args:
        window: task slots in the ring (0 = unbounded, the whole graph stays in memory).
        concurrent: install the pthread sync hooks, so the orchestration may run on one
            thread (blocking in :meth:`task` while the window is full) while another thread
            pops and completes tasks.
        count_only: only count tasks and regions (no graph; O(1) memory).
        lib: a compiled cffi module that contains the runtime (default: the bare runtime).
        hooks: called with the ``pto_config *`` before the runtime is created, to install sync
            hooks of its own (the native pool's: :mod:`pto.exec.native`); instead of
            ``concurrent``. Whoever installed them frees them after :meth:`close`.

    Arguments are checked as :class:`RuntimeLib` does (:mod:`pto.runtime.checks`): a non-integer or
    out-of-range integer, a name with a NUL, float task ids... raise
    :class:`pto.errors.RuntimeStatusError` with status ``ERR_INVALID``.
    """

    def __init__(self, window: int = 0, concurrent: bool = False, count_only: bool = False,
                 lib: ModuleType | None = None, hooks=None):
        self.ptr: Any = None  # so close() from __del__ is harmless if the checks below fail
        self._sync = False
        window = check_i32("Runtime", "window", window)
        module = lib if lib is not None else load_runtime_module()
        self.api = RuntimeLib(module)
        self.ffi = module.ffi
        self.ptr = self.ffi.NULL
        self._cfg = self.ffi.new("pto_config *")
        self.api.lib.pto_config_init(self._cfg)
        self._cfg.window = window
        self._cfg.count_only = 1 if count_only else 0
        if concurrent:
            status = self.api.lib.pto_sync_posix_init(self._cfg)
            if status != self.api.lib.PTO_OK:
                raise RuntimeStatusError(
                    f"cannot set up the pthread sync hooks: {self.api.status_name(status)}", status)
            self._sync = True
        elif hooks is not None:
            hooks(self._cfg)
        try:
            self.ptr = self.api.runtime_create(self._cfg)
        except RuntimeStatusError:
            self._free_sync()
            raise

    # -- lifetime ------------------------------------------------------------------------

    def _free_sync(self) -> None:
        if self._sync:
            self.api.lib.pto_sync_posix_free(self._cfg)
            self._sync = False

    def close(self) -> None:
        """Destroy the C runtime (idempotent). No other thread may use it concurrently."""
        if self.ptr is None:  # __init__ refused its arguments: nothing was created
            return
        if self.ptr != self.ffi.NULL:
            self.api.runtime_destroy(self.ptr)
            self.ptr = self.ffi.NULL
        self._free_sync()

    def reset(self) -> None:
        """Forget every tensor, function and task but keep the allocated memory.

        The next graph built into this runtime reuses that memory, so it pays neither
        allocations nor first-touch page faults; ``bytes_peak`` keeps counting since creation.
        """
        self.api.runtime_reset(self._rt())

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # at interpreter shutdown the cffi module may be half torn down already
        with contextlib.suppress(Exception):
            self.close()

    def _rt(self) -> Any:
        if self.ptr == self.ffi.NULL:
            raise RuntimeStatusError("the runtime was closed", self.api.lib.PTO_ERR_STATE)
        return self.ptr

    # -- names ---------------------------------------------------------------------------

    def register_tensor(self, name: str, rows: int, cols: int, elem_size: int) -> int:
        """Register a 2-D tensor ``rows x cols`` of ``elem_size``-byte elements → tensor id."""
        return self.api.tensor_register(self._rt(), name, rows, cols, elem_size)

    def register_func(self, name: str) -> int:
        """Register an InCore function name → function id (idempotent per name)."""
        return self.api.func_register(self._rt(), name)

    # -- building --------------------------------------------------------------------------

    def task(self, func_id: int, buffer_bytes: int = 0) -> int:
        """Allocate a task of function ``func_id`` → task id; add its arguments, then submit."""
        return self.api.task_alloc(self._rt(), func_id, buffer_bytes)

    def add_input(self, task: int, tensor: int, row0: int, col0: int, rows: int, cols: int) -> None:
        """The task reads ``tensor[row0:row0+rows, col0:col0+cols]``."""
        self.api.task_add_input(self._rt(), task, tensor, row0, col0, rows, cols)

    def add_output(self, task: int, tensor: int, row0: int, col0: int, rows: int, cols: int) -> None:
        """The task writes the region."""
        self.api.task_add_output(self._rt(), task, tensor, row0, col0, rows, cols)

    def add_inout(self, task: int, tensor: int, row0: int, col0: int, rows: int, cols: int) -> None:
        """The task reads and writes the region."""
        self.api.task_add_inout(self._rt(), task, tensor, row0, col0, rows, cols)

    def add_scalar(self, task: int, value: int) -> None:
        """A scalar argument, kept in order with the regions."""
        self.api.task_add_scalar(self._rt(), task, value)

    def submit(self, task: int) -> None:
        """Resolve the task's dependencies; it becomes ready when its predecessors completed."""
        self.api.task_submit(self._rt(), task)

    # -- executing ---------------------------------------------------------------------------

    def ready_count(self) -> int:
        """Tasks waiting in the ready queue."""
        return self.api.ready_count(self._rt())

    def ready_pop(self, max: int | None = None) -> np.ndarray:
        """Pop up to ``max`` ready tasks (all if None), in the order they became ready."""
        rt = self._rt()
        n = self.api.ready_count(rt) if max is None else max
        return self.api.ready_pop(rt, n)

    def complete(self, ids: int | Iterable[int] | np.ndarray) -> None:
        """Mark one popped task or many as completed, releasing their successors.

        ``ids``: one id, an iterable of ids or a 1-D integer numpy array (int32 arrays, as
        :meth:`ready_pop` returns them, go to C without per-element work). Float, bool or
        multi-dimensional arrays and ids beyond int32 raise before any task is completed;
        a negative or unknown id is reported by C (``ERR_UNKNOWN_TASK``).
        """
        rt = self._rt()
        if isinstance(ids, (int, np.integer)) or (isinstance(ids, np.ndarray) and ids.ndim == 0):
            self.api.task_complete(rt, ids)
        else:
            self.api.task_complete_many(rt, ids)

    # -- inspecting ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """Counters: tasks, edges, tensor-map entries, bytes (current/peak), bytes_per_task..."""
        return self.api.get_stats(self._rt())

    def task_info(self, task: int) -> dict[str, int]:
        """State, function, fanin/pending, argument and successor counts of a live task."""
        return self.api.task_query(self._rt(), task)

    def task_args(self, task: int) -> list[tuple[int, int, int, int, int, int, int]]:
        """Arguments of a live task: ``(kind, tensor, row0, col0, rows, cols, scalar)``."""
        return self.api.task_args(self._rt(), task)

    def dump(self, path: str | Path) -> None:
        """Write the text dump of the live graph (format in docs/RUNTIME.md)."""
        self.api.dump(self._rt(), path)

    def export(self) -> GraphExport:
        """Every live submitted task, its arguments and its edges as numpy arrays (3 C calls)."""
        rt = self._rt()
        info = self.api.export_info(rt)
        n, na, ne = info.n_tasks, info.n_args, info.n_edges
        ex = GraphExport(
            first_task=info.first_task,
            func=np.empty(n, np.int32), buffer_bytes=np.empty(n, np.int32), fanin=np.empty(n, np.int32),
            state=np.empty(n, np.int8), arg_ptr=np.empty(n + 1, np.int64), arg_kind=np.empty(na, np.int8),
            arg_tensor=np.empty(na, np.int32), arg_region=np.empty((na, 4), np.int64),
            arg_scalar=np.empty(na, np.int64), fanout_ptr=np.empty(n + 1, np.int64),
            fanout_ids=np.empty(ne, np.int32))
        arrays = self.ffi.new("pto_export_arrays *")
        keep = []
        for name, ctype in (("func", "int32_t[]"), ("buffer_bytes", "int32_t[]"), ("fanin", "int32_t[]"),
                            ("state", "int8_t[]"), ("arg_ptr", "int64_t[]"), ("arg_kind", "int8_t[]"),
                            ("arg_tensor", "int32_t[]"), ("arg_region", "int64_t[]"),
                            ("arg_scalar", "int64_t[]"), ("fanout_ptr", "int64_t[]"),
                            ("fanout_ids", "int32_t[]")):
            buf = self.ffi.from_buffer(ctype, getattr(ex, name))
            keep.append(buf)
            cname = {"func": "task_func", "buffer_bytes": "task_buffer_bytes", "fanin": "task_fanin",
                     "state": "task_state"}.get(name, name)
            setattr(arrays, cname, buf)
        self.api.export_fill(rt, arrays)
        ex.tensors = [self.api.tensor_get(rt, i) for i in range(info.n_tensors)]
        ex.funcs = [self.api.func_get(rt, i) for i in range(info.n_funcs)]
        return ex
