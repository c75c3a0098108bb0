"""The quantized GEMV's product by *groups* (``RenderOptions.qgemv == "groups"``): the helpers
``_pto_dqg_load_<format>`` and ``_pto_dqg_dot_<format>`` that replace the unit helpers of
:mod:`pto.codegen.triton.quant` for a GEMV's fused tiles
(:func:`pto.ir.analysis.gemv_quantized_loads`).

Why: the unit helpers read a tile as ``[BR, BC / U]`` integers (U elements a unit) with every
scale loaded once per unit (a k-quant's sub-block scale four times, one byte load each), the
x tile moved between threads to meet the units' layout and each K step's sums reduced across
the program (shuffles and barriers in the loop): on an H200 the 8B model's Q4_K GEMVs read
about 1.1 TB/s of the 4.8, a program having a few KiB in flight (docs/PERF.md, "Quantized
weights", 2026-11-29).

Here a row of a tile is ``G = BC / T`` *groups* of ``T`` consecutive elements, ``T`` the
elements whose widest element plane is 16 bytes (32 of 4-bit values, 16 of 8-bit ones), and
every plane is one ``[G, BR, ...]`` tensor whose last dim is a group's own: an element plane's
``V`` words of the group (int32 where a group's values are 64 bits or more, uint16 for 1-bit
values; fp8's e4m3 bytes four a word), read as one contiguous 4- to 16-byte run per row and group (a
thread's vector load; Triton's layout keeps a group in one thread and puts consecutive groups
on consecutive threads: coalesced), a scale plane's value per *subgroup* (``S = T / Gs``
values, ``Gs`` the smallest scale group of the format, at most ``T``), a header plane's per row.
So a scale is loaded once per group that uses it, not once per element or unit.

The dot (:func:`render_dot`) is :func:`pto.codegen.triton.quant.render_dot`'s algebra on these
shapes: the format's routine is affine in its element planes, so each subgroup's ``sum x E``
comes from the fields as ``1 + E / 2^bits`` (a shift and one and-or a weight, the f32 ``1.0``
in a register so that the and and the or are one instruction), times x (one multiply-add a
weight, a subgroup's products one chain within the thread), and the scales multiply once per
subgroup; the program's sum over its groups is one reduction per K step. x is made the groups'
shape once per K step (``[G, 1, T]``, shared by the rows), so a program's wider K step (a
4096-wide row of 4-bit values is 2 KiB) costs no more reductions.
"""

from __future__ import annotations

from pto.codegen.triton.quant import (
    _TL,
    _Emitter,
    _header,
    _planes_params,
    affine_form,
    affine_parts,
    fraction_sums,
    header_load,
)
from pto.ir.quant import Plane, QuantFormat

#: the f32 1.0: a field moved to the top of its mantissa and or'ed into it is 1 + field / 2^bits
_ONE = 0x3F800000


def group_of(fmt: QuantFormat) -> int:
    """``T``: the elements a thread takes of a row per K step, as many as 16 bytes of the
    format's widest element plane hold (32 4-bit values, 16 8-bit ones)."""
    return 128 // max(p.bits for p in fmt.planes if p.group == 1)


def subgroup_of(fmt: QuantFormat) -> int:
    """``Gs``: the elements that share every scale value, the smallest scale group (at most a
    group)."""
    return min([p.group for p in fmt.planes if p.group > 1] + [group_of(fmt)])


def words_of(fmt: QuantFormat, p: Plane) -> tuple[str, int, int]:
    """How element plane ``p`` is read per group: (the word's Triton type, ``V`` words a group,
    ``U`` values a word). int32 words where a group's values fill two or more; uint16 ones for
    1-bit values (two a group, so that the words are the contiguous dim of the load); e4m3 bytes
    four a word as the others' 8-bit values."""
    bits = group_of(fmt) * p.bits
    word = 32 if bits >= 64 else 16
    return ("tl.int32" if word == 32 else "tl.uint16"), bits // word, word // p.bits


def applies(fmt: QuantFormat, cols: int, block_cols: int) -> bool:
    """Can a tile of ``block_cols`` columns (``cols`` of them valid) be read by groups: whole
    groups, one at least."""
    T = group_of(fmt)
    return block_cols % T == 0 and cols % T == 0 and all(p.group % subgroup_of(fmt) == 0
                                                            for p in fmt.planes if p.group > 1)


def load_name(fmt: QuantFormat) -> str:
    return f"_pto_dqg_load_{fmt.name}"


def dot_name(fmt: QuantFormat, rows: bool = False) -> str:
    return f"_pto_dqg_{'rows' if rows else 'dot'}_{fmt.name}"


def render_load(fmt: QuantFormat) -> list[str]:
    """``_pto_dqg_load_<format>(P, S, ri, c0, rmask, lim, BR, BC, MASKED)`` (the arguments of
    :func:`pto.codegen.triton.quant.render_load`): every plane of the tile's rows as its
    ``[G, BR, ...]`` tensor (the module docstring; scales as f32).

    The groups are the first dim: Triton orders a load's dims by how contiguous its addresses
    are, the first among equals first, so the groups (not the rows) spread over the threads and
    each thread holds its groups of every row. A scale's index is multiplied by an opaque 1, so
    that no scale load is made a vector of consecutive groups' scales (a layout of its own)."""
    em = _Emitter()
    T, Gs = group_of(fmt), subgroup_of(fmt)
    S = T // Gs
    offsets = fmt.offset_code()
    g = em.let(f"tl.arange(0, BC // {T})[:, None, None]")
    rows = [em.let("rowp[None, :, :]"), em.let("rmask[None, :, :]")]
    valid = em.let(f"{rows[1]} & (c0 + {g} * {T} < lim)")
    one = em.let("1 + (S >> 31)")  # 1, opaque (S is never negative)
    out = {}
    for p in fmt.planes:
        base = f"{rows[0]} + {offsets[p.name]}"
        if p.header:
            out[p.name] = header_load(em, p, base, rows[1])
        elif p.group == 1:
            word, V, _ = words_of(fmt, p)
            lane = em.let(f"tl.arange(0, {V})[None, None, :]")
            # (c0 // T) * bytes: 16-byte aligned, as Triton sees it (c0 is a multiple of the block)
            ptr = f"({base} + (c0 // {T}) * {T * p.bits // 8}).to(tl.pointer_type({word})) + {g} * {V} + {lane}"
            raw = em.load(ptr, valid)
            out[p.name] = em.let(f"{raw}.to(tl.int32)") if word == "tl.uint16" else raw
        else:  # a value per subgroup (S of a group), or one a group for larger groups
            pair = fmt.pair_of(p.name)
            if pair and pair[1] == p.name:
                continue  # (read with the first)
            if p.group >= T:
                index = f"{g} * {one}" if p.group == T else f"{g} // {p.group // T}"
            else:
                sub = em.let(f"tl.arange(0, {S})[None, None, :]")
                per = p.group // Gs  # subgroups a value
                index = f"{g} * {one} * {T // p.group} + " + (f"{sub}" if per == 1 else f"{sub} // {per}")
            at = f"{base} + (c0 // {p.group}) * {fmt.stride(p.name)}"
            if pair:  # both planes' values as one word of twice the width, split in registers
                raw = em.load(f"({at}).to(tl.pointer_type({_PAIR_WORD[p.bits]})) + {index}", valid)
                for k, name in enumerate(pair):
                    out[name] = em.let(_pair_value(fmt.plane(name), f"({raw} >> {k * p.bits})" if k else raw))
                continue
            ptr = f"({at}).to(tl.pointer_type({_TL[(p.kind, p.bits)]})) + {index}"
            out[p.name] = em.let(f"{em.load(ptr, valid)}.to(tl.float32)")
    return [f"@triton.jit\ndef {load_name(fmt)}(P, S, ri, c0, rmask, lim, BR: tl.constexpr, BC: tl.constexpr, "
            "MASKED: tl.constexpr):", f"    # {fmt.name} by groups of {T}: {fmt.doc}", *_header(fmt), *em.lines,
            f"    return {', '.join(out[p.name] for p in fmt.planes)}"]


#: the word a pair of scale planes' values is loaded as, by the planes' bits
_PAIR_WORD = {8: "tl.uint16", 16: "tl.uint32"}


def _pair_value(p: Plane, word: str) -> str:
    """The f32 value of pair plane ``p`` in the low bits of ``word`` (its pair's load, shifted)."""
    if p.kind == "u" and p.bits == 8:
        return f"({word} & 255).to(tl.float32)"
    if p.kind == "f16":
        return f"({word} & 65535).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)"
    raise ValueError(f"plane {p.name}: a pair of {p.kind} planes of {p.bits} bits is not read by groups")


def _fraction(em: _Emitter, p: Plane, raw: str, k: int, one: str) -> str:
    """Lane ``k``'s field of element plane ``p`` (its words ``raw``) as the f32 ``1 + u /
    2^bits`` (:func:`pto.codegen.triton.quant._fraction`, the 1.0 or'ed from ``one``, a
    register: the mask and the or are one instruction); an e4m3 byte's (byte ``k`` of its word)
    value as it is."""
    if p.kind == "e4m3":
        byte = f"({raw} >> {8 * k}) & 255" if k else f"{raw} & 255"
        return em.let(f"({byte}).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)")
    at, top = k * p.bits, 23 - p.bits
    moved = raw if at == top else f"({raw} << {top - at})" if at < top else f"({raw} >> {at - top})"
    field = f"({moved} & {((1 << p.bits) - 1) << top})"
    if p.kind == "i":
        field = f"({field} ^ {1 << (top + p.bits - 1)})"
    return em.let(f"({field} | {one}).to(tl.float32, bitcast=True)")


def _joined(em: _Emitter, parts: list[str]) -> str:
    """``parts`` joined along new minor dims whose flat index is the part's (in-thread)."""
    if len(parts) == 1:
        return parts[0]
    return em.let(f"tl.join({_joined(em, parts[0::2])}, {_joined(em, parts[1::2])})")


def render_dot(fmt: QuantFormat, rows: bool = False) -> list[str]:
    """``_pto_dqg_dot_<format>(planes..., P, S, x, BR, BC)``: the ``[BR]`` sums of ``x [1, BC]``
    (f32, zero past its valid columns) times each row's values, from the planes of
    :func:`render_load` (``P``, ``S``: the load's; the module docstring). ``rows``: the helper
    of a few rows of x (:func:`rows_lead`), ``_pto_dqg_rows_<format>(..., BR, BC, BM)``.

    The fractions' 1.0 is a ``[G, 1, 1]`` tensor: the f32 1.0's bits plus a load that never
    happens (its mask is ``S < 0``, which no compiler can prove false, as it could ``g < 0`` for
    an index ``g``), so that it is a register the compiler cannot fold (ptxas
    splits an or with a constant from the mask's and: two instructions a weight) and a load
    after the x tile's: Triton 3.6 gives an operation the layout of the last loaded of its
    operands' loads, and through this one the product takes the groups' (x moves between
    threads once, not the weights' lanes), whatever order the loads were put in (a programmatic
    dependent launch's weights load before its wait, x after)."""
    em = _Emitter()
    T, Gs = group_of(fmt), subgroup_of(fmt)
    S = T // Gs
    G = f"BC // {T}"
    L, a = rows_lead(rows)
    never = _never(em, G, False)
    one = em.let(f"{_ONE} + {never}.to(tl.int32)")
    # x by groups: one move between threads, every plane's view
    xg = em.let(f"tl.reshape(x, ({L}{G}, 1, {T}))" + (f" + {_never(em, G, True)}.to(tl.float32)" if rows else ""))
    xs = em.let(f"tl.sum(tl.reshape({xg}, ({L}{G}, 1, {S}, {Gs})), axis={3 + a})")  # x summed per subgroup
    form = affine_form(em, fmt)
    sums = {}
    for name in form.coef:
        p = fmt.plane(name)
        _, V, U = words_of(fmt, p)
        raw = f"R_{p.name}"
        parts = [_fraction(em, p, raw, k, one) for k in range(U)]
        whole = parts[0] if U == 1 else em.let(f"tl.reshape({_joined(em, parts)}, ({G}, BR, {V}, {U}))")
        xw = em.let(f"tl.reshape({xg}, ({L}{G}, 1, {V}, {U}))") if U > 1 else \
            em.let(f"tl.reshape({xg}, ({L}{G}, 1, {V}))")
        # each subgroup's products summed within the thread, one multiply-add chain
        sums[name] = em.let(f"tl.sum(tl.reshape({whole} * {xw}, ({L}{G}, BR, {S}, {V * U // S})), axis={3 + a})")
    return _dot_function(em, fmt, fraction_sums(em, fmt, form, sums, xs), xs, dot_name(fmt, rows), form=form,
                         rows=rows)


def _never(em: _Emitter, G: str, rows: bool) -> str:
    """A load that never happens (its mask, ``S < 0``, no compiler can prove false), 0 in the
    groups' layout: ``[G, 1, 1]``, or ``[1, G, 1, 1]`` with ``rows`` (:func:`rows_lead`: added to
    x's groups, it gives them and every product of x and the weights its layout, the groups on
    the threads and x's rows in each thread's registers, where a broadcast of a ``[G, 1, 1]``
    one would take x's layout instead, and its threads along a dim of one)."""
    g = em.let(f"tl.arange(0, {G})[None, :, None, None]" if rows else f"tl.arange(0, {G})[:, None, None]")
    return em.let(f"tl.load(P + {g} * (1 + (S >> 31)), mask={g} * 0 + S < 0, other=0)")


def rows_lead(rows: bool) -> tuple[str, int]:
    """How a dot helper of ``rows`` (x of ``BM`` rows, ``[BM, BC]``; the sums ``[BM, BR]``) writes
    x's tensors: a leading ``BM`` dim before the groups' (``[BM, G, 1, ...]``), every x-derived
    tensor's axes one further (the weights' ``[G, BR, ...]`` broadcast over it: each thread's
    weights unpacked once for every row of x); without, the one row's shapes: ("" or "BM, ",
    the axes' offset)."""
    return ("BM, ", 1) if rows else ("", 0)


def _dot_function(em: _Emitter, fmt: QuantFormat, esums: dict[str, str], xsum: str, name: str, comment: str = "",
                  form=None, rows: bool = False) -> list[str]:
    """A dot helper's lines: ``em``'s, then the sum of the format's affine parts (``form``, else
    the format's, :func:`affine_form`) from ``esums`` (each element plane's ``sum x E`` per
    subgroup, ``[G, BR, S]``) and ``xsum`` (x's per subgroup), as the ``[BR]`` row sums; with
    ``rows`` (:func:`rows_lead`) ``esums`` are ``[BM, G, BR, S]`` and the sums ``[BM, BR]``."""
    form = affine_form(em, fmt) if form is None else form
    if rows:
        row_sum = "tl.sum(tl.sum({}, axis=3), axis=1)"
        units, per_row = affine_parts(em, fmt, form, esums, xsum, lambda v: row_sum.format(v) + "[:, None, :, None]")
        total = [] if units is None else [em.let(row_sum.format(units.code))]
        total += [] if per_row is None else [em.let(f"tl.reshape({per_row.code}, (BM, BR))")]
    else:
        units, per_row = affine_parts(em, fmt, form, esums, xsum,
                                      lambda v: f"tl.sum(tl.sum({v}, axis=2), axis=0)[None, :, None]")
        total = [] if units is None else [em.let(f"tl.sum(tl.sum({units.code}, axis=2), axis=0)")]
        total += [] if per_row is None else [em.let(f"tl.reshape({per_row.code}, (BR,))")]
    bm = ", BM: tl.constexpr" if rows else ""
    head = f"@triton.jit\ndef {name}({_planes_params(fmt)}, P, S, x, BR: tl.constexpr, BC: tl.constexpr{bm}):"
    return [head, *([f"    # {comment}"] if comment else []), *em.lines, f"    return {' + '.join(total)}"]


def int_dots_apply(fmt: QuantFormat) -> bool:
    """Can a GEMV take ``fmt``'s products as integer dots (:func:`render_dot_int`): element
    planes of unsigned 2-, 4- or 8-bit or signed 8-bit integers read as int32 words, each
    subgroup (the values that share every scale) whole words of every plane, and a 5-bit
    format's 1-bit plane, which goes into its 4-bit fields (:func:`_high_bit`): Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; not fp8."""
    high = _high_bit(fmt)
    planes = [p for p in fmt.planes if p.group == 1 and (high is None or p.name != high[1])]
    S = group_of(fmt) // subgroup_of(fmt)
    return all((p.kind == "u" and p.bits in (2, 4, 8) or p.kind == "i" and p.bits == 8)
               and words_of(fmt, p)[0] == "tl.int32" and words_of(fmt, p)[1] % S == 0 for p in planes)


def _high_bit(fmt: QuantFormat) -> tuple[str, str] | None:
    """The (4-bit, 1-bit) element planes of a 5-bit format whose routine weighs the 1-bit plane
    16 times the 4-bit one (Q5_0, Q5_1, Q5_K: ``ql + 16 qh``), a group of 32 (its high bits two
    16-bit words); None for the others. The integer dots move each high bit into its 4-bit
    field's byte (the 5-bit value): one pair of dots a field word, on the 4-bit plane's x words."""
    planes = {p.name: p for p in fmt.planes if p.group == 1}
    lo, hi = planes.get("ql"), planes.get("qh")
    if lo is None or hi is None or len(planes) != 2 or (lo.bits, hi.bits) != (4, 1) or group_of(fmt) != 32:
        return None
    return "ql", "qh"


def reads_by_groups_in(source: str) -> bool:
    """Does a rendered kernel's device function (its source's last ``def d_``) take a GEMV's
    product by groups (the float dot, the integer dots or the half dots)."""
    body = source.split("def d_")[-1]
    return any(f"{stem}_{kind}_" in body for stem in ("_pto_dqg", "_pto_dqx8", "_pto_dqx16", "_pto_dqh")
               for kind in ("dot", "rows"))


def int_dot_name(fmt: QuantFormat, xbits: int, rows: bool = False) -> str:
    return f"_pto_dqx{xbits}_{'rows' if rows else 'dot'}_{fmt.name}"


#: the f32 1.5 * 2^23: an f32 of magnitude below 2^22 added to it is rounded to an integer (to
#: nearest, ties to even) held in the sum's low bits, two's complement
_ROUND = "12582912.0"

#: the integer dots: each helper's PTX instruction (operands: the result, ``a``, ``b``, ``c``) and
#: its products for Triton's operations, ``(bits, at)`` of ``a``'s signed field then ``b``'s
_DOTS = {
    "_pto_dp4a": ("dp4a.s32.s32", [(8, 8 * k, 8, 8 * k) for k in range(4)]),
    "_pto_dp2a_lo": ("dp2a.lo.s32.s32", [(16, 0, 8, 0), (16, 16, 8, 8)]),
    "_pto_dp2a_hi": ("dp2a.hi.s32.s32", [(16, 0, 8, 16), (16, 16, 8, 24)]),
}


#: packing x's integers (each the low bits of an int32) into words: PTX's ``prmt`` (byte
#: permutes; selector nibbles index a's bytes 0-3 and b's 4-7) and the same in Triton's operations
_PACKS = {
    "_pto_pack2": ("a, b", "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", "(a & 65535) | (b << 16)"),
    "_pto_pack4": ("a, b, c, d", "{ .reg .b32 lo, hi; prmt.b32 lo, $1, $2, 0x0040; prmt.b32 hi, $3, $4, 0x0040; "
                   "prmt.b32 $0, lo, hi, 0x5410; }", "=r,r,r,r,r",
                   "(a & 255) | ((b & 255) << 8) | ((c & 255) << 16) | (d << 24)"),
}


def render_int_dots(asm: bool) -> list[str]:
    """``_pto_dp4a(a, b, c)``: ``c`` plus the products of the four signed bytes of ``a`` and
    ``b``; ``_pto_dp2a_lo``/``_hi(a, b, c)``: ``c`` plus the products of ``a``'s two signed 16-bit
    halves and ``b``'s bytes 0 and 1 (2 and 3) (int32 tensors): PTX's ``dp4a``/``dp2a`` (one
    instruction each) where ``asm``, else the same arithmetic in Triton's operations (the
    interpreter's: no inline assembly there); ``_pto_pack2(a, b)``, ``_pto_pack4(a, b, c, d)``:
    the low 16 bits (8 bits) of each in one word, the first lowest (one ``prmt``, three)."""
    out = []
    for name, (ptx, terms) in _DOTS.items():
        out.append(f"@triton.jit\ndef {name}(a, b, c):")
        if asm:
            out.append(f'    return tl.inline_asm_elementwise("{ptx} $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], '
                       "dtype=tl.int32, is_pure=True, pack=1)")
        else:
            parts = " + ".join(f"((a << {32 - ab - aa}) >> {32 - ab}) * ((b << {32 - bb - ba}) >> {32 - bb})"
                               for ab, aa, bb, ba in terms)
            out.append(f"    return c + {parts}")
        out += ["", ""]
    for name, (args, ptx, constraints, ops) in _PACKS.items():
        out.append(f"@triton.jit\ndef {name}({args}):")
        if asm:
            out.append(f'    return tl.inline_asm_elementwise("{ptx}", "{constraints}", [{args}], dtype=tl.int32, '
                       "is_pure=True, pack=1)")
        else:
            out.append(f"    return {ops}")
        out += ["", ""]
    return out


def _words(em: _Emitter, t: str, lead: str, V: int) -> list[str]:
    """The ``V`` slices of ``t``'s last dim (``[lead, V]``, ``V`` a power of two: a group's words,
    x's lanes) as ``[lead, 1]`` tensors, in index order (splits within the thread)."""
    if V == 1:
        return [t]
    even, odd = em.split(f"tl.reshape({t}, ({lead}, {V // 2}, 2))")
    return [w for pair in zip(_words(em, even, lead, V // 2), _words(em, odd, lead, V // 2)) for w in pair]


def _x_by_groups(em: _Emitter, G: str, T: int, floor: str, rows: bool = False) -> tuple[str, str, str]:
    """What the integer and half dots take of x first: an opaque int32 0 of the groups' layout
    (:func:`render_dot`'s anchor), x as ``[G, 1, T]`` and each group's largest magnitude, at least
    ``floor`` (``[G, 1, 1]``); with ``rows`` (:func:`rows_lead`) x's ``[BM, G, 1, ...]``."""
    L, a = rows_lead(rows)
    never = _never(em, G, rows)
    zero = em.let(f"{never}.to(tl.int32)")
    xg = em.let(f"tl.reshape(x, ({L}{G}, 1, {T}))" + (f" + {never}.to(tl.float32)" if rows else ""))
    amax = em.let(f"tl.maximum(tl.max(tl.abs({xg}), axis={2 + a}, keep_dims=True), {floor})")
    return zero, xg, amax


def render_dot_int(fmt: QuantFormat, xbits: int, rows: bool = False) -> list[str]:
    """``_pto_dqx<xbits>_dot_<format>(planes..., P, S, x, BR, BC)``: :func:`render_dot`'s sums with x
    rounded to ``xbits``-bit integers per group (a scale a group: its largest magnitude over
    ``2^(xbits-1) - 1``; 8 bits as llama.cpp's Q8_1 activations) and each subgroup's ``sum xq
    E`` of each element plane integer dots (:func:`render_int_dots`: four bytes an instruction
    with 8-bit x, two with 16-bit x): the packed fields masked into bytes (a word of ``b``-bit
    fields ``8 / b`` masks), x's integers packed in the matching order once per K step and
    shared by the rows. The arithmetic differs from the float dot's by x's rounding (at most
    half a step of its group's scale an element: 1/254 of the group's largest magnitude with 8
    bits, 1/65534 with 16, finer than bf16's rounding of the group's larger values); the integer
    sums are exact; the values' constant part (a minimum, an offset) multiplies x's own sum.
    ``rows``: the helper of a few rows of x (:func:`rows_lead`; the fields unpacked once, an
    integer dot a row)."""
    em = _Emitter()
    T, Gs = group_of(fmt), subgroup_of(fmt)
    S = T // Gs
    G = f"BC // {T}"
    L, a = rows_lead(rows)
    top = float((1 << (xbits - 1)) - 1)
    # the group's largest magnitude (at least 1e-30: a group of zeros has integers zero)
    zero, xg, amax = _x_by_groups(em, G, T, "1e-30", rows)
    inv = em.let(f"{top!r} / {amax}")
    xs = em.let(f"{amax} / {top!r}")  # a step of the group's integers
    xi = em.let(f"({xg} * {inv} + {_ROUND}).to(tl.int32, bitcast=True)")  # [G, 1, T]: the low bits
    xsum = em.let(f"tl.sum(tl.reshape({xg}, ({L}{G}, 1, {S}, {Gs})), axis={3 + a})")  # x summed per subgroup
    esums = {}
    high = _high_bit(fmt)
    joined = None
    if high is not None:  # the 1-bit plane's two 16-bit words a group as one (the first low), its bits
        # moved into the 4-bit fields' bytes below
        (w0, w1) = _words(em, f"R_{high[1]}", f"{G}, BR", 2)
        joined = em.let(f"{w0} | ({w1} << 16)")
        esums[high[1]] = "0.0"  # (its products are in the 4-bit plane's: its coefficient is 16 times that one's)
    for p in [q for q in fmt.planes if q.group == 1 and (high is None or q.name != high[1])]:
        _, V, _ = words_of(fmt, p)
        per = 8 // p.bits  # fields a byte: shift k's field of byte j is the word's lane j * per + k
        # x by lane k: [G, 1, V, 4], byte j of the field words of shift k
        lanes = [em.let(f"tl.reshape({w}, ({L}{G}, 1, {V}, 4))")
                 for w in _words(em, em.let(f"tl.reshape({xi}, ({L}{G}, 1, {V}, 4, {per}))"), f"{L}{G}, 1, {V}, 4",
                                 per)]
        xw = []  # per lane k: the x words of each field word v (one for dp4a; dp2a's lo and hi pairs)
        for lane in lanes:  # j = 2 h + i below
            even, odd = em.split(f"tl.reshape({lane}, ({L}{G}, 1, {V}, 2, 2))")  # i = 0, 1: [G, 1, V, 2] over h
            if xbits == 8:
                (j0, j2), (j1, j3) = em.split(even), em.split(odd)
                xw.append([_words(em, em.let(f"_pto_pack4({j0}, {j1}, {j2}, {j3}) + {zero}"), f"{L}{G}, 1", V)])
            else:
                pairs = em.let(f"_pto_pack2({even}, {odd})")
                xw.append([_words(em, em.let(f"{h} + {zero}"), f"{L}{G}, 1", V) for h in em.split(pairs)])
        rw = _words(em, f"R_{p.name}", f"{G}, BR", V)
        mask = 0x01010101 * ((1 << p.bits) - 1)
        accs = []
        for sub in range(S):  # each subgroup's words, one chain
            acc = zero
            for v in range(sub * V // S, (sub + 1) * V // S):
                word = rw[v]
                for k in range(per):
                    field = word if p.bits == 8 else \
                        em.let(f"({word} >> {k * p.bits}) & {mask}" if k else f"{word} & {mask}")
                    if joined is not None and p.name == high[0]:
                        # byte j holds element 8 v + 2 j + k: its high bit (bit 8 v + 2 j + k of the
                        # joined word) to bit 4 of byte j: bits 0, 2, 4, 6 times 0x410410
                        shifted = em.let(f"{joined} >> {8 * v + k}" if 8 * v + k else joined)
                        field = em.let(f"{field} | ((({shifted} & 85) * 4260880) & 269488144)")
                    if xbits == 8:
                        acc = em.let(f"_pto_dp4a({field}, {xw[k][0][v]}, {acc})")
                    else:
                        acc = em.let(f"_pto_dp2a_lo({xw[k][0][v]}, {field}, {acc})")
                        acc = em.let(f"_pto_dp2a_hi({xw[k][1][v]}, {field}, {acc})")
            accs.append(acc)
        whole = accs[0] if S == 1 else em.let(f"tl.reshape({_joined(em, accs)}, ({L}{G}, BR, {S}))")
        esums[p.name] = em.let(f"{whole}.to(tl.float32) * {xs}")  # [G, BR, S]: each subgroup's sum of x E
    return _dot_function(em, fmt, esums, xsum, int_dot_name(fmt, xbits, rows),
                         f"{fmt.name}: x as {xbits}-bit integers a group of {T}, integer dots", rows=rows)


def half_dots_apply(fmt: QuantFormat) -> bool:
    """Can a GEMV take ``fmt``'s products as half dots (:func:`render_dot_half`): element planes
    of e4m3 only (fp8)."""
    return all(p.kind == "e4m3" for p in fmt.planes if p.group == 1)


def half_dot_name(fmt: QuantFormat, rows: bool = False) -> str:
    return f"_pto_dqh_{'rows' if rows else 'dot'}_{fmt.name}"


#: the half dots' helpers: (arguments, PTX, constraints, the result's type, the same in Triton's
#: operations). ``_pto_h2pack(lo, hi)``: two f32 as the halves of an f16x2 word (lo the low
#: half), rounded to nearest; ``_pto_hfma4(w, xa, xb, c)``: the f16x2 ``c`` plus the products
#: of word ``w``'s four e4m3 bytes (as f16, exactly) and the f16 pairs ``xa`` (bytes 0, 1) and
#: ``xb`` (2, 3): even bytes onto the low half, odd onto the high, each a fused multiply-add
#: rounded once to f16; ``_pto_h2sum(a)``: the f32 sum of an f16x2 word's halves
_HALVES = {
    "_pto_h2pack": ("lo, hi", "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", "tl.int32",
                    "(_pto_h16(lo) & 65535) | (_pto_h16(hi) << 16)"),
    "_pto_hfma4": ("w, xa, xb, c", "{ .reg .b16 l, h; .reg .b32 a, b, t; mov.b32 {l, h}, $1; "
                   "cvt.rn.f16x2.e4m3x2 a, l; cvt.rn.f16x2.e4m3x2 b, h; fma.rn.f16x2 t, a, $2, $4; "
                   "fma.rn.f16x2 $0, b, $3, t; }", "=r,r,r,r,r", "tl.int32",
                   "_pto_hfma2(w >> 16, xb, _pto_hfma2(w, xa, c))"),
    "_pto_h2sum": ("a", "{ .reg .b16 l, h; .reg .f32 p, q; mov.b32 {l, h}, $1; cvt.f32.f16 p, l; "
                   "cvt.f32.f16 q, h; add.rn.f32 $0, p, q; }", "=f,r", "tl.float32",
                   "_pto_f16(a).to(tl.float32) + _pto_f16(a >> 16).to(tl.float32)"),
}

#: the interpreter's pieces of the half dots: an f32's f16 bits (low 16 of an int32), the f16 of
#: an int32's low 16 bits, and one f16x2 fused multiply-add of two e4m3 bytes (``w``'s low 16
#: bits) by an f16x2 word onto another (float64 holds each product and sum exactly, so that the
#: one rounding to f16 is the instruction's)
_HALF_EMULATION = [
    "@triton.jit\ndef _pto_h16(v):",
    "    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)",
    "",
    "",
    "@triton.jit\ndef _pto_f16(w):",
    "    return ((w << 16) >> 16).to(tl.int16).to(tl.float16, bitcast=True)",
    "",
    "",
    "@triton.jit\ndef _pto_e4m3(w):",
    "    return (w & 255).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32).to(tl.float64)",
    "",
    "",
    "@triton.jit\ndef _pto_hfma2(w, x, c):",
    "    lo = _pto_e4m3(w) * _pto_f16(x).to(tl.float64) + _pto_f16(c).to(tl.float64)",
    "    hi = _pto_e4m3(w >> 8) * _pto_f16(x >> 16).to(tl.float64) + _pto_f16(c >> 16).to(tl.float64)",
    "    return (_pto_h16(lo) & 65535) | (_pto_h16(hi) << 16)",
    "",
    "",
]


def render_half_dots(asm: bool) -> list[str]:
    """The half dots' helpers (:data:`_HALVES`): inline PTX where ``asm`` (sm_89 and later: the
    e4m3 conversion), else the same arithmetic in Triton's operations (the interpreter's)."""
    out = [] if asm else list(_HALF_EMULATION)
    for name, (args, ptx, constraints, dtype, ops) in _HALVES.items():
        out.append(f"@triton.jit\ndef {name}({args}):")
        if asm:
            out.append(f'    return tl.inline_asm_elementwise("{ptx}", "{constraints}", [{args}], '
                       f"dtype={dtype}, is_pure=True, pack=1)")
        else:
            out.append(f"    return {ops}")
        out += ["", ""]
    return out


def render_dot_half(fmt: QuantFormat, rows: bool = False) -> list[str]:
    """``_pto_dqh_dot_<format>(planes..., P, S, x, BR, BC)``: :func:`render_dot`'s sums of an fp8
    matrix with x scaled per group by a power of two (``2^(127 - e)``, ``e`` the biased exponent
    of the group's largest magnitude, taken at least f32's smallest normal (so that ``e >= 1``)
    and ``e`` at most 253: the scaled values are below 2 in magnitude (below 4 for a group past
    2^126), exactly x's) and rounded to f16 (one ``cvt`` a pair, once per K step, shared by the
    rows), each group's products f16x2 fused multiply-adds of the e4m3 bytes converted to f16
    (PTX ``cvt.rn.f16x2.e4m3x2``, exact) and x's halves: two chains a group (its even and odd
    elements, eight products each: at most 8 * 448 * 4 in magnitude, no overflow), their sum in
    f32 times the group's power of two, the row's scale applied per row. The arithmetic differs
    from the float dot's by x's rounding to f16 (2^-11 of each value within 2^14 of its group's
    largest, f16's subnormal step of 2^-24 times the group's power of two below: as 16-bit
    integers' step, finer than bf16's) and the chains' rounding to f16 (2^-11 of each partial
    sum). ``rows``: the helper of a few rows of x (:func:`rows_lead`)."""
    em = _Emitter()
    T, Gs = group_of(fmt), subgroup_of(fmt)
    S = T // Gs
    G = f"BC // {T}"
    L, a = rows_lead(rows)
    (p,) = [q for q in fmt.planes if q.group == 1]
    _, V, _ = words_of(fmt, p)
    zero, xg, amax = _x_by_groups(em, G, T, "1.1754943508222875e-38", rows)  # (f32's smallest normal)
    e = em.let(f"tl.minimum({amax}.to(tl.int32, bitcast=True) >> 23, 253)")
    inv = em.let(f"((254 - {e}) << 23).to(tl.float32, bitcast=True)")  # 2^(127 - e)
    unit = em.let(f"({e} << 23).to(tl.float32, bitcast=True)")  # 2^(e - 127)
    even, odd = em.split(f"tl.reshape({xg} * {inv}, ({L}{G}, 1, {V}, 2, 2))")  # [G, 1, V, 2]: bytes 2h, 2h + 1
    xa, xb = em.split(em.let(f"_pto_h2pack({even}, {odd})"))  # [G, 1, V]: the pairs of bytes 0, 1 and 2, 3
    xas = _words(em, em.let(f"{xa} + {zero}"), f"{L}{G}, 1", V)
    xbs = _words(em, em.let(f"{xb} + {zero}"), f"{L}{G}, 1", V)
    acc = zero
    for v, word in enumerate(_words(em, f"R_{p.name}", f"{G}, BR", V)):
        acc = em.let(f"_pto_hfma4({word}, {xas[v]}, {xbs[v]}, {acc})")
    esums = {p.name: em.let(f"_pto_h2sum({acc}) * {unit}")}  # [G, BR, 1]: the group's sum of x E
    xsum = em.let(f"tl.sum(tl.reshape({xg}, ({L}{G}, 1, {S}, {Gs})), axis={3 + a})")
    return _dot_function(em, fmt, esums, xsum, half_dot_name(fmt, rows),
                         f"{fmt.name}: x as f16 a group of {T} scaled by a power of two, f16x2 dots", rows=rows)


def render_helpers(fmt: QuantFormat, xbits: int = 0, half: bool = False, rows: bool = False) -> list[str]:
    """The group helpers of ``fmt`` (the load and the dot; ``xbits``: the integer dot with x of
    that many bits too; ``half``: the half dot too; ``rows``: the dots of a few rows of x too)."""
    lines = [line for f in (render_load, render_dot) for line in (*f(fmt), "", "")]
    lines += [*render_dot_int(fmt, xbits), "", ""] if xbits else []
    lines += [*render_dot_half(fmt), "", ""] if half else []
    if rows:
        lines += [*render_dot(fmt, True), "", ""]
        lines += [*render_dot_int(fmt, xbits, True), "", ""] if xbits else []
        lines += [*render_dot_half(fmt, True), "", ""] if half else []
    return lines


__all__ = ["group_of", "subgroup_of", "words_of", "applies", "load_name", "dot_name", "render_load", "render_dot",
           "render_helpers", "rows_lead", "int_dots_apply", "reads_by_groups_in", "int_dot_name", "render_dot_int",
           "render_int_dots", "half_dots_apply", "half_dot_name", "render_dot_half", "render_half_dots"]
