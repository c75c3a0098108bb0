"""The Triton backend: generated, batched kernels, a launch or two per task batch.

``prepare(batch)`` renders the batch's specialized InCore function (:mod:`pto.codegen.triton`,
cached per function and options), loads it (:mod:`.loader`), builds the per-task offset table
once as a device tensor (:mod:`.tables`), and picks the per-batch specializations (``EVEN_<p>``:
the tasks' regions are full, so loads and stores skip masks; ``ALIGN_<p>``: the regions start
on a 16-column boundary and are a multiple of 16 columns wide; ``TMA_<p>``: tensor-descriptor
loads). The aligned tasks and the others launch apart (``split``; usually one launch: a
clipped last tile joins the full ones on the masked path). The launch it returns
allocates nothing and never synchronizes with the host, so the executor may capture it in a
CUDA graph (after a first, uncaptured call has compiled the kernels). Launch settings are a
:class:`~.launch.LaunchConfig`: the renderer's heuristics, the schedule database
(:mod:`.schedules`), the caller's overrides. :meth:`TritonBackend.megakernel` compiles a whole
graph into the persistent kernel (:mod:`.megakernel`).

On a CPU the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``; f32 and f16,
small shapes; its bf16 conversions truncate, so bf16 is checked by compiling for sm_90 instead).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from pto.backends.base import Backend, Launch, triton_available
from pto.backends.triton.ahead import call as ahead_call
from pto.backends.triton.ahead import fitted, note, refit, submit
from pto.backends.triton.ahead import key as ahead_key
from pto.backends.triton.collective import capturable, chunked, collective_launch, native_split, parts
from pto.backends.triton.launch import (
    CODEGEN,
    LaunchConfig,
    LaunchGroup,
    calls,
    fit_calls,
    launcher,
    merged,
    unfit_specializations,
    with_descriptors,
)
from pto.backends.triton.loader import load_kernel
from pto.backends.triton.megakernel import ESTIMATE_TARGET, Megakernel, MegakernelSettings, occupancy, resolve_warps
from pto.backends.triton.modes import (
    K_AHEAD_REGS,
    K_FIRST_TRIPS,
    PDL_POLICIES,
    blocks_formats,
    blocks_functions,
    k_ahead_mode,
    pdl_late_functions,
    pdl_mode,
    persistent_mode,
    qgemv_cols,
    qgemv_mode,
    qgemv_warps,
    qgemv_warps_by,
    qscales_mode,
    run_loop_mode,
    split_mode,
    tma_mode,
)
from pto.backends.triton.schedules import for_device
from pto.backends.triton.tables import build_table, check_batch, descriptor_masks, even_masks, task_env
from pto.codegen.triton import ALIGN, RenderedKernel, RenderOptions, render, render_sources
from pto.codegen.triton.common import BLOCK_MAXNREG, BLOCK_PROGRAMS, _loops
from pto.codegen.triton.tma import tma_memrefs
from pto.data.batch import TaskBatch
from pto.errors import ExecutionError, UsageError
from pto.ir.analysis import has_collective
from pto.ir.expr import Const, evaluate
from pto.ir.facts import constant_trips
from pto.ir.nodes import IncoreFunction, walk_instrs
from pto.ir.ops import Op
from pto.machine.collectives import SumBuffers
from pto.machine.target import get as get_target

_MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension


def _quantized_k_trips(fn: IncoreFunction) -> int:
    """The most constant trips of a loop of ``fn`` that loads a quantized memref (what
    ``RenderOptions.k_ahead`` may load a step ahead, or peel), 0 where none."""
    quantized = {p.name for p in fn.memrefs if p.dtype.is_quantized}
    return max(((constant_trips(s) or 0) for s in _loops(fn.body)
                if any(i.op is Op.LOAD and i.srcs[0] in quantized for i in walk_instrs(s.body))), default=0)


class TritonBackend(Backend):
    """Generated Triton kernels: one launch per batch, or one per kind of task with ``split``.

    ``options``: :class:`RenderOptions` (e.g. ``input_precision="tf32"``). ``launch``: per
    InCore function overrides of the launch parameters, keyed by plain name (``gemm_tile``) or
    variant name (``gemm_tile__TK64_TM64_TN128``, which wins), e.g.
    ``{"gemm_tile": {"num_warps": 8, "num_stages": 4}}``. ``even``/``align``: allow the
    per-batch specializations. ``split``: which tasks of a batch launch apart: "align" (the
    aligned from the unaligned; a batch's few clipped tiles join the full ones, all on the
    masked path, whose aligned column masks keep the loads' vector width), "masks" (also the
    full from the clipped: at most 4 launches; the clipped tiles' launch runs after the full
    ones' and streams the weights again with a few programs: on an H100 the 7B layer at 1,537
    tokens took 1.69 ms so, 1.34 with "align", 1.32 at 1,664) or "none"; None: ``PTO_SPLIT``,
    else "align". ``pdl``: the programmatic-dependent-launch policy (:data:`PDL_POLICIES`; "off"):
    a render mode for every launch (``RenderOptions.pdl``: "early", "late", "chain"), or "auto":
    each launch may load what the one before does not write before its wait (``TaskBatch.readonly``), and signals
    "late", or "chain" (right after its wait) where the executor says the next launch loads weights
    early (``TaskBatch.chain``, :meth:`loads_early`); None: "auto" where the kernels are compiled for a
    GPU of compute capability 9.0 or later, unless the environment sets ``PTO_PDL``. Measured on
    an H100: the SmolLM2 decode step 15% faster with "late" than without PDL, and 19% faster
    again with "auto"; "early" 30% slower; the prefill layer unchanged by any (docs/PERF.md
    "Programmatic dependent launch", "Tenth session"). Tensor-descriptor loads of the large tiles
    that feed matrix products (``RenderOptions.tma``, :mod:`pto.codegen.triton.tma`): on where
    the kernels are compiled for compute capability 9.0 or later, unless ``PTO_TMA=off`` (the
    7B layer 9-12% faster on an H100).
    """

    name = "triton"
    description = ("generated Triton kernels (a GPU, or the CPU interpreter with TRITON_INTERPRET=1: f32, small "
                   "shapes)")
    capabilities = frozenset({"megakernel", "cpu_f32_only"})
    auto_rank = 10  # the fastest where it runs: auto's choice on a GPU

    def __init__(self, device="cuda", options: RenderOptions | None = None,
                 launch: dict[str, dict] | None = None, even: bool = True, align: bool = True,
                 split: str | None = None, schedules=None, pdl: str | None = None):
        self.device = torch.device(device)
        self.graph_capturable = self.device.type == "cuda"
        # the collective batches' sum buffers, shared (pto/backends/triton/collective.py)
        self._sum_buffers = SumBuffers()
        self.options = options or RenderOptions()
        #: the PDL policy (PDL_POLICIES; "" off): "auto" renders "late", and "chain" for a launch
        #: whose successor loads early (TaskBatch.chain); "auto" and "chain" load TaskBatch.readonly early
        self.pdl = self._pdl(pdl)
        # what a kernel may load before its wait is the executor's to say, per batch (batch_options)
        self.options = replace(self.options, pdl="late" if self.pdl == "auto" else self.pdl, pre=())
        self.options = replace(self.options, tma=self._tma(), qgemv=self.options.qgemv or qgemv_mode(self.compiles),
                               qgemv_warps=self.options.qgemv_warps or qgemv_warps(),
                               qgemv_warps_by=self.options.qgemv_warps_by or qgemv_warps_by(),
                               qgemv_cols=self.options.qgemv_cols or qgemv_cols(),
                               qscales=self.options.qscales or qscales_mode(),
                               run_loop=self.options.run_loop or run_loop_mode(),
                               k_ahead=self.options.k_ahead or k_ahead_mode(), asm=self.compiles)
        #: the persistent tile loop of the kernels whose loops multiply large tiles, where no
        #: schedule says (options, else PTO_PERSISTENT): :meth:`render_options`
        self.persistent = self.options.persistent or persistent_mode()
        #: the weight formats whose gate/up GEMV "auto" runs in "blocks" form (PTO_BLOCKS_FORMATS)
        self.blocks_formats = blocks_formats()
        #: the functions "auto" also runs in "blocks" form, whatever their weights (PTO_BLOCKS_FUNCTIONS)
        self.blocks_functions = blocks_functions()
        #: the functions whose launches load nothing before their PDL wait (PTO_PDL_LATE)
        self.pdl_late = pdl_late_functions()
        if self.persistent == "ws" and self.compiles and tuple(torch.cuda.get_device_capability(self.device)) < (9, 0):
            raise UsageError("persistent tile loops 'ws' (warp-specialized) need compute capability 9.0 or later; "
                             "use 'loop'")
        self.options = replace(self.options, persistent="")
        self.launch_overrides = dict(launch or {})
        self.schedules = schedules  # a ScheduleDB (None: the renderer's heuristics)
        self.even = even
        self.align = align
        self.split = split_mode(split)
        self._kernels: dict[tuple, RenderedKernel] = {}
        self._shared: int | None = None
        #: the name of this backend's private copy of every kernel's ``@triton.jit`` function
        #: (:func:`~.loader.load_kernel`; None: the process's shared one). Compiles of one kernel
        #: are one at a time per function object (:mod:`.ahead`), so backends that launch one
        #: kernel under different launch settings (pto tune's candidates) each take a copy to
        #: compile at once
        self.kernel_copy: str | None = None

    def _tma(self) -> bool:
        """Tensor-descriptor loads: asked for by the options (``RenderOptions(tma=True)``; refused
        where the kernels are not compiled for compute capability 9.0+), else ``PTO_TMA``'s
        (:func:`tma_mode`)."""
        cap = torch.cuda.get_device_capability(self.device) if self.compiles else None
        if self.options.tma and (cap is None or tuple(cap) < (9, 0)):
            raise UsageError("tensor-descriptor loads (RenderOptions.tma) need kernels compiled for a GPU of "
                             "compute capability 9.0 or later")
        return self.options.tma or tma_mode(cap, self.compiles)

    def _pdl(self, asked: str | None) -> str:
        """The PDL mode: ``asked`` ("off" or a mode; None: the options', else ``PTO_PDL``'s for
        this GPU), refused where the kernels are not compiled for compute capability 9.0+."""
        cap = torch.cuda.get_device_capability(self.device) if self.compiles else None
        mode = asked if asked is not None else (self.options.pdl or pdl_mode(cap, self.compiles))
        mode = "" if mode == "off" else mode
        if mode not in ("",) + PDL_POLICIES:
            raise UsageError(f"pdl={mode!r}: one of {', '.join(PDL_POLICIES)} or off")
        if mode and cap is None:
            raise UsageError("programmatic dependent launch (pdl) needs kernels compiled for a GPU; "
                             "this backend runs the Triton interpreter")
        if mode and cap < (9, 0):
            raise UsageError(f"programmatic dependent launch (pdl={mode!r}) needs compute capability 9.0 or "
                             f"later; {self.device} has {cap[0]}.{cap[1]}")
        return mode

    def kernel(self, fn: IncoreFunction, options: RenderOptions | None = None) -> RenderedKernel:
        """The rendered kernel of ``fn`` under ``options`` (default: this backend's; cached)."""
        opts = options or self.options
        k = self._kernels.get((fn, opts))
        if k is None:
            k = self._kernels[(fn, opts)] = render(fn, opts)
        return k

    @classmethod
    def create(cls, device, launch: dict[str, dict], shipped: tuple[Path, ...] = ()) -> TritonBackend:
        return cls(device, launch=launch, schedules=for_device(str(device), shipped))

    @classmethod
    def unusable(cls, device: str) -> str | None:
        if not triton_available():
            return "--backend triton: the triton package is not installed (pip install -e \".[triton]\")"
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return ("--backend triton on the CPU needs TRITON_INTERPRET=1 (the Triton interpreter; f32 and small "
                    "shapes only)")
        return None

    @classmethod
    def auto_candidate(cls, device: str) -> bool:
        return device == "cuda" and triton_available()

    @classmethod
    def modes(cls, target) -> dict[str, str]:
        """Programmatic dependent launch, tensor-descriptor loads, the quantized GEMVs' reads and
        the persistent tile loops (:mod:`.modes`)."""
        compiles = os.environ.get("TRITON_INTERPRET") != "1"
        return {"pdl": pdl_mode(target.capability, compiles) or "off",
                "tma": "on" if tma_mode(target.capability, compiles) else "off", "qgemv": qgemv_mode(compiles),
                "qscales": qscales_mode(), "k_ahead": k_ahead_mode(),
                "persistent": persistent_mode() or "off", "blocks_formats": ",".join(sorted(blocks_formats())),
                "blocks_functions": ",".join(sorted(blocks_functions())),
                "pdl_late": ",".join(sorted(pdl_late_functions()))}

    def launch_config(self, fn: IncoreFunction, tasks: int = 1) -> LaunchConfig:
        """Launch parameters for a batch of ``tasks`` tasks of ``fn``: the renderer's
        heuristics, then the schedule database's entry for the variant and the batch's shape
        bucket (the user's, else the program's shipped defaults;
        :mod:`pto.backends.triton.schedules`), then ``launch`` for the plain name, then
        ``launch`` for the variant name."""
        kernel = self.kernel(fn)
        cfg = LaunchConfig.of(kernel.launch, f"`{fn.name}`'s heuristics")
        if self.schedules is not None:
            found, where = self.schedules.lookup(fn.name, fn.variant_name, tasks, kernel.schedule_digest)
            cfg = cfg.updated(found, f"the {where} schedule of `{fn.variant_name}`")
        for key in (fn.name, fn.variant_name):
            cfg = cfg.updated(self.launch_overrides.get(key, {}), f"the launch settings given for `{key}`")
        return cfg

    def launch_origin(self, fn: IncoreFunction, tasks: int = 1) -> str:
        """Where ``launch_config``'s settings come from, for messages: an override, the user's or
        the shipped schedule database, or the renderer's heuristics."""
        if fn.name in self.launch_overrides or fn.variant_name in self.launch_overrides:
            return "launch settings given to the backend"
        where = self.schedules.lookup(fn.name, fn.variant_name, tasks, self.kernel(fn).schedule_digest)[1] \
            if self.schedules is not None else "heuristic"
        if where.startswith("shipped for "):
            return f"the schedules pto ships for {where[len('shipped for '):]}, which stand in for this GPU's; " \
                   "pto tune --show lists them"
        return {"user": "the user's schedule database; pto tune --show lists it",
                "shipped": "the schedules shipped with pto; pto tune --show lists them"}.get(where, "the heuristics")

    def render_sources(self, functions) -> dict[str, str]:
        """``{filename: source}`` of the kernels of ``functions`` under this backend's options."""
        return render_sources(functions, self.options)

    def prepare(self, batch: TaskBatch) -> Launch:
        return self._prepare(batch, ahead=False)

    def prepare_ahead(self, batch: TaskBatch) -> Launch:
        """:meth:`prepare`, with a kernel this process has not compiled for the batch's
        arguments compiled on a worker thread (:mod:`.ahead`): the launch waits for it, and
        carries ``pending`` while it runs."""
        return self._prepare(batch, ahead=True)

    def _prepare(self, batch: TaskBatch, ahead: bool) -> Launch:
        fn = batch.fn
        check_batch(batch)
        if batch.size == 0:
            return launcher(None, [], [])
        if has_collective(fn):  # Triton kernels do not communicate: two kernels and NCCL, or the evaluator
            split = native_split(fn)
            if split is not None:
                return collective_launch(lambda part: self._prepare(part, ahead), batch, split, task_env(batch),
                                         self._sum_buffers)
            from pto.backends.torch_backend import TorchBackend

            return TorchBackend().prepare(batch)
        cfg = self.launch_config(fn, batch.size)
        origin = self.launch_origin(fn, batch.size)
        kernel = self.kernel(fn, self.batch_options(cfg, batch))
        cfg = self.kernel_settings(kernel, cfg)
        jit = load_kernel(kernel, self.kernel_copy)
        args = []
        for p in fn.memrefs:
            t = batch.mems[p.name].tensor
            args += [t, t.stride(0)]
        env = task_env(batch)
        groups = self.groups(batch, env)
        device = batch.mems[fn.memrefs[0].name].tensor.device
        table = build_table(kernel, batch, device)
        for g in groups:
            g.table = table if len(g.tasks) == batch.size else table[g.tasks.to(device)].contiguous()
        what = f"`{kernel.name}` ({origin})"
        safe = descriptor_masks(fn, env, batch, kernel.tma) if kernel.tma else {}
        launches = calls(groups, tuple(args), cfg, kernel.pdl, self.programs(kernel), kernel.persistent == "blocks")
        launches = with_descriptors(kernel, batch, groups, launches, safe)
        if not self.compiles:
            return launcher(jit, launches, groups, what)
        k = ahead_key(kernel.digest, launches)
        known = refit(k, launches)
        if known is not None:
            return launcher(jit, known, groups, what)
        limit = self.shared_limit()

        def fit() -> list[tuple]:
            out = fit_calls(jit, launches, limit, what)
            note(k, out)
            return out

        if ahead and not fitted(k):
            return launcher(jit, None, groups, what, submit(k, jit, fit, device))
        return launcher(jit, fit(), groups, what)

    def batch_options(self, cfg: LaunchConfig, batch: TaskBatch) -> RenderOptions:
        """The code-generation options of ``batch``'s kernel: this backend's, those a schedule
        switches (``cfg``), and under the "auto" and "chain" PDL policies the memrefs it may load
        before its wait (``TaskBatch.readonly``) and, "auto", where it signals (``TaskBatch.chain``)."""
        opts = self.render_options(batch.fn, cfg)
        # a warp-specialized loop keeps the PDL wait before it: no loads move above the wait
        early = self.pdl in ("auto", "chain") and opts.persistent != "ws" and batch.fn.name not in self.pdl_late
        opts = replace(opts, pre=tuple(sorted(batch.readonly)) if early else ())
        if self.pdl == "auto" and batch.chain:
            opts = replace(opts, pdl="chain")
        return opts

    def render_options(self, fn: IncoreFunction, cfg: LaunchConfig) -> RenderOptions:
        """This backend's code-generation options with those ``cfg`` switches, and the backend's
        persistent tile loop (``self.persistent``) for a kernel whose loops multiply large tiles
        where ``cfg`` does not say; "auto": "blocks" for a kernel whose plain form says so in the
        formats this backend takes so (``RenderedKernel.blocks_auto_in`` :attr:`blocks_formats`:
        the gate/up GEMVs measured faster so, and the functions :attr:`blocks_functions` names),
        no loop elsewhere. ``k_ahead`` "auto" (:func:`~.modes.k_ahead_mode`) is decided per
        function (:meth:`k_ahead_of`)."""
        opts = self._loop_options(fn, cfg)
        if opts.k_ahead == "auto":  # (a persistent tile loop has no rounds of programs: not there)
            opts = replace(opts, k_ahead="off" if opts.persistent else self.k_ahead_of(fn, cfg.num_warps))
        return opts

    def k_ahead_of(self, fn: IncoreFunction, warps: int) -> str:
        """``k_ahead`` "auto" for ``fn`` launched with ``warps`` warps a program, one task a launch
        (a decode step's GEMV: each layer's weights a launch): "on" where a
        task's programs (its parallel axis's constant extent) fit one round on the GPU at
        :data:`~.modes.K_AHEAD_REGS` registers a thread (a K loop carrying its next step takes
        155-168 at 4 warps, three programs a multiprocessor, where the plain loop's 120-128 fit
        four: a task of more programs runs a second round); elsewhere "first" where the loop has
        :data:`~.modes.K_FIRST_TRIPS` steps or more (its first step peeled, its weights before
        the PDL wait, no register carried), else "off". On an H200 the 1B's Q4_K down projection
        (256 programs) 8.4 -> 6.1 us a layer on, its Q8_0 one 8.4 -> 7.8; the 8B's (512 programs,
        7 steps) 16.1 -> 18.9 on, 16.3 -> 14.8 first (Q8_0 20.0 -> 18.3, fp8 21.2 -> 20.4); the LM
        heads' loops of 2-4 steps mixed first (the Q6_K head 142 -> 184 us, Q8_0's 157 -> 154),
        SmolLM2's head (8 warps) 16.4 -> 20.0 on (docs/PERF.md, "Thirty-fifth session")."""
        extent = fn.parallel.extent if fn.parallel is not None else None
        trips = _quantized_k_trips(fn)
        if not isinstance(extent, Const) or trips < 2:
            return "off"
        # (the multiprocessors, a device query on a GPU, asked only of a kernel the form may change)
        sms = self._sms() if self.device.type == "cuda" else get_target(ESTIMATE_TARGET).sm_count
        per_sm = 65536 // (K_AHEAD_REGS * 32 * warps)
        if extent.value <= per_sm * sms:
            return "on"
        return "first" if trips >= K_FIRST_TRIPS else "off"

    def _loop_options(self, fn: IncoreFunction, cfg: LaunchConfig) -> RenderOptions:
        """:meth:`render_options` but ``k_ahead``."""
        opts = cfg.options(self.options)
        if not self.persistent or "persistent" in dict(cfg.codegen):
            return opts
        # (the kernels with a parallel axis may loop over it, a collective's excepted)
        loopable = fn.parallel is not None and not has_collective(fn)
        if self.persistent == "auto":
            if fn.name in self.blocks_functions and loopable:
                return replace(opts, persistent="blocks")
            kernel = self.kernel(fn, opts)  # (the plain kernel, launched where it does not loop)
            # (the formats first: the programs, a device query on a GPU, asked only of a kernel that could loop)
            fmts = self.blocks_formats
            auto = kernel.blocks_auto_in(fmts) and kernel.loops_blocks(self.block_programs(), fmts)
            return replace(opts, persistent="blocks") if auto else opts
        if self.persistent == "blocks":
            return replace(opts, persistent="blocks") if loopable else opts
        # ("flat": also the kernels with a parallel axis, the GEMVs, whose loops it pipelines)
        if (self.persistent == "flat" and fn.parallel is not None) or tma_memrefs(fn):
            opts = replace(opts, persistent=self.persistent)
        return opts

    def loads_early(self, batch: TaskBatch) -> frozenset[str]:
        """The memrefs ``batch``'s kernel loads before its PDL wait (the executor's question for
        ``TaskBatch.chain``)."""
        if self.pdl not in ("auto", "chain") or not batch.readonly or batch.size == 0 or has_collective(batch.fn):
            return frozenset()
        return self.kernel(batch.fn, self.batch_options(self.launch_config(batch.fn, batch.size), batch)).early

    def uniform_launch(self, graph) -> dict[str, dict]:
        """Launch overrides (variant name -> parameters) that compile every batched kernel of
        ``graph`` as the persistent megakernel compiles its branches: the kernel-wide settings of
        :func:`~pto.backends.triton.launch.merged` (the most warps any variant asks for, FMA
        contraction if any allows it) and this backend's code-generation options
        (a schedule may not switch them for one kernel). Pipelining depth stays each variant's own:
        it reorders loads, not arithmetic. So both executors run identically compiled arithmetic."""
        ex = graph.runtime.export()
        by_id = graph.variant_of_func_id()
        fids, counts = np.unique(ex.func, return_counts=True)
        one = merged([self.launch_config(by_id[int(f)], int(n)) for f, n in zip(fids, counts)])
        # (the megakernel's warps where PTO_MK_WARPS sets them: a reduction over other warps rounds otherwise)
        same = {"num_warps": resolve_warps(None) or one.num_warps, "enable_fp_fusion": one.enable_fp_fusion}
        same.update({f: getattr(self.options, f) for f in CODEGEN})
        return {by_id[int(f)].variant_name: dict(same) for f in fids}

    def unfit_specializations(self, fn: IncoreFunction, tasks: int = 1) -> list[str]:
        """The specializations of ``fn``'s batched kernel that need more shared memory than the
        device has with the launch settings for ``tasks`` tasks (:func:`.launch.unfit_specializations`)."""
        return self._unfit(fn, tasks)()

    def unfit_specializations_ahead(self, fn: IncoreFunction, tasks: int = 1) -> Future:
        """:meth:`unfit_specializations` on a compile thread (:func:`.ahead.call`: one at a time
        with the other compiles of the kernel's function object)."""
        check = self._unfit(fn, tasks)
        return ahead_call(load_kernel(check.args[0], self.kernel_copy), check, self.device)

    def kernel_settings(self, kernel: RenderedKernel, cfg: LaunchConfig) -> LaunchConfig:
        """``cfg`` with what ``kernel``'s form asks of the compiler where ``cfg`` does not say: a
        loop over its blocks that carries the next block's weights (``block_ahead``), 4 warps or
        fewer, at most BLOCK_MAXNREG registers a thread on a GPU, so that BLOCK_PROGRAMS programs
        fit a multiprocessor."""
        if kernel.block_ahead and self.compiles and cfg.num_warps <= 4 and "maxnreg" not in dict(cfg.extra):
            return cfg.updated({"maxnreg": BLOCK_MAXNREG})
        return cfg

    def _unfit(self, fn: IncoreFunction, tasks: int) -> partial:
        """The check of :meth:`unfit_specializations`, to call (its first argument the kernel)."""
        cfg = self.launch_config(fn, tasks)
        kernel = self.kernel(fn, self.render_options(fn, cfg))
        cfg = self.kernel_settings(kernel, cfg)
        return partial(unfit_specializations, kernel, cfg, self.device, self.programs(kernel), self.shared_limit(),
                       self.kernel_copy)

    def task_flags(self, fn: IncoreFunction, env: dict, regions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per task and memref (``regions``: ``[tasks, memrefs, 4]``, ``env``: per-task int64
        vectors): may it skip masks (every access inside the region), do its region's first
        column and width fall on ALIGN-column boundaries. The persistent executor's plan makes a branch of each
        combination (:func:`pto.exec.plan.make_plan`)."""
        size = len(regions)
        if not fn.memrefs:
            return np.zeros((size, 0), bool), np.zeros((size, 0), bool)
        even = even_masks(fn, env)
        return (np.stack([even[m.name].numpy() for m in fn.memrefs], axis=1),
                (regions[:, :, 1] % ALIGN == 0) & (regions[:, :, 3] % ALIGN == 0))

    def megakernel_settings(self, settings: MegakernelSettings | None = None, **changes) -> MegakernelSettings:
        return replace(settings or MegakernelSettings(), **changes)

    def megakernel(self, plan, tensors: dict[str, torch.Tensor], settings: MegakernelSettings,
                   after: Megakernel | None = None) -> Megakernel:
        """``plan`` (:class:`pto.exec.plan.Plan`) compiled into the persistent kernel over
        ``tensors`` (:mod:`.megakernel`), launched after ``after`` where a split plan's segment."""
        return Megakernel(self, plan, tensors, settings, after)

    def compiled_kernels(self) -> list[dict]:
        """What each batched kernel this backend compiled needs, per compiled specialization: its
        InCore variant, registers, spills, shared memory, warps and stages (the compiled
        kernels' metadata, read from Triton's caches: for reports, e.g. the wave executor's row
        of bench/decode.py); none under the interpreter (nothing is compiled)."""
        out = []
        for k in list(self._kernels.values()):
            jit = load_kernel(k, self.kernel_copy)
            for cache in getattr(jit, "device_caches", {}).values():
                for compiled in list(cache[0].values()):
                    compiled._init_handles()  # (loads the module: registers and spills are known from here)
                    meta = compiled.metadata
                    out.append({"kernel": k.fn.variant_name, "regs": compiled.n_regs, "spills": compiled.n_spills,
                                "shared": meta.shared, "warps": meta.num_warps, "stages": meta.num_stages})
        return out

    def megakernel_occupancy(self, plan, stages: int | str | None = None) -> tuple[tuple[str, ...], np.ndarray]:
        """By threads and by shared memory (:func:`.megakernel.occupancy`)."""
        return occupancy(self, plan, stages)

    @property
    def compiles(self) -> bool:
        """Kernels are compiled for the GPU (not run by the Triton interpreter)."""
        return self.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"

    def programs(self, kernel: RenderedKernel) -> int:
        """How many programs a persistent kernel launches (0: not persistent): one per
        multiprocessor on a GPU; 3 under the interpreter (which runs them one by one), so that a
        program takes several pairs. "blocks": a task's, BLOCK_PROGRAMS a multiprocessor (2
        under the interpreter)."""
        if not kernel.persistent:
            return 0
        if kernel.persistent == "blocks":
            return self.block_programs()
        if not self.compiles:
            return 3
        return self._sms()

    def block_programs(self) -> int:
        """The programs a task of a "blocks" kernel launches: BLOCK_PROGRAMS a multiprocessor (2
        under the interpreter)."""
        if not self.compiles:
            return 2
        return self._sms() * BLOCK_PROGRAMS

    def _sms(self) -> int:
        """The device's multiprocessors."""
        return torch.cuda.get_device_properties(self.device.index or 0).multi_processor_count

    def shared_limit(self) -> int:
        """Bytes of shared memory one program may use on this device."""
        if self._shared is None:
            p = torch.cuda.get_device_properties(self.device.index or 0)
            self._shared = int(getattr(p, "shared_memory_per_block_optin", 0) or p.shared_memory_per_block)
        return self._shared

    def captures(self, variants) -> bool:
        return capturable(variants)

    def launches_per_batch(self, batch: TaskBatch) -> int:
        split = native_split(batch.fn)
        if split is not None and batch.size:
            cut = parts(batch, split, task_env(batch), allocate=False)
            return sum(self.launches_per_batch(a) + self.launches_per_batch(b)
                       for a, b, _, _ in chunked(cut.first, cut.second))
        if has_collective(batch.fn):
            return 1 if batch.size else 0
        return len(self.groups(batch)) if batch.size else 0

    def groups(self, batch: TaskBatch, env: dict | None = None) -> list[LaunchGroup]:
        """The launches of a batch: its tasks partitioned by the ``split`` mode (aligned or not,
        and full or not with "masks"), each part with the flags every one of its tasks allows
        and its own grid (``env``: the batch's :func:`~.tables.task_env`, if the caller has it)."""
        fn, size = batch.fn, batch.size
        env = task_env(batch) if env is None else env
        if fn.parallel is not None:
            ext = torch.as_tensor(evaluate(fn.parallel.extent, env)).reshape(-1).expand(size)
        else:
            ext = torch.ones(size, dtype=torch.int64)
        false = torch.zeros(size, dtype=torch.bool)
        even = even_masks(fn, env) if self.even else {p.name: false for p in fn.memrefs}
        align = {p.name: aligned(batch.mems[p.name].col0, batch.mems[p.name].cols).expand(size)
                 if self.align else false for p in fn.memrefs}
        all_align = torch.stack(list(align.values())).all(0) if align else torch.ones(size, dtype=torch.bool)
        if self.split == "masks":
            all_even = torch.stack(list(even.values())).all(0)
            keys = all_even.long() * 2 + all_align.long()
            parts = [torch.nonzero(keys == k).flatten() for k in (3, 2, 1, 0)]
        elif self.split == "align":
            parts = [torch.nonzero(all_align == k).flatten() for k in (True, False)]
        else:
            parts = [torch.arange(size)]
        out = []
        for idx in parts:
            if idx.numel() == 0:
                continue
            pmax = int(ext[idx].max())
            if pmax <= 0:
                continue
            if pmax > _MAX_GRID_Y:
                raise ExecutionError(f"`{fn.variant_name}`: parallel axis `{fn.parallel.var}` has extent "
                                     f"{pmax}; a launch takes at most {_MAX_GRID_Y}")
            flags = {f"EVEN_{m}": bool(v[idx].all()) for m, v in even.items()}
            flags.update({f"ALIGN_{m}": bool(v[idx].all()) for m, v in align.items()})
            out.append(LaunchGroup(idx, (idx.numel(), pmax), flags))
        return out


def aligned(col0, cols) -> torch.Tensor:
    """Per task: the region's first column and width are multiples of ``ALIGN`` (``ALIGN_<p>``)."""
    c0, w = (torch.as_tensor(v).reshape(-1).cpu() for v in (col0, cols))
    return (c0 % ALIGN == 0) & (w % ALIGN == 0)


__all__ = ["TritonBackend", "pdl_mode"]
