"""The InCore builder: declare dims, memref and scalar parameters, tiles, and apply tile ops.

Example (row softmax of a tile; dims are compile-time symbols that get one variant per value)::

    k = InCore("softmax_tile")
    R, C = k.dim("R", 32), k.dim("C", 128)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t, m = k.tile("t", R, C, f32), k.tile("m", R, 1, f32)
    k.load(t, x, 0, 0, pad=float("-inf"))
    k.rowmax(m, t)
    k.rowexpandsub(t, t, m)
    ...
    k.store(y, 0, 0, t)
    softmax_tile = k.build()

Every op checks its operands as it is added (so the error points at the line that wrote it);
``build()`` then checks the whole function (unused names, region bounds) and returns the
immutable :class:`pto.ir.nodes.IncoreFunction`.
"""

from __future__ import annotations

import contextlib
import math

from pto.builder.common import caller_loc, check_name, expr_of
from pto.errors import BuildError
from pto.ir.dtypes import dtype_of
from pto.ir.expr import Attr, Const, ExprLike, Var
from pto.ir.nodes import ForRange, IncoreFunction, Instr, MemRefParam, Parallel, ScalarParam, Tile
from pto.ir.ops import ATTRS, BINARY, BROADCAST, CAST, MASK, REDUCE, SCALAR_BINARY, UNARY, Op
from pto.ir.verify_incore import verify_incore
from pto.ir.verify_instr import IncoreCtx, check_instr


class TileRef:
    """Handle of a declared tile (what ``InCore.tile`` returns)."""

    __slots__ = ("name", "tile")

    def __init__(self, tile: Tile):
        self.name = tile.name
        self.tile = tile

    def __repr__(self) -> str:
        return f"<tile {self.name}: {self.tile.rows}x{self.tile.cols} {self.tile.dtype}>"


class MemRef:
    """Handle of a memref parameter; ``x.rows`` / ``x.cols`` are the valid extent of the region
    the call bound (smaller than the tiles at a residual edge)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    @property
    def rows(self) -> Attr:
        return Attr(self.name, "rows")

    @property
    def cols(self) -> Attr:
        return Attr(self.name, "cols")

    def __repr__(self) -> str:
        return f"<memref {self.name}>"


class InCore:
    """Builder of one InCore function."""

    def __init__(self, name: str):
        self.name = check_name(name, "InCore function", function=True)
        self._loc = caller_loc()
        self._params: list = []
        self._dims: list[tuple[str, int]] = []
        self._tiles: list[Tile] = []
        self._stack: list[list] = [[]]
        self._loop_vars: list[str] = []
        self._parallel: Parallel | None = None
        self._names: dict[str, str] = {}
        self._loaded: list[str] = []  # scalars defined by load_scalar
        self._built = False

    # declarations -----------------------------------------------------------------------------
    def _declare(self, name: str, kind: str) -> str:
        self._check_open()
        check_name(name, kind, self.name)
        if name in self._names:
            raise BuildError(f"`{self.name}`: `{name}` is already declared as {self._names[name]}")
        self._names[name] = kind
        return name

    def dim(self, name: str, default: int) -> Var:
        """A compile-time size symbol (e.g. the tile height) with its default value; calls pick
        a value per variant (``dims={"R": i.rows}``)."""
        if not isinstance(default, int) or isinstance(default, bool) or default <= 0:
            raise BuildError(f"`{self.name}`: dim `{name}` needs a positive integer default, got {default!r}")
        self._declare(name, "dim")
        self._dims.append((name, default))
        return Var(name)

    def memref(self, name: str, dtype, shape: tuple[ExprLike, ExprLike] | None = None) -> MemRef:
        """A global-tensor parameter. With ``shape`` the region is fixed and tiles overhanging
        it are masked; without, the region is what the loads and stores cover."""
        self._declare(name, "memref parameter")
        dt = dtype_of(dtype)
        shp = None
        if shape is not None:
            if not isinstance(shape, (tuple, list)) or len(shape) != 2:
                raise BuildError(f"`{self.name}`: shape of memref `{name}` must be (rows, cols)")
            shp = (expr_of(shape[0]), expr_of(shape[1]))
        self._params.append(MemRefParam(name, dt, shp))
        return MemRef(name)

    def scalar(self, name: str) -> Var:
        """An integer parameter passed per task (positions, lengths)."""
        self._declare(name, "scalar parameter")
        self._params.append(ScalarParam(name))
        return Var(name)

    def tile(self, name: str, rows: ExprLike, cols: ExprLike, dtype) -> TileRef:
        """A static tile; ``rows``/``cols`` are integers or expressions of dims."""
        self._declare(name, "tile")
        r, c = expr_of(rows), expr_of(cols)
        for e in (r, c):
            bad = [v for v in e.free_vars() if self._names.get(v) != "dim"]
            if bad:
                raise BuildError(f"`{self.name}`: tile `{name}` shape uses `{bad[0]}`, which is not a "
                                 "dim (tile shapes are static; declare it with dim())")
        t = Tile(name, r, c, dtype_of(dtype))
        dims = dict(self._dims)
        from pto.ir.facts import tile_shape

        rr, cc = tile_shape(t, dims)
        if rr <= 0 or cc <= 0:
            raise BuildError(f"`{self.name}`: tile `{name}` has non-positive shape {rr}x{cc}")
        self._tiles.append(t)
        return TileRef(t)

    def parallel(self, name: str, extent: ExprLike) -> Var:
        """Declare the parallel axis ``name`` in ``[0, extent)`` (a grid axis on the GPU)."""
        if self._parallel is not None:
            raise BuildError(f"`{self.name}`: only one parallel axis; `{self._parallel.var}` exists")
        self._declare(name, "parallel axis")
        self._parallel = Parallel(name, expr_of(extent))
        return Var(name)

    @contextlib.contextmanager
    def for_range(self, name: str, lb: ExprLike, ub: ExprLike, step: ExprLike = 1):
        """A sequential loop (``with k.for_range("kk", 0, K, 64) as kk: ...``)."""
        self._declare(name, "loop variable")
        lb_, ub_, st_ = expr_of(lb), expr_of(ub), expr_of(step)
        sv = st_.value if isinstance(st_, Const) else None
        if sv is not None and (not isinstance(sv, int) or sv <= 0):
            raise BuildError(f"`{self.name}`: loop `{name}` step must be a positive integer, got {sv!r}")
        scope = self._scope()
        for e in (lb_, ub_, st_):
            for v in e.free_vars():
                if v not in scope:
                    raise BuildError(f"`{self.name}`: loop `{name}` bound `{e}` uses undeclared `{v}`")
        self._stack.append([])
        self._loop_vars.append(name)
        try:
            yield Var(name)
        finally:
            body = self._stack.pop()
            self._loop_vars.pop()
            # the name goes out of scope; it may not be declared again
        if not body:
            raise BuildError(f"`{self.name}`: loop `{name}` has an empty body")
        self._stack[-1].append(ForRange(name, lb_, ub_, st_, tuple(body)))

    def _scope(self) -> set[str]:
        s = {p.name for p in self._params if isinstance(p, ScalarParam)}
        s |= set(self._loaded)
        s |= {k for k, _ in self._dims}
        s |= set(self._loop_vars)
        if self._parallel is not None:
            s.add(self._parallel.var)
        return s

    def _check_open(self):
        if self._built:
            raise BuildError(f"`{self.name}` was already built; start a new InCore builder")

    # instructions -----------------------------------------------------------------------------
    def _name(self, x) -> str:
        if isinstance(x, (TileRef, MemRef)):
            return x.name
        if isinstance(x, str):
            return x
        if isinstance(x, Var):
            return x.name
        raise BuildError(f"`{self.name}`: expected a tile or memref, got {type(x).__name__} {x!r}")

    def _emit(self, op: Op, dst, srcs: list, attrs: dict | None = None) -> None:
        self._check_open()
        sig = _signature_kinds(op)
        conv = []
        for kind, s in zip(sig, srcs):
            if kind in "TM":
                conv.append(self._name(s))
            else:
                if isinstance(s, (TileRef, MemRef)):
                    raise BuildError(f"`{self.name}`, {op.value}: expected a scalar, got {s.name!r}")
                conv.append(expr_of(s))
        defaults = ATTRS[op]
        attr_items = []
        for k, v in (attrs or {}).items():
            if k in defaults and v == defaults[k] and type(v) is type(defaults[k]):
                continue  # defaults are implicit, so equal programs print equally
            if k == "acc":
                v = dtype_of(v).short
            attr_items.append((k, v))
        ins = Instr(op, None if dst is None else self._name(dst), tuple(conv), tuple(sorted(attr_items)),
                    loc=caller_loc())
        ctx = IncoreCtx(self._snapshot(), dict(self._dims), set(self._loaded))
        check_instr(ctx, ins, self._scope())
        self._stack[-1].append(ins)

    def _snapshot(self) -> IncoreFunction:
        return IncoreFunction(self.name, tuple(self._params), tuple(self._dims), tuple(self._tiles),
                              (), self._parallel, (), self._loc)

    def load_scalar(self, name: str, src, row: ExprLike, col: ExprLike) -> Var:
        """A scalar read from memory when the task runs: the integer value of ``src[row, col]``
        (an f32 memref; integers are exact below 2**24). Device data (a decode step's position,
        a token id) becomes an offset or a bound without rebuilding the graph. At the top level,
        before its uses; a load or store whose offset uses it needs the memref's ``shape``."""
        if len(self._stack) > 1:
            raise BuildError(f"`{self.name}`: load_scalar `{name}` must be at the function's top level, not "
                             "inside a loop")
        self._declare(name, "loaded scalar")
        self._check_open()
        ins = Instr(Op.LOAD_SCALAR, name, (self._name(src), expr_of(row), expr_of(col)), loc=caller_loc())
        check_instr(IncoreCtx(self._snapshot(), dict(self._dims), set(self._loaded)), ins, self._scope())
        self._loaded.append(name)
        self._stack[-1].append(ins)
        return Var(name)

    def load(self, dst, src, row: ExprLike, col: ExprLike, pad: float = 0.0, step: int = 1) -> None:
        """``dst = src[row : row + dst.rows * step : step, col : col + dst.cols]`` relative to
        the region (``step`` > 1: every step-th row, a strided load); elements outside the
        region's valid extent read as ``pad``."""
        self._emit(Op.LOAD, dst, [src, row, col], {"pad": float(pad), "step": step})

    def store(self, dst, row: ExprLike, col: ExprLike, src) -> None:
        """``dst[row : ..., col : ...] = src``; elements outside the valid extent are skipped."""
        self._emit(Op.STORE, None, [src, dst, row, col])

    def store_add(self, dst, row: ExprLike, col: ExprLike, src) -> None:
        """``dst[row : ..., col : ...] += src``, one atomic add an element (f32 tile, f32 memref):
        the items of a task may add into the same region, in any order (a split-K sum); the task
        reads and writes ``dst``. Elements outside the valid extent are skipped."""
        self._emit(Op.STORE_ADD, None, [src, dst, row, col])

    def matmul(self, dst, a, b, ta: bool = False, tb: bool = False, acc="f32") -> None:
        """``dst = op(a) @ op(b)`` accumulated in ``acc`` (op transposes when ``ta``/``tb``)."""
        self._emit(Op.MATMUL, dst, [a, b], {"ta": bool(ta), "tb": bool(tb), "acc": acc})

    def matmul_acc(self, dst, a, b, ta: bool = False, tb: bool = False, acc="f32") -> None:
        """``dst += op(a) @ op(b)`` accumulated in ``acc``."""
        self._emit(Op.MATMUL_ACC, dst, [a, b], {"ta": bool(ta), "tb": bool(tb), "acc": acc})

    def full(self, dst, value: float) -> None:
        """Fill ``dst`` with a constant."""
        self._emit(Op.FULL, dst, [float(value)])

    def deinterleave(self, dst, src, part: int) -> None:
        """``dst = src[:, part::2]``: every other column of ``src`` (R x 2C) from column ``part``
        (0 or 1), converted to dst's dtype (R x C)."""
        self._emit(Op.DEINTERLEAVE, dst, [src], {"part": part})

    def mask_causal(self, dst, src, diag: ExprLike, fill: float = -math.inf) -> None:
        """Keep ``src[r, c]`` where ``c <= r + diag``, else ``fill`` (causal attention with
        ``diag = q_pos - k_pos``)."""
        self._emit(Op.MASK_CAUSAL, dst, [src, diag], {"fill": float(fill)})

    def mask_cols(self, dst, src, ncols: ExprLike, fill: float = -math.inf) -> None:
        """Keep columns ``c < ncols``, else ``fill``."""
        self._emit(Op.MASK_COLS, dst, [src, ncols], {"fill": float(fill)})

    def mask_rows(self, dst, src, nrows: ExprLike, fill: float = 0.0) -> None:
        """Keep rows ``r < nrows``, else ``fill``."""
        self._emit(Op.MASK_ROWS, dst, [src, nrows], {"fill": float(fill)})

    def allreduce(self, dst, src, acc="f32") -> None:
        """``dst = sum of src over every rank`` of the default process group (torch.distributed),
        summed in ``acc`` (f32, or src's dtype: half the bytes sent) and rounded to dst's dtype;
        with one rank, ``dst = src``. A collective: each rank runs the same task graph, so the
        task that holds it issues it on every rank (docs/ARCHITECTURE.md, "Tensor parallelism")."""
        self._emit(Op.ALLREDUCE, dst, [src], {"acc": acc})

    # build -------------------------------------------------------------------------------------
    def build(self, target=None) -> IncoreFunction:
        """Validate the whole function and return it (the builder is closed afterwards).

        With ``target`` (a :class:`pto.machine.target.Target`) the tiles live at the
        same time must also fit the target's on-chip memory (SramError otherwise)."""
        self._check_open()
        if len(self._stack) != 1:
            raise BuildError(f"`{self.name}`: build() inside an open loop")
        fn = IncoreFunction(self.name, tuple(self._params), tuple(self._dims), tuple(self._tiles),
                            tuple(self._stack[0]), self._parallel, (), self._loc)
        if not fn.body:
            raise BuildError(f"`{self.name}` has no instructions")
        verify_incore(fn)
        if target is not None:
            from pto.passes.tiling import check_sram

            check_sram(fn, target)
        self._built = True
        return fn


def _signature_kinds(op: Op) -> str:
    from pto.ir.ops import SIGNATURE

    return SIGNATURE[op][0]


def _make_method(op: Op, doc: str):
    kinds = _signature_kinds(op)

    def method(self, dst, *srcs):
        if len(srcs) != len(kinds):
            raise BuildError(f"`{self.name}`, {op.value}: takes {len(kinds)} operands after the "
                             f"destination, got {len(srcs)}")
        self._emit(op, dst, list(srcs))

    method.__name__ = op.value
    method.__doc__ = doc
    return method


_DOCS = {
    "binary": "``dst = a {} b`` elementwise (computed in f32, rounded to dst's dtype).",
    "scalar": "``dst = a {} s`` with a scalar ``s``.",
    "unary": "``dst = {}(a)`` elementwise.",
    "reduce": "``dst = {} of a`` along rows (R x 1 result) or columns (1 x C).",
    "broadcast": "``dst = a {} v`` with ``v`` broadcast along the tile.",
    "cast": "``dst = {}(a)`` converting to dst's dtype.",
}

for _op in BINARY:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["binary"].format(_op.value)))
for _op in SCALAR_BINARY:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["scalar"].format(_op.value[:-1])))
for _op in UNARY:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["unary"].format(_op.value)))
for _op in REDUCE:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["reduce"].format(_op.value)))
InCore.rowargmax.__doc__ = ("``dst[r] =`` the column of row r's largest element of ``a`` (the first of equal ones), "
                            "as a number in dst's float dtype (exact below 2**24): greedy sampling's argmax.")
for _op in BROADCAST:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["broadcast"].format(_op.value)))
for _op in CAST:
    setattr(InCore, _op.value, _make_method(_op, _DOCS["cast"].format(_op.value)))
del _op

_ = MASK  # masks have explicit methods above (they take a fill)
