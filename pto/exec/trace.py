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
  load); ``otherData`` and the process label say how many were drawn, and :func:`write_trace`
  returns the counts (:class:`TraceInfo`) so that the caller can say so too (``flow_note``).

Times come from the executor's records: host ``perf_counter_ns`` around launches that are
synchronized for tracing, so a task's slice is its launch's interval. They are written in
microseconds relative to the first launch.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pto.errors import UsageError
from pto.ir.names import base_name

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


def _edges(graph, edges) -> np.ndarray:
    """All (predecessor, successor) task-id pairs, given or the graph's, in predecessor order."""
    if edges is not None:
        return np.asarray(edges, np.int64).reshape(-1, 2)
    if graph is None:
        return np.zeros((0, 2), np.int64)
    return graph.runtime.export().edges().astype(np.int64)


def _program_name(graph) -> str:
    try:
        return str(graph.program.corch.name)
    except AttributeError:
        return "pto"


def flow_note(flows: int, dependencies: int) -> str | None:
    """The line to tell the user when the arrows were capped, e.g. ``trace: first 5,000 of
    21,696 dependency arrows drawn``; None when every dependency has its arrow."""
    if flows >= dependencies:
        return None
    return f"trace: first {flows:,} of {dependencies:,} dependency arrows drawn"


@dataclass(frozen=True)
class TraceInfo:
    """What :func:`write_trace` wrote (the numbers of its ``otherData``)."""

    path: str
    tasks: int
    batches: int
    dependencies: int   # dependencies between executed tasks
    flows: int          # arrows drawn: the first ``max_flows`` dependencies
    max_flows: int

    @property
    def capped(self) -> bool:
        return self.flows < self.dependencies

    @property
    def note(self) -> str | None:
        """``trace: first 5,000 of 21,696 dependency arrows drawn`` when capped, else None."""
        return flow_note(self.flows, self.dependencies)


def _prepare(records: Sequence, graph, max_flows: int) -> tuple[dict[str, str], list, int]:
    """Check ``max_flows``; (variant -> function names, records by start, the first start)."""
    if isinstance(max_flows, bool) or not isinstance(max_flows, int) or max_flows < 0:
        raise UsageError(f"max_flows must be a non-negative integer, got {max_flows!r}")
    recs = sorted(records, key=lambda r: (r.start_ns, r.end_ns))
    return _function_names(graph), recs, (recs[0].start_ns if recs else 0)


def _flows(pairs: np.ndarray, src: dict, dst: dict, max_flows: int) -> tuple[list[dict[str, Any]], int, int]:
    """Flow arrows for the dependency ``pairs`` between executed tasks: an ``s`` event at the
    predecessor's slice ``src[pred]`` and an ``f`` event with ``bp: e`` at the successor's slice
    ``dst[succ]`` (each ``(tid, ts, ...)``: a slice's start, the point every viewer resolves to
    exactly that slice), the first ``max_flows`` of them; returns (events, drawn, total)."""
    events: list[dict[str, Any]] = []
    n_flows = total = 0
    for pred, succ in pairs.tolist():
        a, b = src.get(pred), dst.get(succ)
        if a is None or b is None:  # a task that was not executed (or not recorded) has no slice
            continue
        total += 1
        if n_flows >= max_flows:
            continue
        events.append({"name": "dep", "cat": TASK_CAT, "ph": "s", "id": n_flows, "pid": PID, "tid": a[0],
                       "ts": a[1]})
        events.append({"name": "dep", "cat": TASK_CAT, "ph": "f", "bp": "e", "id": n_flows, "pid": PID,
                       "tid": b[0], "ts": b[1]})
        n_flows += 1
    return events, n_flows, total


def trace_events(records: Sequence, graph=None, max_flows: int = MAX_FLOWS, edges=None) -> dict[str, Any]:
    """The trace as a JSON-able dict (see the module docstring).

    Args:
        records: ``pto.exec.LaunchRecord`` s (wave, func, tasks, start_ns, end_ns).
        graph: the executed ``pto.runtime.graph.Graph`` (function names and dependency edges); None
            gives a trace named by variant, with arrows only for ``edges``.
        max_flows: at most this many dependency arrows (0 or more).
        edges: (predecessor, successor) task-id pairs in predecessor order, in place of the
            graph's (e.g. ``pto.runtime.dump.read_dump(path).edges()``).
    """
    names, recs, t0 = _prepare(records, graph, max_flows)
    events: list[dict[str, Any]] = []
    # where each task's slice is, for the flow arrows: task id -> (tid, ts)
    slot: dict[int, tuple[int, float]] = {}
    width = 0
    for li, r in enumerate(recs):
        ts, dur = _us(r.start_ns, t0), max(_us(r.end_ns, t0) - _us(r.start_ns, t0), 0.0)
        func = names.get(r.func, base_name(r.func))
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

    flows, n_flows, total = _flows(_edges(graph, edges), slot, slot, max_flows)
    events += flows

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


def item_trace_events(records: Sequence, graph=None, max_flows: int = MAX_FLOWS, edges=None) -> dict[str, Any]:
    """The trace of the persistent executor's work items (``pto.exec.base.ItemRecord``): one
    lane per resident program ("program k"), a slice per item named by its InCore function
    (task, parallel index and variant in args), and flow arrows from the last item of each
    predecessor task to the first item of its successor, so the schedule and the waits show.
    Times are the GPU's global timer (ticks of a logical clock under the interpreter), in
    microseconds from the first item."""
    names, recs, t0 = _prepare(records, graph, max_flows)
    events: list[dict[str, Any]] = []
    first: dict[int, tuple[int, float]] = {}
    last: dict[int, tuple[int, float, float]] = {}
    lanes = set()
    for r in recs:
        ts, end = _us(r.start_ns, t0), _us(r.end_ns, t0)
        tid = r.program + 1
        lanes.add(tid)
        events.append({"name": names.get(r.func, r.func), "cat": TASK_CAT, "ph": "X", "pid": PID, "tid": tid,
                       "ts": ts, "dur": max(end - ts, 0.0), "args": {"task": r.task, "p": r.p, "variant": r.func}})
        first.setdefault(r.task, (tid, ts))
        if r.task not in last or end >= last[r.task][2]:
            last[r.task] = (tid, ts, end)
    flows, n_flows, total = _flows(_edges(graph, edges), last, first, max_flows)
    events += flows
    prog = _program_name(graph)
    capped = total > n_flows
    arrows = f"first {n_flows:,} of {total:,} dependency arrows" if capped else f"{n_flows:,} dependency arrows"
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": f"pto run {prog} (persistent)"}},
        {"name": "process_labels", "ph": "M", "pid": PID, "tid": 0,
         "args": {"labels": f"{len(recs):,} work items of {len(first):,} tasks on {len(lanes)} programs; {arrows}"}},
    ]
    for tid in sorted(lanes):
        meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": f"program {tid - 1}"}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    other = {"program": prog, "tasks": len(first), "items": len(recs), "batches": 0, "lanes": len(lanes),
             "dependencies": total, "flows": n_flows, "flows_capped": capped, "max_flows": max_flows,
             "clock": "the GPU's global timer per work item (a logical clock under the Triton interpreter)"}
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def traced_critical_path(records: Sequence, edges: np.ndarray, unit: float = 1e3) -> dict[str, Any]:
    """Where the persistent executor's traced run spent its time along the critical path: from
    the task that ended last back through, at each step, the predecessor that ended last (the
    one it waited for). Per task on the path: the wait (its first item's start after that
    predecessor's end: the release, the poll that sees it, the dispatch), its item (the median
    duration of its items: the body after the wait) and its spread (the rest of its span, first
    start to last end: items that ran after others, behind other work on their programs).
    Where the predecessor ran in an earlier launch (a segment of a split plan) the gap is
    ``launch``, not a wait. ``edges``: (predecessor, successor) task ids; ``unit``: record ticks
    per reported unit (1e3: ns to us). The sums, and per InCore variant on the path its count,
    its sums, and its tasks' mean items and rounds (the most items of a task one program ran: a
    task of 896 items on 264 programs runs four rounds on some, three on the rest, and its span
    is the four's)."""
    by_task: dict[int, list[tuple[int, int]]] = {}
    func: dict[int, str] = {}
    segment: dict[int, int] = {}
    ran: dict[int, Counter] = {}  # task -> the items each program ran of it
    for r in records:
        by_task.setdefault(r.task, []).append((r.start_ns, r.end_ns))
        func[r.task] = r.func
        segment[r.task] = r.segment
        ran.setdefault(r.task, Counter())[r.program] += 1
    if not by_task:
        return {"tasks": 0, "total": 0.0, "wait": 0.0, "item": 0.0, "spread": 0.0, "launch": 0.0, "by_function": {}}
    first = {t: min(s for s, _ in v) for t, v in by_task.items()}
    last = {t: max(e for _, e in v) for t, v in by_task.items()}
    preds: dict[int, list[int]] = {}
    for a, b in np.asarray(edges, np.int64).reshape(-1, 2).tolist():
        if a in last and b in last:
            preds.setdefault(b, []).append(a)
    t = max(last, key=lambda k: (last[k], k))
    end = last[t]
    sums = {"wait": 0.0, "item": 0.0, "spread": 0.0, "launch": 0.0}
    by_function: dict[str, dict[str, float]] = {}
    n = 0
    while True:
        n += 1
        p = max(preds.get(t, ()), key=lambda k: (last[k], k), default=None)
        wait = max(first[t] - last[p], 0) if p is not None else 0
        if p is not None and segment[p] != segment[t]:  # the launch order, not a counter: the
            sums["launch"] += wait / unit  # next segment's launch after the last (host time when
            wait = 0  # launched one by one, not in a CUDA graph)
        item = float(np.median([e - s for s, e in by_task[t]]))
        spread = last[t] - first[t] - item
        f = by_function.setdefault(func[t], {"tasks": 0, "wait": 0.0, "item": 0.0, "spread": 0.0, "items": 0.0,
                                              "rounds": 0.0})
        f["tasks"] += 1
        for k, v in (("wait", wait), ("item", item), ("spread", spread)):
            sums[k] += v / unit
            f[k] += v / unit
        f["items"] += len(by_task[t])
        f["rounds"] += max(ran[t].values())
        if p is None:
            break
        t = p
    start = first[t]
    out = {"tasks": n, "total": round((end - start) / unit, 3), **{k: round(v, 3) for k, v in sums.items()}}
    for v in by_function.values():  # (means over the function's tasks on the path)
        v["items"] /= v["tasks"]
        v["rounds"] /= v["tasks"]
    out["by_function"] = {k: {m: (round(x, 3) if m != "tasks" else int(x)) for m, x in v.items()}
                          for k, v in sorted(by_function.items(), key=lambda kv: -(kv[1]["wait"] + kv[1]["item"]
                                                                                     + kv[1]["spread"]))}
    return out


def traced_item_path(records: Sequence, dep_pred: np.ndarray, unit: float = 1e3) -> dict[str, Any]:
    """The critical path of a traced persistent run item by item: from the item that ended last
    back through, at each step, whatever held its start last: the item it waited for that ended
    last (``dep_pred[i]``: the record index of the item whose release was the last its counter
    took, -1 where it waited for nothing), the item before it on its own program, or, for a
    program's first item of a later launch, the previous launch's last item. Each gap is then a
    ``wait`` (a dependency: the release, the poll that sees it), a ``dispatch`` (its program
    was busy until then: the next descriptor, the branch's table loads) or ``launch``; with the
    items' own durations they add up to the path's length. Unlike
    :func:`traced_critical_path`, whose steps are tasks, this follows the dependencies the
    kernel waits on, so an item that starts before its predecessor task's last item ends (data
    dependencies, ``PTO_MK_DEPS=data``) is a wait on the item it did wait for. ``unit``: record
    ticks per reported unit. Per InCore variant on the path: its items and their sums."""
    n = len(records)
    out: dict[str, Any] = {"items": 0, "total": 0.0, "wait": 0.0, "dispatch": 0.0, "item": 0.0, "launch": 0.0,
                           "by_function": {}}
    if not n:
        return out
    start = np.array([r.start_ns for r in records], np.int64)
    end = np.array([r.end_ns for r in records], np.int64)
    seg = np.array([r.segment for r in records], np.int64)
    prog = np.array([r.program for r in records], np.int64)
    dep_pred = np.asarray(dep_pred, np.int64)
    if dep_pred.shape != (n,):
        raise ValueError(f"dep_pred: {dep_pred.shape}, expected ({n},): one entry a record")
    order = np.lexsort((start, prog, seg))
    prev = np.full(n, -1, np.int64)  # the item before it on its program in its launch
    same = (seg[order][1:] == seg[order][:-1]) & (prog[order][1:] == prog[order][:-1])
    prev[order[1:][same]] = order[:-1][same]
    seg_last = {}  # launch -> its item that ended last
    for k in np.unique(seg).tolist():
        idx = np.flatnonzero(seg == k)
        seg_last[k] = int(idx[np.argmax(end[idx])])
    t = int(np.lexsort((np.arange(n), end))[-1])
    last_end = int(end[t])
    by_function: dict[str, dict[str, float]] = {}
    count = 0
    while True:
        count += 1
        f = by_function.setdefault(records[t].func, {"items": 0, "wait": 0.0, "dispatch": 0.0, "item": 0.0})
        f["items"] += 1
        f["item"] += int(end[t] - start[t]) / unit
        out["item"] += int(end[t] - start[t]) / unit
        held = []  # (its end, preference on a tie, what, the record)
        if dep_pred[t] >= 0:
            held.append((int(end[dep_pred[t]]), 2, "wait", int(dep_pred[t])))
        if prev[t] >= 0:
            held.append((int(end[prev[t]]), 1, "dispatch", int(prev[t])))
        elif seg[t] > 0 and (seg[t] - 1) in seg_last:
            held.append((int(end[seg_last[seg[t] - 1]]), 0, "launch", seg_last[seg[t] - 1]))
        if not held:
            break
        when, _, what, p = max(held)
        gap = max(int(start[t]) - when, 0) / unit
        out[what] += gap
        if what != "launch":
            f[what] += gap
        t = p
    out["items"] = count
    out["total"] = (last_end - int(start[t])) / unit
    for k in ("total", "wait", "dispatch", "item", "launch"):
        out[k] = round(float(out[k]), 3)
    out["by_function"] = {k: {m: (round(x, 3) if m != "items" else int(x)) for m, x in v.items()}
                          for k, v in sorted(by_function.items(), key=lambda kv: -(kv[1]["wait"] + kv[1]["item"]
                                                                                     + kv[1]["dispatch"]))}
    return out


def write_trace(path: str | Path, records: Sequence, graph=None, max_flows: int = MAX_FLOWS,
                edges=None) -> TraceInfo:
    """Write the trace of ``records`` (and ``graph``'s or ``edges``' dependencies) to ``path``.

    Returns what was written; its ``note`` is the line to print when the arrows were capped
    (``trace: first 5,000 of 21,696 dependency arrows drawn``)."""
    items = bool(records) and hasattr(records[0], "program")
    trace = (item_trace_events if items else trace_events)(records, graph, max_flows, edges)
    with open(path, "w", encoding="utf-8") as f:
        # compact separators: a 200k-task trace is tens of MB either way, a third less this way
        json.dump(trace, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    o = trace["otherData"]
    return TraceInfo(str(path), o["tasks"], o["batches"], o["dependencies"], o["flows"], o["max_flows"])


__all__ = ["MAX_FLOWS", "TraceInfo", "flow_note", "traced_critical_path", "traced_item_path", "trace_events",
           "write_trace"]
