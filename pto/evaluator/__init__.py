"""The reference tile evaluator: InCore functions run on torch tensors, a batch of tasks at a
time (:mod:`.machine`; region reads and writes in :mod:`.regions`, helpers in :mod:`.support`).
The reference interpreter (:mod:`pto.interp`) and the torch backend
(:mod:`pto.backends.torch_backend`) both run InCore functions through it."""

from pto.evaluator.machine import run_incore_batch

__all__ = ["run_incore_batch"]
