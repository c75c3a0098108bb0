"""The thin layer of the runtime binding: :class:`RuntimeLib`, one method per C function.

A non-zero status becomes :class:`pto.errors.RuntimeStatusError` whose message is the runtime's
last-error text; integer, name and path arguments are checked first (:mod:`pto.runtime.checks`).
The Pythonic layer, :class:`pto.runtime.Runtime`, is built on it.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

from pto.errors import RuntimeStatusError
from pto.runtime.checks import bad_arg, check_i32, check_i64, check_name, check_region, check_task_ids

# the pto_stats fields that get_stats returns
_STATS_FIELDS = (
    "tasks_submitted", "tasks_completed", "tasks_retired", "tasks_live", "regions", "scalars", "edges",
    "edges_live", "map_entries", "map_entries_peak", "bytes", "bytes_peak", "bytes_per_task", "ready",
    "window", "count_only",
)


class RuntimeLib:
    """One method per runtime C function; raises :class:`RuntimeStatusError` on a bad status.

    ``rt`` arguments are the raw ``pto_runtime *`` cdata. Outputs come back as return values.
    Integer, name and path arguments are checked first (:mod:`pto.runtime.checks`): a bad one raises
    :class:`RuntimeStatusError` with status ``ERR_INVALID`` before C is called.
    """

    def __init__(self, module: ModuleType):
        self.module = module
        self.ffi = module.ffi
        self.lib = module.lib

    def check(self, rt: Any, status: int) -> None:
        """Raise the runtime's last error for a status other than ``PTO_OK``."""
        if status != self.lib.PTO_OK:
            msg = self.ffi.string(self.lib.pto_last_error(rt)).decode(errors="replace")
            if not msg:
                msg = self.status_name(status)
            raise RuntimeStatusError(msg, status)

    def status_name(self, status: int) -> str:
        """Symbolic name of a status code, e.g. ``PTO_ERR_WINDOW_FULL``."""
        return self.ffi.string(self.lib.pto_status_name(check_i32("pto_status_name", "status", status))).decode()

    def runtime_create(self, cfg: Any) -> Any:
        """``pto_runtime_create``: a new runtime from a ``pto_config *``."""
        out = self.ffi.new("pto_runtime **")
        status = self.lib.pto_runtime_create(cfg, out)
        if status != self.lib.PTO_OK:
            raise RuntimeStatusError(
                f"cannot create the runtime (window={cfg.window}, count_only={cfg.count_only}): "
                f"{self.status_name(status)}", status)
        return out[0]

    def runtime_destroy(self, rt: Any) -> None:
        """``pto_runtime_destroy``."""
        self.lib.pto_runtime_destroy(rt)

    def runtime_reset(self, rt: Any) -> None:
        """``pto_runtime_reset``: forget the graph, tensors and functions, keep the memory."""
        self.check(rt, self.lib.pto_runtime_reset(rt))

    def tensor_register(self, rt: Any, name: str, rows: int, cols: int, elem_size: int) -> int:
        """``pto_tensor_register`` → tensor id."""
        cname = check_name("tensor", name)
        what = f"tensor '{name}'"
        rows, cols = check_i64(what, "rows", rows), check_i64(what, "cols", cols)
        elem_size = check_i32(what, "elem_size", elem_size)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_tensor_register(rt, cname, rows, cols, elem_size, out))
        return int(out[0])

    def func_register(self, rt: Any, name: str) -> int:
        """``pto_func_register`` → function id (the same id for a name registered before)."""
        cname = check_name("function", name)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_func_register(rt, cname, out))
        return int(out[0])

    def tensor_get(self, rt: Any, tensor: int) -> tuple[str, int, int, int]:
        """``pto_tensor_get`` → (name, rows, cols, elem_size)."""
        tensor = check_i32("pto_tensor_get", "tensor id", tensor)
        name = self.ffi.new("const char **")
        rows, cols = self.ffi.new("int64_t *"), self.ffi.new("int64_t *")
        elem = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_tensor_get(rt, tensor, name, rows, cols, elem))
        return self.ffi.string(name[0]).decode(), int(rows[0]), int(cols[0]), int(elem[0])

    def func_get(self, rt: Any, func: int) -> str:
        """``pto_func_get`` → name."""
        func = check_i32("pto_func_get", "function id", func)
        name = self.ffi.new("const char **")
        self.check(rt, self.lib.pto_func_get(rt, func, name))
        return self.ffi.string(name[0]).decode()

    def task_alloc(self, rt: Any, func: int, buffer_bytes: int) -> int:
        """``pto_task_alloc`` → task id (blocks while the window is full if sync hooks are set)."""
        func = check_i32("pto_task_alloc", "function id", func)
        buffer_bytes = check_i32("pto_task_alloc", "buffer_bytes", buffer_bytes)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_task_alloc(rt, func, buffer_bytes, out))
        return int(out[0])

    def task_add_input(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                       cols: int) -> None:
        """``pto_task_add_input``."""
        args = check_region("pto_task_add_input", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_input(rt, *args))

    def task_add_output(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                        cols: int) -> None:
        """``pto_task_add_output``."""
        args = check_region("pto_task_add_output", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_output(rt, *args))

    def task_add_inout(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                       cols: int) -> None:
        """``pto_task_add_inout``."""
        args = check_region("pto_task_add_inout", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_inout(rt, *args))

    def task_add_scalar(self, rt: Any, task: int, value: int) -> None:
        """``pto_task_add_scalar``."""
        task = check_i32("pto_task_add_scalar", "task id", task)
        value = check_i64("pto_task_add_scalar", "value", value)
        self.check(rt, self.lib.pto_task_add_scalar(rt, task, value))

    def task_submit(self, rt: Any, task: int) -> None:
        """``pto_task_submit``."""
        self.check(rt, self.lib.pto_task_submit(rt, check_i32("pto_task_submit", "task id", task)))

    def ready_count(self, rt: Any) -> int:
        """``pto_ready_count``."""
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_ready_count(rt, out))
        return int(out[0])

    def ready_pop(self, rt: Any, max_n: int) -> np.ndarray:
        """``pto_ready_pop`` → int32 array of up to ``max_n`` ids, in the order they became ready."""
        max_n = check_i32("pto_ready_pop", "max", max_n)
        if max_n > 4096:  # no more than the queue holds: a huge max must not allocate a huge buffer
            max_n = min(max_n, self.ready_count(rt))
        ids = np.empty(max(max_n, 0), dtype=np.int32)
        n = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_ready_pop(rt, self.ffi.from_buffer("int32_t[]", ids), max_n, n))
        return ids[: n[0]]

    def task_complete(self, rt: Any, task: int) -> None:
        """``pto_task_complete``."""
        self.check(rt, self.lib.pto_task_complete(rt, check_i32("complete", "task id", task)))

    def task_complete_many(self, rt: Any, ids: np.ndarray) -> None:
        """``pto_task_complete_many`` (stops at the first id that fails).

        ``ids``: a 1-D integer array or an iterable of ints; anything else (floats, bools,
        ids beyond int32) raises before any task is completed.
        """
        ids = check_task_ids("complete", ids)
        self.check(rt, self.lib.pto_task_complete_many(rt, self.ffi.from_buffer("int32_t[]", ids), len(ids)))

    def get_stats(self, rt: Any) -> dict[str, int | float]:
        """``pto_get_stats`` → dict keyed by the ``pto_stats`` field names."""
        st = self.ffi.new("pto_stats *")
        self.check(rt, self.lib.pto_get_stats(rt, st))
        return {f: getattr(st, f) for f in _STATS_FIELDS}

    def task_query(self, rt: Any, task: int) -> dict[str, int]:
        """``pto_task_query`` → dict keyed by the ``pto_task_view`` field names."""
        task = check_i32("pto_task_query", "task id", task)
        v = self.ffi.new("pto_task_view *")
        self.check(rt, self.lib.pto_task_query(rt, task, v))
        return {f: getattr(v, f) for f in ("func", "buffer_bytes", "state", "fanin", "pending", "n_args",
                                             "n_fanout")}

    def task_args(self, rt: Any, task: int) -> list[tuple[int, int, int, int, int, int, int]]:
        """``pto_task_args`` → [(kind, tensor, row0, col0, rows, cols, scalar)] in call order."""
        task = check_i32("pto_task_args", "task id", task)
        n = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_task_args(rt, task, self.ffi.NULL, 0, n))
        buf = self.ffi.new("pto_arg[]", max(n[0], 1))
        self.check(rt, self.lib.pto_task_args(rt, task, buf, n[0], n))
        return [(a.kind, a.tensor, a.row0, a.col0, a.rows, a.cols, a.scalar) for a in buf[0: n[0]]]

    def export_info(self, rt: Any) -> Any:
        """``pto_export_info_get`` → the ``pto_export_info`` cdata."""
        info = self.ffi.new("pto_export_info *")
        self.check(rt, self.lib.pto_export_info_get(rt, info))
        return info

    def export_fill(self, rt: Any, arrays: Any) -> None:
        """``pto_export_fill`` with a ``pto_export_arrays *`` of caller buffers."""
        self.check(rt, self.lib.pto_export_fill(rt, arrays))

    def dump(self, rt: Any, path: str | bytes | os.PathLike[str]) -> None:
        """``pto_dump``."""
        try:
            cpath = os.fsencode(path)
        except TypeError:
            raise bad_arg(f"dump: path must be a str or a path, got {type(path).__name__} {path!r}") from None
        if b"\0" in cpath:
            raise bad_arg(f"dump: path {path!r} contains a NUL character")
        self.check(rt, self.lib.pto_dump(rt, cpath))

