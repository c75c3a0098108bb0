"""Loads and stores of the tile evaluator: tiles of a batch of instances gathered from, and
scattered into, the regions their memref parameters are bound to.

Every instance (task x parallel index) reads an ``r x c`` tile at an offset ``(row, col)`` of its
region. An offset is an :class:`Offset`: an int (the same for every instance) or an int64 vector,
with its smallest and largest value. A tile's elements lie at flat indices (row-major into the
contiguous tensor) from its start: the region's first element plus ``row * ncols + col``. A
:class:`Place` says where the tiles of some instances start: evenly stepping starts (one task, a
parallel axis over column blocks, consecutive row tiles) make one strided view of the tensor,
copied in one op; otherwise one ``index_select`` (a load) or ``index_copy_`` (a store) moves the
tiles' rows, each a window of ``c`` consecutive elements of the tensor.

Tiles inside their regions (decided from the offsets' extremes where that suffices, without a
tensor op where they are ints) take that path. The instances with a tile overhanging its region
take the masked path: a load reads the elements from indices clamped into the tensor and puts
the pad where they lie outside the region; a store writes only the elements inside. Regions lie
inside their tensors (the runtime refuses others), so an element inside its region has the
same index either way, and the values moved are exactly those of row and column indexing (the
evaluator's former, slower form).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from pto.data.batch import RegionBatch
from pto.evaluator.support import arange


class Offset(NamedTuple):
    """An offset in the regions: ``value`` an int or an int64 vector; ``lo``, ``hi`` its extremes;
    ``fixed``: the same object serves a whole batch (so what is derived from it may be kept).
    A named tuple: made for every load and store, where a dataclass costs microseconds."""

    value: int | torch.Tensor
    lo: int
    hi: int
    fixed: bool = False

    @staticmethod
    def of(v, fixed: bool = False) -> Offset:
        if isinstance(v, torch.Tensor):
            v = v.to(torch.int64)
            if v.dim() == 0:
                return Offset(int(v), int(v), int(v), fixed)
            (lo, hi), = _extremes(v.reshape(1, -1))
            return Offset(v, lo, hi, fixed)
        return Offset(int(v), int(v), int(v), fixed)

    def pick(self, inst: torch.Tensor):
        """The values of instances ``inst``."""
        return self.value[inst] if isinstance(self.value, torch.Tensor) else self.value


#: vectors up to this length are read into Python for their extremes (one op, not three)
SMALL = 256


def _extremes(v: torch.Tensor) -> list[tuple[int, int]]:
    """The smallest and largest value of each row of an int matrix ((0, 0) for empty rows)."""
    if v.shape[1] <= SMALL:
        return [(min(row), max(row)) if row else (0, 0) for row in v.tolist()]
    lo, hi = torch.aminmax(v, dim=1)
    return list(zip(lo.tolist(), hi.tolist()))


class Place(NamedTuple):
    """Where the tiles of ``n`` instances start, as flat indices into the tensor: instance
    ``i``'s at ``start + i * step`` where ``starts`` is None (strided), else at ``start +
    starts[i]``; ``rows`` (where the tiles' rows start, n * r indices from ``start``, or None)
    is kept with it."""

    n: int
    start: int
    step: int = 0
    starts: torch.Tensor | None = None
    rows: torch.Tensor | None = None

    def shifted(self, by: int) -> Place:
        return Place(self.n, self.start + by, self.step, self.starts, self.rows)


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
        self.storage_offset = rb.tensor.storage_offset()
        # the region extents' extremes: offsets known by theirs are checked against them
        (r0_lo, r0_hi), (c0_lo, c0_hi), (self.rows_min, self.rows_max), (self.cols_min, self.cols_max) = (
            _extremes(torch.stack([rb.row0, rb.col0, rb.rows, rb.cols])))
        # the flat offset of each region's first element
        self.base: int | torch.Tensor = r0_lo * self.ncols + c0_lo
        if r0_lo != r0_hi or c0_lo != c0_hi:
            base = rb.row0 * self.ncols + rb.col0
            self.base = base if task is None else base[task]
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
    instance ``i``, None when every task has one instance); ``inst`` (an int64 vector) picks
    some of the instances."""

    def __init__(self, mems: dict[str, RegionBatch], task: torch.Tensor | None, n: int, device):
        self.mems = mems
        self.task = task
        self.n = n
        self.device = device
        self._bound: dict[str, _Bound] = {}
        self._places: dict[tuple, Place] = {}  # places of fixed vector offsets, before the int shift

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

    def none_inside(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> bool:
        """Whether no instance's ``r x c`` tile lies inside its region, as far as the extremes
        tell (False may be conservative)."""
        b = self.bound(mem)
        return row.lo + r > b.rows_max or col.lo + c > b.cols_max or row.hi < 0 or col.hi < 0 or self.n <= 1

    def inside(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> torch.Tensor:
        """Per instance (a bool vector): whether its ``r x c`` tile lies inside its region."""
        b = self.bound(mem)
        ok = (b.per_instance("rows") >= row.value + r) & (b.per_instance("cols") >= col.value + c)
        for off in (row, col):
            if off.lo < 0:
                ok = ok & (torch.as_tensor(off.value, device=self.device) >= 0)
        return ok

    def partition(self, mem: str, row: Offset, col: Offset, r: int, c: int):
        """``(good, bad)``: the instances whose ``r x c`` tiles lie inside their regions and the
        others (index vectors), or ``(None, None)`` when none does."""
        if self.none_inside(mem, row, col, r, c):
            return None, None
        inside = self.inside(mem, row, col, r, c)
        good = inside.nonzero().view(-1)
        if not good.shape[0]:
            return None, None
        return good, (~inside).nonzero().view(-1)

    def valid(self, mem: str, row: Offset, col: Offset, r: int, c: int, inst: torch.Tensor | None) -> torch.Tensor:
        """Per element of the tiles of instances ``inst`` (all where None; M x r x c, bool):
        whether it lies inside its region."""
        b = self.bound(mem)
        valid = []
        for off, size, field in ((row, r, "rows"), (col, c, "cols")):
            v, extent = off.value, b.per_instance(field)
            if inst is not None:
                v, extent = off.pick(inst), extent[inst]
            at = arange(size, self.device).view(1, size) + (v.view(-1, 1) if isinstance(v, torch.Tensor) else v)
            ok = at < extent.view(-1, 1)
            valid.append(ok & (at >= 0) if off.lo < 0 else ok)
        return valid[0].view(-1, r, 1) & valid[1].view(-1, 1, c)

    def masked_read(self, mem: str, place: Place, row: Offset, col: Offset, r: int, c: int, pad: float,
                    inst: torch.Tensor | None = None) -> torch.Tensor:
        """The tiles of instances ``inst`` (``place``: theirs; all where None), ``pad`` where they
        lie outside their regions (the elements there are read from indices clamped into the tensor)."""
        t = self.bound(mem).tensor
        vals = self.read(mem, self.clamped(mem, self.flat(mem, place, r, c)))
        pad_t = torch.tensor(pad, dtype=t.dtype, device=self.device)
        return torch.where(self.valid(mem, row, col, r, c, inst), vals, pad_t)

    def masked_write(self, mem: str, place: Place, row: Offset, col: Offset, r: int, c: int, vals: torch.Tensor,
                     inst: torch.Tensor | None = None) -> None:
        """Write the elements of the tiles ``vals`` of instances ``inst`` (``place``: theirs; all
        where None) that lie inside their regions."""
        keep = self.valid(mem, row, col, r, c, inst).expand(vals.shape)
        self.write(mem, self.flat(mem, place, r, c).expand(vals.shape)[keep], vals[keep])

    def place(self, mem: str, row: Offset, col: Offset, r: int, c: int) -> Place:
        """Where every instance's ``r x c`` tile starts (kept for the batch where the offsets are
        fixed; the int parts make a shift, without a tensor op)."""
        b = self.bound(mem)
        shift, spread, key = 0, [], (mem, r, c)
        for off, scale in ((b.base, 1), (row.value, b.ncols), (col.value, 1)):
            if isinstance(off, int):
                shift += off * scale
            else:
                spread.append(off if scale == 1 else off * scale)
        if not spread:
            return Place(self.n, shift)
        for o in (row, col):
            if not isinstance(o.value, int):
                key = key + (id(o),) if o.fixed and key is not None else None
        place = self._places.get(key) if key is not None else None
        if place is None:
            place = self._even(sum(spread[1:], spread[0]))
            if key is not None:
                if place.starts is not None:  # its rows too, for the batch
                    place = Place(place.n, place.start, 0, place.starts, self._rows(mem, place.starts, r))
                self._places[key] = place
        return place.shifted(shift)

    def subset(self, place: Place, inst: torch.Tensor) -> Place:
        """The place of the tiles of instances ``inst``."""
        starts = place.step * inst if place.starts is None else place.starts[inst]
        return self._even(starts).shifted(place.start)

    def _even(self, starts: torch.Tensor) -> Place:
        """The place of tiles starting at flat offsets ``starts`` (a vector): strided where they
        step evenly."""
        n = starts.shape[0]
        head = starts.tolist() if n <= SMALL else starts[:2].tolist()
        first = head[0] if head else 0
        step = head[1] - first if n > 1 else 0
        if n <= SMALL:
            even = head == [first + i * step for i in range(n)]
        else:
            even = torch.equal(starts, first + step * arange(n, self.device))
        return Place(n, first, step) if even else Place(n, 0, 0, starts)

    def flat(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """The flat element indices of the tiles of ``place``, one M x r x c tensor."""
        starts = place.starts if place.starts is not None else place.step * arange(place.n, self.device)
        grid = tile_grid(r, c, self.bound(mem).ncols, self.device) + starts.view(-1, 1, 1)
        return grid + place.start if place.start else grid

    def _rows(self, mem: str, starts: torch.Tensor, r: int) -> torch.Tensor:
        """Where the rows of tiles starting at ``starts`` start (M * r flat indices)."""
        ncols = self.bound(mem).ncols
        return (starts.view(-1, 1) + tile_grid(r, 1, ncols, self.device).view(1, r)).view(-1)

    def _strided(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """The tiles of a strided ``place`` as one view (M x r x c) of the tensor."""
        b = self.bound(mem)
        return b.tensor.as_strided((place.n, r, c), (place.step, b.ncols, 1), b.storage_offset + place.start)

    def _windows(self, mem: str, start: int, c: int) -> torch.Tensor:
        """The tensor from flat index ``start`` on as overlapping windows of ``c`` elements
        (window ``k``: elements ``start + k`` to ``start + k + c - 1``): a tile row is a window."""
        b = self.bound(mem)
        return b.tensor.as_strided((b.tensor.numel() - start - c + 1, c), (1, 1), b.storage_offset + start)

    def gather(self, mem: str, place: Place, r: int, c: int) -> torch.Tensor:
        """The M x r x c elements of the tiles of ``place`` (all inside the tensor)."""
        if place.starts is None and place.step >= 0:
            return self._strided(mem, place, r, c).clone(memory_format=torch.contiguous_format)
        if place.starts is None:
            return self.read(mem, self.flat(mem, place, r, c))
        rows = place.rows if place.rows is not None else self._rows(mem, place.starts, r)
        return self._windows(mem, place.start, c).index_select(0, rows).view(place.n, r, c)

    def scatter(self, mem: str, place: Place, vals: torch.Tensor, r: int, c: int) -> None:
        """Write the M x r x c ``vals`` into the tiles of ``place`` (all inside the tensor)."""
        if place.starts is None and self._disjoint(mem, place, r, c):
            self._strided(mem, place, r, c).copy_(vals)
        elif place.starts is None:
            self.write(mem, self.flat(mem, place, r, c).reshape(-1), vals.reshape(-1))
        else:
            # the windows overlap in memory, the rows written do not (tiles of a batch never
            # do); torch checks a written view for overlap only where a stride is 0
            rows = place.rows if place.rows is not None else self._rows(mem, place.starts, r)
            self._windows(mem, place.start, c).index_copy_(0, rows, vals.reshape(-1, c))

    def _disjoint(self, mem: str, place: Place, r: int, c: int) -> bool:
        """Whether the strided tiles of ``place`` are disjoint (side by side, or stacked)."""
        ncols, step = self.bound(mem).ncols, place.step
        if place.n <= 1:
            return True
        if step <= 0:
            return False
        if step % ncols == 0:
            return step // ncols >= r
        return step >= c and place.start % ncols + (place.n - 1) * step + c <= ncols

    def read(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        """The elements at flat indices ``flat`` (any shape, all inside the tensor)."""
        return self.bound(mem).tensor.view(-1).index_select(0, flat.reshape(-1)).view(flat.shape)

    def write(self, mem: str, flat: torch.Tensor, vals: torch.Tensor) -> None:
        """``vals`` at flat indices ``flat`` (vectors)."""
        self.bound(mem).tensor.view(-1).index_copy_(0, flat, vals)

    def add(self, mem: str, flat: torch.Tensor, vals: torch.Tensor) -> None:
        """``vals`` added at flat indices ``flat`` (vectors; an index may repeat: each value is
        added, in order on the CPU)."""
        self.bound(mem).tensor.view(-1).index_add_(0, flat, vals)

    def clamped(self, mem: str, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` clamped into the tensor (indices of elements inside their regions are)."""
        return flat.clamp(0, self.bound(mem).tensor.numel() - 1)


__all__ = ["Offset", "Place", "Regions", "tile_grid"]
