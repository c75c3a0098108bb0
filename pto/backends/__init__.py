"""Execution backends for InCore tasks: ``torch`` (the batched reference interpreter, any
device) and ``triton`` (generated Triton kernels; GPU, or the CPU interpreter for tests).

A backend turns a :class:`TaskBatch` (one specialized InCore function, many tasks) into a launch:
``launch = backend.prepare(batch)`` does everything that can be done once (compile, upload the
offset table), and ``launch()`` runs it; the executor calls launches in order on one stream and
may capture them in a CUDA graph.
"""

from pto.backends.base import Backend, TaskBatch, get_backend

__all__ = ["Backend", "TaskBatch", "get_backend"]
