"""A GGUF file (llama.cpp's checkpoint format: metadata key/values, then tensors, many of them
block-quantized) read through the maintained ``gguf`` package.

:func:`open_gguf` parses the header once per file and process (the token list of a 50K
vocabulary makes parsing take seconds) and keeps the last few files opened, so that reading the
configuration, the tokenizer and the weights of one file parses it once. Tensor data stays
memory-mapped until :meth:`GGUFFile.tensor` dequantizes it.

GGUF writes a tensor's dimensions innermost first (``ne``): a ``[rows, columns]`` matrix in
numpy's order is ``ne = [columns, rows]``. Everything here speaks numpy's (and torch's) order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from pto.errors import UsageError
from pto.ir.dtypes import dtype_of

_MISSING = object()
_OPEN: dict[tuple, GGUFFile] = {}  # (path, mtime, size) -> parsed file, least recent first
_KEEP = 4


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
    one UsageError naming ``path`` for anything else (what every reader of a checkpoint accepts)."""
    p = Path(path)
    if p.is_dir():
        return folder(p)
    if is_gguf(p):
        return gguf(open_gguf(p))
    if not p.exists():
        raise UsageError(f"{path}: no such file or folder")
    raise UsageError(f"{path}: neither a GGUF file nor a Hugging Face model folder (with config.json)")


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


class GGUFFile:
    """One GGUF file: its metadata (:meth:`value`), the headers of its tensors (:meth:`shape`,
    :meth:`qtype`) and their values (:meth:`tensor`). Every problem is one UsageError line
    naming the file (and the key or tensor)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        gguf = _gguf()
        if not self.path.is_file():
            self.fail("no such file")
        if not is_gguf(self.path):
            self.fail("not a GGUF file (it does not begin with the GGUF magic bytes)")
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as e:  # the reader raises ValueError, KeyError, IndexError on a bad header
            # the reader maps every tensor's data at once: a short file fails here too
            self.fail(f"not a readable GGUF file, truncated or corrupt ({e.__class__.__name__}: "
                      f"{str(e).splitlines()[0][:120]})")
        self.tensors = {t.name: t for t in self.reader.tensors}

    def fail(self, msg: str):
        raise UsageError(f"{self.path}: {msg}")

    def metadata_keys(self) -> list[str]:
        """The metadata keys, in the file's order (GGUF's own bookkeeping ``GGUF.*`` left out)."""
        return [k for k in self.reader.fields if not k.startswith("GGUF.")]

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def value(self, key: str, default=_MISSING):
        """The value of metadata ``key``: a number, bool, string, or a list of them; ``default``
        when absent (without one, a missing key is a UsageError naming it)."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                self.fail(f"no metadata key {key!r}")
            return default
        return field.contents()

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
        return tuple(int(n) for n in reversed(self._info(name).shape.tolist()))

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


__all__ = ["GGUFFile", "open_gguf", "is_gguf"]
