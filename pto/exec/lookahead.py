"""What each work item of a plan reads of the memrefs it may load before its wait: the regions
the persistent megakernel's lookahead prefetches into L2 one item ahead.

A program of the megakernel runs its items one after another, and each item's loads start only
when the item before it has finished: every item pays a memory latency before its first bytes
arrive, and the program's loads in flight drain at its end. Where a program knows its next item
(ranged dispatch: its own range of the item table), it can ask for that item's weights while it
runs the current one; the next item's loads then find them in L2. What an item reads is known
on the host: its task's regions (the table) and its parallel index, through its InCore
function's load offsets bounded over its loops (:func:`pto.ir.bounds.bounds`), the way the
regions of a memref parameter are derived. Only the memrefs a branch loads before its wait
(:attr:`pto.codegen.triton.megakernel.Branch.pre`: tensors nothing in the launch writes, or none
of the task's predecessors) are taken: a prefetch is a hint, but one of a region still being
written would fetch lines that are about to change. Quantized memrefs (rows of bytes) are left
out.
"""

from __future__ import annotations

import numpy as np
import torch

from pto.codegen.triton.body import LINE_BYTES
from pto.codegen.triton.common import TableLayout
from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.expr import Const, evaluate, fold
from pto.ir.facts import loop_ranges, memref_accesses, tile_shape
from pto.ir.nodes import IncoreFunction
from pto.ir.ops import Op

#: the regions an item's lookahead names at most (the largest: a fused gate/up GEMV's two weight
#: blocks; a norm's gains are small and stay in L2 anyway)
BOXES = 2
#: the columns of a region: tensor index, first row, rows, first column, columns (elements of
#: the tensor, absolute), rows 0 for none
BOX_COLS = 5


def _read_bounds(fn: IncoreFunction, pre: tuple[bool, ...]) -> dict[str, list]:
    """Per memref of ``fn`` that ``pre`` marks (and is not quantized), the symbolic bounds of
    each load of it: ``(row lo, row hi, col lo, col hi)`` (hi exclusive) over ``fn``'s loops, in
    terms of the parallel index, the scalars and the regions' fields; a load whose offsets cannot
    be bounded is left out."""
    ranges = loop_ranges(fn)
    if fn.parallel is not None:
        ranges.pop(fn.parallel.var, None)  # one item: its own parallel index, exactly
    early = {m.name for m, ok in zip(fn.memrefs, pre) if ok and not m.dtype.is_quantized}
    out: dict[str, list] = {}
    dims = dict(fn.variant)
    for mem, ins, row, col, tile in memref_accesses(fn):
        if mem not in early or ins.op is not Op.LOAD:
            continue
        try:
            rows, cols = tile_shape(tile, dims)
            (rlo, rhi), (clo, chi) = bounds(row, ranges), bounds(col, ranges)
        except BuildError:
            continue
        out.setdefault(mem, []).append((rlo, fold(rhi + Const(rows)), clo, fold(chi + Const(cols))))
    return out


def _env(fn: IncoreFunction, tab: np.ndarray, rows: np.ndarray, p: np.ndarray) -> dict:
    """The names ``fn``'s offsets use, per item (int64 tensors): each memref's region fields,
    the scalars and the parallel index, read from the items' table rows ``rows``."""
    layout = TableLayout(tuple(m.name for m in fn.memrefs), tuple(s.name for s in fn.scalars))
    env = {}
    for m in fn.memrefs:
        for fld in ("rows", "cols"):
            env[f"{m.name}.{fld}"] = torch.from_numpy(tab[rows + layout.column(m.name, fld)].astype(np.int64))
    for s in fn.scalars:
        env[s.name] = torch.from_numpy(tab[rows + layout.column(s.name)].astype(np.int64))
    if fn.parallel is not None:
        env[fn.parallel.var] = torch.from_numpy(p.astype(np.int64))
    return env


def _value(e, env: dict, n: int) -> np.ndarray:
    v = evaluate(e, env)
    return np.broadcast_to(v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v, np.int64), (n,)).astype(np.int64)


def item_boxes(plan, order: np.ndarray | None = None) -> np.ndarray:
    """``[n_items, BOXES, BOX_COLS]`` int64: per work item (queue order, or the queue indices
    ``order``), the regions of tensors it reads before its wait, largest first (:data:`BOX_COLS`;
    clipped to the task's region: the loads past it are masked)."""
    items = plan.items if order is None else plan.items[order]
    out = np.zeros((max(len(items), 1), BOXES, BOX_COLS), np.int64)
    if not len(items):
        return out
    task = items[:, 0].astype(np.int64)
    branch = plan.task_branch[task]
    for k, b in enumerate(plan.branches):
        sel = np.nonzero(branch == k)[0]
        reads = _read_bounds(b.fn, b.pre) if len(sel) else {}
        if not reads:
            continue
        t = task[sel]
        rows = plan.task_row[t]
        env = _env(b.fn, plan.tab, rows, items[sel, 1])
        layout = TableLayout(tuple(m.name for m in b.fn.memrefs), tuple(s.name for s in b.fn.scalars))
        cand = []
        for mem, loads in reads.items():
            j = [m.name for m in b.fn.memrefs].index(mem)
            n = len(sel)
            lo = []
            for box in loads:
                try:  # (an offset a loaded value gives, e.g. a token's row, is not known here)
                    lo.append(np.stack([_value(e, env, n) for e in box]))
                except BuildError:
                    continue
            if not lo:
                continue
            r_lo, r_hi, c_lo, c_hi = (np.min([x[i] for x in lo], axis=0) if i % 2 == 0 else
                                      np.max([x[i] for x in lo], axis=0) for i in range(4))
            reg = {f: plan.tab[rows + layout.column(mem, f)].astype(np.int64) for f in TableLayout.FIELDS}
            r_lo, c_lo = np.maximum(r_lo, 0), np.maximum(c_lo, 0)
            r_hi, c_hi = np.minimum(r_hi, reg["rows"]), np.minimum(c_hi, reg["cols"])
            nr, nc = np.maximum(r_hi - r_lo, 0), np.maximum(c_hi - c_lo, 0)
            nr = np.where(nc > 0, nr, 0)
            cand.append(np.stack([plan.task_tensor[t, j].astype(np.int64), reg["r0"] + r_lo, nr,
                                  reg["c0"] + c_lo, np.where(nr > 0, nc, 0)], axis=1))
        if not cand:
            continue
        boxes = np.stack(cand, axis=1)  # [n, memrefs, BOX_COLS]
        size = boxes[:, :, 2] * boxes[:, :, 4]
        top = np.argsort(-size, axis=1, kind="stable")[:, :BOXES]
        boxes = np.take_along_axis(boxes, top[:, :, None], axis=1)
        out[sel, :boxes.shape[1]] = boxes
    return out


#: bytes of an L2 line: the lookahead asks for one address a line
LINE = LINE_BYTES


def look_table(boxes: np.ndarray, base: np.ndarray, stride: np.ndarray, itemsize: np.ndarray,
               budget: int) -> np.ndarray:
    """``[n_items, BOXES * LOOK_COLS]`` int64: :func:`item_boxes`'s regions in bytes
    (:data:`~pto.codegen.triton.megakernel.LOOK_COLS`: the address of a region's first byte, the
    bytes of a row, the rows, the row stride), given each tensor's base address, row stride
    (elements) and element size. An item whose regions hold more than ``budget`` bytes keeps each
    region's share of it: the first bytes of its rows (a K loop's first trips), then fewer rows."""
    t = boxes[..., 0]
    size = itemsize[t]
    start = base[t] + (boxes[..., 1] * stride[t] + boxes[..., 3]) * size
    rows, width = boxes[..., 2], boxes[..., 4] * size
    total = (rows * width).sum(axis=1, keepdims=True)
    share = np.minimum(1.0, budget / np.maximum(total, 1))
    allowed = np.floor(rows * width * share).astype(np.int64)
    keep = np.where(allowed > 0, np.minimum(width, np.maximum(allowed // np.maximum(rows, 1), 1)), 0)
    rows = np.where(allowed > 0, np.minimum(rows, np.maximum(1, allowed // np.maximum(keep, 1))), 0)
    out = np.stack([start, keep, rows, stride[t] * size], axis=2)
    return np.ascontiguousarray(np.where(rows[..., None] > 0, out, 0).reshape(len(boxes), -1))


def line_addresses(row: np.ndarray) -> np.ndarray:
    """The addresses the megakernel prefetches for one region of a lookahead table's row
    (``start, bytes a row, rows, stride``): per row, one every :data:`LINE` bytes from its first
    and its last byte, so every line the row touches, whatever its alignment (the kernel's
    ``_pto_lookahead``, in numpy: for the tests)."""
    start, width, rows, stride = (int(v) for v in row)
    if rows <= 0 or width <= 0:
        return np.zeros(0, np.int64)
    per = -(-width // LINE) + 1
    j = np.arange(rows * per)
    return start + (j // per) * stride + np.minimum((j % per) * LINE, width - 1)


__all__ = ["BOXES", "BOX_COLS", "LINE", "item_boxes", "line_addresses", "look_table"]
