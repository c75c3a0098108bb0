"""Compile C code into a cffi extension module, cached on disk under a content hash.

:func:`load_cffi_module` is the one entry point. It is generic: the runtime binding uses it
for the bare runtime, the benchmark for the runtime plus a C driver, and generated
orchestration C is compiled the same way (pass the orchestration source as ``source`` or as
a file in ``sources``, together with :func:`pto.runtime.runtime_sources`).

The cache key covers everything that changes the binary: the cdef, the inline source, the
contents of every source file and of every header in the include directories, the compile
arguments, the interpreter's ABI tag and the cffi version. A warm start hashes those inputs,
finds the module and imports it without running the compiler. A cold start builds in a
temporary directory next to the cache entry, imports the module from there and renames the
directory into place, so concurrent processes (pytest-xdist workers, two ``pto run`` at once)
never load a half-written module and never depend on another's: the first rename wins and the
others keep the identical module they built.

Every entry holds the SHA-256 of its module (``sha256``), checked before the module is loaded:
an entry that is truncated or corrupted (or does not load) is set aside, rebuilt, and reported
on the ``pto.cache`` logger (one line on stderr by default), never a crash; an entry without a
checksum (written by an older pto) is rebuilt without a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

import cffi

from pto.cache.cachedir import cache_root
from pto.errors import BuildError

#: Flags every translation unit gets; callers add theirs through ``extra_compile_args``.
BASE_CFLAGS = ("-O2", "-std=c99", "-Wall", "-Wextra", "-fPIC")
#: The cffi-generated wrapper is not ours to make warning-free; it gets no warning flags.
WRAPPER_CFLAGS = ("-O2", "-std=c99", "-fPIC")

_loaded: dict[str, ModuleType] = {}
_lock = threading.Lock()
#: where repairs of cache entries are reported (here and in pto.backends.triton)
log = logging.getLogger("pto.cache")
CHECKSUM = "sha256"
NO_CHECKSUM = "without a checksum"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def _linker() -> list[str]:
    ld = os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED")
    return shlex.split(ld) if ld else [*_compiler(), "-shared"]


def _headers(include_dirs: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for d in include_dirs:
        if d.is_dir():
            found.extend(sorted(p for p in d.iterdir() if p.suffix == ".h" and p.is_file()))
    return found


def _cache_key(name: str, cdef: str, source: str, sources: Sequence[Path], include_dirs: Sequence[Path],
               extra_compile_args: Sequence[str]) -> str:
    h = hashlib.sha256()

    def add(tag: str, data: bytes) -> None:
        h.update(f"{tag}:{len(data)}:".encode())
        h.update(data)

    add("name", name.encode())
    add("cdef", cdef.encode())
    add("source", source.encode())
    for p in sources:
        add("file", p.name.encode())
        add("content", p.read_bytes())
    for p in _headers(include_dirs):
        add("header", p.name.encode())
        add("content", p.read_bytes())
    add("args", "\0".join([*BASE_CFLAGS, *WRAPPER_CFLAGS, *extra_compile_args]).encode())
    add("compiler", "\0".join([*_compiler(), *_linker()]).encode())
    add("abi", f"{sys.implementation.cache_tag}:{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    add("cffi", cffi.__version__.encode())
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as exc:
        raise BuildError(f"cannot run the C compiler `{cmd[0]}`: {exc}") from exc
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()
        raise BuildError(f"C compilation failed (exit {proc.returncode}): {shlex.join(cmd)}\n{out}")


def _build(modname: str, cdef: str, source: str, sources: Sequence[Path], include_dirs: Sequence[Path],
           extra_compile_args: Sequence[str], workdir: Path) -> Path:
    ffi = cffi.FFI()
    try:
        ffi.cdef(cdef)
    except cffi.CDefError as exc:
        raise BuildError(f"cffi cannot parse the declarations for {modname}: {exc}") from exc
    ffi.set_source(modname, source)
    wrapper = workdir / f"{modname}.c"
    with contextlib.redirect_stdout(io.StringIO()):  # cffi announces the file it writes
        ffi.emit_c_code(str(wrapper))
    py_inc = {sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"]}
    incs = [f"-I{d}" for d in [*include_dirs, *sorted(py_inc)]]
    objects = []
    units = [(wrapper, WRAPPER_CFLAGS), *((Path(s), BASE_CFLAGS) for s in sources)]
    for i, (src, flags) in enumerate(units):
        obj = workdir / f"{i}_{src.stem}.o"
        _run([*_compiler(), *flags, *extra_compile_args, *incs, "-c", str(src), "-o", str(obj)], workdir)
        objects.append(str(obj))
    out = workdir / f"{modname}{sysconfig.get_config_var('EXT_SUFFIX')}"
    _run([*_linker(), *objects, "-o", str(out), "-pthread"], workdir)
    for obj in objects:
        os.unlink(obj)
    return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_problem(target: Path) -> str | None:
    """Why the cache entry of module file ``target`` cannot be trusted, or None if it can."""
    stamp = target.parent / CHECKSUM
    if not target.is_file():
        return "missing its module"
    if not stamp.is_file():
        return NO_CHECKSUM
    want = stamp.read_bytes().decode(errors="replace").strip()
    if _digest(target) != want:
        return f"corrupt (its {target.stat().st_size:,}-byte module does not match its checksum)"
    return None


def _set_aside(final: Path, target: Path) -> None:
    """Move a bad entry out of the way (unless another process has just replaced it with a good
    one) and delete it."""
    if entry_problem(target) is None:
        return
    away = final.parent / f".bad-{final.name[:12]}-{os.getpid()}-{threading.get_ident()}"
    try:
        os.rename(final, away)
    except OSError:
        return  # gone already: another process is repairing it
    if away.is_dir():
        shutil.rmtree(away, ignore_errors=True)
    else:
        away.unlink(missing_ok=True)


def _import(modname: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(modname, str(path))
    spec = importlib.util.spec_from_file_location(modname, path, loader=loader)
    if spec is None:
        raise BuildError(f"cannot import the compiled module {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def write_source(stem: str, text: str) -> Path:
    """Generated C as a file under the cache (``src/<stem>_<hash>.c``) for :func:`load_cffi_module`
    to compile: written once per content, atomically; a damaged copy is rewritten and reported."""
    data = text.encode()
    src_dir = cache_root() / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    path = src_dir / f"{stem}_{hashlib.sha256(data).hexdigest()[:16]}.c"
    if not path.exists() or path.read_bytes() != data:
        if path.exists():  # a truncated or corrupted copy: compiling it would fail or differ
            log.warning("pto: cache: the generated source %s was corrupt; rewritten", path)
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def compiler_available() -> bool:
    """Whether the C compiler pto would run (``$CC``, Python's, or ``cc``) is installed."""
    return shutil.which(_compiler()[0]) is not None


def load_cffi_module(name: str, cdef: str, source: str, sources: Sequence[Path | str] = (),
                     include_dirs: Sequence[Path | str] = (),
                     extra_compile_args: Sequence[str] = ()) -> ModuleType:
    """Compile (or find in the cache) a cffi API-mode module and import it.

    Args:
        name: a short name for the module (letters, digits, ``_``); the importable module
            name gets the content hash appended, so different builds never collide.
        cdef: declarations cffi exposes (``module.ffi`` / ``module.lib``).
        source: C text of the wrapper translation unit, usually ``#include`` lines.
        sources: further C files compiled and linked into the module.
        include_dirs: ``-I`` directories; the ``.h`` files directly in them are hashed.
        extra_compile_args: added to every compile command (e.g. ``["-O3"]``).

    Returns:
        the compiled module, with ``.ffi`` and ``.lib``. Repeated calls with the same inputs
        return the same module object.

    Raises:
        BuildError: the declarations do not parse or the compiler failed (its output is in
            the message).
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise BuildError(f"module name {name!r} is not an identifier")
    src_paths = [Path(s).resolve() for s in sources]
    inc_paths = [Path(d).resolve() for d in include_dirs]
    for p in src_paths:
        if not p.is_file():
            raise BuildError(f"C source {p} does not exist")
    key = _cache_key(name, cdef, source, src_paths, inc_paths, extra_compile_args)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        modname = f"_pto_{name}_{key[:16]}"
        final = cache_root() / "cffi" / key[:32]
        target = final / f"{modname}{sysconfig.get_config_var('EXT_SUFFIX')}"
        module = None
        if final.exists():
            problem = entry_problem(target)
            if problem is None:
                try:
                    module = _import(modname, target)
                except ImportError as exc:
                    problem = f"not loadable ({' '.join(str(exc).split())})"
            if problem is not None:
                _set_aside(final, target)
                # an entry of an older pto has no checksum: rebuilt quietly, it was not damaged
                level = logging.INFO if problem == NO_CHECKSUM else logging.WARNING
                log.log(level, "pto: cache: the compiled module %s was %s; rebuilt", final, problem)
        if module is None:
            module = _build_entry(modname, key, final, cdef, source, src_paths, inc_paths, extra_compile_args)
        _loaded[key] = module
        return module


def _build_entry(modname: str, key: str, final: Path, cdef: str, source: str, src_paths, inc_paths,
                 extra_compile_args) -> ModuleType:
    """Build into a temporary directory, import from there, then rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=final.parent))
    try:
        built = _build(modname, cdef, source, src_paths, inc_paths, extra_compile_args, tmp)
        (tmp / CHECKSUM).write_text(_digest(built) + "\n")
        module = _import(modname, built)  # loaded: the rename below cannot pull it away
        with contextlib.suppress(OSError):  # another process finished the same build first: identical
            os.rename(tmp, final)
        return module
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
