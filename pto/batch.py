"""What an executor hands a backend: a batch of tasks of one specialized InCore function.

A :class:`TaskBatch` binds each memref parameter of the function to one :class:`RegionBatch`
(one tensor, a region per task) and each scalar parameter to a per-task vector. The executors,
the backends and the tile evaluator all speak it; it depends on nothing but torch and the IR.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pto.ir.nodes import IncoreFunction


@dataclass
class RegionBatch:
    """The regions one memref parameter is bound to, one per task (int64 vectors of length B)."""

    tensor: torch.Tensor
    row0: torch.Tensor
    col0: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor


@dataclass
class TaskBatch:
    """Tasks of one specialized InCore function that may run concurrently.

    ``mems[p]`` holds, for every task, the region memref parameter ``p`` is bound to (all tasks
    of a batch bind ``p`` to the same tensor); ``scalars[s]`` the per-task values of scalar
    parameter ``s`` (int64 vectors of length ``size``). Tasks of a batch never write overlapping
    elements.
    """

    fn: IncoreFunction
    mems: dict[str, RegionBatch]
    scalars: dict[str, torch.Tensor]
    size: int


__all__ = ["RegionBatch", "TaskBatch"]
