"""cffi API-mode build script of the PTO C runtime.

``ffibuilder`` builds the extension ``pto._pto_runtime`` from ``pto_runtime.c`` and the
pthread sync adapter ``pto_sync_posix.c``; its cdef is the declarations-only header
``pto_runtime_api.h`` read verbatim. ``python runtime_c/build_runtime.py`` compiles it into
``build/cffi/``. At run time pto uses :func:`pto.cbuild.load_cffi_module` with the helpers below
instead, which also lets generated orchestration C be compiled together with the runtime::

    load_cffi_module("orch", runtime_cdef() + ORCH_CDEF, '#include "pto_runtime.h"\\n' + ORCH_C,
                     sources=runtime_sources(), include_dirs=[runtime_include_dir()])
"""

from __future__ import annotations

import os
from pathlib import Path

import cffi

_HERE = Path(__file__).resolve().parent


def runtime_include_dir() -> Path:
    """Directory holding ``pto_runtime.h`` and ``pto_runtime_api.h``."""
    return _HERE


#: The runtime's C files (plain C99, no platform headers), one part each; the private header
#: pto_runtime_internal.h describes them.
CORE_SOURCES = ("pto_mem.c", "pto_map.c", "pto_task.c", "pto_registry.c", "pto_inspect.c", "pto_runtime.c")
#: Headers the core needs: the public ones and the private one the parts share.
CORE_HEADERS = ("pto_runtime.h", "pto_runtime_api.h", "pto_runtime_internal.h")


def runtime_sources() -> list[Path]:
    """C files that make up the runtime (the core plus the pthread sync adapter)."""
    return [*(_HERE / n for n in CORE_SOURCES), _HERE / "pto_sync_posix.c"]


def portable_files() -> list[Path]:
    """Headers and C files of the runtime that generated code builds with on its own (no
    threads: the pthread sync adapter stays out); ``cc DIR/*.c`` compiles them all."""
    return [_HERE / n for n in (*CORE_HEADERS, "pto_orch.h", *CORE_SOURCES)]


def runtime_cdef() -> str:
    """The cdef text: ``pto_runtime_api.h`` verbatim."""
    return (_HERE / "pto_runtime_api.h").read_text()


def _builder(relative: bool) -> cffi.FFI:
    """The cffi builder; setuptools' cffi_modules wants paths relative to the project root
    (it builds from there), a direct compile absolute ones (cffi compiles inside tmpdir)."""

    def path(p: Path) -> str:
        return os.path.relpath(p, _HERE.parent) if relative else str(p)

    ffi = cffi.FFI()
    ffi.cdef(runtime_cdef())
    ffi.set_source(
        "pto._pto_runtime",
        '#include "pto_runtime.h"\n',
        sources=[path(p) for p in runtime_sources()],
        include_dirs=[path(runtime_include_dir())],
        extra_compile_args=["-O2", "-std=c99"],
        extra_link_args=["-pthread"],
    )
    return ffi


ffibuilder = _builder(relative=True)

if __name__ == "__main__":
    print(_builder(relative=False).compile(tmpdir=str(_HERE.parent / "build" / "cffi"), verbose=True))
