"""Element types of tensors and tiles.

Storage types are f32, f16 and bf16; i8 and fp8 have names reserved so that the text form and
the tables can grow without a format change, but no op accepts them yet.
"""

from __future__ import annotations

import enum

from pto.errors import BuildError


class DType(enum.Enum):
    F32 = ("f32", 4)
    F16 = ("f16", 2)
    BF16 = ("bf16", 2)

    def __init__(self, short: str, itemsize: int):
        self.short = short
        self.itemsize = itemsize

    def __str__(self) -> str:
        return self.short

    def __repr__(self) -> str:
        return f"pto.{self.short}"

    @property
    def torch(self):
        import torch

        return {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}[self]

    @property
    def is_half(self) -> bool:
        return self.itemsize == 2


f32 = DType.F32
f16 = DType.F16
bf16 = DType.BF16

_BY_NAME = {d.short: d for d in DType}
_BY_NAME.update({"float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16})


def dtype_of(value) -> DType:
    """Accept a DType, its short name ("bf16") or a torch dtype; raise BuildError otherwise."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        import torch

        if isinstance(value, torch.dtype):
            for d in DType:
                if d.torch == value:
                    return d
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    names = ", ".join(d.short for d in DType)
    raise BuildError(f"unknown dtype {value!r}; expected one of {names}")
