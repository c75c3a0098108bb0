"""Benchmark of the C runtime's graph build: the LLaMA-shaped synthetic graph, built in C.

    python bench/runtime_build.py [--json] [--repeats 15] [--window 16384] [--tiles 256,512]

For every tile count N (16 N + 3 N^2 tasks), with the whole graph kept (window 0):

- ``build_ms``: median time of a build into a runtime that built the same graph before and
  was ``pto_runtime_reset`` (its memory is reused, as when a serving loop rebuilds a layer's
  graph every step); ``build_ms_min`` the fastest of them;
- ``build_ms_cold``: median time of a build into a fresh runtime: malloc plus first-touch page
  faults of every byte (about 2 us per 4 KiB page on this VM);
- ``tasks_per_ms`` = tasks / build_ms, ``bytes_per_task`` = peak runtime bytes / tasks;
- ``windowed_peak_bytes``: peak bytes of a build through a ``--window`` slot window, where the
  C driver completes every ready task whenever the window is full (single-threaded).

The graph is built by bench/synthetic_llama.c in one C call per build: per-task Python calls
would measure Python. Times are wall-clock around that call. With --json it prints one JSON
object whose top-level keys are the first tile count's numbers, plus ``results`` with one
object per tile count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT))

from pto.cache.cbuild import load_cffi_module  # noqa: E402
from pto.runtime import Runtime, runtime_cdef, runtime_include_dir, runtime_sources  # noqa: E402

BENCH_CDEF = "int bench_llama_build(pto_runtime *rt, int32_t n_tiles, int32_t drain);\n"


def load_bench_module():
    """The runtime plus the synthetic driver, compiled through pto.cache.cbuild."""
    return load_cffi_module("bench_llama", runtime_cdef() + BENCH_CDEF, '#include "pto_runtime.h"\n',
                            sources=[*runtime_sources(), Path(__file__).with_name("synthetic_llama.c")],
                            include_dirs=[runtime_include_dir()])


def timed_build(mod, rt: Runtime, n_tiles: int, drain: bool) -> float:
    """One build of the whole graph into ``rt``; returns seconds."""
    t0 = time.perf_counter()
    status = mod.lib.bench_llama_build(rt.ptr, n_tiles, 1 if drain else 0)
    dt = time.perf_counter() - t0
    rt.api.check(rt.ptr, status)
    return dt


def measure(mod, n_tiles: int, repeats: int, window: int) -> dict:
    """Numbers for one tile count."""
    cold = []
    for _ in range(max(1, repeats // 3)):
        with Runtime(lib=mod) as rt:
            cold.append(timed_build(mod, rt, n_tiles, drain=False))
            stats = rt.stats()
    warm = []
    with Runtime(lib=mod) as rt:
        for _ in range(repeats + 1):
            rt.reset()
            warm.append(timed_build(mod, rt, n_tiles, drain=False))
        warm = warm[1:]  # the first build into this runtime is a cold one
        assert rt.stats()["edges"] == stats["edges"]
    tasks = stats["tasks_submitted"]
    expected = 16 * n_tiles + 3 * n_tiles * n_tiles
    if tasks != expected:
        raise SystemExit(f"N={n_tiles}: built {tasks} tasks, expected {expected}")
    build_ms = statistics.median(warm) * 1e3
    wtimes, wstats = [], None
    for _ in range(max(1, repeats // 5)):
        with Runtime(window=window, lib=mod) as rt:
            wtimes.append(timed_build(mod, rt, n_tiles, drain=True))
            wstats = rt.stats()
    assert wstats is not None and wstats["tasks_completed"] == tasks
    return {
        "n_tiles": n_tiles,
        "tasks": tasks,
        "edges": stats["edges"],
        "build_ms": round(build_ms, 3),
        "build_ms_min": round(min(warm) * 1e3, 3),
        "build_ms_cold": round(statistics.median(cold) * 1e3, 3),
        "tasks_per_ms": round(tasks / build_ms, 1),
        "tasks_per_ms_best": round(tasks / (min(warm) * 1e3), 1),
        "tasks_per_ms_cold": round(tasks / (statistics.median(cold) * 1e3), 1),
        "bytes_peak": stats["bytes_peak"],
        "bytes_per_task": round(stats["bytes_per_task"], 2),
        "map_entries_peak": stats["map_entries_peak"],
        "window": window,
        "windowed_peak_bytes": wstats["bytes_peak"],
        "windowed_build_ms": round(statistics.median(wtimes) * 1e3, 3),
        "windowed_edges": wstats["edges"],
        "windowed_map_entries_peak": wstats["map_entries_peak"],
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--repeats", type=int, default=15, help="warm builds per tile count (median reported)")
    ap.add_argument("--window", type=int, default=16384, help="window of the streamed build")
    ap.add_argument("--tiles", default="256,512", help="comma-separated tile counts N")
    args = ap.parse_args(argv)
    mod = load_bench_module()
    results = [measure(mod, int(n), args.repeats, args.window) for n in args.tiles.split(",")]
    out = dict(results[0])
    out["results"] = results
    out["machine"] = f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}"
    if args.json:
        print(json.dumps(out))
        return 0
    cols = ["n_tiles", "tasks", "edges", "build_ms", "build_ms_min", "build_ms_cold", "tasks_per_ms",
            "bytes_per_task", "windowed_peak_bytes"]
    print(" ".join(f"{c:>19}" for c in cols))
    for r in results:
        print(" ".join(f"{r[c]:>19}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
