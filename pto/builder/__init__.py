"""Builders (the user-facing API that constructs and validates IR)."""

from pto.builder.incore import InCore, MemRef, TileRef
from pto.builder.orchestration import Orchestration, TensorRef

__all__ = ["InCore", "MemRef", "TileRef", "Orchestration", "TensorRef"]
