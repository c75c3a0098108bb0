"""``pto run``: a program at a shape, built, executed, checked against its reference and reported
(the JSON-able result of ``pto run --json``), with the safety options of docs/SAFETY.md and
tensor parallelism over torchrun.

:func:`run` takes a :class:`pto.engine.Job` (or a program's name with its settings, shape and
options as keywords) and a :class:`RunOptions`; the preparation is :class:`pto.engine.Runner`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from pto import programs
from pto.engine import SETTING_NAMES, Job, Runner, check_memory, get_runner, module_of, rel_err, resolve
from pto.errors import UsageError
from pto.program import Estimation, Shape


@dataclass(frozen=True)
class RunOptions:
    """What ``pto run`` does beyond executing once (its flags): ``check`` against the reference,
    ``dump`` the graph, ``trace`` the execution, ``repeat`` replays (median), ``profile`` per
    InCore function; docs/SAFETY.md: ``sentinel``, ``inputs`` / ``save_inputs`` / ``save``
    (safetensors files), ``check_schedule``, ``deterministic``. ``progress(done, total)`` is
    called as tasks complete; ``phase(name, unit)`` as each part of the run starts (compiling,
    building, the inputs, executing, checking: :data:`pto.engine.Phase`); ``warn(line)`` once
    before a long execution."""

    check: bool = False
    dump: str | None = None
    trace: str | None = None
    seed: int = 0
    repeat: int = 1
    profile: bool = False
    adaptive: bool = True
    sentinel: bool = False
    inputs: str | None = None
    save: str | None = None
    save_inputs: str | None = None
    check_schedule: bool = False
    deterministic: bool = False
    progress: Callable | None = None
    phase: Callable | None = None
    warn: Callable | None = None

    @property
    def record(self) -> bool:
        return bool(self.trace) or self.check_schedule


_OPTION_NAMES = frozenset(f.name for f in fields(RunOptions))


def job_of(program: str, shape, kw: dict) -> tuple[Job, Shape]:
    """A job and a shape from a program's name and keywords: the settings
    (:data:`pto.engine.SETTING_NAMES`), the program's shape parameters and its own options."""
    prog = programs.get(program)
    names = {p.name for p in prog.shape_params}
    sizes = {k: kw.pop(k) for k in list(kw) if k in names}
    settings = {k: kw.pop(k) for k in list(kw) if k in SETTING_NAMES}
    shape = prog.shape(shape, **sizes)
    return resolve(program, options=kw, shape=shape, **settings), shape


def run(job: Job | str, shape: Shape | dict | int | None = None, options: RunOptions | None = None,
        **kw) -> dict:
    """Build and run a job at ``shape`` (the program's defaults where not given); returns the
    JSON-able result of ``pto run --json``. ``job`` may be a program's name: then ``kw`` holds
    the settings (device, backend, executor, config, dtype, target, tp), the shape parameters
    and the program's options, e.g. ``run("llama7b", seq=100, attention="split", check=True)``;
    :class:`RunOptions` fields may be given as keywords too.

    With ``repeat > 1`` the runner is cached by shape: calling again with the same shape replays
    the same CUDA graph. Tensor parallelism (``tp`` > 1 in the job's settings): one process per
    rank, started by torchrun; every rank makes the whole seeded inputs and runs on its shard
    (:meth:`Program.shard`), rank 0 checks the outputs against the reference on the whole inputs
    and writes the files; ``ranks`` has every rank's time and collectives."""
    from pto.machine import collectives, dist

    opts = replace(options or RunOptions(), **{k: kw.pop(k) for k in list(kw) if k in _OPTION_NAMES})
    if isinstance(job, Job):
        shape = job.program.shape(shape, **kw)
    else:
        job, shape = job_of(job, shape, kw)
    rank = dist.init(job.device, job.settings.tp, command=f"run {job.program.name}")
    collectives.check()  # PTO_COLLECTIVES and its limits, before any work
    if rank != 0:  # every rank holds the same outputs: rank 0 writes the files
        opts = replace(opts, dump=None, trace=None, save=None, save_inputs=None)
    module, whole = _prepare_checks(job, shape, opts)
    cached = opts.repeat > 1 and not opts.record and not opts.sentinel
    runner = get_runner(job, shape, opts.adaptive, opts.deterministic, module) if cached else Runner(
        job, shape, opts.adaptive, record=opts.record, sentinel=opts.sentinel, deterministic=opts.deterministic,
        progress=opts.progress, module=module, phase=opts.phase)
    try:
        return _execute(job, shape, opts, runner, whole, rank)
    finally:
        if not cached:
            runner.close()


def _prepare_checks(job: Job, shape: Shape, opts: RunOptions):
    """What is checked before any work: the size, the memory; the module (built once, here) and
    the whole (single-process) module whose inputs every rank makes."""
    prog, s = job.program, job.settings
    module = module_of(job, shape)
    check_memory(job, shape, module, opts.check)
    return module, module if s.tp == 1 else prog.build(replace(s, tp=1), shape)


def _inputs(job: Job, shape: Shape, opts: RunOptions, whole) -> dict[str, torch.Tensor]:
    """The run's inputs: from ``opts.inputs`` (checked against the whole module) or seeded."""
    prog, s = job.program, job.settings
    if opts.inputs:
        from pto.safety.tensor_io import load_inputs

        where = f"{prog.name} at {shape} (config {s.config})"
        try:
            return load_inputs(opts.inputs, whole, prog.scalars(s, shape), job.device, program=where)
        except UsageError as mine:  # another form of the inputs the program converts (Program.input_conversions)
            for alt, convert in prog.input_conversions(s):
                module = prog.build(replace(alt, tp=1), shape)
                try:
                    return convert(load_inputs(opts.inputs, module, prog.scalars(alt, shape), job.device,
                                               program=where))
                except UsageError:
                    continue
            raise mine
    return prog.inputs(s, shape, job.device, opts.seed)


def _execute(job: Job, shape: Shape, opts: RunOptions, runner: Runner, whole, rank: int) -> dict:
    from pto.cli.progress import long_run_warning
    from pto.machine import dist
    from pto.safety.tensor_io import run_metadata, save_inputs_file

    prog, s, graph = job.program, job.settings, runner.graph
    if opts.dump:
        graph.dump(opts.dump)
    note = long_run_warning(job, shape, graph.tasks) if opts.warn is not None and rank == 0 else None
    if note and runner.stats is None:  # a cached runner's graph has run before: no news
        opts.warn(note)
    _phase(opts, "making the inputs")
    data = _inputs(job, shape, opts, whole)
    meta = run_metadata(job, shape, opts.seed, opts.inputs)
    if opts.save_inputs:  # before the run: a run that fails can be repeated from the file
        save_inputs_file(opts.save_inputs, whole, prog.scalars(s, shape), data, meta)
    local = prog.shard(s, data, rank)
    before = None
    if opts.sentinel:
        from pto.safety.blame import nonfinite_summary

        before = nonfinite_summary(local, local)
    dist.counters(reset=True)
    first = runner.stats is None
    _phase(opts, "executing", "task")
    t0 = time.perf_counter()
    outputs = runner(local)
    if not first and job.device == "cuda":
        torch.cuda.synchronize()
    exec_ms = runner.stats.exec_ms if first else (time.perf_counter() - t0) * 1e3
    kernels_ms = runner.stats.kernel_compile_ms if first else 0.0
    if s.tp > 1:  # the outputs some programs split over the ranks, whole (a collective)
        outputs = prog.unshard(s, outputs)
    out = _report(job, shape, runner, exec_ms, kernels_ms)
    if opts.sentinel:
        from pto.safety.blame import blame

        out["nonfinite"] = blame(graph, runner.executor.flags, runner.tensors, prog.outputs, before)
    if opts.check and rank == 0:
        _phase(opts, "checking against the torch reference")
        ref = prog.reference(s, shape, data)
        out["rel_err"] = max(rel_err(outputs[k], v) for k, v in ref.items())
    _extras(out, opts, runner, outputs, meta)
    if dist.world_size() > 1:
        mine = {"rank": rank, "exec_ms": out["exec_ms"], "collectives": dist.counters(),
                **({"replay_ms": out["replay_ms"]} if "replay_ms" in out else {})}
        out["ranks"] = dist.gather(mine)
    return out


def _phase(opts: RunOptions, name: str, unit: str | None = None) -> None:
    if opts.phase is not None:
        opts.phase(name, unit)


def _report(job: Job, shape: Shape, runner: Runner, exec_ms: float, kernels_ms: float) -> dict:
    graph, stats = runner.graph, runner.stats
    return {**job.to_json(), "executor": runner.executor.name, **shape.to_json(), "shape": shape.to_json(),
            "tasks": graph.tasks, "edges": graph.edges, "launches": stats.launches, "waves": stats.waves,
            "build_ms": round(graph.build_ms, 3), "exec_ms": round(exec_ms, 3),
            "compile_ms": round(runner.compile_ms, 1), "kernel_compile_ms": round(kernels_ms, 1),
            "bytes_per_task": round(float(graph.stats["bytes_per_task"]), 1),
            # the program's own byte counts (a decode step: its weights, its cache, a step's reads)
            **(job.program.estimate_columns(job.settings, shape) if isinstance(job.program, Estimation) else {})}


def _extras(out: dict, opts: RunOptions, runner: Runner, outputs: dict, meta: dict) -> None:
    """The schedule check, determinism, the saved files, the trace, the profile, the replays."""
    from pto.safety.determinism import adding_functions, guarantee

    stats, graph, job = runner.stats, runner.graph, runner.job
    if opts.inputs:
        out["inputs"] = str(opts.inputs)
    if opts.check_schedule:
        from pto.safety.trace_check import verify_schedule

        out["schedule"] = verify_schedule(graph.runtime.export(), stats.records).to_json()
    out["determinism"] = guarantee(job.device, job.backend, opts.deterministic,
                                   adds=adding_functions(runner.module))
    fusion = job.program.fusion(job.settings)
    if fusion is not None and fusion.fused:
        out["fused"] = [f.describe() for f in fusion.fused]
    if opts.save:
        from pto.safety.tensor_io import save_outputs

        save_outputs(opts.save, outputs, meta)
        out["saved"] = str(opts.save)
    if opts.save_inputs:
        out["saved_inputs"] = str(opts.save_inputs)
    if opts.trace:
        from pto.exec.trace import write_trace

        info = write_trace(opts.trace, stats.records, graph)
        out["trace"] = {"path": str(opts.trace), "dependencies": info.dependencies, "flows": info.flows}
    if opts.profile:
        out["profile"] = runner.profile()
    if opts.repeat > 1:
        out.update(runner.time(opts.repeat))


__all__ = ["run", "RunOptions", "job_of"]
