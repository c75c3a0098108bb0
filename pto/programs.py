"""The registry of runnable programs (``pto run PROGRAM``).

A :class:`Program` bundles what the command line and the benchmarks need to run one program
end to end: the module for a configuration, its scalar parameters for a sequence length, seeded
random inputs, and an independent torch reference for ``--check``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from pto.errors import UsageError
from pto.ir.dtypes import DType
from pto.ir.nodes import Module


@dataclass
class RunOptions:
    """Options that change the program that gets built (not how it runs)."""

    config: str = "tiny"
    dtype: DType = DType.F32
    causal: bool = True
    attention: str = "fused"
    target: str | None = None  # SRAM-aware tiling target name; None: from the device


class Program:
    """Base class of runnable programs."""

    name = ""
    description = ""
    default_seq = 128
    configs: tuple[str, ...] = ("tiny", "7b")
    outputs: tuple[str, ...] = ()
    #: options besides config, dtype and target that change this program (e.g. "attention")
    uses: frozenset[str] = frozenset()

    def check_options(self, opts: RunOptions) -> None:
        if opts.config not in self.configs:
            raise UsageError(f"{self.name}: unknown config {opts.config!r} "
                             f"(choose from {', '.join(self.configs)})")

    def build(self, opts: RunOptions) -> Module:
        raise NotImplementedError

    def scalar_exprs(self, opts: RunOptions) -> dict:
        """Each scalar parameter of the entry function as an expression of ``seq`` (the
        standalone main.c that ``pto codegen`` writes evaluates them in C)."""
        raise NotImplementedError

    def scalars(self, opts: RunOptions, seq: int) -> dict[str, int]:
        from pto.ir.expr import evaluate

        return {k: int(evaluate(e, {"seq": seq})) for k, e in self.scalar_exprs(opts).items()}

    def inputs(self, opts: RunOptions, seq: int, device, seed: int = 0) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def reference(self, opts: RunOptions, seq: int,
                  inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def check_size(self, opts: RunOptions, seq: int) -> None:
        """Refuse, before any work, a size the program cannot run (nothing to check by default)."""

    def flops(self, opts: RunOptions, seq: int) -> float:
        """Floating-point operations of one run (for TFLOP/s); 0 if not meaningful."""
        return 0.0


_MODULES = {
    "softmax": "pto.orchestration.softmax",
    "bgemm": "pto.orchestration.bgemm",
    "llama7b": "pto.orchestration.llama7b",
}


def names() -> list[str]:
    return [n for n in _MODULES if _available(n)]


def _available(name: str) -> bool:
    try:
        importlib.import_module(_MODULES[name])
    except ModuleNotFoundError:
        return False
    return True


def get(name: str) -> Program:
    """The program registered under ``name`` (UsageError naming the choices otherwise)."""
    if name not in _MODULES or not _available(name):
        raise UsageError(f"unknown program {name!r} (choose from {', '.join(names())})")
    mod = importlib.import_module(_MODULES[name])
    return mod.PROGRAM


def seeded_randn(shape, dtype: DType, device, generator: torch.Generator, scale: float = 1.0):
    """Normal random values made on the CPU from a seeded generator (the same numbers on every
    device), then moved and cast."""
    x = torch.randn(*shape, generator=generator, dtype=torch.float32) * scale
    return x.to(device=device, dtype=dtype.torch)
