"""Python binding of the PTO C runtime (runtime_c/), in two layers.

:class:`RuntimeLib` is the thin layer: one method per C function, turning a non-zero status
into :class:`pto.errors.RuntimeStatusError` whose message is the runtime's last-error text.
:class:`Runtime` is the Pythonic layer on top (context manager, numpy arrays, dicts).

Both only use ``module.ffi`` and ``module.lib`` of a compiled cffi module that contains the
runtime, so a module that also holds other C (generated orchestration code compiled with
:func:`runtime_sources`) works too: ``Runtime(lib=that_module)``, and pass ``rt.ptr`` to its
functions. The text dump that :meth:`Runtime.dump` writes is parsed by :mod:`pto.runtime.dump`.
Arguments are checked before they reach C (a bad one raises ``RuntimeStatusError`` with status
``ERR_INVALID``, never a cffi exception); the status codes ``OK``, ``ERR_*`` and task states
``TASK_*`` are attributes of this package, read from the compiled library on first use.

The modules, each one job:

- :mod:`pto.runtime.loader`: finding and compiling the C sources; the status and state constants;
- :mod:`pto.runtime.checks`: the argument checks and their rules;
- :mod:`pto.runtime.lib`: the thin layer, :class:`RuntimeLib`;
- :mod:`pto.runtime.api`: the Pythonic layer, :class:`Runtime`, and :class:`GraphExport`;
- :mod:`pto.runtime.dump`: the text dump, parsed (:func:`~pto.runtime.dump.read_dump`);
- :mod:`pto.runtime.graph`: a module's generated orchestration C compiled with the runtime
  (:class:`~pto.runtime.graph.CompiledProgram`) and run into a task graph (:class:`~pto.runtime.graph.Graph`).

The package's front (these names) imports neither the dump nor the graph module.
"""

from __future__ import annotations

import contextlib
import re

from pto.runtime.api import GraphExport, Runtime
from pto.runtime.lib import RuntimeLib
from pto.runtime.loader import (
    kernel_cdef,
    load_runtime_module,
    runtime_cdef,
    runtime_constants,
    runtime_include_dir,
    runtime_native_files,
    runtime_portable_files,
    runtime_sources,
)

_ENUM_NAME = re.compile(r"OK|ERR_[A-Z_]+|TASK_[A-Z]+")


def __getattr__(name: str) -> int:
    # OK, ERR_INVALID, ..., TASK_OPEN, ...: looked up on first use, so importing compiles nothing
    if _ENUM_NAME.fullmatch(name):
        with contextlib.suppress(KeyError):
            return runtime_constants()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GraphExport", "Runtime", "RuntimeLib", "kernel_cdef", "load_runtime_module", "runtime_cdef",
           "runtime_include_dir", "runtime_native_files", "runtime_portable_files", "runtime_sources"]
