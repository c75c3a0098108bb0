"""The persistent executor: the whole task graph runs as one GPU-resident Triton kernel.

The built graph becomes device data (:class:`Plan`): per task its branch (the InCore variant
and the EVEN/ALIGN flags its regions allow), its table row, the tensor of each memref parameter,
its number of work items (parallel-axis blocks), its predecessor count and its successors; and a
queue of work items in a topological priority order (:mod:`pto.exec.order`). One launch of the
megakernel (:mod:`pto.codegen.triton.megakernel`) with as many programs as fit on the GPU at once
runs every item; the only waits are the true dependencies. A replay resets the counters on the
device (two memsets and a copy) and launches again, so it is captured in a CUDA graph like the
wave executor's launches.

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
from dataclasses import dataclass

import numpy as np
import torch

from pto.backends.base import Backend, capable
from pto.codegen.triton import ALIGN
from pto.codegen.triton.megakernel import Branch, MegaKernel, fit_megakernel, kernel_settings, render_megakernel
from pto.codegen.triton.scan import scan_table
from pto.errors import ExecutionError, UsageError
from pto.exec.base import ExecStats, Executor, ItemRecord, Progress
from pto.exec.cost import item_costs
from pto.exec.order import bottom_levels, item_order, levels, list_order
from pto.exec.sentinel import TaskFlags, declared_infinities
from pto.ir.analysis import has_collective
from pto.ir.expr import evaluate
from pto.ir.nodes import IncoreFunction

#: polls of a predecessor counter before a program gives up (about 1 s per 2**21 on an H100)
MAX_POLLS = 1 << 24
_INT32_MAX = 2**31 - 1


@dataclass
class Plan:
    """A graph as the megakernel's tables (numpy; :meth:`to_device` uploads them)."""

    branches: list[Branch]
    items: np.ndarray  # [k, 2] int32: (task, parallel index), queue order
    task_branch: np.ndarray  # [n] int32
    task_row: np.ndarray  # [n] int64
    tab: np.ndarray  # int32 or int64
    task_tensor: np.ndarray  # [n, maxm] int32: index into ``tensor_names``
    tensor_names: list[str]
    pending: np.ndarray  # [n] int32: predecessors
    nitems: np.ndarray  # [n] int32
    succ_ptr: np.ndarray  # [n + 1] int32
    succ: np.ndarray  # int32
    first_task: int  # runtime id of task 0
    variants: list[IncoreFunction]  # per task index: its variant (for reports)
    group_of: dict[str, int]  # InCore function -> GROUP used in the order

    @property
    def n_tasks(self) -> int:
        return len(self.task_branch)

    @property
    def n_items(self) -> int:
        return len(self.items)


def _task_tables(fn: IncoreFunction, tens: np.ndarray, reg: np.ndarray, sca: np.ndarray):
    """Per task of one variant: (rows of its table, parallel extent, EVEN and ALIGN per memref,
    estimated nanoseconds per item)."""
    from pto.backends.triton_backend import even_masks

    size = len(tens)
    env = {}
    cols = []
    even_env_mems = {}
    for k, p in enumerate(fn.params):
        if p.name in {m.name for m in fn.memrefs}:
            r = reg[:, k, :]
            env[f"{p.name}.rows"] = torch.from_numpy(r[:, 2].copy())
            env[f"{p.name}.cols"] = torch.from_numpy(r[:, 3].copy())
            even_env_mems[p.name] = r
    for k, p in enumerate(fn.params):
        if p.name not in even_env_mems:
            env[p.name] = torch.from_numpy(sca[:, k].copy())
    for m in fn.memrefs:
        cols += [even_env_mems[m.name][:, j] for j in range(4)]
    for s in fn.scalars:
        cols.append(env[s.name].numpy())
    rows = np.stack(cols, axis=1) if cols else np.zeros((size, 0), np.int64)
    if fn.parallel is not None:
        ext = np.broadcast_to(np.asarray(evaluate(fn.parallel.extent, env), dtype=np.int64), (size,)).copy()
    else:
        ext = np.ones(size, np.int64)
    even = even_masks(fn, env)
    even = np.stack([even[m.name].numpy() for m in fn.memrefs], axis=1) if fn.memrefs else np.zeros((size, 0), bool)
    align = np.stack([even_env_mems[m.name][:, 1] % ALIGN == 0 for m in fn.memrefs], axis=1) \
        if fn.memrefs else np.zeros((size, 0), bool)
    return rows.astype(np.int64), ext, even, align, item_costs(fn, env, size)


def make_plan(graph, tensor_names: list[str], launch_group: dict[str, int],
              tensor_aligned: np.ndarray | None = None, programs: int = 132, order: str = "list") -> Plan:
    """The device tables of a fully built graph (``launch_group``: GROUP per InCore function;
    ``tensor_aligned``: per tensor, a row stride that is a multiple of 16 elements and a 16-byte
    aligned base; all by default; ``order``: ``list`` (a list schedule for ``programs``
    programs, :func:`pto.exec.order.list_order`) or ``levels`` (:func:`pto.exec.order.item_order`
    alone))."""
    if tensor_aligned is None:
        tensor_aligned = np.ones(len(tensor_names), bool)
    ex = graph.runtime.export()
    n = ex.n_tasks
    variants = graph.variant_of_func_id()
    tensor_index = {graph.tensor_ids[name]: i for i, name in enumerate(tensor_names)}
    task_branch = np.zeros(n, np.int32)
    task_row = np.zeros(n, np.int64)
    extent = np.ones(n, np.int64)
    group = np.zeros(n, np.int64)
    maxm = max((len(f.memrefs) for f in variants.values()), default=1) or 1
    task_tensor = np.zeros((n, maxm), np.int32)
    task_variant: list[IncoreFunction | None] = [None] * n
    work = np.zeros(n, np.int64)  # elements of a task's regions: the wave executor's "largest first"
    cost = np.zeros(n)  # estimated ns per item
    branches: list[Branch] = []
    branch_ids: dict[tuple, int] = {}
    chunks, offset = [], 0
    for fid in np.unique(ex.func):
        fn = variants[int(fid)]
        idx = np.nonzero(ex.func == fid)[0]
        nargs = len(fn.params)
        base = ex.arg_ptr[idx][:, None] + np.arange(nargs)[None, :]
        tens, reg, sca = ex.arg_tensor[base], ex.arg_region[base], ex.arg_scalar[base]
        rows, ext, even, align, cost[idx] = _task_tables(fn, tens, reg, sca)
        mem_k = [k for k, p in enumerate(fn.params) if p.name in {m.name for m in fn.memrefs}]
        work[idx] = (reg[:, mem_k, 2] * reg[:, mem_k, 3]).sum(axis=1)
        extent[idx] = np.maximum(ext, 1)  # a task with nothing to do still completes (one no-op item)
        group[idx] = launch_group.get(fn.name, 0)
        width = rows.shape[1]
        task_row[idx] = offset + np.arange(len(idx)) * width
        offset += len(idx) * width
        chunks.append(rows.reshape(-1))
        for j, k in enumerate(mem_k):
            task_tensor[idx, j] = np.vectorize(tensor_index.__getitem__, otypes=[np.int32])(tens[:, k])
        m = len(fn.memrefs)
        aligned = tensor_aligned[task_tensor[idx, :m]]
        keys = np.concatenate([even, align, aligned], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        for u, row in enumerate(uniq):
            key = (int(fid), tuple(bool(x) for x in row))
            if key not in branch_ids:
                branch_ids[key] = len(branches)
                flags = [tuple(bool(x) for x in row[k * m:(k + 1) * m]) for k in range(3)]
                branches.append(Branch(fn, *flags))
            task_branch[idx[inv.reshape(-1) == u]] = branch_ids[key]
        for t in idx:
            task_variant[t] = fn
    tab = np.concatenate(chunks) if chunks else np.zeros(1, np.int64)
    if len(tab) == 0:
        tab = np.zeros(1, np.int64)
    if tab.size == 0 or np.abs(tab).max() <= _INT32_MAX:
        tab = tab.astype(np.int32)
    succ_ptr = ex.fanout_ptr.astype(np.int64)
    succ = (ex.fanout_ids.astype(np.int64) - ex.first_task).astype(np.int64)
    pending = np.bincount(succ, minlength=n).astype(np.int32)
    lv = levels(n, succ_ptr, succ)
    bottom = bottom_levels(n, succ_ptr, succ, lv)
    _, binding = np.unique(task_tensor, axis=0, return_inverse=True)
    items = item_order(lv, bottom, task_branch, extent, group, binding.reshape(-1), work)
    if order == "list":
        items = list_order(items, cost, extent, succ_ptr, succ, pending, lv, programs)
    elif order != "levels":
        raise UsageError(f"unknown queue order {order!r} (choose list or levels)")
    if len(succ) > _INT32_MAX or len(items) > _INT32_MAX // 2:
        raise ExecutionError(f"the graph has {len(succ):,} edges and {len(items):,} work items: more than the "
                             "persistent kernel's int32 indices hold; use --executor waves")
    return Plan(branches, items, task_branch, task_row, tab, task_tensor, tensor_names, pending,
                extent.astype(np.int32), succ_ptr.astype(np.int32), succ.astype(np.int32), int(ex.first_task),
                task_variant, dict(launch_group))


def _translated(e: Exception, ex: PersistentExecutor) -> Exception:
    """An error Triton raised compiling or launching the megakernel as one line naming it
    (:func:`pto.backends.triton_backend.triton_error`); any other error unchanged."""
    try:
        from triton.errors import TritonError
    except ImportError:  # pragma: no cover - the executor needs Triton
        return e
    if not isinstance(e, TritonError):
        return e
    from pto.backends.triton_backend import triton_error

    return triton_error(e, f"the persistent kernel over {len(ex.plan.branches)} branches", ex._consts())


class PersistentExecutor(Executor):
    """Runs a graph as one persistent Triton kernel (see the module docstring)."""

    name = "persistent"

    def __init__(self, backend: Backend, tensors: dict[str, torch.Tensor], record: bool = False,
                 progress: Progress | None = None, max_polls: int = MAX_POLLS, programs: int | None = None,
                 order: str = "list", sentinel: bool = False, shared_limit: int | None = None):
        if not capable(backend.name, "megakernel"):
            raise UsageError(f"the persistent executor runs Triton kernels; --backend {backend.name} needs "
                             "--executor waves")
        super().__init__(backend, tensors, record, progress)
        self.max_polls = max_polls
        self.programs_override = programs
        self.shared_limit = shared_limit  # bytes of shared memory the kernel may use (None: the device's)
        self.order = order
        self.plan: Plan | None = None
        self.kernel: MegaKernel | None = None
        self.sentinel = sentinel
        self.flags: TaskFlags | None = None  # the sentinel's records of the last launch

    # -- building ---------------------------------------------------------------------------------
    def _branch_configs(self) -> list[dict]:
        """Each branch's launch configuration (its schedule for the number of tasks it runs)."""
        tasks = np.bincount(self.plan.task_branch, minlength=len(self.plan.branches))
        return [self.backend.launch_config(b.fn, int(n)) for b, n in zip(self.plan.branches, tasks)]

    def _launch_config(self) -> dict:
        """One configuration for the whole kernel (:func:`kernel_settings`); pipelining is per
        loop, in the source (``self.stages``), so the kernel's own depth is 1."""
        return {**kernel_settings(self._branch_configs()), "num_stages": 1}

    def _build_kernel(self, graph) -> None:
        """Render the megakernel with each variant's pipelining depth, lowered until the compiled
        kernel fits the device's shared memory (:func:`fit_megakernel`; compiled here, before any
        launch). Under the interpreter nothing is compiled and the depths stay as asked."""
        want: dict[str, int] = {}
        for b, c in zip(self.plan.branches, self._branch_configs()):
            v = b.fn.variant_name
            want[v] = max(want.get(v, 1), int(c.get("num_stages", 1)))
        ignore = declared_infinities(graph.variants) if self.sentinel else frozenset()

        def render(stages: dict[str, int]) -> MegaKernel:
            return render_megakernel(self.plan.branches, self.backend.options, sentinel=self.sentinel,
                                     ignore=ignore, stages=stages)

        self.stages = want
        self.kernel = render(want)
        self._upload()
        if not self._compiles():
            return
        from pto.backends.triton_backend import load_kernel

        limit = self.shared_limit or self.backend.shared_limit()

        def shared(kernel: MegaKernel) -> int:
            self.kernel = kernel
            return int(load_kernel(kernel).warmup(*self._args(), grid=(1,), **self._consts()).metadata.shared)

        self.kernel, self.stages, _ = fit_megakernel(self.plan.branches, want, shared, limit, render)

    def _compiles(self) -> bool:
        """The kernel is compiled for the GPU (not run by the Triton interpreter)."""
        return self.device.type == "cuda" and self.backend.compiles

    def _upload(self) -> None:
        p, dev = self.plan, self.device
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in (
            ("items", p.items), ("task_branch", p.task_branch), ("task_row", p.task_row), ("tab", p.tab),
            ("task_tensor", p.task_tensor), ("pending0", p.pending), ("nitems", p.nitems),
            ("succ_ptr", p.succ_ptr), ("succ", p.succ if len(p.succ) else np.zeros(1, np.int32)))}
        tensors = [self.tensors[name] for name in p.tensor_names]
        t["ptrs"] = torch.tensor([x.data_ptr() for x in tensors], dtype=torch.int64, device=dev)
        t["strides"] = torch.tensor([x.stride(0) for x in tensors], dtype=torch.int64, device=dev)
        t["pending"] = t["pending0"].clone()
        t["done"] = torch.zeros(p.n_tasks, dtype=torch.int32, device=dev)
        t["nxt"] = torch.zeros(1, dtype=torch.int32, device=dev)
        t["err"] = torch.zeros(2, dtype=torch.int32, device=dev)
        t["clock"] = torch.zeros(1, dtype=torch.int32, device=dev)
        t["trace"] = torch.zeros((max(p.n_items, 1), 3), dtype=torch.int64, device=dev)
        if self.sentinel:
            t["spend"] = t["pending0"].clone()
            t["sread"] = torch.full((max(p.n_tasks, 1), 4), -1, dtype=torch.int64, device=dev)
            t["swrite"] = torch.full((max(p.n_tasks, 1), 4), -1, dtype=torch.int64, device=dev)
            t["stab"] = torch.tensor(scan_table([b.fn for b in p.branches], self.kernel.max_memrefs),
                                     dtype=torch.int32, device=dev)
        self.tracing = 0
        self.buf = t

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def _args(self):
        b = self.buf
        b["tracing"] = self.tracing
        return (b["items"], self.plan.n_items, b["nxt"], b["task_branch"], b["task_row"], b["tab"],
                b["task_tensor"], b["ptrs"], b["strides"], b["pending"], b["done"], b["nitems"],
                b["succ_ptr"], b["succ"], b["err"], b["trace"], b["clock"], b["tracing"],
                *((b["spend"], b["sread"], b["swrite"], b["stab"]) if self.sentinel else ()))

    def _consts(self) -> dict:
        cfg = self._launch_config()
        return {"MAXM": self.kernel.max_memrefs, "MAX_POLLS": self.max_polls,
                "SUCC_BLOCK": 32 * cfg["num_warps"], "GPU_CLOCK": self.device.type == "cuda", **cfg}

    def _resident_programs(self, jit) -> int:
        """As many programs as the GPU holds at once (registers, shared memory, threads); 2 under
        the interpreter (it runs programs one after another)."""
        if self.programs_override:
            return self.programs_override
        if not self._compiles():
            return 2
        from pto.target import detect

        tg = detect("cuda", self.device.index or 0)
        consts = self._consts()
        compiled = jit.warmup(*self._args(), grid=(1,), **consts)
        compiled._init_handles()  # loads the module: registers and spills are known from here
        warps = consts["num_warps"]
        by_regs = (tg.regs_per_block or 65536) // max(compiled.n_regs * 32 * warps, 1)
        smem = compiled.metadata.shared
        by_smem = (tg.sram_bytes + 1024) // (smem + 1024) if smem else 32
        by_threads = 2048 // (32 * warps)
        per_sm = max(1, min(by_regs, by_smem, by_threads, 32))
        self.compiled_info = {"regs": compiled.n_regs, "spills": compiled.n_spills, "shared": smem,
                              "programs_per_sm": per_sm}
        return per_sm * (tg.sm_count or 1)

    # -- running ----------------------------------------------------------------------------------
    def run(self, graph) -> ExecStats:
        from pto.backends.triton_backend import load_kernel
        from pto.target import detect

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
        # the list schedule assumes one program per SM (what the megakernels' shared memory allows)
        sms = self.programs_override or (detect("cuda", self.device.index or 0).sm_count
                                         if self.device.type == "cuda" else 4)
        self.plan = make_plan(graph, names, groups, aligned, programs=sms, order=self.order)
        try:
            self._build_kernel(graph)
            self.jit = load_kernel(self.kernel)
            if self.sentinel:
                self.flags = TaskFlags(graph.runtime.export(),
                                       {graph.tensor_ids[n]: self.tensors[n] for n in names},
                                       declared_infinities(graph.variants))
            self.programs = self._resident_programs(self.jit)
            self._launch(trace=self.record)
        except Exception as e:
            one_line = _translated(e, self)
            if one_line is e:
                raise
            raise one_line from e
        self.check()
        if self.progress is not None:
            self.progress(self.plan.n_tasks, self.plan.n_tasks)
        ms = (time.perf_counter() - t0) * 1e3
        self.records = self.trace_records() if self.record else []
        return ExecStats(self.plan.n_tasks, 0, 1, ms, self.records)

    def _reset(self) -> None:
        b = self.buf
        b["nxt"].zero_()
        b["done"].zero_()
        b["pending"].copy_(b["pending0"])

    def _launch(self, trace: bool = False) -> None:
        self._reset()
        if self.sentinel:
            self._sentinel_before()
        self.tracing = int(trace)
        self.jit[(max(1, min(self.programs, self.plan.n_items)),)](*self._args(), **self._consts())
        self.tracing = 0
        if self.sentinel:
            self._sentinel_after()

    def _sentinel_before(self) -> None:
        """Reset the device records; check the inputs of the tasks without predecessors here
        (the device checks a task's inputs when its last predecessor releases it)."""
        b = self.buf
        b["spend"].copy_(b["pending0"])
        b["sread"].fill_(-1)
        b["swrite"].fill_(-1)
        self.flags.clear()
        roots = np.nonzero(self.plan.pending == 0)[0]
        self.flags.scan(roots + self.plan.first_task, writes=False)

    def _sentinel_after(self) -> None:
        n = self.plan.n_tasks
        inner = self.plan.pending > 0
        self.flags.read[inner] = self.buf["sread"].cpu().numpy()[:n][inner]
        self.flags.wrote[:] = self.buf["swrite"].cpu().numpy()[:n]

    def replay(self) -> None:
        self._launch()

    def check(self) -> None:
        """Raise ExecutionError if a program gave up waiting (names the task it waited on)."""
        err = self.buf["err"].cpu()
        if int(err[0]):
            t = int(err[1])
            fn = self.plan.variants[t]
            raise ExecutionError(f"persistent executor: a program waited more than {self.max_polls:,} polls for the "
                                 f"predecessors of task {t + self.plan.first_task} (`{fn.variant_name}`); "
                                 "a dependency was never released")
        if int(self.buf["nxt"].cpu()[0]) < self.plan.n_items:
            raise ExecutionError("persistent executor: the kernel ended before taking every work item")

    def trace_records(self) -> list[ItemRecord]:
        """One record per work item of the last traced run."""
        self.sync()
        tr = self.buf["trace"].cpu().numpy()[: self.plan.n_items]
        return [ItemRecord(int(t) + self.plan.first_task, int(p), int(tr[i, 2]), int(tr[i, 0]), int(tr[i, 1]),
                           self.plan.variants[t].variant_name)
                for i, (t, p) in enumerate(self.plan.items)]

    def report(self) -> dict:
        """Items, programs, branches and the scheduling cost per work item: the median gap
        between one item's end and the next item's start on the same program (queue atomic,
        table loads, dependency check, dispatch, completion), from a traced run; microseconds
        on the GPU (ticks of the logical clock under the interpreter)."""
        self._launch(trace=True)
        self.check()
        recs = self.trace_records()
        by_prog: dict[int, list] = {}
        for r in recs:
            by_prog.setdefault(r.program, []).append((r.start_ns, r.end_ns))
        gaps = []
        for spans in by_prog.values():
            spans.sort()
            gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        gap = float(np.median(gaps)) / (1e3 if self.device.type == "cuda" else 1.0) if gaps else 0.0
        out = {"items": self.plan.n_items, "programs": self.programs, "branches": len(self.plan.branches),
               "item_gap_us" if self.device.type == "cuda" else "item_gap_ticks": round(gap, 3)}
        out.update(getattr(self, "compiled_info", {}))
        return out

    def profile(self, repeat: int = 3) -> dict[str, float]:
        """Per InCore function: the summed duration of its work items divided by the number of
        programs (the share of one replay it occupies), from a traced run (ms)."""
        self._launch(trace=True)
        self.check()
        acc: dict[str, float] = {}
        for r in self.trace_records():
            name = self.plan.variants[r.task - self.plan.first_task].name
            acc[name] = acc.get(name, 0.0) + (r.end_ns - r.start_ns) / 1e6
        return {k: round(v / self.programs, 4) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


__all__ = ["PersistentExecutor", "Plan", "make_plan", "MAX_POLLS"]
