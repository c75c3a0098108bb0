"""``pto bench``: a program against PyTorch eager and torch.compile of its own reference.

For each shape (each value of the program's swept shape parameter, ``--seq``), in one process
on the same seeded inputs: the program's reference (``Program.reference``: plain torch ops) run
eagerly and under ``torch.compile``, and our task
graph with each requested executor (built once, then replayed: a CUDA graph on the GPU);
``torch.compile`` specializes to each shape (``dynamic=False``, dynamo reset between shapes). Times
are medians of ``iterations`` runs after ``warmup`` (CUDA events on the GPU); with ``rounds`` above
1 every method is timed ``iterations`` runs in turn, round after round, and its time is the median
of all its runs, so that a drift of the GPU's clocks during the shape's minute falls on all
methods alike (``{name}_rounds``: each round's median; ``{name}_spread``: its slowest round's
over its fastest's, minus 1). TFLOP/s come from the program's flop count; ratios are the
reference's time over ours (above 1: we are faster), the median of the rounds' ratios;
``rel_err`` is ours against the reference.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from pto import programs
from pto.cli.progress import iterate
from pto.engine import Job, Runner, rel_err, resolve
from pto.errors import UsageError
from pto.exec.timing import samples_ms
from pto.program import Program, Shape

COMPARE = ("eager", "compile")


def _reference_runner(job: Job, shape: Shape, compiled: bool):
    prog, s = job.program, job.settings

    def ref(inputs):
        return prog.reference(s, shape, inputs)

    if not compiled:
        return ref
    # each shape its own specialized code (dynamo would otherwise compile the second shape's and
    # later ones with symbolic sizes), and no recompile limit across the sweep's shapes
    torch._dynamo.reset()
    return torch.compile(ref, dynamic=False)


@dataclass(frozen=True)
class Timing:
    """How each run is timed: the median of ``iterations`` after ``warmup``, on the inputs of
    ``seed``; ``rounds`` of ``iterations`` each, the methods in turn."""

    iterations: int = 20
    warmup: int = 3
    seed: int = 0
    rounds: int = 1


def bench(program: str, shapes: list[Shape | int], *, executors: tuple[str, ...] = ("auto",),
          compare: tuple[str, ...] = COMPARE, timing: Timing | None = None, progress: bool = False,
          **resolve_kw) -> dict:
    """Rows of milliseconds, TFLOP/s, ratios and rel_err for each shape (JSON-able);
    ``resolve_kw``: the settings of :func:`pto.engine.resolve` but the executor."""
    moved = sorted(set(resolve_kw) & {"iterations", "warmup", "seed"})
    if moved:
        raise UsageError(f"bench: {', '.join(moved)} go in timing=Timing(...)")
    timing = timing or Timing()
    if timing.iterations <= 0 or timing.warmup < 0 or timing.rounds <= 0:
        raise UsageError("--iterations and --rounds must be positive and --warmup not negative")
    bad = [c for c in compare if c not in COMPARE]
    if bad:
        raise UsageError(f"--compare {bad[0]!r}: choose from {', '.join(COMPARE)}")
    prog = program if isinstance(program, Program) else programs.get(program)
    shapes = [prog.shape(x) for x in shapes]
    jobs = []
    for e in executors:  # auto may resolve to an executor also asked for by name: time it once
        job = resolve(prog, executor=e, shape=shapes[0] if shapes else None, **resolve_kw)
        if e == "auto":  # (by the first shape: the command line sweeps one parameter, the same rule throughout)
            other = {resolve(prog, executor=e, shape=x, **resolve_kw).executor for x in shapes[1:]} - {job.executor}
            if other:
                raise UsageError(f"bench: --executor auto is {job.executor} at {shapes[0]} but {sorted(other)[0]} "
                                 "at another shape; name the executors (--executor waves,persistent)")
        if job.executor not in [j.executor for j in jobs]:
            jobs.append(job)
    job0 = jobs[0]
    s, cuda = job0.settings, job0.device == "cuda"
    for shape in shapes:
        prog.check_size(s, shape)
    rows = []
    for shape in iterate(shapes, f"{prog.name}: benchmarking", progress, unit="shape"):
        rows.append(_shape_row(jobs, compare, shape, timing))
        if cuda:
            torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    return {"program": prog.name, **s.to_json(), "options": [k for k, _ in s.options], "device": job0.device,
            "device_name": dev, "backend": job0.backend, "executors": [j.executor for j in jobs],
            "compare": list(compare), "iterations": timing.iterations, "warmup": timing.warmup,
            "rounds": timing.rounds, "swept": prog.swept.name,
            "rows": rows}


def _shape_row(jobs, compare, shape: Shape, timing: Timing) -> dict:
    """One shape's row: each method run once (a compile's seconds, our first run, rel_err), then
    all of them timed in ``timing.rounds`` rounds."""
    job0 = jobs[0]
    prog, s, cuda = job0.program, job0.settings, job0.device == "cuda"
    inputs = prog.inputs(s, shape, job0.device, timing.seed)
    flops = prog.flops(s, shape)
    row: dict = {**shape.to_json(), "gflop": round(flops / 1e9, 3)}
    ref = {k: v.clone() for k, v in prog.reference(s, shape, inputs).items()}
    timers, runners = {}, []
    try:
        for name in compare:
            timers[name] = _first_reference(row, _reference_runner(job0, shape, name == "compile"), name, inputs,
                                            cuda)
        for job in jobs:
            runners.append(Runner(job, shape))
            timers[job.executor] = _first_ours(row, job, runners[-1], inputs, ref)
        rounds = {}
        for name, ms in interleaved(timers, timing, cuda).items():
            row[f"{name}_ms"] = round(statistics.median(ms), 4)
            rounds[name] = round_medians(ms, timing.rounds)
            if timing.rounds > 1:
                row[f"{name}_rounds"] = [round(m, 4) for m in rounds[name]]
                row[f"{name}_spread"] = round(spread(rounds[name]), 4)
        for runner in runners:
            runner.executor.check()
    finally:
        for runner in runners:
            runner.close()
    for k in [k for k in row if k.endswith("_ms")]:
        if flops and row[k] > 0:
            row[k.replace("_ms", "_tflops")] = round(flops / (row[k] * 1e-3) / 1e12, 1)
    for job in jobs:
        for name in compare:
            row[f"{job.executor}_vs_{name}"] = round(round_ratio(rounds[name], rounds[job.executor]), 3)
    return row


def interleaved(timers: dict, timing: Timing, cuda: bool) -> dict[str, list[float]]:
    """Milliseconds of every run of each timer: ``timing.warmup`` untimed runs each, then
    ``timing.rounds`` rounds of ``timing.iterations`` runs of each timer in turn (run ``i`` of
    round ``r`` at index ``i * rounds + r``, so that ``ms[r::rounds]`` is round ``r``)."""
    out: dict[str, list[float]] = {name: [0.0] * (timing.iterations * timing.rounds) for name in timers}
    for f in timers.values():
        samples_ms(f, 0, timing.warmup, cuda=cuda)
    for r in range(timing.rounds):
        for name, f in timers.items():
            for i, ms in enumerate(samples_ms(f, timing.iterations, 0, cuda=cuda)):
                out[name][i * timing.rounds + r] = ms
    return out


def round_medians(ms: list[float], rounds: int) -> list[float]:
    """Each round's median of :func:`interleaved`'s runs of one timer."""
    return [statistics.median(ms[r::rounds]) for r in range(rounds)]


def spread(medians: list[float]) -> float:
    """The slowest round's median over the fastest's, minus 1."""
    return max(medians) / min(medians) - 1


def round_ratio(num: list[float], den: list[float]) -> float:
    """The median of the rounds' ratios of two timers (each round's runs minutes apart at most)."""
    return statistics.median(a / b for a, b in zip(num, den))


def _first_reference(row: dict, f, name: str, inputs, cuda: bool):
    """Run the reference once (a compile's seconds in the row); returns the timed call."""
    t0 = time.perf_counter()
    f(inputs)
    if cuda:
        torch.cuda.synchronize()
    if name == "compile":
        row["compile_s"] = round(time.perf_counter() - t0, 2)
    return lambda: f(inputs)


def _first_ours(row: dict, job: Job, runner: Runner, inputs, ref: dict):
    """Our first run (its seconds, rel_err, tasks, launches in the row); returns the replay, with
    the CUDA graph captured."""
    key = job.executor
    if key == "auto":
        row["auto"] = runner.executor.name
    t0 = time.perf_counter()
    out = runner(inputs)
    if job.device == "cuda":
        torch.cuda.synchronize()
    row[f"{key}_first_run_s"] = round(time.perf_counter() - t0, 2)
    row[f"{key}_rel_err"] = max(rel_err(out[k], v) for k, v in ref.items())
    row[f"{key}_tasks"] = runner.graph.tasks
    row[f"{key}_launches"] = runner.stats.launches
    row.update({f"{key}_{k}": v for k, v in runner.executor.report().items()})
    runner.replay()  # captures the CUDA graph
    return runner.replay


def _rate_unit(res: dict) -> tuple[str, float] | None:
    """The unit of the table's FLOP/s column (TF/s, or GF/s where every rate is under a TFLOP/s,
    as on a CPU, where TF/s rounds to 0) and FLOP/s per unit; None for a program without a flop
    count (no column)."""
    rates = [_flops_per_s(r, e) for r in res["rows"] for e in res["executors"]]
    if not rates or not all(rates):
        return None
    return ("TF/s", 1e12) if max(rates) >= 1e12 else ("GF/s", 1e9)


def _flops_per_s(row: dict, executor: str) -> float:
    ms = row[f"{executor}_ms"]
    return row["gflop"] * 1e9 / (ms * 1e-3) if ms > 0 else 0.0


def _three_digits(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_table(res: dict) -> str:
    ex, cmp = res["executors"], res["compare"]
    head = [f"{res['program']} on {res['device_name']} ({res['device']}), config={res['config']} "
            f"dtype={res['dtype']} target={res['target']}, median of {_runs(res)}"]
    name = res.get("swept", "seq")
    unit = _rate_unit(res)
    cols = [name] + [f"{e} ms" for e in ex] + [f"{c} ms" for c in cmp] + \
        ([f"{e} {unit[0]}" for e in ex] if unit else []) + [f"{e} x {c}" for e in ex for c in cmp] + \
        [f"{e} rel_err" for e in ex]
    lines = head + [" | ".join(cols)]
    for r in res["rows"]:
        vals = [str(r[name])] + [f"{r[f'{e}_ms']:.3f}" for e in ex] + [f"{r[f'{c}_ms']:.3f}" for c in cmp]
        if unit:
            vals += [_three_digits(_flops_per_s(r, e) / unit[1]) for e in ex]
        vals += [f"{r[f'{e}_vs_{c}']:.3f}" for e in ex for c in cmp]
        vals += [f"{r[f'{e}_rel_err']:.1e}" for e in ex]
        lines.append(" | ".join(vals))
    if res.get("rounds", 1) > 1:  # how far each method's rounds moved: how much a ratio can be trusted
        spreads = [(m, [r[f"{m}_spread"] for r in res["rows"]]) for m in [*ex, *cmp]]
        lines.append("spread between rounds (slowest round's median over the fastest's): " + ", ".join(
            f"{m} {min(v):.0%}-{max(v):.0%}" for m, v in spreads))
    return "\n".join(lines)


def _runs(res: dict) -> str:
    rounds = res.get("rounds", 1)
    return f"{res['iterations']}" if rounds == 1 else f"{res['iterations']} x {rounds} rounds (in turn)"


def plot(res: dict, path: str):
    """Milliseconds against sequence length for every method (log-log); the settings in the
    title (:mod:`pto.viz.plotting`). Returns the figure."""
    from pto.cli.commands.estimate import check_plot_path
    from pto.viz.plotting import figure, finish, log_axes

    check_plot_path(path)
    swept = res.get("swept", "seq")
    seqs = [r[swept] for r in res["rows"]]
    fig, (ax,) = figure(1)
    for name in [*res["executors"], *res["compare"]]:
        label = f"pto ({name})" if name in res["executors"] else f"torch {name}"
        ax.plot(seqs, [r[f"{name}_ms"] for r in res["rows"]], "o-", label=label)
    log_axes(ax, "time per run (median)", "ms", "sequence length" if swept == "seq" else swept)
    opts = [f"{k}={res[k]}" for k in res["options"] if res[k] != ""]
    details = [", ".join([f"config {res['config']}", res["dtype"], f"target {res['target']}",
                          f"{res['backend']} backend", f"median of {_runs(res)}", *opts])]
    return finish(fig, [ax], f"{res['program']} on {res['device_name']}", details, path)


__all__ = ["bench", "format_table", "plot", "interleaved", "round_medians", "round_ratio", "spread", "COMPARE"]
