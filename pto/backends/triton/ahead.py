"""Compiling a run's kernels ahead, in parallel.

A first run compiles every kernel it launches, one after another where the launches come
(seconds each for a GEMM or attention kernel). Triton's compiler spends most of that time
outside Python's lock (the MLIR passes, ``ptxas``), so threads compile several kernels at once
(docs/PERF.md "First run"). ``pto tune`` compiles a variant's candidates here at once, each
from a copy of the kernel of its own (``TritonBackend.kernel_copy``). The waves executor asks
for its batches "ahead" (:meth:`TritonBackend.prepare_ahead <pto.backends.triton.backend.TritonBackend.prepare_ahead>`):
a batch whose kernel this process has not compiled for these arguments gets its compile (and
the shared-memory fit of :func:`~.launch.fit_calls`) submitted here, and its launch waits for
it; the executor holds that launch, and every later one, until the graph's waves are planned,
so the compiles of the whole graph overlap.

On the workers, one lock per kernel keeps two compiles of one kernel apart (the calling
thread's own compiles of a kernel already compiled here only read Triton's cache). A worker
compiles with the batch's device current, as the launch will run. A run that fails cancels the
compiles of its launches that have not started.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

_POOL: ThreadPoolExecutor | None = None
_GUARD = threading.Lock()
_LOCKS: dict[int, threading.Lock] = {}
_FITTED: set = set()
_DEPTHS: dict[tuple, tuple] = {}  # key -> each launch's fitted pipelining depth (None: the launch has none)


def workers() -> int:
    """Compile threads: ``PTO_COMPILE_THREADS``, else the CPU's cores up to 16."""
    asked = os.environ.get("PTO_COMPILE_THREADS")
    if asked is not None:
        from pto.errors import UsageError

        if not asked.isdigit() or int(asked) < 1:
            raise UsageError(f"PTO_COMPILE_THREADS={asked!r}: a positive number of threads")
        return int(asked)
    return max(1, min(16, os.cpu_count() or 1))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _GUARD:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(workers(), thread_name_prefix="pto-compile")
        return _POOL


def _spec(a) -> tuple:
    """What Triton specializes an argument on (coarsely): a tensor's dtype and 16-byte
    alignment, an integer's value being 1 or a multiple of 16 and its width."""
    if isinstance(a, torch.Tensor):
        return (str(a.dtype), a.data_ptr() % 16 == 0)
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -2**31 <= a < 2**31)
    return (type(a).__name__,)


#: keyword arguments that are runtime integers (the grid's extents), not compile-time values
_RUNTIME_INTS = ("NB", "NP")


def _kwspec(k: str, v) -> object:
    """A keyword argument as the key holds it: a runtime integer as Triton specializes it, a
    plain value itself, a tensor descriptor by what its type is made of."""
    if k in _RUNTIME_INTS and isinstance(v, int):
        return _spec(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    base = getattr(v, "base", None)
    return (type(v).__name__, str(getattr(base, "dtype", "")), tuple(getattr(v, "block_shape", ())))


def key(digest: str, launches: list[tuple]) -> tuple:
    """The compiled kernels ``launches`` (``(grid, args, kwargs)``) need, as far as they differ."""
    return (digest,) + tuple((tuple(_spec(a) for a in args), tuple((k, _kwspec(k, v)) for k, v in sorted(kw.items())))
                             for _grid, args, kw in launches)


def fitted(k: tuple) -> bool:
    """Has this process compiled the kernels of key ``k``?"""
    return k in _FITTED


def submit(k: tuple, jit, fit, device: torch.device) -> Future:
    """Run ``fit()`` (the compiles and fits of one batch, returning its launches) on a worker,
    one at a time per kernel ``jit``, with ``device`` current; record ``k`` as compiled."""

    def work():
        out = fit()
        _FITTED.add(k)
        return out

    return call(jit, work, device)


def call(jit, work, device: torch.device) -> Future:
    """Run ``work()`` (compiles of kernel ``jit``: ``pto tune``'s check of a candidate's other
    specializations) on a worker, one at a time per ``jit`` as :func:`submit`'s, with ``device``
    current."""
    with _GUARD:
        lock = _LOCKS.setdefault(id(jit), threading.Lock())

    def locked():
        with lock, (torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()):
            return work()

    return _pool().submit(locked)


def note(k: tuple, launches: list[tuple] | None = None) -> None:
    """Record key ``k`` as compiled (a batch fitted in the caller's thread), and, given, the
    pipelining depths its ``launches`` were fitted to (:func:`refit`)."""
    _FITTED.add(k)
    if launches is not None:
        _DEPTHS[k] = tuple(kw.get("num_stages") for _grid, _args, kw in launches)


def refit(k: tuple, launches: list[tuple]) -> list[tuple] | None:
    """``launches`` at the depths another batch of the same key was fitted to in this process
    (the same compiled kernels need the same shared memory), or None where none was: a batch of
    a kernel already fitted asks Triton nothing (each of its ``warmup`` calls costs milliseconds;
    a prefill prepares the same dequantization for every layer)."""
    depths = _DEPTHS.get(k)
    if depths is None or len(depths) != len(launches):
        return None
    return [(grid, args, kw if d is None else {**kw, "num_stages": d}) for (grid, args, kw), d in zip(launches, depths)]


__all__ = ["workers", "key", "fitted", "submit", "call", "note", "refit"]
