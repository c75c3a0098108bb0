"""Python binding of the PTO C runtime (runtime_c/), in two layers.

:class:`RuntimeLib` is the thin layer: one method per C function, turning a non-zero status
into :class:`pto.errors.RuntimeStatusError` whose message is the runtime's last-error text.
:class:`Runtime` is the Pythonic layer on top (context manager, numpy arrays, dicts).

Both only use ``module.ffi`` and ``module.lib`` of a compiled cffi module that contains the
runtime, so a module that also holds other C (generated orchestration code compiled with
:func:`runtime_sources`) works too: ``Runtime(lib=that_module)``, and pass ``rt.ptr`` to its
functions. The text dump that
:meth:`Runtime.dump` writes is parsed by :mod:`pto.dump`.

Arguments are checked before they reach C, so a bad one never surfaces as a cffi
``OverflowError``/``TypeError`` nor gets truncated on the way:

- every integer argument must be an ``int`` or a numpy integer (anything with ``__index__``
  except ``bool``/``numpy.bool_``: a flag where an id or size is expected is a mistake) that
  fits the C parameter (``int32_t`` for ids, ``window``, ``elem_size``, ``buffer_bytes`` and
  ``max``; ``int64_t`` for tensor shapes, region offsets/extents and scalar values);
- names must be ``str`` without NUL characters (C would see the name cut at the NUL);
- task ids given to :meth:`Runtime.complete` must be integers: an int, an iterable of ints,
  or a 1-D integer numpy array (float, bool and multi-dimensional arrays are refused, never
  truncated); int32 arrays go to C as they are;
- a dump path must be a ``str``/``bytes``/``os.PathLike`` without NUL characters.

Such an argument raises :class:`pto.errors.RuntimeStatusError` with status ``ERR_INVALID``
(the C runtime's status for a bad argument) and a message in the runtime's style naming the
call, the argument and the value as given, e.g. ``pto_task_alloc: buffer_bytes 1099511627776
does not fit int32_t (-2147483648..2147483647)``. Values that fit are judged by C itself
(a negative task id is ``ERR_UNKNOWN_TASK``, a negative shape ``ERR_INVALID``, ...).
"""

from __future__ import annotations

import contextlib
import importlib.util
import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pto.cbuild import load_cffi_module
from pto.errors import RuntimeStatusError

# The status codes (OK, ERR_INVALID, ... ERR_LIMIT) and task states (TASK_OPEN, ... TASK_RETIRED)
# are the enum constants pto_status and pto_task_state of pto_runtime_api.h as the compiled
# library exposes them, without the PTO_ prefix; the module's __getattr__ looks them up on first
# use, so importing this module compiles nothing.
_ENUMS = ("pto_status", "pto_task_state")
_ENUM_NAME = re.compile(r"OK|ERR_[A-Z_]+|TASK_[A-Z]+")
_constants: dict[str, int] | None = None


def _runtime_constants() -> dict[str, int]:
    """``{"OK": 0, "ERR_INVALID": -1, ..., "TASK_OPEN": 1, ...}`` from the compiled runtime."""
    global _constants
    if _constants is None:  # built whole, then published: a racing thread never sees half of it
        module = load_runtime_module()
        _constants = {cname.removeprefix("PTO_"): getattr(module.lib, cname)
                      for enum in _ENUMS for cname in module.ffi.typeof(enum).relements}
    return _constants


def __getattr__(name: str) -> int:
    if _ENUM_NAME.fullmatch(name):
        with contextlib.suppress(KeyError):
            return _runtime_constants()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_STATS_FIELDS = (
    "tasks_submitted", "tasks_completed", "tasks_retired", "tasks_live", "regions", "scalars", "edges",
    "edges_live", "map_entries", "map_entries_peak", "bytes", "bytes_peak", "bytes_per_task", "ready",
    "window", "count_only",
)


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_IDENT_RULE = "letters, digits and '_', not starting with a digit, no whitespace, at most 255 characters"


# ------------------------------------------------------------------------------------------
# argument checks (before anything reaches cffi)
# ------------------------------------------------------------------------------------------

def _bad_arg(message: str) -> RuntimeStatusError:
    return RuntimeStatusError(message, _runtime_constants()["ERR_INVALID"])


def _as_int(what: str, arg: str, value: Any) -> int:
    """``value`` as a Python int if it is an integer (not a bool), else a RuntimeStatusError."""
    if not isinstance(value, (bool, np.bool_)):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise _bad_arg(f"{what}: {arg} must be an integer, got {type(value).__name__} {value!r}")


def _i32(what: str, arg: str, value: Any) -> int:
    """Check that ``value`` is an integer that fits ``int32_t``; returns it as an int."""
    if type(value) is not int:
        value = _as_int(what, arg, value)
    if -0x80000000 <= value <= 0x7FFFFFFF:  # literal bounds: no global lookups
        return value
    raise _bad_arg(f"{what}: {arg} {value} does not fit int32_t ({_I32_MIN}..{_I32_MAX})")


def _i64(what: str, arg: str, value: Any) -> int:
    """Check that ``value`` is an integer that fits ``int64_t``; returns it as an int."""
    if type(value) is not int:
        value = _as_int(what, arg, value)
    if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return value
    raise _bad_arg(f"{what}: {arg} {value} does not fit int64_t ({_I64_MIN}..{_I64_MAX})")


def _region(what: str, task: Any, tensor: Any, row0: Any, col0: Any, rows: Any,
            cols: Any) -> tuple[int, int, int, int, int, int]:
    # the common case in one expression (literal bounds: no global lookups)
    if (type(task) is type(tensor) is type(row0) is type(col0) is type(rows) is type(cols) is int
            and -0x80000000 <= task <= 0x7FFFFFFF and -0x80000000 <= tensor <= 0x7FFFFFFF
            and -0x8000000000000000 <= row0 <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= col0 <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= rows <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= cols <= 0x7FFFFFFFFFFFFFFF):
        return task, tensor, row0, col0, rows, cols
    return (_i32(what, "task id", task), _i32(what, "tensor id", tensor), _i64(what, "row0", row0),
            _i64(what, "col0", col0), _i64(what, "rows", rows), _i64(what, "cols", cols))


def _name(kind: str, name: Any) -> bytes:
    """A tensor/function name as the bytes C gets; refuses what C would not see as given."""
    if not isinstance(name, str):
        raise _bad_arg(f"{kind} name must be a str, got {type(name).__name__} {name!r}")
    if "\0" in name:
        raise _bad_arg(f"{kind} name {name!r} is not an identifier: it contains a NUL character "
                       f"({_IDENT_RULE})")
    try:
        return name.encode()
    except UnicodeEncodeError:
        raise _bad_arg(f"{kind} name {name!r} is not an identifier ({_IDENT_RULE})") from None


def _task_ids(what: str, ids: Any) -> np.ndarray:
    """Task ids as a contiguous 1-D int32 array; refuses non-integers and ids beyond int32.

    A 1-D int32 array (what :meth:`Runtime.ready_pop` returns) passes without a copy or any
    per-element work; other integer arrays get one vectorized range check.
    """
    if isinstance(ids, np.ndarray):
        if ids.dtype == np.int32 and ids.ndim == 1:
            return np.ascontiguousarray(ids)
        if ids.ndim != 1:
            raise _bad_arg(f"{what}: task ids must be a 1-D array, got shape {ids.shape}")
        if ids.dtype.kind == "O":
            return _task_ids(what, ids.tolist())
        if ids.dtype.kind not in "iu":
            shown = np.array2string(ids, threshold=8)
            raise _bad_arg(f"{what}: task ids must be integers, got a {ids.dtype} array {shown}")
        if ids.size and (int(ids.min()) < _I32_MIN or int(ids.max()) > _I32_MAX):
            bad = next(t for t in ids.tolist() if not _I32_MIN <= t <= _I32_MAX)
            raise _bad_arg(f"{what}: task id {bad} does not fit int32_t ({_I32_MIN}..{_I32_MAX})")
        return ids.astype(np.int32)
    if isinstance(ids, (str, bytes)):
        raise _bad_arg(f"{what}: task ids must be integers, got {type(ids).__name__} {ids!r}")
    try:
        it = iter(ids)
    except TypeError:
        raise _bad_arg(f"{what}: task ids must be an integer or an iterable of integers, got "
                       f"{type(ids).__name__} {ids!r}") from None
    return np.array([_i32(what, "task id", t) for t in it], dtype=np.int32)


# ------------------------------------------------------------------------------------------
# locating and compiling the runtime
# ------------------------------------------------------------------------------------------

def _runtime_c_dir() -> Path:
    here = Path(__file__).resolve().parent
    for cand in (here / "runtime_c", here.parent / "runtime_c"):  # installed, then source tree
        if (cand / "pto_runtime_api.h").is_file():
            return cand
    raise RuntimeStatusError("cannot find the runtime C sources (runtime_c/pto_runtime_api.h)")


def _build_script() -> ModuleType:
    path = _runtime_c_dir() / "build_runtime.py"
    spec = importlib.util.spec_from_file_location("_pto_runtime_c_build", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def runtime_include_dir() -> Path:
    """Directory with ``pto_runtime.h`` (pass it as an include dir when compiling C that uses it)."""
    return _runtime_c_dir()


def runtime_sources() -> list[Path]:
    """The runtime's C files, to compile together with other C through :mod:`pto.cbuild`."""
    return _build_script().runtime_sources()


def runtime_portable_files() -> list[Path]:
    """The headers and C files a generated orchestration needs to build without Python (``pto
    codegen`` copies them): everything but the pthread sync adapter."""
    return _build_script().portable_files()


def runtime_cdef() -> str:
    """The runtime's cdef text (``pto_runtime_api.h``), to prepend to another module's cdef."""
    return _build_script().runtime_cdef()


def load_runtime_module() -> ModuleType:
    """The bare runtime as a compiled cffi module (cached; compiled on first use)."""
    return load_cffi_module("pto_runtime", runtime_cdef(), '#include "pto_runtime.h"\n',
                            sources=runtime_sources(), include_dirs=[runtime_include_dir()])


# ------------------------------------------------------------------------------------------
# thin layer: 1:1 wrappers
# ------------------------------------------------------------------------------------------

class RuntimeLib:
    """One method per runtime C function; raises :class:`RuntimeStatusError` on a bad status.

    ``rt`` arguments are the raw ``pto_runtime *`` cdata. Outputs come back as return values.
    Integer, name and path arguments are checked first (module docstring): a bad one raises
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
        return self.ffi.string(self.lib.pto_status_name(_i32("pto_status_name", "status", status))).decode()

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
        cname = _name("tensor", name)
        what = f"tensor '{name}'"
        rows, cols = _i64(what, "rows", rows), _i64(what, "cols", cols)
        elem_size = _i32(what, "elem_size", elem_size)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_tensor_register(rt, cname, rows, cols, elem_size, out))
        return int(out[0])

    def func_register(self, rt: Any, name: str) -> int:
        """``pto_func_register`` → function id (the same id for a name registered before)."""
        cname = _name("function", name)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_func_register(rt, cname, out))
        return int(out[0])

    def tensor_get(self, rt: Any, tensor: int) -> tuple[str, int, int, int]:
        """``pto_tensor_get`` → (name, rows, cols, elem_size)."""
        tensor = _i32("pto_tensor_get", "tensor id", tensor)
        name = self.ffi.new("const char **")
        rows, cols = self.ffi.new("int64_t *"), self.ffi.new("int64_t *")
        elem = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_tensor_get(rt, tensor, name, rows, cols, elem))
        return self.ffi.string(name[0]).decode(), int(rows[0]), int(cols[0]), int(elem[0])

    def func_get(self, rt: Any, func: int) -> str:
        """``pto_func_get`` → name."""
        func = _i32("pto_func_get", "function id", func)
        name = self.ffi.new("const char **")
        self.check(rt, self.lib.pto_func_get(rt, func, name))
        return self.ffi.string(name[0]).decode()

    def task_alloc(self, rt: Any, func: int, buffer_bytes: int) -> int:
        """``pto_task_alloc`` → task id (blocks while the window is full if sync hooks are set)."""
        func = _i32("pto_task_alloc", "function id", func)
        buffer_bytes = _i32("pto_task_alloc", "buffer_bytes", buffer_bytes)
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_task_alloc(rt, func, buffer_bytes, out))
        return int(out[0])

    def task_add_input(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                       cols: int) -> None:
        """``pto_task_add_input``."""
        args = _region("pto_task_add_input", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_input(rt, *args))

    def task_add_output(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                        cols: int) -> None:
        """``pto_task_add_output``."""
        args = _region("pto_task_add_output", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_output(rt, *args))

    def task_add_inout(self, rt: Any, task: int, tensor: int, row0: int, col0: int, rows: int,
                       cols: int) -> None:
        """``pto_task_add_inout``."""
        args = _region("pto_task_add_inout", task, tensor, row0, col0, rows, cols)
        self.check(rt, self.lib.pto_task_add_inout(rt, *args))

    def task_add_scalar(self, rt: Any, task: int, value: int) -> None:
        """``pto_task_add_scalar``."""
        task = _i32("pto_task_add_scalar", "task id", task)
        value = _i64("pto_task_add_scalar", "value", value)
        self.check(rt, self.lib.pto_task_add_scalar(rt, task, value))

    def task_submit(self, rt: Any, task: int) -> None:
        """``pto_task_submit``."""
        self.check(rt, self.lib.pto_task_submit(rt, _i32("pto_task_submit", "task id", task)))

    def ready_count(self, rt: Any) -> int:
        """``pto_ready_count``."""
        out = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_ready_count(rt, out))
        return int(out[0])

    def ready_pop(self, rt: Any, max_n: int) -> np.ndarray:
        """``pto_ready_pop`` → int32 array of up to ``max_n`` ids, in the order they became ready."""
        max_n = _i32("pto_ready_pop", "max", max_n)
        if max_n > 4096:  # no more than the queue holds: a huge max must not allocate a huge buffer
            max_n = min(max_n, self.ready_count(rt))
        ids = np.empty(max(max_n, 0), dtype=np.int32)
        n = self.ffi.new("int32_t *")
        self.check(rt, self.lib.pto_ready_pop(rt, self.ffi.from_buffer("int32_t[]", ids), max_n, n))
        return ids[: n[0]]

    def task_complete(self, rt: Any, task: int) -> None:
        """``pto_task_complete``."""
        self.check(rt, self.lib.pto_task_complete(rt, _i32("complete", "task id", task)))

    def task_complete_many(self, rt: Any, ids: np.ndarray) -> None:
        """``pto_task_complete_many`` (stops at the first id that fails).

        ``ids``: a 1-D integer array or an iterable of ints; anything else (floats, bools,
        ids beyond int32) raises before any task is completed.
        """
        ids = _task_ids("complete", ids)
        self.check(rt, self.lib.pto_task_complete_many(rt, self.ffi.from_buffer("int32_t[]", ids), len(ids)))

    def get_stats(self, rt: Any) -> dict[str, int | float]:
        """``pto_get_stats`` → dict keyed by the ``pto_stats`` field names."""
        st = self.ffi.new("pto_stats *")
        self.check(rt, self.lib.pto_get_stats(rt, st))
        return {f: getattr(st, f) for f in _STATS_FIELDS}

    def task_query(self, rt: Any, task: int) -> dict[str, int]:
        """``pto_task_query`` → dict keyed by the ``pto_task_view`` field names."""
        task = _i32("pto_task_query", "task id", task)
        v = self.ffi.new("pto_task_view *")
        self.check(rt, self.lib.pto_task_query(rt, task, v))
        return {f: getattr(v, f) for f in ("func", "buffer_bytes", "state", "fanin", "pending", "n_args",
                                             "n_fanout")}

    def task_args(self, rt: Any, task: int) -> list[tuple[int, int, int, int, int, int, int]]:
        """``pto_task_args`` → [(kind, tensor, row0, col0, rows, cols, scalar)] in call order."""
        task = _i32("pto_task_args", "task id", task)
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
            raise _bad_arg(f"dump: path must be a str or a path, got {type(path).__name__} {path!r}") from None
        if b"\0" in cpath:
            raise _bad_arg(f"dump: path {path!r} contains a NUL character")
        self.check(rt, self.lib.pto_dump(rt, cpath))


# ------------------------------------------------------------------------------------------
# Pythonic layer
# ------------------------------------------------------------------------------------------

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

    Arguments are checked as :class:`RuntimeLib` does (module docstring): a non-integer or
    out-of-range integer, a name with a NUL, float task ids... raise
    :class:`pto.errors.RuntimeStatusError` with status ``ERR_INVALID``.
    """

    def __init__(self, window: int = 0, concurrent: bool = False, count_only: bool = False,
                 lib: ModuleType | None = None):
        self.ptr: Any = None  # so close() from __del__ is harmless if the checks below fail
        self._sync = False
        window = _i32("Runtime", "window", window)
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
