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

import time

import numpy as np

from pto import programs
from pto.errors import ExecutionError, UsageError
from pto.graph import CompiledProgram
from pto.ir.dtypes import dtype_of
from pto.programs import RunOptions

#: graphs up to this many tasks are built for real
MAX_BUILD_TASKS = 2_000_000
#: calibration builds of the memory model stay below this many tasks
CALIBRATION_TASKS = 200_000
#: the task metadata of the reference runtime (seed 004): 2,864 bytes per task
SEED_BYTES_PER_TASK = 2864
#: the seed's published rows (tasks with and without adaptive tiles), for the plot
SEED_ROWS = {1024: (1024, 3584), 2048: (3584, 13312), 4096: (13312, 51200), 8192: (51200, 200704),
             16384: (200704, 794624)}
SEED_SETTING = dict(target="ascend910b", dtype="f32", causal=False, attention="split")


def default_target() -> str:
    """The GPU's target when one is visible, else the H100's (estimates are for the GPU)."""
    from pto.device import cuda_available, device_info
    from pto.passes.tiling import target_for_device

    return target_for_device(device_info("cuda")).name if cuda_available() else "cuda_h100"


class _Counter:
    """Counts of one program setting: closed form when the program has one, else count-only
    builds of the generated C."""

    def __init__(self, prog, opts: RunOptions, module):
        self.prog = prog
        self.opts = opts
        self.module = module
        self.has_closed_form = hasattr(prog, "closed_form_counts")

    def counts(self, seq: int, adaptive: bool) -> dict | None:
        if self.has_closed_form:
            return self.prog.closed_form_counts(self.opts, seq, adaptive)
        g = CompiledProgram.get(self.module, adaptive).build_graph(self.prog.scalars(self.opts, seq),
                                                                  count_only=True)
        try:
            return {"tasks": g.tasks}
        finally:
            g.close()


def _build(module, prog, opts, seq: int, adaptive: bool) -> dict:
    cp = CompiledProgram.get(module, adaptive)
    scalars = prog.scalars(opts, seq)
    t0 = time.perf_counter()
    g = cp.build_graph(scalars)
    wall = (time.perf_counter() - t0) * 1e3
    try:
        st = g.stats
        return {"tasks": g.tasks, "edges": g.edges, "bytes": int(st["bytes_peak"]),
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
    A = np.array([[s["tasks"], 1.0] for s in samples], dtype=np.float64)
    y = np.array([s["edges"] for s in samples], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(coef[0]), float(coef[1])


def estimate(program: str, seqs: list[int], config: str = "7b", dtype: str = "bf16",
             target: str | None = None, attention: str = "fused", causal: bool = True,
             adaptive: bool = True, max_build_tasks: int = MAX_BUILD_TASKS) -> dict:
    """Rows of task counts, edges and runtime memory for each sequence length (JSON-able)."""
    prog = programs.get(program)
    if not seqs:
        raise UsageError("estimate needs at least one sequence length")
    tname = target or default_target()
    from pto.passes.tiling import get_target

    get_target(tname)
    opts = RunOptions(config=config, dtype=dtype_of(dtype), causal=causal, attention=attention, target=tname)
    prog.check_options(opts)
    module = prog.build(opts)
    counter = _Counter(prog, opts, module)
    rows, samples = [], []
    for seq in sorted(set(seqs)):
        ca, cn = counter.counts(seq, True), counter.counts(seq, False)
        mine = ca if adaptive else cn
        row = {"seq": seq, "tasks": ca["tasks"], "tasks_no_adaptive": cn["tasks"],
               "saved": round(1.0 - ca["tasks"] / cn["tasks"], 4) if cn["tasks"] else 0.0}
        if "row_tiles" in mine:
            row["row_tiles"] = mine["row_tiles"]
        if mine["tasks"] <= max_build_tasks:
            b = _build(module, prog, opts, seq, adaptive)
            if b["tasks"] != mine["tasks"] or ("edges" in mine and b["edges"] != mine["edges"]):
                raise ExecutionError(f"{program} at seq {seq}: the closed form gives {mine} but the "
                                     f"built graph has {b['tasks']} tasks and {b['edges']} edges")
            samples.append(b)
            row.update(edges=b["edges"], runtime_bytes=b["bytes"], build_ms=b["build_ms"], measured=True,
                       tasks_per_ms=round(b["tasks"] / b["build_ms"]) if b["build_ms"] > 0 else None)
        else:
            row.update(edges=mine.get("edges"), measured=False)
        rows.append(row)
    # calibrate the memory model on small builds when fewer than three sizes were measured
    cal = 64
    while len(samples) < 3 and cal <= 1 << 16:
        c = counter.counts(cal, adaptive)
        if c["tasks"] > CALIBRATION_TASKS:
            break
        if all(s["tasks"] != c["tasks"] for s in samples):
            samples.append(_build(module, prog, opts, cal, adaptive))
        cal *= 2
    if not samples:
        raise ExecutionError(f"{program}: no graph is small enough to build for the memory model")
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
    return {
        "program": prog.name, "config": config, "dtype": opts.dtype.short, "target": tname,
        "attention": attention, "causal": causal, "adaptive": adaptive,
        "memory_model": {"bytes_per_task": round(a, 2), "bytes_per_edge": round(b, 2), "bytes_fixed": round(c)},
        "rows": rows,
    }


def row_tasks(row: dict, adaptive: bool) -> int:
    return row["tasks"] if adaptive else row["tasks_no_adaptive"]


def _human_bytes(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f}{unit}"
    return f"{int(n)}B"


def _human_seq(s: int) -> str:
    return f"{s // 1024}K" if s % 1024 == 0 else str(s)


def format_table(res: dict) -> str:
    head = (f"{res['program']} config={res['config']} dtype={res['dtype']} target={res['target']} "
            f"attention={res['attention']} {'causal' if res['causal'] else 'non-causal'}"
            f"{'' if res['adaptive'] else ' (no adaptive tiles)'}")
    cols = ["SeqLen", "Tiles", "Tasks", "No-Opt", "Saved", "Edges", "Build", "Tasks/ms", "Memory", "B/task", ""]
    lines = [head, " | ".join(cols)]
    for r in res["rows"]:
        build = f"{r['build_ms']:.2f}ms" if r.get("build_ms") is not None else "-"
        tpm = f"{r['tasks_per_ms']:,}" if r.get("tasks_per_ms") else "-"
        lines.append(" | ".join([
            _human_seq(r["seq"]), str(r.get("row_tiles", "-")), f"{r['tasks']:,}", f"{r['tasks_no_adaptive']:,}",
            f"{100 * r['saved']:.0f}%", f"{r['edges']:,}", build, tpm, _human_bytes(r["runtime_bytes"]),
            f"{r['bytes_per_task']:.0f}", "measured" if r["measured"] else "closed form",
        ]))
    m = res["memory_model"]
    lines.append(f"memory model: {m['bytes_per_task']} B/task + {m['bytes_per_edge']} B/edge + "
                 f"{m['bytes_fixed']} B (fitted on measured builds)")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    """Tasks and runtime memory against sequence length (log-log): this setting against the
    seed's setting, with the seed's published rows as markers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    seqs = [r["seq"] for r in res["rows"]]
    seed = estimate(res["program"], seqs, config=res["config"], **SEED_SETTING) \
        if res["program"] == "llama7b" else None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    label = f"ours ({res['target']}, {res['dtype']}, {res['attention']}, {'causal' if res['causal'] else 'non-causal'})"
    ax1.plot(seqs, [r["tasks"] for r in res["rows"]], "o-", label=label + ", adaptive")
    ax1.plot(seqs, [r["tasks_no_adaptive"] for r in res["rows"]], "o--", label=label + ", no adaptive")
    ax2.plot(seqs, [r["runtime_bytes"] for r in res["rows"]], "o-", label=label)
    if seed is not None:
        ax1.plot(seqs, [r["tasks"] for r in seed["rows"]], "s-", label="seed setting (ascend910b f32 split), ours")
        ax2.plot(seqs, [r["runtime_bytes"] for r in seed["rows"]], "s-", label="seed setting, our runtime")
        ax2.plot(seqs, [r["tasks"] * SEED_BYTES_PER_TASK for r in seed["rows"]], "s:",
                 label="seed setting, seed runtime (2,864 B/task)")
        pts = sorted(SEED_ROWS.items())
        ax1.plot([s for s, _ in pts], [v[0] for _, v in pts], "kx", label="seed 004 table (adaptive)")
    for ax, title in ((ax1, "tasks"), (ax2, "runtime memory (bytes)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
