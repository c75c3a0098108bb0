"""Element types of tensors and tiles.

Compute types are f32, f16 and bf16: every tile has one, and so has every tensor a task writes.
The block-quantized types (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k: GGUF's; fp8: E4M3 with a scale
per row) are storage types of weights only (:mod:`pto.ir.quant`: the row layout and the
dequantization): a memref or a tensor may have one, a tile never; a load from such a memref
dequantizes into a tile of a compute type, and nothing stores into one. Their buffers are
``rows x row_bytes`` uint8 tensors (:meth:`DType.storage_shape`), rows still rows.
"""

from __future__ import annotations

import enum

from pto.errors import BuildError
from pto.ir.quant import FORMATS, QuantFormat


class DType(enum.Enum):
    F32 = ("f32", 4)
    F16 = ("f16", 2)
    BF16 = ("bf16", 2)
    Q4_0 = ("q4_0", 1)
    Q4_1 = ("q4_1", 1)
    Q5_0 = ("q5_0", 1)
    Q5_1 = ("q5_1", 1)
    Q8_0 = ("q8_0", 1)
    Q4_K = ("q4_k", 1)
    Q5_K = ("q5_k", 1)
    Q6_K = ("q6_k", 1)
    FP8 = ("fp8", 1)

    def __init__(self, short: str, itemsize: int):
        self.short = short
        #: bytes per element of the buffer (a quantized type's buffer is bytes: 1)
        self.itemsize = itemsize

    def __str__(self) -> str:
        return self.short

    def __repr__(self) -> str:
        return f"pto.{self.short}"

    @property
    def torch(self):
        """The torch dtype of the buffer (uint8 for a quantized type)."""
        import torch

        if self.quant is not None:
            return torch.uint8
        return {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}[self]

    @property
    def is_half(self) -> bool:
        return self.itemsize == 2

    @property
    def quant(self) -> QuantFormat | None:
        """The block-quantized format (None for a compute type)."""
        return FORMATS.get(self.short)

    @property
    def is_quantized(self) -> bool:
        return self.short in FORMATS

    def storage_shape(self, rows: int, cols: int) -> tuple[int, int]:
        """The shape of the buffer of a ``rows x cols`` tensor (a quantized type's: its rows of
        bytes, :meth:`pto.ir.quant.QuantFormat.row_bytes`)."""
        q = self.quant
        return (rows, cols) if q is None else (rows, q.row_bytes(cols))

    def nbytes(self, rows: int, cols: int) -> int:
        """Bytes of a ``rows x cols`` tensor of this type."""
        r, c = self.storage_shape(rows, cols)
        return r * c * self.itemsize


f32 = DType.F32
f16 = DType.F16
bf16 = DType.BF16
#: the types of tiles and of what tasks compute (a run's --dtype)
COMPUTE = (DType.F32, DType.F16, DType.BF16)
QUANTIZED = tuple(d for d in DType if d.is_quantized)

_BY_NAME = {d.short: d for d in DType}
_BY_NAME.update({"float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16})


def dtype_of(value) -> DType:
    """Accept a DType, its short name ("bf16", "q4_k") or a torch dtype (a compute type's);
    raise BuildError otherwise."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        import torch

        if isinstance(value, torch.dtype):
            for d in COMPUTE:
                if d.torch == value:
                    return d
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    names = ", ".join(d.short for d in DType)
    raise BuildError(f"unknown dtype {value!r}; expected one of {names}")
