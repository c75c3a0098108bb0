"""The verifier of orchestration functions: one rule per statement kind plus whole-function
checks, over an :class:`OrchFunction` and the InCore functions it calls.

The rules keep their state in an :class:`OrchCtx` (the declarations and the blocks open at the
statement: which names are in scope, which loops are adaptive). The Orchestration builder keeps
one while it builds and checks each statement with its rule as it is added, so an error points
at the user's line; ``build()`` then runs :func:`verify_orch` on the whole function, and
:func:`pto.ir.verify.verify_module` runs it on parsed or hand-made modules. Messages name the
function, the call site (``loc``) where one is known, and what the user wrote: "`prog`
(prog.py:12): call to `copy_tile`: `copy_tile` writes parameter `y` but tensor `x` is an input
(declare it inout or temp)".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from pto.errors import BuildError
from pto.ir.analysis import param_access
from pto.ir.dtypes import DType
from pto.ir.expr import Expr, const_value, evaluate, is_int_expr
from pto.ir.loop_attrs import check_loop_attrs
from pto.ir.names import check_name
from pto.ir.nodes import (
    Call,
    Function,
    If,
    IncoreFunction,
    Let,
    Loop,
    MemRefParam,
    Module,
    OrchFunction,
    RegionBinding,
    TensorDecl,
    walk_calls,
)

ROLES = ("input", "output", "inout", "temp")


class _Block:
    """A block of statements: the names it declares and the loop that opened it (if any)."""

    __slots__ = ("names", "loop", "adaptive")

    def __init__(self, loop: str | None = None, adaptive: bool = False):
        self.names: set[str] = set()
        self.loop = loop
        self.adaptive = adaptive


class OrchCtx:
    """What the rules of one orchestration function look up and record: its scalars and
    tensors, the blocks open at the current statement, and its callees (``callees`` maps a
    name to a function: a Module or a dict)."""

    def __init__(self, name: str, callees: Module | Mapping[str, Function]):
        self.name = name
        self.scalars: list[str] = []
        self.tensors: dict[str, TensorDecl] = {}
        self.blocks: list[_Block] = [_Block()]
        self._callees = callees
        self._access: dict[str, tuple[IncoreFunction, dict]] = {}

    def fail(self, msg: str, loc: str | None = None) -> NoReturn:
        where = f" ({loc})" if loc else ""
        raise BuildError(f"`{self.name}`{where}: {msg}")

    def names(self) -> set[str]:
        """Every name a new declaration would collide with."""
        out = set(self.scalars) | set(self.tensors)
        for b in self.blocks:
            out |= b.names
        return out

    def scope(self) -> set[str]:
        """What an expression may use here: scalars, lets, loop variables, ``i.rows`` of the
        adaptive loops around."""
        out = set(self.scalars)
        for b in self.blocks:
            out |= b.names
            if b.adaptive:
                out.add(f"{b.loop}.rows")
        return out

    def open(self, loop: str | None = None, adaptive: bool = False) -> None:
        self.blocks.append(_Block(loop, adaptive))

    def close(self) -> None:
        self.blocks.pop()

    def callee(self, name: str) -> Function | None:
        return self._callees.get(name)

    def known_callees(self) -> list[str]:
        fns = self._callees.functions if isinstance(self._callees, Module) else self._callees.values()
        return sorted(f.name for f in fns if isinstance(f, IncoreFunction))

    def access(self, f: IncoreFunction) -> dict:
        """The callee's parameter directions and extents (derived once per function)."""
        hit = self._access.get(f.name)
        if hit is None or hit[0] is not f:
            hit = self._access[f.name] = (f, param_access(f))
        return hit[1]


# declarations ----------------------------------------------------------------------------------

def declare(ctx: OrchCtx, name: str, what: str, loc: str | None = None) -> str:
    """A new name must be valid (:mod:`pto.ir.names`) and not collide with one in scope."""
    check_name(name, what, ctx.name)
    if name in ctx.names():
        ctx.fail(f"`{name}` is already declared", loc)
    return name


def check_scalar(ctx: OrchCtx, name: str) -> None:
    """A scalar parameter of the function."""
    declare(ctx, name, "scalar parameter")
    ctx.scalars.append(name)


def check_tensor(ctx: OrchCtx, t: TensorDecl) -> None:
    """A tensor: a known role and dtype, a shape of scalar parameters only."""
    if t.role not in ROLES:
        ctx.fail(f"tensor `{t.name}`: role must be one of {', '.join(ROLES)}, got {t.role!r}")
    declare(ctx, t.name, "tensor")
    if not isinstance(t.dtype, DType):
        ctx.fail(f"tensor `{t.name}`: {t.dtype!r} is not a dtype")
    if t.dtype.is_quantized and t.role != "input":
        ctx.fail(f"tensor `{t.name}` is {t.dtype}, quantized weights: an input (no task writes one), not {t.role}")
    for e in (t.rows, t.cols):
        for v in e.free_vars():
            if v not in ctx.scalars:
                ctx.fail(f"tensor `{t.name}` shape uses `{v}`, which is not a scalar parameter")
        if not is_int_expr(e):
            ctx.fail(f"tensor `{t.name}`: shape `{e}` is not an integer expression")
    ctx.tensors[t.name] = t


# expressions -----------------------------------------------------------------------------------

def check_expr(ctx: OrchCtx, e: Expr, what: str, loc: str | None = None) -> Expr:
    """An expression may use only the scalars, lets and loop variables in scope, ``i.rows``
    only inside adaptive loop ``i``, and integers only."""
    if not isinstance(e, Expr):
        ctx.fail(f"{what}: expected a scalar expression, got {type(e).__name__} {e!r}", loc)
    scope = ctx.scope()
    for v in sorted(e.free_vars()):
        if v in scope:
            continue
        if v.endswith(".rows"):
            ctx.fail(f"{what}: `{v}` is only defined inside the adaptive loop `{v[:-5]}` (one with "
                     "tile_levels)", loc)
        if "." in v:
            ctx.fail(f"{what}: `{v}` means nothing in an orchestration function (only `i.rows` of an "
                     "adaptive loop `i`)", loc)
        if v in ctx.tensors:
            ctx.fail(f"{what}: `{v}` is a tensor, not a scalar", loc)
        ctx.fail(f"{what}: scalar `{v}` is not declared", loc)
    if not is_int_expr(e):
        ctx.fail(f"{what}: `{e}` is not an integer expression", loc)
    return e


# statements ------------------------------------------------------------------------------------

def check_let(ctx: OrchCtx, s: Let, loc: str | None = None) -> None:
    check_expr(ctx, s.value, f"let `{s.name}`", loc)
    declare(ctx, s.name, "scalar", loc)
    ctx.blocks[-1].names.add(s.name)


def check_loop(ctx: OrchCtx, s: Loop, loc: str | None = None) -> None:
    """A loop's header (bounds, step, binary-expansion attributes); opens its block, which the
    caller closes after the body."""
    if not isinstance(s.reassociate, bool):
        ctx.fail(f"loop `{s.var}`: reassociate must be True or False, got {s.reassociate!r}", loc)
    if s.reassociate and s.tile_levels is None:
        ctx.fail(f"loop `{s.var}`: reassociate=True needs tile_levels (only adaptive loops merge "
                 "iterations)", loc)
    check_expr(ctx, s.lb, f"loop `{s.var}` lower bound", loc)
    check_expr(ctx, s.ub, f"loop `{s.var}` upper bound", loc)
    check_expr(ctx, s.step, f"loop `{s.var}` step", loc)
    sv = const_value(s.step)
    if sv is not None and (not isinstance(sv, int) or sv <= 0):
        ctx.fail(f"loop `{s.var}`: step must be a positive integer, got {sv!r}", loc)
    levels = None
    if s.tile_levels is not None:
        pairs = s.tile_levels
        if not isinstance(pairs, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            ctx.fail(f"loop `{s.var}`: tile_levels must be pairs (block size, tile height), got {pairs!r}", loc)
        levels = dict(pairs)
        if len(levels) != len(pairs):
            ctx.fail(f"loop `{s.var}`: tile_levels gives a block size twice", loc)
        if s.max_range is None or s.min_range is None:
            ctx.fail(f"loop `{s.var}`: an adaptive loop needs max_range and min_range", loc)
    check_loop_attrs(ctx.name, s.var, s.step, s.max_range, s.min_range, levels, loc)
    declare(ctx, s.var, "loop variable", loc)
    ctx.open(s.var, s.adaptive)
    ctx.blocks[-1].names.add(s.var)


def check_loop_body(ctx: OrchCtx, s: Loop, loc: str | None = None) -> None:
    if not s.body:
        ctx.fail(f"loop `{s.var}` has an empty body", loc)


def check_if(ctx: OrchCtx, s: If, loc: str | None = None) -> None:
    check_expr(ctx, s.cond, "if condition", loc)


def resolve_callee(ctx: OrchCtx, name: str, loc: str | None = None) -> IncoreFunction:
    """The InCore function a call names."""
    f = ctx.callee(name)
    if f is None:
        known = ", ".join(ctx.known_callees()) or "none registered"
        ctx.fail(f"call to unknown function `{name}` (known: {known})", loc)
    if not isinstance(f, IncoreFunction):
        ctx.fail(f"call to `{name}`: `{name}` is an orchestration function; only InCore functions "
                 "can be called", loc)
    return f


def check_binding_names(ctx: OrchCtx, f: IncoreFunction, names, loc: str | None = None) -> None:
    """Every name a call binds is a parameter or a dim of the callee."""
    dims = [k for k, _ in f.dims]
    for key in names:
        if f.param(key) is None and key not in dims:
            known = ", ".join([p.name for p in f.params] + dims)
            ctx.fail(f"call to `{f.name}`: `{f.name}` has no parameter `{key}` (its parameters: {known})", loc)


def check_call(ctx: OrchCtx, c: Call) -> None:
    """A call: an InCore callee of the module, every parameter bound once with the right kind,
    dims that exist and are positive, regions of declared tensors of the parameter's dtype,
    extents positive and no wider than the callee accesses, no write to an input, and inside an
    adaptive loop it moves with, a use of the loop's tile height."""
    loc = c.loc
    f = resolve_callee(ctx, c.func, loc)
    what = f"call to `{f.name}`"
    dim_names = dict(f.dims)
    seen: set[str] = set()
    for k, e in c.dims:
        if k not in dim_names:
            names = ", ".join(dim_names) or "none"
            ctx.fail(f"{what}: `{f.name}` has no dim `{k}` (its dims: {names})", loc)
        if k in seen:
            ctx.fail(f"{what}: dim `{k}` is bound twice", loc)
        seen.add(k)
        check_expr(ctx, e, f"{what}, dim `{k}`", loc)
        cv = const_value(e)
        if cv is not None and cv <= 0:
            ctx.fail(f"{what}: dim `{k}` must be a positive integer, got {cv!r}", loc)
    # dims known here (defaults and constant bindings), for checking region extents
    known_dims = {k: v for k, v in dim_names.items() if k not in seen}
    known_dims.update({k: const_value(e) for k, e in c.dims if const_value(e) is not None})
    check_binding_names(ctx, f, [k for k, _ in c.args], loc)
    bound: set[str] = set()
    for key, v in c.args:
        if key in bound:
            ctx.fail(f"{what}: parameter `{key}` is bound twice", loc)
        bound.add(key)
        p = f.param(key)
        if isinstance(p, MemRefParam):
            if not isinstance(v, RegionBinding):
                ctx.fail(f"{what}: memref parameter `{key}` is bound to the scalar `{v}`, not a region", loc)
            _check_region(ctx, f, p, v, what, loc, known_dims)
        else:
            if isinstance(v, RegionBinding):
                ctx.fail(f"{what}: scalar parameter `{key}` is bound to a region of tensor `{v.tensor}`", loc)
            check_expr(ctx, v, f"{what}, scalar `{key}`", loc)
    missing = [p.name for p in f.params if p.name not in bound]
    if missing:
        ctx.fail(f"{what}: missing binding for parameter{'s' if len(missing) > 1 else ''} "
                 f"{', '.join('`' + m + '`' for m in missing)}", loc)
    _check_adaptive(ctx, c, what, loc)


def _check_region(ctx: OrchCtx, f: IncoreFunction, p: MemRefParam, v: RegionBinding, what: str,
                  loc: str | None, known_dims: dict) -> None:
    decl = ctx.tensors.get(v.tensor)
    if decl is None:
        if v.tensor in ctx.scope():
            ctx.fail(f"{what}: memref parameter `{p.name}` is bound to scalar `{v.tensor}`", loc)
        ctx.fail(f"{what}: tensor `{v.tensor}` for parameter `{p.name}` is not declared", loc)
    if decl.dtype != p.dtype:
        ctx.fail(f"{what}: parameter `{p.name}` is {p.dtype} but tensor `{v.tensor}` is {decl.dtype}", loc)
    check_expr(ctx, v.row, f"{what}, `{p.name}` row offset", loc)
    check_expr(ctx, v.col, f"{what}, `{p.name}` col offset", loc)
    acc = ctx.access(f).get(p.name)
    if acc is None:
        ctx.fail(f"{what}: `{f.name}` never loads or stores parameter `{p.name}`", loc)
    if (v.rows is None) != (v.cols is None):
        ctx.fail(f"{what}: region for `{p.name}` gives {'rows' if v.cols is None else 'cols'} without "
                 f"{'cols' if v.cols is None else 'rows'}", loc)
    if v.rows is not None:
        for lbl, mine, theirs in (("rows", v.rows, acc.rows), ("cols", v.cols, acc.cols)):
            check_expr(ctx, mine, f"{what}, `{p.name}` {lbl}", loc)
            mv = const_value(mine)
            tv = _eval_or_none(theirs, known_dims)
            if mv is not None and mv <= 0:
                ctx.fail(f"{what}: `{p.name}` {lbl} must be positive, got {mv}", loc)
            if mv is not None and tv is not None and mv > tv:
                ctx.fail(f"{what}: `{p.name}` {lbl} {mv} exceed the {tv} that `{f.name}` accesses in "
                         f"`{p.name}`", loc)
    if decl.role == "input" and acc.direction != "in":
        ctx.fail(f"{what}: `{f.name}` writes parameter `{p.name}` but tensor `{v.tensor}` is an input "
                 "(declare it inout or temp)", loc)


def _check_adaptive(ctx: OrchCtx, c: Call, what: str, loc: str | None) -> None:
    """Inside an adaptive loop, a call whose regions move with the loop variable must take the
    loop's tile height (``i.rows``) somewhere, or its tiles would not grow with the blocks
    binary expansion makes."""
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
    for b in ctx.blocks:
        if b.adaptive and b.loop in used and f"{b.loop}.rows" not in used:
            ctx.fail(f"{what} inside adaptive loop `{b.loop}` moves with `{b.loop}` but never uses its "
                     f"tile height `{b.loop}.rows` (bind a dim or an extent to it)", loc)


def check_end(ctx: OrchCtx, body: tuple) -> None:
    """The whole function: at least one call, and every tensor used by one."""
    calls = walk_calls(body)
    if not calls:
        ctx.fail("the orchestration function makes no calls")
    used = {v.tensor for c in calls for _, v in c.args if isinstance(v, RegionBinding)}
    for t in ctx.tensors.values():
        if t.name not in used:
            ctx.fail(f"tensor `{t.name}` is declared but no call uses it")


def _eval_or_none(e: Expr, env: dict):
    if any(v not in env for v in e.free_vars()):
        return None
    return evaluate(e, env)


# the whole function ----------------------------------------------------------------------------

def _loop(ctx: OrchCtx, s: Loop) -> None:
    check_loop(ctx, s)
    _body(ctx, s.body)
    ctx.close()
    check_loop_body(ctx, s)


def _if(ctx: OrchCtx, s: If) -> None:
    check_if(ctx, s)
    for branch in (s.then, s.orelse):
        ctx.open()
        _body(ctx, branch)
        ctx.close()


# statement kind -> its rule
RULES = {Let: check_let, Loop: _loop, If: _if, Call: check_call}


def _body(ctx: OrchCtx, body) -> None:
    for s in body:
        rule = RULES.get(type(s))
        if rule is None:
            ctx.fail(f"{type(s).__name__} is not an orchestration statement")
        rule(ctx, s)


def verify_orch(fn: OrchFunction, callees: Module | Mapping[str, Function]) -> None:
    """Check a whole orchestration function; ``callees`` (its module, or a dict) gives the
    functions its calls name."""
    check_name(fn.name, "orchestration function", function=True)
    ctx = OrchCtx(fn.name, callees)
    for s in fn.scalars:
        check_scalar(ctx, s)
    for t in fn.tensors:
        check_tensor(ctx, t)
    _body(ctx, fn.body)
    check_end(ctx, fn.body)


__all__ = ["verify_orch", "OrchCtx", "RULES", "ROLES", "declare", "check_scalar",
           "check_tensor", "check_expr", "check_let", "check_loop", "check_loop_body", "check_if", "check_call",
           "check_binding_names", "resolve_callee", "check_end"]
