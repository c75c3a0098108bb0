"""Build task graphs by running generated orchestration C against the runtime.

:class:`CompiledProgram` lowers a module (binary expansion, or the plain base-tile loops with
``adaptive=False``), generates its C, and compiles it together with the runtime sources into
one cffi module, cached on disk by content hash (a warm start runs no compiler). Its
:meth:`~CompiledProgram.build_graph` registers the tensors and function variants for given
scalars and submits every task from C; the result is a :class:`Graph` around the runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from pto.cache.cbuild import load_cffi_module, write_source
from pto.codegen.c_orch import COrchestration, generate_c
from pto.errors import RegionError, RuntimeStatusError
from pto.ir.nodes import IncoreFunction, Module
from pto.machine.target import Target
from pto.passes.expansion.binary_expansion import expand_binary, strip_adaptive
from pto.runtime import ERR_REGION, Runtime, runtime_cdef, runtime_include_dir, runtime_sources
from pto.text.printer import format_module

_COMPILED: dict[tuple[str, bool, str | None], CompiledProgram] = {}


@dataclass
class Graph:
    """A built task graph: the runtime holding it and the names behind its ids."""

    program: CompiledProgram
    runtime: Runtime
    scalars: dict[str, int]
    tensor_ids: dict[str, int]
    func_ids: list[int]  # runtime func id of each variant, in program.variants order
    build_ms: float
    stats: dict = field(default_factory=dict)

    @property
    def variants(self) -> list[IncoreFunction]:
        return [v.func for v in self.program.corch.variants]

    def variant_of_func_id(self) -> dict[int, IncoreFunction]:
        return {fid: v for fid, v in zip(self.func_ids, self.variants)}

    def tasks_per_variant(self) -> dict[IncoreFunction, int]:
        """How many tasks of each variant the graph holds."""
        import numpy as np

        ex = self.runtime.export()
        fids, counts = np.unique(ex.func, return_counts=True)
        by_id = self.variant_of_func_id()
        return {by_id[int(f)]: int(c) for f, c in zip(fids, counts)}

    @property
    def tasks(self) -> int:
        return int(self.stats["tasks_submitted"])

    @property
    def edges(self) -> int:
        return int(self.stats["edges"])

    def dump(self, path: str | Path) -> None:
        self.runtime.dump(path)

    def close(self) -> None:
        self.runtime.close()


class CompiledProgram:
    """A module lowered, turned into C and compiled with the runtime (cached by content)."""

    def __init__(self, module: Module, adaptive: bool = True, target: Target | None = None):
        self.module = module
        self.adaptive = adaptive
        self.lowered = expand_binary(module) if adaptive else strip_adaptive(module)
        self.corch: COrchestration = generate_c(self.lowered)
        if target is not None:
            # every variant the program can call (tile heights from binary expansion included)
            from pto.passes.tiling import check_sram

            for v in self.corch.variants:
                check_sram(v.func, target)
        name = self.corch.name
        path = write_source(name, self.corch.source)
        self.lib = load_cffi_module(
            f"orch_{name}", runtime_cdef() + self.corch.cdef,
            # the wrapper must see the prototypes (an implicit declaration returns int)
            '#include "pto_runtime.h"\n' + self.corch.cdef,
            sources=[*runtime_sources(), path], include_dirs=[runtime_include_dir()])
        self._fns = {k: getattr(self.lib.lib, f"pto_{name}_{k}") for k in ("setup", "build", "call_site")}

    @classmethod
    def get(cls, module: Module, adaptive: bool = True, target: Target | None = None) -> CompiledProgram:
        """A cached instance per (module text, adaptive, target); with ``target`` every
        variant's live tiles must fit its SRAM."""
        key = (format_module(module), adaptive, target)
        hit = _COMPILED.get(key)
        if hit is None:
            hit = _COMPILED[key] = cls(module, adaptive, target)
        return hit

    @property
    def variants(self):
        return self.corch.variants

    def build_graph(self, scalars: dict[str, int], window: int = 0, count_only: bool = False,
                    concurrent: bool = False) -> Graph:
        """Register tensors and variants, then submit every task (from C)."""
        missing = [s for s in self.corch.scalars if s not in scalars]
        if missing:
            raise RegionError(f"`{self.corch.name}` needs scalar{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)}")
        ffi = self.lib.ffi
        rt = Runtime(window=window, count_only=count_only, concurrent=concurrent, lib=self.lib)
        try:
            graph = self._run(rt, ffi, scalars)
        except Exception:
            rt.close()
            raise
        return graph

    def start(self, scalars: dict[str, int], rt: Runtime, lib=None):
        """Register tensors and variants on ``rt``; returns (tensor_ids, func_ids, build) where
        ``build()`` submits every task and may run on another thread (concurrent runtimes).
        ``lib``: another compiled module holding this orchestration and ``rt``'s runtime (the
        native executor's)."""
        ffi = (lib or self.lib).ffi
        fns = self._fns if lib is None else {k: getattr(lib.lib, f"pto_{self.corch.name}_{k}") for k in self._fns}
        sc = ffi.new("int64_t[]", [int(scalars[s]) for s in self.corch.scalars] or [0])
        tids = ffi.new("int32_t[]", max(len(self.corch.tensors), 1))
        fids = ffi.new("int32_t[]", max(len(self.corch.variants), 1))
        st = fns["setup"](rt.ptr, sc, tids, fids)
        if st != 0:
            raise RuntimeStatusError(f"`{self.corch.name}` setup: {_last_error(rt)}", st)
        tensor_ids = {t: tids[i] for i, t in enumerate(self.corch.tensors)}
        func_ids = [fids[i] for i in range(len(self.corch.variants))]

        def build():
            failed = ffi.new("int32_t *", -1)
            status = fns["build"](rt.ptr, sc, tids, fids, failed)
            if status != 0:
                site = ffi.string(fns["call_site"](failed[0])).decode() if failed[0] >= 0 else ""
                msg = _last_error(rt)
                text = f"{site}: {msg}" if site else msg
                if status == ERR_REGION:  # a region outside its tensor: the program's mistake
                    raise RegionError(text)
                raise RuntimeStatusError(text, status)

        return tensor_ids, func_ids, build

    def _run(self, rt: Runtime, ffi, scalars) -> Graph:
        tensor_ids, func_ids, build = self.start(scalars, rt)
        t0 = time.perf_counter()
        build()
        build_ms = (time.perf_counter() - t0) * 1e3
        return Graph(self, rt, dict(scalars), tensor_ids, func_ids, build_ms, rt.stats())


def _last_error(rt: Runtime) -> str:
    return rt.ffi.string(rt.api.lib.pto_last_error(rt.ptr)).decode(errors="replace")


__all__ = ["CompiledProgram", "Graph"]
