"""The reference interpreter's InCore step: one task of a specialized InCore function on torch
tensors, through the batched tile evaluator (:mod:`pto.evaluator.machine`, which holds the
numerics contract every backend follows) with a batch of one.
"""

from __future__ import annotations

import torch

from pto.batch import RegionBatch
from pto.evaluator.machine import run_incore_batch
from pto.ir.nodes import IncoreFunction


def run_incore(fn: IncoreFunction, regions: dict[str, tuple], scalars: dict[str, int] | None = None) -> None:
    """Run one task: ``regions[p] = (tensor, row0, col0, rows, cols)``; scalars are ints."""
    mems = {}
    for name, (t, r0, c0, nr, nc) in regions.items():
        dev = t.device
        mems[name] = RegionBatch(t, *(torch.tensor([int(v)], device=dev) for v in (r0, c0, nr, nc)))
    dev = next(iter(regions.values()))[0].device
    sc = {k: torch.tensor([int(v)], device=dev) for k, v in (scalars or {}).items()}
    run_incore_batch(fn, mems, sc, 1)


__all__ = ["run_incore"]
