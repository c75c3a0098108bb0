"""C of a quantized format's reads: one ``static`` function per format (``pto_dq_<format>``)
rendered by running the format's one dequantization routine
(:attr:`pto.ir.quant.QuantFormat.dequantize`, the routine the torch evaluator and the Triton
renderer run) on symbolic values that stand for C expressions.

``pto_dq_<format>(row, nb, b0, n, out)`` writes the f32 values of blocks ``b0 .. b0 + n - 1`` of
one quantized row (``row``: its first byte, ``nb``: its blocks; the layout of
:mod:`pto.ir.quant`: header planes, then each block plane, a pair of scale planes interleaved)
to ``out``, ``n * block`` floats.
Within a block it walks *groups* (the smallest run of elements that share every scale, e.g. 32
for Q4_K's sub-blocks): the scales of a group are read once, then every element of it is the
routine over its element planes' fields. The fields are read in *units* (``U`` elements whose
packed fields are whole bytes of every element plane: 2 for 4-bit values, 8 where a plane packs
1-bit ones, 1 for bytes), so each lane's shift and mask are constants and the compiler
vectorizes the loop over the units. Every product of a routine is exact in f32 (the
:mod:`pto.ir.quant` docstring), so the values are the evaluator's, bit for bit, with or without
contracted multiply-adds.

``pto_dqdot_<format>(row, nb, b0, n, xp)`` is a GEMV's dot product of those blocks with an f32
vector, without a tile of the values: each weight is the routine's value (the same bits as the
tile's), multiplied into an accumulator per lane, the accumulators summed at the end (the f32
products of a dot product of the tile, summed in another order). The vector comes prepared once
per GEMV (``pto_dq_prep`` of ``pto_tile.h``: each group's elements lane-major, so that a lane's
elements are contiguous), so a format of one element plane of whole bytes per unit (Q4_0, Q4_1,
Q8_0, Q4_K) runs on the machine's vectors: a vector of units' bytes widened once, each lane's
fields a constant shift and mask, converted, the routine run on the vector (its scales
broadcast), times x's lane.

``pto_dqdots_<format>(row, nb, b0, n, xp, ldx, R, c, ldc)`` is the dot product of those blocks
with ``R`` prepared vectors (a GEMV of several rows: a decode step's batch): each weight value
computed once for a block of :data:`DOT_BLOCK` vectors and multiplied into each one's
accumulators (the rest of the vectors in one smaller block), so the dequantization is paid once
per block of rows rather than per row; each vector's products and their order are
``pto_dqdot_<format>``'s, so a row's sum is what the one-row GEMV gives it, bit for bit.
"""

from __future__ import annotations

from pto.ir.quant import Plane, QuantFormat, Symbolic


def helper_name(fmt: QuantFormat) -> str:
    return f"pto_dq_{fmt.name}"


def dot_name(fmt: QuantFormat) -> str:
    return f"pto_dqdot_{fmt.name}"


def dots_name(fmt: QuantFormat) -> str:
    return f"pto_dqdots_{fmt.name}"


def _f(v: float) -> str:
    return f"{float(v)!r}f" if float(v) == int(v) else f"{float(v).hex()}f"


class _C(Symbolic):
    """A symbolic f32 value: the C expression it stands for."""

    def __init__(self, code: str):
        self.code = code

    def _op(self, other, sym: str, swap: bool = False) -> _C:
        o = other.code if isinstance(other, _C) else _f(other)
        a, b = (o, self.code) if swap else (self.code, o)
        return _C(f"({a} {sym} {b})")


def unit_of(fmt: QuantFormat) -> int:
    """Elements per unit: as many as make whole bytes of the narrowest element plane."""
    return max(8 // p.bits for p in fmt.planes if p.group == 1)


def group_of(fmt: QuantFormat) -> int:
    """Elements sharing every scale: the smallest group of a scale plane (the block where none)."""
    return min((p.group for p in fmt.planes if p.group > 1), default=fmt.block)


def _scalar(p: Plane, at: str) -> str:
    """The f32 value of plane ``p``'s field at byte pointer ``at`` (a scale or header: whole bytes)."""
    if p.kind == "f16":
        return f"pto_ld_f16({at})"
    if p.kind == "f32":
        return f"pto_ld_f32({at})"
    if p.kind == "i":
        return f"(float)(int8_t)*({at})"
    if p.kind == "e4m3":
        return f"pto_e4m3_f32(*({at}))"
    return f"(float)*({at})"


def _lane(p: Plane, unit: str, lane: int) -> str:
    """Lane ``lane``'s field of element plane ``p`` in the unit at element ``unit`` (its value)."""
    if p.bits >= 8:
        return _scalar(p, f"pl_{p.name} + {unit} + {lane}")
    byte = f"pl_{p.name}[({unit} * {p.bits} >> 3) + {lane * p.bits >> 3}]"
    shift = lane * p.bits & 7
    field = f"({byte} >> {shift})" if shift else byte
    return f"(float)({field} & {(1 << p.bits) - 1})"


def _prologue(fmt: QuantFormat, signature: str) -> list[str]:
    lines = [f"/* {fmt.name}: {fmt.doc} */", f"static inline {signature}", "{"]
    for p in fmt.planes:
        lines.append(f"    const uint8_t *const pl_{p.name} = row + {fmt.offset_code()[p.name]};")
    for p in fmt.planes:
        if p.header:
            lines.append(f"    const float h_{p.name} = {_scalar(p, f'pl_{p.name}')};")
    return lines


def _scales(fmt: QuantFormat) -> tuple[list[str], dict[str, _C]]:
    """The lines reading a group's scales (at element ``k0``) and the symbolic value of each
    scale and header plane."""
    lines, values = [], {}
    for p in fmt.planes:
        if p.header:
            values[p.name] = _C(f"h_{p.name}")
        elif p.group > 1:
            lines.append(f"        const float g_{p.name} = "
                         f"{_scalar(p, f'pl_{p.name} + k0 / {p.group} * {fmt.stride(p.name)}')};")
            values[p.name] = _C(f"g_{p.name}")
    return lines, values


def _weight(fmt: QuantFormat, scales: dict[str, _C], lane: int) -> str:
    """The routine's value at lane ``lane`` of the unit at element ``ku`` (C)."""
    values = dict(scales)
    values.update({p.name: _C(_lane(p, "ku", lane)) for p in fmt.planes if p.group == 1})
    return fmt.dequantize(values).code


def _walk(fmt: QuantFormat, each: str) -> list[str]:
    """The loops over blocks ``b0 ..`` of a row: the groups (their scales read once), the units,
    and for each lane ``each`` formatted with ``at`` (the element's index in the group) and
    ``w`` (its value)."""
    U, G = unit_of(fmt), group_of(fmt)
    lines = ["    int64_t k0, u;", f"    for (k0 = b0 * {fmt.block}; k0 < (b0 + n) * {fmt.block}; k0 += {G}) {{"]
    scale_lines, values = _scales(fmt)
    lines += scale_lines
    lines += [f"        for (u = 0; u < {G}; u += {U}) {{", "            const int64_t ku = k0 + u;"]
    for lane in range(U):
        lines.append("            " + each.format(at=f"u + {lane}", w=_weight(fmt, values, lane)))
    return lines + ["        }"]


def render_helper(fmt: QuantFormat) -> list[str]:
    """``pto_dq_<format>``: blocks of a row dequantized (the module docstring)."""
    lines = _prologue(fmt, f"void {helper_name(fmt)}(const uint8_t *row, int64_t nb, int64_t b0, int64_t n, "
                           "float *out)")
    lines += _walk(fmt, "out[{at}] = {w};")
    return lines + [f"        out += {group_of(fmt)};", "    }", "    (void)nb;", "}", ""]


def vectorized(fmt: QuantFormat) -> bool:
    """Whether the dot product has the vector form (the module docstring): one element plane,
    integers of 4 or 8 bits (a unit is one byte of it)."""
    planes = [p for p in fmt.planes if p.group == 1]
    return len(planes) == 1 and planes[0].kind in ("u", "i") and planes[0].bits * unit_of(fmt) == 8


def _dot_loops(fmt: QuantFormat, rows: int, x: str) -> list[str]:
    """The loops of a dot product of blocks ``b0 ..`` of a row with ``rows`` prepared vectors
    (``x``, ``x + ldx``, ...; ``x`` advanced a group at a time): each weight the routine's value
    once, multiplied into each vector's accumulators (``acc<r>``: one vector in the vector form,
    a group's lanes otherwise)."""
    U, G = unit_of(fmt), group_of(fmt)
    V = G // U  # units of a group
    scale_lines, values = _scales(fmt)
    vec = vectorized(fmt)
    at = [""] + [f" + {'' if r == 1 else f'{r} * '}ldx" for r in range(1, rows)]  # each vector's offset
    lines = ["    int64_t k0, u;",
             f"    for (k0 = b0 * {fmt.block}; k0 < (b0 + n) * {fmt.block}; k0 += {G}, {x} += {G}) {{", *scale_lines]
    if vec:  # each lane's weights a vector (the routine on it, the scales broadcast), times x's
        p = next(q for q in fmt.planes if q.group == 1)
        widen = "pto_vwiden_i8" if p.kind == "i" else "pto_vwiden_u8"
        lines += [_guard(fmt), f"        for (u = 0; u < {V}; u += PTO_VW) {{",
                  f"            const pto_vi v = {widen}(pl_{p.name} + k0 / {U} + u);"]
        for lane in range(U):
            field = f"(v >> {lane * p.bits}) & {(1 << p.bits) - 1}" if p.bits < 8 else "v"
            w = fmt.dequantize({**values, p.name: _C(f"__builtin_convertvector({field}, pto_vf)")}).code
            lines.append(f"            w = {w};")
            lines += [f"            acc{r} += pto_vload({x}{at[r]} + {lane * V} + u) * w;" for r in range(rows)]
        lines += ["        }", "#else"]
    lines += [f"        for (u = 0; u < {V}; u++) {{", f"            const int64_t ku = k0 + u * {U};"]
    for lane in range(U):
        lines.append(f"            w_ = {_weight(fmt, values, lane)};")
        lines += [f"            acc{r}[{lane * V} + u] += {x}[{lane * V} + u{at[r]}] * w_;" for r in range(rows)]
    lines.append("        }")
    return lines + (["#endif", "    }"] if vec else ["    }"])


def _guard(fmt: QuantFormat) -> str:
    """The condition of the vector form (the module docstring)."""
    return f"#if defined(PTO_DQ_VECTORS) && {group_of(fmt) // unit_of(fmt)} % PTO_VW == 0"


def _accumulators(fmt: QuantFormat, rows: int) -> list[str]:
    """The declarations of ``rows`` vectors' accumulators (zero) and of a weight (``w``, ``w_``)."""
    scalar = f"    float {', '.join(f'acc{r}[{group_of(fmt)}] = {{0.0f}}' for r in range(rows))}, w_;"
    if not vectorized(fmt):
        return [scalar]
    vector = ", ".join(f"acc{r} = pto_vsplat(0.0f)" for r in range(rows))
    return [_guard(fmt), f"    pto_vf {vector}, w;", "#else", scalar, "#endif"]


def _sums(fmt: QuantFormat, into: list[str]) -> list[str]:
    """Each accumulator's sum (``into[r]``: a format with a ``{}`` for it)."""
    scalar = [f"    {t.format(f'pto_row_sum(acc{r}, {group_of(fmt)})')}" for r, t in enumerate(into)]
    if not vectorized(fmt):
        return scalar
    return [_guard(fmt), *(f"    {t.format(f'pto_vsum(acc{r})')}" for r, t in enumerate(into)), "#else", *scalar,
            "#endif"]


def render_dot(fmt: QuantFormat) -> list[str]:
    """``pto_dqdot_<format>``: blocks of a row dotted with a prepared vector (the module docstring)."""
    lines = _prologue(fmt, f"float {dot_name(fmt)}(const uint8_t *row, int64_t nb, int64_t b0, int64_t n, "
                           "const float *xp)")
    lines += _accumulators(fmt, 1) + _dot_loops(fmt, 1, "xp") + ["    (void)nb;"]
    return lines + _sums(fmt, ["return {};"]) + ["}", ""]


#: the vectors a multi-row dot product multiplies each weight into at once (their accumulators in
#: registers); the rest (fewer) in one block. 8 was no faster with AVX-512's 32 registers
DOT_BLOCK = 4


def render_dots(fmt: QuantFormat) -> list[str]:
    """``pto_dqdots_<format>(row, nb, b0, n, xp, ldx, R, c, ldc)``: blocks of a row dotted with
    ``R`` prepared vectors (``ldx`` apart), each sum added to ``c[i * ldc]``: the weights
    computed once per :data:`DOT_BLOCK` vectors, each vector's sum ``pto_dqdot_<format>``'s (the
    same products in the same order)."""
    lines = _prologue(fmt, f"void {dots_name(fmt)}(const uint8_t *row, int64_t nb, int64_t b0, int64_t n, "
                           "const float *xp, int64_t ldx, int64_t R, float *c, int64_t ldc)")
    lines.append("    int64_t i = 0;")
    for rows in range(DOT_BLOCK, 1, -1):  # blocks of DOT_BLOCK vectors, then one of the rest
        head = f"for (; i + {rows} <= R; i += {rows})" if rows == DOT_BLOCK else f"if (R - i == {rows})"
        body = ["    const float *x = xp + i * ldx;", *_accumulators(fmt, rows), *_dot_loops(fmt, rows, "x"),
                *_sums(fmt, [f"c[(i + {r}) * ldc] += {{}};" for r in range(rows)])]
        lines += [f"    {head} {{", *(t if t.startswith("#") else "    " + t for t in body),
                  "    }" if rows == DOT_BLOCK else "        return;", *([] if rows == DOT_BLOCK else ["    }"])]
    lines += [f"    for (; i < R; i++) c[i * ldc] += {dot_name(fmt)}(row, nb, b0, n, xp + i * ldx);", "}", ""]
    return lines


def render_helpers(fmt: QuantFormat) -> list[str]:
    """Every helper of ``fmt``."""
    return [*render_helper(fmt), *render_dot(fmt), *render_dots(fmt)]


__all__ = ["DOT_BLOCK", "dot_name", "dots_name", "group_of", "helper_name", "render_dot", "render_dots",
           "render_helper", "render_helpers", "unit_of", "vectorized"]
