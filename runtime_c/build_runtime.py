"""Where the PTO C runtime's files are, for the code that compiles or copies them.

:func:`runtime_sources` lists the C files of the runtime, :func:`runtime_cdef` is the cdef
text (``pto_runtime_api.h`` verbatim) and :func:`runtime_include_dir` the ``-I`` directory;
pto compiles them with :func:`pto.cache.cbuild.load_cffi_module`, alone or together with generated
orchestration C::

    load_cffi_module("orch", runtime_cdef() + ORCH_CDEF, '#include "pto_runtime.h"\\n' + ORCH_C,
                     sources=runtime_sources(), include_dirs=[runtime_include_dir()])

:func:`portable_files` is what ``pto codegen`` copies next to generated code so that it builds
without Python (``cc -O2 -Wall -Wextra -Werror DIR/*.c``).
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def runtime_include_dir() -> Path:
    """Directory holding ``pto_runtime.h`` and ``pto_runtime_api.h``."""
    return _HERE


#: The runtime's C files (plain C99, no platform headers), one part each; the private header
#: pto_runtime_internal.h describes them.
CORE_SOURCES = ("pto_mem.c", "pto_map.c", "pto_task.c", "pto_registry.c", "pto_inspect.c", "pto_runtime.c")
#: Headers the core needs: the public ones and the private one the parts share.
CORE_HEADERS = ("pto_runtime.h", "pto_kernel_abi.h", "pto_runtime_api.h", "pto_runtime_internal.h")


#: The runtime's parts on pthreads: the sync hooks and the native pool of worker threads.
THREAD_SOURCES = ("pto_sync_posix.c", "pto_native.c")


def runtime_sources() -> list[Path]:
    """C files that make up the runtime (the core plus its pthread parts)."""
    return [*(_HERE / n for n in (*CORE_SOURCES, *THREAD_SOURCES))]


def native_files() -> list[Path]:
    """What a folder of generated code adds to :func:`portable_files` to run its graph natively
    (the InCore functions as C, main.c's ``--run``): the tile arithmetic, the worker pool and the
    standalone driver with its safetensors reader; ``cc DIR/*.c -lm -pthread`` builds them all."""
    return [_HERE / n for n in ("pto_tile.h", "pto_native.c", "pto_standalone.h", "pto_safetensors.h")]


def portable_files() -> list[Path]:
    """Headers and C files of the runtime that generated code builds with on its own (no
    threads: the pthread sync adapter stays out); ``cc DIR/*.c`` compiles them all."""
    return [_HERE / n for n in (*CORE_HEADERS, "pto_orch.h", *CORE_SOURCES)]


def kernel_cdef() -> str:
    """The cdef text of the compiled InCore functions' types: ``pto_kernel_abi.h`` verbatim."""
    return (_HERE / "pto_kernel_abi.h").read_text()


def runtime_cdef() -> str:
    """The cdef text: ``pto_kernel_abi.h`` and ``pto_runtime_api.h`` verbatim."""
    return kernel_cdef() + (_HERE / "pto_runtime_api.h").read_text()
