"""A quantized matrix on a device (:class:`QTensor`): its format, its rows of planes and its
logical columns; what a model's weights hold where they stay quantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.quant.planes import dequantize_rows


@dataclass(frozen=True)
class QTensor:
    """A ``rows x cols`` matrix of a block-quantized ``dtype``, its blocks along the columns
    (a weight stored output-major, ``[out, in]``); ``data`` is its ``rows x row_bytes`` uint8
    buffer (:mod:`pto.ir.quant`'s layout), the tensor a task graph binds."""

    dtype: DType
    data: torch.Tensor
    cols: int

    def __post_init__(self):
        if not self.dtype.is_quantized:
            raise ValueError(f"QTensor of {self.dtype}, not a quantized type")
        want = self.dtype.storage_shape(self.data.shape[0], self.cols)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(f"a {self.data.shape[0]} x {self.cols} {self.dtype} matrix is {want[0]} x {want[1]} "
                             f"uint8, not {tuple(self.data.shape)} {self.data.dtype}")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def to(self, device) -> QTensor:
        return QTensor(self.dtype, self.data.to(device), self.cols)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``rows x cols`` values (f32, rounded to ``dtype``), a block of rows at a time."""
        out = torch.empty(self.rows, self.cols, dtype=dtype, device=self.device)
        step = max(1, (1 << 22) // max(self.cols, 1))  # ~16 MB of f32 temporaries at once
        for r in range(0, self.rows, step):
            out[r:r + step] = dequantize_rows(self.dtype.quant, self.data[r:r + step], self.cols)
        return out

    def take_rows(self, index) -> QTensor:
        """Rows ``index`` (a slice or a long tensor), as their own matrix."""
        return QTensor(self.dtype, self.data[index].contiguous(), self.cols)

    @staticmethod
    def cat(parts: list[QTensor]) -> QTensor:
        """The rows of ``parts`` (one dtype, one width) one after the other."""
        first = parts[0]
        if any(p.dtype != first.dtype or p.cols != first.cols for p in parts):
            raise ValueError("QTensor.cat: every part needs the same dtype and columns")
        return QTensor(first.dtype, torch.cat([p.data for p in parts]), first.cols)

    @staticmethod
    def quantize(dtype, w: torch.Tensor) -> QTensor:
        """``w`` (``rows x cols`` floats) quantized by pto (:func:`pto.quant.quantize.quantize`)."""
        from pto.quant.quantize import quantize

        dt = dtype_of(dtype)
        if not dt.is_quantized:
            raise UsageError(f"{dt} is not a quantized type")
        return QTensor(dt, quantize(dt.quant, w), w.shape[1])


__all__ = ["QTensor"]
