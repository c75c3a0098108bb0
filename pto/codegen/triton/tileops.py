"""The tile instructions of a Triton InCore body: one method per op group and small per-op
format tables, mixed into :class:`pto.codegen.triton.body.BodyRenderer` (which holds the tiles'
shapes and dtypes, names scalar expressions and emits the lines).

Padding: a tile of logical shape ``r x c`` is held as a block of :func:`~.common.block_shape`
(each dim rounded up to a power of two). Its padding lanes hold unspecified values (loads fill
them with ``pad``; lane-wise ops compute on them like on any lane, so they may become inf or
NaN) and no logical lane ever reads one: loads and stores mask them always (under ``EVEN_<p>``
too), a reduction along a padded axis sees its neutral element there, and a matmul zeroes the
padding lanes of its contraction in both operands. Elementwise, broadcast (an ``R x 1`` vector's
padding rows meet the tile's padding rows), cast, fill and mask ops are lane-wise. Every mask is
``tl.where`` on the lane index, never a product (``0 * inf`` is NaN), and is emitted only where
a tile has a padded axis, so the kernels of power-of-two tiles are those without padding.
"""

from __future__ import annotations

import torch

from pto.codegen.triton import quant_groups
from pto.codegen.triton.common import (
    INT_DOT_BITS,
    MAX_NUMEL,
    QGEMV_INT_AUTO,
    TL_DTYPE,
    float_literal,
    reads_by_groups,
)
from pto.codegen.triton.quant import dot_name, helper_name, load_name
from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.dtypes import DType
from pto.ir.expr import Expr, const_value
from pto.ir.nodes import Instr, walk_instrs
from pto.ir.ops import (
    ARITH,
    BINARY,
    BROADCAST,
    CAST,
    COL_REDUCE,
    COLLECTIVE,
    LAYOUT,
    MASK,
    MATMUL,
    MEMORY,
    REDUCE_KIND,
    ROW_REDUCE,
    SCALAR_BINARY,
    SCALAR_LOAD,
    UNARY,
    Op,
)

# tile arithmetic on f32 operands (NaN-propagating max/min, as torch.maximum/minimum)
_ARITH_FMT = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{div}({a}, {b})",
    "max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    "min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
}

_UNARY_FMT = {
    Op.EXP: "tl.exp({x})",
    Op.EXP2: "tl.exp2({x})",
    Op.LOG: "tl.log({x})",
    Op.SQRT: "{sqrt}({x})",
    Op.RSQRT: "tl.math.rsqrt({x})",
    Op.RECIP: "{div}(1.0, {x})",
    Op.NEG: "-{x}",
    Op.ABS: "tl.abs({x})",
    Op.RELU: "tl.maximum({x}, 0.0, propagate_nan=tl.PropagateNan.ALL)",
    Op.SILU: "{div}({x}, 1.0 + tl.exp(-{x}))",  # torch's silu: x / (1 + exp(-x))
}

_REDUCE_FN = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min", "argmax": "tl.argmax"}
# what a padding lane holds for a reduction: its neutral element (+0.0 for sums, as torch's sum
# starts from +0.0: a row of -0.0 sums to +0.0 there too)
_NEUTRAL = {"sum": "0.0", "max": "_NEG_INF", "min": "_INF", "argmax": "_NEG_INF", "takemax": "_NEG_INF"}

_MASK_KEEP = {
    Op.MASK_CAUSAL: "tl.arange(0, {C})[None, :] <= tl.arange(0, {R})[:, None] + {k}",
    Op.MASK_COLS: "tl.arange(0, {C})[None, :] < {k}",
    Op.MASK_ROWS: "tl.arange(0, {R})[:, None] < {k}",
}


class TileOps:
    """The instruction renderers of :class:`~pto.codegen.triton.body.BodyRenderer` (a mixin:
    ``fn``, ``opts``, ``shapes`` (logical), ``blocks``, ``dtypes``, ``memrefs``, ``ranges``,
    ``div``, ``sqrt`` and the methods ``emit``, ``fresh``, ``expr``, ``scalar_f32``, ``f32``,
    ``use`` and ``assign`` are the renderer's)."""

    def instr(self, ins: Instr) -> None:
        op = ins.op
        for group, method in _DISPATCH:
            if op in group:
                method(self, ins)
                return
        raise BuildError(f"`{self.fn.variant_name}`: no Triton rule for `{op.value}`")  # pragma: no cover

    def int_dots(self, fmt) -> int:
        """The bits of x where the GEMVs read by groups take ``fmt``'s products as integer dots
        (``qgemv`` "int8", "int16", or "auto" for the formats measured so, and a format that allows them:
        :func:`pto.codegen.triton.quant_groups.int_dots_apply`), else 0."""
        bits = INT_DOT_BITS.get(self.opts.qgemv, 0)
        if self.opts.qgemv == "auto" and fmt.name not in QGEMV_INT_AUTO:
            return 0
        return bits if bits and quant_groups.int_dots_apply(fmt) else 0

    def half_dots(self, fmt) -> bool:
        """Do the GEMVs that read by groups take ``fmt``'s products as half dots (fp8 under
        ``qgemv`` "auto", "int8" or "int16": :func:`pto.codegen.triton.quant_groups.render_dot_half`)."""
        return self.opts.qgemv in INT_DOT_BITS and quant_groups.half_dots_apply(fmt)

    # padding -----------------------------------------------------------------------------------
    def lanes(self, tile: str, axis: int) -> str | None:
        """The mask of ``tile``'s logical lanes along ``axis`` (0 rows, 1 columns), broadcastable
        to its block; None where that axis has no padding."""
        n, b = self.shapes[tile][axis], self.blocks[tile][axis]
        if n == b:
            return None
        return f"(tl.arange(0, {b}){'[:, None]' if axis == 0 else '[None, :]'} < {n})"

    def valid(self, tile: str) -> str | None:
        """The mask of ``tile``'s logical lanes (None: a block without padding)."""
        masks = [m for m in (self.lanes(tile, 0), self.lanes(tile, 1)) if m is not None]
        return " & ".join(masks) or None

    # op groups ---------------------------------------------------------------------------------
    def _collective(self, ins: Instr) -> None:
        raise BuildError(f"`{self.fn.variant_name}`: `{ins.op.value}` is a collective (a sum over the ranks of "
                         "torch.distributed's process group); Triton kernels do not communicate: the triton "
                         "backend runs this function with the torch evaluator, the persistent executor not at all")

    def _binary(self, ins: Instr) -> None:
        a, b = ins.srcs
        self.assign(ins.dst, self.arith(ARITH[ins.op], self.f32(a), self.f32(b)))

    def _scalar(self, ins: Instr) -> None:
        a, s = ins.srcs
        self.assign(ins.dst, self.arith(ARITH[ins.op], self.f32(a), self.scalar_f32(s)))

    def arith(self, name: str, a: str, b: str) -> str:
        return _ARITH_FMT[name].format(a=a, b=b, div=self.div)

    def _unary(self, ins: Instr) -> None:
        x = self.f32(ins.srcs[0])
        self.assign(ins.dst, _UNARY_FMT[ins.op].format(x=x, div=self.div, sqrt=self.sqrt))

    def _reduce(self, ins: Instr) -> None:
        src = ins.srcs[0]
        row = ins.op in ROW_REDUCE
        axis = 1 if row else 0
        kind = REDUCE_KIND[ins.op]
        x = self.f32(src)
        mask = self.lanes(src, axis)
        if mask is not None:
            x = f"tl.where({mask}, {x}, {_NEUTRAL[kind]})"
        if kind == "takemax":  # b's element at a's row maximum (the first of equal ones)
            at = self.fresh("at")
            self.emit(f"{at} = tl.argmax({x}, axis=1, tie_break_left=True)")
            cols = f"tl.arange(0, {self.blocks[src][1]})[None, :]"
            pick = f"tl.where({cols} == {at}[:, None], {self.f32(ins.srcs[1])}, 0.0)"
            self.assign(ins.dst, f"tl.sum({pick}, axis=1)[:, None]")
            return
        if kind == "argmax":
            red = f"tl.argmax({x}, axis=1, tie_break_left=True).to(tl.float32)"
        else:
            red = f"{_REDUCE_FN[kind]}({x}, axis={axis})"
        self.assign(ins.dst, red + ("[:, None]" if row else "[None, :]"))

    def _load_scalar(self, ins: Instr) -> None:
        """The element's integer value (truncated: the memref holds exact integers)."""
        mem, row, col = ins.srcs
        name = f"s_{ins.dst}"
        # (an offset within the region: no int64 needed, the region's origin is already in P)
        self.emit(f"{name} = tl.load(P_{mem} + {self.expr(row)} * S_{mem} + {self.expr(col)}).to(tl.int32)")
        self.names[ins.dst] = name

    def _broadcast(self, ins: Instr) -> None:
        r, c = self.blocks[ins.dst]
        vec = self.f32(ins.srcs[-1])
        if ARITH[ins.op] == "copy":
            self.assign(ins.dst, f"tl.broadcast_to({vec}, ({r}, {c}))")
            return
        # Triton broadcasts the R x 1 / 1 x C vector itself
        self.assign(ins.dst, self.arith(ARITH[ins.op], self.f32(ins.srcs[0]), vec))

    def _matmul(self, ins: Instr) -> None:
        a, b = ins.srcs
        acc = str(ins.attr("acc"))
        accumulate = ins.op is Op.MATMUL_ACC
        if b in self.planes:  # a GEMV of a quantized tile's planes: the sums per unit or group, no values
            mem = next(i.srcs[0] for i in walk_instrs(self.fn.body) if i.dst == b)
            fmt = self.memrefs[mem].dtype.quant
            r, c = self.blocks[b]
            planes = ", ".join(self.planes[b])
            if b in self.grouped:  # (the memref's pointer and stride: pto.codegen.triton.quant_groups.render_dot)
                planes = f"{planes}, P_{mem}, S_{mem}"
            m = self.x_rows[b]  # (past one: a few rows of x, read by groups)
            name = quant_groups.dot_name(fmt, m > 1) if b in self.grouped else dot_name(fmt)
            xbits = self.int_dots(fmt) if b in self.grouped else 0
            if xbits:
                name = quant_groups.int_dot_name(fmt, xbits, m > 1)
            elif b in self.grouped and self.half_dots(fmt):
                name = quant_groups.half_dot_name(fmt, m > 1)
            x = self.operand(a, False, 1)
            dot = f"{name}({planes}, {x}, {r}, {c}, {m})" if m > 1 else f"{name}({planes}, {x}, {r}, {c})[None, :]"
            self.assign(ins.dst, f"{self.f32(ins.dst)} + {dot}")
            return
        self.use(a)
        self.use(b)
        if accumulate:
            self.use(ins.dst)
        # accumulate straight onto the f32 destination
        value = self.product(ins, fused=accumulate and acc == "f32")
        if acc == "f16":
            value = f"({value}).to(tl.float16)"
            if accumulate:
                d16 = f"t_{ins.dst}" if self.dtypes[ins.dst] is DType.F16 else f"t_{ins.dst}.to(tl.float16)"
                value = f"({d16}.to(tl.float32) + {value}.to(tl.float32)).to(tl.float16)"
            self.assign(ins.dst, value, DType.F16)
        else:
            self.assign(ins.dst, value)

    def product(self, ins: Instr, fused: bool) -> str:
        """The f32 product of a matmul's operands (plus the destination where ``fused``):
        ``tl.dot`` where every block dim reaches ``dot_min``, else an exact f32
        broadcast-multiply-sum."""
        a, b = ins.srcs
        ta, tb = bool(ins.attr("ta")), bool(ins.attr("tb"))
        m, k = self.blocks[a][::-1] if ta else self.blocks[a]
        n = self.blocks[b][0] if tb else self.blocks[b][1]
        dt = self.dtypes[a]
        opa, opb = self.operand(a, ta, 0 if ta else 1), self.operand(b, tb, 1 if tb else 0)
        if min(m, n, k) >= self.opts.dot_min:
            prec = f', input_precision="{self.opts.input_precision}"' if dt is DType.F32 else ""
            if fused:
                return f"tl.dot({opa}, {opb}, {self.f32(ins.dst)}{prec})"
            return f"tl.dot({opa}, {opb}{prec}, out_dtype=tl.float32)"
        if m * k * n > MAX_NUMEL:
            lm, lk = self.shapes[a][::-1] if ta else self.shapes[a]
            ln = self.shapes[b][0] if tb else self.shapes[b][1]
            raise BuildError(f"`{self.fn.variant_name}`: matmul into `{ins.dst}` is {lm}x{lk}x{ln}; "
                             f"below {self.opts.dot_min} in a dim it needs an {m * k * n}-element "
                             f"block (at most {MAX_NUMEL})")
        if tb and not ta:
            # b as it is stored (n x k): each output lane sums along the rows' contiguous axis,
            # with no transposed copy of b (a GEMV against a weight stored output-major)
            opb = self.operand(b, False, 1)
            if dt is not DType.F32:
                opa, opb = f"{opa}.to(tl.float32)", f"{opb}.to(tl.float32)"
            if m == 1:
                # one row: the products in b's own layout, the row broadcast over b's rows (a
                # tile's worth of b never changes layout: on sm_90 the 3-D form below moved the
                # weights of a GEMV through shared memory to multiply them)
                value = f"tl.sum({opb} * {opa}, axis=1)[None, :]"
            else:
                value = f"tl.sum({opa}[:, None, :] * {opb}[None, :, :], axis=2)"
            return f"{self.f32(ins.dst)} + {value}" if fused else value
        if dt is not DType.F32:
            opa, opb = f"{opa}.to(tl.float32)", f"{opb}.to(tl.float32)"
        # exact f32 products summed in f32, like the reference's f32 matmul
        value = f"tl.sum({opa}[:, :, None] * {opb}[None, :, :], axis=1)"
        return f"{self.f32(ins.dst)} + {value}" if fused else value

    def operand(self, tile: str, trans: bool, contraction: int) -> str:
        """A matmul operand: ``tile`` (transposed where ``trans``) with the padding lanes of its
        ``contraction`` axis zeroed, so that they add nothing to a logical lane's sum."""
        src = f"t_{tile}"
        mask = self.lanes(tile, contraction)
        if mask is not None:
            src = f"tl.where({mask}, {src}, 0.0)"
        return f"tl.trans({src})" if trans else src

    def _cast(self, ins: Instr) -> None:
        src = ins.srcs[0]
        self.use(src)
        self.assign(ins.dst, f"t_{src}", self.dtypes[src])

    def _full(self, ins: Instr) -> None:
        r, c = self.blocks[ins.dst]
        dt = self.dtypes[ins.dst]
        # the reference fills f32 and rounds to the tile's dtype
        v = float(torch.tensor(float(const_value(ins.srcs[0])), dtype=torch.float32).item())
        value = float_literal(v, dt, as_tensor=False)
        self.emit(f"t_{ins.dst} = tl.full(({r}, {c}), {value}, {TL_DTYPE[dt]})")
        self.defined.add(ins.dst)

    def _deinterleave(self, ins: Instr) -> None:
        """Every other column: the source block reshaped to (rows, columns / 2, 2) and split
        (a padded tile's block is a power of two, twice its half's)."""
        src = ins.srcs[0]
        (r, c2), (_, c) = self.blocks[src], self.blocks[ins.dst]
        if c2 != 2 * c:  # pragma: no cover - blocks are powers of two
            raise BuildError(f"`{self.fn.variant_name}`: deinterleave of a {r}x{c2} block into {c} columns")
        self.use(src)
        even, odd = self.fresh("ev"), self.fresh("od")
        self.emit(f"{even}, {odd} = tl.split(tl.reshape(t_{src}, ({r}, {c}, 2)))")
        self.assign(ins.dst, odd if int(ins.attr("part")) else even, self.dtypes[src])

    def _mask(self, ins: Instr) -> None:
        src, bound = ins.srcs
        r, c = self.blocks[ins.dst]
        keep = _MASK_KEEP[ins.op].format(R=r, C=c, k=self.expr(bound))
        fill = float_literal(float(ins.attr("fill")))
        self.assign(ins.dst, f"tl.where({keep}, {self.f32(src)}, {fill})")

    def _memory(self, ins: Instr) -> None:
        if ins.op is Op.LOAD and self.memrefs[ins.srcs[0]].dtype.is_quantized:
            self._load_quantized(ins)
            return
        if ins.op is Op.LOAD:
            mem, row, col = ins.srcs
            tile = ins.dst
        else:
            tile, mem, row, col = ins.srcs
            self.use(tile)
        r, c = self.blocks[tile]
        ri, ci, ptr = self.fresh("r"), self.fresh("c"), self.fresh("p")
        step = int(ins.attr("step")) if ins.op is Op.LOAD else 1
        self.emit(f"{ri} = {self.offset(row, r, True, step)}")
        self.emit(f"{ci} = {self.offset(col, c, False)}")
        self.emit(f"{ptr} = P_{mem} + {ri}.to(tl.int64) * S_{mem} + {ci}")
        conds = []
        for idx, e, lim in ((ri, row, f"m_{mem}_rows"), (ci, col, f"m_{mem}_cols")):
            if not self.nonnegative(e):
                conds.append(f"({idx} >= 0)")
            conds.append(f"({idx} < {lim})")
        # a padded tile's padding lanes lie outside the tile, maybe outside the tensor: masked
        # on the mask-free path too
        lanes = self.valid(tile)
        mask = " & ".join(conds if lanes is None else [lanes, *conds])
        even = "" if lanes is None else f", mask={lanes}"
        # a second load of a multiplied tile (pto/codegen/triton/operands.py): a cache modifier of
        # its own, so that Triton's CSE does not merge it back into the first; never a descriptor
        cg = ', cache_modifier=".cg"' if ins.op is Op.LOAD and tile in self.copies else ""
        if ins.op is Op.LOAD and mem in self.tma and not cg:  # the descriptor's coordinates: the whole tensor's
            self.emit(f"if TMA_{mem}:")
            self.emit(f"    t_{tile} = D_{mem}.load([(m_{mem}_r0 + {self.expr(row)}).to(tl.int32), "
                      f"(m_{mem}_c0 + {self.expr(col)}).to(tl.int32)])")
            self.emit(f"elif EVEN_{mem}:")
        else:
            self.emit(f"if EVEN_{mem}:")
        if ins.op is Op.LOAD:
            pad = float_literal(float(ins.attr("pad")), self.memrefs[mem].dtype)
            other = "" if lanes is None else f", other={pad}"
            self.emit(f"    t_{tile} = tl.load({ptr}{even}{other}{cg})")
            self.emit("else:")
            self.emit(f"    t_{tile} = tl.load({ptr}, mask={mask}, other={pad}{cg})")
            self.defined.add(tile)
        elif ins.op is Op.STORE_ADD:  # the adds of a task's programs in any order (f32 rounding)
            self.emit(f"    tl.atomic_add({ptr}, t_{tile}{even}, sem=\"relaxed\")")
            self.emit("else:")
            self.emit(f"    tl.atomic_add({ptr}, t_{tile}, mask={mask}, sem=\"relaxed\")")
        else:
            self.emit(f"    tl.store({ptr}, t_{tile}{even})")
            self.emit("else:")
            self.emit(f"    tl.store({ptr}, t_{tile}, mask={mask})")

    def _load_quantized(self, ins: Instr) -> None:
        """A tile of a quantized memref: the format's helper (:mod:`pto.codegen.triton.quant`)
        reads the tile's blocks and dequantizes them in registers; masks (and the pad) only
        where the tile overhangs its region or its block."""
        mem, row, col = ins.srcs
        tile = ins.dst
        fmt = self.memrefs[mem].dtype.quant
        self.quantized.add(fmt.name)
        (r, c), (lr, lc) = self.blocks[tile], self.shapes[tile]
        ri, c0, lim, rmask = self.fresh("r"), self.fresh("c"), self.fresh("lim"), self.fresh("rm")
        self.emit(f"{ri} = {self.offset(row, r, True)}")
        self.emit(f"{c0} = m_{mem}_c0 + {self.expr(col)}")
        # the valid elements: the region's columns, the tile's own (a padded block's lanes)
        self.emit(f"{lim} = tl.minimum(m_{mem}_c0 + m_{mem}_cols, {c0} + {lc})")
        rows = [f"({ri} < m_{mem}_rows)"] + ([] if self.nonnegative(row) else [f"({ri} >= 0)"])
        rows += [] if lr == r else [f"(tl.arange(0, {r})[:, None] < {lr})"]
        self.emit(f"{rmask} = {' & '.join(rows)}")
        grouped = tile in self.fused and reads_by_groups(self.opts.qgemv) and quant_groups.applies(fmt, lc, c)
        if grouped:  # read by groups (pto.codegen.triton.quant_groups): its own helpers
            self.grouped[tile] = (r, c)
            helper = quant_groups.load_name(fmt)
        else:
            helper = load_name(fmt)
        planes = [f"t_{tile}__{p.name}" for p in fmt.planes]
        load = f"{', '.join(planes)} = {helper}(P_{mem}, S_{mem}, {ri}, {c0}, {rmask}, {lim}, {r}, {c}, {{}})"
        self.emit(f"if EVEN_{mem}:")
        self.emit("    " + load.format((lr, lc) != (r, c)))
        self.emit("else:")
        self.emit("    " + load.format(True))
        if tile in self.fused:  # the product takes the planes (pto.ir.analysis.gemv_quantized_loads)
            self.planes[tile] = planes
            self.defined.add(tile)
            return
        value = f"{helper_name(fmt)}({', '.join(planes)}, {r}, {c})"
        pad = float_literal(float(ins.attr("pad")))
        masked = f"tl.where({rmask} & ({c0} + tl.arange(0, {c})[None, :] < {lim}), {value}, {pad})"
        self.emit(f"if EVEN_{mem}:")
        self.depth += 1
        self.assign(tile, value if (lr, lc) == (r, c) else masked)
        self.depth -= 1
        self.emit("else:")
        self.depth += 1
        self.assign(tile, masked)
        self.depth -= 1

    def offset(self, e: Expr, n: int, rows: bool, step: int = 1) -> str:
        idx = f"tl.arange(0, {n})" + ("[:, None]" if rows else "[None, :]") + (f" * {step}" if step > 1 else "")
        return idx if const_value(e) == 0 else f"{self.expr(e)} + {idx}"

    def nonnegative(self, e: Expr) -> bool:
        try:
            lo = const_value(bounds(e, self.ranges)[0])
        except BuildError:
            return False
        return lo is not None and lo >= 0


_DISPATCH = (
    (MEMORY, TileOps._memory),
    (SCALAR_LOAD, TileOps._load_scalar),
    (BINARY, TileOps._binary),
    (SCALAR_BINARY, TileOps._scalar),
    (UNARY, TileOps._unary),
    (ROW_REDUCE | COL_REDUCE, TileOps._reduce),
    (BROADCAST, TileOps._broadcast),
    (MATMUL, TileOps._matmul),
    (CAST, TileOps._cast),
    (frozenset({Op.FULL}), TileOps._full),
    (MASK, TileOps._mask),
    (LAYOUT, TileOps._deinterleave),
    (COLLECTIVE, TileOps._collective),
)
assert set().union(*(g for g, _ in _DISPATCH)) == set(Op)
