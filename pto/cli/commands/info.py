"""``pto info``: the device, its target, the backends and executors ``auto`` picks there (from
their registries), the quantized types every backend loads, and the collectives of tensor
parallelism (:func:`pto.machine.collectives.info`)."""

from __future__ import annotations

import platform

from pto import backends
from pto.exec import names as executor_names
from pto.exec import resolve as resolve_executor
from pto.ir.dtypes import DType
from pto.machine import collectives
from pto.machine.device import resolve_device
from pto.machine.target import detect


def info(device: str = "auto") -> dict:
    """What ``pto info --json`` prints: the device, its target, backends and executors, and the
    collectives of tensor parallelism (:func:`pto.machine.collectives.info`)."""
    dev = resolve_device(device)
    t = detect(dev)
    triton_version = None
    if backends.base.triton_available():
        from importlib.metadata import version

        triton_version = version("triton")
    be = backends.resolve("auto", dev)
    out = {
        "device": dev,
        "name": t.device_name or platform.processor() or platform.machine(),
        "target": t.name,
        "arch": t.arch,
        "capability": list(t.capability) if t.capability else None,
        "sram_bytes": t.sram_bytes,
        "regs_per_block": t.regs_per_block,
        "sm_count": t.sm_count,
        "memory_bytes": t.memory_bytes,
        "triton": triton_version,
        "backend": be,
        "backends": backends.names(),
        "executor": resolve_executor("auto", dev, be),
        "executors": executor_names(),
        # weights in memory: every backend's loads dequantize them (pto.ir.quant)
        "quantized": {d.short: d.quant.bits_per_weight for d in DType if d.is_quantized},
        "collectives": collectives.info(),
    }
    if dev == "cuda":
        out["bf16"] = t.capability >= (8, 0)
        out["fp8"] = t.capability >= (8, 9)
    if dev == "cuda":  # what each backend that runs here says of its modes on this GPU
        for name in backends.names():
            cls = backends.backend_class(name)
            if cls.unusable(dev) is None:
                out.update(cls.modes(t))
    return out


def format_info(d: dict) -> str:
    kib = d["sram_bytes"] // 1024
    none = "; no CUDA GPU visible to torch" if d["device"] == "cpu" else ""
    lines = [f"device:    {d['device']} ({d['name']}){none}"]
    lines.append(f"target:    {d['target']} (arch {d['arch']}" +
                 (f", compute capability {d['capability'][0]}.{d['capability'][1]}" if d["capability"] else "") + ")")
    sram = "shared memory per block (opt-in)" if d["device"] == "cuda" else "on-chip memory per task (L1D)"
    lines.append(f"SRAM:      {kib} KiB {sram}")
    if d["regs_per_block"]:
        lines.append(f"registers: {d['regs_per_block']:,} per block")
    if d["sm_count"]:
        lines.append(f"SMs:       {d['sm_count']}")
    if d["memory_bytes"]:
        lines.append(f"memory:    {d['memory_bytes'] / 2**30:.1f} GiB")
    if "bf16" in d:
        lines.append(f"bf16:      {'yes' if d['bf16'] else 'no'}    fp8: {'yes' if d['fp8'] else 'no'}")
    tri = f"triton {d['triton']}" if d["triton"] else "triton not installed"
    if d["triton"] and d["device"] == "cpu":
        tri += " (on the CPU only through its interpreter: TRITON_INTERPRET=1)"
    if "pdl" in d:
        tri += f"; programmatic dependent launch {d['pdl']} (PTO_PDL)"
        if d.get("pdl_late"):
            tri += f", nothing loaded before the wait by {d['pdl_late'].replace(',', ', ')} (PTO_PDL_LATE)"
        tri += f"; tensor descriptors {d.get('tma', 'off')} (PTO_TMA)"
        tri += (f"; quantized GEMVs by {d.get('qgemv', 'units')} (PTO_QGEMV; auto: integer dots for the integer "
                "formats, half dots for fp8; PTO_QGEMV_WARPS: their fewest warps a "
                "program, N or N,FUNCTION=M; PTO_QGEMV_COLS: a warp's columns); the tiles' scales by "
                f"{d.get('qscales', 'groups')} (PTO_QSCALES); their K steps loaded ahead {d.get('k_ahead', 'auto')} "
                "(PTO_K_AHEAD)")
        blocks = d.get("blocks_formats", "").replace(",", ", ")
        funcs = d.get("blocks_functions", "").replace(",", ", ")
        tri += (f"; persistent tile loops {d.get('persistent', 'off')} (PTO_PERSISTENT; auto: the gate/up GEMVs of "
                f"{blocks} weights loop over their blocks, PTO_BLOCKS_FORMATS"
                + (f"; and {funcs}, PTO_BLOCKS_FUNCTIONS" if funcs else "") + ")")
    lines.append(f"backend:   {d['backend']} (auto; {', '.join(d['backends'])}); {tri}")
    lines.append(f"executor:  {d['executor']} (auto; {', '.join(d['executors'])})")
    if d.get("quantized"):
        kinds = ", ".join(f"{k} ({v:g})" for k, v in d["quantized"].items())
        lines.append(f"quantized: {kinds} bits per weight; weights only, dequantized in registers by every backend")
    lines.append(f"collectives: {format_collectives(d['collectives'])}")
    return "\n".join(lines)


def format_collectives(c: dict) -> str:
    """One line: the mode, the process groups this torch has, symmetric memory's all-reduce
    (where it can run: its size limits; else why not), NVLink multicast."""
    groups = ", ".join(n for n in ("nccl", "gloo") if c[n]) or "none"
    if c["symmetric_memory"]:
        symm = (f"symmetric memory one-shot up to {c['one_shot_max_bytes'] // 1024} KiB, two-shot up to "
                f"{c['two_shot_max_bytes'] // 1024} KiB, the process group above")
    else:
        symm = f"symmetric memory no ({c['symmetric_memory_why']}): the process group's at every size"
    return (f"{c['mode']} (PTO_COLLECTIVES); process groups: {groups}; {symm}; NVLink multicast "
            f"{'on' if c['multicast'] else 'off'}")


__all__ = ["info", "format_info", "format_collectives"]
