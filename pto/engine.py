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
    if target is None:  # tile sizes for the machine that runs the program
        from pto.device import device_info
        from pto.passes.tiling import target_for_device

        target = target_for_device(device_info(dev)).name
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
        seed: int = 0, repeat: int = 1, profile: bool = False, adaptive: bool = True) -> dict:
    """Build and run ``program``; returns the JSON-able result of ``pto run --json``."""
    from pto.backends import get_backend
    from pto.executor import Executor
    from pto.graph import CompiledProgram
    from pto.interp.orchestration import allocate, tensor_shapes

    prog, dev, be, opts = resolve_options(program, config, device, backend, dtype, causal, attention, target)
    seq = seq or prog.default_seq
    scalars = prog.scalars(opts, seq)
    t0 = time.perf_counter()
    module = prog.build(opts)
    compiled = CompiledProgram.get(module, adaptive=adaptive)
    compile_ms = (time.perf_counter() - t0) * 1e3
    graph = compiled.build_graph(scalars)
    try:
        if dump:
            graph.dump(dump)
        inputs = prog.inputs(opts, seq, dev, seed)
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), inputs, dev)
        ex = Executor(get_backend(be, dev), tensors, record=bool(trace) or profile)
        stats = ex.run(graph)
        exec_ms = stats.exec_ms
        out = {
            "program": prog.name, "seq": seq, "config": opts.config, "device": dev, "backend": be,
            "dtype": opts.dtype.short, "tasks": graph.tasks, "edges": graph.edges,
            "launches": stats.launches, "waves": stats.waves, "build_ms": round(graph.build_ms, 3),
            "exec_ms": round(exec_ms, 3), "compile_ms": round(compile_ms, 1),
            "bytes_per_task": round(float(graph.stats["bytes_per_task"]), 1),
        }
        if check:
            ref = prog.reference(opts, seq, inputs)
            out["rel_err"] = max(rel_err(tensors[k], v) for k, v in ref.items())
        if trace:
            from pto.trace import write_trace

            write_trace(trace, stats.records, graph)
        if profile:
            out["profile"] = profile_table(stats.records)
        if repeat > 1:
            out.update(time_replays(ex, repeat, dev))
        return out
    finally:
        graph.close()


def profile_table(records) -> dict:
    """Milliseconds per InCore function (host clock around synchronized launches)."""
    acc: dict[str, float] = {}
    for r in records:
        name = r.func.split("__")[0]
        acc[name] = acc.get(name, 0.0) + (r.end_ns - r.start_ns) / 1e6
    return dict(sorted(acc.items(), key=lambda kv: -kv[1]))


def time_replays(ex, repeat: int, dev: str) -> dict:
    """Median time of ``repeat`` replays of the recorded launches (a CUDA graph when the backend
    allows it)."""
    times = []
    if dev == "cuda":
        graph = ex.capture() if ex.backend.graph_capturable else None
        for _ in range(repeat):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            if graph is not None:
                graph.replay()
            else:
                ex.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        mode = "cuda_graph" if graph is not None else "launches"
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            ex.replay()
            times.append((time.perf_counter() - t0) * 1e3)
        mode = "launches"
    times.sort()
    return {"replay_ms": round(times[len(times) // 2], 4), "replays": repeat, "replay_mode": mode}


def format_summary(res: dict) -> str:
    lines = [
        f"{res['program']} seq={res['seq']} config={res['config']} device={res['device']} "
        f"backend={res['backend']} dtype={res['dtype']}",
        f"tasks {res['tasks']}  edges {res['edges']}  launches {res['launches']}",
        f"build {res['build_ms']:.2f} ms  exec {res['exec_ms']:.2f} ms",
    ]
    if "replay_ms" in res:
        lines.append(f"replay {res['replay_ms']:.3f} ms (median of {res['replays']}, {res['replay_mode']})")
    if "rel_err" in res:
        lines.append(f"rel_err {res['rel_err']:.3e} vs the torch reference")
    if "profile" in res:
        lines.append("time per InCore function (ms):")
        lines += [f"  {k:<28} {v:9.3f}" for k, v in res["profile"].items()]
    return "\n".join(lines)


def codegen(program: str, out_dir: str, seq: int | None = None, config: str = "auto",
            dtype: str | None = "auto", causal: bool = True, attention: str = "fused",
            target: str | None = None, adaptive: bool = True) -> list[str]:
    """Write a self-contained directory: the orchestration .c, the runtime sources and headers,
    a main.c (``cc -O2 -Wall -Wextra -Werror DIR/*.c -o DIR/graph`` builds a program that builds
    the graph for the sequence length on its command line), the module's text form, and the
    Triton kernel sources of every InCore variant the program calls."""
    import shutil
    from pathlib import Path

    from pto.codegen.c_orch import generate_c, generate_main
    from pto.passes.binary_expansion import expand_binary, strip_adaptive
    from pto.runtime import runtime_include_dir

    prog, _dev, _be, opts = resolve_options(program, config, "cpu", "torch", dtype, causal, attention, target)
    if config == "auto":
        opts.config = "7b"
    module = prog.build(opts)
    lowered = expand_binary(module) if adaptive else strip_adaptive(module)
    corch = generate_c(lowered)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name: str, text: str) -> None:
        p = out / name
        p.write_text(text)
        written.append(str(p))

    write(corch.filename, corch.source)
    write("main.c", generate_main(corch, prog.scalar_exprs(opts), prog.name, default_seq=seq))
    inc = runtime_include_dir()
    for name in ("pto_runtime.h", "pto_runtime_api.h", "pto_runtime.c", "pto_orch.h"):
        shutil.copyfile(inc / name, out / name)
        written.append(str(out / name))
    write(f"{corch.name}.pto", module.text())
    try:
        from pto.codegen.triton import render_sources
    except ImportError:  # triton not installed: the C side stands alone
        render_sources = None
    if render_sources is not None:
        kdir = out / "kernels"
        kdir.mkdir(exist_ok=True)
        for fname, src in render_sources([v.func for v in corch.variants]).items():
            (kdir / fname).write_text(src)
            written.append(str(kdir / fname))
    return written
