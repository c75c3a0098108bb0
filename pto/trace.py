"""Execution traces in the Chrome/Perfetto trace-event JSON format (``pto run ... --trace FILE``).

The file is the "JSON Object Format" that chrome://tracing, ui.perfetto.dev and Perfetto's
trace processor import: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.

Layout (one process):

- lane (tid) 0, "batches": one complete event per batch the executor prepared and ran
  (``batch: function ×n``; a batch may be one or a few device launches, which is what
  ``pto run --json`` counts as ``launches``);
- lanes 1, 2, ...: "task slot k": a launch runs its batch of tasks at once on one stream, so the
  k-th task of every launch goes to lane k + 1 and the tasks of one launch stack up visibly
  instead of hiding behind each other. Each task is a complete event named by its InCore
  function, with the task id, variant, wave and launch index as args;
- flow arrows (``s``/``f`` pairs, ``bp: e``) from each predecessor task to its successor, the
  first ``max_flows`` dependencies in predecessor order (a trace with a million arrows does not
  load); ``otherData`` and the process label say how many were drawn.

Times come from the executor's records: host ``perf_counter_ns`` around launches that are
synchronized for tracing, so a task's slice is its launch's interval. They are written in
microseconds relative to the first launch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PID = 1
LAUNCH_TID = 0
MAX_FLOWS = 5000
# flow events bind to a slice by (pid, tid, ts, cat) in Chrome's viewer: share the tasks' category
TASK_CAT = "task"


def _us(ns: int, t0: int) -> float:
    """Nanoseconds since ``t0`` as microseconds (ns precision kept)."""
    return round((ns - t0) / 1000.0, 3)


def _function_names(graph) -> dict[str, str]:
    """Variant name -> InCore function name, from the graph (empty without one)."""
    if graph is None:
        return {}
    return {v.variant_name: v.name for v in graph.variant_of_func_id().values()}


def _edges(graph) -> np.ndarray:
    """All (predecessor, successor) task-id pairs of the graph, in predecessor order."""
    if graph is None:
        return np.zeros((0, 2), np.int64)
    return graph.runtime.export().edges().astype(np.int64)


def _program_name(graph) -> str:
    try:
        return str(graph.program.corch.name)
    except AttributeError:
        return "pto"


def trace_events(records: Sequence, graph=None, max_flows: int = MAX_FLOWS) -> dict[str, Any]:
    """The trace as a JSON-able dict (see the module docstring).

    Args:
        records: ``pto.executor.LaunchRecord`` s (wave, func, tasks, start_ns, end_ns).
        graph: the executed ``pto.graph.Graph`` (function names and dependency edges); None
            gives a trace without arrows, named by variant.
        max_flows: at most this many dependency arrows.
    """
    names = _function_names(graph)
    recs = sorted(records, key=lambda r: (r.start_ns, r.end_ns))
    t0 = recs[0].start_ns if recs else 0
    events: list[dict[str, Any]] = []
    # where each task's slice is, for the flow arrows: task id -> (tid, ts)
    slot: dict[int, tuple[int, float]] = {}
    width = 0
    for li, r in enumerate(recs):
        ts, dur = _us(r.start_ns, t0), max(_us(r.end_ns, t0) - _us(r.start_ns, t0), 0.0)
        func = names.get(r.func, r.func.split("__", 1)[0])
        tasks = [int(t) for t in np.asarray(r.tasks).reshape(-1)]
        width = max(width, len(tasks))
        events.append({"name": f"batch: {func} ×{len(tasks)}", "cat": "launch", "ph": "X", "pid": PID,
                       "tid": LAUNCH_TID, "ts": ts, "dur": dur,
                       "args": {"launch": li, "wave": int(r.wave), "variant": r.func, "tasks": len(tasks),
                                "first_task": tasks[0] if tasks else -1}})
        for k, task in enumerate(tasks):
            events.append({"name": func, "cat": TASK_CAT, "ph": "X", "pid": PID, "tid": k + 1, "ts": ts,
                           "dur": dur, "args": {"task": task, "variant": r.func, "wave": int(r.wave),
                                                "launch": li, "batch_index": k, "batch_size": len(tasks)}})
            slot[task] = (k + 1, ts)

    edges = _edges(graph)
    n_flows = 0
    total = 0
    for pred, succ in edges.tolist():
        a, b = slot.get(pred), slot.get(succ)
        if a is None or b is None:  # a task that was not executed (or not recorded) has no slice
            continue
        total += 1
        if n_flows >= max_flows:
            continue
        # "s" binds to the predecessor's slice, "f" with bp=e to the successor's slice (both
        # at the slice start, the point every viewer resolves to exactly that slice)
        events.append({"name": "dep", "cat": TASK_CAT, "ph": "s", "id": n_flows, "pid": PID,
                       "tid": a[0], "ts": a[1]})
        events.append({"name": "dep", "cat": TASK_CAT, "ph": "f", "bp": "e", "id": n_flows, "pid": PID,
                       "tid": b[0], "ts": b[1]})
        n_flows += 1

    prog = _program_name(graph)
    capped = total > n_flows
    arrows = (f"first {n_flows:,} of {total:,} dependency arrows" if capped
              else f"{n_flows:,} dependency arrows")
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": LAUNCH_TID,
         "args": {"name": f"pto run {prog}"}},
        {"name": "process_labels", "ph": "M", "pid": PID, "tid": LAUNCH_TID,
         "args": {"labels": f"{len(slot):,} tasks in {len(recs):,} batches; {arrows}"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": LAUNCH_TID, "args": {"name": "batches"}},
        {"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": LAUNCH_TID, "args": {"sort_index": 0}},
    ]
    for k in range(width):
        meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": k + 1,
                     "args": {"name": f"task slot {k}"}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": k + 1,
                     "args": {"sort_index": k + 1}})
    other = {"program": prog, "tasks": len(slot), "batches": len(recs), "lanes": width + 1,
             "dependencies": total, "flows": n_flows, "flows_capped": capped, "max_flows": max_flows,
             "clock": "host perf_counter_ns around synchronized launches; a task's slice is its launch's"}
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: str | Path, records: Sequence, graph=None, max_flows: int = MAX_FLOWS) -> str:
    """Write the trace of ``records`` (and ``graph``'s dependencies) to ``path``; returns it."""
    trace = trace_events(records, graph, max_flows)
    with open(path, "w", encoding="utf-8") as f:
        # compact separators: a 200k-task trace is tens of MB either way, a third less this way
        json.dump(trace, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    return str(path)


__all__ = ["MAX_FLOWS", "trace_events", "write_trace"]
