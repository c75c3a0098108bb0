"""The persistent executor: the whole task graph runs as one GPU-resident kernel.

The built graph becomes device data (:class:`pto.exec.plan.Plan`): per task its branch, its
table row, its tensors, its work items, its predecessor count and its successors; and a queue of
work items in a topological priority order (:mod:`pto.exec.order`). The backend compiles the plan
into its megakernel (:meth:`Backend.megakernel <pto.backends.base.Backend.megakernel>`; the
Triton backend's, :mod:`pto.backends.triton.megakernel`), launched with as many programs as fit
on the GPU at once; the only waits are the true dependencies. A replay resets the counters on the
device and launches again, so it is captured in a CUDA graph like the wave executor's launches.

The settings' ``split`` (``PTO_MK_SPLIT``) cuts the plan into segments by resource class
(:mod:`pto.exec.segments`): one megakernel per segment, each compiled for its own branches and
launched with as many programs as it allows, one after another on the stream (a replay and its
CUDA graph hold every segment's launch).

On the CPU the kernel runs under the Triton interpreter, which runs the programs one after
another: the first takes every item in queue order, so every wait is already satisfied (the
tests compare it bit for bit with the wave executor).

With ``sentinel=True`` the kernel is rendered with the non-finite sentinel
(:mod:`pto.codegen.triton.scan`): the device records every task's first non-finite input and
output element, the host checks the inputs of the tasks without predecessors before each launch,
and ``flags`` (:class:`pto.exec.sentinel.TaskFlags`) holds the records of the last launch.
Without it the kernel and its arguments are exactly those of a plain run.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pto.backends.base import Backend, capable
from pto.errors import ExecutionError, UsageError
from pto.exec.base import ExecStats, Executor, ItemRecord, Progress
from pto.exec.item_deps import resolve_deps
from pto.exec.plan import (
    Plan,
    make_plan,
    resolve_affinity,
    resolve_early,
    resolve_prefetch_rule,
    resolve_runs,
    resolve_strides,
    runs_auto,
)
from pto.exec.segments import Split, split_plan
from pto.exec.sentinel import TaskFlags, declared_infinities
from pto.exec.trace import traced_critical_path, traced_item_path
from pto.ir.analysis import has_collective


class PersistentExecutor(Executor):
    """Runs a graph as one persistent kernel (see the module docstring). ``settings``: how the
    backend builds it (:meth:`Backend.megakernel_settings <pto.backends.base.Backend.megakernel_settings>`: the
    Triton backend's ``MegakernelSettings``; its ``sentinel`` is this executor's)."""

    name = "persistent"

    def __init__(self, backend: Backend, tensors: dict[str, torch.Tensor], record: bool = False,
                 progress: Progress | None = None, order: str = "list", sentinel: bool = False, settings=None):
        if not capable(backend.name, "megakernel"):
            raise UsageError(f"the persistent executor runs Triton kernels; --backend {backend.name} needs "
                             "--executor waves")
        super().__init__(backend, tensors, record, progress)
        self.order = order
        self.sentinel = sentinel
        self.settings = settings
        self.plan: Plan | None = None  # the whole graph's
        self.split: Split | None = None  # where it is cut
        self.segments: list[Plan] = []  # its launches in order ([plan] uncut)
        self.kernels: list = []  # the backend's compiled megakernel of each segment
        self.flags: TaskFlags | None = None  # the sentinel's records of the last launch

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    @property
    def kernel(self):
        """The compiled megakernel of an uncut plan (None before a run; a split plan has one per
        segment, :attr:`kernels`)."""
        if len(self.kernels) > 1:
            raise ValueError(f"the plan is split into {len(self.kernels)} megakernels: see .kernels")
        return self.kernels[0] if self.kernels else None

    @property
    def programs(self) -> int:
        """The programs of the widest launch."""
        return max(k.programs for k in self.kernels)

    def run(self, graph) -> ExecStats:
        from pto.backends.triton.megakernel import programs_found, resolve_stages, resolve_warps, runs_share
        from pto.machine.target import detect

        t0 = time.perf_counter()
        talking = sorted({fn.name for fn in graph.variants if has_collective(fn)})
        if talking:
            raise UsageError(f"the persistent executor runs no collectives (`{talking[0]}` sums over the ranks "
                             "through torch.distributed); use --executor waves")
        names = list(graph.tensor_ids)
        per_variant = graph.tasks_per_variant()
        groups = {fn.name: self.backend.launch_config(fn, per_variant.get(fn, 1)).get("GROUP", 0)
                  for fn in graph.variants}
        aligned = np.array([self.tensors[n].stride(0) % 16 == 0 and self.tensors[n].data_ptr() % 16 == 0
                            for n in names], bool)
        settings = self.backend.megakernel_settings(
            self.settings, sentinel=self.sentinel,
            ignore=declared_infinities(graph.variants) if self.sentinel else frozenset())
        resolve_stages(settings.stages)  # (bad settings named before the plan is built)
        resolve_warps(settings.warps)
        strides = None
        if resolve_strides(settings.strides) == "constant":
            strides = np.array([self.tensors[n].stride(0) for n in names], np.int64)
        # the list schedule assumes one program per SM (what the megakernels' shared memory allows)
        sms = settings.programs or (detect("cuda", self.device.index or 0).sm_count
                                    if self.device.type == "cuda" else 4)

        def build(share: int, split: str | None, per_sm) -> None:
            """The plan with its runs cut for ``share`` programs a multiprocessor, split as
            ``split`` says, and its segments' kernels (``per_sm``: the settings' unless given)."""
            self.plan = make_plan(graph, names, groups, aligned, programs=sms, order=self.order,
                                  early=resolve_early(settings.early),
                                  flags=self.backend.task_flags, runs=resolve_runs(settings.runs, sms, share),
                                  prefetch=resolve_prefetch_rule(settings.prefetch),
                                  deps=resolve_deps(settings.deps),
                                  affinity=resolve_affinity(settings.affinity), tensor_strides=strides)
            self.split, self.segments = split_plan(self.plan, self.backend, split, settings.stages)
            self.kernels = []
            for k, segment in enumerate(self.segments):
                one = self.backend.megakernel_settings(settings, segment=k, **({"per_sm": per_sm} if per_sm else {}))
                self.kernels.append(self.backend.megakernel(segment, self.tensors, one,
                                                            self.kernels[-1] if self.kernels else None))

        share = runs_share(settings.per_sm)
        build(share, settings.split, None)
        found = programs_found(self.kernels, settings.per_sm, share)
        if found is not None and runs_auto(settings.runs):
            # PTO_PER_SM=more made room for more programs than the runs were cut for: the
            # plan again with runs for them, the same cuts, each kernel at the count it found
            split = self.split
            build(found[0], ",".join(map(str, split.cuts)) or "off", found[1])
            self.split = Split(self.split.cuts, split.reason)
        if self.sentinel:
            self.flags = TaskFlags(graph.runtime.export(), {graph.tensor_ids[n]: self.tensors[n] for n in names},
                                   declared_infinities(graph.variants))
        self._launch(trace=self.record)
        self.check()
        if self.progress is not None:
            self.progress(self.plan.n_tasks, self.plan.n_tasks)
        ms = (time.perf_counter() - t0) * 1e3
        self.records = self.trace_records() if self.record else []
        return ExecStats(self.plan.n_tasks, 0, len(self.kernels), ms, self.records)

    def _launch(self, trace: bool = False) -> None:
        """Launch every segment in turn (``trace``: each records its items' spans)."""
        if self.sentinel:
            self.flags.clear()
        for segment, kernel in zip(self.segments, self.kernels):
            if self.sentinel:
                # the device checks a task's inputs when its last predecessor in the segment
                # releases it; the inputs of the segment's tasks without one are checked here,
                # after the segments before it ran (the scan waits for the stream)
                roots = np.nonzero(segment.tasks & (segment.pending == 0))[0]
                self.flags.scan(roots + self.plan.first_task, writes=False)
            kernel.launch(trace)
            if self.sentinel:
                read, wrote = kernel.sentinel_records()
                inner = segment.pending > 0
                self.flags.read[inner] = read[inner]
                self.flags.wrote[segment.tasks] = wrote[segment.tasks]

    def replay(self) -> None:
        self._launch()

    def check(self) -> None:
        """Raise ExecutionError if a program of any segment gave up waiting (names the task it
        waited on, the first segment's that did), or a segment ended before running its items."""
        gave_up = [(kernel, t) for kernel in self.kernels if (t := kernel.gave_up()) is not None]
        for kernel, _ in gave_up:
            kernel.clear_give_up()  # reported: the next launch starts clean
        if gave_up:
            kernel, t = gave_up[0]
            fn = self.plan.variants[t]
            raise ExecutionError(f"persistent executor: a program waited more than {kernel.max_polls:,} polls "
                                 f"for the predecessors of task {t + self.plan.first_task} (`{fn.variant_name}`); "
                                 "a dependency was never released")
        for k, (segment, kernel) in enumerate(zip(self.segments, self.kernels)):
            what = f" (segment {k} of {len(self.kernels)})" if len(self.kernels) > 1 else ""
            taken = kernel.items_taken()
            if taken < segment.n_items:
                raise ExecutionError(f"persistent executor: the kernel{what} ended before taking every work item")
            if kernel.dispatch == "static" and taken != segment.n_items:  # (each program counts its own)
                raise ExecutionError(f"persistent executor: the programs{what} ran {taken:,} items of "
                                     f"{segment.n_items:,}")

    def trace_records(self) -> list[ItemRecord]:
        """One record per work item of the last traced run, segment by segment."""
        self.sync()
        out = []
        for k, (segment, kernel) in enumerate(zip(self.segments, self.kernels)):
            tr = kernel.trace()
            first, _ = self.plan.item_indices(segment.items)  # (an item of a run: its first index)
            out += [ItemRecord(int(t) + self.plan.first_task, int(first[i]), int(tr[i, 2]), int(tr[i, 0]),
                               int(tr[i, 1]), self.plan.variants[t].variant_name, k, int(tr[i, 3]))
                    for i, (t, _) in enumerate(segment.items)]
        return out

    def report(self) -> dict:
        """Items, programs, branches and the scheduling cost per work item: the median gap
        between one item's end and the next item's start on the same program (queue atomic,
        table loads, dependency check, dispatch, completion), and the critical path's time in
        waits, items and spread (:func:`pto.exec.trace.traced_critical_path`), from a traced run;
        microseconds on the GPU (ticks of the logical clock under the interpreter)."""
        self._launch(trace=True)
        self.check()
        records = self.trace_records()
        by_prog: dict[tuple[int, int], list] = {}
        for r in records:
            by_prog.setdefault((r.segment, r.program), []).append((r.start_ns, r.end_ns))
        gaps = []
        for spans in by_prog.values():
            spans.sort()
            gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        unit, suffix = (1e3, "us") if self.device.type == "cuda" else (1.0, "ticks")
        gap = float(np.median(gaps)) / unit if gaps else 0.0
        wait = self._release_waits(records)
        out = {"items": self.plan.n_items, "programs": self.programs, "branches": len(self.plan.branches),
               f"item_gap_{suffix}": round(gap, 3),
               f"dependency_wait_{suffix}": round(float(np.median(wait)) / unit, 3) if len(wait) else 0.0}
        plan = self.plan
        edges = np.stack([plan.edge_sources, plan.succ.astype(np.int64)], 1) + plan.first_task
        out[f"critical_path_{suffix}"] = traced_critical_path(records, edges, unit)
        out[f"item_path_{suffix}"] = traced_item_path(records, self._waited_items(records), unit)
        if len(self.kernels) == 1:
            out.update(self.kernels[0].compiled_info)
        else:
            out["split"] = self.split.reason
            out["segments"] = self.segment_report()
        return out

    def segment_report(self) -> list[dict]:
        """Per segment (one, uncut): its levels, tasks, items, programs and branches (variant
        names), and its compiled kernel's registers, spills, shared memory, programs a
        multiprocessor and warps (on the GPU)."""
        level = self.plan.levels()
        out = []
        for segment, kernel in zip(self.segments, self.kernels):
            lv = level[segment.tasks]
            out.append({"levels": [int(lv.min()), int(lv.max())], "tasks": int(segment.tasks.sum()),
                        "items": segment.n_items, "programs": kernel.programs,
                        "branches": [b.fn.variant_name for b in segment.branches], **kernel.compiled_info})
        return out

    def branch_resources(self) -> list[dict]:
        """Per branch of the plan, its own resources: the backend's estimate (programs a
        multiprocessor by each resource, what the cut rule reads) and, on a GPU, what its device
        function compiled alone into a one-branch megakernel needs (registers, spills, shared
        memory, programs a multiprocessor: the compiled kernel's metadata; compiled, never
        launched). Under the interpreter nothing is compiled, so only the estimate. For reports
        (bench/decode.py and bench/megakernel.py ``--branches``): a compile per branch."""
        names, occ = self.backend.megakernel_occupancy(self.plan, self.settings.stages if self.settings else None)
        settings = self.backend.megakernel_settings(self.settings, sentinel=False, per_sm=0, programs=None,
                                                    split="off")
        out = []
        for b, branch in enumerate(self.plan.branches):
            member = self.plan.task_branch == b
            alone = self.backend.megakernel(self.plan.segment(member), self.tensors, settings)
            out.append({"branch": branch.fn.variant_name, "tasks": int(member.sum()),
                        "estimate_per_sm": dict(zip(names, (int(x) for x in occ[b]))), **alone.compiled_info})
        return out

    def _release_waits(self, records: list[ItemRecord]) -> np.ndarray:
        """Per task with predecessors, from its last predecessor's last item's end to its own first
        item's start: what a dependency costs through memory (the release, the poll that sees it,
        the dispatch), and also any time no program was free to take the task (so the median is
        the cost where programs wait on their dependencies, as in a decode step). With
        dependencies at the granularity of data, the same per counter that is waited on: from
        the last end of the items that release it to the first start of the items that wait on
        it (``records`` in :meth:`trace_records`' order)."""
        plan = self.plan
        if plan.boxes is not None and not self.sentinel:
            return self._counter_waits(records)
        task = np.array([r.task for r in records], np.int64) - plan.first_task
        first = np.full(plan.n_tasks, np.iinfo(np.int64).max)
        last = np.full(plan.n_tasks, np.iinfo(np.int64).min)
        np.minimum.at(first, task, np.array([r.start_ns for r in records], np.int64))
        np.maximum.at(last, task, np.array([r.end_ns for r in records], np.int64))
        ready = np.full(plan.n_tasks, np.iinfo(np.int64).min)
        np.maximum.at(ready, plan.succ, last[plan.edge_sources])
        waited = plan.pending > 0
        return (first[waited] - ready[waited]).astype(np.float64)

    def _counter_waits(self, records: list[ItemRecord]) -> np.ndarray:
        """:meth:`_release_waits` per waited counter of each segment's kernel."""
        out, at = [], 0
        for kernel in self.kernels:
            c, n = kernel.counters, kernel.plan.n_items
            start = np.array([r.start_ns for r in records[at:at + n]], np.int64)
            end = np.array([r.end_ns for r in records[at:at + n]], np.int64)
            at += n
            item, released = _releases(c)
            ready = np.full(len(c.init), np.iinfo(np.int64).min)
            np.maximum.at(ready, released, end[item])
            first = np.full(len(c.init), np.iinfo(np.int64).max)
            np.minimum.at(first, c.counter, start)
            waited = (c.init > 0) & (first < np.iinfo(np.int64).max)
            out.append((first[waited] - ready[waited]).astype(np.float64))
        return np.concatenate(out) if out else np.zeros(0)

    def _waited_items(self, records: list[ItemRecord]) -> np.ndarray:
        """Per record (:meth:`trace_records`' order), the record index of the item whose release
        its counter took last (the one it waited for), -1 where it waited for nothing."""
        out, at = [], 0
        for kernel in self.kernels:
            c, n = kernel.counters, kernel.plan.n_items
            end = np.array([r.end_ns for r in records[at:at + n]], np.int64)
            item, released = _releases(c)
            last = np.full(len(c.init), -1, np.int64)
            if len(item):
                by = np.lexsort((item, end[item], released))  # per counter, its last release last
                tail = np.r_[released[by][1:] != released[by][:-1], True]
                last[released[by][tail]] = item[by][tail]
            pred = last[c.counter]
            out.append(np.where((c.init[c.counter] > 0) & (pred >= 0), pred + at, -1))
            at += n
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Per InCore function: the summed duration of its work items, each divided by the
        programs of its launch (the share of one replay it occupies), from a traced run (ms)."""
        self._launch(trace=True)
        self.check()
        acc: dict[str, float] = {}
        for r in self.trace_records():
            name = self.plan.variants[r.task - self.plan.first_task].name
            share = (r.end_ns - r.start_ns) / 1e6 / self.kernels[r.segment].programs
            acc[name] = acc.get(name, 0.0) + share
        return {k: round(v, 4) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}



def _releases(c) -> tuple[np.ndarray, np.ndarray]:
    """The releases a launch of counters ``c`` (:class:`pto.exec.item_deps.Counters`) makes:
    per release, the item (queue index) and the counter it decrements."""
    per_row = np.diff(c.rel_ptr.astype(np.int64))[c.row]
    offset = np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    released = c.rel.astype(np.int64)[np.repeat(c.rel_ptr[c.row].astype(np.int64), per_row) + offset]
    return np.repeat(np.arange(len(c.row)), per_row), released

__all__ = ["PersistentExecutor"]
