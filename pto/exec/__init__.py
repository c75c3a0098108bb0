"""Executors: how a built task graph runs on a device (``--executor``).

``waves`` (:mod:`pto.exec.waves`): the host takes every ready task, groups them by InCore
variant and bindings, launches one batched kernel per group, completes the wave; replayed as a
CUDA graph. ``persistent`` (:mod:`pto.exec.persistent`): one persistent Triton kernel takes work
items from a device queue and waits only on each task's own predecessors. The registry maps
names to implementations of :class:`pto.exec.base.Executor`; ``auto`` picks one per device and
backend.
"""

from __future__ import annotations

import importlib

from pto.errors import UsageError
from pto.exec.base import ExecStats, Executor, LaunchRecord

#: name -> (module, class, one line for --help)
EXECUTORS = {
    "waves": ("pto.exec.waves", "WaveExecutor", "host-driven waves of batched launches, replayed as a CUDA graph"),
    "persistent": ("pto.exec.persistent", "PersistentExecutor", "one GPU-resident Triton kernel runs the whole "
                   "graph, tasks waiting only on their own predecessors (triton backend)"),
}


def names() -> list[str]:
    return list(EXECUTORS)


def resolve(name: str, device: str, backend: str) -> str:
    """``auto``: the executor for this device and backend."""
    if name != "auto" and name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (choose auto, {', '.join(EXECUTORS)})")
    return "waves" if name == "auto" else name


def get_executor(name: str, backend, tensors, **kw) -> Executor:
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r} (choose {', '.join(EXECUTORS)})")
    module, cls, _ = EXECUTORS[name]
    return getattr(importlib.import_module(module), cls)(backend, tensors, **kw)


__all__ = ["EXECUTORS", "Executor", "ExecStats", "LaunchRecord", "names", "resolve", "get_executor"]
