"""The per-instruction half of the InCore verifier: the context a check runs in and a table of
per-op rules (:func:`check_instr`), which the InCore builder runs on each instruction as it is
added. Every message names the function, the instruction as the user wrote it and the operands
involved, e.g. "`softmax_tile`, add %s, %a, %b (softmax.py:12): tile `a` is 32x128 but `b` is
32x64". The whole-function checks: :mod:`pto.ir.verify_incore`.
"""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.dtypes import DType, dtype_of
from pto.ir.expr import Expr, is_int_expr
from pto.ir.facts import tile_shape
from pto.ir.nodes import IncoreFunction, Instr, MemRefParam, ScalarParam, Tile
from pto.ir.ops import (
    ATTRS,
    BINARY,
    CAST,
    COL_BROADCAST,
    COL_REDUCE,
    COLLECTIVE,
    FILL,
    MASK,
    MATMUL,
    MEMORY,
    ROW_BROADCAST,
    ROW_REDUCE,
    SCALAR_BINARY,
    SCALAR_LOAD,
    SIGNATURE,
    UNARY,
    Op,
)


def _fmt_instr(ins: Instr) -> str:
    ops = []
    if ins.dst is not None:
        ops.append(f"%{ins.dst}")
    for s in ins.srcs:
        ops.append(f"%{s}" if isinstance(s, str) else str(s))
    where = f" ({ins.loc})" if ins.loc else ""
    return f"{ins.op.value} {', '.join(ops)}{where}"


class IncoreCtx:
    """What the rules of one function look things up in: tiles, memrefs, scalars, dims."""

    def __init__(self, fn: IncoreFunction, dims: dict[str, int], loaded: set[str] | None = None):
        self.fn = fn
        self.dims = dims
        self.tiles = {t.name: t for t in fn.tiles}
        self.memrefs = {p.name: p for p in fn.params if isinstance(p, MemRefParam)}
        self.scalars = {p.name for p in fn.params if isinstance(p, ScalarParam)}
        # the scalars load_scalar defines (device data): ``fn``'s, or the builder's so far
        self.loaded = loaded_scalars(fn) if loaded is None else loaded

    def fail(self, ins: Instr | None, msg: str):
        head = f"`{self.fn.name}`"
        if ins is not None:
            head += f", {_fmt_instr(ins)}"
        raise BuildError(f"{head}: {msg}")

    def shape(self, name: str) -> tuple[int, int]:
        return tile_shape(self.tiles[name], self.dims)


def _fmt_shape(s: tuple[int, int]) -> str:
    return f"{s[0]}x{s[1]}"


def check_instr(ctx: IncoreCtx, ins: Instr, scope: set[str]) -> None:
    """Check one instruction: operand kinds, names in scope, attributes, shapes, dtypes."""
    sig, has_dst = SIGNATURE[ins.op]
    if has_dst != (ins.dst is not None):
        ctx.fail(ins, "this op " + ("writes a destination tile" if has_dst else "has no destination"))
    if len(ins.srcs) != len(sig):
        ctx.fail(ins, f"expects {len(sig)} operands after the destination, got {len(ins.srcs)}")
    if ins.dst is not None and ins.dst not in ctx.tiles and ins.op not in SCALAR_LOAD:
        what = "a memref parameter, not a tile" if ins.dst in ctx.memrefs else "not a declared tile"
        ctx.fail(ins, f"destination `{ins.dst}` is {what}")
    for kind, src in zip(sig, ins.srcs):
        if kind == "T":
            if not isinstance(src, str) or src not in ctx.tiles:
                desc = (f"`{src}` is a memref parameter" if src in ctx.memrefs
                        else f"`{src}` is not a declared tile")
                ctx.fail(ins, f"expected a tile operand; {desc}")
        elif kind == "M":
            if not isinstance(src, str) or src not in ctx.memrefs:
                desc = (f"`{src}` is a tile" if src in ctx.tiles
                        else f"`{src}` is not a memref parameter")
                ctx.fail(ins, f"expected a memref parameter; {desc}")
        else:
            if not isinstance(src, Expr):
                ctx.fail(ins, f"expected a scalar expression, got `{src}`")
            _check_expr(ctx, ins, src, scope, allow_attr=ins.op not in MEMORY | SCALAR_LOAD)
    allowed = ATTRS[ins.op]
    for k, _ in ins.attrs:
        if k not in allowed:
            names = ", ".join(allowed) or "none"
            ctx.fail(ins, f"unknown attribute `{k}` (this op takes: {names})")
    RULES[_rule_key(ins.op)](ctx, ins)


def _check_expr(ctx: IncoreCtx, ins: Instr, e: Expr, scope: set[str], allow_attr: bool) -> None:
    for name in e.free_vars():
        if "." in name:
            base, field = name.split(".", 1)
            if not allow_attr:
                ctx.fail(ins, f"`{name}` may not be used in load/store offsets (the region's "
                              "extent is derived from them)")
            if base not in ctx.memrefs or field not in ("rows", "cols"):
                ctx.fail(ins, f"`{name}` is not the rows/cols of a memref parameter")
            continue
        if name not in scope:
            ctx.fail(ins, f"scalar `{name}` is not declared (not a scalar parameter, dim, loop "
                          "variable or parallel axis in scope)")


def _rule_key(op: Op) -> str:
    for key, group in (("binary", BINARY), ("scalar", SCALAR_BINARY), ("unary", UNARY),
                       ("rowreduce", ROW_REDUCE), ("colreduce", COL_REDUCE),
                       ("rowbcast", ROW_BROADCAST), ("colbcast", COL_BROADCAST),
                       ("matmul", MATMUL), ("cast", CAST), ("fill", FILL), ("mask", MASK),
                       ("collective", COLLECTIVE), ("scalar_load", SCALAR_LOAD)):
        if op in group:
            return key
    return op.value


def _same(ctx: IncoreCtx, ins: Instr, names: list[str]) -> None:
    shapes = [(n, ctx.shape(n)) for n in names]
    n0, s0 = shapes[0]
    for n, s in shapes[1:]:
        if s != s0:
            ctx.fail(ins, f"tile `{n0}` is {_fmt_shape(s0)} but `{n}` is {_fmt_shape(s)}")


def _binary(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0], ins.srcs[1]])


def _scalar(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0]])


def _unary(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0]])


def _rowreduce(ctx, ins):
    r, _ = ctx.shape(ins.srcs[0])
    d = ctx.shape(ins.dst)
    if ins.op is Op.ROWTAKEMAX:
        _same(ctx, ins, list(ins.srcs))
    if d != (r, 1):
        ctx.fail(ins, f"a row reduction of `{ins.srcs[0]}` ({_fmt_shape(ctx.shape(ins.srcs[0]))}) "
                      f"needs a {r}x1 destination; `{ins.dst}` is {_fmt_shape(d)}")


def _colreduce(ctx, ins):
    _, c = ctx.shape(ins.srcs[0])
    d = ctx.shape(ins.dst)
    if d != (1, c):
        ctx.fail(ins, f"a column reduction of `{ins.srcs[0]}` ({_fmt_shape(ctx.shape(ins.srcs[0]))}) "
                      f"needs a 1x{c} destination; `{ins.dst}` is {_fmt_shape(d)}")


def _bcast(ctx, ins, row: bool):
    d = ctx.shape(ins.dst)
    vec = ins.srcs[-1]
    v = ctx.shape(vec)
    if len(ins.srcs) == 2:
        _same(ctx, ins, [ins.dst, ins.srcs[0]])
    want = (d[0], 1) if row else (1, d[1])
    if v != want:
        kind = "row" if row else "column"
        ctx.fail(ins, f"{kind} vector `{vec}` must be {_fmt_shape(want)} to broadcast over "
                      f"`{ins.dst}` ({_fmt_shape(d)}); it is {_fmt_shape(v)}")


def _matmul(ctx, ins):
    a, b = ins.srcs
    ta, tb = bool(ins.attr("ta")), bool(ins.attr("tb"))
    sa, sb, sd = ctx.shape(a), ctx.shape(b), ctx.shape(ins.dst)
    m, ka = (sa[1], sa[0]) if ta else sa
    kb, n = (sb[1], sb[0]) if tb else sb
    if ka != kb:
        ctx.fail(ins, f"inner dimensions differ: `{a}`{'ᵀ' if ta else ''} is {m}x{ka} and "
                      f"`{b}`{'ᵀ' if tb else ''} is {kb}x{n}")
    if sd != (m, n):
        ctx.fail(ins, f"destination `{ins.dst}` is {_fmt_shape(sd)} but the product is {m}x{n}")
    da, db = ctx.tiles[a].dtype, ctx.tiles[b].dtype
    if da != db:
        ctx.fail(ins, f"operands must share a dtype: `{a}` is {da}, `{b}` is {db} (cast one)")
    acc = ins.attr("acc")
    try:
        acc_dt = dtype_of(acc)
    except BuildError:
        ctx.fail(ins, f"unknown accumulation dtype {acc!r}")
    if acc_dt is DType.BF16:
        ctx.fail(ins, "bf16 accumulation is not supported; accumulate in f32 (or f16)")
    for flag in ("ta", "tb"):
        if not isinstance(ins.attr(flag), bool):
            ctx.fail(ins, f"attribute `{flag}` must be true or false")


def _cast(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0]])


def _fill(ctx, ins):
    v = ins.srcs[0]
    if v.free_vars():
        ctx.fail(ins, f"fill value `{v}` must be a constant")


def _mask(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0]])
    if not is_int_expr(ins.srcs[1]):
        ctx.fail(ins, f"mask bound `{ins.srcs[1]}` must be an integer expression")
    fill = ins.attr("fill")
    if not isinstance(fill, (int, float)):
        ctx.fail(ins, f"fill must be a number, got {fill!r}")


def _deinterleave(ctx, ins):
    (r, c), (sr, sc) = ctx.shape(ins.dst), ctx.shape(ins.srcs[0])
    if (sr, sc) != (r, 2 * c):
        ctx.fail(ins, f"every other column of `{ins.srcs[0]}` ({_fmt_shape((sr, sc))}) needs a "
                      f"{_fmt_shape((sr, sc // 2)) if sc % 2 == 0 else 'tile of half its (odd) width'} "
                      f"destination; `{ins.dst}` is {_fmt_shape((r, c))}")
    if ins.attr("part") not in (0, 1) or isinstance(ins.attr("part"), bool):
        ctx.fail(ins, f"attribute `part` must be 0 (even columns) or 1 (odd), not {ins.attr('part')!r}")


def _collective(ctx, ins):
    _same(ctx, ins, [ins.dst, ins.srcs[0]])
    acc = ins.attr("acc")
    src_dt = ctx.tiles[ins.srcs[0]].dtype
    try:
        acc_dt = dtype_of(acc)
    except BuildError:
        ctx.fail(ins, f"unknown accumulation dtype {acc!r}")
    if acc_dt not in (DType.F32, src_dt):
        ctx.fail(ins, f"the sum over ranks runs in f32 or in the source's dtype ({src_dt}), not {acc_dt}")


def _load(ctx, ins):
    mem, row, col = ins.srcs
    t = ctx.tiles[ins.dst]
    _check_access(ctx, ins, t, ctx.memrefs[mem], row, col)
    pad = ins.attr("pad")
    if not isinstance(pad, (int, float)):
        ctx.fail(ins, f"pad must be a number, got {pad!r}")
    step = ins.attr("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        ctx.fail(ins, f"step must be a positive integer (every step-th row), got {step!r}")


def _store(ctx, ins):
    tile, mem, row, col = ins.srcs
    _check_access(ctx, ins, ctx.tiles[tile], ctx.memrefs[mem], row, col)


def _store_add(ctx, ins):
    tile, mem, row, col = ins.srcs
    t, m = ctx.tiles[tile], ctx.memrefs[mem]
    if m.dtype is not DType.F32 or t.dtype is not DType.F32:
        ctx.fail(ins, f"store_add adds an f32 tile into an f32 memref (atomic adds, each rounded to f32); "
                      f"`{tile}` is {t.dtype} and `{mem}` is {m.dtype}")
    _check_access(ctx, ins, t, m, row, col)


def _load_scalar(ctx, ins):
    mem, row, col = ins.srcs
    m = ctx.memrefs[mem]
    if ins.dst in ctx.tiles or ins.dst in ctx.memrefs or ins.dst in ctx.scalars or ins.dst in ctx.dims:
        ctx.fail(ins, f"`{ins.dst}` is already declared; load_scalar defines a new scalar")
    if m.dtype is not DType.F32:
        ctx.fail(ins, f"load_scalar reads an f32 memref (integers exact below 2**24); `{mem}` is {m.dtype}")
    for what, e in (("row", row), ("col", col)):
        if not is_int_expr(e):
            ctx.fail(ins, f"{what} offset `{e}` must be an integer expression")


def _check_access(ctx, ins, tile: Tile, mem: MemRefParam, row: Expr, col: Expr):
    dynamic = sorted((row.free_vars() | col.free_vars()) & ctx.loaded)
    if dynamic and mem.shape is None:
        ctx.fail(ins, f"the offset uses `{dynamic[0]}`, a scalar loaded from memory: memref `{mem.name}` must "
                      "declare its shape (memref(..., shape=...)), the region a task may touch")
    if mem.dtype.is_quantized:
        _check_quantized_access(ctx, ins, tile, mem)
    elif tile.dtype != mem.dtype:
        verb = "load" if ins.op is Op.LOAD else ins.op.value
        ctx.fail(ins, f"{verb} between {mem.dtype} memref `{mem.name}` and {tile.dtype} tile "
                      f"`{tile.name}`; dtypes must match (use cast)")
    for what, e in (("row", row), ("col", col)):
        if not is_int_expr(e):
            ctx.fail(ins, f"{what} offset `{e}` must be an integer expression")


def _check_quantized_access(ctx, ins, tile: Tile, mem: MemRefParam):
    """A quantized memref holds weights: loads dequantize whole blocks of a row into a tile of a
    compute type; nothing stores into it. (That the column offset is a multiple of the block is
    the whole function's check: :func:`pto.ir.verify_incore.verify_incore`.)"""
    q = mem.dtype.quant
    if ins.op is not Op.LOAD:
        ctx.fail(ins, f"memref `{mem.name}` is {mem.dtype}, quantized weights: tasks load it, never store into it")
    if tile.dtype.is_quantized:
        ctx.fail(ins, f"tile `{tile.name}` is {tile.dtype}; a load from {mem.dtype} memref `{mem.name}` "
                      "dequantizes into a tile of f32, f16 or bf16")
    if ins.attr("step") != 1:
        ctx.fail(ins, f"a strided load of {mem.dtype} memref `{mem.name}`: its rows are read whole blocks at a time, "
                      "one row after another (step 1)")
    cols = ctx.shape(tile.name)[1]
    if cols % q.block:
        ctx.fail(ins, f"tile `{tile.name}` is {cols} columns wide: a load from {mem.dtype} memref `{mem.name}` reads "
                      f"whole blocks of {q.block} columns")


RULES = {
    "binary": _binary,
    "scalar": _scalar,
    "unary": _unary,
    "rowreduce": _rowreduce,
    "colreduce": _colreduce,
    "rowbcast": lambda c, i: _bcast(c, i, row=True),
    "colbcast": lambda c, i: _bcast(c, i, row=False),
    "matmul": _matmul,
    "cast": _cast,
    "fill": _fill,
    "mask": _mask,
    "collective": _collective,
    "deinterleave": _deinterleave,
    "load": _load,
    "store": _store,
    "store_add": _store_add,
    "scalar_load": _load_scalar,
}


def loaded_scalars(fn: IncoreFunction) -> set[str]:
    """The scalars ``fn``'s load_scalar instructions define (all at the top level)."""
    return {s.dst for s in fn.body if isinstance(s, Instr) and s.op in SCALAR_LOAD}
