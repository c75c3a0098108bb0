"""SRAM-aware tiling (seed 004, "Dynamic Tiling" and "SRAM Constraint Analysis").

A :class:`Target` says how much on-chip memory one InCore task may use and what its vector unit
looks like. From it:

- :func:`compute_tile_shape` picks the elementwise tile of a dtype (the seed's "Tile Sizes by
  ISA" table: one vector-friendly 16 KiB tile, 1 x N on ARM64 and CUDA, 32 x N on Ascend);
- :func:`flash_sram_bytes` / :func:`flash_tile_rows` size flash-attention blocks: Q, K, V and O
  take rows x d each and the score block S rows x rows, so S grows quadratically and caps the
  tile height;
- :func:`check_sram` rejects an InCore function whose live tiles exceed the target's memory,
  naming the tiles and their bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.errors import SramError, UsageError
from pto.ir.analysis import live_tiles_peak, tile_bytes
from pto.ir.nodes import IncoreFunction

KiB = 1024


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    sram_bytes: int  # on-chip memory one task (block) may use
    vector_bytes: int  # width of one vector operation
    tile_rows: int  # rows of the elementwise tile (1: a row vector; 32: Ascend's 32-row repeats)
    tile_bytes: int = 16 * KiB  # bytes of the elementwise tile
    cube: tuple[int, int, int] | None = None  # matrix-unit shape (m, n, k), if any


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("arm64", "ARM64 core: NEON 128-bit, 64 KiB L1D", 64 * KiB, 16, 1),
    Target("x86_64", "x86-64 core: AVX-512, 48 KiB L1D", 48 * KiB, 64, 1),
    Target("cuda_h100", "NVIDIA H100 (sm_90): 228 KiB shared memory per SM, 227 KiB per block",
           227 * KiB, 16, 1, cube=(64, 256, 16)),
    Target("cuda_a100", "NVIDIA A100 (sm_80): 164 KiB shared memory per SM, 163 KiB per block",
           163 * KiB, 16, 1, cube=(16, 8, 16)),
    Target("ascend910b", "Huawei Ascend 910B AI core: 256 KiB unified buffer, 256-byte vectors",
           256 * KiB, 256, 32, cube=(16, 16, 16)),
)}

_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i8": 1, "fp8": 1}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r} (choose from {', '.join(TARGETS)})") from None


def itemsize(dtype) -> int:
    key = getattr(dtype, "short", dtype)
    if key not in _ITEMSIZE:
        raise UsageError(f"unknown dtype {dtype!r} (choose from {', '.join(_ITEMSIZE)})")
    return _ITEMSIZE[key]


def target_for_device(info=None) -> Target:
    """The target of the machine pto runs on (from :func:`pto.device.device_info`)."""
    import platform

    if info is None or info.device != "cuda":
        return TARGETS["arm64" if platform.machine() in ("arm64", "aarch64") else "x86_64"]
    if info.capability and info.capability[0] >= 9:
        return TARGETS["cuda_h100"]
    if info.smem_per_block:
        base = TARGETS["cuda_a100"]
        return Target(f"cuda_sm{info.capability[0]}{info.capability[1]}", info.name,
                      int(info.smem_per_block), base.vector_bytes, 1, cube=base.cube)
    return TARGETS["cuda_a100"]


def compute_tile_shape(dtype, target: Target | str) -> tuple[int, int]:
    """The elementwise tile (rows, cols) of ``dtype`` on ``target``: ``tile_bytes`` of data in
    ``tile_rows`` rows (ARM64/CUDA 1 x 4096 f32; Ascend 910B 32 x 128 f32)."""
    t = get_target(target) if isinstance(target, str) else target
    size = itemsize(dtype)
    return t.tile_rows, t.tile_bytes // (t.tile_rows * size)


def flash_sram_bytes(rows: int, head_dim: int, dtype) -> int:
    """On-chip bytes of one flash-attention block: Q, K, V, O (rows x d each) and S (rows x rows)."""
    return (4 * rows * head_dim + rows * rows) * itemsize(dtype)


def flash_tile_rows(target: Target | str, head_dim: int, dtype, candidates=(256, 128, 64, 32, 16)) -> int:
    """The largest tile height whose flash-attention block fits the target's on-chip memory."""
    t = get_target(target) if isinstance(target, str) else target
    for r in candidates:
        if flash_sram_bytes(r, head_dim, dtype) <= t.sram_bytes:
            return r
    raise SramError(f"no flash-attention tile of {list(candidates)} rows with head dim {head_dim} "
                    f"({dtype}) fits the {t.sram_bytes // KiB} KiB of target {t.name}")


def _fmt(n: int) -> str:
    return f"{n / KiB:.1f} KiB" if n >= KiB else f"{n} B"


def check_sram(fn: IncoreFunction, target: Target | str, dims: dict[str, int] | None = None) -> int:
    """Raise SramError when the tiles live at the same time in ``fn`` exceed the target's
    on-chip memory; return the peak live bytes otherwise."""
    t = get_target(target) if isinstance(target, str) else target
    peak, names = live_tiles_peak(fn, dims)
    if peak > t.sram_bytes:
        sizes = tile_bytes(fn, dims)
        parts = ", ".join(f"{n} {_fmt(sizes[n])}" for n in sorted(names, key=lambda n: -sizes[n]))
        raise SramError(f"`{fn.variant_name}` needs {_fmt(peak)} of live tiles ({parts}) but target "
                        f"{t.name} has {_fmt(t.sram_bytes)} of on-chip memory")
    return peak
