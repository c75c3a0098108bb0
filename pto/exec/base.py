"""The executor interface: run a built task graph on a backend, then replay it.

An executor consumes a :class:`pto.runtime.graph.Graph` (through the runtime's bulk export,
:class:`pto.runtime.GraphExport`) and executes its tasks on the tensors of a run with a
:class:`pto.backends.Backend`. ``run`` executes the graph once (compiling what it needs) and
keeps what a replay needs; ``replay`` runs it again on the same tensors (the runner copies new
inputs in first); ``capture`` records a replay into a CUDA graph where the backend allows it.
Implementations register in :mod:`pto.exec` by name (``--executor``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from pto.backends.base import Backend
from pto.errors import ExecutionError

#: progress callback: (tasks done, tasks in all)
Progress = Callable[[int, int], None]


@dataclass
class LaunchRecord:
    """One launch: which variant, which tasks, and when (host clock, ns)."""

    wave: int
    func: str
    tasks: np.ndarray
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class ItemRecord:
    """One work item of the persistent executor: a task and its parallel index, the program
    (lane) of its segment's launch that ran it, and when (the GPU's global timer in ns; ticks
    of a logical clock under the interpreter)."""

    task: int
    p: int
    program: int
    start_ns: int
    end_ns: int
    func: str  # variant name
    segment: int = 0  # the launch (segment of a split plan, pto.exec.segments) that ran it
    sm: int = -1  # the multiprocessor its program ran on (-1: not known)


@dataclass
class ExecStats:
    tasks: int
    waves: int
    launches: int  # device launches of one replay
    exec_ms: float  # without kernel_compile_ms
    records: list[LaunchRecord] = field(default_factory=list)
    #: what the run spent getting its kernels compiled (or loaded from the disk cache: a first
    #: run's) where it is told apart: the c backend's kernels (``Backend.compile_ms``), the
    #: native executor's program. Not Triton's: its kernels compile on workers while the wave
    #: executor holds their launches, or inside their first launch (docs/ARCHITECTURE.md)
    kernel_compile_ms: float = 0.0


class Executor:
    """Base class: see the module docstring."""

    name = ""

    def __init__(self, backend: Backend, tensors: dict[str, torch.Tensor], record: bool = False,
                 progress: Progress | None = None):
        self.backend = backend
        self.tensors = tensors
        self.record = record
        self.progress = progress

    def run(self, graph) -> ExecStats:
        raise NotImplementedError

    def replay(self) -> None:
        raise NotImplementedError

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Milliseconds per InCore function of one replay (summed over its launches)."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise ExecutionError if the device reported a failure during the last runs (nothing to
        check for host-driven executors)."""

    def report(self) -> dict:
        """Executor-specific numbers for reports (JSON-able)."""
        return {}

    @property
    def cuda(self) -> bool:
        return any(t.is_cuda for t in self.tensors.values())

    def capture(self) -> torch.cuda.CUDAGraph:
        """Record a replay into a CUDA graph (the backend must be graph-capturable), after the
        graph's first run. Nothing runs here: no warm-up replay off the capture (what torch
        suggests for libraries that set up on first use), because the first run was that warm-up
        (every kernel compiled and loaded, every communicator made) and a replay would execute
        the graph once more: a decode step would append to its cache and advance its position,
        and the first replay after the capture would then be the second step from the state its
        caller set (``pto generate`` on a GPU lost its second token)."""
        if not self.backend.graph_capturable:
            raise ExecutionError(f"the {self.backend.name} backend cannot be captured in a CUDA graph")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.replay()
        return g

    def sync(self) -> None:
        """Wait for the GPU when the tensors live there (host timestamps need it)."""
        for d in {t.device for t in self.tensors.values() if t.is_cuda}:
            torch.cuda.synchronize(d)


__all__ = ["Executor", "ExecStats", "LaunchRecord", "ItemRecord", "Progress"]
