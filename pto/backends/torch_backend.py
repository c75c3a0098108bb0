"""The torch backend: the batched tile evaluator (:mod:`pto.evaluator.machine`) as a backend.

Any device; one group of torch ops per instruction for a whole batch. It synchronizes with the
host (loop trip counts, parallel extents), so its launches are not captured in CUDA graphs.
"""

from __future__ import annotations

from pto.backends.base import Backend, Launch
from pto.batch import RegionBatch, TaskBatch
from pto.evaluator.machine import run_incore_batch


class TorchBackend(Backend):
    name = "torch"
    description = "the batched tile evaluator in torch (any device)"

    @classmethod
    def create(cls, device, launch: dict[str, dict], shipped: tuple = ()) -> TorchBackend:
        return cls()  # no launch parameters or schedules to apply

    def prepare(self, batch: TaskBatch) -> Launch:
        fn, size = batch.fn, batch.size
        mems = {}
        for name, rb in batch.mems.items():
            dev = rb.tensor.device
            mems[name] = RegionBatch(rb.tensor, rb.row0.to(dev), rb.col0.to(dev), rb.rows.to(dev),
                                     rb.cols.to(dev))
        dev = next(iter(batch.mems.values())).tensor.device
        scalars = {k: v.to(dev) for k, v in batch.scalars.items()}

        def launch():
            run_incore_batch(fn, mems, scalars, size)

        launch.count = 1  # one group of torch ops
        return launch
