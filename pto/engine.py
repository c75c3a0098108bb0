"""The ``pto run`` pipeline: resolve options, build the program, build and execute its graph,
check against the reference, report.

Kept apart from the command line so that benchmarks and tests call the same code.
"""

from __future__ import annotations

import time

import torch

from pto import programs
from pto.device import resolve_backend, resolve_device
from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.programs import RunOptions


def resolve_options(program: str, config: str, device: str, backend: str, dtype: str, causal: bool,
                    attention: str, target: str | None):
    prog = programs.get(program)
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    if config == "auto":
        config = "7b" if dev == "cuda" else "tiny"
    if dtype in (None, "auto"):
        dt = DType.BF16 if dev == "cuda" else DType.F32
    else:
        dt = dtype_of(dtype)
    if be == "triton" and dev == "cpu" and dt != DType.F32:
        raise UsageError("the Triton interpreter on the CPU runs f32 only; use --dtype f32")
    opts = RunOptions(config=config, dtype=dt, causal=causal, attention=attention, target=target)
    prog.check_options(opts)
    return prog, dev, be, opts


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖₂ / ‖ref‖₂ in float64 (inf if out has NaN or inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = r.norm().item()
    num = (o - r).norm().item()
    return num / den if den > 0 else num


def run(program: str, seq: int | None = None, config: str = "auto", device: str = "auto",
        backend: str = "auto", dtype: str | None = "auto", causal: bool = True, attention: str = "fused",
        target: str | None = None, check: bool = False, dump: str | None = None, trace: str | None = None,
        seed: int = 0, repeat: int = 1, profile: bool = False) -> dict:
    """Build and run ``program``; returns the JSON-able result of ``pto run --json``."""
    prog, dev, be, opts = resolve_options(program, config, device, backend, dtype, causal, attention, target)
    seq = seq or prog.default_seq
    from pto.interp.orchestration import run_program

    t0 = time.perf_counter()
    module = prog.build(opts)
    build_ms = (time.perf_counter() - t0) * 1e3
    inputs = prog.inputs(opts, seq, dev, seed)
    t0 = time.perf_counter()
    res = run_program(module, inputs, prog.scalars(opts, seq), device=dev)
    exec_ms = (time.perf_counter() - t0) * 1e3
    out = {
        "program": prog.name, "seq": seq, "config": opts.config, "device": dev, "backend": be,
        "dtype": opts.dtype.short, "tasks": res.tasks, "edges": None, "launches": res.tasks,
        "build_ms": round(build_ms, 3), "exec_ms": round(exec_ms, 3),
    }
    if check:
        ref = prog.reference(opts, seq, inputs)
        out["rel_err"] = max(rel_err(res.tensors[k], v) for k, v in ref.items())
    return out


def format_summary(res: dict) -> str:
    lines = [
        f"{res['program']} seq={res['seq']} config={res['config']} device={res['device']} "
        f"backend={res['backend']} dtype={res['dtype']}",
        f"tasks {res['tasks']}  edges {res['edges']}  launches {res['launches']}",
        f"build {res['build_ms']:.2f} ms  exec {res['exec_ms']:.2f} ms",
    ]
    if "rel_err" in res:
        lines.append(f"rel_err {res['rel_err']:.3e} vs the torch reference")
    return "\n".join(lines)


def codegen(program: str, out_dir: str, **kw) -> list[str]:  # filled in by the codegen issue
    raise UsageError("codegen is not available yet")
