"""Generated kernel sources on disk and their ``@triton.jit`` functions.

Sources go to ``$PTO_CACHE_DIR/triton/<hash>.py`` (default ``~/.cache/pto/triton``), written
atomically (a corrupt file is replaced and reported on the ``pto.cache`` logger) and compiled
from the source in hand, so no bytecode cache can go stale.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

from pto.cache.cachedir import cache_root
from pto.codegen.triton import RenderedKernel
from pto.errors import ExecutionError

#: (digest, copy) -> imported kernel module (copy None: the one all backends share)
_MODULES: dict[tuple[str, str | None], object] = {}
log = logging.getLogger("pto.cache")  # repairs of cache entries (as pto.cache.cbuild's)


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


def load_kernel(kernel: RenderedKernel, copy: str | None = None):
    """The ``@triton.jit`` function of a rendered kernel, imported from its cache file; ``copy``
    names a private copy of it (a function object of its own, compiled and locked apart from the
    shared one: :attr:`TritonBackend.kernel_copy <pto.backends.triton.backend.TritonBackend.kernel_copy>`)."""
    mod = _MODULES.get((kernel.digest, copy))
    if mod is None:
        if importlib.util.find_spec("triton") is None:
            raise ExecutionError("the triton backend needs the `triton` package (pip install triton)")
        path = cache_dir() / f"{kernel.digest}.py"
        _write_atomic(path, kernel.source)
        name = f"_pto_triton_{kernel.digest}" + (f"_{len(_MODULES)}" if copy is not None else "")
        # compiled from the source in hand, not through an import: no bytecode cache to go stale
        # or corrupt; Triton reads the function's source back from the file, which holds it
        mod = types.ModuleType(name)
        mod.__file__ = str(path)
        sys.modules[name] = mod
        exec(compile(kernel.source, str(path), "exec"), mod.__dict__)
        _MODULES[(kernel.digest, copy)] = mod
    return getattr(mod, kernel.name)


__all__ = ["cache_dir", "load_kernel"]
