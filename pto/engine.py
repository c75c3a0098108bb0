"""The ``pto run`` and ``pto codegen`` pipelines: resolve a job, build the program and its graph,
execute, check against the reference, report.

Kept apart from the command line so that benchmarks and tests call the same code. Nothing here
names a program or its options: a :class:`Job` carries the program and its
:class:`pto.program.Settings`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from pto import programs
from pto.backends import resolve as resolve_backend
from pto.device import resolve_device
from pto.errors import UsageError
from pto.exec import resolve as resolve_executor
from pto.ir.analysis import has_collective
from pto.program import Program, Settings
from pto.target import Target
from pto.target import resolve as resolve_target

if TYPE_CHECKING:
    from pto.graph import Graph
    from pto.ir.nodes import Module


@dataclass(frozen=True)
class Job:
    """A program with its settings, and where and how it runs."""

    program: Program
    settings: Settings
    device: str
    backend: str
    executor: str

    def to_json(self) -> dict:
        return {"program": self.program.name, "device": self.device, "backend": self.backend,
                "executor": self.executor, **self.settings.to_json()}


def resolve(program: str, *, device: str = "auto", backend: str = "auto", executor: str = "auto",
            config: str | None = None, dtype: str | None = None, target: str | Target | None = None,
            options: dict | None = None, tp: int = 1) -> Job:
    """Every default resolved once, by the rule of :mod:`pto.program` (the same for every
    command), every value checked; ``tp``: the tensor-parallel ranks (one rank's module)."""
    prog = programs.get(program)
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    tg = target if isinstance(target, Target) else resolve_target(target, dev)
    s = prog.settings(device=dev, config=config, dtype=dtype, target=tg, tp=tp, **(options or {}))
    if be == "triton" and dev == "cpu" and s.dtype.short != "f32":
        raise UsageError("the Triton interpreter on the CPU runs f32 only; use --dtype f32")
    ex = resolve_executor(executor, dev, be)
    if ex == "persistent" and be != "triton":  # refused here, before the graph is built
        if backend == "auto":
            raise UsageError("the persistent executor needs a GPU (or the Triton interpreter: --backend triton "
                             "with TRITON_INTERPRET=1); on the CPU use --executor waves")
        raise UsageError(f"the persistent executor runs Triton kernels; --backend {be} needs --executor waves")
    return Job(prog, s, dev, be, ex)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖₂ / ‖ref‖₂ in float64 (inf if out has NaN or inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = r.norm().item()
    num = (o - r).norm().item()
    return num / den if den > 0 else num


# -- memory, before any work ---------------------------------------------------------------------

#: bytes the runtime holds per task and per edge (docs/PERF.md: 119 B/task with ~3 edges)
RUNTIME_BYTES_PER_TASK, RUNTIME_BYTES_PER_EDGE = 100, 8


def available_memory(device: str) -> int | None:
    """Bytes the device can still allocate (None if unknown)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _human(n: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} B"


def check_memory(job: Job, seq: int, module, check: bool, execute: bool = True) -> None:
    """Refuse, before allocating anything, a run whose tensors or task graph do not fit: the
    tensors (inputs twice: generated, then copied into the run's buffers; outputs once more for
    the reference) on the device, the graph (and the tensors of a CPU run) in host memory.
    Without ``execute`` (a graph built only), the graph alone."""
    from pto.buffers import tensor_bytes

    fn = module.entry_function
    sizes = tensor_bytes(fn, job.program.scalars(job.settings, seq)) if execute else {}
    role = {t.name: t.role for t in fn.tensors}
    tensors = sum(sizes.values()) + sum(b for n, b in sizes.items() if role[n] in ("input", "inout"))
    if check:
        tensors += sum(sizes[n] for n in job.program.outputs if n in sizes)
    counts = job.program.counts(job.settings, seq)
    graph = counts["tasks"] * RUNTIME_BYTES_PER_TASK + counts["edges"] * RUNTIME_BYTES_PER_EDGE if counts else 0
    needs = [("cpu", graph + (tensors if job.device == "cpu" else 0))]
    if job.device != "cpu" and execute:
        needs.append((job.device, tensors))
    for dev, need in needs:
        avail = available_memory(dev)
        if avail is not None and need > avail:
            parts = [f"tensors {_human(tensors)}"] if dev == job.device and execute else []
            parts += [f"task graph {_human(graph)}"] if dev == "cpu" and graph else []
            where = "host" if dev == "cpu" else dev
            raise UsageError(f"{job.program.name} at seq {seq} needs about {_human(need)} of {where} memory "
                             f"({', '.join(parts)}) but {_human(avail)} is available; use a shorter --seq")


# -- running ------------------------------------------------------------------------------------


@dataclass
class BuiltGraph:
    """What :func:`build_graph` made: the program's module, its scalars at the run's length, the
    task graph (close it when done) and the milliseconds of building and compiling the module."""

    module: Module
    scalars: dict[str, int]
    graph: Graph
    compile_ms: float


def build_graph(job: Job, seq: int, adaptive: bool = True) -> BuiltGraph:
    """The task graph of ``job`` at ``seq``, built the way every run builds it: the program's
    module, lowered (binary expansion unless not ``adaptive``) and checked against the target's
    SRAM, its generated C compiled with the runtime (cached on disk), run for the program's
    scalars. Nothing is allocated for the tensors and nothing executes (``pto graph``)."""
    from pto.graph import CompiledProgram

    prog, s = job.program, job.settings
    t0 = time.perf_counter()
    module = prog.build(s)
    compiled = CompiledProgram.get(module, adaptive=adaptive, target=s.target)
    compile_ms = (time.perf_counter() - t0) * 1e3
    scalars = prog.scalars(s, seq)
    return BuiltGraph(module, scalars, compiled.build_graph(scalars), compile_ms)


class Runner:
    """One program prepared for repeated execution at one shape.

    The graph is built once and its tensors are static buffers; the first call executes the
    graph, later calls copy the new inputs in and replay, captured in a CUDA graph when the
    backend allows it. :func:`get_runner` caches runners by shape, so a CUDA graph is rebuilt
    only when the shapes change.
    """

    def __init__(self, job: Job, seq: int, adaptive: bool = True, record: bool = False, progress=None,
                 sentinel: bool = False, deterministic: bool = False):
        from pto.backends import get_backend
        from pto.buffers import allocate, tensor_shapes
        from pto.exec import get_executor

        self.job, self.seq, self.device = job, seq, job.device
        built = build_graph(job, seq, adaptive)
        self.module, self.scalars, self.graph = built.module, built.scalars, built.graph
        self.compile_ms = built.compile_ms
        # collectives run through the torch evaluator (host synchronization): never captured
        self.collective = any(has_collective(f) for f in self.graph.variants)
        fn = self.module.entry_function
        shapes = tensor_shapes(fn, self.scalars)
        # static buffers: inputs are copied in on every call (a captured graph reads them there)
        placeholders = {t.name: torch.empty(shapes[t.name], dtype=t.dtype.torch, device=job.device)
                        for t in fn.tensors if t.role in ("input", "inout")}
        self.tensors = allocate(fn, shapes, placeholders, job.device)
        backend = get_backend(job.backend, job.device)
        if deterministic and job.backend == "triton":  # the persistent kernel's launch settings everywhere
            from pto.safety.determinism import uniform_launch

            backend.launch_overrides.update(uniform_launch(backend, self.graph))
        name = job.executor
        if name == "auto":
            from pto.exec import choose

            name = choose(self.graph)
        self.executor = get_executor(name, backend, self.tensors, record=record, progress=progress,
                                     **({"sentinel": True} if sentinel else {}))
        self.stats = None
        self.cuda_graph = None

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on ``inputs``; returns the program's output tensors (the runner's buffers)."""
        for name, value in inputs.items():
            self.tensors[name].copy_(value)
        if self.stats is None:
            from pto.exec import run_first

            self.executor, self.stats = run_first(self.executor, self.graph)
        else:
            self.replay()
        return {name: self.tensors[name] for name in self.job.program.outputs}

    def replay(self) -> str:
        """Replay the execution; returns how ("cuda_graph" or "launches")."""
        if self.device == "cuda" and self.executor.backend.graph_capturable and not self.collective:
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
        """Milliseconds per InCore function (see the executor's ``profile``)."""
        return self.executor.profile(repeat)

    def close(self) -> None:
        self.graph.close()


_RUNNERS: dict[tuple, Runner] = {}


def get_runner(job: Job, seq: int, adaptive: bool = True, deterministic: bool = False) -> Runner:
    """The cached runner of this job at this shape (built on first use)."""
    key = (job.program.name, job.settings.key, job.device, job.backend, job.executor, seq, adaptive, deterministic)
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = Runner(job, seq, adaptive, deterministic=deterministic)
    return runner


def clear_runners() -> None:
    """Drop every cached runner (and the device memory it holds)."""
    for r in _RUNNERS.values():
        r.close()
    _RUNNERS.clear()


def run(job: Job | str, seq: int | None = None, *, check: bool = False, dump: str | None = None,
        trace: str | None = None, seed: int = 0, repeat: int = 1, profile: bool = False, adaptive: bool = True,
        progress=None, sentinel: bool = False, inputs: str | None = None, save: str | None = None,
        save_inputs: str | None = None, check_schedule: bool = False, deterministic: bool = False, warn=None,
        device: str = "auto", backend: str = "auto", executor: str = "auto", config: str | None = None,
        dtype: str | None = None, target: str | Target | None = None, tp: int = 1, **options) -> dict:
    """Build and run a job (or the program named ``job`` with the given settings and program
    options, e.g. ``run("llama7b", 100, attention="split")``); returns the JSON-able result of
    ``pto run --json``.

    With ``repeat > 1`` the runner is cached by shape: calling again with the same shapes replays
    the same CUDA graph. ``progress(done, total)`` is called as tasks complete; ``warn(line)``
    once the graph is built, before anything executes, when the execution will be long
    (:func:`pto.progress.long_run_warning`). docs/SAFETY.md:
    ``sentinel`` (``nonfinite``: who made the first NaN or infinity of an output), ``inputs`` /
    ``save_inputs`` / ``save`` (safetensors files), ``check_schedule`` (``schedule``: the trace against the graph),
    ``deterministic`` (the same bits from both executors on a GPU).

    Tensor parallelism (``tp`` > 1 in the job's settings): one process per rank, started by
    torchrun; the default process group is started here (:func:`pto.dist.init`), every rank
    makes the whole seeded inputs and runs on its shard (:meth:`Program.shard`), rank 0 checks
    the outputs against the reference on the whole inputs and writes the files; ``ranks`` has
    every rank's time and collectives."""
    from pto import dist
    from pto.progress import long_run_warning

    if not isinstance(job, Job):
        job = resolve(job, device=device, backend=backend, executor=executor, config=config, dtype=dtype,
                      target=target, options=options, tp=tp)
    prog, s = job.program, job.settings
    seq = seq or prog.default_seq
    rank = dist.init(job.device, s.tp, command=f"run {prog.name}")
    if rank != 0:  # every rank holds the same outputs: rank 0 writes the files
        dump = trace = save = save_inputs = None
    prog.check_size(s, seq)
    module = prog.build(s)
    check_memory(job, seq, module, check)
    given = None
    whole = module if s.tp == 1 else prog.build(replace(s, tp=1))  # the whole inputs, every rank its shard
    if inputs:
        from pto.safety.tensor_io import load_inputs

        given = load_inputs(inputs, whole, prog.scalars(s, seq), job.device,
                            program=f"{prog.name} at seq {seq} (config {s.config})")
    record = bool(trace) or check_schedule
    cached = repeat > 1 and not record and not sentinel
    runner = get_runner(job, seq, adaptive, deterministic) if cached else \
        Runner(job, seq, adaptive, record=record, progress=progress, sentinel=sentinel, deterministic=deterministic)
    try:
        graph = runner.graph
        if dump:
            graph.dump(dump)
        note = long_run_warning(job, seq, graph.tasks) if warn is not None and rank == 0 else None
        if note and runner.stats is None:  # a cached runner's graph has run before: no news
            warn(note)
        data = given if given is not None else prog.inputs(s, seq, job.device, seed)
        from pto.safety.tensor_io import run_metadata, save_inputs_file

        meta = run_metadata(job, seq, seed, inputs)
        if save_inputs:  # before the run: a run that fails can be repeated from the file
            save_inputs_file(save_inputs, whole, prog.scalars(s, seq), data, meta)
        local = prog.shard(s, data, rank)
        if sentinel:
            from pto.safety.blame import blame, nonfinite_summary

            before = nonfinite_summary(local, local)
        dist.counters(reset=True)
        first = runner.stats is None
        t0 = time.perf_counter()
        outputs = runner(local)
        if not first and job.device == "cuda":
            torch.cuda.synchronize()
        stats = runner.stats
        out = {
            **job.to_json(), "executor": runner.executor.name, "seq": seq,
            "tasks": graph.tasks, "edges": graph.edges, "launches": stats.launches, "waves": stats.waves,
            "build_ms": round(graph.build_ms, 3),
            "exec_ms": round(stats.exec_ms if first else (time.perf_counter() - t0) * 1e3, 3),
            "compile_ms": round(runner.compile_ms, 1),
            "bytes_per_task": round(float(graph.stats["bytes_per_task"]), 1),
        }
        if inputs:
            out["inputs"] = str(inputs)
        if sentinel:
            out["nonfinite"] = blame(graph, runner.executor.flags, runner.tensors, prog.outputs, before)
        if check and rank == 0:
            ref = prog.reference(s, seq, data)
            out["rel_err"] = max(rel_err(outputs[k], v) for k, v in ref.items())
        if check_schedule:
            from pto.safety.schedule import verify_schedule

            out["schedule"] = verify_schedule(graph.runtime.export(), stats.records).to_json()
        from pto.safety.determinism import guarantee

        out["determinism"] = guarantee(job.device, job.backend, deterministic)
        if save:
            from pto.safety.tensor_io import save_outputs

            save_outputs(save, outputs, meta)
            out["saved"] = str(save)
        if save_inputs:
            out["saved_inputs"] = str(save_inputs)
        if trace:
            from pto.trace import write_trace

            info = write_trace(trace, stats.records, graph)
            out["trace"] = {"path": str(trace), "dependencies": info.dependencies, "flows": info.flows}
        if profile:
            out["profile"] = runner.profile()
        if repeat > 1:
            out.update(runner.time(repeat))
        if dist.world_size() > 1:
            mine = {"rank": rank, "exec_ms": out["exec_ms"], "collectives": dist.counters()}
            if "replay_ms" in out:
                mine["replay_ms"] = out["replay_ms"]
            out["ranks"] = dist.gather(mine)
        return out
    finally:
        if not cached:
            runner.close()


def execute(module, scalars: dict[str, int], inputs: dict[str, torch.Tensor], *, device: str = "auto",
            backend: str = "auto", executor: str = "auto", adaptive: bool = True,
            sentinel: bool = False) -> dict[str, torch.Tensor]:
    """Run any module (a program written with the builders, registered or not) on ``inputs``:
    binary expansion, the generated C builds the graph, the executor runs it with the backend.
    Returns every tensor of the entry function by name (outputs included). With ``sentinel``,
    an output or inout tensor holding a NaN or an infinity raises
    :class:`pto.safety.NonFiniteError` naming the task that made the first one (``.report``,
    ``.tensors``)."""
    from pto.backends import get_backend
    from pto.buffers import allocate, tensor_shapes
    from pto.exec import choose, get_executor, run_first
    from pto.exec import resolve as resolve_exec
    from pto.graph import CompiledProgram

    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    graph = CompiledProgram.get(module, adaptive=adaptive).build_graph(scalars)
    try:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), {k: v.to(dev) for k, v in inputs.items()}, dev)
        name = resolve_exec(executor, dev, be)
        ex = get_executor(choose(graph) if name == "auto" else name, get_backend(be, dev), tensors,
                          **({"sentinel": True} if sentinel else {}))
        if not sentinel:
            run_first(ex, graph)
            return tensors
        from pto.safety.blame import NonFiniteError, blame, nonfinite_summary

        before = nonfinite_summary(tensors, [t.name for t in fn.tensors if t.role in ("input", "inout")])
        ex, _ = run_first(ex, graph)
        report = blame(graph, ex.flags, tensors, [t.name for t in fn.tensors if t.role in ("output", "inout")], before)
        if report is not None:
            raise NonFiniteError(report, tensors)
        return tensors
    finally:
        graph.close()


def format_summary(res: dict, options: tuple[str, ...] = ()) -> str:
    opts = "".join(f" {k}={res[k]}" for k in options if k in res)
    lines = [
        f"{res['program']} seq={res['seq']} config={res['config']} dtype={res['dtype']} target={res['target']}"
        f"{opts}",
        f"device={res['device']} backend={res['backend']} executor={res['executor']}",
        f"tasks {res['tasks']}  edges {res['edges']}  launches {res['launches']}",
        f"build {res['build_ms']:.2f} ms  exec {res['exec_ms']:.2f} ms",
    ]
    if "replay_ms" in res:
        lines.append(f"replay {res['replay_ms']:.3f} ms (median of {res['replays']}, {res['replay_mode']})")
    if "rel_err" in res:
        lines.append(f"rel_err {res['rel_err']:.3e} vs the torch reference")
    if "nonfinite" in res:
        from pto.safety.blame import format_nonfinite

        lines += format_nonfinite(res["nonfinite"]) if res.get("nonfinite") else ["sentinel: every output is finite"]
    if "schedule" in res:
        sc = res["schedule"]
        lines.append(f"schedule checked: {sc['tasks']} tasks, {sc['dependencies']} dependencies kept, "
                     f"{sc['concurrent_pairs']} concurrent accesses without a conflict")
    if "profile" in res:
        lines.append("time per InCore function (ms):")
        lines += [f"  {k:<28} {v:9.3f}" for k, v in res["profile"].items()]
    return "\n".join(lines)


__all__ = ["Job", "resolve", "run", "execute", "Runner", "get_runner", "clear_runners", "rel_err",
           "check_memory", "format_summary"]
