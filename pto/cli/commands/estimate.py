"""``pto estimate``: task counts, edges and runtime memory against sequence length.

For each sequence length the graph is built for real by the generated orchestration C when it
is small enough to build in about a second (``measured: true``: counts, edges, the runtime's
peak bytes and the build time are read off the runtime). Larger graphs are not built: task and
edge counts come from the program's exact closed form (checked against every measured row) or,
for programs without one, from a count-only run of the generated C; memory comes from the
runtime's bytes per task and per edge, fitted by least squares on measured builds.
docs/ESTIMATE.md gives the formulas and the seed comparison.
"""

from __future__ import annotations

import numbers
import shutil
import time
from pathlib import Path

import numpy as np

from pto import programs
from pto.cli.progress import iterate
from pto.data.buffers import tensor_bytes
from pto.engine import build_module_graph
from pto.errors import ExecutionError, UsageError
from pto.machine.target import Target
from pto.paths import can_write
from pto.program import Baseline, CountsTasks, Estimation, Program, Settings, Shape

#: graphs up to this many tasks are built for real
MAX_BUILD_TASKS = 2_000_000
#: ... and up to this many edges: the fused layer's edges grow as T^2 / 2 with few tasks (4M
#: tokens: 360K tasks but 1.1G edges, minutes and gigabytes to build), so the task limit alone
#: does not keep a build to about a second (20M edges: ~0.4 s and ~170 MB here)
MAX_BUILD_EDGES = 20_000_000
#: calibration builds of the memory model stay below this many tasks and edges
CALIBRATION_TASKS = 200_000
CALIBRATION_EDGES = 2_000_000
#: the largest sequence length: the runtime's tensor dimensions are int32
MAX_SEQ = 2**31 - 1


class _Counter:
    """Counts of one program setting: closed form when the program has one, else count-only
    builds of the generated C."""

    def __init__(self, prog: Program, s: Settings):
        self.prog = prog
        self.s = s
        self._modules: dict[str, object] = {}
        self.has_closed_form = isinstance(prog, CountsTasks) and prog.counts(s, prog.shape()) is not None

    def module(self, shape: Shape):
        """The program's module at ``shape``: the same one for every shape it builds alike (a
        decode step's structure depends on its cache: chunks and combine levels), so each
        distinct module compiles once."""
        from pto.text.printer import format_module

        m = self.prog.build(self.s, shape)
        return self._modules.setdefault(format_module(m), m)

    def counts(self, shape: Shape, adaptive: bool) -> dict:
        """``tasks`` (and ``edges``, ``row_tiles`` where the closed form gives them)."""
        if self.has_closed_form:
            return self.prog.counts(self.s, shape, adaptive)
        g = build_module_graph(self.module(shape), self.prog.scalars(self.s, shape), adaptive, self.s.target,
                               count_only=True).graph
        try:
            return {"tasks": g.tasks}
        finally:
            g.close()


def _build(module, prog: Program, s: Settings, shape: Shape, adaptive: bool) -> dict:
    """Build the whole graph (window 0) and read its counts, peak bytes and build time."""
    t0 = time.perf_counter()
    built = build_module_graph(module, prog.scalars(s, shape), adaptive, s.target)
    g, wall = built.graph, (time.perf_counter() - t0) * 1e3 - built.compile_ms
    try:
        st = g.stats
        return {"value": shape[prog.swept.name], "tasks": g.tasks, "edges": g.edges, "bytes": int(st["bytes_peak"]),
                "build_ms": round(g.build_ms, 3), "setup_ms": round(wall - g.build_ms, 3)}
    finally:
        g.close()


def _fit_bytes(samples: list[dict]) -> tuple[float, float, float]:
    """bytes ~ a * tasks + b * edges + c with a, b, c >= 0, least squares over measured builds
    (a feature whose coefficient comes out negative, e.g. edges proportional to tasks, is
    dropped and the rest refitted)."""
    X = np.array([[s["tasks"], s["edges"], 1.0] for s in samples], dtype=np.float64)
    y = np.array([s["bytes"] for s in samples], dtype=np.float64)
    active = [0, 1, 2][: max(1, min(3, len(samples)))]
    while True:
        coef, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        neg = [f for f, c in zip(active, coef) if c < 0]
        if not neg or len(active) == 1:
            break
        active = [f for f in active if f != neg[0]]
    out = [0.0, 0.0, 0.0]
    for f, c in zip(active, coef):
        out[f] = max(float(c), 0.0)
    return out[0], out[1], out[2]


def _fit_edges(samples: list[dict]) -> tuple[float, float]:
    """edges ~ a * tasks + b over the builds (programs without a closed form for edges)."""
    A = np.array([[s["tasks"], 1.0] for s in samples], dtype=np.float64)
    y = np.array([s["edges"] for s in samples], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(coef[0]), float(coef[1])


def _calibration_builds(counter: _Counter, adaptive: bool, samples: list[dict], at) -> list[dict]:
    """Builds for the memory model when fewer than three rows were measured: the largest
    power-of-two values of the swept shape parameter (``at(value)``: the shape) whose graphs stay
    within CALIBRATION_TASKS and
    CALIBRATION_EDGES. The largest, not the smallest: the fixed bytes swamp tiny graphs, and the
    fused layer's edges per task grow with the length, so only graphs with many edges per task
    pin the bytes per edge (the smallest three left it at 0: 13 MB predicted for a 562 MB
    graph at 1M tokens)."""
    fits, cal = [], 64
    while cal <= 1 << 24:  # the counts are closed-form or count-only runs: cheap
        try:
            counter.prog.check_shape(counter.s, at(cal))
        except UsageError:  # a size the program cannot build (a decode cache below one chunk)
            cal *= 2
            continue
        c = counter.counts(at(cal), adaptive)
        if c["tasks"] > CALIBRATION_TASKS or c.get("edges", 0) > CALIBRATION_EDGES:
            break
        fits.append((cal, c["tasks"]))
        cal *= 2
    out, seen = [], {s["tasks"] for s in samples}
    for cal, tasks in reversed(fits):
        if len(samples) + len(out) >= 3:
            break
        if tasks not in seen:
            seen.add(tasks)
            out.append(_build(counter.module(at(cal)), counter.prog, counter.s, at(cal), adaptive))
    return out


def check_plot_path(path: str) -> None:
    """UsageError unless matplotlib can write ``path`` (its suffix names a format it writes, and
    its folder exists): checked before anything is computed, so that a typo costs no build."""
    try:
        from matplotlib import rcParams
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = set(FigureCanvasBase.get_supported_filetypes())
    if not shutil.which(rcParams["pgf.texsystem"]):  # pgf output runs a TeX install
        formats.discard("pgf")
    if suffix not in formats:
        what = f"'.{suffix}' files" if suffix else "a file without a suffix"
        raise UsageError(f"--plot {path}: matplotlib cannot write {what} "
                         f"(use .png, .pdf, .svg or .jpg; all: {', '.join(sorted(formats))})")
    folder = Path(path).parent
    if not folder.is_dir():
        raise UsageError(f"--plot {path}: no folder {str(folder)!r}")
    if not can_write(path):
        raise UsageError(f"--plot {path}: cannot write in folder {str(folder)!r}")


def check_values(values: list[int], name: str = "seq") -> list[int]:
    """The distinct values of the swept shape parameter ``name``, sorted; UsageError naming the
    first one out of range."""
    if not values:
        raise UsageError(f"at least one value of --{name} is needed")
    for s in values:
        if not isinstance(s, numbers.Integral) or isinstance(s, bool) or s <= 0:
            raise UsageError(f"--{name} {s!r}: must be a positive integer")
        if s > MAX_SEQ:
            raise UsageError(f"--{name} {s} is above {MAX_SEQ} (2**31 - 1), the runtime's "
                             f"limit on a tensor dimension")
    return sorted({int(s) for s in values})


def estimate(program: Program | str, values: list[int], *, shape: Shape | None = None, adaptive: bool = True,
             limits: tuple[int, int] = (MAX_BUILD_TASKS, MAX_BUILD_EDGES), plot_path: str | None = None,
             progress: bool = False, **resolve_kw) -> dict:
    """Rows of task counts, edges and runtime memory for each value of the program's swept shape
    parameter (``seq``), the others at ``shape``'s (the defaults); JSON-able.

    The program's settings are ``settings`` (in ``resolve_kw``), or resolved from ``device``,
    ``config``, ``dtype``, ``target`` and the program's own options by the rule every command
    follows (:mod:`pto.program`). A row is built for real when its graph (the adaptive one, or
    the non-adaptive one with ``adaptive=False``) has at most ``limits`` = (tasks, edges; edges
    where the closed form gives them). ``plot_path`` is only checked here (before any work;
    :func:`check_plot_path`); :func:`plot` draws it.
    """
    if plot_path is not None:
        check_plot_path(plot_path)
    values = check_values(values, "seq" if isinstance(program, str) else program.swept.name)
    prog = program if isinstance(program, Program) else programs.get(program)
    name = prog.swept.name
    s = _settings(prog, **resolve_kw)
    base = prog.shape(shape)

    def at(v: int) -> Shape:
        return prog.shape({**base, name: v})

    for v in values:  # refused before any work (sizes too large to run are estimated)
        prog.check_shape(s, at(v))
    counter = _Counter(prog, s)
    rows, samples = [], []
    for v in iterate(values, "estimating", progress, unit=name):
        row, built = _row(counter, at(v), adaptive, limits)
        rows.append(row)
        samples += [built] if built else []
    calibration = _calibration_builds(counter, adaptive, samples, at) if len(samples) < 3 else []
    samples += calibration
    if not samples:
        raise ExecutionError(f"{prog.name}: no graph is small enough to build for the memory model")
    model = _fill_memory(rows, samples, adaptive)
    model["calibration"] = sorted(x["value"] for x in calibration)
    res = {"program": prog.name, **s.to_json(), "options": [k for k, _ in s.options], "swept": name,
           "shape": base.to_json()}
    res.update(adaptive=adaptive, closed_form=counter.has_closed_form, memory_model=model, rows=rows)
    return res


def _settings(prog: Program, settings: Settings | None = None, device: str = "auto", config: str | None = None,
              dtype: str | None = None, target: str | Target | None = None, **options) -> Settings:
    if settings is not None:
        return settings
    from pto.machine.device import resolve_device
    from pto.machine.target import get as get_target
    from pto.machine.target import resolve as resolve_target

    dev = resolve_device(device)
    tg = get_target(target) if isinstance(target, str) else target or resolve_target(None, dev)
    return prog.settings(device=dev, config=config, dtype=dtype, target=tg, **options)


def _row(counter: _Counter, shape: Shape, adaptive: bool, limits: tuple[int, int]) -> tuple[dict, dict | None]:
    """One row (counts, tensors; built and measured when the graph is small enough) and the
    build's sample for the memory model, if built."""
    prog, s, module = counter.prog, counter.s, counter.module(shape)
    ca, cn = counter.counts(shape, True), counter.counts(shape, False)
    mine = ca if adaptive else cn
    row = {**shape.to_json(), "tasks": ca["tasks"], "tasks_no_adaptive": cn["tasks"],
           "saved": round(1.0 - ca["tasks"] / cn["tasks"], 4) if cn["tasks"] else 0.0,
           # the tensors a run allocates (one rank's with --tp: its weight shards and activations)
           "tensor_bytes": sum(tensor_bytes(module.entry_function, prog.scalars(s, shape)).values()),
           **(prog.estimate_columns(s, shape) if isinstance(prog, Estimation) else {})}
    if "row_tiles" in mine:
        row["row_tiles"] = mine["row_tiles"]
    if mine["tasks"] > limits[0] or mine.get("edges", 0) > limits[1]:
        row.update(edges=mine.get("edges"), measured=False)
        return row, None
    b = _build(module, prog, s, shape, adaptive)
    if b["tasks"] != mine["tasks"] or ("edges" in mine and b["edges"] != mine["edges"]):
        raise ExecutionError(f"{prog.name} at {shape}: the closed form gives {mine} but the "
                             f"built graph has {b['tasks']} tasks and {b['edges']} edges")
    row.update(edges=b["edges"], runtime_bytes=b["bytes"], build_ms=b["build_ms"], measured=True,
               tasks_per_ms=round(b["tasks"] / b["build_ms"]) if b["build_ms"] > 0 else None)
    return row, b


def _fill_memory(rows: list[dict], samples: list[dict], adaptive: bool) -> dict:
    """The memory model fitted on ``samples``; the rows not built get their edges and bytes
    from it."""
    a, b, c = _fit_bytes(samples)
    ea, eb = _fit_edges(samples)
    for row in rows:
        if row["measured"]:
            row["bytes_per_task"] = round(row["runtime_bytes"] / max(row_tasks(row, adaptive), 1), 1)
            continue
        n = row_tasks(row, adaptive)
        if row["edges"] is None:  # no closed form: edges scale with tasks
            row["edges"] = int(round(ea * n + eb))
            row["edges_estimated"] = True
        row["runtime_bytes"] = int(round(a * n + b * row["edges"] + c))
        row["bytes_per_task"] = round(row["runtime_bytes"] / max(n, 1), 1)
    return {"bytes_per_task": round(a, 2), "bytes_per_edge": round(b, 2), "bytes_fixed": round(c),
            "fitted_on": sorted(x["value"] for x in samples)}


def row_tasks(row: dict, adaptive: bool) -> int:
    """Tasks of the graph the row's edges and memory describe."""
    return row["tasks"] if adaptive else row["tasks_no_adaptive"]


def _human_bytes(n: float) -> str:
    """Decimal units up to PB (the 2**31 - 1 token rows reach petabytes)."""
    for unit, k in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f}{unit}"
    return f"{int(n)}B"


def _human_seq(s: int) -> str:
    """1024 -> 1K; lengths that are not multiples of 1024 as they are."""
    return f"{s // 1024}K" if s % 1024 == 0 else str(s)


def _human_seqs(values) -> str:
    return ", ".join(_human_seq(v) for v in values)


#: column labels of the programs' own byte counts (:meth:`pto.program.Estimation.estimate_columns`)
_EXTRA_LABELS = {"kv_cache_bytes": "KV cache", "weight_bytes": "Weights", "step_read_bytes": "Read/step"}


def describe_columns(row: dict) -> str | None:
    """The program's own byte counts of ``row`` (:meth:`pto.program.Estimation.estimate_columns`)
    as one line, e.g. "Weights 98.3MB, KV cache 3.1MB, Read/step 101.4MB" (None: it has none)."""
    parts = [f"{label} {_human_bytes(row[k])}" for k, label in _EXTRA_LABELS.items() if k in row]
    return ", ".join(parts) or None


def format_table(res: dict) -> str:
    """The text table of ``pto estimate``. Tasks (adaptive tiles) and No-Opt (none) are both
    always shown; a header line says which of the two graphs Tiles, Edges, Build, Memory and
    B/task describe, since ``--no-adaptive`` switches them but not the Tasks column."""
    setting = [f"{res['program']} config={res['config']} dtype={res['dtype']} target={res['target']}"]
    if res.get("tp", 1) > 1:
        setting.append(f"tp={res['tp']} (one rank's graph and tensors)")
    setting += [f"{k}={res[k]}" for k in res["options"]]
    graph = "with" if res["adaptive"] else "WITHOUT"
    unbuilt = "closed form" if res.get("closed_form", True) else "counted"
    note = (f"Tasks: with adaptive tiles; No-Opt: without; Tiles, Edges, Build, Tasks/ms, Memory (the runtime's) and "
            f"B/task: the graph {graph} adaptive tiles; Tensors: what a run allocates; Source: measured (the graph "
            f"built) or {unbuilt}")
    swept = res.get("swept", "seq")
    cols = ["SeqLen" if swept == "seq" else swept, "Tiles", "Tasks", "No-Opt", "Saved", "Edges", "Build", "Tasks/ms",
            "Memory", "B/task", "Tensors", "Source"]
    extra = [k for k in res["rows"][0] if k.endswith("_bytes") and k not in ("tensor_bytes", "runtime_bytes")]
    cols += [_EXTRA_LABELS.get(k, k) for k in extra]
    lines = [" ".join(setting), note, " | ".join(cols)]
    for r in res["rows"]:
        build = f"{r['build_ms']:.2f}ms" if r.get("build_ms") is not None else "-"
        tpm = f"{r['tasks_per_ms']:,}" if r.get("tasks_per_ms") else "-"
        lines.append(" | ".join([
            _human_seq(r[swept]), str(r.get("row_tiles", "-")), f"{r['tasks']:,}", f"{r['tasks_no_adaptive']:,}",
            f"{100 * r['saved']:.0f}%", f"{r['edges']:,}", build, tpm, _human_bytes(r["runtime_bytes"]),
            f"{r['bytes_per_task']:.0f}", _human_bytes(r["tensor_bytes"]), "measured" if r["measured"] else unbuilt,
            *(_human_bytes(r[k]) for k in extra)]))
    m = res["memory_model"]
    lines.append(f"memory model: {m['bytes_per_task']} B/task + {m['bytes_per_edge']} B/edge + "
                 f"{m['bytes_fixed']} B ({_fitted_on(m)})")
    if any(r.get("edges_estimated") for r in res["rows"]):
        lines.append("edges of the counted rows: scaled from the measured graphs")
    return "\n".join(lines)


def _fitted_on(model: dict) -> str:
    """Which builds the memory model was fitted on: the rows' own, and those it made for the fit
    at other lengths (a user who asked for 1K and 16K would not know where an 8K came from)."""
    extra = model.get("calibration", [])
    own = _human_seqs(x for x in model["fitted_on"] if x not in extra)
    if not extra:
        return f"fitted on the builds of the rows at {own}"
    if not own:
        return f"fitted on builds of its own at {_human_seqs(extra)}, no row being small enough to build"
    return f"fitted on the builds of the rows at {own} and builds of its own at {_human_seqs(extra)}"


def _label(res: dict) -> str:
    """The settings of a result in a line (options left empty, e.g. no --weights, left out)."""
    return ", ".join([res["target"], res["dtype"]] + [f"{k}={res[k]}" for k in res["options"] if res[k] != ""])


def plot(res: dict, path: str, baselines: list[tuple[Baseline, dict]] = ()):
    """Tasks and runtime memory against sequence length (log-log): this setting ("ours"), and
    each baseline (the program's :meth:`~pto.program.Estimation.estimate_baselines`, estimated at
    the same lengths) with its published rows as markers; every setting spelled out in the
    title (:mod:`pto.viz.plotting`). Returns the figure."""
    from pto.viz.plotting import figure, finish, log_axes

    check_plot_path(path)  # callers that did not pass plot_path to estimate()
    name = res.get("swept", "seq")
    seqs = [r[name] for r in res["rows"]]
    fig, (ax1, ax2) = figure(2)
    # one color per setting in both panels; without adaptive tiles hollow and larger, so that where
    # both graphs have the same tasks (tiles that cannot merge) both lines still show
    tasks, plain = [r["tasks"] for r in res["rows"]], [r["tasks_no_adaptive"] for r in res["rows"]]
    same = " (the same tasks)" if tasks == plain else ""
    ax1.plot(seqs, tasks, "o-", color="C0", label="ours, adaptive tiles")
    ax1.plot(seqs, plain, "D--", color="C0", markerfacecolor="none", markersize=9,
             label=f"ours, no adaptive tiles{same}")
    ax2.plot(seqs, [r["runtime_bytes"] for r in res["rows"]], "o-", color="C0", label="ours")
    details = [f"ours: {_label(res)}"]
    for i, (b, bres) in enumerate(baselines, start=1):
        ax1.plot(seqs, [r["tasks"] for r in bres["rows"]], "s-", color=f"C{i}", label=f"{b.label}, ours")
        ax2.plot(seqs, [r["runtime_bytes"] for r in bres["rows"]], "s-", color=f"C{i}", label=f"{b.label}, our runtime")
        details.append(f"{b.label}: {_label(bres)}")
        if b.other_bytes_per_task:
            runtime, per = b.other_bytes_per_task
            ax2.plot(seqs, [r["tasks"] * per for r in bres["rows"]], "s:", color=f"C{i}",
                     label=f"{b.label}, {runtime}")
            details.append(f"{b.label}, {runtime}: {per:,.0f} B/task")
        if b.published:
            pts = sorted(b.published.items())
            ax1.plot([s for s, _ in pts], [v for _, v in pts], "kx", label=f"{b.label}, published")
    xlabel = "sequence length" if name == "seq" else name
    log_axes(ax1, "tasks", "tasks", xlabel)
    log_axes(ax2, "runtime memory", "bytes", xlabel)
    rank = f", one rank of tp={res['tp']}" if res.get("tp", 1) > 1 else ""
    title = f"{res['program']} (config {res['config']}{rank}): the task graph against {xlabel}"
    return finish(fig, [ax1, ax2], title, details, path)
