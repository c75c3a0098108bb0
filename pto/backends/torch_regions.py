"""Loads and stores of the tile evaluator: tiles of a batch of instances gathered from, and
scattered into, the regions their memref parameters are bound to.

Every instance (task x parallel index) reads an ``r x c`` tile at an offset ``(row, col)`` of its
region. An offset is an :class:`Offset`: an int (the same for every instance) or an int64 vector,
with its smallest and largest value. The flat indices of a tile's elements (row-major into the
contiguous tensor) are the region's first element plus the offset plus a grid, and one
``index_select`` (a load) or ``index_copy_`` (a store) moves them. When every tile lies inside
its region (decided from the offsets' extremes, without a tensor op where they are ints), that
is the whole access; otherwise a mask of the elements inside their regions picks what a store
writes and which loaded elements are replaced by the pad (the others are read from indices
clamped into the tensor). Regions lie inside their tensors (the runtime refuses others), so an
element inside its region has the same index either way, and the values moved are exactly those
of row and column indexing (the evaluator's former, slower form).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from pto.backends.torch_support import arange
from pto.batch import RegionBatch


@dataclass(frozen=True)
class Offset:
    """An offset in the regions: ``value`` an int or an int64 vector; ``lo``, ``hi`` its extremes."""

    value: int | torch.Tensor
    lo: int
    hi: int

    @staticmethod
    def of(v) -> Offset:
        if isinstance(v, torch.Tensor):
            v = v.to(torch.int64)
            if v.dim() == 0 or v.numel() == 0:
                return Offset(v, 0, 0) if v.numel() == 0 else Offset(int(v), int(v), int(v))
            lo, hi = (int(x) for x in torch.aminmax(v))
            return Offset(v, lo, hi)
        return Offset(int(v), int(v), int(v))


@functools.lru_cache(maxsize=256)
def tile_grid(r: int, c: int, ncols: int, device: torch.device) -> torch.Tensor:
    """Flat offsets of an ``r x c`` tile's elements from its first one in a tensor of ``ncols``
    columns (1 x r x c); never written to."""
    rows = torch.arange(r, device=device).view(r, 1) * ncols
    return (rows + torch.arange(c, device=device).view(1, c)).view(1, r, c)


class _Bound:
    """One memref's regions: per task as given, per instance where needed."""

    def __init__(self, rb: RegionBatch, task: torch.Tensor | None):
        self.rb = rb
        self.task = task
        self.tensor = rb.tensor
        self.nrows, self.ncols = rb.tensor.shape
        base = rb.row0 * self.ncols + rb.col0  # flat offset of each region's first element
        self.base = base if task is None else base[task]
        # the smallest region extents: offsets known by their extremes are checked against them
        self.rows_min, self.cols_min = torch.stack([rb.rows, rb.cols]).amin(dim=1).tolist()
        self._inst: dict[str, torch.Tensor] = {}
        self._grids: dict[tuple[int, int], torch.Tensor] = {}

    def per_instance(self, field: str) -> torch.Tensor:
        """``rows`` or ``cols`` of every instance."""
        v = self._inst.get(field)
        if v is None:
            v = getattr(self.rb, field)
            v = self._inst[field] = v if self.task is None else v[self.task]
        return v

    def base_grid(self, r: int, c: int) -> torch.Tensor:
        """Flat indices (N x r x c) of every instance's ``r x c`` tile at offset (0, 0)."""
        g = self._grids.get((r, c))
        if g is None:
            g = self._grids[r, c] = self.base.view(-1, 1, 1) + tile_grid(r, c, self.ncols, self.tensor.device)
        return g


class Regions:
    """Gathers and scatters tiles for the instances of one batch (``task[i]``: the task of
    instance ``i``, None when every task has one instance)."""

    def __init__(self, mems: dict[str, RegionBatch], task: torch.Tensor | None, device):
        self.mems = mems
        self.task = task
        self.device = device
        self._bound: dict[str, _Bound] = {}

    def bound(self, mem: str) -> _Bound:
        b = self._bound.get(mem)
        if b is None:
            b = self._bound[mem] = _Bound(self.mems[mem], self.task)
        return b

    def all_inside(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> bool:
        """Whether every instance's ``r x c`` tile surely lies inside its region (False may be
        conservative where the extents differ between instances)."""
        b = self.bound(mem)
        return row.lo >= 0 and col.lo >= 0 and row.hi + r <= b.rows_min and col.hi + c <= b.cols_min

    def valid(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> torch.Tensor:
        """Per element of every instance's tile (N x r x c, bool): whether it lies inside its region."""
        b = self.bound(mem)
        valid = []
        for off, size, extent in ((row, r, b.per_instance("rows")), (col, c, b.per_instance("cols"))):
            v = off.value.view(-1, 1) if isinstance(off.value, torch.Tensor) else off.value
            at = arange(size, self.device).view(1, size) + v
            valid.append((at >= 0) & (at < extent.view(-1, 1)) if off.lo < 0 else at < extent.view(-1, 1))
        return valid[0].view(-1, r, 1) & valid[1].view(-1, 1, c)

    def flat(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> torch.Tensor:
        """Flat element indices (N x r x c) of every instance's tile; those of elements outside
        their regions may lie outside the tensor."""
        b = self.bound(mem)
        off = row.value * b.ncols + col.value
        if isinstance(off, int):
            return b.base_grid(r, c) + off if off else b.base_grid(r, c)
        return b.base_grid(r, c) + off.view(-1, 1, 1)

    def gather(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        return self.bound(mem).tensor.view(-1).index_select(0, flat.view(-1)).view(flat.shape)

    def scatter(self, mem: str, flat: torch.Tensor, vals: torch.Tensor) -> None:
        self.bound(mem).tensor.view(-1).index_copy_(0, flat.view(-1), vals.reshape(-1))

    def clamped(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` clamped into the tensor (indices of elements inside their regions are)."""
        return flat.clamp(0, self.bound(mem).tensor.numel() - 1)


__all__ = ["Offset", "Regions", "tile_grid"]
