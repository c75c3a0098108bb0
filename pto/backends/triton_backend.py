"""The Triton backend: generated, batched kernels, a launch or two per task batch.

``prepare(batch)`` renders the batch's specialized InCore function (:mod:`pto.codegen.triton`,
cached per function and options), writes the source to a content-addressed file and imports it
(Triton's ``jit`` reads real source files), builds the per-task offset table once as a device
tensor, and picks the per-batch specializations (``EVEN_<p>``: the tasks' regions are full, so
loads and stores skip masks; ``ALIGN_<p>``: the regions start on a 16-column boundary). Tasks
that allow different specializations launch apart (at most 4 launches; usually 1, or 2 when a
few residual tiles join full ones). The launch it returns allocates nothing and never
synchronizes with the host, so the executor may capture it in a CUDA graph (after a first,
uncaptured call has compiled the kernels).

Sources go to ``$PTO_CACHE_DIR/triton/<hash>.py`` (default ``~/.cache/pto/triton``). On a CPU
the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``; f32 and f16, small shapes;
its bf16 conversions truncate, so bf16 is checked by compiling for sm_90 instead).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import tempfile
import types
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pto.backends.base import Backend, Launch
from pto.batch import RegionBatch, TaskBatch
from pto.cachedir import cache_root
from pto.codegen.triton import ALIGN, RenderedKernel, RenderOptions, access_bounds, render, render_sources
from pto.errors import BuildError, ExecutionError
from pto.ir.analysis import has_collective
from pto.ir.expr import evaluate
from pto.ir.nodes import IncoreFunction

_MODULES: dict[str, object] = {}  # digest -> imported kernel module (shared by all backends)
log = logging.getLogger("pto.cache")  # repairs of cache entries (as pto.cbuild's)
log_fit = logging.getLogger("pto.schedules")  # a launch's depth lowered to fit the device
_INT32_MAX = 2**31 - 1
_MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension


def cache_dir() -> Path:
    """Where generated kernel sources are written: ``$PTO_CACHE_DIR/triton`` or
    ``~/.cache/pto/triton``."""
    return cache_root() / "triton"


def _write_atomic(path: Path, text: str) -> None:
    """Make ``path`` hold ``text``: a file that holds anything else (truncated, corrupted) is
    replaced, and that is reported on the ``pto.cache`` logger."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    if path.exists():
        old = path.read_bytes()
        if old == data:
            return
        log.warning("pto: cache: the Triton source %s was corrupt (%d bytes, expected %d); rewritten", path,
                    len(old), len(data))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # readers see the old file or the whole new one, never a part
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_kernel(kernel: RenderedKernel):
    """The ``@triton.jit`` function of a rendered kernel, imported from its cache file."""
    mod = _MODULES.get(kernel.digest)
    if mod is None:
        if importlib.util.find_spec("triton") is None:
            raise ExecutionError("the triton backend needs the `triton` package (pip install triton)")
        path = cache_dir() / f"{kernel.digest}.py"
        _write_atomic(path, kernel.source)
        name = f"_pto_triton_{kernel.digest}"
        # compiled from the source in hand, not through an import: no bytecode cache to go stale
        # or corrupt; Triton reads the function's source back from the file, which holds it
        mod = types.ModuleType(name)
        mod.__file__ = str(path)
        sys.modules[name] = mod
        exec(compile(kernel.source, str(path), "exec"), mod.__dict__)
        _MODULES[kernel.digest] = mod
    return getattr(mod, kernel.name)


@dataclass
class LaunchGroup:
    """One launch of a prepared batch: the tasks ``tasks`` (indices into the batch), which share
    the constexpr flags, on grid (len(tasks), largest parallel extent)."""

    tasks: torch.Tensor
    grid: tuple[int, int]
    flags: dict[str, bool]
    table: torch.Tensor | None = None


class TritonBackend(Backend):
    """Generated Triton kernels: one launch per batch, or one per kind of task with ``split``.

    ``options``: :class:`RenderOptions` (e.g. ``input_precision="tf32"``). ``launch``: per
    InCore function overrides of the launch parameters, keyed by plain name (``gemm_tile``) or
    variant name (``gemm_tile__TK64_TM64_TN128``, which wins), e.g.
    ``{"gemm_tile": {"num_warps": 8, "num_stages": 4}}``. ``even``/``align``: allow the
    per-batch specializations. ``split``: launch the tasks whose regions are all full and
    aligned apart from the others (at most 4 launches a batch), so a few residual tiles do not
    put a whole batch on the masked path.
    """

    name = "triton"

    def __init__(self, device="cuda", options: RenderOptions | None = None,
                 launch: dict[str, dict] | None = None, even: bool = True, align: bool = True,
                 split: bool = True, schedules=None):
        self.device = torch.device(device)
        self.graph_capturable = self.device.type == "cuda"
        self.options = options or RenderOptions()
        self.launch_overrides = dict(launch or {})
        self.schedules = schedules  # a pto.schedules.ScheduleDB (None: the renderer's heuristics)
        self.even = even
        self.align = align
        self.split = split
        self._kernels: dict[tuple, RenderedKernel] = {}
        self._shared: int | None = None

    def kernel(self, fn: IncoreFunction, options: RenderOptions | None = None) -> RenderedKernel:
        """The rendered kernel of ``fn`` under ``options`` (default: this backend's; cached)."""
        opts = options or self.options
        k = self._kernels.get((fn, opts))
        if k is None:
            k = self._kernels[(fn, opts)] = render(fn, opts)
        return k

    @classmethod
    def create(cls, device, launch: dict[str, dict]) -> TritonBackend:
        from pto.schedules import for_device

        return cls(device, launch=launch, schedules=for_device(str(device)))

    def launch_config(self, fn: IncoreFunction, tasks: int = 1) -> dict:
        """Launch parameters for a batch of ``tasks`` tasks of ``fn``: the renderer's
        heuristics, then the schedule database's entry for the variant and the batch's shape
        bucket (the user's, else the shipped defaults; :mod:`pto.schedules`), then ``launch``
        for the plain name, then ``launch`` for the variant name."""
        kernel = self.kernel(fn)
        cfg = dict(kernel.launch)
        if self.schedules is not None:
            cfg.update(self.schedules.lookup(fn.name, fn.variant_name, tasks, kernel.digest)[0])
        cfg.update(self.launch_overrides.get(fn.name, {}))
        cfg.update(self.launch_overrides.get(fn.variant_name, {}))
        return cfg

    def launch_origin(self, fn: IncoreFunction, tasks: int = 1) -> str:
        """Where ``launch_config``'s settings come from, for messages: an override, the user's or
        the shipped schedule database, or the renderer's heuristics."""
        if fn.name in self.launch_overrides or fn.variant_name in self.launch_overrides:
            return "launch settings given to the backend"
        where = self.schedules.lookup(fn.name, fn.variant_name, tasks, self.kernel(fn).digest)[1] \
            if self.schedules is not None else "heuristic"
        return {"user": "the user's schedule database; pto tune --show lists it",
                "shipped": "the schedules shipped with pto; pto tune --show lists them"}.get(where, "the heuristics")

    def render_sources(self, functions) -> dict[str, str]:
        """``{filename: source}`` of the kernels of ``functions`` under this backend's options."""
        return render_sources(functions, self.options)

    def prepare(self, batch: TaskBatch) -> Launch:
        fn = batch.fn
        _check_batch(batch)
        if has_collective(fn):  # Triton kernels do not communicate: the torch evaluator, same device
            from pto.backends.torch_backend import TorchBackend

            return TorchBackend().prepare(batch)
        if batch.size == 0:
            return _launcher(None, [], [])
        cfg = self.launch_config(fn, batch.size)
        origin = self.launch_origin(fn, batch.size)
        # a schedule may switch code generation options (RenderOptions fields) as well
        fields = {k: cfg.pop(k) for k in list(cfg) if k in RenderOptions.__dataclass_fields__}
        kernel = self.kernel(fn, replace(self.options, **fields) if fields else None)
        jit = load_kernel(kernel)
        args = []
        for p in fn.memrefs:
            t = batch.mems[p.name].tensor
            args += [t, t.stride(0)]
        groups = self.groups(batch)
        device = batch.mems[fn.memrefs[0].name].tensor.device
        table = build_table(kernel, batch, device)
        for g in groups:
            g.table = table if len(g.tasks) == batch.size else table[g.tasks.to(device)].contiguous()
        what = f"`{kernel.name}` ({origin})"
        calls = _calls(groups, tuple(args), cfg)
        if self.compiles:
            calls = fit_calls(jit, calls, self.shared_limit(), what)
        return _launcher(jit, calls, groups, what)

    def uniform_launch(self, graph) -> dict[str, dict]:
        """Launch overrides (variant name -> parameters) that compile every batched kernel of
        ``graph`` as the persistent megakernel compiles its branches: the kernel-wide settings of
        :func:`pto.codegen.triton.megakernel.kernel_settings` (the most warps any variant asks for,
        FMA contraction if any allows it) and this backend's code-generation options (a schedule
        may not switch them for one kernel). Pipelining depth stays each variant's own: it reorders
        loads, not arithmetic. So both executors run identically compiled arithmetic."""
        import numpy as np

        from pto.codegen.triton.megakernel import kernel_settings

        ex = graph.runtime.export()
        by_id = graph.variant_of_func_id()
        fids, counts = np.unique(ex.func, return_counts=True)
        same = kernel_settings([self.launch_config(by_id[int(f)], int(n)) for f, n in zip(fids, counts)])
        same.update({f: getattr(self.options, f) for f in RenderOptions.__dataclass_fields__})
        return {by_id[int(f)].variant_name: dict(same) for f in fids}

    def unfit_specializations(self, fn: IncoreFunction, tasks: int = 1) -> list[str]:
        """The specializations of ``fn``'s batched kernel (every region full or not, aligned or
        not) that need more shared memory than the device has with the launch settings for
        ``tasks`` tasks as given (compiled, not launched): a schedule is kept only if none
        (``pto tune``), since a residual tile's masked path may need more than the full tiles it
        was measured on."""
        cfg = self.launch_config(fn, tasks)
        fields = {k: cfg.pop(k) for k in list(cfg) if k in RenderOptions.__dataclass_fields__}
        kernel = self.kernel(fn, replace(self.options, **fields) if fields else None)
        jit = load_kernel(kernel)
        # what the compiled code depends on: dtypes, 16-divisible pointers and strides, the table's type
        args = [x for p in fn.memrefs for x in (torch.empty(16, 16, dtype=p.dtype.torch, device=self.device), 16)]
        table = torch.zeros(1, max(kernel.layout.width, 1), dtype=torch.int32, device=self.device)
        bad = []
        for even, align in ((True, True), (True, False), (False, True), (False, False)):
            flags = {f"EVEN_{p.name}": even for p in fn.memrefs} | {f"ALIGN_{p.name}": align for p in fn.memrefs}
            grid, a, kw = _calls([LaunchGroup(torch.zeros(1), (1, 1), flags, table)], tuple(args), cfg)[0]
            need = int(jit.warmup(*a, grid=grid, **kw).metadata.shared)
            if need > self.shared_limit():
                bad.append(f"{'full' if even else 'masked'}, {'aligned' if align else 'unaligned'} regions need "
                           f"{need:,} bytes of shared memory (the device allows {self.shared_limit():,})")
        return bad

    @property
    def compiles(self) -> bool:
        """Kernels are compiled for the GPU (not run by the Triton interpreter)."""
        return self.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"

    def shared_limit(self) -> int:
        """Bytes of shared memory one program may use on this device."""
        if self._shared is None:
            p = torch.cuda.get_device_properties(self.device.index or 0)
            self._shared = int(getattr(p, "shared_memory_per_block_optin", 0) or p.shared_memory_per_block)
        return self._shared

    def launches_per_batch(self, batch: TaskBatch) -> int:
        if has_collective(batch.fn):
            return 1 if batch.size else 0
        return len(self.groups(batch)) if batch.size else 0

    def groups(self, batch: TaskBatch) -> list[LaunchGroup]:
        """The launches of a batch: its tasks partitioned by (all regions full, all regions
        aligned), each part with the flags every one of its tasks allows and its own grid."""
        fn, size = batch.fn, batch.size
        env = _task_env(batch)
        if fn.parallel is not None:
            ext = torch.as_tensor(evaluate(fn.parallel.extent, env)).reshape(-1).expand(size)
        else:
            ext = torch.ones(size, dtype=torch.int64)
        false = torch.zeros(size, dtype=torch.bool)
        even = even_masks(fn, env) if self.even else {p.name: false for p in fn.memrefs}
        align = {p.name: (torch.as_tensor(batch.mems[p.name].col0).reshape(-1).cpu() % ALIGN == 0)
                 .expand(size) if self.align else false for p in fn.memrefs}
        if self.split:
            all_even = torch.stack(list(even.values())).all(0)
            all_align = torch.stack(list(align.values())).all(0)
            keys = all_even.long() * 2 + all_align.long()
            parts = [torch.nonzero(keys == k).flatten() for k in (3, 2, 1, 0)]
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


def triton_error(e: Exception, what: str, cfg: dict) -> ExecutionError:
    """One line for an error Triton raised compiling or launching ``what`` (a kernel and where
    its settings come from) with launch settings ``cfg``: the resource and the setting that asked
    for too much of it, or the compiler's first line."""
    from pto.errors import ResourceError

    settings = ", ".join(f"{k}={cfg[k]}" for k in ("num_warps", "num_stages") if k in cfg)
    required, limit = getattr(e, "required", None), getattr(e, "limit", None)
    if required is not None and limit is not None:
        return ResourceError(f"{what}: needs {int(required):,} bytes of {getattr(e, 'name', 'a resource')} with "
                             f"{settings} (the device allows {int(limit):,}); lower num_stages for it")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return ExecutionError(f"{what}: Triton failed with {settings}: {first}")


def _calls(groups: list[LaunchGroup], args: tuple, cfg: dict) -> list[tuple]:
    """``(grid, arguments, keyword arguments)`` of each group's launch."""
    calls = []
    for g in groups:
        nb, np_ = g.grid
        if "GROUP" in cfg:  # a parallel axis: the kernel also takes the grid's extents
            grid = (nb * np_,) if cfg["GROUP"] > 0 else g.grid
            calls.append((grid, (g.table, *args), {**g.flags, **cfg, "NB": nb, "NP": np_}))
        else:
            calls.append((g.grid, (g.table, *args), {**g.flags, **cfg}))
    return calls


def fit_calls(jit, calls: list[tuple], limit: int, what: str) -> list[tuple]:
    """The calls with each launch's pipelining depth lowered until its compiled kernel fits
    ``limit`` bytes of shared memory (compiled here, before any launch). A schedule is measured
    on the specializations its tuning run launched; a residual tile's masked path can need more
    shared memory at the same depth. Raises :class:`ResourceError` when one stage is too much."""
    from triton.errors import TritonError

    out = []
    for grid, a, kw in calls:
        kw = dict(kw)
        while True:
            try:
                need = int(jit.warmup(*a, grid=grid, **kw).metadata.shared)
            except TritonError as e:
                raise triton_error(e, what, kw) from e
            if need <= limit:
                break
            if kw.get("num_stages", 1) <= 1:
                from pto.errors import ResourceError

                raise ResourceError(f"{what}: needs {need:,} bytes of shared memory with num_warps="
                                    f"{kw.get('num_warps')}, num_stages=1 (the device allows {limit:,})")
            log_fit.info("pto: %s: num_stages %d needs %d bytes of shared memory (the device allows %d); "
                         "lowered", what, kw["num_stages"], need, limit)
            kw["num_stages"] -= 1
        out.append((grid, a, kw))
    return out


def _launcher(jit, calls: list[tuple], groups: list[LaunchGroup], what: str = "") -> Launch:
    """The closure the executor calls: Triton launches only (no allocation, no host sync)."""
    from triton.errors import TritonError

    def launch():
        try:
            for grid, a, kw in calls:
                jit[grid](*a, **kw)
        except TritonError as e:  # compiling (first launch) or loading the kernel
            raise triton_error(e, what, calls[0][2]) from e

    launch.groups = groups  # for inspection; the closure keeps the tables alive anyway
    launch.count = len(calls)
    return launch


def _check_batch(batch: TaskBatch) -> None:
    fn = batch.fn
    if fn.dims:
        raise ExecutionError(f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first")
    missing = [p.name for p in fn.memrefs if p.name not in batch.mems] + \
              [p.name for p in fn.scalars if p.name not in batch.scalars]
    if missing:
        raise ExecutionError(f"`{fn.name}`: no binding for {', '.join(missing)}")
    for p in fn.memrefs:
        t = batch.mems[p.name].tensor
        if t.dtype != p.dtype.torch:
            raise ExecutionError(f"`{fn.name}`: memref `{p.name}` is {p.dtype} but the tensor is {t.dtype}")
        if t.dim() != 2 or not t.is_contiguous():
            raise ExecutionError(f"`{fn.name}`: tensor for `{p.name}` must be 2-D and contiguous")


def _task_env(batch: TaskBatch) -> dict:
    """Scalar environment of the batch (int64 CPU vectors): scalars and ``p.rows``/``p.cols``."""
    size = batch.size

    def vec(v):
        return torch.as_tensor(v).reshape(-1).to("cpu", torch.int64).expand(size)

    env = {k: vec(v) for k, v in batch.scalars.items()}
    for name, rb in batch.mems.items():
        env[f"{name}.rows"] = vec(rb.rows)
        env[f"{name}.cols"] = vec(rb.cols)
    return env


def build_table(kernel: RenderedKernel, batch: TaskBatch, device) -> torch.Tensor:
    """The ``B x F`` per-task table on ``device``: int32 unless a value needs int64 (the kernel
    follows the table's type)."""
    cols = []
    size = batch.size
    for name in kernel.layout.memrefs:
        rb = batch.mems[name]
        cols += [rb.row0, rb.col0, rb.rows, rb.cols]
    for name in kernel.layout.scalars:
        cols.append(batch.scalars[name])
    vecs = [torch.as_tensor(c).to(device=device, dtype=torch.int64).reshape(-1).expand(size) for c in cols]
    tab = torch.stack(vecs, dim=1)
    big = tab.numel() and int(tab.abs().max().item()) > _INT32_MAX
    return tab.contiguous() if big else tab.to(torch.int32).contiguous()


def even_masks(fn: IncoreFunction, env: dict) -> dict[str, torch.Tensor]:
    """Per memref, per task: does every access stay inside the region's valid extent (so the
    task may skip masks)? ``env`` holds per-task int64 vectors."""
    size = len(next(iter(env.values())))
    out = {}
    for mem, accesses in access_bounds(fn).items():
        ok = torch.full((size,), accesses is not None)
        try:
            for a in accesses or ():
                ok &= _inside(evaluate(a.row_lo, env), evaluate(a.row_hi, env), a.rows, env[f"{mem}.rows"])
                ok &= _inside(evaluate(a.col_lo, env), evaluate(a.col_hi, env), a.cols, env[f"{mem}.cols"])
        except (ZeroDivisionError, BuildError):
            ok = torch.zeros(size, dtype=torch.bool)
        out[mem] = ok
    return out


def _inside(lo, hi, n: int, limit) -> torch.Tensor:
    """Offsets in [lo, hi] plus a block of n stay in [0, limit), per task. ``lo <= hi`` is
    required too: bounds assume positive symbolic divisors, and a loop that runs zero times
    (hi < lo) may as well keep its masks."""
    lo, hi = torch.as_tensor(lo), torch.as_tensor(hi)
    return (lo >= 0) & (lo <= hi) & (hi + n <= limit)


_DEFAULT: dict[str, TritonBackend] = {}


def run_incore_triton(fn: IncoreFunction, regions: dict[str, tuple],
                      scalars: dict[str, int] | None = None) -> None:
    """Run one task through the Triton backend, in place: ``regions[p] = (tensor, row0, col0,
    rows, cols)``; scalars are ints (as the reference interpreter's ``run_incore``)."""
    if fn.dims:
        raise ExecutionError(f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first")
    mems = {}
    for name, (t, r0, c0, nr, nc) in regions.items():
        mems[name] = RegionBatch(t, *(torch.tensor([int(v)], device=t.device) for v in (r0, c0, nr, nc)))
    dev = next(iter(regions.values()))[0].device
    sc = {k: torch.tensor([int(v)], device=dev) for k, v in (scalars or {}).items()}
    be = _DEFAULT.get(str(dev))
    if be is None:
        be = _DEFAULT[str(dev)] = TritonBackend(dev)
    be.prepare(TaskBatch(fn, mems, sc, 1))()


__all__ = ["TritonBackend", "LaunchGroup", "run_incore_triton", "load_kernel", "build_table", "even_masks",
           "cache_dir"]
