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

This layer turns Python arguments into IR (expression text is parsed, tensors and tuples become
region bindings) and checks what only Python can get wrong; every rule about the program itself
is a rule of the orchestration verifier (:mod:`pto.ir.verify_orch`), applied to each statement
as it is added and to the whole function in ``build()``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from pto.builder.common import caller_loc, check_name, expr_of
from pto.errors import BuildError
from pto.ir.dtypes import dtype_of
from pto.ir.expr import Expr, ExprLike, Var
from pto.ir.loop_attrs import check_loop_attrs
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
from pto.ir.verify_orch import (
    ROLES,
    OrchCtx,
    check_binding_names,
    check_call,
    check_if,
    check_let,
    check_loop,
    check_loop_body,
    check_scalar,
    check_tensor,
    resolve_callee,
    verify_orch,
)


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


class Orchestration:
    """Builder of one orchestration function."""

    def __init__(self, name: str, functions: list[IncoreFunction] | tuple = ()):
        self.name = check_name(name, "orchestration function", function=True)
        self._loc = caller_loc()
        self._callees: dict[str, IncoreFunction] = {}
        self._ctx = OrchCtx(self.name, self._callees)
        self._bodies: list[list] = [[]]  # the statements of each open block
        for f in functions:
            self._register(f)
        self._built = False

    def _fail(self, msg: str, loc: str | None = None):
        self._ctx.fail(msg, loc)

    # declarations -----------------------------------------------------------------------------
    def scalar(self, name: str) -> Var:
        """An integer parameter of the program (a sequence length, a batch size)."""
        self._check_open()
        if len(self._bodies) != 1 or self._bodies[0]:
            self._fail(f"declare scalar parameter `{name}` before any statement")
        check_scalar(self._ctx, name)
        return Var(name)

    def tensor(self, name: str, rows: ExprLike, cols: ExprLike, dtype, role: str = "input") -> TensorRef:
        """A whole 2-D tensor; ``role`` is input, output, inout or temp."""
        self._check_open()
        if role not in ROLES:
            self._fail(f"tensor `{name}`: role must be one of {', '.join(ROLES)}, got {role!r}")
        check_name(name, "tensor", self.name)
        d = TensorDecl(name, self._expr(rows, f"tensor `{name}` rows"), self._expr(cols, f"tensor `{name}` cols"),
                       dtype_of(dtype), role)
        check_tensor(self._ctx, d)
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
    def _expr(self, x, what: str, loc: str | None = None) -> Expr:
        """A Python argument as an expression (text is parsed); the verifier's rules check what
        it may use."""
        if isinstance(x, TensorRef):
            self._fail(f"{what}: expected a scalar expression, got tensor `{x.name}`", loc)
        try:
            return expr_of(x)
        except BuildError as err:
            self._fail(f"{what}: {err}", loc)

    def let(self, name: str, value: ExprLike) -> Var:
        """Bind a scalar name to an expression (immutable; one binding per name)."""
        loc = caller_loc()
        self._check_open()
        s = Let(name, self._expr(value, f"let `{name}`", loc))
        check_let(self._ctx, s, loc)
        self._bodies[-1].append(s)
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

        Binary expansion merges iterations only when it proves them independent and each merged
        call's regions to be its base calls' regions laid end to end (a tile of the loop at
        ``i * base`` plus a part that does not move, extent ``i.rows`` or
        ``min(i.rows, END - i * base)``); it refuses what it cannot prove, before any work. With
        ``reassociate=True`` the author promises that regions every iteration touches alike (the
        state of a reduction, scratch) may be merged as well: one call over the merged tiles
        equals the calls it replaces up to floating-point re-association (an online softmax
        over kv tiles)."""
        loc = caller_loc()
        self._check_open()
        lb_ = self._expr(lb, f"loop `{name}` lower bound", loc)
        ub_ = self._expr(ub, f"loop `{name}` upper bound", loc)
        st_ = self._expr(step, f"loop `{name}` step", loc)
        # the attributes as the user gave them, defaults filled in; check_loop checks the result
        levels, mx, mn = check_loop_attrs(self.name, name, st_, max_range, min_range, tile_levels, loc)
        header = Loop(name, lb_, ub_, st_, (), mx, mn, levels, reassociate)
        check_loop(self._ctx, header, loc)
        self._bodies.append([])
        try:
            yield Var(name)
        finally:
            body = self._bodies.pop()
            self._ctx.close()
        loop = replace(header, body=tuple(body))
        check_loop_body(self._ctx, loop, loc)
        self._bodies[-1].append(loop)

    @contextlib.contextmanager
    def if_(self, cond: ExprLike):
        """``if cond:`` (non-zero is true); an ``else_()`` block may follow directly."""
        loc = caller_loc()
        self._check_open()
        s = If(self._expr(cond, "if condition", loc), ())
        check_if(self._ctx, s, loc)
        self._bodies.append([])
        self._ctx.open()
        try:
            yield
        finally:
            then = self._bodies.pop()
            self._ctx.close()
        self._bodies[-1].append(replace(s, then=tuple(then)))

    @contextlib.contextmanager
    def else_(self):
        """The else branch of the ``if_`` block just closed."""
        loc = caller_loc()
        stmts = self._bodies[-1]
        if not stmts or not isinstance(stmts[-1], If) or stmts[-1].orelse:
            self._fail("else_() must directly follow an if_() block", loc)
        self._bodies.append([])
        self._ctx.open()
        try:
            yield
        finally:
            orelse = self._bodies.pop()
            self._ctx.close()
        stmts[-1] = replace(stmts[-1], orelse=tuple(orelse))

    # calls ------------------------------------------------------------------------------------
    def _register(self, f: IncoreFunction) -> None:
        if not isinstance(f, IncoreFunction):
            self._fail(f"only InCore functions can be called, got {type(f).__name__}")
        old = self._callees.get(f.name)
        if old is not None and old != f:
            self._fail(f"two different InCore functions are named `{f.name}`")
        self._callees[f.name] = f

    def call(self, func, bindings: dict, dims: dict | None = None) -> None:
        """Submit one task: ``func`` with memref parameters bound to ``tensor`` (its origin) or
        ``(tensor, row, col)`` or ``(tensor, row, col, rows, cols)``, scalar parameters bound to
        expressions, and dims (in ``dims`` or ``bindings``) to expressions such as ``i.rows``."""
        loc = caller_loc()
        self._check_open()
        if isinstance(func, str):
            f = resolve_callee(self._ctx, func, loc)
        elif isinstance(func, IncoreFunction):
            self._register(func)
            f = func
        else:
            self._fail(f"call target must be an InCore function or its name, got {type(func).__name__}",
                       loc)
        what = f"call to `{f.name}`"
        if not isinstance(bindings, dict):
            self._fail(f"{what}: bindings must be a dict of parameter -> value", loc)
        dim_names = [k for k, _ in f.dims]
        all_dims = dict(dims or {})
        for key, val in bindings.items():
            if key in dim_names:
                if key in all_dims:
                    self._fail(f"{what}: dim `{key}` is bound twice", loc)
                all_dims[key] = val
        dim_args = [(k, self._expr(v, f"{what}, dim `{k}`", loc)) for k, v in all_dims.items()]
        check_binding_names(self._ctx, f, [k for k in bindings if k not in dim_names], loc)
        args = []
        for key, val in bindings.items():
            p = f.param(key)
            if p is None:
                continue  # a dim
            if isinstance(p, MemRefParam):
                args.append((key, self._region(p, val, what, loc)))
            else:
                if isinstance(val, (TensorRef, tuple, list)):
                    self._fail(f"{what}: scalar parameter `{key}` is bound to a "
                               f"{'tensor' if isinstance(val, TensorRef) else 'region'}", loc)
                args.append((key, self._expr(val, f"{what}, scalar `{key}`", loc)))
        order = {p.name: i for i, p in enumerate(f.params)}
        args.sort(key=lambda kv: order[kv[0]])
        dim_args.sort(key=lambda kv: dim_names.index(kv[0]) if kv[0] in dim_names else len(dim_names))
        c = Call(f.name, tuple(args), tuple(dim_args), loc=loc)
        check_call(self._ctx, c)
        self._bodies[-1].append(c)

    def _region(self, p: MemRefParam, val, what: str, loc) -> RegionBinding:
        """A memref binding as a region: ``tensor``, ``(tensor, row, col)`` or ``(tensor, row,
        col, rows, cols)``, the tensor a TensorRef or its name."""
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
        if not isinstance(tname, str):
            self._fail(f"{what}: region for `{p.name}` must start with a tensor, got {type(t).__name__} {t!r}",
                       loc)
        parts = [self._expr(x, f"{what}, `{p.name}` {lbl}", loc)
                 for x, lbl in zip(val[1:], ("row offset", "col offset", "rows", "cols"))]
        return RegionBinding(tname, *parts)

    # build ------------------------------------------------------------------------------------
    def _check_open(self):
        if self._built:
            raise BuildError(f"`{self.name}` was already built; start a new Orchestration builder")

    def build(self) -> OrchFunction:
        """Verify the whole function (:func:`pto.ir.verify_orch.verify_orch`) and return it
        (the builder is closed afterwards)."""
        self._check_open()
        if len(self._bodies) != 1:
            self._fail("build() inside an open loop or if block")
        fn = OrchFunction(self.name, tuple(self._ctx.scalars), tuple(self._ctx.tensors.values()),
                          tuple(self._bodies[0]), loc=self._loc)
        verify_orch(fn, self._callees)
        self._built = True
        self._fn = fn
        return fn

    def module(self) -> Module:
        """Build (if not yet built) and return a Module with this entry and its callees."""
        fn = self._fn if self._built else self.build()
        return Module(tuple(self._callees.values()) + (fn,), fn.name)


__all__ = ["Orchestration", "TensorRef"]
