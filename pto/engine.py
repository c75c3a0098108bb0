"""How every command runs a program: resolve a job, prepare it at a shape (the module, its graph,
buffers, a backend, an executor), execute, check against the reference.

One recipe, :class:`Prepared`, turns a module and its scalars into something that executes;
:class:`Runner` is a program's job prepared at one shape and replayed; :func:`run` is ``pto run``
(the JSON-able result), :func:`execute` runs any module. Benchmarks, ``pto tune`` and the tests
call the same code. Nothing here names a program or its options: a :class:`Job` carries the
program and its :class:`pto.program.Settings`, a :class:`pto.program.Shape` its shape.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pto import programs
from pto.backends import capable
from pto.backends import resolve as resolve_backend
from pto.errors import UsageError
from pto.exec import resolve as resolve_executor
from pto.ir.dtypes import DType
from pto.machine import dist
from pto.machine.device import resolve_device
from pto.machine.target import Target
from pto.machine.target import resolve as resolve_target
from pto.program import CountsTasks, Program, Settings, Shape

if TYPE_CHECKING:
    from pto.ir.nodes import Module
    from pto.runtime.graph import Graph


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


#: the settings :func:`resolve` takes by keyword (the rest of a call's keywords are the program's)
SETTING_NAMES = ("device", "backend", "executor", "config", "dtype", "target", "tp")


def resolve(program: str | Program, *, device: str = "auto", backend: str = "auto", executor: str = "auto",
            target: str | Target | None = None, options: dict | None = None, shape: Mapping | None = None,
            **settings) -> Job:
    """Every default resolved once, by the rule of :mod:`pto.program` (the same for every
    command), every value checked. ``program``: a registered name or the program itself;
    ``settings``: the program's common settings (``config``, ``dtype``, ``tp``: the
    tensor-parallel ranks, one rank's module; :meth:`Program.settings`), ``options`` its own;
    ``shape``: the shape the job runs at where the executor ``auto`` depends on it
    (:meth:`Program.auto_executor`; None: the program's default shape)."""
    prog = program if isinstance(program, Program) else programs.get(program)
    program = prog.name
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    tg = target if isinstance(target, Target) else resolve_target(target, dev)
    unknown = set(settings) - {"config", "dtype", "tp"}
    if unknown:
        raise UsageError(f"{program}: unknown setting {sorted(unknown)[0]!r} (config, dtype, tp; the program's own "
                         "go in options)")
    s = prog.settings(device=dev, target=tg, **settings, **(options or {}))
    ex = _executor(prog, executor, dev, be, s.dtype, backend, _auto_of(prog, s, shape))
    return Job(prog, prog.for_executor(s, ex), dev, be, ex)


def _auto_of(prog: Program, s, shape) -> str | None:
    """``prog``'s :meth:`Program.auto_executor` at ``shape`` (a plugin's that takes the settings
    alone, as before it had the shape, without it)."""
    try:
        takes = len(inspect.signature(prog.auto_executor).parameters) > 1
    except (TypeError, ValueError):  # (a builtin or C callable: as the base class's)
        takes = True
    return prog.auto_executor(s, shape) if takes else prog.auto_executor(s)


def _executor(prog: Program, executor: str, device: str, backend: str, dtype: DType, asked_backend: str,
              auto: str | None) -> str:
    """The executor ``executor`` means for ``prog`` on ``device`` with ``backend`` (``auto``: the
    program's own choice ``auto`` where it has one, on a GPU), and the checks of that combination
    before any work."""
    if capable(backend, "cpu_f32_only") and device == "cpu" and dtype.short != "f32":
        raise UsageError("the Triton interpreter on the CPU runs f32 only; use --dtype f32")
    ex = resolve_executor(executor, device, backend)
    if ex == "auto" and auto:
        ex = auto
    if ex == "native" and not capable(backend, "native"):
        raise UsageError(f"the native executor runs the c backend's compiled programs; --backend {backend} needs "
                         "--executor waves")
    if ex == "persistent" and not capable(backend, "megakernel"):  # refused here, before the graph is built
        if asked_backend == "auto":
            raise UsageError("the persistent executor needs a GPU; on the CPU use --executor waves (pto run and "
                             "pto bench also run it under the Triton interpreter: --backend triton with "
                             "TRITON_INTERPRET=1)")
        raise UsageError(f"the persistent executor runs Triton kernels; --backend {backend} needs --executor waves")
    return ex


def placement(program: Program, device: str, dtype: DType, backend: str = "auto", executor: str = "auto",
              auto: str | None = None) -> Placement:
    """Where and how graphs of ``program`` run, by the rules :func:`resolve` applies (the device
    and backend ``auto`` resolved, the executor ``auto`` the program's own choice, the
    combination checked), for a driver that builds the program's modules itself (the generation
    application: the decode step and the layer it prefills with). ``auto``: what the executor
    ``auto`` means on a GPU where the driver knows (the program's rule on its own settings,
    :meth:`Program.auto_executor`); None: decided per built graph."""
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    return Placement(dev, be, _executor(program, executor, dev, be, dtype, backend, auto), schedules=program.schedules)


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


def check_memory(job: Job, shape: Shape, module, check: bool, execute: bool = True) -> None:
    """Refuse, before allocating anything, a run whose tensors or task graph do not fit: the
    tensors (inputs twice: generated, then copied into the run's buffers; outputs once more for
    the reference) and the program's scratch (:meth:`Program.scratch_bytes`) on the device, the
    graph (and the tensors of a CPU run) in host memory.
    Without ``execute`` (a graph built only), the graph alone."""
    from pto.data.buffers import tensor_bytes

    fn = module.entry_function
    sizes = tensor_bytes(fn, job.program.scalars(job.settings, shape)) if execute else {}
    role = {t.name: t.role for t in fn.tensors}
    tensors = sum(sizes.values()) + sum(b for n, b in sizes.items() if role[n] in ("input", "inout"))
    if check:
        tensors += sum(sizes[n] for n in job.program.outputs if n in sizes)
    scratch = job.program.scratch_bytes(job.settings, shape) if execute else 0
    tensors += scratch
    counts = job.program.counts(job.settings, shape) if isinstance(job.program, CountsTasks) else None
    graph = counts["tasks"] * RUNTIME_BYTES_PER_TASK + counts["edges"] * RUNTIME_BYTES_PER_EDGE if counts else 0
    needs = [("cpu", graph + (tensors if job.device == "cpu" else 0))]
    if job.device != "cpu" and execute:
        needs.append((job.device, tensors))
    for dev, need in needs:
        avail = available_memory(dev)
        if avail is not None and need > avail:
            parts = [f"tensors {_human(tensors - scratch)}"] if dev == job.device and execute else []
            parts += [f"collective sum buffer {_human(scratch)}"] if dev == job.device and scratch else []
            parts += [f"task graph {_human(graph)}"] if dev == "cpu" and graph else []
            where = "host" if dev == "cpu" else dev
            raise UsageError(f"{job.program.name} at {shape} needs about {_human(need)} of {where} memory "
                             f"({', '.join(parts)}) but {_human(avail)} is available; use a smaller "
                             f"{' or '.join('--' + k.replace('_', '-') for k in shape)} or --config")


# -- preparing -----------------------------------------------------------------------------------


@dataclass
class BuiltGraph:
    """What :func:`build_graph` made: the module, its scalars, the task graph (close it when
    done) and the milliseconds of building and compiling the module."""

    module: Module
    scalars: dict[str, int]
    graph: Graph
    compile_ms: float


#: ``phase(name, unit)``: the part of the work now starting, for a progress report
#: (:meth:`pto.cli.progress.ProgressLines.phase`); ``unit`` names what it counts (None: nothing)
Phase = Callable[[str, "str | None"], None]


def build_module_graph(module: Module, scalars: dict[str, int], adaptive: bool = True,
                       target: Target | None = None, phase: Phase | None = None,
                       count_only: bool = False) -> BuiltGraph:
    """The task graph of ``module`` for ``scalars``: lowered (binary expansion unless not
    ``adaptive``), checked against ``target``'s SRAM, its generated C compiled with the runtime
    (cached on disk) and run. Nothing is allocated for the tensors and nothing executes; with
    ``count_only`` the runtime counts the tasks and keeps none (``pto estimate``'s large graphs)."""
    from pto.runtime.graph import CompiledProgram

    if phase is not None:
        phase("compiling the runtime and the generated C", None)
    t0 = time.perf_counter()
    compiled = CompiledProgram.get(module, adaptive=adaptive, target=target)
    compile_ms = (time.perf_counter() - t0) * 1e3
    if phase is not None:
        phase("building the graph", None)
    return BuiltGraph(module, dict(scalars), compiled.build_graph(scalars, count_only=count_only), compile_ms)


def module_of(job: Job, shape: Shape) -> Module:
    """The module ``job`` runs at ``shape``: the size checked first (:meth:`Program.check_size`:
    a size the program cannot run is refused before any work, so no caller builds a graph that
    computes something else), then built. A run calls it once and hands the module on
    (:func:`build_graph`, :class:`Runner`, :func:`check_memory`)."""
    job.program.check_size(job.settings, shape)
    return job.program.build(job.settings, shape)


def build_graph(job: Job, shape: Shape, adaptive: bool = True, module: Module | None = None,
                phase: Phase | None = None) -> BuiltGraph:
    """The task graph of ``job`` at ``shape``, built the way every run builds it (``pto graph``
    stops here): of ``module``, the caller's :func:`module_of` (None: made here)."""
    prog, s = job.program, job.settings
    t0 = time.perf_counter()
    built = build_module_graph(module or module_of(job, shape), prog.scalars(s, shape), adaptive, s.target, phase)
    built.compile_ms = (time.perf_counter() - t0) * 1e3 - built.graph.build_ms
    return built


@dataclass(frozen=True)
class Placement:
    """Where and how a graph executes: the device, the backend and the executor by name
    (``auto`` picks per graph, :func:`pto.exec.choose`), and what the executor records."""

    device: str
    backend: str
    executor: str = "auto"
    record: bool = False
    sentinel: bool = False
    deterministic: bool = False
    progress: Callable | None = None
    schedules: tuple = ()  # the program's shipped schedule folders (Program.schedules)
    #: the executor's own keyword options as (name, value) pairs (the persistent queue's ``order``)
    options: tuple[tuple[str, object], ...] = ()


class Prepared:
    """A built graph made ready to execute: its tensors as static buffers (``inputs`` copied
    in, or placeholders that each call fills), a backend and an executor. The first call
    executes, later calls replay (a CUDA graph when the backend allows it). The one recipe of
    every command: :class:`Runner`, :func:`execute`, ``pto tune``, the benchmarks."""

    def __init__(self, built: BuiltGraph, place: Placement, inputs: Mapping[str, torch.Tensor] | None = None,
                 packed: tuple[tuple[str, ...], ...] = ()):
        from pto.backends import get_backend
        from pto.data.buffers import allocate, placeholders, tensor_shapes
        from pto.exec import choose, get_executor

        self.built, self.place, self.device = built, place, place.device
        self.module, self.scalars, self.graph = built.module, built.scalars, built.graph
        fn = self.module.entry_function
        shapes = tensor_shapes(fn, self.scalars)
        given = {k: v.to(place.device) for k, v in (inputs or {}).items()}
        # the inputs' buffers (``packed``: groups in one buffer, :meth:`Program.packed_inputs`)
        given.update(placeholders(fn, shapes, place.device, packed, given))
        self.tensors = allocate(fn, shapes, given, place.device)
        backend = get_backend(place.backend, place.device, shipped=place.schedules)
        if place.deterministic:  # the persistent kernel's launch settings everywhere
            backend.launch_overrides.update(backend.uniform_launch(self.graph))
        name = choose(self.graph, self.tensors) if place.executor == "auto" else place.executor
        self.executor = get_executor(name, backend, self.tensors, record=place.record, progress=place.progress,
                                     **({"sentinel": True} if place.sentinel else {}), **dict(place.options))
        self.stats = None
        self.cuda_graph = None

    def __call__(self, inputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Copy ``inputs`` in and execute (the first call) or replay; returns every tensor."""
        for name, value in (inputs or {}).items():
            self.tensors[name].copy_(value)
        if self.stats is None:
            from pto.exec import run_first

            self.executor, self.stats = run_first(self.executor, self.graph)
        else:
            self.replay()
        return self.tensors

    def replay(self) -> str:
        """Replay the execution; returns how ("cuda_graph" or "launches")."""
        backend = self.executor.backend
        if self.device == "cuda" and backend.graph_capturable and backend.captures(self.graph.variants):
            if self.cuda_graph is None:
                self.cuda_graph = self.executor.capture()
            self.cuda_graph.replay()
            return "cuda_graph"
        self.executor.replay()
        return "launches"

    def time(self, repeat: int) -> dict:
        """Median milliseconds of ``repeat`` replays (CUDA events on the GPU)."""
        from pto.exec.timing import median_ms

        mode = self.replay()  # also captures the CUDA graph once
        ms = median_ms(self.replay, repeat, warmup=0, cuda=self.device == "cuda")
        return {"replay_ms": round(ms, 4), "replays": repeat, "replay_mode": mode}

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Milliseconds per InCore function (see the executor's ``profile``)."""
        return self.executor.profile(repeat)

    def close(self) -> None:
        """Free the task graph and the CUDA graph of the replays (a captured NCCL call keeps the
        process group from being destroyed until the graph is gone: :func:`pto.machine.dist.at_shutdown`)."""
        if self.cuda_graph is not None:
            self.cuda_graph.reset()
            self.cuda_graph = None
        getattr(self.executor, "close", lambda: None)()  # the native executor's parked threads
        self.graph.close()


class Runner(Prepared):
    """A job prepared at one shape (a :class:`Shape`, or an int: the program's first shape
    parameter) for repeated execution; a call takes the program's inputs and returns its
    outputs. :func:`get_runner` caches runners by shape, so a CUDA graph is rebuilt only when the
    shape changes. ``record``, ``sentinel``, ``deterministic``, ``progress``: :class:`Placement`;
    ``module``: the job's module at the shape where the caller has built it (:func:`module_of`);
    ``phase``: told as compiling and building start (:data:`Phase`)."""

    def __init__(self, job: Job, shape: Shape | int, adaptive: bool = True, *, record: bool = False,
                 sentinel: bool = False, deterministic: bool = False, progress: Callable | None = None,
                 module: Module | None = None, phase: Phase | None = None):
        self.job, self.shape = job, job.program.shape(shape)
        place = Placement(job.device, job.backend, job.executor, record, sentinel, deterministic, progress,
                          job.program.schedules)
        super().__init__(build_graph(job, self.shape, adaptive, module, phase), place,
                         packed=job.program.packed_inputs(job.settings))
        self.compile_ms = self.built.compile_ms

    def __call__(self, inputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        tensors = super().__call__(inputs)
        return {name: tensors[name] for name in self.job.program.outputs}


_RUNNERS: dict[tuple, Runner] = {}


def get_runner(job: Job, shape: Shape, adaptive: bool = True, deterministic: bool = False,
               module: Module | None = None) -> Runner:
    """The cached runner of this job at this shape (built on first use, of ``module`` where the
    caller has built it)."""
    key = (job.program.name, job.settings.key, job.device, job.backend, job.executor, shape, adaptive, deterministic)
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = Runner(job, shape, adaptive, deterministic=deterministic, module=module)
    return runner


def clear_runners() -> None:
    """Drop every cached runner (and the device memory it holds)."""
    for r in _RUNNERS.values():
        r.close()
    _RUNNERS.clear()


dist.at_shutdown(clear_runners)  # the cached runners' CUDA graphs go before the process group


def execute(module, scalars: dict[str, int], inputs: dict[str, torch.Tensor], *, device: str = "auto",
            backend: str = "auto", executor: str = "auto", adaptive: bool = True,
            sentinel: bool = False) -> dict[str, torch.Tensor]:
    """Run any module (a program written with the builders, registered or not) on ``inputs``:
    binary expansion, the generated C builds the graph, the executor runs it with the backend.
    Returns every tensor of the entry function by name (outputs included). With ``sentinel``,
    an output or inout tensor holding a NaN or an infinity raises
    :class:`pto.safety.NonFiniteError` naming the task that made the first one (``.report``,
    ``.tensors``)."""
    dev = resolve_device(device)
    be = resolve_backend(backend, dev)
    place = Placement(dev, be, resolve_executor(executor, dev, be), sentinel=sentinel)
    run = Prepared(build_module_graph(module, scalars, adaptive), place, inputs)
    try:
        if not sentinel:
            return run()
        from pto.safety.blame import NonFiniteError, blame, nonfinite_summary

        fn = module.entry_function
        before = nonfinite_summary(run.tensors, [t.name for t in fn.tensors if t.role in ("input", "inout")])
        tensors = run()
        outs = [t.name for t in fn.tensors if t.role in ("output", "inout")]
        report = blame(run.graph, run.executor.flags, tensors, outs, before)
        if report is not None:
            raise NonFiniteError(report, tensors)
        return tensors
    finally:
        run.close()


__all__ = ["Job", "resolve", "placement", "execute", "Prepared", "Placement", "Runner", "get_runner", "clear_runners",
           "rel_err", "check_memory", "module_of", "build_graph", "build_module_graph", "BuiltGraph", "SETTING_NAMES"]
