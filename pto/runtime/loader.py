"""Finding, compiling and loading the C runtime (runtime_c/), and the constants it defines.

The runtime's sources, headers and cdef come from ``runtime_c/build_runtime.py``, found beside
the installed package (``pto/runtime_c``) or at the top of a source checkout (``runtime_c/``);
:func:`load_runtime_module` compiles them through :mod:`pto.cache.cbuild` (cached by content hash).

The status codes (``OK``, ``ERR_INVALID`` ... ``ERR_LIMIT``) and task states (``TASK_OPEN`` ...
``TASK_RETIRED``) are the enum constants ``pto_status`` and ``pto_task_state`` of
``pto_runtime_api.h`` as the compiled library exposes them, without the ``PTO_`` prefix:
:func:`runtime_constants` reads them on first use, so importing the binding compiles nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from pto.cache.cbuild import load_cffi_module
from pto.errors import RuntimeStatusError

_ENUMS = ("pto_status", "pto_task_state")
_constants: dict[str, int] | None = None


def _runtime_c_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # pto/
    for cand in (package / "runtime_c", package.parent / "runtime_c"):  # installed, then source tree
        if (cand / "pto_runtime_api.h").is_file():
            return cand
    raise RuntimeStatusError("cannot find the runtime C sources (runtime_c/pto_runtime_api.h)")


def _build_script() -> ModuleType:
    path = _runtime_c_dir() / "build_runtime.py"
    spec = importlib.util.spec_from_file_location("_pto_runtime_c_build", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def runtime_include_dir() -> Path:
    """Directory with ``pto_runtime.h`` (pass it as an include dir when compiling C that uses it)."""
    return _runtime_c_dir()


def runtime_sources() -> list[Path]:
    """The runtime's C files, to compile together with other C through :mod:`pto.cache.cbuild`."""
    return _build_script().runtime_sources()


def runtime_portable_files() -> list[Path]:
    """The headers and C files a generated orchestration needs to build without Python (``pto
    codegen`` copies them): everything but the pthread sync adapter."""
    return _build_script().portable_files()


def kernel_cdef() -> str:
    """The cdef text of compiled InCore functions' types (``pto_kernel_abi.h``), for a module of
    kernels without the runtime."""
    return _build_script().kernel_cdef()


def runtime_native_files() -> list[Path]:
    """The files a generated folder adds to run its graph natively (``pto codegen``)."""
    return _build_script().native_files()


def runtime_cdef() -> str:
    """The runtime's cdef text (``pto_runtime_api.h``), to prepend to another module's cdef."""
    return _build_script().runtime_cdef()


def load_runtime_module() -> ModuleType:
    """The bare runtime as a compiled cffi module (cached; compiled on first use)."""
    return load_cffi_module("pto_runtime", runtime_cdef(), '#include "pto_runtime.h"\n',
                            sources=runtime_sources(), include_dirs=[runtime_include_dir()])


def runtime_constants() -> dict[str, int]:
    """``{"OK": 0, "ERR_INVALID": -1, ..., "TASK_OPEN": 1, ...}`` from the compiled runtime."""
    global _constants
    if _constants is None:  # built whole, then published: a racing thread never sees half of it
        module = load_runtime_module()
        _constants = {cname.removeprefix("PTO_"): getattr(module.lib, cname)
                      for enum in _ENUMS for cname in module.ffi.typeof(enum).relements}
    return _constants
