"""The ``c`` backend: InCore functions compiled to C (:mod:`pto.codegen.c_incore`), for the CPU.

Its home is the native executor (:mod:`pto.exec.native`, the ``native`` capability): the whole
program compiled into one shared object (:func:`pto.backends.c.build.program_module`) whose
worker threads run each task's kernel as the runtime readies it. A batch handed over by the wave
executor (``prepare``) runs its tasks' kernels one after another in one C call; a function with
a collective runs on the torch evaluator, as the triton backend's do.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pto.backends.base import Backend, Launch
from pto.backends.c.build import ProgramModule, kernel_module, program_module
from pto.backends.torch_backend import TorchBackend
from pto.cache.cbuild import compiler_available
from pto.data.batch import TaskBatch
from pto.errors import ExecutionError, UsageError
from pto.ir.analysis import has_collective
from pto.ir.dtypes import DType

#: ``pto_region`` of pto_kernel_abi.h as a numpy record (a pointer and seven int64)
REGION = np.dtype([("origin", np.uintp), ("ld", np.int64), ("rows", np.int64), ("cols", np.int64),
                   ("row0", np.int64), ("col0", np.int64), ("trows", np.int64), ("tcols", np.int64)])


def row_stride(t: torch.Tensor, what: str, dtype: DType) -> int:
    """The elements between ``t``'s rows (a quantized tensor's: bytes between its rows of
    blocks); ExecutionError for a tensor a kernel cannot address (not on the CPU, not 2-D with
    contiguous rows, another dtype than the memref's)."""
    if t.device.type != "cpu":
        raise ExecutionError(f"{what}: the c backend runs on the CPU; the tensor is on {t.device}")
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        raise ExecutionError(f"{what}: the c backend needs a 2-D tensor with contiguous rows, got shape "
                             f"{tuple(t.shape)} and strides {t.stride()}")
    if t.dtype != dtype.torch:
        raise ExecutionError(f"{what}: memref is {dtype} but the tensor is {t.dtype}")
    return max(int(t.stride(0)), int(t.shape[1]), 1)


def region_table(batch: TaskBatch) -> np.ndarray:
    """``[tasks, memrefs]`` pto_region records of a batch."""
    fn = batch.fn
    out = np.zeros((batch.size, len(fn.memrefs)), REGION)
    for k, p in enumerate(fn.memrefs):
        rb = batch.mems[p.name]
        t = rb.tensor
        ld = row_stride(t, f"`{fn.variant_name}` memref `{p.name}`", p.dtype)
        row0, col0 = rb.row0.numpy(), rb.col0.numpy()
        col = out[:, k]
        q = p.dtype.quant
        # a quantized tensor's region starts at its first row's first byte (the kernel finds the
        # columns in the blocks); its columns are the matrix's, not the buffer's bytes
        start = row0 * ld if q is not None else (row0 * ld + col0) * t.element_size()
        col["origin"] = t.data_ptr() + start
        col["ld"], col["rows"], col["cols"] = ld, rb.rows.numpy(), rb.cols.numpy()
        col["row0"], col["col0"] = row0, col0
        col["trows"] = t.shape[0]
        col["tcols"] = t.shape[1] if q is None else q.blocks_of_row(t.shape[1]) * q.block
    return out


class CBackend(Backend):
    name = "c"
    description = "InCore functions compiled to C, run by the C runtime's worker threads (the CPU, with a C compiler)"
    capabilities = frozenset({"native"})
    #: auto's choice on a CPU with a compiler: above the evaluator (torch: the reference, and the
    #: fallback), below a GPU's Triton (which never offers itself for the CPU)
    auto_rank = 5

    @classmethod
    def create(cls, device, launch: dict[str, dict], shipped: tuple = ()) -> CBackend:
        why = cls.unusable(str(device))
        if why is not None:
            raise UsageError(why)
        return cls()  # no launch parameters or schedules

    @classmethod
    def unusable(cls, device: str) -> str | None:
        if device != "cpu":
            return f"--backend c runs on the CPU; --device {device} needs --backend triton or torch"
        if not compiler_available():
            return "--backend c needs a C compiler (cc, or $CC); none is installed"
        return None

    def prepare(self, batch: TaskBatch) -> Launch:
        fn = batch.fn
        if has_collective(fn):  # a sum over the ranks: torch.distributed's, through the evaluator
            return TorchBackend().prepare(batch)
        t0 = time.perf_counter()
        kernels = kernel_module([fn])  # compiled or loaded once, then kept in memory
        self.compile_ms += (time.perf_counter() - t0) * 1e3
        regions = region_table(batch)
        scalars = np.zeros((batch.size, max(len(fn.scalars), 1)), np.int64)
        for k, p in enumerate(fn.scalars):
            scalars[:, k] = batch.scalars[p.name].numpy()
        ffi = kernels.module.ffi
        pr, ps = ffi.from_buffer("pto_region[]", regions), ffi.from_buffer("int64_t[]", scalars)
        tensors = [rb.tensor for rb in batch.mems.values()]  # kept alive with the launch
        n = batch.size

        def launch():
            st = kernels.run(0, pr, ps, n)
            if st != 0:
                raise ExecutionError(f"`{fn.variant_name}`: the compiled kernel failed with status {st}")

        launch.count = 1
        launch.keep = (regions, scalars, tensors)
        return launch

    def program(self, corch) -> ProgramModule:
        """The whole program compiled for the native executor (:mod:`pto.exec.native`)."""
        return program_module(corch)

    def row_stride(self, t: torch.Tensor, what: str, dtype: DType) -> int:
        return row_stride(t, what, dtype)


__all__ = ["CBackend", "REGION", "region_table", "row_stride"]
