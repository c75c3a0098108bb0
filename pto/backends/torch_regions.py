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
    """An offset in the regions: ``value`` an int or an int64 vector; ``lo``, ``hi`` its extremes;
    ``fixed``: the same object serves a whole batch (so what is derived from it may be kept)."""

    value: int | torch.Tensor
    lo: int
    hi: int
    fixed: bool = False

    @staticmethod
    def of(v, fixed: bool = False) -> Offset:
        if isinstance(v, torch.Tensor):
            v = v.to(torch.int64)
            if v.dim() == 0 or v.numel() == 0:
                return Offset(v, 0, 0, fixed) if v.numel() == 0 else Offset(int(v), int(v), int(v), fixed)
            lo, hi = (int(x) for x in torch.aminmax(v))
            return Offset(v, lo, hi, fixed)
        return Offset(int(v), int(v), int(v), fixed)


@dataclass(frozen=True)
class Place:
    """Where the tiles of the instances lie, as flat indices into the tensor: instance ``i``'s
    tile starts at ``start + i * step``, its rows ``ncols`` apart (strided); or, where the starts
    do not step evenly, its elements lie at ``grid[i] + start`` (``grid``: N x r x c)."""

    grid: torch.Tensor | None
    start: int
    step: int


@functools.lru_cache(maxsize=256)
def tile_grid(r: int, c: int, ncols: int, device: torch.device) -> torch.Tensor:
    """Flat offsets of an ``r x c`` tile's elements from its first one in a tensor of ``ncols``
    columns (1 x r x c); never written to."""
    rows = torch.arange(r, device=device).view(r, 1) * ncols
    return (rows + torch.arange(c, device=device).view(1, c)).view(1, r, c)


class _Bound:
    """One memref's regions: per task as given, per instance where needed. Where every task
    has the same region (one task, or a weight all of them read), its first element is an int."""

    def __init__(self, rb: RegionBatch, task: torch.Tensor | None):
        self.rb = rb
        self.task = task
        self.tensor = rb.tensor
        self.nrows, self.ncols = rb.tensor.shape
        base = rb.row0 * self.ncols + rb.col0  # flat offset of each region's first element
        lo, hi = (v.tolist() for v in torch.stack([base, rb.rows, rb.cols]).aminmax(dim=1))
        # the smallest region extents: offsets known by their extremes are checked against them
        self.rows_min, self.cols_min = lo[1], lo[2]
        self.base: int | torch.Tensor = lo[0] if lo[0] == hi[0] else base if task is None else base[task]
        self._inst: dict[str, torch.Tensor] = {}

    def per_instance(self, field: str) -> torch.Tensor:
        """``rows`` or ``cols`` of every instance."""
        v = self._inst.get(field)
        if v is None:
            v = getattr(self.rb, field)
            v = self._inst[field] = v if self.task is None else v[self.task]
        return v


class Regions:
    """Gathers and scatters tiles for the ``n`` instances of one batch (``task[i]``: the task of
    instance ``i``, None when every task has one instance)."""

    def __init__(self, mems: dict[str, RegionBatch], task: torch.Tensor | None, n: int, device):
        self.mems = mems
        self.task = task
        self.n = n
        self.device = device
        self._bound: dict[str, _Bound] = {}
        self._places: dict[tuple, Place] = {}  # where the tiles of fixed offsets lie, before the int shift

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

    def place(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> Place:
        """Where every instance's ``r x c`` tile lies (kept for the batch where the offsets are
        fixed); elements outside their regions may lie outside the tensor."""
        b = self.bound(mem)
        shift, spread, key = 0, [], (mem, r, c)
        for off, scale in ((b.base, 1), (row.value, b.ncols), (col.value, 1)):
            if isinstance(off, int):
                shift += off * scale
            else:
                spread.append(off if scale == 1 else off * scale)
        if not spread:
            return Place(None, shift, 0)
        for o in (row, col):
            if not isinstance(o.value, int):
                key = key + (id(o),) if o.fixed and key is not None else None
        place = self._places.get(key) if key is not None else None
        if place is None:
            place = self._spread(sum(spread[1:], spread[0]), r, c, b.ncols)
            if key is not None:
                self._places[key] = place
        return Place(place.grid, place.start + shift, place.step)

    def _spread(self, starts: torch.Tensor, r: int, c: int, ncols: int) -> Place:
        """The place of tiles starting at flat offsets ``starts`` (one per instance): strided
        where they step evenly, else a grid."""
        head = starts[:2].tolist()
        first = head[0] if head else 0
        step = head[1] - first if len(head) > 1 else 0
        if torch.equal(starts, first + step * arange(self.n, self.device)):
            return Place(None, first, step)
        return Place(tile_grid(r, c, ncols, self.device) + starts.view(-1, 1, 1), 0, 0)

    def flat(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """The flat element indices of every instance's tile, as one N x r x c tensor."""
        if place.grid is not None:
            return place.grid + place.start if place.start else place.grid
        starts = place.start + place.step * arange(self.n, self.device)
        return tile_grid(r, c, self.bound(mem).ncols, self.device) + starts.view(-1, 1, 1)

    def _strided(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """Every instance's tile as one view (N x r x c) of the tensor."""
        t = self.bound(mem).tensor
        return t.as_strided((self.n, r, c), (place.step, t.shape[1], 1), t.storage_offset() + place.start)

    def gather(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """The N x r x c elements of every instance's tile (all inside the tensor)."""
        if place.grid is None and place.step >= 0:
            return self._strided(mem, place, r, c).clone(memory_format=torch.contiguous_format)
        grid = self.flat(mem, place, r, c) if place.grid is None else place.grid
        src = self.bound(mem).tensor.view(-1)
        if place.grid is not None and place.start:
            src = src.narrow(0, place.start, src.numel() - place.start)
        return src.index_select(0, grid.reshape(-1)).view(grid.shape)

    def scatter(self, mem: str, place: Place, vals: torch.Tensor, r: int, c: int) -> None:
        """Write the N x r x c ``vals`` into every instance's tile (all inside the tensor)."""
        if place.grid is None and self._disjoint(mem, place, r, c):
            self._strided(mem, place, r, c).copy_(vals)
            return
        self.write(mem, self.flat(mem, place, r, c).reshape(-1), vals.reshape(-1))

    def _disjoint(self, mem: str, place: Place, r: int, c: int) -> bool:
        """Whether the strided tiles of ``place`` are disjoint (side by side, or stacked)."""
        ncols, step = self.bound(mem).ncols, place.step
        if self.n == 1:
            return True
        if step <= 0:
            return False
        if step % ncols == 0:
            return step // ncols >= r
        return step >= c and place.start % ncols + (self.n - 1) * step + c <= ncols

    def write(self, mem: str, flat: torch.Tensor, vals: torch.Tensor) -> None:
        """``vals`` at flat indices ``flat`` (vectors)."""
        self.bound(mem).tensor.view(-1).index_copy_(0, flat, vals)

    def clamped(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` clamped into the tensor (indices of elements inside their regions are)."""
        return flat.clamp(0, self.bound(mem).tensor.numel() - 1)


__all__ = ["Offset", "Regions", "tile_grid"]
