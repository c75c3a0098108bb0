"""Which device ``auto`` means: a CUDA GPU when torch sees one, else the CPU (checked once, at
the boundary: :func:`resolve_device`). The device's description is its
:class:`pto.machine.target.Target` (:func:`pto.machine.target.detect`); what ``pto info``
prints of it is :mod:`pto.cli.commands.info`.
"""

from __future__ import annotations

from pto.errors import UsageError

DEVICES = ("auto", "cpu", "cuda")


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - a broken driver must not stop the CPU path
        return False


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r} (choose {', '.join(DEVICES)})")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise UsageError("--device cuda: no CUDA GPU is visible to torch on this machine")
    return device


__all__ = ["DEVICES", "cuda_available", "resolve_device"]
