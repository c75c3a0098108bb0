"""The backend interface and the registry of backends.

A backend turns a :class:`pto.batch.TaskBatch` into a launch: ``launch = backend.prepare(batch)``
does everything that can be done once (compile, upload the offset table) and ``launch()`` runs
it. Backends are registered by name in :data:`BACKENDS`; ``auto`` picks the fastest one the
device supports and keeps one that works everywhere (seed 001's dispatch rule).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping

from pto.batch import TaskBatch
from pto.errors import UsageError

Launch = Callable[[], None]  # with an int attribute ``count``: the device launches it makes


class Backend:
    """Turns task batches into launches."""

    name = ""
    #: launches may be captured in a CUDA graph (no host synchronization inside)
    graph_capturable = False

    def prepare(self, batch: TaskBatch) -> Launch:
        """Everything that can be done once; the returned callable runs the batch and carries
        ``count``, the number of device launches it makes (for ``launches`` in reports)."""
        raise NotImplementedError

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

    #: programmatic-dependent-launch policy ("auto": the executor tells each batch whether the
    #: next loads early, TaskBatch.chain; "" for a backend without PDL)
    pdl = ""

    def loads_early(self, batch: TaskBatch) -> frozenset[str]:
        """The memrefs ``batch``'s launch loads before it waits for the previous launch."""
        return frozenset()

    def launch_config(self, fn, tasks: int = 1) -> Mapping:
        """The launch settings of a batch of ``tasks`` tasks of ``fn`` (a mapping of launch
        keywords; ``GROUP``: the parallel axis's program order); none for a backend without
        launch settings."""
        return {}

    def megakernel(self, plan, tensors, settings):
        """A whole graph's plan (:class:`pto.exec.plan.Plan`) compiled into one persistent kernel,
        for a backend with the ``megakernel`` capability (:func:`capable`)."""
        raise UsageError(f"the persistent executor needs a backend that compiles a megakernel; --backend {self.name} "
                         "needs --executor waves")

    def uniform_launch(self, graph) -> dict[str, dict]:
        """Launch overrides that make every batch of ``graph`` compute exactly as the persistent
        executor's kernel does (``--deterministic``); none for a backend without launch settings."""
        return {}


#: what a backend can do, asked by name (executors and checks never compare backend names):
#: ``megakernel``: it compiles a whole graph into one persistent kernel (the persistent
#: executor runs on it); ``cpu_f32_only``: on the CPU it computes in f32 only (an interpreter);
#: ``native``: it compiles a whole program to run by the C runtime's workers (the native executor)
CAPABILITIES = ("megakernel", "cpu_f32_only", "native")

#: name -> (module, class, what it needs, its capabilities)
BACKENDS = {
    "triton": ("pto.backends.triton", "TritonBackend", "generated Triton kernels (a GPU, or the CPU "
               "interpreter with TRITON_INTERPRET=1: f32, small shapes)", frozenset({"megakernel", "cpu_f32_only"})),
    "torch": ("pto.backends.torch_backend", "TorchBackend", "the batched tile evaluator in torch (any device)",
              frozenset()),
    "c": ("pto.backends.c", "CBackend", "InCore functions compiled to C, run by the C runtime's worker threads "
          "(the CPU, with a C compiler)", frozenset({"native"})),
}


def capable(name: str, capability: str) -> bool:
    """Whether backend ``name`` has ``capability`` (one of :data:`CAPABILITIES`), without
    importing it."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown backend capability {capability!r} (one of {', '.join(CAPABILITIES)})")
    return name in BACKENDS and capability in BACKENDS[name][3]


def names() -> list[str]:
    return list(BACKENDS)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve(name: str, device: str) -> str:
    """``auto`` is triton on a GPU with Triton installed, c on the CPU where a C compiler is
    installed, torch otherwise (the reference, and the fallback). Triton on the CPU needs the
    interpreter (TRITON_INTERPRET=1, f32, small shapes)."""
    from pto.cbuild import compiler_available

    if name != "auto" and name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r} (choose auto, {', '.join(BACKENDS)})")
    if name == "auto":
        if device == "cuda":
            return "triton" if triton_available() else "torch"
        return "c" if compiler_available() else "torch"
    if name == "c":
        if device != "cpu":
            raise UsageError(f"--backend c runs on the CPU; --device {device} needs --backend triton or torch")
        if not compiler_available():
            raise UsageError("--backend c needs a C compiler (cc, or $CC); none is installed")
    if name == "triton":
        if not triton_available():
            raise UsageError("--backend triton: the triton package is not installed (pip install -e \".[triton]\")")
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--backend triton on the CPU needs TRITON_INTERPRET=1 (the Triton "
                             "interpreter; f32 and small shapes only)")
    return name


def get_backend(name: str, device: str = "cpu", launch: dict[str, dict] | None = None,
                shipped: tuple = ()) -> Backend:
    """An instance of backend ``name`` for ``device``; ``launch``: per InCore function launch
    parameters, ``shipped``: the folders of the program's shipped schedules
    (:attr:`pto.program.Program.schedules`; backends without launch parameters ignore both)."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r} (choose {', '.join(BACKENDS)})")
    module, cls, _, _ = BACKENDS[name]
    return getattr(importlib.import_module(module), cls).create(device, launch or {}, tuple(shipped))
