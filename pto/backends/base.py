"""The backend interface and the registry of backends.

A backend turns a :class:`pto.data.batch.TaskBatch` into a launch: ``launch = backend.prepare(batch)``
does everything that can be done once (compile, upload the offset table) and ``launch()`` runs
it. :class:`Backend` declares everything an executor or the engine may call; an executor asks
what a backend can do (its :attr:`~Backend.capabilities`, :func:`capable`) and never imports a
concrete one. Backends are found like programs: every entry point of the ``pto.backends`` group
(:mod:`pto.plugins`) names a :class:`Backend` subclass. ``auto`` picks, among the backends that
offer themselves for the device (:meth:`Backend.auto_candidate`), the one of the highest
:attr:`~Backend.auto_rank` (the fastest where it runs; the torch backend runs everywhere: seed
001's dispatch rule).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pto import plugins
from pto.errors import UsageError

if TYPE_CHECKING:  # torch: the command line lists the backends before importing it
    from pto.data.batch import TaskBatch

Launch = Callable[[], None]  # with an int attribute ``count``: the device launches it makes

GROUP = "pto.backends"

#: what a backend can do, asked by name (executors and checks never compare backend names):
#: ``megakernel``: it compiles a whole graph into one persistent kernel (the persistent
#: executor runs on it); ``cpu_f32_only``: on the CPU it computes in f32 only (an interpreter);
#: ``native``: it compiles a whole program for the C runtime's workers (the native executor)
CAPABILITIES = ("megakernel", "cpu_f32_only", "native")


class Backend(ABC):
    """Turns task batches into launches (the module docstring). A subclass implements
    :meth:`create` and :meth:`prepare`; the rest has defaults for a backend without launch
    settings, megakernel or programmatic dependent launch."""

    name: ClassVar[str] = ""
    #: what it needs and does (``pto info``, the registry's messages)
    description: ClassVar[str] = ""
    #: what it can do (:data:`CAPABILITIES`)
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: ``auto``'s preference among the backends that offer themselves for a device (highest first)
    auto_rank: ClassVar[int] = 0
    #: launches may be captured in a CUDA graph (no host synchronization inside)
    graph_capturable = False
    #: programmatic-dependent-launch policy ("auto": the executor tells each batch whether the
    #: next loads early, TaskBatch.chain; "" for a backend without PDL)
    pdl = ""
    #: milliseconds :meth:`prepare` spent compiling kernels (or loading them from the disk cache)
    #: on the calling thread, in all (an instance's count): executors report a first run's apart
    #: from its execution (``ExecStats.kernel_compile_ms``)
    compile_ms = 0.0

    def __init__(self) -> None:
        #: per InCore function launch settings that override the backend's own (``--deterministic``
        #: puts :meth:`uniform_launch`'s here)
        self.launch_overrides: dict[str, dict] = {}

    # -- the registry's questions ----------------------------------------------------------------
    @classmethod
    @abstractmethod
    def create(cls, device, launch: dict[str, dict], shipped: tuple = ()) -> Backend:
        """An instance for ``device``; ``launch``: per InCore function launch parameters,
        ``shipped``: the folders of the program's shipped schedules
        (:attr:`pto.program.Program.schedules`; a backend without launch parameters ignores both)."""

    @classmethod
    def unusable(cls, device: str) -> str | None:
        """Why the backend cannot run on ``device`` as this process is set up (one line, the
        flag's words), or None."""
        return None

    @classmethod
    def auto_candidate(cls, device: str) -> bool:
        """Whether ``auto`` may pick this backend on ``device``."""
        return cls.unusable(device) is None

    @classmethod
    def modes(cls, target) -> dict[str, str]:
        """The modes the environment sets for this backend on a GPU of ``target`` (``pto info``
        lists them); none by default."""
        return {}

    # -- what executors call -----------------------------------------------------------------------
    @abstractmethod
    def prepare(self, batch: TaskBatch) -> Launch:
        """Everything that can be done once; the returned callable runs the batch and carries
        ``count``, the number of device launches it makes (for ``launches`` in reports)."""

    def prepare_ahead(self, batch: TaskBatch) -> Launch:
        """:meth:`prepare` for an executor that may hold the launch until it has planned the
        rest of its graph (a backend that compiles kernels may compile this one meanwhile)."""
        return self.prepare(batch)

    def captures(self, variants) -> bool:
        """Can a CUDA graph capture the batches of these variants (with ``graph_capturable``)?
        Not a collective's, unless the backend runs it without the host."""
        from pto.ir.analysis import has_collective

        return not any(has_collective(f) for f in variants)

    def launches_per_batch(self, batch: TaskBatch) -> int:
        """Device launches one prepared batch makes."""
        return self.prepare(batch).count

    def loads_early(self, batch: TaskBatch) -> frozenset[str]:
        """The memrefs ``batch``'s launch loads before it waits for the previous launch."""
        return frozenset()

    def launch_config(self, fn, tasks: int = 1) -> Mapping:
        """The launch settings of a batch of ``tasks`` tasks of ``fn`` (a mapping of launch
        keywords; ``GROUP``: the parallel axis's program order); none for a backend without
        launch settings."""
        return {}

    def uniform_launch(self, graph) -> dict[str, dict]:
        """Launch overrides that make every batch of ``graph`` compute exactly as the persistent
        executor's kernel does (``--deterministic``); none for a backend without launch settings."""
        return {}

    # -- the persistent executor's (a backend with the ``megakernel`` capability) ------------------
    def megakernel_settings(self, settings=None, **changes):
        """How this backend builds a megakernel: ``settings`` (the executor's, None: the
        defaults) with ``changes`` (``sentinel``, ``ignore``, ``segment``: which segment of a split
        plan the kernel runs); the result's ``programs`` is the
        programs of a launch where fixed (None: as many as fit on the GPU)."""
        raise UsageError(f"the persistent executor needs a backend that compiles a megakernel; --backend {self.name} "
                         "needs --executor waves")

    def megakernel(self, plan, tensors, settings, after=None):
        """A whole graph's plan (:class:`pto.exec.plan.Plan`) compiled into one persistent kernel,
        for a backend with the ``megakernel`` capability (:func:`capable`); a segment of a split
        plan is launched after the kernel ``after`` (the segment before it, on the same stream)."""
        raise UsageError(f"the persistent executor needs a backend that compiles a megakernel; --backend {self.name} "
                         "needs --executor waves")

    def megakernel_occupancy(self, plan, stages: int | str | None = None) -> tuple[tuple[str, ...], np.ndarray]:
        """Per branch of ``plan`` and resource (the names), how many programs a multiprocessor
        the branch alone allows, estimated before compiling (``[branches, resources]`` int): what
        the persistent executor's cut rule reads (:mod:`pto.exec.segments`); ``stages``: the
        megakernel settings' pipeline stages. No resource by default (the rule never cuts)."""
        return (), np.zeros((len(plan.branches), 0), np.int64)

    def task_flags(self, fn, env: dict, regions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per task and memref of a megakernel's plan (``regions``: ``[tasks, memrefs, 4]``,
        ``env``: per-task int64 vectors): may it skip masks, is its region aligned. None of
        either by default: every task on the masked path."""
        shape = (len(regions), len(fn.memrefs))
        return np.zeros(shape, bool), np.zeros(shape, bool)

    # -- the native executor's (a backend with the ``native`` capability) ------------------------
    def program(self, corch):
        """The whole program of the orchestration ``corch`` (:class:`pto.codegen.c_orch.COrchestration`)
        compiled with its runtime, its InCore functions and the worker pool, for a backend with the
        ``native`` capability: an object with ``module`` (cffi) and ``fn(entry)``."""
        raise UsageError(f"the native executor runs compiled programs; --backend {self.name} needs --executor waves")

    def row_stride(self, t, what: str, dtype) -> int:
        """The elements between the rows of tensor ``t`` as a compiled kernel addresses it (an
        ExecutionError naming ``what`` for a tensor it cannot address), for the native executor."""
        raise UsageError(f"the native executor runs compiled programs; --backend {self.name} needs --executor waves")


def backend_class(name: str) -> type[Backend]:
    """The class registered as backend ``name`` (UsageError naming the choices otherwise)."""
    cls = plugins.load(GROUP, name, "backend")
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise UsageError(f"backend {name!r}: entry point {plugins.group(GROUP)[name].value} is not a "
                         "pto.backends.Backend")
    return cls


def capable(name: str, capability: str) -> bool:
    """Whether backend ``name`` has ``capability`` (one of :data:`CAPABILITIES`)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown backend capability {capability!r} (one of {', '.join(CAPABILITIES)})")
    return name in names() and capability in backend_class(name).capabilities


def names() -> list[str]:
    """The registered backends' names, in their declaration order (pto's own first)."""
    return list(plugins.group(GROUP))


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve(name: str, device: str) -> str:
    """``auto``: the best backend that offers itself for ``device`` (the module docstring); a
    named one checked: registered, and usable here (:meth:`Backend.unusable`)."""
    have = names()
    if name != "auto" and name not in have:
        raise UsageError(f"unknown backend {name!r} (choose auto, {', '.join(have)})")
    if name == "auto":
        offered = [backend_class(n) for n in have if backend_class(n).auto_candidate(device)]
        if not offered:
            raise UsageError(f"no backend runs on {device} (registered: {', '.join(have)})")
        return max(offered, key=lambda c: c.auto_rank).name
    why = backend_class(name).unusable(device)
    if why is not None:
        raise UsageError(why)
    return name


def get_backend(name: str, device: str = "cpu", launch: dict[str, dict] | None = None,
                shipped: tuple = ()) -> Backend:
    """An instance of backend ``name`` for ``device``; ``launch``: per InCore function launch
    parameters, ``shipped``: the folders of the program's shipped schedules
    (:attr:`pto.program.Program.schedules`; backends without launch parameters ignore both)."""
    if name not in names():
        raise UsageError(f"unknown backend {name!r} (choose {', '.join(names())})")
    return backend_class(name).create(device, launch or {}, tuple(shipped))
