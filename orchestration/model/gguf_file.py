"""A GGUF file (llama.cpp's checkpoint format: metadata key/values, then tensors, many of them
block-quantized) read through the maintained ``gguf`` package.

:func:`open_gguf` parses the header once per file and process and keeps the last few files
opened, so that reading the configuration, the tokenizer and the weights of one file parses it
once. The gguf package's reader takes seconds over the token list of a 50K vocabulary (4.8 s for
SmolLM2's on a shared 2-core machine: most of ``pto generate``'s start on a warm cache), so what
it parsed (the metadata's values and where each tensor's data lies) is kept in the cache folder
(:func:`pto.cache.cachedir.cache_root`, ``gguf/``), keyed by the file's path, size and modification
time and by the gguf package's version: a later process reads it back in milliseconds and maps
the tensors' data where the reader would. Tensor data stays memory-mapped until
:meth:`GGUFFile.tensor` dequantizes it.

GGUF writes a tensor's dimensions innermost first (``ne``): a ``[rows, columns]`` matrix in
numpy's order is ``ne = [columns, rows]``. Everything here speaks numpy's (and torch's) order.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from pto.errors import UsageError
from pto.ir.dtypes import dtype_of

_MISSING = object()
_OPEN: dict[tuple, GGUFFile] = {}  # (path, mtime, size) -> parsed file, least recent first
_KEEP = 4
#: what a cached header holds (a change of its layout bumps it), and how many are kept
HEADER_FORMAT = 1
KEEP_HEADERS = 64


T = TypeVar("T")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UsageError("reading GGUF files needs the `gguf` package (pip install 'pto[model]')") from None
    return gguf


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that begins with GGUF's magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def from_checkpoint(path: str | os.PathLike, folder: Callable[[Path], T], gguf: Callable[[GGUFFile], T]) -> T:
    """``folder(path)`` for a Hugging Face model folder, ``gguf(the open file)`` for a GGUF file;
    one UsageError naming ``path`` for anything else (what every reader of a checkpoint accepts;
    :func:`given_as` adds the flag that gave it)."""
    p = Path(path)
    if p.is_dir():
        return folder(p)
    if is_gguf(p):
        return gguf(open_gguf(p))
    if not p.exists():
        raise UsageError(f"{path}: no such file or folder")
    raise UsageError(f"{path}: neither a GGUF file nor a Hugging Face model folder (with config.json)")


@contextmanager
def given_as(flag: str, path: str | os.PathLike) -> Iterator[None]:
    """An error about the checkpoint ``path`` (its message begins with the path, or with a file
    in its folder) begins with ``flag`` and the path as the user wrote it: ``--gguf m.gguf:
    truncated: ...`` (the readers name the file alone: they do not know which flag gave it)."""
    try:
        yield
    except UsageError as e:
        msg, given = str(e), os.fspath(path)
        for form in dict.fromkeys((given, str(Path(given)))):
            rest = msg[len(form):] if msg.startswith(form) else ""
            if rest[:1] in (":", " "):
                raise UsageError(f"{flag} {given}{rest}") from None
            if rest[:1] == os.sep:  # a file in the folder
                raise UsageError(f"{flag} {given}: {msg}") from None
        raise


class _Truncated(Exception):
    """The file ended inside its header: ``at`` the offset being read, ``after`` the last
    metadata key read whole (None: none yet), ``in_tensors``: in the list of tensors."""

    def __init__(self, at: int, after: str | None, in_tensors: bool):
        super().__init__(at)
        self.at, self.after, self.in_tensors = at, after, in_tensors

    def message(self, size: int) -> str:
        where = "its list of tensors" if self.in_tensors else \
            f"its metadata, after key {self.after!r}" if self.after else "its first bytes"
        return f"truncated: the file ends at byte {size:,}, in {where}"


def _reader_class(gguf):
    """``gguf.GGUFReader`` that tells where a short file ends, instead of an IndexError from
    deep in numpy: inside the header, :class:`_Truncated`; inside the tensor data, the reader is
    made whole with empty data and ``cut_off`` set (so every tensor's extent is known)."""

    class Reader(gguf.GGUFReader):
        cut_off = False

        def _get(self, offset, dtype, count=1, override_order=None):
            count = int(count)
            end = offset + np.dtype(dtype).itemsize * count
            if end > len(self.data):
                if not hasattr(self, "data_offset"):  # still in the header
                    keys = [k for k in self.fields if not k.startswith("GGUF.")]
                    done = "GGUF.kv_count" in self.fields and \
                        len(keys) == int(self.fields["GGUF.kv_count"].parts[0][0])
                    raise _Truncated(offset, keys[-1] if keys else None, done)
                self.cut_off = True
                return np.zeros(count, dtype)  # never read: the file is refused
            return super()._get(offset, dtype, count, override_order)

    return Reader


def _cut_off_message(reader) -> str:
    size = len(reader.data)
    needed = max(t.data_offset + int(t.n_bytes) for t in reader.tensors)
    first = min((t for t in reader.tensors if t.data_offset + int(t.n_bytes) > size), key=lambda t: t.data_offset)
    return f"truncated: {size:,} of its {needed:,} bytes (missing from the data of tensor {first.name} on)"


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """The parsed file at ``path`` (the last few opened are reused while unchanged on disk)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise UsageError(f"{path}: no such file") from None
    key = (os.path.realpath(p), st.st_mtime_ns, st.st_size)
    f = _OPEN.pop(key, None) or GGUFFile(p)
    _OPEN[key] = f  # the most recent last
    while len(_OPEN) > _KEEP:
        del _OPEN[next(iter(_OPEN))]
    return f


@dataclass(frozen=True)
class TensorHeader:
    """A tensor as the file describes it: its name, its storage type (``gguf``'s
    ``GGMLQuantizationType``), its dimensions as GGUF writes them (``ne``: innermost first) and its
    data where it lies in the memory-mapped file, as the ``gguf`` package's reader views it
    (numpy's order; a block-quantized type as rows of bytes)."""

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """One GGUF file: its metadata (:meth:`value`), the headers of its tensors (:meth:`shape`,
    :meth:`qtype`) and their values (:meth:`tensor`). Every problem is one UsageError line
    naming the file (and the key or tensor)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        _gguf()
        if not self.path.is_file():
            self.fail("no such file")
        if not is_gguf(self.path):
            self.fail("not a GGUF file (it does not begin with the GGUF magic bytes)")
        #: the metadata's values by key, in the file's order; the tensors' headers by name
        self.values, self.tensors = _cached_header(self.path) or self._parse()

    def _parse(self) -> tuple[dict[str, Any], dict[str, TensorHeader]]:
        """The header through the gguf package's reader (and kept in the cache for the next
        process, :func:`_store_header`)."""
        gguf = _gguf()
        try:
            reader = _reader_class(gguf)(self.path)
        except _Truncated as t:
            self.fail(t.message(self.path.stat().st_size))
        except (ValueError, KeyError) as e:  # the reader's own findings: a version, a type, a duplicate
            self.fail(f"not a readable GGUF file: its header is corrupt ({str(e).splitlines()[0][:120]})")
        except Exception:  # anything else from deep in the reader says nothing to a user
            self.fail("not a readable GGUF file: its header is corrupt")
        if reader.cut_off:
            self.fail(_cut_off_message(reader))
        values = {k: f.contents() for k, f in reader.fields.items()}
        tensors = {t.name: TensorHeader(t.name, t.tensor_type, tuple(int(n) for n in t.shape), t.data)
                   for t in reader.tensors}
        _store_header(self.path, values, [(t, int(t.data_offset)) for t in reader.tensors])
        return values, tensors

    def fail(self, msg: str):
        raise UsageError(f"{self.path}: {msg}")

    def metadata_keys(self) -> list[str]:
        """The metadata keys, in the file's order (GGUF's own bookkeeping ``GGUF.*`` left out)."""
        return [k for k in self.values if not k.startswith("GGUF.")]

    def has(self, key: str) -> bool:
        return key in self.values

    def value(self, key: str, default=_MISSING):
        """The value of metadata ``key``: a number, bool, string, or a list of them; ``default``
        when absent (without one, a missing key is a UsageError naming it)."""
        if key not in self.values:
            if default is _MISSING:
                self.fail(f"no metadata key {key!r}")
            return default
        return self.values[key]

    def integer(self, key: str, default=_MISSING, minimum: int = 0):
        """A metadata value that must be an integer of at least ``minimum`` (``default``, as it
        is, when the key is absent)."""
        if not self.has(key) and default is not _MISSING:
            return default
        v = self.value(key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            self.fail(f"metadata {key} must be an integer of at least {minimum}, got {v!r}")
        return int(v)

    def number(self, key: str, default=_MISSING) -> float:
        """A metadata value that must be a positive number (``default`` when absent)."""
        if not self.has(key) and default is not _MISSING:
            return default
        v = self.value(key)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not v > 0:
            self.fail(f"metadata {key} must be a positive number, got {v!r}")
        return float(v)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape in numpy's order, from its header."""
        return tuple(int(n) for n in reversed(self._info(name).shape))

    def qtype(self, name: str) -> str:
        """Tensor ``name``'s storage type (``F32``, ``F16``, ``Q4_1``, ``Q8_0``, ``Q4_K``, ...)."""
        return self._info(name).tensor_type.name

    def _info(self, name: str):
        t = self.tensors.get(name)
        if t is None:
            self.fail(f"no tensor {name!r}")
        return t

    def quantized(self, name: str, shape: tuple[int, int], device="cpu"):
        """Matrix ``name`` (of ``shape``, checked) as the file stores it, its blocks repacked (a
        :class:`pto.quant.QTensor`; its type must run natively: :func:`pto.quant.format_of_gguf`)."""
        from pto.quant import QTensor, format_of_gguf, from_gguf

        t = self._info(name)
        if self.shape(name) != tuple(shape):
            self.fail(f"tensor {name} is {' x '.join(map(str, self.shape(name)))} but the metadata needs "
                      f"{' x '.join(map(str, shape))}")
        fmt = format_of_gguf(t.tensor_type.name)
        if fmt is None:
            self.fail(f"tensor {name} is stored as {t.tensor_type.name}, which pto does not run quantized")
        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(shape[0], -1))  # (a copy: the map is read-only)
        return QTensor(dtype_of(fmt.name), from_gguf(fmt, raw, shape[1]).to(device), shape[1])

    def tensor(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device="cpu") -> torch.Tensor:
        """Tensor ``name`` dequantized and cast to ``dtype`` on ``device``, after checking from its
        header that it has ``shape`` (numpy order)."""
        t = self._info(name)
        if self.shape(name) != tuple(shape):
            self.fail(f"tensor {name} is {' x '.join(map(str, self.shape(name)))} but the metadata needs "
                      f"{' x '.join(map(str, shape))}")
        from gguf.quants import dequantize

        try:
            values = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            self.fail(f"tensor {name} is stored as {t.tensor_type.name}, which the gguf package cannot dequantize")
        if t.tensor_type.name == "F32":
            # dequantize returns F32 data as a view of the read-only memory map: copy it, so the
            # tensor owns writable memory and the file can be closed
            values = np.array(values, dtype=np.float32)
        return torch.from_numpy(values.reshape(shape)).to(device=device, dtype=dtype)


# -- the parsed header, kept between processes ------------------------------------------------------


def _header_file(path: Path) -> Path | None:
    """Where the header of the file at ``path`` is kept (None: no usable cache folder)."""
    from importlib.metadata import version

    from pto.cache.cachedir import cache_root

    try:
        st = path.stat()
        root = cache_root()
    except (OSError, UsageError):
        return None
    ident = f"{HEADER_FORMAT}|{version('gguf')}|{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return root / "gguf" / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"


def _store_header(path: Path, values: dict[str, Any], tensors: list[tuple[Any, int]]) -> None:
    """Keep the parsed header (``tensors``: each reader tensor and its data's offset in the
    file); a cache that cannot be written is skipped (the next process parses again)."""
    where = _header_file(path)
    if where is None:
        return
    table = [[t.name, int(t.tensor_type), [int(n) for n in t.shape], t.data.dtype.str, list(t.data.shape), offset]
             for t, offset in tensors]
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"values": values, "tensors": table}))
        os.replace(tmp, where)  # readers see no file or the whole of it
        kept = sorted(where.parent.glob("*.json"), key=lambda f: f.stat().st_mtime)
        for old in kept[:-KEEP_HEADERS]:  # the files of long ago (and of files since changed) go
            old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):
        return


def _cached_header(path: Path) -> tuple[dict[str, Any], dict[str, TensorHeader]] | None:
    """The header kept by an earlier process for this very file (its path, size and modification
    time, and this gguf package), its tensors mapped where the reader maps them; None when there
    is none or it does not fit the file."""
    where = _header_file(path)
    if where is None or not where.is_file():
        return None
    from gguf import GGMLQuantizationType

    try:
        kept = json.loads(where.read_text())
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        tensors = {}
        for name, kind, ne, dtype, shape, offset in kept["tensors"]:
            dt = np.dtype(dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            if offset < 0 or offset + size > len(mapped):
                return None
            data = mapped[offset:offset + size].view(dt).reshape(shape)
            tensors[name] = TensorHeader(name, GGMLQuantizationType(kind), tuple(ne), data)
        return dict(kept["values"]), tensors
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["GGUFFile", "TensorHeader", "open_gguf", "is_gguf", "from_checkpoint", "given_as", "HEADER_FORMAT"]
