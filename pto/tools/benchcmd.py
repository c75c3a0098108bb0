"""``pto bench``: a program against PyTorch eager and torch.compile of its own reference.

For each shape (each value of the program's swept shape parameter, ``--seq``), in one process
on the same seeded inputs: the program's reference (``Program.reference``: plain torch ops) run
eagerly and under ``torch.compile``, and our task
graph with each requested executor (built once, then replayed: a CUDA graph on the GPU). Times
are medians of ``iterations`` runs after ``warmup`` (CUDA events on the GPU); TFLOP/s come from
the program's flop count; ratios are the reference's time over ours (above 1: we are faster);
``rel_err`` is ours against the reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pto.engine import Job, Runner, rel_err, resolve
from pto.errors import UsageError
from pto.program import Shape
from pto.progress import iterate
from pto.timing import median_ms

COMPARE = ("eager", "compile")


def _reference_runner(job: Job, shape: Shape, compiled: bool):
    prog, s = job.program, job.settings

    def ref(inputs):
        return prog.reference(s, shape, inputs)

    return torch.compile(ref) if compiled else ref


@dataclass(frozen=True)
class Timing:
    """How each run is timed: the median of ``iterations`` after ``warmup``, on the inputs of
    ``seed``."""

    iterations: int = 20
    warmup: int = 3
    seed: int = 0


def bench(program: str, shapes: list[Shape | int], *, executors: tuple[str, ...] = ("auto",),
          compare: tuple[str, ...] = COMPARE, timing: Timing | None = None, progress: bool = False,
          **resolve_kw) -> dict:
    """Rows of milliseconds, TFLOP/s, ratios and rel_err for each shape (JSON-able);
    ``resolve_kw``: the settings of :func:`pto.engine.resolve` but the executor."""
    moved = sorted(set(resolve_kw) & {"iterations", "warmup", "seed"})
    if moved:
        raise UsageError(f"bench: {', '.join(moved)} go in timing=Timing(...)")
    timing = timing or Timing()
    iterations, warmup, seed = timing.iterations, timing.warmup, timing.seed
    bad = [c for c in compare if c not in COMPARE]
    if bad:
        raise UsageError(f"--compare {bad[0]!r}: choose from {', '.join(COMPARE)}")
    if iterations <= 0 or warmup < 0:
        raise UsageError("--iterations must be positive and --warmup not negative")
    jobs = []
    for e in executors:  # auto may resolve to an executor also asked for by name: time it once
        job = resolve(program, executor=e, **resolve_kw)
        if job.executor not in [j.executor for j in jobs]:
            jobs.append(job)
    job0 = jobs[0]
    prog, s, cuda = job0.program, job0.settings, job0.device == "cuda"
    shapes = [prog.shape(x) for x in shapes]
    for shape in shapes:
        prog.check_size(s, shape)
    rows = []
    for shape in iterate(shapes, f"{prog.name}: benchmarking", progress, unit="shape"):
        inputs = prog.inputs(s, shape, job0.device, seed)
        flops = prog.flops(s, shape)
        row: dict = {**shape.to_json(), "gflop": round(flops / 1e9, 3)}
        ref = {k: v.clone() for k, v in prog.reference(s, shape, inputs).items()}
        for name in compare:
            _time_reference(row, _reference_runner(job0, shape, name == "compile"), name, inputs, iterations,
                            warmup, cuda)
        for job in jobs:
            _time_ours(row, job, shape, inputs, ref, iterations, warmup)
        for k in [k for k in row if k.endswith("_ms")]:
            if flops and row[k] > 0:
                row[k.replace("_ms", "_tflops")] = round(flops / (row[k] * 1e-3) / 1e12, 1)
        for job in jobs:
            for name in compare:
                row[f"{job.executor}_vs_{name}"] = round(row[f"{name}_ms"] / row[f"{job.executor}_ms"], 3)
        rows.append(row)
        if cuda:
            torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    return {"program": prog.name, **s.to_json(), "options": [k for k, _ in s.options], "device": job0.device,
            "device_name": dev, "backend": job0.backend, "executors": [j.executor for j in jobs],
            "compare": list(compare), "iterations": iterations, "warmup": warmup, "swept": prog.swept.name,
            "rows": rows}


def _time_reference(row: dict, f, name: str, inputs, iterations: int, warmup: int, cuda: bool) -> None:
    t0 = time.perf_counter()
    f(inputs)
    if cuda:
        torch.cuda.synchronize()
    if name == "compile":
        row["compile_s"] = round(time.perf_counter() - t0, 2)
    row[f"{name}_ms"] = round(median_ms(lambda: f(inputs), iterations, warmup, cuda=cuda), 4)


def _time_ours(row: dict, job: Job, shape: Shape, inputs, ref: dict, iterations: int, warmup: int) -> None:
    runner = Runner(job, shape)
    key = job.executor
    if key == "auto":
        row["auto"] = runner.executor.name
    try:
        t0 = time.perf_counter()
        out = runner(inputs)
        if job.device == "cuda":
            torch.cuda.synchronize()
        row[f"{key}_first_run_s"] = round(time.perf_counter() - t0, 2)
        row[f"{key}_rel_err"] = max(rel_err(out[k], v) for k, v in ref.items())
        row[f"{key}_tasks"] = runner.graph.tasks
        row[f"{key}_launches"] = runner.stats.launches
        row.update({f"{key}_{k}": v for k, v in runner.executor.report().items()})
        for _ in range(warmup):
            runner.replay()
        row[f"{key}_ms"] = runner.time(iterations)["replay_ms"]
        runner.executor.check()
    finally:
        runner.close()


def format_table(res: dict) -> str:
    ex, cmp = res["executors"], res["compare"]
    head = [f"{res['program']} on {res['device_name']} ({res['device']}), config={res['config']} "
            f"dtype={res['dtype']} target={res['target']}, median of {res['iterations']}"]
    name = res.get("swept", "seq")
    cols = [name] + [f"{e} ms" for e in ex] + [f"{c} ms" for c in cmp] + [f"{e} TF/s" for e in ex] \
        + [f"{e} x {c}" for e in ex for c in cmp] + [f"{e} rel_err" for e in ex]
    lines = head + [" | ".join(cols)]
    for r in res["rows"]:
        vals = [str(r[name])] + [f"{r[f'{e}_ms']:.3f}" for e in ex] + [f"{r[f'{c}_ms']:.3f}" for c in cmp]
        vals += [f"{r.get(f'{e}_tflops', 0):.0f}" for e in ex]
        vals += [f"{r[f'{e}_vs_{c}']:.3f}" for e in ex for c in cmp]
        vals += [f"{r[f'{e}_rel_err']:.1e}" for e in ex]
        lines.append(" | ".join(vals))
    return "\n".join(lines)


def plot(res: dict, path: str):
    """Milliseconds against sequence length for every method (log-log); the settings in the
    title (:mod:`pto.tools.plotting`). Returns the figure."""
    from pto.tools.estimate import check_plot_path
    from pto.tools.plotting import figure, finish, log_axes

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
                          f"{res['backend']} backend", f"median of {res['iterations']}", *opts])]
    return finish(fig, [ax], f"{res['program']} on {res['device_name']}", details, path)


__all__ = ["bench", "format_table", "plot", "COMPARE"]
