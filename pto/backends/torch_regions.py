"""Loads and stores of the tile evaluator: tiles of a batch of instances gathered from, and
scattered into, the regions their memref parameters are bound to.

Every instance (task x parallel index) reads an ``r x c`` tile at offset ``(row, col)`` of its
region. The common case, every tile of the instruction inside its region, needs no clamping and
no mask: one flat index per element (row-major into the contiguous tensor) and one
``index_select`` (a load) or one indexed copy (a store). Otherwise the general path clamps the
indices into the tensor, pads the loaded elements outside the region and skips the stored ones,
and skips the inactive instances of a store. Both paths move the same elements, so they give the
same bits; the fast one makes a handful of torch ops instead of about twenty.
"""

from __future__ import annotations

import torch

from pto.batch import RegionBatch


class _Bound:
    """One memref's regions per instance, and what the fast path derives from them."""

    def __init__(self, rb: RegionBatch, task: torch.Tensor | None):
        self.tensor = rb.tensor
        pick = (lambda v: v) if task is None else (lambda v: v[task])
        self.row0, self.col0, self.rows, self.cols = pick(rb.row0), pick(rb.col0), pick(rb.rows), pick(rb.cols)
        self.nrows, self.ncols = rb.tensor.shape
        self.base = self.row0 * self.ncols + self.col0  # flat offset of each region's first element
        # the smallest region extents: an offset known for all instances at once is checked
        # against them without a tensor op
        mins = torch.stack([self.rows.min(), self.cols.min()]).tolist() if len(self.rows) else [0, 0]
        self.rows_min, self.cols_min = (int(v) for v in mins)


def _inside(off, size: int, extent: torch.Tensor, extent_min: int) -> bool:
    """Whether ``[off, off + size)`` lies in ``[0, extent)`` for every instance."""
    if isinstance(off, int):
        return off >= 0 and off + size <= extent_min
    return bool(((off >= 0) & (off + size <= extent)).all())


def _inside_each(off, size: int, extent: torch.Tensor) -> torch.Tensor:
    """Per instance (a bool vector): whether ``[off, off + size)`` lies in ``[0, extent)``."""
    if isinstance(off, int):
        return extent >= off + size if off >= 0 else torch.zeros_like(extent, dtype=torch.bool)
    return (off >= 0) & (off + size <= extent)


def pick(v, inst: torch.Tensor | None):
    """The values of instances ``inst`` (all when None) of an offset: an int or a vector."""
    if inst is None or not isinstance(v, torch.Tensor) or v.dim() == 0:
        return v
    return v[inst]


class Regions:
    """Gathers and scatters tiles for the instances of one batch (``task[i]``: the task of
    instance ``i``, None when every task has one instance). Offsets ``row``, ``col`` in the
    regions are ints (the same for every instance) or int64 vectors of length N; ``inst``
    (int64 vector) restricts an access to some instances, offsets already picked for them."""

    def __init__(self, mems: dict[str, RegionBatch], task: torch.Tensor | None, device):
        self.mems = mems
        self.task = task
        self.device = device
        self._bound: dict[str, _Bound] = {}
        self._grids: dict[tuple[int, int, int], torch.Tensor] = {}

    def bound(self, mem: str) -> _Bound:
        b = self._bound.get(mem)
        if b is None:
            b = self._bound[mem] = _Bound(self.mems[mem], self.task)
        return b

    def _grid(self, r: int, c: int, ncols: int) -> torch.Tensor:
        """Flat offsets of an ``r x c`` tile's elements from its first one (1 x r x c)."""
        key = (r, c, ncols)
        g = self._grids.get(key)
        if g is None:
            rows = torch.arange(r, device=self.device).view(r, 1) * ncols
            g = self._grids[key] = (rows + torch.arange(c, device=self.device).view(1, c)).view(1, r, c)
        return g

    def all_inside(self, mem: str, row, col, r: int, c: int) -> bool:
        """Whether every instance's ``r x c`` tile lies inside its region."""
        b = self.bound(mem)
        return _inside(row, r, b.rows, b.rows_min) and _inside(col, c, b.cols, b.cols_min)

    def inside(self, mem: str, row, col, r: int, c: int) -> torch.Tensor:
        """Per instance (a bool vector): whether its ``r x c`` tile lies inside its region."""
        b = self.bound(mem)
        return _inside_each(row, r, b.rows) & _inside_each(col, c, b.cols)

    def flat(self, mem: str, row, col, r: int, c: int, inst: torch.Tensor | None = None) -> torch.Tensor:
        """Flat element indices (N x r x c) of tiles that lie inside their regions."""
        b = self.bound(mem)
        start = pick(b.base, inst) + (row * b.ncols + col)
        return start.view(-1, 1, 1) + self._grid(r, c, b.ncols)

    def gather(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        return self.bound(mem).tensor.view(-1).index_select(0, flat.view(-1)).view(flat.shape)

    def scatter(self, mem: str, flat: torch.Tensor, vals: torch.Tensor) -> None:
        self.bound(mem).tensor.view(-1).index_copy_(0, flat.view(-1), vals.reshape(-1))

    def index(self, mem: str, row: torch.Tensor, col: torch.Tensor, r: int, c: int, inst: torch.Tensor | None):
        """The general path: row and column indices (M x r x 1, M x 1 x c) clamped into the
        tensor, and the valid mask (M x r x c, or None when every element lies inside its
        region); ``row``, ``col``: vectors of the M instances."""
        b = self.bound(mem)
        ri = row.view(-1, 1) + torch.arange(r, device=self.device).view(1, r)
        ci = col.view(-1, 1) + torch.arange(c, device=self.device).view(1, c)
        rvalid = (ri >= 0) & (ri < pick(b.rows, inst).view(-1, 1))
        cvalid = (ci >= 0) & (ci < pick(b.cols, inst).view(-1, 1))
        grow = (pick(b.row0, inst).view(-1, 1) + ri).clamp_(0, b.nrows - 1)
        gcol = (pick(b.col0, inst).view(-1, 1) + ci).clamp_(0, b.ncols - 1)
        valid = None
        if not (bool(rvalid.all()) and bool(cvalid.all())):
            valid = rvalid.view(-1, r, 1) & cvalid.view(-1, 1, c)
        return grow.view(-1, r, 1), gcol.view(-1, 1, c), valid


__all__ = ["Regions", "pick"]
