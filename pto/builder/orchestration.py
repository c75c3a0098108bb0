"""The orchestration builder: scalar parameters and arithmetic, tensors, loops (with the binary
expansion attributes), if/else, and calls of InCore functions on regions of whole tensors.

Example::

    o = Orchestration("softmax")
    R, C = o.scalar("R"), o.scalar("C")
    x, y = o.input("x", R, C, f32), o.output("y", R, C, f32)
    n = o.let("n", cdiv(R, 32))
    with o.for_loop("i", 0, n, max_range=8, min_range=1, tile_levels={0: 32, 8: 64}) as i:
        rows = emin(i.rows, R - i * 32)
        o.call(softmax_tile, {"x": (x, i * 32, 0, rows, C), "y": (y, i * 32, 0, rows, C)},
               dims={"R": i.rows})
    module = o.module()

A call's regions take their direction (in/out/inout) and extent from the callee's loads and
stores (:func:`pto.ir.analysis.param_access`); a binding may narrow the extent (residual
tiles), never widen it.
"""

from __future__ import annotations

import contextlib

from pto.builder.common import caller_loc, check_name
from pto.errors import BuildError
from pto.ir.analysis import param_access
from pto.ir.dtypes import dtype_of
from pto.ir.expr import Expr, ExprLike, Var, as_expr, const_value, evaluate
from pto.ir.nodes import (
    Call,
    If,
    IncoreFunction,
    Let,
    Loop,
    MemRefParam,
    Module,
    OrchFunction,
    RegionBinding,
    TensorDecl,
)

ROLES = ("input", "output", "inout", "temp")


class TensorRef:
    """Handle of a declared tensor."""

    __slots__ = ("decl",)

    def __init__(self, decl: TensorDecl):
        self.decl = decl

    @property
    def name(self) -> str:
        return self.decl.name

    def __getitem__(self, idx):
        """``x[row, col]`` or ``x[row, col, rows, cols]``: a region binding."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        return (self, *idx)

    def __repr__(self) -> str:
        d = self.decl
        return f"<tensor {d.name}: {d.rows}x{d.cols} {d.dtype} {d.role}>"


class _Frame:
    def __init__(self, loop: str | None = None, adaptive: bool = False):
        self.stmts: list = []
        self.names: set[str] = set()
        self.loop = loop
        self.adaptive = adaptive


class Orchestration:
    """Builder of one orchestration function."""

    def __init__(self, name: str, functions: list[IncoreFunction] | tuple = ()):
        self.name = check_name(name, "orchestration function")
        self._loc = caller_loc()
        self._scalars: list[str] = []
        self._tensors: dict[str, TensorDecl] = {}
        self._frames: list[_Frame] = [_Frame()]
        self._callees: dict[str, IncoreFunction] = {}
        self._access_cache: dict[int, dict] = {}
        for f in functions:
            self._register(f)
        self._built = False

    def _fail(self, msg: str, loc: str | None = None):
        where = f" ({loc})" if loc else ""
        raise BuildError(f"`{self.name}`{where}: {msg}")

    # declarations -----------------------------------------------------------------------------
    def _all_names(self) -> set[str]:
        s = set(self._scalars) | set(self._tensors)
        for f in self._frames:
            s |= f.names
        return s

    def _declare(self, name: str, what: str) -> str:
        self._check_open()
        check_name(name, what, self.name)
        if name in self._all_names():
            self._fail(f"`{name}` is already declared")
        return name

    def scalar(self, name: str) -> Var:
        """An integer parameter of the program (a sequence length, a batch size)."""
        if len(self._frames) != 1 or self._frames[0].stmts:
            self._fail(f"declare scalar parameter `{name}` before any statement")
        self._declare(name, "scalar parameter")
        self._scalars.append(name)
        return Var(name)

    def tensor(self, name: str, rows: ExprLike, cols: ExprLike, dtype, role: str = "input") -> TensorRef:
        """A whole 2-D tensor; ``role`` is input, output, inout or temp."""
        if role not in ROLES:
            self._fail(f"tensor `{name}`: role must be one of {', '.join(ROLES)}, got {role!r}")
        self._declare(name, "tensor")
        r, c = as_expr(rows), as_expr(cols)
        for e in (r, c):
            for v in e.free_vars():
                if v not in self._scalars:
                    self._fail(f"tensor `{name}` shape uses `{v}`, which is not a scalar parameter")
        d = TensorDecl(name, r, c, dtype_of(dtype), role)
        self._tensors[name] = d
        return TensorRef(d)

    def input(self, name, rows, cols, dtype) -> TensorRef:
        return self.tensor(name, rows, cols, dtype, "input")

    def output(self, name, rows, cols, dtype) -> TensorRef:
        return self.tensor(name, rows, cols, dtype, "output")

    def inout(self, name, rows, cols, dtype) -> TensorRef:
        return self.tensor(name, rows, cols, dtype, "inout")

    def temp(self, name, rows, cols, dtype) -> TensorRef:
        return self.tensor(name, rows, cols, dtype, "temp")

    # scalar statements ------------------------------------------------------------------------
    def _scope(self) -> set[str]:
        s = set(self._scalars)
        for f in self._frames:
            s |= f.names
            if f.adaptive:
                s.add(f"{f.loop}.rows")
        return s

    def _expr(self, x: ExprLike, what: str, loc: str | None) -> Expr:
        if isinstance(x, (TensorRef,)):
            self._fail(f"{what}: expected a scalar expression, got tensor `{x.name}`", loc)
        try:
            e = as_expr(x)
        except BuildError as err:
            self._fail(f"{what}: {err}", loc)
        scope = self._scope()
        for v in e.free_vars():
            if v not in scope:
                if v.endswith(".rows"):
                    self._fail(f"{what}: `{v}` is only defined inside the adaptive loop "
                               f"`{v[:-5]}` (one with tile_levels)", loc)
                if v in self._tensors:
                    self._fail(f"{what}: `{v}` is a tensor, not a scalar", loc)
                self._fail(f"{what}: scalar `{v}` is not declared", loc)
        return e

    def let(self, name: str, value: ExprLike) -> Var:
        """Bind a scalar name to an expression (immutable; one binding per name)."""
        loc = caller_loc()
        e = self._expr(value, f"let `{name}`", loc)
        self._declare(name, "scalar")
        self._frames[-1].names.add(name)
        self._frames[-1].stmts.append(Let(name, e))
        return Var(name)

    # control flow -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def for_loop(self, name: str, lb: ExprLike, ub: ExprLike, step: ExprLike = 1,
                 max_range: int | None = None, min_range: int | None = None,
                 tile_levels: dict[int, int] | None = None, reassociate: bool = False):
        """``for name in range(lb, ub, step)``. With ``tile_levels`` the loop is adaptive: it
        counts base tiles of height ``tile_levels[0]``; binary expansion (pto.passes) runs
        power-of-two blocks of ``p`` iterations (``min_range <= p <= max_range``) with tile
        height ``tile_levels[p]`` and ``name.rows`` is the current tile height.

        Binary expansion merges iterations only when it proves them independent. With
        ``reassociate=True`` the author promises that regions every iteration touches alike (the
        state of a reduction, scratch) may be merged as well: one call over the merged tiles
        equals the calls it replaces up to floating-point re-association (an online softmax
        over kv tiles)."""
        loc = caller_loc()
        if not isinstance(reassociate, bool):
            self._fail(f"loop `{name}`: reassociate must be True or False, got {reassociate!r}", loc)
        if reassociate and tile_levels is None:
            self._fail(f"loop `{name}`: reassociate=True needs tile_levels (only adaptive loops merge "
                       "iterations)", loc)
        lb_ = self._expr(lb, f"loop `{name}` lower bound", loc)
        ub_ = self._expr(ub, f"loop `{name}` upper bound", loc)
        st_ = self._expr(step, f"loop `{name}` step", loc)
        sv = const_value(st_)
        if sv is not None and (not isinstance(sv, int) or sv <= 0):
            self._fail(f"loop `{name}`: step must be a positive integer, got {sv!r}", loc)
        levels, max_range, min_range = check_loop_attrs(self.name, name, st_, max_range, min_range,
                                                        tile_levels, loc)
        self._declare(name, "loop variable")
        frame = _Frame(loop=name, adaptive=levels is not None)
        frame.names.add(name)
        self._frames.append(frame)
        try:
            yield Var(name)
        finally:
            self._frames.pop()
        if not frame.stmts:
            self._fail(f"loop `{name}` has an empty body", loc)
        self._frames[-1].stmts.append(Loop(name, lb_, ub_, st_, tuple(frame.stmts),
                                           max_range if levels else None,
                                           min_range if levels else None, levels, reassociate))

    @contextlib.contextmanager
    def if_(self, cond: ExprLike):
        """``if cond:`` (non-zero is true); an ``else_()`` block may follow directly."""
        loc = caller_loc()
        c = self._expr(cond, "if condition", loc)
        frame = _Frame()
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()
        self._frames[-1].stmts.append(If(c, tuple(frame.stmts), ()))

    @contextlib.contextmanager
    def else_(self):
        """The else branch of the ``if_`` block just closed."""
        loc = caller_loc()
        stmts = self._frames[-1].stmts
        if not stmts or not isinstance(stmts[-1], If) or stmts[-1].orelse:
            self._fail("else_() must directly follow an if_() block", loc)
        frame = _Frame()
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()
        last = stmts[-1]
        stmts[-1] = If(last.cond, last.then, tuple(frame.stmts))

    # calls ------------------------------------------------------------------------------------
    def _register(self, f: IncoreFunction) -> None:
        if not isinstance(f, IncoreFunction):
            self._fail(f"only InCore functions can be called, got {type(f).__name__}")
        old = self._callees.get(f.name)
        if old is not None and old != f:
            self._fail(f"two different InCore functions are named `{f.name}`")
        self._callees[f.name] = f

    def _access(self, f: IncoreFunction) -> dict:
        key = id(f)
        if key not in self._access_cache:
            self._access_cache[key] = (f, param_access(f))
        return self._access_cache[key][1]

    def call(self, func, bindings: dict, dims: dict | None = None) -> None:
        """Submit one task: ``func`` with memref parameters bound to ``tensor`` (its origin) or
        ``(tensor, row, col)`` or ``(tensor, row, col, rows, cols)``, scalar parameters bound to
        expressions, and dims (in ``dims`` or ``bindings``) to expressions such as ``i.rows``."""
        loc = caller_loc()
        self._check_open()
        if isinstance(func, str):
            if func not in self._callees:
                known = ", ".join(sorted(self._callees)) or "none registered"
                self._fail(f"call to unknown function `{func}` (known: {known})", loc)
            f = self._callees[func]
        elif isinstance(func, IncoreFunction):
            self._register(func)
            f = func
        else:
            self._fail(f"call target must be an InCore function or its name, got {type(func).__name__}",
                       loc)
        if not isinstance(bindings, dict):
            self._fail(f"call to `{f.name}`: bindings must be a dict of parameter -> value", loc)
        what = f"call to `{f.name}`"
        access = self._access(f)
        dim_names = dict(f.dims)
        all_dims = dict(dims or {})
        for key, val in bindings.items():
            if key in dim_names:
                if key in all_dims:
                    self._fail(f"{what}: dim `{key}` is bound twice", loc)
                all_dims[key] = val
        dim_args = []
        for k, v in all_dims.items():
            if k not in dim_names:
                names = ", ".join(dim_names) or "none"
                self._fail(f"{what}: `{f.name}` has no dim `{k}` (its dims: {names})", loc)
            e = self._expr(v, f"{what}, dim `{k}`", loc)
            cv = const_value(e)
            if cv is not None and (not isinstance(cv, int) or cv <= 0):
                self._fail(f"{what}: dim `{k}` must be a positive integer, got {cv!r}", loc)
            dim_args.append((k, e))
        # dims known here (defaults and constant bindings) for checking region extents
        known_dims = {k: v for k, v in dim_names.items() if k not in all_dims}
        known_dims.update({k: const_value(e) for k, e in dim_args if const_value(e) is not None})
        args: list = []
        for key, val in bindings.items():
            if key in dim_names:
                continue
            p = f.param(key)
            if p is None:
                names = ", ".join([q.name for q in f.params] + list(dim_names))
                self._fail(f"{what}: `{f.name}` has no parameter `{key}` (its parameters: {names})", loc)
            if isinstance(p, MemRefParam):
                args.append((key, self._region(f, p, access[key], val, what, loc, known_dims)))
            else:
                if isinstance(val, (TensorRef, tuple, list)):
                    self._fail(f"{what}: scalar parameter `{key}` is bound to a "
                               f"{'tensor' if isinstance(val, TensorRef) else 'region'}", loc)
                args.append((key, self._expr(val, f"{what}, scalar `{key}`", loc)))
        missing = [p.name for p in f.params if p.name not in bindings]
        if missing:
            self._fail(f"{what}: missing binding for parameter{'s' if len(missing) > 1 else ''} "
                       f"{', '.join('`' + m + '`' for m in missing)}", loc)
        order = {p.name: i for i, p in enumerate(f.params)}
        args.sort(key=lambda kv: order[kv[0]])
        dim_args.sort(key=lambda kv: list(dim_names).index(kv[0]))
        c = Call(f.name, tuple(args), tuple(dim_args), loc=loc)
        self._check_adaptive(c, what, loc)
        self._frames[-1].stmts.append(c)

    def _region(self, f, p: MemRefParam, acc, val, what, loc, known_dims: dict) -> RegionBinding:
        if isinstance(val, (TensorRef, str)):
            val = (val, 0, 0)
        if not isinstance(val, (tuple, list)):
            self._fail(f"{what}: memref parameter `{p.name}` must be bound to a tensor or "
                       f"(tensor, row, col[, rows, cols]), got {type(val).__name__} {val!r}", loc)
        if len(val) not in (3, 5):
            self._fail(f"{what}: region for `{p.name}` must be (tensor, row, col) or "
                       f"(tensor, row, col, rows, cols); got {len(val)} items", loc)
        t = val[0]
        tname = t.name if isinstance(t, TensorRef) else t
        if not isinstance(tname, str) or tname not in self._tensors:
            if isinstance(tname, str) and tname in self._scope():
                self._fail(f"{what}: memref parameter `{p.name}` is bound to scalar `{tname}`", loc)
            self._fail(f"{what}: tensor `{tname}` for parameter `{p.name}` is not declared", loc)
        decl = self._tensors[tname]
        if decl.dtype != p.dtype:
            self._fail(f"{what}: parameter `{p.name}` is {p.dtype} but tensor `{tname}` is {decl.dtype}", loc)
        row = self._expr(val[1], f"{what}, `{p.name}` row offset", loc)
        col = self._expr(val[2], f"{what}, `{p.name}` col offset", loc)
        rows = cols = None
        if len(val) == 5:
            rows = self._expr(val[3], f"{what}, `{p.name}` rows", loc)
            cols = self._expr(val[4], f"{what}, `{p.name}` cols", loc)
            for lbl, mine, theirs in (("rows", rows, acc.rows), ("cols", cols, acc.cols)):
                mv = const_value(mine)
                tv = _eval_or_none(theirs, known_dims)
                if mv is not None and mv <= 0:
                    self._fail(f"{what}: `{p.name}` {lbl} must be positive, got {mv}", loc)
                if mv is not None and tv is not None and mv > tv:
                    self._fail(f"{what}: `{p.name}` {lbl} {mv} exceed the {tv} that `{f.name}` "
                               f"accesses in `{p.name}`", loc)
        if decl.role == "input" and acc.direction != "in":
            self._fail(f"{what}: `{f.name}` writes parameter `{p.name}` but tensor `{tname}` is an "
                       "input (declare it inout or temp)", loc)
        return RegionBinding(tname, row, col, rows, cols)

    def _check_adaptive(self, c: Call, what: str, loc) -> None:
        """Inside an adaptive loop, a call whose regions move with the loop variable must take
        the loop's tile height (``i.rows``) somewhere, or its tiles would not grow with the
        blocks binary expansion makes."""
        used: set[str] = set()
        for _, v in c.args:
            if isinstance(v, RegionBinding):
                for e in (v.row, v.col, v.rows, v.cols):
                    if e is not None:
                        used |= e.free_vars()
            else:
                used |= v.free_vars()
        for _, e in c.dims:
            used |= e.free_vars()
        for fr in self._frames:
            if fr.adaptive and fr.loop in used and f"{fr.loop}.rows" not in used:
                self._fail(f"{what} inside adaptive loop `{fr.loop}` moves with `{fr.loop}` but never "
                           f"uses its tile height `{fr.loop}.rows` (bind a dim or an extent to it)", loc)

    # build ------------------------------------------------------------------------------------
    def _check_open(self):
        if self._built:
            raise BuildError(f"`{self.name}` was already built; start a new Orchestration builder")

    def build(self) -> OrchFunction:
        """Validate and return the orchestration function (the builder is closed afterwards)."""
        self._check_open()
        if len(self._frames) != 1:
            self._fail("build() inside an open loop or if block")
        body = tuple(self._frames[0].stmts)
        if not any(True for _ in _calls(body)):
            self._fail("the orchestration function makes no calls")
        used = set()
        for c in _calls(body):
            for _, v in c.args:
                if isinstance(v, RegionBinding):
                    used.add(v.tensor)
        for t in self._tensors.values():
            if t.name not in used:
                self._fail(f"tensor `{t.name}` is declared but no call uses it")
        self._built = True
        self._fn = OrchFunction(self.name, tuple(self._scalars), tuple(self._tensors.values()), body,
                                loc=self._loc)
        return self._fn

    def module(self) -> Module:
        """Build (if not yet built) and return a Module with this entry and its callees."""
        fn = self._fn if self._built else self.build()
        return Module(tuple(self._callees.values()) + (fn,), fn.name)


def _calls(body):
    for s in body:
        if isinstance(s, Call):
            yield s
        elif isinstance(s, Loop):
            yield from _calls(s.body)
        elif isinstance(s, If):
            yield from _calls(s.then)
            yield from _calls(s.orelse)


def _eval_or_none(e: Expr, env: dict):
    if any(v not in env for v in e.free_vars()):
        return None
    return evaluate(e, env)


def check_loop_attrs(owner: str, name: str, step: Expr, max_range, min_range, tile_levels, loc=None):
    """Validate the binary-expansion attributes; return (tile_levels as a sorted tuple,
    max_range, min_range) with the defaults filled in, or (None, None, None)."""

    def fail(msg):
        where = f" ({loc})" if loc else ""
        raise BuildError(f"`{owner}`{where}: loop `{name}`: {msg}")

    def pow2(v):
        return isinstance(v, int) and not isinstance(v, bool) and v > 0 and (v & (v - 1)) == 0

    if tile_levels is None:
        if max_range is not None or min_range is not None:
            fail("max_range/min_range need tile_levels (the tile height per block size)")
        return None, None, None
    if not isinstance(tile_levels, dict) or not tile_levels:
        fail(f"tile_levels must be a dict {{block size: tile height}}, got {tile_levels!r}")
    for k, v in tile_levels.items():
        if not isinstance(k, int) or isinstance(k, bool) or not isinstance(v, int) or isinstance(v, bool):
            fail(f"tile_levels entries must be int: int, got {k!r}: {v!r}")
    if 0 not in tile_levels:
        fail("tile_levels needs key 0: the base (and residual) tile height")
    base = tile_levels[0]
    if base <= 0:
        fail(f"base tile height tile_levels[0] must be positive, got {base}")
    if const_value(step) != 1:
        fail(f"an adaptive loop counts base tiles and needs step 1, got `{step}`")
    for v, what in ((max_range, "max_range"), (min_range, "min_range")):
        if v is not None and not pow2(v):
            fail(f"{what} must be a positive power of two, got {v!r}")
    keys = sorted(k for k in tile_levels if k != 0)
    mx = max_range if max_range is not None else (keys[-1] if keys else 1)
    mn = min_range if min_range is not None else min(keys[0] if keys else 1, mx)
    if mn > mx:
        fail(f"min_range {mn} exceeds max_range {mx}")
    for p in keys:
        h = tile_levels[p]
        if not pow2(p):
            fail(f"tile_levels key {p} is not a power of two (keys are block sizes in base tiles)")
        if p < mn or p > mx:
            fail(f"tile_levels key {p} lies outside [min_range, max_range] = [{mn}, {mx}]")
        if h <= 0 or h % base:
            fail(f"tile height {h} for blocks of {p} is not a positive multiple of the base height {base}")
        if p % (h // base):
            fail(f"a block of {p} base tiles cannot be cut into tiles of {h} rows "
                 f"({h // base} base tiles each)")
    return tuple(sorted(tile_levels.items())), mx, mn


__all__ = ["Orchestration", "TensorRef", "check_loop_attrs"]
