"""What machine we run on: GPU architecture and capabilities, and the backend ``auto`` picks.

The dispatch rule (seed 001): detect the compute capability and features, pick the fastest
implementation that the machine supports, and always keep one that works everywhere (the torch
backend on the CPU).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict, dataclass

from pto.errors import UsageError


@dataclass
class DeviceInfo:
    device: str  # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] | None
    sm_count: int | None
    smem_per_block: int | None  # bytes a block may opt in to
    memory_bytes: int | None
    bf16: bool
    fp8: bool
    triton: bool
    backend: str  # what --backend auto picks

    @property
    def arch(self) -> str:
        if self.capability is None:
            return platform.machine()
        major, minor = self.capability
        return {9: "hopper", 10: "blackwell", 12: "blackwell", 8: "ampere" if minor < 9 else "ada",
                7: "volta" if minor < 5 else "turing"}.get(major, f"sm_{major}{minor}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["arch"] = self.arch
        return d


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - a broken driver must not stop the CPU path
        return False


def device_info(device: str = "auto") -> DeviceInfo:
    """Describe ``device`` ("auto" picks cuda when present)."""
    dev = resolve_device(device)
    tri = triton_available()
    if dev == "cuda":
        import torch

        p = torch.cuda.get_device_properties(0)
        cap = (p.major, p.minor)
        smem = (getattr(p, "shared_memory_per_block_optin", None)
                or getattr(p, "shared_memory_per_block", None))
        return DeviceInfo("cuda", p.name, cap, p.multi_processor_count, smem, p.total_memory,
                          bf16=cap >= (8, 0), fp8=cap >= (8, 9), triton=tri,
                          backend="triton" if tri else "torch")
    return DeviceInfo("cpu", platform.processor() or platform.machine(), None, None, None, None,
                      bf16=True, fp8=False, triton=tri, backend="torch")


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {device!r} (choose auto, cpu or cuda)")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise UsageError("--device cuda: no CUDA GPU is visible to torch on this machine")
    return device


def resolve_backend(backend: str, device: str) -> str:
    """``auto`` is triton on a GPU with Triton installed, torch otherwise. Triton on the CPU needs
    the interpreter (TRITON_INTERPRET=1, f32, small shapes)."""
    if backend not in ("auto", "triton", "torch"):
        raise UsageError(f"unknown backend {backend!r} (choose auto, triton or torch)")
    if backend == "auto":
        return "triton" if device == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise UsageError("--backend triton: the triton package is not installed")
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--backend triton on the CPU needs TRITON_INTERPRET=1 (the Triton "
                             "interpreter; f32 and small shapes only)")
    return backend


def format_info(info: DeviceInfo) -> str:
    if info.device == "cpu":
        lines = [
            f"device:   cpu ({info.name}); no CUDA GPU visible to torch",
            f"backend:  {info.backend} (auto); triton {'installed' if info.triton else 'not installed'}"
            + (" (usable on the CPU only with TRITON_INTERPRET=1)" if info.triton else ""),
        ]
        return "\n".join(lines)
    major, minor = info.capability
    gib = info.memory_bytes / 2**30 if info.memory_bytes else 0
    lines = [
        f"device:   {info.name} (cuda)",
        f"arch:     {info.arch}, compute capability {major}.{minor}",
        f"SMs:      {info.sm_count}",
        f"smem:     {info.smem_per_block // 1024 if info.smem_per_block else '?'} KiB per block (opt-in)",
        f"memory:   {gib:.1f} GiB",
        f"bf16:     {'yes' if info.bf16 else 'no'}    fp8: {'yes' if info.fp8 else 'no'}",
        f"backend:  {info.backend} (auto)",
    ]
    return "\n".join(lines)
