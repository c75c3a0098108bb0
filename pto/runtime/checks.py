"""Checks of the binding's arguments before they reach cffi.

A bad argument never surfaces as a cffi ``OverflowError``/``TypeError`` nor gets truncated on
the way to C:

- every integer argument must be an ``int`` or a numpy integer (anything with ``__index__``
  except ``bool``/``numpy.bool_``: a flag where an id or size is expected is a mistake) that
  fits the C parameter (``int32_t`` for ids, ``window``, ``elem_size``, ``buffer_bytes`` and
  ``max``; ``int64_t`` for tensor shapes, region offsets/extents and scalar values);
- names must be ``str`` without NUL characters (C would see the name cut at the NUL);
- task ids given to :meth:`pto.runtime.Runtime.complete` must be integers: an int, an iterable
  of ints, or a 1-D integer numpy array (float, bool and multi-dimensional arrays are refused,
  never truncated); int32 arrays go to C as they are;
- a dump path must be a ``str``/``bytes``/``os.PathLike`` without NUL characters (checked by
  :meth:`pto.runtime.RuntimeLib.dump`).

Such an argument raises :class:`pto.errors.RuntimeStatusError` with status ``ERR_INVALID``
(the C runtime's status for a bad argument) and a message in the runtime's style naming the
call, the argument and the value as given, e.g. ``pto_task_alloc: buffer_bytes 1099511627776
does not fit int32_t (-2147483648..2147483647)``. Values that fit are judged by C itself
(a negative task id is ``ERR_UNKNOWN_TASK``, a negative shape ``ERR_INVALID``, ...).
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import numpy as np

from pto.errors import RuntimeStatusError
from pto.runtime.loader import runtime_constants

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_IDENT_RULE = "letters, digits and '_', not starting with a digit, no whitespace, at most 255 characters"


def bad_arg(message: str) -> RuntimeStatusError:
    """The error for an argument C cannot take: status ``ERR_INVALID``."""
    return RuntimeStatusError(message, runtime_constants()["ERR_INVALID"])


def as_int(what: str, arg: str, value: Any) -> int:
    """``value`` as a Python int if it is an integer (not a bool), else a RuntimeStatusError."""
    if not isinstance(value, (bool, np.bool_)):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise bad_arg(f"{what}: {arg} must be an integer, got {type(value).__name__} {value!r}")


def check_i32(what: str, arg: str, value: Any) -> int:
    """Check that ``value`` is an integer that fits ``int32_t``; returns it as an int."""
    if type(value) is not int:
        value = as_int(what, arg, value)
    if -0x80000000 <= value <= 0x7FFFFFFF:  # literal bounds: no global lookups
        return value
    raise bad_arg(f"{what}: {arg} {value} does not fit int32_t ({_I32_MIN}..{_I32_MAX})")


def check_i64(what: str, arg: str, value: Any) -> int:
    """Check that ``value`` is an integer that fits ``int64_t``; returns it as an int."""
    if type(value) is not int:
        value = as_int(what, arg, value)
    if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return value
    raise bad_arg(f"{what}: {arg} {value} does not fit int64_t ({_I64_MIN}..{_I64_MAX})")


def check_region(what: str, task: Any, tensor: Any, row0: Any, col0: Any, rows: Any,
                 cols: Any) -> tuple[int, int, int, int, int, int]:
    """A region argument ``(task, tensor, row0, col0, rows, cols)``: ids as ``int32_t``, the rest
    as ``int64_t``."""
    # the common case in one expression (literal bounds: no global lookups)
    if (type(task) is type(tensor) is type(row0) is type(col0) is type(rows) is type(cols) is int
            and -0x80000000 <= task <= 0x7FFFFFFF and -0x80000000 <= tensor <= 0x7FFFFFFF
            and -0x8000000000000000 <= row0 <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= col0 <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= rows <= 0x7FFFFFFFFFFFFFFF
            and -0x8000000000000000 <= cols <= 0x7FFFFFFFFFFFFFFF):
        return task, tensor, row0, col0, rows, cols
    return (check_i32(what, "task id", task), check_i32(what, "tensor id", tensor),
            check_i64(what, "row0", row0), check_i64(what, "col0", col0),
            check_i64(what, "rows", rows), check_i64(what, "cols", cols))


def check_name(kind: str, name: Any) -> bytes:
    """A tensor/function name as the bytes C gets; refuses what C would not see as given."""
    if not isinstance(name, str):
        raise bad_arg(f"{kind} name must be a str, got {type(name).__name__} {name!r}")
    if "\0" in name:
        raise bad_arg(f"{kind} name {name!r} is not an identifier: it contains a NUL character "
                      f"({_IDENT_RULE})")
    try:
        return name.encode()
    except UnicodeEncodeError:
        raise bad_arg(f"{kind} name {name!r} is not an identifier ({_IDENT_RULE})") from None


def check_task_ids(what: str, ids: Any) -> np.ndarray:
    """Task ids as a contiguous 1-D int32 array; refuses non-integers and ids beyond int32.

    A 1-D int32 array (what :meth:`pto.runtime.Runtime.ready_pop` returns) passes without a copy
    or any per-element work; other integer arrays get one vectorized range check.
    """
    if isinstance(ids, np.ndarray):
        if ids.dtype == np.int32 and ids.ndim == 1:
            return np.ascontiguousarray(ids)
        if ids.ndim != 1:
            raise bad_arg(f"{what}: task ids must be a 1-D array, got shape {ids.shape}")
        if ids.dtype.kind == "O":
            return check_task_ids(what, ids.tolist())
        if ids.dtype.kind not in "iu":
            shown = np.array2string(ids, threshold=8)
            raise bad_arg(f"{what}: task ids must be integers, got a {ids.dtype} array {shown}")
        if ids.size and (int(ids.min()) < _I32_MIN or int(ids.max()) > _I32_MAX):
            bad = next(t for t in ids.tolist() if not _I32_MIN <= t <= _I32_MAX)
            raise bad_arg(f"{what}: task id {bad} does not fit int32_t ({_I32_MIN}..{_I32_MAX})")
        return ids.astype(np.int32)
    if isinstance(ids, (str, bytes)):
        raise bad_arg(f"{what}: task ids must be integers, got {type(ids).__name__} {ids!r}")
    try:
        it = iter(ids)
    except TypeError:
        raise bad_arg(f"{what}: task ids must be an integer or an iterable of integers, got "
                      f"{type(ids).__name__} {ids!r}") from None
    return np.array([check_i32(what, "task id", t) for t in it], dtype=np.int32)

