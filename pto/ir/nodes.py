"""IR nodes: InCore functions (tiles and tile instructions) and orchestration functions
(scalars, loops, conditions and calls on tensor regions), and the Module that holds both.

Nodes are frozen dataclasses, so two modules compare equal exactly when they are the same
program (source locations are carried along but do not take part in equality). Nothing here
checks anything: the verifiers (:mod:`pto.ir.verify`) do, for the builders (:mod:`pto.builder`)
and the text parser alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from pto.ir.dtypes import DType
from pto.ir.expr import Expr
from pto.ir.names import variant_name
from pto.ir.ops import Op

# --------------------------------------------------------------------------- InCore functions


@dataclass(frozen=True)
class Tile:
    """A static on-chip tile. ``rows``/``cols`` may use the function's dims (``R``)."""

    name: str
    rows: Expr
    cols: Expr
    dtype: DType


@dataclass(frozen=True)
class MemRefParam:
    """A global-tensor parameter. A call binds it to a region of a tensor; loads and stores are
    relative to the region's origin. ``shape``, when given, is the region the function may
    touch (tiles overhanging it are masked); otherwise the region is what the loads and stores
    cover."""

    name: str
    dtype: DType
    shape: tuple[Expr, Expr] | None = None


@dataclass(frozen=True)
class ScalarParam:
    """An integer parameter, passed per task (positions, lengths)."""

    name: str


Param = Union[MemRefParam, ScalarParam]

Operand = Union[str, Expr]  # a tile or memref name, or a scalar expression


@dataclass(frozen=True)
class Instr:
    """One tile instruction: ``op dst, srcs {attrs}``. ``dst`` is None for a store."""

    op: Op
    dst: str | None
    srcs: tuple[Operand, ...]
    attrs: tuple[tuple[str, object], ...] = ()
    loc: str | None = field(default=None, compare=False)

    def attr(self, name: str):
        from pto.ir.ops import ATTRS

        for k, v in self.attrs:
            if k == name:
                return v
        return ATTRS[self.op][name]


@dataclass(frozen=True)
class ForRange:
    """A sequential loop inside an InCore function (e.g. the K loop of a matmul)."""

    var: str
    lb: Expr
    ub: Expr
    step: Expr
    body: tuple[IncoreStmt, ...]


IncoreStmt = Union[Instr, ForRange]


@dataclass(frozen=True)
class Parallel:
    """A parallel axis ``var`` in ``[0, extent)``: a grid axis on the GPU, a loop elsewhere."""

    var: str
    extent: Expr


@dataclass(frozen=True)
class IncoreFunction:
    """A tile kernel. A generic definition has ``dims`` (symbols with defaults); a variant made
    by :func:`pto.ir.analysis.specialize` has none left and records their values in
    ``variant``, keeping the generic ``name``."""

    name: str
    params: tuple[Param, ...]
    dims: tuple[tuple[str, int], ...]  # compile-time symbols with their default values
    tiles: tuple[Tile, ...]
    body: tuple[IncoreStmt, ...]
    parallel: Parallel | None = None
    # the dim values this function was specialized with (empty for a generic definition)
    variant: tuple[tuple[str, int], ...] = ()
    loc: str | None = field(default=None, compare=False)

    kind = "incore"

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None

    def tile(self, name: str) -> Tile | None:
        for t in self.tiles:
            if t.name == name:
                return t
        return None

    @property
    def memrefs(self) -> tuple[MemRefParam, ...]:
        return tuple(p for p in self.params if isinstance(p, MemRefParam))

    @property
    def scalars(self) -> tuple[ScalarParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarParam))

    @property
    def variant_name(self) -> str:
        """``name`` plus the dim values it was specialized with, e.g. ``softmax_tile__R64``: built
        from ``name`` and ``variant``, the data to read instead of parsing it."""
        return variant_name(self.name, self.variant)


# --------------------------------------------------------------------- orchestration functions


@dataclass(frozen=True)
class TensorDecl:
    """A whole 2-D tensor of the orchestration. ``role`` is input, output, inout or temp
    (temps are allocated by whoever runs the program)."""

    name: str
    rows: Expr
    cols: Expr
    dtype: DType
    role: str = "input"


@dataclass(frozen=True)
class RegionBinding:
    """``tensor[row, col]`` with an optional valid extent (rows, cols); without one the extent is
    the callee's region for the parameter."""

    tensor: str
    row: Expr
    col: Expr
    rows: Expr | None = None
    cols: Expr | None = None


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[tuple[str, RegionBinding | Expr], ...]  # memref params -> region, scalars -> expr
    dims: tuple[tuple[str, Expr], ...] = ()  # callee dims -> expression (constant per variant)
    loc: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr


@dataclass(frozen=True)
class Loop:
    """``for var in range(lb, ub, step)``. With ``tile_levels`` the loop is adaptive: it counts
    base tiles of height ``tile_levels[0]`` and binary expansion runs blocks of ``p`` base tiles
    with the taller tiles ``tile_levels[p]``; ``var.rows`` is the current tile height.

    Merging iterations is only the same program when they are independent; binary expansion
    proves that (:mod:`pto.passes.expansion.independence`). ``reassociate`` is the author's promise that
    regions every iteration touches alike (accumulators, scratch) may be merged too: one call
    over the merged tiles equals the calls it replaces up to floating-point re-association."""

    var: str
    lb: Expr
    ub: Expr
    step: Expr
    body: tuple[OrchStmt, ...]
    max_range: int | None = None
    min_range: int | None = None
    tile_levels: tuple[tuple[int, int], ...] | None = None
    reassociate: bool = False

    @property
    def adaptive(self) -> bool:
        return self.tile_levels is not None

    @property
    def base_rows(self) -> int | None:
        return dict(self.tile_levels)[0] if self.tile_levels else None

    @property
    def merge_factor(self) -> int:
        """How many base iterations binary expansion may merge into one (1: none)."""
        if not self.tile_levels:
            return 1
        return max(h for _, h in self.tile_levels) // self.base_rows


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple[OrchStmt, ...]
    orelse: tuple[OrchStmt, ...] = ()


OrchStmt = Union[Call, Let, Loop, If]


@dataclass(frozen=True)
class OrchFunction:
    name: str
    scalars: tuple[str, ...]
    tensors: tuple[TensorDecl, ...]
    body: tuple[OrchStmt, ...]
    loc: str | None = field(default=None, compare=False)

    kind = "orchestration"

    def tensor(self, name: str) -> TensorDecl | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None


Function = Union[IncoreFunction, OrchFunction]


@dataclass(frozen=True)
class Module:
    """InCore and orchestration functions plus the entry orchestration function's name."""

    functions: tuple[Function, ...]
    entry: str

    def get(self, name: str) -> Function | None:
        for f in self.functions:
            if f.name == name:
                return f
        return None

    def __getitem__(self, name: str) -> Function:
        f = self.get(name)
        if f is None:
            raise KeyError(name)
        return f

    @property
    def entry_function(self) -> OrchFunction:
        return self[self.entry]  # type: ignore[return-value]

    @property
    def incore_functions(self) -> tuple[IncoreFunction, ...]:
        return tuple(f for f in self.functions if isinstance(f, IncoreFunction))

    @property
    def orchestration_functions(self) -> tuple[OrchFunction, ...]:
        return tuple(f for f in self.functions if isinstance(f, OrchFunction))


def walk_instrs(body):
    """Every instruction of an InCore body, in order, loops' bodies included."""
    for s in body:
        if isinstance(s, ForRange):
            yield from walk_instrs(s.body)
        else:
            yield s


def walk_calls(body) -> list[Call]:
    """All calls of an orchestration body, in program order (both branches of an if)."""
    out: list[Call] = []
    for s in body:
        if isinstance(s, Call):
            out.append(s)
        elif isinstance(s, Loop):
            out.extend(walk_calls(s.body))
        elif isinstance(s, If):
            out.extend(walk_calls(s.then))
            out.extend(walk_calls(s.orelse))
    return out
