"""The tensors of a run: each tensor of an orchestration function at its concrete shape.

:func:`tensor_shapes` evaluates the declared shapes for given scalars; :func:`allocate` checks
the tensors a caller gives (inputs) and allocates the rest, poisoned with NaN so that an element
no task writes shows up. The reference interpreter and every executor use them.
"""

from __future__ import annotations

import torch

from pto.errors import ExecutionError
from pto.ir.expr import evaluate
from pto.ir.nodes import OrchFunction


def tensor_shapes(fn: OrchFunction, scalars: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Concrete shape of every tensor of the orchestration function."""
    missing = [s for s in fn.scalars if s not in scalars]
    if missing:
        raise ExecutionError(f"`{fn.name}` needs scalar{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)}")
    out = {}
    for t in fn.tensors:
        r, c = int(evaluate(t.rows, scalars)), int(evaluate(t.cols, scalars))
        if r <= 0 or c <= 0:
            raise ExecutionError(f"tensor `{t.name}` of `{fn.name}` has shape {r}x{c} for "
                                 f"{', '.join(f'{k}={v}' for k, v in scalars.items())}")
        out[t.name] = (r, c)
    return out


def placeholders(fn: OrchFunction, shapes: dict[str, tuple[int, int]], device,
                 packed: tuple[tuple[str, ...], ...] = (), given=()) -> dict[str, torch.Tensor]:
    """Uninitialized buffers of ``fn``'s inputs but those ``given`` (a run copies the values in);
    in each group of ``packed`` (:meth:`pto.program.Program.packed_inputs`) the inputs of one shape
    and dtype are contiguous blocks of one buffer, stacked by rows."""
    decl = {t.name: t for t in fn.tensors if t.role in ("input", "inout") and t.name not in given}
    out = {}
    for group in packed:
        kinds: dict[tuple, list[str]] = {}
        for name in group:
            if name in decl:
                kinds.setdefault((shapes[name], decl[name].dtype), []).append(name)
        for ((rows, cols), dt), names in kinds.items():
            cols = dt.storage_shape(rows, cols)[1]
            buf = torch.empty(len(names) * rows, cols, dtype=dt.torch, device=device)
            out.update({n: buf[k * rows:(k + 1) * rows] for k, n in enumerate(names)})
    for name, t in decl.items():
        if name not in out:
            out[name] = torch.empty(t.dtype.storage_shape(*shapes[name]), dtype=t.dtype.torch, device=device)
    return out


def allocate(fn: OrchFunction, shapes: dict[str, tuple[int, int]], given: dict[str, torch.Tensor],
             device) -> dict[str, torch.Tensor]:
    """Check the given tensors against the declarations; allocate the rest (poisoned with NaN so
    that an element no task writes shows up). A quantized tensor is given as its buffer
    (:meth:`pto.ir.dtypes.DType.storage_shape`: rows of bytes)."""
    out = {}
    for t in fn.tensors:
        shape = shapes[t.name]
        if t.name in given:
            x = given[t.name]
            if tuple(x.shape) != t.dtype.storage_shape(*shape):
                what = f" ({t.dtype}: {'x'.join(map(str, t.dtype.storage_shape(*shape)))} bytes)" \
                    if t.dtype.is_quantized else ""
                raise ExecutionError(f"tensor `{t.name}` must be {shape[0]}x{shape[1]}{what}, got "
                                     f"{'x'.join(map(str, x.shape))}")
            if x.dtype != t.dtype.torch:
                raise ExecutionError(f"tensor `{t.name}` must be {t.dtype}, got {x.dtype}")
            out[t.name] = x.contiguous()
        elif t.role in ("input", "inout"):
            raise ExecutionError(f"input tensor `{t.name}` of `{fn.name}` was not given")
        else:
            out[t.name] = torch.full(shape, float("nan"), dtype=t.dtype.torch, device=device)
    unknown = set(given) - {t.name for t in fn.tensors}
    if unknown:
        raise ExecutionError(f"`{fn.name}` has no tensor {', '.join(sorted(unknown))}")
    return out


def tensor_bytes(fn: OrchFunction, scalars: dict[str, int]) -> dict[str, int]:
    """Bytes of every tensor of ``fn`` (what a run allocates), by name."""
    shapes = tensor_shapes(fn, scalars)
    return {t.name: t.dtype.nbytes(*shapes[t.name]) for t in fn.tensors}


__all__ = ["tensor_shapes", "placeholders", "allocate", "tensor_bytes"]
