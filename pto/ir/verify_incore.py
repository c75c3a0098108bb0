"""The verifier of InCore functions: the whole-function checks (names, scopes, uses, the
regions a function's accesses reach) on top of the per-op rules of :mod:`pto.ir.verify_instr`.

The InCore builder checks each instruction with :func:`check_instr` as it is added and the
whole function with :func:`verify_incore` in ``build()``; :func:`pto.ir.verify.verify_module`
runs the same on parsed or hand-made modules.
"""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.expr import Bin, Expr, Var, const_value, evaluate
from pto.ir.facts import loop_ranges, memref_accesses, tile_shape
from pto.ir.names import check_name
from pto.ir.nodes import ForRange, IncoreFunction
from pto.ir.ops import SCALAR_LOAD, Op
from pto.ir.verify_instr import IncoreCtx, check_instr


def verify_incore(fn: IncoreFunction, dims: dict[str, int] | None = None) -> None:
    """Check a whole InCore function under ``dims`` (the defaults where not given)."""
    d = {**dict(fn.dims), **(dims or {})}
    ctx = IncoreCtx(fn, d)
    names, base_scope = _check_declarations(ctx, fn, d)
    used = _check_body(ctx, fn, names, base_scope)
    _check_uses(ctx, fn, names, used)
    _check_region_bounds(ctx)
    _check_adds_alone(ctx)
    _check_block_offsets(ctx)


def _check_declarations(ctx: IncoreCtx, fn: IncoreFunction, d: dict[str, int]) -> tuple[dict[str, str], set[str]]:
    """Names declared once and well formed, tiles of positive shape, the parallel axis; returns
    the declared names (name -> kind) and the scope the body starts with."""
    check_name(fn.name, "InCore function", function=True)
    names: dict[str, str] = {}
    for kind, nm in ([("parameter", p.name) for p in fn.params] + [("tile", t.name) for t in fn.tiles]
                     + [("dim", k) for k, _ in fn.dims]):
        check_name(nm, kind, fn.name)
        if nm in names:
            ctx.fail(None, f"`{nm}` is declared twice (as {names[nm]} and as {kind})")
        names[nm] = kind
    for t in fn.tiles:
        r, c = tile_shape(t, d)
        if r <= 0 or c <= 0:
            ctx.fail(None, f"tile `{t.name}` has non-positive shape {r}x{c}")
        if t.dtype.is_quantized:
            ctx.fail(None, f"tile `{t.name}` is {t.dtype}, a quantized type of weights in memory; a tile is f32, f16 "
                           "or bf16 (a load from a quantized memref dequantizes into one)")
    base_scope = set(ctx.scalars) | set(d)
    if fn.parallel is not None:
        check_name(fn.parallel.var, "parallel axis", fn.name)
        if fn.parallel.var in names:
            ctx.fail(None, f"parallel axis `{fn.parallel.var}` reuses a declared name")
        for v in fn.parallel.extent.free_vars():
            if v not in base_scope:
                ctx.fail(None, f"parallel extent `{fn.parallel.extent}` uses undeclared `{v}`")
        base_scope.add(fn.parallel.var)
    return names, base_scope


def _check_body(ctx: IncoreCtx, fn: IncoreFunction, names: dict[str, str], base_scope: set[str]) -> set[str]:
    """Every loop and instruction of the body in its scope; returns the names the body uses.
    A load_scalar (top level only) adds its scalar to the top-level scope from there on."""
    used: set[str] = set()

    def visit(body, scope):
        for s in body:
            if isinstance(s, ForRange):
                for e in (s.lb, s.ub, s.step):
                    for v in e.free_vars():
                        if v not in scope:
                            ctx.fail(None, f"loop `{s.var}`: bound `{e}` uses undeclared `{v}`")
                        used.add(v)
                sv = const_value(s.step)
                if sv is not None and sv <= 0:
                    ctx.fail(None, f"loop `{s.var}`: step must be positive, got {sv}")
                check_name(s.var, "loop variable", fn.name)
                if s.var in scope or s.var in names:
                    ctx.fail(None, f"loop variable `{s.var}` shadows another name")
                visit(s.body, scope | {s.var})
            else:
                check_instr(ctx, s, scope)
                if s.op in SCALAR_LOAD:
                    if scope is not base_scope:
                        ctx.fail(s, "load_scalar must be at the function's top level, not inside a loop")
                    if s.dst in names or s.dst in scope:
                        ctx.fail(s, f"`{s.dst}` is already declared; load_scalar defines a new scalar")
                    scope.add(s.dst)  # in scope from here on (the top-level set is shared)
                for x in s.srcs:
                    if isinstance(x, str):
                        used.add(x)
                    else:
                        used.update(v.split(".")[0] for v in x.free_vars())
                if s.dst is not None:
                    used.add(s.dst)

    visit(fn.body, base_scope)
    return used


def _check_uses(ctx: IncoreCtx, fn: IncoreFunction, names: dict[str, str], used: set[str]) -> None:
    """Every declared name used, at least one memref, and every memref loaded or stored."""
    if fn.parallel is not None:
        used.update(fn.parallel.extent.free_vars())
    for t in fn.tiles:
        used.update(t.rows.free_vars() | t.cols.free_vars())
    for p in fn.memrefs:
        if p.shape is not None:
            used.update(p.shape[0].free_vars() | p.shape[1].free_vars())
    for nm, kind in names.items():
        if nm not in used:
            ctx.fail(None, f"{kind} `{nm}` is declared but never used")
    if not fn.memrefs:
        ctx.fail(None, "an InCore function needs at least one memref parameter")
    touched = {m for m, *_ in memref_accesses(fn)}
    for p in fn.memrefs:
        if p.name not in touched:
            ctx.fail(None, f"memref `{p.name}` is never loaded or stored")


def _check_region_bounds(ctx: IncoreCtx) -> None:
    """Loads and stores must start inside the region (tiles may overhang a declared shape's
    edge; the overhang is masked). Checked where the offsets' bounds are known numbers."""
    fn = ctx.fn
    ranges = loop_ranges(fn)
    env = dict(ctx.dims)
    for mem, ins, row, col, _tile in memref_accesses(fn):
        if (row.free_vars() | col.free_vars()) & ctx.loaded:
            continue  # device data: masked by the region's extent when the task runs
        p = ctx.memrefs[mem]
        for what, e, limit in (("row", row, p.shape[0] if p.shape else None),
                               ("col", col, p.shape[1] if p.shape else None)):
            lo, hi = bounds(e, ranges)
            lo_v = _try_eval(lo, env)
            if lo_v is not None and lo_v < 0:
                ctx.fail(ins, f"{what} offset `{e}` reaches {lo_v}, before the start of `{mem}`'s region")
            if limit is not None:
                hi_v, lim_v = _try_eval(hi, env), _try_eval(limit, env)
                if hi_v is not None and lim_v is not None and hi_v >= lim_v:
                    ctx.fail(ins, f"{what} offset `{e}` reaches {hi_v}, outside `{mem}`'s declared "
                                  f"region of {what}s [0, {lim_v})")


def _check_adds_alone(ctx: IncoreCtx) -> None:
    """A memref a function adds into (``store_add``) is not also loaded or stored there: one
    program's load of what another adds, or a store beside the adds, would give each backend
    another answer (the evaluator runs the programs in lock step, C one after another, a GPU at
    once)."""
    accesses = list(memref_accesses(ctx.fn))
    added = {mem for mem, ins, *_ in accesses if ins.op is Op.STORE_ADD}
    for mem, ins, *_ in accesses:
        if mem in added and ins.op is not Op.STORE_ADD:
            how = {Op.LOAD: "loaded", Op.STORE: "stored"}.get(ins.op, "read with load_scalar")
            ctx.fail(ins, f"memref `{mem}` is added into (store_add) and also {how} here: a function that "
                          "adds into a memref only adds into it (its programs' adds land in any order)")


def _check_block_offsets(ctx: IncoreCtx) -> None:
    """A load from a quantized memref starts at a multiple of its block: the column offset must
    be one for every value its loops and axis take (shown from the expression: constants and
    dims that are multiples, loops that start and step on multiples, sums and products of
    them), since a block is dequantized whole."""
    fn = ctx.fn
    loops: dict[str, ForRange] = {}

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                loops[s.var] = s
                visit(s.body)

    visit(fn.body)
    for mem, ins, _row, col, _tile in memref_accesses(fn):
        q = ctx.memrefs[mem].dtype.quant
        if q is not None and not _multiple_of(col, q.block, loops, ctx.dims):
            ctx.fail(ins, f"column offset `{col}` of {ctx.memrefs[mem].dtype} memref `{mem}` is not shown to be a "
                          f"multiple of its block of {q.block} columns (a load dequantizes whole blocks)")


def _multiple_of(e: Expr, m: int, loops: dict, dims: dict) -> bool:
    """Whether ``e`` is a multiple of ``m`` for every value of its variables (False where that
    cannot be shown)."""
    v = _try_eval(e, dims)
    if v is not None:
        return v % m == 0
    if isinstance(e, Var):
        s = loops.get(e.name)
        return s is not None and _multiple_of(s.lb, m, loops, dims) and _multiple_of(s.step, m, loops, dims)
    if isinstance(e, Bin) and e.op in ("+", "-"):
        return _multiple_of(e.a, m, loops, dims) and _multiple_of(e.b, m, loops, dims)
    if isinstance(e, Bin) and e.op == "*":
        return _multiple_of(e.a, m, loops, dims) or _multiple_of(e.b, m, loops, dims)
    return False


def _try_eval(e: Expr, env: dict):
    if any("." in v or v not in env for v in e.free_vars()):
        return None
    try:
        return evaluate(e, env)
    except (BuildError, ZeroDivisionError):
        return None


__all__ = ["verify_incore", "check_instr", "IncoreCtx"]
