"""Launch settings and launches of the Triton backend.

:class:`LaunchConfig` is the typed launch configuration of one kernel: Triton's launch keywords
(``num_warps``, ``num_stages``, ``enable_fp_fusion``), the parallel axis's program order
(``GROUP``) and the code-generation options a schedule may switch (:class:`RenderOptions`
fields). It reads as a mapping of those keywords, so ``jit[grid](*args, **cfg)`` launches with
it. :func:`merged` is the one rule for a kernel that runs the device functions of several
configurations (the persistent megakernel; the batched kernels under ``--deterministic``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

import torch

from pto.codegen.triton import RenderOptions
from pto.errors import ExecutionError, ResourceError, UsageError

log_fit = logging.getLogger("pto.schedules")  # a launch's depth lowered to fit the device
#: the RenderOptions a schedule may switch: not ``pdl``, ``tma`` and ``pre``, which are the
#: backend's (they need a compiled kernel on sm_90; PDL goes with the launch keyword; what a kernel
#: may load before its wait depends on the launch before it; TritonBackend checks all three), nor
#: ``qgemv_warps``, ``qgemv_warps_by`` and ``qgemv_cols``, which set the rendered kernel's warps
#: (a launch sets ``num_warps`` itself)
CODEGEN = tuple(f.name for f in fields(RenderOptions)
                if f.name not in ("pdl", "tma", "pre", "qgemv_warps", "qgemv_warps_by", "qgemv_cols"))
#: Triton launch options passed through as given (a schedule file may name them)
_TRITON_EXTRA = ("maxnreg", "num_ctas")


@dataclass(frozen=True, eq=False)
class LaunchConfig(Mapping):
    """How one kernel launches (see the module docstring). ``group`` is None for a kernel
    without a parallel axis (it takes no ``GROUP``); ``codegen``: RenderOptions fields."""

    num_warps: int = 4
    num_stages: int = 1
    enable_fp_fusion: bool = False
    group: int | None = None
    codegen: tuple[tuple[str, object], ...] = field(default=())
    extra: tuple[tuple[str, object], ...] = field(default=())  # maxnreg, num_ctas

    @classmethod
    def of(cls, settings: Mapping, where: str = "launch settings") -> LaunchConfig:
        """From a mapping of launch keywords (a schedule entry, an override, the renderer's
        heuristics); an unknown key is refused, naming ``where`` it came from."""
        return cls().updated(settings, where)

    def updated(self, settings: Mapping, where: str = "launch settings") -> LaunchConfig:
        """These settings with ``settings``' keys replacing theirs."""
        if isinstance(settings, LaunchConfig):
            settings = dict(settings)
        plain, codegen, extra = {}, dict(self.codegen), dict(self.extra)
        for k, v in settings.items():
            if k in ("num_warps", "num_stages"):
                plain[k] = int(v)
            elif k == "enable_fp_fusion":
                plain[k] = bool(v)
            elif k == "GROUP":
                plain["group"] = int(v)
            elif k in CODEGEN:
                codegen[k] = v
            elif k in _TRITON_EXTRA:
                extra[k] = v
            else:
                raise UsageError(f"{where}: unknown launch setting {k!r} (known: num_warps, num_stages, "
                                 f"enable_fp_fusion, GROUP, {', '.join(CODEGEN + _TRITON_EXTRA)})")
        return replace(self, **plain, codegen=tuple(sorted(codegen.items())), extra=tuple(sorted(extra.items())))

    def kwargs(self) -> dict:
        """Triton's launch keywords (and ``GROUP`` for a kernel with a parallel axis)."""
        out = {"num_warps": self.num_warps, "num_stages": self.num_stages, "enable_fp_fusion": self.enable_fp_fusion,
               **dict(self.extra)}
        if self.group is not None:
            out["GROUP"] = self.group
        return out

    def options(self, base: RenderOptions) -> RenderOptions:
        """``base`` with the code-generation options this configuration switches."""
        return replace(base, **dict(self.codegen)) if self.codegen else base

    # a read-only mapping of every setting (what **cfg passes, what --show prints)
    def _items(self) -> dict:
        return {**self.kwargs(), **dict(self.codegen)}

    def __getitem__(self, key: str):
        return self._items()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items().items())))

    def __repr__(self) -> str:
        return repr(self._items())


def merged(configs: list[LaunchConfig]) -> LaunchConfig:
    """The launch settings of one kernel that runs the device functions of several launch
    configurations (the megakernel; the batched kernels under ``--deterministic``): the most
    warps any asks for (a branch gets at least the threads it was tuned with) and FMA contraction
    if any allows it. Pipelining depth is not merged: it is each variant's own, on its loops
    (:func:`pto.codegen.triton.megakernel.fit_megakernel`), so the kernel's own depth is 1."""
    return LaunchConfig(num_warps=max((c.num_warps for c in configs), default=4), num_stages=1,
                        enable_fp_fusion=any(c.enable_fp_fusion for c in configs))


@dataclass
class LaunchGroup:
    """One launch of a prepared batch: the tasks ``tasks`` (indices into the batch), which share
    the constexpr flags, on grid (len(tasks), largest parallel extent)."""

    tasks: torch.Tensor
    grid: tuple[int, int]
    flags: dict[str, bool]
    table: torch.Tensor | None = None


def triton_error(e: Exception, what: str, cfg: Mapping) -> ExecutionError:
    """One line for an error Triton raised compiling or launching ``what`` (a kernel and where
    its settings come from) with launch settings ``cfg``: the resource and the setting that asked
    for too much of it, or the compiler's first line."""
    settings = ", ".join(f"{k}={cfg[k]}" for k in ("num_warps", "num_stages") if k in cfg)
    required, limit = getattr(e, "required", None), getattr(e, "limit", None)
    if required is not None and limit is not None:
        return ResourceError(f"{what}: needs {int(required):,} bytes of {getattr(e, 'name', 'a resource')} with "
                             f"{settings} (the device allows {int(limit):,}); lower num_stages for it")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return ExecutionError(f"{what}: Triton failed with {settings}: {first}")


def calls(groups: list[LaunchGroup], args: tuple, cfg: LaunchConfig, pdl: str = "", programs: int = 0,
          blocks: bool = False) -> list[tuple]:
    """``(grid, arguments, keyword arguments)`` of each group's launch; ``pdl``: the kernel was
    rendered with the PDL prologue (``RenderedKernel.pdl``), so it launches with ``launch_pdl``
    (never otherwise: a dependent launch must wait before its first access); ``programs``: the
    kernel loops over its pairs (``RenderedKernel.persistent``), launched on at most this many
    programs (the device's multiprocessors); ``blocks``: over each task's parallel indices
    (persistent "blocks"), a grid of the tasks by at most ``programs`` programs each."""
    out = []
    kw = cfg.kwargs() | ({"launch_pdl": True} if pdl else {})
    for g in groups:
        nb, np_ = g.grid
        if blocks:
            out.append(((nb, max(1, min(np_, programs))), (g.table, *args), {**g.flags, **kw, "NB": nb, "NP": np_}))
        elif cfg.group is not None:  # a parallel axis: the kernel also takes the grid's extents
            grid = (nb * np_,) if cfg.group > 0 else g.grid
            grid = (min(nb * np_, programs),) if programs else grid
            out.append((grid, (g.table, *args), {**g.flags, **kw, "NB": nb, "NP": np_}))
        elif programs:
            out.append(((min(nb, programs),), (g.table, *args), {**g.flags, **kw, "NB": nb}))
        else:
            out.append((g.grid, (g.table, *args), {**g.flags, **kw}))
    return out


def fit_calls(jit, launches: list[tuple], limit: int, what: str) -> list[tuple]:
    """The calls with each launch's pipelining depth lowered until its compiled kernel fits
    ``limit`` bytes of shared memory (compiled here, before any launch). A schedule is measured
    on the specializations its tuning run launched; a residual tile's masked path can need more
    shared memory at the same depth. Raises :class:`ResourceError` when one stage is too much."""
    from triton.errors import TritonError

    out = []
    for grid, a, kw in launches:
        kw = dict(kw)
        while True:
            try:
                need = int(jit.warmup(*a, grid=grid, **kw).metadata.shared)
            except TritonError as e:
                raise triton_error(e, what, kw) from e
            if need <= limit:
                break
            if kw.get("num_stages", 1) <= 1:
                raise ResourceError(f"{what}: needs {need:,} bytes of shared memory with num_warps="
                                    f"{kw.get('num_warps')}, num_stages=1 (the device allows {limit:,})")
            log_fit.info("pto: %s: num_stages %d needs %d bytes of shared memory (the device allows %d); "
                         "lowered", what, kw["num_stages"], need, limit)
            kw["num_stages"] -= 1
        out.append((grid, a, kw))
    return out


def unfit_specializations(kernel, cfg: LaunchConfig, device: torch.device, programs: int, limit: int,
                          copy: str | None = None) -> list[str]:
    """The specializations of ``kernel`` (every region full or not, aligned or not) that need more
    than ``limit`` bytes of shared memory with launch settings ``cfg`` (compiled, not launched;
    ``programs``: :func:`calls`'; ``copy``: the kernel's copy to compile, :func:`~.loader.load_kernel`):
    a schedule is kept only if none (``pto tune``), since a residual tile's masked path may need
    more than the full tiles it was measured on."""
    from pto.backends.triton.loader import load_kernel

    fn = kernel.fn
    jit = load_kernel(kernel, copy)
    # what the compiled code depends on: dtypes, 16-divisible pointers and strides, the table's type
    args = [x for p in fn.memrefs for x in (torch.empty(16, 16, dtype=p.dtype.torch, device=device), 16)]
    table = torch.zeros(1, max(kernel.layout.width, 1), dtype=torch.int32, device=device)
    bad = []
    for even, align in ((True, True), (True, False), (False, True), (False, False)):
        flags = {f"EVEN_{p.name}": even for p in fn.memrefs} | {f"ALIGN_{p.name}": align for p in fn.memrefs}
        flags |= {f"TMA_{m}": False for m in kernel.tma} | {f"D_{m}": None for m in kernel.tma}
        grid, a, kw = calls([LaunchGroup(torch.zeros(1), (1, 1), flags, table)], tuple(args), cfg, kernel.pdl,
                            programs, kernel.persistent == "blocks")[0]
        need = int(jit.warmup(*a, grid=grid, **kw).metadata.shared)
        if need > limit:
            bad.append(f"{'full' if even else 'masked'}, {'aligned' if align else 'unaligned'} regions need "
                       f"{need:,} bytes of shared memory (the device allows {limit:,})")
    return bad


def with_descriptors(kernel, batch, groups: list[LaunchGroup], launches: list[tuple], safe: dict) -> list[tuple]:
    """The launches (one per group) with the tensor-descriptor arguments of the kernel's TMA
    memrefs (:mod:`pto.codegen.triton.tma`): a descriptor of the whole tensor where every task
    of the launch may read through it (``safe``: per memref, per task of the batch:
    :func:`~pto.backends.triton.tables.descriptor_masks`) and the hardware takes the tensor
    (16-byte aligned base and row stride, contiguous rows), else none and the pointer loads."""
    if not kernel.tma:
        return launches
    from triton.tools.tensor_descriptor import TensorDescriptor

    uses = [{m: bool(safe[m][g.tasks.cpu()].all()) for m in kernel.tma} for g in groups]
    descs = {}
    for m, block in kernel.tma.items():
        t = batch.mems[m].tensor
        ok = (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0 and min(t.shape) > 0
              and max(t.shape) < 2**31 and (t.stride(0) * t.element_size()) % 16 == 0)
        descs[m] = TensorDescriptor(t, list(t.shape), list(t.stride()), list(block)) \
            if ok and any(u[m] for u in uses) else None
    out = []
    for use, (grid, a, kw) in zip(uses, launches):
        on = {m: u and descs[m] is not None for m, u in use.items()}
        out.append((grid, a, {**kw, **{f"TMA_{m}": v for m, v in on.items()},
                              **{f"D_{m}": descs[m] if v else None for m, v in on.items()}}))
    return out


def launcher(jit, launches: list[tuple] | None, groups: list[LaunchGroup], what: str = "", future=None):
    """The closure the executor calls: Triton launches only (no allocation, no host sync).
    ``future``: the launches are being compiled on a worker (:mod:`.ahead`; ``launches`` None):
    the first call waits for them (and raises what compiling raised); ``launch.pending`` says
    whether the compile is still running."""
    from triton.errors import TritonError

    done = [launches]

    def launch():
        if done[0] is None:
            done[0] = future.result()
        try:
            for grid, a, kw in done[0]:
                jit[grid](*a, **kw)
        except TritonError as e:  # compiling (first launch) or loading the kernel
            raise triton_error(e, what, done[0][0][2]) from e

    launch.groups = groups  # for inspection; the closure keeps the tables alive anyway
    launch.count = len(groups) if launches is None else len(launches)
    launch.pending = future is not None and not future.done()
    launch.future = future
    return launch


__all__ = ["CODEGEN", "LaunchConfig", "LaunchGroup", "merged", "triton_error", "calls", "fit_calls", "launcher",
           "unfit_specializations", "with_descriptors"]
