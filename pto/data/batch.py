"""What an executor hands a backend: a batch of tasks of one specialized InCore function.

A :class:`TaskBatch` binds each memref parameter of the function to one :class:`RegionBatch`
(one tensor, a region per task) and each scalar parameter to a per-task vector. The executors,
the backends and the tile evaluator all speak it; it depends on nothing but torch and the IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    elements. ``readonly``: memref parameters the function only reads whose tensors the batch
    before does not write (none for a run's first batch): a kernel launched as a programmatic
    dependent of the previous one may load them before it waits (``RenderOptions.pre``), since
    every launch before its predecessor has completed when it starts.
    """

    fn: IncoreFunction
    mems: dict[str, RegionBatch]
    scalars: dict[str, torch.Tensor]
    size: int
    readonly: frozenset[str] = field(default_factory=frozenset)
    #: the launch after this one loads memory before its wait: this one signals right after its own
    #: wait, so that those loads overlap its work (the "auto" PDL policy)
    chain: bool = False

    @classmethod
    def one(cls, fn: IncoreFunction, regions: dict[str, tuple], scalars: dict[str, int] | None = None) -> TaskBatch:
        """A batch of one task in the reference interpreter's terms: ``regions[p] = (tensor,
        row0, col0, rows, cols)``, ``scalars`` ints (the index vectors on the tensors' device)."""
        mems = {name: RegionBatch(t, *(torch.tensor([int(v)], device=t.device) for v in (r0, c0, nr, nc)))
                for name, (t, r0, c0, nr, nc) in regions.items()}
        dev = next(iter(regions.values()))[0].device
        return cls(fn, mems, {k: torch.tensor([int(v)], device=dev) for k, v in (scalars or {}).items()}, 1)


__all__ = ["RegionBatch", "TaskBatch"]
