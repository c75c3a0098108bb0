"""The reference interpreter's InCore step: one task of a specialized InCore function on torch
tensors, through the batched tile evaluator (:mod:`pto.evaluator.machine`, which holds the
numerics contract every backend follows) with a batch of one.
"""

from __future__ import annotations

from pto.data.batch import TaskBatch
from pto.evaluator.machine import run_incore_batch
from pto.ir.nodes import IncoreFunction


def run_incore(fn: IncoreFunction, regions: dict[str, tuple], scalars: dict[str, int] | None = None) -> None:
    """Run one task: ``regions[p] = (tensor, row0, col0, rows, cols)``; scalars are ints."""
    batch = TaskBatch.one(fn, regions, scalars)
    run_incore_batch(fn, batch.mems, batch.scalars, 1)


__all__ = ["run_incore"]
