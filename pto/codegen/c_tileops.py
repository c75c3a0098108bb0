"""The tile instructions of an InCore function rendered to C: one method per op group and small
per-op format tables, mixed into :class:`pto.codegen.c_incore.KernelRenderer` (which holds the
tiles' shapes, dtypes and storage, renders scalar expressions and emits the lines).

A tile is an array of f32 values in the kernel's scratch (``t_<name>``, row-major, its columns
apart), each value rounded to the tile's dtype when it is written (``pto_r_bf16``,
``pto_r_f16`` of ``runtime_c/pto_tile.h``), so every op reads f32 and the numbers are the
evaluator's (:mod:`pto.evaluator.machine`): elementwise, unary, reduction, broadcast and mask
ops compute in f32 and round to the destination's dtype; matmul multiplies f32 values and
accumulates in f32, rounded to ``acc``; loads give ``pad`` outside the region's valid extent,
stores skip it. A tile that only ever holds what a load of an f32 input read and is used before
any store may instead point at the memory it was loaded from (a *view*, ``p_<name>``, rows
``ld_<name>`` apart) when the load lies inside its region: a matrix product then reads the
operands where they are, with no copy.

Memory is read and written through one conversion per storage dtype (:data:`LOAD`,
:data:`STORE`). A block-quantized memref (GGUF's Q4_0, Q8_0, ..., fp8: :mod:`pto.ir.quant`) is
rows of blocks: a load dequantizes whole blocks of each row through its format's helper
(:mod:`pto.codegen.c_quant`, the evaluator's routine: the same bits), and a GEMV's product of a
tile only it reads (:func:`pto.ir.analysis.gemv_quantized_loads`, up to
:data:`~pto.ir.analysis.DOT_ROWS` rows) takes each weight row as stored, dequantized into the dot
products of every row (``pto_dqdot_<format>``, ``pto_dqdots_<format>``), so the tile is never
made.
"""

from __future__ import annotations

import math

from pto.codegen.c_expr import strip_parens
from pto.codegen.c_quant import dot_name, dots_name, group_of, helper_name, unit_of
from pto.errors import BuildError
from pto.ir.analysis import DOT_ROWS
from pto.ir.dtypes import DType, dtype_of
from pto.ir.expr import const_value
from pto.ir.nodes import Instr
from pto.ir.ops import ARITH, BINARY, GROUPS, REDUCE_KIND, ROW_BROADCAST, ROW_REDUCE, Op

#: C type of an element in memory, per storage dtype
C_TYPE = {DType.F32: "float", DType.BF16: "uint16_t", DType.F16: "uint16_t"}
#: an element of memory as f32 (exact)
LOAD = {DType.F32: "{x}", DType.BF16: "pto_bf16_f32({x})", DType.F16: "pto_f16_f32({x})"}
#: an f32 value as an element of memory (rounded to nearest even)
STORE = {DType.F32: "{x}", DType.BF16: "pto_bf16_of({x})", DType.F16: "pto_f16_of({x})"}
#: an f32 value rounded to a tile's dtype
ROUND = {DType.F32: "{x}", DType.BF16: "pto_r_bf16({x})", DType.F16: "pto_r_f16({x})"}

ARITH_FMT = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "max": "pto_maxf({a}, {b})",
    "min": "pto_minf({a}, {b})",
}

UNARY_FMT = {
    Op.EXP: "pto_expf({x})",
    Op.EXP2: "pto_exp2f({x})",
    Op.LOG: "pto_logf({x})",
    Op.SQRT: "sqrtf({x})",
    Op.RSQRT: "pto_rsqrtf({x})",
    Op.RECIP: "1.0f / {x}",
    Op.NEG: "-{x}",
    Op.ABS: "fabsf({x})",
    Op.RELU: "pto_reluf({x})",
    Op.SILU: "pto_siluf({x})",
}

ROW_REDUCE_FN = {"sum": "pto_row_sum", "max": "pto_row_max", "min": "pto_row_min"}
#: a column reduction: the first row, then each further row folded in
COL_FOLD = {"sum": "{a} + {b}", "max": "pto_maxf({b}, {a})", "min": "pto_minf({b}, {a})"}

MASK_KEEP = {
    Op.MASK_CAUSAL: "j <= i + {k}",
    Op.MASK_COLS: "j < {k}",
    Op.MASK_ROWS: "i < {k}",
}


def c_float(v: float) -> str:
    """An f32 value as an exact C literal."""
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    if v == 0.0:
        return "-0.0f" if math.copysign(1.0, v) < 0 else "0.0f"
    return f"{v.hex()}f"


def rounded(v: float, dtype: DType, via_f32: bool = True) -> float:
    """``v`` as torch holds it in ``dtype`` (through f32 first where ``via_f32``: the evaluator
    fills f32 and rounds to the tile's dtype)."""
    import torch

    t = torch.tensor(float(v), dtype=torch.float32 if via_f32 else dtype.torch)
    return float(t.to(dtype.torch).float().item())


class CTileOps:
    """The instruction renderers of :class:`~pto.codegen.c_incore.KernelRenderer` (a mixin:
    ``fn``, ``shapes``, ``dtypes``, ``memrefs``, ``views`` and the methods ``emit``, ``expr``,
    ``scalar_f32``, ``src``, ``at``, ``lanewise``, ``open_loop``, ``close`` and ``temp`` are
    the renderer's)."""

    def instr(self, ins: Instr) -> None:
        _DISPATCH[ins.op](self, ins)

    def assign_round(self, dst: str, value: str) -> str:
        return ROUND[self.dtypes[dst]].format(x=value)

    # lane-wise op groups -------------------------------------------------------------------
    def _elementwise(self, ins: Instr) -> None:
        """tile (op) tile, or tile (op) scalar"""
        a, b = ins.srcs
        if ins.op in BINARY:
            self.lanewise(ins.dst, ARITH_FMT[ARITH[ins.op]], {"a": (a, "full"), "b": (b, "full")})
        else:
            self.lanewise(ins.dst, ARITH_FMT[ARITH[ins.op]].replace("{b}", self.scalar_f32(b)), {"a": (a, "full")})

    def _unary(self, ins: Instr) -> None:
        self.lanewise(ins.dst, UNARY_FMT[ins.op], {"x": (ins.srcs[0], "full")})

    def _broadcast(self, ins: Instr) -> None:
        how = "row" if ins.op in ROW_BROADCAST else "col"
        if ARITH[ins.op] == "copy":
            self.lanewise(ins.dst, "{v}", {"v": (ins.srcs[0], how)})
            return
        self.lanewise(ins.dst, ARITH_FMT[ARITH[ins.op]].replace("{b}", "{v}"),
                      {"a": (ins.srcs[0], "full"), "v": (ins.srcs[1], how)})

    def _cast(self, ins: Instr) -> None:
        self.lanewise(ins.dst, "{x}", {"x": (ins.srcs[0], "full")})

    def _mask(self, ins: Instr) -> None:
        src, bound = ins.srcs
        keep = MASK_KEEP[ins.op].format(k=self.expr(bound))
        fill = c_float(rounded(float(ins.attr("fill")), DType.F32))
        self.lanewise(ins.dst, f"({keep}) ? {{x}} : {fill}", {"x": (src, "full")}, flat=False)

    def _full(self, ins: Instr) -> None:
        v = const_value(ins.srcs[0])
        value = c_float(rounded(float(v), self.dtypes[ins.dst]))
        self.lanewise(ins.dst, value, {})

    def _deinterleave(self, ins: Instr) -> None:
        part = int(ins.attr("part"))
        ptr, ld = self.src(ins.srcs[0])
        self.lanewise(ins.dst, f"{ptr}[i * {ld} + 2 * j + {part}]", {}, flat=False)

    # reductions ------------------------------------------------------------------------------
    def _reduce(self, ins: Instr) -> None:
        src, dst = ins.srcs[0], ins.dst
        r, c = self.shapes[src]
        ptr, ld = self.src(src)
        kind = REDUCE_KIND[ins.op]
        if ins.op in ROW_REDUCE:
            if kind in ROW_REDUCE_FN:
                value = f"{ROW_REDUCE_FN[kind]}({ptr} + i * {ld}, {c})"
            elif kind == "argmax":
                value = f"(float)pto_row_argmax({ptr} + i * {ld}, {c})"
            else:  # takemax: b's element at a's row maximum (the first of equal ones)
                bptr, bld = self.src(ins.srcs[1])
                value = f"{bptr}[i * {bld} + pto_row_argmax({ptr} + i * {ld}, {c})]"
            self.open_loop("i", r)
            self.emit(f"t_{dst}[i] = {self.assign_round(dst, value)};")
            self.close()
            return
        # a column reduction folds the rows in order into a row of f32 partials
        acc = self.temp(c)
        self.open_loop("j", c)
        self.emit(f"{acc}[j] = {ptr}[j];")
        self.close()
        self.open_loop("i", r, start=1)
        self.open_loop("j", c)
        self.emit(f"{acc}[j] = {COL_FOLD[kind].format(a=f'{acc}[j]', b=f'{ptr}[i * {ld} + j]')};")
        self.close()
        self.close()
        self.open_loop("j", c)
        self.emit(f"t_{dst}[j] = {self.assign_round(dst, f'{acc}[j]')};")
        self.close()

    # matrix products -------------------------------------------------------------------------
    def _matmul(self, ins: Instr) -> None:
        a, b = ins.srcs
        if b in self.fused:
            self.gemv_quantized(ins)
            return
        dst, acc = ins.dst, dtype_of(ins.attr("acc"))
        ta, tb = bool(ins.attr("ta")), bool(ins.attr("tb"))
        m, k = self.shapes[a][::-1] if ta else self.shapes[a]
        n = self.shapes[b][0] if tb else self.shapes[b][1]
        pa, la = self.src(a)
        pb, lb = self.src(b)
        sa = ("1", la) if ta else (la, "1")
        sb = ("1", lb) if tb else (lb, "1")
        accumulate = ins.op is Op.MATMUL_ACC
        direct = acc is DType.F32 and self.dtypes[dst] is DType.F32 and dst not in (a, b)
        out = f"t_{dst}" if direct else self.temp(m * n)
        if not (direct and accumulate):
            self.open_loop("e", m * n)
            self.emit(f"{out}[e] = 0.0f;")
            self.close()
        room = (k * n if m > DOT_ROWS else m * k if ta else 0) if tb else 0  # pto_matmul's pack
        pack = self.pack(room) if room else "NULL"
        self.emit(f"pto_matmul({m}, {n}, {k}, {pa}, {sa[0]}, {sa[1]}, {pb}, {sb[0]}, {sb[1]}, {out}, {n}, {pack});")
        if direct:
            return
        # the product rounded to acc, added to the destination in acc (torch: dst.to(acc) + prod)
        prod = ROUND[acc].format(x=f"{out}[e]")
        if accumulate:
            prod = ROUND[acc].format(x=f"{ROUND[acc].format(x=f't_{dst}[e]')} + {prod}")
        self.open_loop("e", m * n)
        self.emit(f"t_{dst}[e] = {self.assign_round(dst, prod)};")
        self.close()

    # memory ----------------------------------------------------------------------------------
    def _memory(self, ins: Instr) -> None:
        if ins.op is Op.LOAD:
            self.load(ins)
        else:
            self.store(ins)

    def load(self, ins: Instr) -> None:
        mem, row, col = ins.srcs
        tile = ins.dst
        if self.memrefs[mem].dtype.is_quantized:
            self.load_quantized(ins)
            return
        r, c = self.shapes[tile]
        step = int(ins.attr("step"))
        mdt = self.memrefs[mem].dtype
        ro, co = self.expr(row), self.expr(col)
        span = (r - 1) * step + 1
        inside = f"{ro} >= 0 && {ro} + {span} <= m_{mem}_rows && {co} >= 0 && {co} + {c} <= m_{mem}_cols"
        value = LOAD[mdt].format(x=f"P_{mem}[(i * {step} + {ro}) * S_{mem} + j + {co}]")
        if tile in self.views:
            # inside: the tile is the memory; else the masked copy below, read from the tile
            self.emit(f"if ({inside}) {{")
            self.emit(f"    p_{tile} = P_{mem} + ({ro}) * S_{mem} + ({co});")
            self.emit(f"    ld_{tile} = S_{mem};")
            self.emit("} else {")
            self.depth += 1
            self.emit(f"p_{tile} = t_{tile};")
            self.emit(f"ld_{tile} = {c};")
        else:
            self.emit(f"if ({inside}) {{")
            self.depth += 1
            self.lanewise(tile, value, {}, flat=False)
            self.depth -= 1
            self.emit("} else {")
            self.depth += 1
        # the pad outside the region's valid extent: its columns [jl_, jh_) of the tile, once
        pad = self.assign_round(tile, c_float(rounded(float(ins.attr("pad")), mdt, via_f32=False)))
        self.columns_inside(mem, co, c)
        self.open_loop("i", r)
        self.emit(f"const int64_t row_ = i * {step} + {ro};")
        self.emit(f"const int64_t jl = row_ >= 0 && row_ < m_{mem}_rows ? jl_ : {c}, jh = jl < {c} ? jh_ : {c};")
        self.emit(f"for (int64_t j = 0; j < jl; j++) t_{tile}[i * {c} + j] = {pad};")
        got = self.assign_round(tile, LOAD[mdt].format(x=f"P_{mem}[row_ * S_{mem} + j + {co}]"))
        self.emit(f"for (int64_t j = jl; j < jh; j++) t_{tile}[i * {c} + j] = {got};")
        self.emit(f"for (int64_t j = jh; j < {c}; j++) t_{tile}[i * {c} + j] = {pad};")
        self.close()
        self.depth -= 1
        self.emit("}")

    def block_start(self, mem: str, co: str, name: str) -> None:
        """``name``: the tensor column where a load of quantized ``mem`` at column offset ``co``
        starts; a start inside a block fails the task (PTO_ERR_REGION: the verifier shows the
        offsets multiples of the block, a region's own column is the orchestration's)."""
        block = self.memrefs[mem].dtype.quant.block
        self.emit(f"const int64_t {name} = m_{mem}_c0 + ({co});")
        self.emit(f"if ({name} % {block} != 0) return PTO_ERR_REGION;")

    def dequantize_row(self, mem: str, row: str, c0: str, out: str) -> None:
        """The blocks of row ``row`` of quantized ``mem`` covering columns ``[jl, jh)`` of a tile
        starting at tensor column ``c0`` (a block's first), dequantized to ``out`` (the tile's row)."""
        fmt = self.memrefs[mem].dtype.quant
        b = fmt.block
        self.emit(f"const int64_t jb = jl - jl % {b};")
        self.emit(f"if (jl < jh) {helper_name(fmt)}(P_{mem} + ({row}) * S_{mem}, nb_{mem}, ({c0} + jb) / {b}, "
                  f"(jh - jb + {b - 1}) / {b}, {out} + jb);")

    def load_quantized(self, ins: Instr) -> None:
        """A tile of quantized weights (the module docstring): each row's blocks under the
        region's valid columns dequantized, then the pad around them; a GEMV's operand
        (``fused``) only notes where it lies."""
        mem, row, col = ins.srcs
        tile = ins.dst
        r, c = self.shapes[tile]
        ro, co = self.expr(row), self.expr(col)
        if tile in self.fused:
            self.emit(f"const int64_t qr_{tile} = {strip_parens(ro)}, qo_{tile} = {strip_parens(co)};")
            self.fused_at[tile] = (mem, f"qr_{tile}", f"qo_{tile}")
            return
        self.emit("{")
        self.depth += 1
        self.block_start(mem, co, "c0_")
        pad = self.assign_round(tile, c_float(rounded(float(ins.attr("pad")), DType.F32)))
        self.columns_inside(mem, co, c)
        self.open_loop("i", r)
        self.emit(f"const int64_t row_ = i + {ro};")
        self.emit(f"const int64_t jl = row_ >= 0 && row_ < m_{mem}_rows ? jl_ : {c}, jh = jl < {c} ? jh_ : {c};")
        self.dequantize_row(mem, "row_", "c0_", f"t_{tile} + i * {c}")
        if self.dtypes[tile] is not DType.F32:
            self.emit(f"for (int64_t j = jl; j < jh; j++) t_{tile}[i * {c} + j] = "
                      f"{self.assign_round(tile, f't_{tile}[i * {c} + j]')};")
        self.emit(f"for (int64_t j = 0; j < jl; j++) t_{tile}[i * {c} + j] = {pad};")
        self.emit(f"for (int64_t j = jh; j < {c}; j++) t_{tile}[i * {c} + j] = {pad};")
        self.close()
        self.depth -= 1
        self.emit("}")

    def gemv_quantized(self, ins: Instr) -> None:
        """``dst += a @ w^T`` for a quantized tile ``w`` as stored (few rows of ``a``: each weight
        row dequantized into one dot product per row of ``a``, its values computed once for a
        block of rows). A weight row outside its region is the pad, 0: it adds nothing; one
        partly outside is dequantized into the temporary row, the pad put around it."""
        a, w = ins.srcs
        dst = ins.dst
        mem, ro, co = self.fused_at[w]
        fmt = self.memrefs[mem].dtype.quant
        m, k = self.shapes[a]
        n = self.shapes[w][0]
        pa, la = self.src(a)
        tmp = self.temp(k)
        xp = self.pack(m * k)  # the rows of a in the dot's order
        self.emit("{")
        self.depth += 1
        self.block_start(mem, co, "c0_")
        self.columns_inside(mem, co, k)
        self.open_loop("i", m)
        self.emit(f"pto_dq_prep({pa} + i * {la}, {k}, {group_of(fmt)}, {unit_of(fmt)}, {xp} + i * {k});")
        self.close()
        self.open_loop("j", n)
        self.emit(f"const int64_t row_ = j + {ro};")
        self.emit(f"if (row_ < 0 || row_ >= m_{mem}_rows) continue;")
        self.emit(f"if (jl_ == 0 && jh_ == {k}) {{")
        self.depth += 1
        blocks = f"P_{mem} + row_ * S_{mem}, nb_{mem}, c0_ / {fmt.block}, {k // fmt.block}"
        if m == 1:
            self.emit(f"t_{dst}[j] += {dot_name(fmt)}({blocks}, {xp});")
        else:  # the weight row's values computed once for every row of a (a few at a time)
            self.emit(f"{dots_name(fmt)}({blocks}, {xp}, {k}, {m}, t_{dst} + j, {n});")
        self.depth -= 1
        self.emit("} else {")
        self.depth += 1
        self.emit("const int64_t jl = jl_, jh = jh_;")
        self.dequantize_row(mem, "row_", "c0_", tmp)
        self.emit(f"for (int64_t jj = 0; jj < jl; jj++) {tmp}[jj] = 0.0f;")
        self.emit(f"for (int64_t jj = jh; jj < {k}; jj++) {tmp}[jj] = 0.0f;")
        self.open_loop("i", m)
        self.emit(f"t_{dst}[i * {n} + j] += pto_dot({k}, {pa} + i * {la}, {tmp});")
        self.close()
        self.depth -= 1
        self.emit("}")
        self.close()
        self.depth -= 1
        self.emit("}")

    def columns_inside(self, mem: str, co: str, c: int) -> None:
        """``jl_``, ``jh_``: the columns of a tile ``c`` wide at column offset ``co`` that lie in
        ``mem``'s region (an empty range where none do)."""
        self.emit(f"const int64_t jl_ = pto_min(pto_max(-({co}), 0), {c}), "
                  f"jh_ = pto_max(pto_min(m_{mem}_cols - ({co}), {c}), jl_);")

    def store(self, ins: Instr) -> None:
        tile, mem, row, col = ins.srcs
        r, c = self.shapes[tile]
        ptr, ld = self.src(tile)
        mdt = self.memrefs[mem].dtype
        ro, co = self.expr(row), self.expr(col)
        value = STORE[mdt].format(x=f"{ptr}[i * {ld} + j]")
        assign = "+=" if ins.op is Op.STORE_ADD else "="  # a task's items run one after another
        self.emit(f"if ({ro} >= 0 && {ro} + {r} <= m_{mem}_rows && {co} >= 0 && {co} + {c} <= m_{mem}_cols) {{")
        self.depth += 1
        self.open_loop("i", r)
        self.open_loop("j", c)
        self.emit(f"P_{mem}[(i + {ro}) * S_{mem} + j + {co}] {assign} {value};")
        self.close()
        self.close()
        self.depth -= 1
        self.emit("} else {")
        self.depth += 1
        self.columns_inside(mem, co, c)
        self.open_loop("i", r)
        self.emit(f"const int64_t row_ = i + {ro};")
        self.emit(f"if (row_ < 0 || row_ >= m_{mem}_rows) continue;")
        self.emit(f"for (int64_t j = jl_; j < jh_; j++) P_{mem}[row_ * S_{mem} + j + {co}] {assign} {value};")
        self.close()
        self.depth -= 1
        self.emit("}")

    def _load_scalar(self, ins: Instr) -> None:
        """The element's integer value, truncated (the memref holds exact integers); the flat
        index is clamped into the tensor, as the evaluator's."""
        mem, row, col = ins.srcs
        mdt = self.memrefs[mem].dtype
        name = self.scalar_name(ins.dst)
        flat = f"pto_clamp_flat(&m[{self.mem_index[mem]}], {self.expr(row)}, {self.expr(col)})"
        self.emit(f"{name} = pto_f32_int64({LOAD[mdt].format(x=f'P_{mem}[{flat}]')});")

    def _collective(self, ins: Instr) -> None:
        raise BuildError(f"`{self.fn.variant_name}`: `{ins.op.value}` is a collective (a sum over the ranks of "
                         "torch.distributed's process group); compiled C does not communicate: the c backend runs "
                         "this function with the torch evaluator")


#: the method of each op group of :data:`pto.ir.ops.GROUPS` (tinygrad's renderer: one rule per group)
_RULES = {
    "memory": CTileOps._memory, "scalar_load": CTileOps._load_scalar, "elementwise": CTileOps._elementwise,
    "unary": CTileOps._unary, "reduce": CTileOps._reduce, "broadcast": CTileOps._broadcast,
    "matmul": CTileOps._matmul, "cast": CTileOps._cast, "fill": CTileOps._full, "mask": CTileOps._mask,
    "layout": CTileOps._deinterleave, "collective": CTileOps._collective,
}
_DISPATCH = {op: _RULES[group] for group, ops in GROUPS.items() for op in ops}
assert set(_DISPATCH) == set(Op) and set(_RULES) == set(GROUPS)
