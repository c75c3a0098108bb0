"""The per-task tables of a batch and the specializations its tasks allow.

A batched kernel reads each task's regions and scalars from a ``B x F`` table
(:func:`build_table`); :func:`even_masks` says, per task and memref, whether every access stays
inside the region (the ``EVEN_<p>`` specialization skips masks).
"""

from __future__ import annotations

import torch

from pto.codegen.triton import RenderedKernel, access_bounds
from pto.data.batch import TaskBatch
from pto.errors import BuildError, ExecutionError
from pto.ir.expr import evaluate
from pto.ir.nodes import IncoreFunction

_INT32_MAX = 2**31 - 1


def check_batch(batch: TaskBatch) -> None:
    fn = batch.fn
    if fn.dims:
        raise ExecutionError(f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first")
    missing = [p.name for p in fn.memrefs if p.name not in batch.mems] + \
              [p.name for p in fn.scalars if p.name not in batch.scalars]
    if missing:
        raise ExecutionError(f"`{fn.name}`: no binding for {', '.join(missing)}")
    for p in fn.memrefs:
        t = batch.mems[p.name].tensor
        if t.dtype != p.dtype.torch:
            raise ExecutionError(f"`{fn.name}`: memref `{p.name}` is {p.dtype} but the tensor is {t.dtype}")
        if t.dim() != 2 or not t.is_contiguous():
            raise ExecutionError(f"`{fn.name}`: tensor for `{p.name}` must be 2-D and contiguous")


def task_env(batch: TaskBatch) -> dict:
    """Scalar environment of the batch (int64 CPU vectors): scalars and ``p.rows``/``p.cols``."""
    size = batch.size

    def vec(v):
        return torch.as_tensor(v).reshape(-1).to("cpu", torch.int64).expand(size)

    env = {k: vec(v) for k, v in batch.scalars.items()}
    for name, rb in batch.mems.items():
        env[f"{name}.rows"] = vec(rb.rows)
        env[f"{name}.cols"] = vec(rb.cols)
    return env


def build_table(kernel: RenderedKernel, batch: TaskBatch, device) -> torch.Tensor:
    """The ``B x F`` per-task table on ``device``: int32 unless a value needs int64 (the kernel
    follows the table's type)."""
    cols = []
    size = batch.size
    for name in kernel.layout.memrefs:
        rb = batch.mems[name]
        cols += [rb.row0, rb.col0, rb.rows, rb.cols]
    for name in kernel.layout.scalars:
        cols.append(batch.scalars[name])
    vecs = [torch.as_tensor(c).to(device=device, dtype=torch.int64).reshape(-1).expand(size) for c in cols]
    tab = torch.stack(vecs, dim=1)
    big = tab.numel() and int(tab.abs().max().item()) > _INT32_MAX
    return tab.contiguous() if big else tab.to(torch.int32).contiguous()


def even_masks(fn: IncoreFunction, env: dict) -> dict[str, torch.Tensor]:
    """Per memref, per task: does every access stay inside the region's valid extent (so the
    task may skip masks)? ``env`` holds per-task int64 vectors."""
    return _access_masks(fn, env, [p.name for p in fn.memrefs], {})


def descriptor_masks(fn: IncoreFunction, env: dict, batch: TaskBatch, memrefs) -> dict[str, torch.Tensor]:
    """Per memref of ``memrefs``, per task: may its loads go through a descriptor of the whole
    tensor (:mod:`pto.codegen.triton.tma`)? Each access must stay inside the region, or, on an
    axis where it overhangs the region's end, that end must be the tensor's: the descriptor then
    reads zeros there, as the masked load does (the memrefs that qualify load with pad 0)."""
    edges = {}
    for mem in memrefs:
        rb, shape = batch.mems[mem], batch.mems[mem].tensor.shape
        edges[mem] = tuple(torch.as_tensor(start).reshape(-1).cpu() + env[f"{mem}.{ext}"] == shape[dim]
                           for dim, (start, ext) in enumerate(((rb.row0, "rows"), (rb.col0, "cols"))))
    return _access_masks(fn, env, memrefs, edges)


def _access_masks(fn: IncoreFunction, env: dict, memrefs, edges: dict) -> dict[str, torch.Tensor]:
    """Per memref of ``memrefs``, per task: every access inside the region, or (where ``edges``
    gives the memref's per-task (rows, columns) "the region ends at the tensor's end") past its
    end on such an axis only."""
    size = len(next(iter(env.values())))
    bounds = access_bounds(fn)
    out = {}
    for mem in memrefs:
        ok = torch.full((size,), bounds[mem] is not None)
        try:
            for a in bounds[mem] or ():
                for dim, (lo_e, hi_e, n, ext) in enumerate(((a.row_lo, a.row_hi, a.rows, "rows"),
                                                            (a.col_lo, a.col_hi, a.cols, "cols"))):
                    lo, hi = torch.as_tensor(evaluate(lo_e, env)), torch.as_tensor(evaluate(hi_e, env))
                    inside = _inside(lo, hi, n, env[f"{mem}.{ext}"])
                    if mem in edges:
                        inside |= (lo >= 0) & (lo <= hi) & edges[mem][dim]
                    ok &= inside
        except (ZeroDivisionError, BuildError):
            ok = torch.zeros(size, dtype=torch.bool)
        out[mem] = ok
    return out


def _inside(lo, hi, n: int, limit) -> torch.Tensor:
    """Offsets in [lo, hi] plus a block of n stay in [0, limit), per task. ``lo <= hi`` is
    required too: bounds assume positive symbolic divisors, and a loop that runs zero times
    (hi < lo) may as well keep its masks."""
    lo, hi = torch.as_tensor(lo), torch.as_tensor(hi)
    return (lo >= 0) & (lo <= hi) & (hi + n <= limit)


__all__ = ["check_batch", "task_env", "build_table", "even_masks", "descriptor_masks"]
