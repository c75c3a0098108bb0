"""``pto tune``: search each InCore variant's schedule space on the GPU and store the winners in the
schedule database (:mod:`pto.backends.triton.schedules`).

For every sequence length: the program's graph runs once with the wave executor (the intermediate
tensors hold real data), recording the batches the executor launches. For each variant, the
largest of its batches is the benchmark: every candidate of the variant's space (warps, pipeline
stages, the grouped program order where the function has a parallel axis) is run on the batch,
its outputs are compared with the torch backend's on the same inputs (a candidate outside the
dtype's tolerance is never kept), the survivors are timed (CUDA events, median), and the fastest
is stored for the variant and the batch's shape bucket, with the Triton version and the kernel's
source hash. The candidates' kernels compile at once on the compile threads
(:mod:`pto.backends.triton.ahead`, ``PTO_COMPILE_THREADS``), and no timing starts before they
have all ended. Variants go in order of their estimated cost, biggest first, within a time budget;
the database is written after each variant, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pto.backends.torch_backend import TorchBackend
from pto.backends.triton import TritonBackend
from pto.backends.triton.schedules import Entry, ScheduleDB, bucket, for_device, triton_version
from pto.cli.progress import iterate
from pto.codegen.triton.tma import tma_memrefs
from pto.data.batch import RegionBatch, TaskBatch
from pto.engine import Job, Placement, Prepared, build_graph, rel_err, resolve
from pto.errors import UsageError
from pto.exec.timing import median_ms
from pto.ir.analysis import param_access
from pto.ir.nodes import ForRange
from pto.ir.ops import Op
from pto.program import Shape

#: relative L2 error a candidate may have against the torch backend, per storage dtype
TOLERANCE = {"f32": 1e-5, "f16": 5e-3, "bf16": 2e-2}


@dataclass(frozen=True)
class Search:
    """How a tuning run searches: ``budget_s`` seconds in all, each candidate timed over
    ``iterations`` launches after ``warmup``; ``seed`` of the program's inputs; ``progress``
    bars; ``only``: the function names to tune; ``candidates``: a space per function name in place
    of :func:`space`; ``on_measure(label, candidate, ms, why_rejected)`` after each candidate."""

    budget_s: float = 600.0
    iterations: int = 10
    warmup: int = 2
    seed: int = 0
    progress: bool = False
    only: frozenset[str] | None = None
    candidates: dict[str, list[dict]] | None = None
    on_measure: object = None


@dataclass
class Result:
    variant: str
    function: str
    tasks: int
    candidates: int
    rejected: int
    best: dict | None
    best_ms: float | None
    default_ms: float | None


def space(fn, capability: tuple[int, int] | None = None) -> list[dict]:
    """The candidates of a variant: warps x pipeline stages (when a loop loads tiles) x the
    grouped order (when the function has a parallel axis); for a kernel whose loops multiply
    large tiles (:func:`~pto.codegen.triton.tma.tma_memrefs`) compiled for a GPU of compute
    ``capability``, also the persistent tile loops at 8 warps and 3 stages, in every grouped
    order: "loop", and "ws" (warp-specialized) from 9.0 (:data:`~pto.codegen.triton.common.PERSISTENT_MODES`;
    "flat" is not tuned yet: it is the decode GEMVs' experiment)."""
    loads_in_loop = any(isinstance(s, ForRange) and _loads(s.body) for s in fn.body)
    stages = (2, 3, 4) if loads_in_loop else (1,)
    groups = (0, 4, 8, 16) if fn.parallel is not None else (None,)
    out = []
    for w, st, g in itertools.product((4, 8), stages, groups):
        c = {"num_warps": w, "num_stages": st}
        if g is not None:
            c["GROUP"] = g
        out.append(c)
    if capability is not None and loads_in_loop and tma_memrefs(fn):
        modes = ("loop", "ws") if tuple(capability) >= (9, 0) else ("loop",)
        out += [{**c, "persistent": m} for m in modes for c in out if c["num_warps"] == 8 and c["num_stages"] == 3]
    return out


def _loads(body) -> bool:
    return any(_loads(s.body) if isinstance(s, ForRange) else s.op is Op.LOAD for s in body)


def _collect_batches(job: Job, shape: Shape, seed: int):
    """Run the program once with the wave executor; every (variant, batch) it launched."""
    prog, s = job.program, job.settings
    run = Prepared(build_graph(job, shape), Placement(job.device, "triton", "waves", schedules=prog.schedules),
                   packed=prog.packed_inputs(s))
    try:
        batches: list[TaskBatch] = []
        run.executor.on_batch = batches.append
        run(prog.inputs(s, shape, job.device, seed))
        if job.device == "cuda":
            torch.cuda.synchronize()
        return batches
    finally:
        run.close()


def _clone(batch: TaskBatch, written: set[str]) -> TaskBatch:
    mems = {k: RegionBatch(v.tensor.clone() if k in written else v.tensor, v.row0, v.col0, v.rows, v.cols)
            for k, v in batch.mems.items()}
    return TaskBatch(batch.fn, mems, batch.scalars, batch.size)


def accept(out: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], dtype: str) -> float | None:
    """The worst relative L2 error of ``out`` against ``ref`` if within the dtype's tolerance,
    else None (the candidate is wrong)."""
    err = max(rel_err(out[k], ref[k]) for k in ref)
    return err if err <= TOLERANCE[dtype] else None


def _backend(device, cand: dict | None, variant: str) -> TritonBackend:
    """A backend running ``cand`` for ``variant``: launch parameters, and RenderOptions fields
    (e.g. ``input_precision``) that switch the generated code; its kernels are copies of their
    own (:attr:`TritonBackend.kernel_copy`), so that the candidates of one kernel compile at once."""
    be = TritonBackend(device, launch={variant: dict(cand)} if cand else None)
    be.kernel_copy = f"tune {sorted(cand.items()) if cand else None}"
    return be


def tune_batch(batch: TaskBatch, db: ScheduleDB, dtype: str, search: Search, deadline: float, label: str) -> Result:
    """Search one variant on one batch, storing the best candidate in ``db`` each time it
    improves on what runs today and on the candidates before it (an interrupted search keeps
    it; a search that finds nothing faster stores nothing); the search result."""
    fn = batch.fn
    candidates = search.candidates.get(fn.name) if search.candidates else None
    on_measure = search.on_measure
    access = param_access(fn)
    written = {p.name for p in fn.memrefs if access[p.name].direction != "in"}
    snapshot = _clone(batch, written)  # inputs as the graph run left them
    ref = _clone(snapshot, written)
    TorchBackend().prepare(ref)()
    ref_out = {k: ref.mems[k].tensor for k in written}
    device = batch.mems[fn.memrefs[0].name].tensor.device
    compiled = device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    cands = candidates if candidates is not None else \
        space(fn, torch.cuda.get_device_capability(device) if compiled else None)
    cuda = device.type == "cuda"
    result = Result(fn.variant_name, fn.name, batch.size, len(cands), 0, None, None, None)

    def reject(cand, why: str) -> None:
        result.rejected += 1
        if on_measure:
            on_measure(label, cand, None, why)

    # every candidate's kernel (and its other specializations' fit) compiled at once on the compile
    # threads (pto.backends.triton.ahead: a compile is seconds, most of it outside Python's lock),
    # each run once as its compile ends and checked; the timings only after every compile has
    # ended, so that none competes with them for the CPU that launches. One buffer of the batch's
    # outputs for all (set back to the batch's before each check run). None first: what runs
    # today (the database's entry, else the renderer's heuristics), the baseline a candidate must
    # beat to be stored
    work = _clone(snapshot, written)
    prepared, ran = [], []
    try:
        for cand in [None, *cands]:
            be = TritonBackend(device, schedules=db) if cand is None else _backend(device, cand, fn.variant_name)
            try:
                launch = be.prepare_ahead(work) if compiled else be.prepare(work)
                fits = be.unfit_specializations_ahead(fn, batch.size) if cand is not None and be.compiles else None
            except Exception as e:  # a candidate that cannot even be rendered for this batch
                reject(cand, type(e).__name__)
                continue
            prepared.append((cand, launch, fits))
        for cand, launch, fits in prepared:
            if time.monotonic() > deadline:
                break
            for n in written:
                work.mems[n].tensor.copy_(snapshot.mems[n].tensor)
            try:
                launch()
                if cuda:
                    torch.cuda.synchronize()
                unfit = fits.result() if fits is not None else []
            except Exception as e:  # a candidate Triton cannot compile (too much shared memory, ...)
                reject(cand, type(e).__name__)
                continue
            if accept({n: work.mems[n].tensor for n in written}, ref_out, dtype) is None:
                reject(cand, "wrong result")  # never kept, whatever its speed
                continue
            if unfit:  # a residual tile's launch would need what the device does not have
                reject(cand, unfit[0])
                continue
            ran.append((cand, launch))
    finally:  # (the deadline, an error, Ctrl-C: the compiles not started are not needed)
        for _, launch, fits in prepared:
            for f in (getattr(launch, "future", None), fits):
                if f is not None:
                    f.cancel()
    for cand, launch in ran:
        if time.monotonic() > deadline:
            break
        ms = round(median_ms(launch, search.iterations, search.warmup, cuda=cuda), 4)
        if cand is None:
            result.default_ms = ms
        elif (result.best_ms is None or ms < result.best_ms) and (result.default_ms is None or ms < result.default_ms):
            result.best, result.best_ms = dict(cand), ms
            # the source is the variant's code under the default options: render switches in the
            # entry's parameters are applied on top (TritonBackend.prepare)
            db.store(fn.name, Entry(fn.variant_name, bucket(batch.size), dict(cand), triton_version(),
                                    TritonBackend(device).kernel(fn).schedule_digest, ms, label, len(cands),
                                    {"default_ms": result.default_ms}))
        if on_measure:
            on_measure(label, cand, ms, None)
    return result


def tune(program: str, shapes: list[Shape | int], search: Search | None = None, db: ScheduleDB | None = None,
         **where) -> dict:
    """Tune every variant the program runs at ``shapes`` (JSON-able summary); ``where``: the
    program's settings as :func:`pto.engine.resolve` takes them (device, config, dtype, target,
    options); ``db``: where the winners go (the device's user database by default)."""
    from datetime import date

    moved = sorted(set(where) & set(Search.__dataclass_fields__))
    if moved:
        raise UsageError(f"tune: {', '.join(moved)} go in search=Search(...)")
    search = search or Search()
    job = resolve(program, backend="triton", executor="waves", **where)
    db = db or for_device(job.device, job.program.schedules)
    if db is None:
        raise UsageError("PTO_SCHEDULES=none: pto tune has no schedule database to store its results in")
    deadline = time.monotonic() + search.budget_s
    results: list[Result] = []
    interrupted = False
    try:
        for shape in [job.program.shape(x) for x in shapes]:
            job.program.check_size(job.settings, shape)
            best: dict[str, TaskBatch] = {}
            for b in _collect_batches(job, shape, search.seed):
                if search.only and b.fn.name not in search.only:
                    continue
                if b.fn.variant_name not in best or b.size > best[b.fn.variant_name].size:
                    best[b.fn.variant_name] = b
            order = sorted(best.values(), key=lambda b: -_estimate(b))
            for b in iterate(order, f"tuning {job.program.name} at {shape}", search.progress, unit="variant"):
                if time.monotonic() > deadline:
                    break
                flags = " ".join(f"--{k} {v}" for k, v in shape.items())
                label = f"{date.today().isoformat()} pto tune {job.program.name} {flags}"
                results.append(tune_batch(b, db, job.settings.dtype.short, search, deadline, label))
    except KeyboardInterrupt:
        interrupted = True
    return {"program": job.program.name, **job.settings.to_json(), "device": job.device, "database": str(db.user_dir),
            "budget_s": search.budget_s, "interrupted": interrupted,
            "results": [r.__dict__ for r in results]}


def _estimate(batch: TaskBatch) -> float:
    from pto.exec.cost import item_costs

    env = {f"{k}.rows": v.rows.cpu() for k, v in batch.mems.items()}
    env.update({f"{k}.cols": v.cols.cpu() for k, v in batch.mems.items()})
    env.update({k: v.cpu() for k, v in batch.scalars.items()})
    try:
        return float(item_costs(batch.fn, env, batch.size).sum())
    except Exception:
        return float(batch.size)


def show(program: str, shapes: list[Shape | int], *, device: str = "auto", config=None, dtype=None, target=None,
         options: dict | None = None) -> str:
    """What applies to each variant the program runs at ``shapes``: the parameters, where they
    come from (user, shipped, heuristic) and why other entries do not apply."""
    job = resolve(program, device=device, config=config, dtype=dtype, target=target, options=options,
                  shape=shapes[0] if shapes else None)
    db = for_device(job.device, job.program.schedules)
    be = TritonBackend(job.device if job.device == "cuda" else "cpu", schedules=db)
    if db is None:
        lines = ["schedules: none (PTO_SCHEDULES=none): the renderer's heuristics for every kernel"]
        db = ScheduleDB("none", user_dir=Path(os.devnull))
    else:
        shipped = ", ".join(str(d) for d in (*db.shipped_dirs, *db.kin_dirs) if d.is_dir()) or \
            f"none for {job.program.name} on {db.device}"
        lines = [f"schedules for {db.device} (user: {db.user_dir}; shipped: {shipped}; Triton "
                 f"{db.triton or 'not installed'})"]
        if job.device == "cpu" and not os.environ.get("PTO_SCHEDULES", "").strip():
            lines.append(_cpu_note(job))
    for shape in [job.program.shape(x) for x in shapes]:
        graph = build_graph(job, shape).graph
        try:
            for fn, n in sorted(graph.tasks_per_variant().items(), key=lambda kv: kv[0].variant_name):
                digest = be.kernel(fn).schedule_digest
                _, origin = db.lookup(fn.name, fn.variant_name, n, digest)
                lines.append(f"{shape}  {fn.variant_name} ({n} tasks, {bucket(n)}): {origin} "
                             f"{be.launch_config(fn, n)}")
                lines += [f"    {x}" for x in db.explain(fn.name, fn.variant_name, n, digest)]
        finally:
            graph.close()
    return "\n".join(lines)


def _cpu_note(job: Job) -> str:
    """What ``--show`` on a CPU lists, and how to see what a GPU the program ships schedules for
    applies: its database (``PTO_SCHEDULES``) with its target, the program's GPU configuration
    and bf16."""
    from pto.machine.target import NAMED

    name = job.program.name
    note = (f"note: on the CPU a run takes the {job.backend} backend, whose kernels have no launch parameters; "
            "below are the Triton kernels' as its interpreter would launch them (TRITON_INTERPRET=1)")
    gpus = sorted({d.name for root in job.program.schedules if root.is_dir() for d in root.iterdir() if d.is_dir()})
    if not gpus:
        return f"{note}. {name} ships no schedules; pto tune measures them on a GPU"
    key = gpus[-1]
    target = next((t for t in NAMED if t.startswith("cuda_") and t[5:] in key.split("_")), None)
    how = f"PTO_SCHEDULES={key} pto tune {name} --show --config {job.program.default_config('cuda')} --dtype bf16" + \
        (f" --target {target}" if target else " --target (that GPU's)")
    return f"{note}. {name} ships schedules for {', '.join(gpus)}: `{how}` shows what one applies"


def refuse_without_gpu(device: str, program: str = "PROGRAM") -> None:
    """Tuning measures Triton kernels: on a GPU, or (``--device cpu``) under the interpreter,
    whose timings mean nothing but which checks the search. ``--show`` needs neither."""
    show = f"`pto tune {program} --show` works anywhere: what applies to each kernel now, and why"
    if device in ("auto", "cuda"):
        from pto.machine.device import cuda_available

        if not cuda_available():
            raise UsageError(f"pto tune measures kernels on a GPU and none is visible; {show}")
    elif os.environ.get("TRITON_INTERPRET") != "1":
        raise UsageError(f"pto tune --device cpu runs the kernels under the Triton interpreter (a check of the "
                         f"search, not a timing): set TRITON_INTERPRET=1; {show}")


__all__ = ["tune", "tune_batch", "show", "space", "accept", "TOLERANCE", "Result"]
