"""The one vocabulary for the machines pto tiles for and runs on.

A :class:`Target` describes a device: its architecture (``sm90``, ``x86_64``, ...), the on-chip
memory and registers one task (a GPU block) may use, its multiprocessor count and device memory,
and the vector geometry the elementwise tiles follow. Tiling (:mod:`pto.passes.tiling`), the
schedules, ``pto info`` and the engine all take a :class:`Target`; a name is resolved once, by
:func:`resolve`.

Named targets describe devices pto can tile for without having them (``pto codegen --target
cuda_h100`` on a laptop). The running device is described by :func:`detect` from what the
driver reports (shared memory per block, registers, SMs, memory), so an H200 or an A10 gets its
own numbers, not a neighbour's; when the detected device equals a named one (same architecture,
on-chip memory and SM count) it carries that name.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, replace

from pto.errors import UsageError

KiB = 1024
GiB = 1024**3


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    kind: str  # "cpu", "cuda" or "npu"
    arch: str  # "sm90", "sm80", "x86_64", "arm64", "ascend910b"
    sram_bytes: int  # on-chip memory one task (one GPU block) may use
    vector_bytes: int  # width of one vector operation
    tile_rows: int  # rows of the elementwise tile (1: a row vector; 32: Ascend's 32-row repeats)
    tile_bytes: int = 16 * KiB  # bytes of the elementwise tile
    cube: tuple[int, int, int] | None = None  # matrix-unit shape (m, n, k), if any
    regs_per_block: int | None = None  # 32-bit registers one block may use (GPUs)
    sm_count: int | None = None  # multiprocessors / cores that run tasks concurrently
    memory_bytes: int | None = None  # device memory (GPUs)
    device_name: str = ""  # what the driver calls the device ("" for a named target)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) of a CUDA target (``sm90`` -> (9, 0))."""
        m = re.fullmatch(r"sm(\d+)(\d)", self.arch)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["cube"] = list(self.cube) if self.cube else None
        return d


NAMED: dict[str, Target] = {t.name: t for t in (
    Target("arm64", "ARM64 core: NEON 128-bit, 64 KiB L1D", "cpu", "arm64", 64 * KiB, 16, 1),
    Target("x86_64", "x86-64 core: AVX-512, 48 KiB L1D", "cpu", "x86_64", 48 * KiB, 64, 1),
    Target("cuda_h100", "NVIDIA H100 SXM (sm_90): 227 KiB shared memory per block, 132 SMs, 80 GB",
           "cuda", "sm90", 227 * KiB, 16, 1, cube=(64, 256, 16), regs_per_block=65536, sm_count=132,
           memory_bytes=80 * 10**9),
    Target("cuda_h200", "NVIDIA H200 (sm_90): 227 KiB shared memory per block, 132 SMs, 141 GB",
           "cuda", "sm90", 227 * KiB, 16, 1, cube=(64, 256, 16), regs_per_block=65536, sm_count=132,
           memory_bytes=141 * 10**9),
    Target("cuda_a100", "NVIDIA A100 SXM (sm_80): 163 KiB shared memory per block, 108 SMs, 80 GB",
           "cuda", "sm80", 163 * KiB, 16, 1, cube=(16, 8, 16), regs_per_block=65536, sm_count=108,
           memory_bytes=80 * 10**9),
    Target("ascend910b", "Huawei Ascend 910B AI core: 256 KiB unified buffer, 256-byte vectors",
           "npu", "ascend910b", 256 * KiB, 256, 32, cube=(16, 16, 16)),
)}


def names() -> list[str]:
    return list(NAMED)


def get(name: str) -> Target:
    """The named target ``name`` (UsageError listing the names otherwise)."""
    try:
        return NAMED[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r} (choose from {', '.join(NAMED)}; "
                         "default: the machine's own)") from None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def host() -> Target:
    """The CPU pto runs on."""
    machine = platform.machine().lower()
    return NAMED["arm64" if machine in ("arm64", "aarch64") else "x86_64"]


def detect(device: str = "cpu", index: int = 0) -> Target:
    """The target of a device from what its driver reports: ``cuda`` reads the GPU's properties
    (architecture, shared memory a block may opt in to, registers, SMs, memory), ``cpu`` is the
    host's named target."""
    if device != "cuda":
        return host()
    import torch

    p = torch.cuda.get_device_properties(index)
    arch = f"sm{p.major}{p.minor}"
    smem = int(getattr(p, "shared_memory_per_block_optin", 0) or getattr(p, "shared_memory_per_block", 0))
    regs = getattr(p, "regs_per_multiprocessor", None)
    regs = min(int(regs), 65536) if regs else 65536  # a block may use at most 64K registers
    sms = int(p.multi_processor_count)
    for t in NAMED.values():  # the same device as a named target: take its name and geometry
        if t.arch == arch and t.sram_bytes == smem and t.sm_count == sms and t.memory_bytes \
                and abs(t.memory_bytes - p.total_memory) < 0.1 * t.memory_bytes:
            return replace(t, memory_bytes=int(p.total_memory), device_name=p.name)
    cube = (64, 256, 16) if p.major >= 9 else (16, 8, 16)
    return Target(f"cuda_{arch}_{_slug(p.name)}", f"{p.name} ({arch}), detected", "cuda", arch, smem, 16, 1,
                  cube=cube, regs_per_block=regs, sm_count=sms, memory_bytes=int(p.total_memory),
                  device_name=p.name)


def resolve(name: str | None, device: str) -> Target:
    """``name`` if given (a named target), else the device's own (:func:`detect`)."""
    return get(name) if name is not None else detect(device)


__all__ = ["Target", "NAMED", "names", "get", "host", "detect", "resolve", "KiB"]
