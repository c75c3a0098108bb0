"""The schedule checker: from an execution trace, prove that an executor kept every dependency.

Two properties of the trace against the graph (the runtime's export: every task's regions and
their kinds, and the edges):

- **order**: every task started after each of its predecessors ended;
- **exclusion**: no two tasks whose regions conflict (the same tensor, overlapping rectangles,
  at least one of them writing) ran at overlapping times;

and every task ran. A task's time is its launch's (the wave executor's :class:`LaunchRecord`:
host clock around a synchronized launch, so the tasks of one launch all overlap) or the span of
its work items (the persistent executor's :class:`ItemRecord`: the GPU's global timer, or a
logical clock under the interpreter). The exclusion check sweeps each tensor's accesses in start
order against those that start before they end; the order check is one comparison per edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pto.errors import ExecutionError

KINDS = {0: "reads", 1: "writes", 2: "updates"}


@dataclass
class ScheduleReport:
    """What :func:`check_schedule` checked and what it found (the first ``limit`` violations,
    each one line; ``found`` counts them all)."""

    tasks: int
    dependencies: int
    pairs: int  # pairs of accesses to one tensor that ran at overlapping times (compared)
    found: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.found == 0

    def to_json(self) -> dict:
        return {"ok": self.ok, "tasks": self.tasks, "dependencies": self.dependencies, "concurrent_pairs": self.pairs,
                "violations": self.found, "first": self.violations[:5]}


def task_intervals(export, records) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per export row: (start, end, times it ran) from launch or item records."""
    n = export.n_tasks
    start = np.full(n, np.iinfo(np.int64).max, np.int64)
    end = np.full(n, np.iinfo(np.int64).min, np.int64)
    runs = np.zeros(n, np.int64)
    for r in records:
        if hasattr(r, "tasks"):  # one launch of many tasks
            rows = np.asarray(r.tasks, np.int64) - export.first_task
            np.add.at(runs, rows, 1)
        else:  # one work item of one task
            rows = np.array([r.task - export.first_task])
            if r.p == 0:
                runs[rows] += 1
        start[rows] = np.minimum(start[rows], r.start_ns)
        end[rows] = np.maximum(end[rows], r.end_ns)
    return start, end, runs


def check_schedule(export, records, limit: int = 20) -> ScheduleReport:
    """Check a trace (``records`` of one run) against the graph ``export`` (see the module
    docstring)."""
    ex = export
    n = ex.n_tasks
    names = [ex.funcs[int(f)] for f in ex.func]
    tensor_names = [t[0] for t in ex.tensors]
    start, end, runs = task_intervals(ex, records)
    out: list[str] = []
    found = 0

    def task(row) -> str:
        return f"task {int(row) + ex.first_task} (`{names[int(row)]}`)"

    for row in np.nonzero(runs != 1)[0]:
        found += 1
        if len(out) < limit:
            out.append(f"{task(row)} ran {int(runs[row])} times, not once")
    edges = ex.edges().astype(np.int64) - ex.first_task
    ran = runs > 0
    if len(edges):
        e = edges[ran[edges[:, 0]] & ran[edges[:, 1]]]
        late = np.nonzero(start[e[:, 1]] < end[e[:, 0]])[0]
        found += len(late)
        for p, s in e[late[:max(0, limit - len(out))]]:
            out.append(f"{task(s)} started at {start[s]}, before its predecessor {task(p)} ended at {end[p]}")
    # exclusion: every memref access, by tensor, swept in start order
    kinds = ex.arg_kind
    mem = np.nonzero(kinds != 3)[0]
    owner = np.searchsorted(ex.arg_ptr, mem, side="right") - 1
    keep = ran[owner]
    mem, owner = mem[keep], owner[keep]
    pairs = 0
    for tid in np.unique(ex.arg_tensor[mem]):
        sel = ex.arg_tensor[mem] == tid
        a, t = mem[sel], owner[sel]
        order = np.argsort(start[t], kind="stable")
        a, t = a[order], t[order]
        s0, e0 = start[t], end[t]
        reg = ex.arg_region[a]
        r0, c0, r1, c1 = reg[:, 0], reg[:, 1], reg[:, 0] + reg[:, 2], reg[:, 1] + reg[:, 3]
        writes = kinds[a] != 0
        hi = np.searchsorted(s0, e0, side="left")  # accesses j > i with start_j < end_i
        for i in np.nonzero(hi > np.arange(len(a)) + 1)[0]:
            j = np.arange(i + 1, hi[i])
            pairs += len(j)
            clash = (t[j] != t[i]) & (writes[j] | writes[i]) & (r0[j] < r1[i]) & (r0[i] < r1[j]) \
                & (c0[j] < c1[i]) & (c0[i] < c1[j]) & (s0[i] < e0[j])
            for jj in j[clash]:
                found += 1
                if len(out) < limit:
                    out.append(f"{task(t[i])} and {task(t[jj])} ran at overlapping times ([{s0[i]}, {e0[i]}] and "
                               f"[{s0[jj]}, {e0[jj]}]) but conflict on `{tensor_names[tid]}`: the first "
                               f"{KINDS[int(kinds[a[i]])]} rows {r0[i]}..{r1[i] - 1} cols {c0[i]}..{c1[i] - 1}, the "
                               f"second {KINDS[int(kinds[a[jj]])]} rows {r0[jj]}..{r1[jj] - 1} cols "
                               f"{c0[jj]}..{c1[jj] - 1}")
    return ScheduleReport(n, len(edges), pairs, found, out)


def verify_schedule(export, records) -> ScheduleReport:
    """:func:`check_schedule`, raising ExecutionError with the first violation (and how many
    there are) when the schedule broke a dependency."""
    rep = check_schedule(export, records)
    if not rep.ok:
        more = f" ({rep.found - 1:,} more)" if rep.found > 1 else ""
        raise ExecutionError(f"schedule check: {rep.violations[0]}{more}")
    return rep


__all__ = ["ScheduleReport", "check_schedule", "verify_schedule", "task_intervals"]
