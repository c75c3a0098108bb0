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
    from pto.passes.tiling import get_target

    if target is None:  # tile sizes for the machine that runs the program
        from pto.device import device_info
        from pto.passes.tiling import target_for_device

        target = target_for_device(device_info(dev)).name
    get_target(target)  # an unknown name is an error for every program
    if attention != "fused" and "attention" not in prog.uses:
        raise UsageError(f"{prog.name} has no attention: --attention {attention} does not apply")
    if not causal and "causal" not in prog.uses:
        raise UsageError(f"{prog.name} has no attention: --no-causal does not apply")
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


class Runner:
    """One program prepared for repeated execution at one shape.

    The graph is built once and its tensors are static buffers; the first call executes the
    graph (the executor records its launches), later calls copy the new inputs in and replay the
    launches, captured in a CUDA graph when the backend allows it. :func:`get_runner` caches
    runners by shape, so a CUDA graph is rebuilt only when the shapes change.
    """

    def __init__(self, prog, opts: RunOptions, seq: int, device: str, backend: str, adaptive: bool = True,
                 record: bool = False):
        from pto.backends import get_backend
        from pto.executor import Executor
        from pto.graph import CompiledProgram
        from pto.interp.orchestration import allocate, tensor_shapes

        self.prog, self.opts, self.seq, self.device = prog, opts, seq, device
        t0 = time.perf_counter()
        self.module = prog.build(opts)
        compiled = CompiledProgram.get(self.module, adaptive=adaptive, target=opts.target)
        self.compile_ms = (time.perf_counter() - t0) * 1e3
        self.scalars = prog.scalars(opts, seq)
        self.graph = compiled.build_graph(self.scalars)
        fn = self.module.entry_function
        shapes = tensor_shapes(fn, self.scalars)
        # static buffers: inputs are copied in on every call (a captured graph reads them there)
        placeholders = {t.name: torch.empty(shapes[t.name], dtype=t.dtype.torch, device=device)
                        for t in fn.tensors if t.role in ("input", "inout")}
        self.tensors = allocate(fn, shapes, placeholders, device)
        self.executor = Executor(get_backend(backend, device), self.tensors, record=record)
        self.stats = None
        self.cuda_graph = None

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on ``inputs``; returns the program's output tensors (the runner's buffers)."""
        for name, value in inputs.items():
            self.tensors[name].copy_(value)
        if self.stats is None:
            self.stats = self.executor.run(self.graph)
        else:
            self.replay()
        return {name: self.tensors[name] for name in self.prog.outputs}

    def replay(self) -> str:
        """Replay the recorded launches; returns how ("cuda_graph" or "launches")."""
        if self.device == "cuda" and self.executor.backend.graph_capturable:
            if self.cuda_graph is None:
                self.cuda_graph = self.executor.capture()
            self.cuda_graph.replay()
            return "cuda_graph"
        self.executor.replay()
        return "launches"

    def time(self, repeat: int) -> dict:
        """Median milliseconds of ``repeat`` replays (CUDA events on the GPU)."""
        from pto.timing import median_ms

        mode = self.replay()  # also captures the CUDA graph once
        ms = median_ms(self.replay, repeat, warmup=0, cuda=self.device == "cuda")
        return {"replay_ms": round(ms, 4), "replays": repeat, "replay_mode": mode}

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Milliseconds per InCore function: each recorded launch timed on its own (warmed up,
        median of ``repeat``; CUDA events on the GPU), summed per function. The first run
        compiled the kernels, so this is kernel time, not compile time."""
        from pto.timing import median_ms

        acc: dict[str, float] = {}
        for launch, name in zip(self.executor.launches, self.executor.launch_names):
            base = name.split("__")[0]
            acc[base] = acc.get(base, 0.0) + median_ms(launch, repeat, warmup=1, cuda=self.device == "cuda")
        return {k: round(v, 4) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}

    def close(self) -> None:
        self.graph.close()


_RUNNERS: dict[tuple, Runner] = {}


def get_runner(prog, opts: RunOptions, seq: int, device: str, backend: str, adaptive: bool = True) -> Runner:
    """The cached runner of this program at this shape (built on first use)."""
    key = (prog.name, opts.config, opts.dtype, opts.causal, opts.attention, opts.target, seq, device, backend,
           adaptive)
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = Runner(prog, opts, seq, device, backend, adaptive)
    return runner


def clear_runners() -> None:
    """Drop every cached runner (and the device memory it holds)."""
    for r in _RUNNERS.values():
        r.close()
    _RUNNERS.clear()


def run(program: str, seq: int | None = None, config: str = "auto", device: str = "auto",
        backend: str = "auto", dtype: str | None = "auto", causal: bool = True, attention: str = "fused",
        target: str | None = None, check: bool = False, dump: str | None = None, trace: str | None = None,
        seed: int = 0, repeat: int = 1, profile: bool = False, adaptive: bool = True) -> dict:
    """Build and run ``program``; returns the JSON-able result of ``pto run --json``.

    With ``repeat > 1`` the runner is cached by shape: calling again with the same shapes replays
    the same CUDA graph."""
    prog, dev, be, opts = resolve_options(program, config, device, backend, dtype, causal, attention, target)
    seq = seq or prog.default_seq
    prog.check_size(opts, seq)
    record = bool(trace)
    cached = repeat > 1 and not record
    runner = get_runner(prog, opts, seq, dev, be, adaptive) if cached else \
        Runner(prog, opts, seq, dev, be, adaptive, record=record)
    try:
        graph = runner.graph
        if dump:
            graph.dump(dump)
        inputs = prog.inputs(opts, seq, dev, seed)
        first = runner.stats is None
        t0 = time.perf_counter()
        outputs = runner(inputs)
        if not first:
            _sync(dev)
        stats = runner.stats
        out = {
            "program": prog.name, "seq": seq, "config": opts.config, "device": dev, "backend": be,
            "dtype": opts.dtype.short, "tasks": graph.tasks, "edges": graph.edges,
            "launches": stats.launches, "waves": stats.waves, "build_ms": round(graph.build_ms, 3),
            "exec_ms": round(stats.exec_ms if first else (time.perf_counter() - t0) * 1e3, 3),
            "compile_ms": round(runner.compile_ms, 1),
            "bytes_per_task": round(float(graph.stats["bytes_per_task"]), 1),
        }
        if check:
            ref = prog.reference(opts, seq, inputs)
            out["rel_err"] = max(rel_err(outputs[k], v) for k, v in ref.items())
        if trace:
            from pto.trace import write_trace

            write_trace(trace, stats.records, graph)
        if profile:
            out["profile"] = runner.profile()
        if repeat > 1:
            out.update(runner.time(repeat))
        return out
    finally:
        if not cached:
            runner.close()


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


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
    from pto.runtime import runtime_portable_files

    # the same defaults as `pto run` on this machine: its target (tile sizes) and dtype
    prog, _dev, _be, opts = resolve_options(program, config, "auto", "auto", dtype, causal, attention, target)
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
    for src in runtime_portable_files():
        shutil.copyfile(src, out / src.name)
        written.append(str(out / src.name))
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
