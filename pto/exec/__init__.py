"""Executors: how a built task graph runs on a device (``--executor``).

``waves`` (:mod:`pto.exec.waves`): the host takes every ready task, groups them by InCore
variant and bindings, launches one batched kernel per group, completes the wave; replayed as a
CUDA graph. ``persistent`` (:mod:`pto.exec.persistent`): one persistent Triton kernel takes work
items from a device queue and waits only on each task's own predecessors. The registry maps
names to implementations of :class:`pto.exec.base.Executor`; ``auto`` picks one per device and
backend. Beside them: what a run records, written as a Perfetto trace (:mod:`pto.exec.trace`),
and the timings the engine and the benchmarks share (:mod:`pto.exec.timing`).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from pto.backends.base import capable
from pto.errors import ResourceError, UsageError

if TYPE_CHECKING:
    from pto.exec.base import ExecStats, Executor

log = logging.getLogger("pto.exec")  # one line on stderr: the executor a run fell back to

#: name -> (module, class, one line for --help)
EXECUTORS = {
    "waves": ("pto.exec.waves", "WaveExecutor", "host-driven waves of batched launches, replayed as a CUDA graph"),
    "persistent": ("pto.exec.persistent", "PersistentExecutor", "one GPU-resident Triton kernel runs the whole "
                   "graph, tasks waiting only on their own predecessors (triton backend)"),
    "native": ("pto.exec.native", "NativeExecutor", "the C runtime's worker threads run the compiled tasks while the "
               "orchestration submits them (c backend, CPU)"),
}


def names() -> list[str]:
    return list(EXECUTORS)


#: the auto rule (docs/PERF.md, "Choosing the executor"): on an H100 the persistent kernel runs the
#: fused layer's item bodies ~12% slower than the batched kernels but pays no barrier per
#: launch; it wins wherever the wave executor makes many launches of few tasks each
AUTO_MIN_BATCHES, AUTO_MAX_TASKS_PER_BATCH = 16, 32


def resolve(name: str, device: str, backend: str) -> str:
    """Check ``name``; ``auto`` is ``native`` for a backend that compiles whole programs (c), stays
    ``auto`` (decided per graph by :func:`choose`) where the persistent executor can run (the
    triton backend on a GPU), else it is ``waves``."""
    if name != "auto" and name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (choose auto, {', '.join(EXECUTORS)})")
    if name == "auto" and capable(backend, "native"):
        return "native"
    if name == "auto" and not (device == "cuda" and capable(backend, "megakernel")):
        return "waves"
    return name


def choose(graph, tensors=None) -> str:
    """``auto`` for a built graph: ``persistent`` when the wave executor would run more than
    AUTO_MIN_BATCHES batches of fewer than AUTO_MAX_TASKS_PER_BATCH tasks each on average (the
    seed's fine-grained attention, residual tiles at odd lengths), else ``waves``; always ``waves``
    for a graph with collectives (tensor parallelism). ``tensors`` (name -> the bound tensor):
    views of one buffer count as one tensor, as the wave executor binds them."""
    from pto.exec.order import wave_batches
    from pto.exec.waves import Views
    from pto.ir.analysis import has_collective

    if any(has_collective(fn) for fn in graph.variants):
        return "waves"  # the persistent kernel runs no collectives
    base = None if tensors is None else Views({tid: tensors[n] for n, tid in graph.tensor_ids.items()}).base
    batches = wave_batches(graph, base)
    return "persistent" if batches > AUTO_MIN_BATCHES and graph.tasks < AUTO_MAX_TASKS_PER_BATCH * batches \
        else "waves"


def get_executor(name: str, backend, tensors, **kw) -> Executor:
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (choose {', '.join(EXECUTORS)})")
    module, cls, _ = EXECUTORS[name]
    return getattr(importlib.import_module(module), cls)(backend, tensors, **kw)


def run_first(ex: Executor, graph) -> tuple[Executor, ExecStats]:
    """The first run of ``graph`` on ``ex``: ``(the executor that ran it, its stats)``. A
    persistent kernel that no configuration fits on the device, or a graph the native executor
    does not run (collectives, the sentinel: :class:`ResourceError`, raised before any launch)
    falls back to the wave executor, said in one line on the ``pto.exec`` logger."""
    try:
        return ex, ex.run(graph)
    except ResourceError as e:
        if ex.name not in ("persistent", "native"):
            raise
        log.warning("pto: %s; running with --executor waves instead", e)
        waves = get_executor("waves", ex.backend, ex.tensors, record=ex.record, progress=ex.progress,
                             sentinel=getattr(ex, "sentinel", False))
        return waves, waves.run(graph)


def __getattr__(name: str):
    """The executor's base types, imported when first asked for: the names and the rule above need
    no torch, so the command line checks ``--executor`` before importing it."""
    if name in ("ExecStats", "Executor", "LaunchRecord"):
        from pto.exec import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EXECUTORS", "Executor", "ExecStats", "LaunchRecord", "names", "resolve", "choose", "get_executor",
           "run_first"]
