"""The backend interface and the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pto.errors import UsageError
from pto.interp.incore import RegionBatch
from pto.ir.nodes import IncoreFunction


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


Launch = Callable[[], None]  # with an int attribute ``count``: the device launches it makes


class Backend:
    """Turns task batches into launches."""

    name = ""
    #: launches may be captured in a CUDA graph (no host synchronization inside)
    graph_capturable = False

    def prepare(self, batch: TaskBatch) -> Launch:
        """Everything that can be done once; the returned callable runs the batch and carries
        ``count``, the number of device launches it makes (for ``launches`` in reports)."""
        raise NotImplementedError

    def launches_per_batch(self, batch: TaskBatch) -> int:
        """Device launches one prepared batch makes."""
        return self.prepare(batch).count


def get_backend(name: str, device: str) -> Backend:
    if name == "torch":
        from pto.backends.torch_backend import TorchBackend

        return TorchBackend()
    if name == "triton":
        from pto.backends.triton_backend import TritonBackend

        return TritonBackend(device)
    raise UsageError(f"unknown backend {name!r} (choose triton or torch)")
