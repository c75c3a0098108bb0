"""Compiling InCore functions rendered to C (:mod:`pto.codegen.c_incore`), through the
content-hash cache of :mod:`pto.cache.cbuild`: a module of kernels alone (:func:`kernel_module`: a
batch of the wave executor, the op tests) or a whole program (:func:`program_module`: the
runtime, the orchestration, the kernels and the worker pool in one shared object, which the
native executor drives).

The kernels are compiled for this machine (``-O3 -march=native``), so the cache key carries the
machine's identity too (:func:`host_tag`): a cache shared by two machines never hands one the
other's instructions. ``-ffp-contract=fast`` lets the matrix products and polynomials of
``pto_tile.h`` use fused multiply-adds; no elementwise op has a multiply-add to contract (each is
one operation per element, rounded and stored), so their results stay the evaluator's.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass
from types import ModuleType

from pto.cache.cbuild import load_cffi_module, write_source
from pto.codegen.c_incore import CIncore, render_incore
from pto.codegen.c_orch import COrchestration
from pto.ir.nodes import IncoreFunction
from pto.runtime import kernel_cdef, runtime_cdef, runtime_include_dir, runtime_sources

#: what the generated kernels are compiled with besides pto.cache.cbuild's flags
KERNEL_CFLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math")


@functools.lru_cache(maxsize=1)
def host_tag() -> str:
    """A short hash of this machine's processor (model and instruction-set flags): part of the
    compile flags, hence of the cache key, because ``-march=native`` means this machine."""
    ident = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    ident += line
    except OSError:
        pass
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def cflags() -> tuple[str, ...]:
    return (*KERNEL_CFLAGS, f"-DPTO_HOST_{host_tag()}")


@dataclass
class KernelModule:
    """A compiled set of kernels: ``incore`` (what was rendered) and ``module`` (cffi: ``.ffi``,
    ``.lib`` with ``pto_<name>_kernel`` and ``pto_<name>_run``)."""

    incore: CIncore
    module: ModuleType

    def run(self, k: int, regions, scalars, n_tasks: int) -> int:
        """Run ``n_tasks`` tasks of kernel ``k`` (cffi pointers to their regions and scalars)."""
        return getattr(self.module.lib, f"pto_{self.incore.name}_run")(k, regions, scalars, n_tasks)


_KERNELS: dict[tuple, KernelModule] = {}


def kernel_module(variants: list[IncoreFunction], name: str = "kernels") -> KernelModule:
    """The kernels of ``variants`` (specialized) in one compiled module (cached in memory by the
    variants, on disk by the source)."""
    key = (tuple(variants), name)
    hit = _KERNELS.get(key)
    if hit is None:
        inc = render_incore(list(variants), name)
        path = write_source(inc.name + "_incore", inc.source)
        module = load_cffi_module(f"kern_{name}", kernel_cdef() + inc.cdef, '#include "pto_runtime.h"\n' + inc.cdef,
                                  sources=[path], include_dirs=[runtime_include_dir()], extra_compile_args=cflags())
        hit = _KERNELS[key] = KernelModule(inc, module)
    return hit


@dataclass
class ProgramModule:
    """A compiled program: the runtime, the orchestration ``corch`` and its variants' kernels
    ``incore`` (in ``corch.variants`` order), and the worker pool, in ``module``."""

    corch: COrchestration
    incore: CIncore
    module: ModuleType

    def fn(self, entry: str):
        """``pto_<name>_<entry>`` of the orchestration (setup, build, call_site) or of the
        kernels (kernel)."""
        return getattr(self.module.lib, f"pto_{self.corch.name}_{entry}")


_PROGRAMS: dict[tuple, ProgramModule] = {}


def program_module(corch: COrchestration) -> ProgramModule:
    """Runtime + orchestration + kernels + pool in one module (cached in memory by the
    orchestration and its variants: one orchestration may call functions of other dtypes, e.g.
    another format of quantized weights; on disk by the sources)."""
    key = (corch.source, tuple(v.func for v in corch.variants))
    hit = _PROGRAMS.get(key)
    if hit is None:
        inc = render_incore([v.func for v in corch.variants], corch.name)
        orch_path = write_source(corch.name, corch.source)
        inc_path = write_source(inc.name + "_incore", inc.source)
        cdef = corch.cdef + inc.cdef
        module = load_cffi_module(f"native_{corch.name}", runtime_cdef() + cdef, '#include "pto_runtime.h"\n' + cdef,
                                  sources=[*runtime_sources(), orch_path, inc_path],
                                  include_dirs=[runtime_include_dir()], extra_compile_args=cflags())
        hit = _PROGRAMS[key] = ProgramModule(corch, inc, module)
    return hit


__all__ = ["KERNEL_CFLAGS", "KernelModule", "ProgramModule", "cflags", "host_tag", "kernel_module", "program_module"]
