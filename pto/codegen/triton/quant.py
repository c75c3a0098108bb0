"""Triton code of a quantized format's tile load: one ``@triton.jit`` helper per format
(``_pto_dq_<format>``), rendered by running the format's one dequantization routine
(:attr:`pto.ir.quant.QuantFormat.dequantize`, the routine the torch evaluator runs) on symbolic
values that emit the Triton statements they stand for.

The helper's contract: ``P`` (uint8 pointer) is the region's first row, ``S`` the tensor's row
stride in bytes, ``ri`` the ``[BR, 1]`` rows of the tile in the region, ``c0`` the tensor
column of the tile's first element (a multiple of the block), ``rmask`` the rows to read and
``lim`` the tensor column the tile's valid elements end before; ``MASKED`` false promises every
row and element of the block is valid (no masks). It returns the ``[BR, BC]`` f32 values (those
of masked elements unspecified: the caller puts the load's pad there).

The tile is read in *units*: runs of ``U`` elements whose packed values are one integer of each
element plane (``U`` = 8 for 4-bit values: a 32-bit word of them, a byte of 1-bit ones, 16 bits
of 2-bit ones; 4 for 8-bit ones; 1 for fp8, read as it is). Every plane is loaded as one ``[BR,
BC / U]`` tensor: an element plane's integers (a contiguous run per row: wide loads), a scale
plane's value for each unit (a block's or a sub-block's scale, the same for its units). The
routine then runs once per lane ``k`` of a unit, on those tensors: the lane's value of each
element plane is a shift and a mask of its integer, made a float by or'ing it into the bits of
2^23 and subtracting 2^23 (exact; no int-to-float conversion instruction, which runs at a
quarter of the rate on the GPU); a product of scales is the same statement for every lane, so
it is computed once per unit. The ``U`` lanes' results are joined into ``[BR, BC]`` last
(``tl.join``: a unit's elements stay in the thread that loaded it). So every plane and every
intermediate has the layout of one ``[BR, BC / U]`` tensor and nothing moves between threads;
the operations and their order are the evaluator's, so the values are the same bits (each
product is exact: :mod:`pto.ir.quant`).
"""

from __future__ import annotations

from pto.ir.quant import Affine, Plane, QuantFormat, Symbolic

_TL = {("u", 8): "tl.uint8", ("i", 8): "tl.int8", ("f16", 16): "tl.float16", ("f32", 32): "tl.float32",
       ("e4m3", 8): "tl.uint8"}


#: the bits of the f32 2^23: an integer below 2^23 or'ed into them is 2^23 plus that integer
_MAGIC = "0x4B000000"


def helper_name(fmt: QuantFormat) -> str:
    return f"_pto_dq_{fmt.name}"


class _Emitter:
    """The lines of a helper's body and fresh names; a statement emitted twice is computed once."""

    def __init__(self):
        self.lines: list[str] = []
        self.n = 0
        self.seen: dict[str, str] = {}

    def let(self, code: str) -> str:
        if code in self.seen:
            return self.seen[code]
        self.n += 1
        name = self.seen[code] = f"_v{self.n}"
        self.lines.append(f"    {name} = {code}")
        return name

    def split(self, code: str) -> tuple[str, str]:
        """``tl.split(code)``'s two halves, as two names (computed once, as :meth:`let`)."""
        key = f"tl.split({code})"
        if key not in self.seen:
            self.n += 2
            self.seen[key] = f"_v{self.n - 1}, _v{self.n}"
            self.lines.append(f"    {self.seen[key]} = {key}")
        a, b = self.seen[key].split(", ")
        return a, b

    def load(self, ptr: str, mask: str) -> str:
        """A load, masked unless the caller promised every lane valid (``MASKED`` false)."""
        self.n += 1
        name = f"_v{self.n}"
        self.lines += ["    if MASKED:", f"        {name} = tl.load({ptr}, mask={mask}, other=0)", "    else:",
                       f"        {name} = tl.load({ptr})"]
        return name


class _Value(Symbolic):
    """A symbolic f32 ``[BR, BC / U]`` tensor (one value per unit, or per row: ``[BR, 1]``)."""

    def __init__(self, em: _Emitter, code: str, row: bool = False):
        #: ``row``: one value per row (``[BR, 1]``: a header plane's, or made of them only)
        self.em, self.code, self.row = em, code, row

    def _op(self, other, sym: str, swap: bool = False) -> _Value:
        if isinstance(other, Affine):
            return NotImplemented
        if sym == "*" and not isinstance(other, _Value) and float(other) == 1.0:
            return self
        o = other.code if isinstance(other, _Value) else repr(float(other))
        a, b = (o, self.code) if swap else (self.code, o)
        row = self.row and (not isinstance(other, _Value) or other.row)
        return _Value(self.em, self.em.let(f"{a} {sym} {b}"), row)


def unit_of(fmt: QuantFormat) -> int:
    """Elements per unit: 1 where an element plane is fp8 (read as it is), else as many as the
    widest element plane packs into 32 bits."""
    planes = [p for p in fmt.planes if p.group == 1]
    if any(p.kind == "e4m3" for p in planes):
        return 1
    return 32 // max(p.bits for p in planes)


_INT = {8: "tl.uint8", 16: "tl.uint16", 32: "tl.int32"}


def _loads(em: _Emitter, fmt: QuantFormat, offsets: dict[str, str], U: int, groups: bool = False) -> dict[str, str]:
    """Each plane of the tile's rows as one ``[BR, BC / U]`` tensor (a header plane ``[BR, 1]``):
    an element plane's integer per unit (int32), a scale plane's f32 value per unit. ``groups``:
    a scale plane whose group spans four units or more is loaded a value a group and broadcast to
    its units: the same values from fewer loads and addresses (``RenderOptions.qscales``)."""
    unit = em.let(f"tl.arange(0, BC // {U})[None, :]")
    out = {}
    for p in fmt.planes:
        base = f"rowp + {offsets[p.name]}"
        if p.header:
            out[p.name] = header_load(em, p, base, "rmask")
            continue
        mask = f"rmask & (c0 + {unit} * {U} < lim)"
        if p.group == 1:  # U values of b bits: one integer of U * b bits per unit
            bits = U * p.bits
            kind = _INT[bits] if p.kind != "e4m3" else "tl.uint8"
            ptr = f"({base} + c0 * {p.bits} // 8).to(tl.pointer_type({kind})) + {unit}"
            raw = em.load(ptr, mask)
            out[p.name] = em.let(f"{raw}.to(tl.int32)") if p.kind != "e4m3" and bits < 32 else raw
            continue
        # a scale per group of elements (whole units): the same for the group's units
        assert p.group % U == 0, (fmt.name, p.name)
        stride = fmt.stride(p.name)
        step = stride // (p.bits // 8)  # (2 in a pair: the other plane's value between)
        at = f"({base} + (c0 // {p.group}) * {stride}).to(tl.pointer_type({_TL[(p.kind, p.bits)]}))"
        if groups and p.group >= 4 * U:
            out[p.name] = _group_scale(em, p, at, step, U)
            continue
        index = unit if p.group == U else f"{unit} // {p.group // U}"
        index = index if step == 1 else f"({index}) * {step}"
        out[p.name] = em.let(f"{em.load(f'{at} + {index}', mask)}.to(tl.float32)")
    return out


def _group_scale(em: _Emitter, p: Plane, at: str, step: int, U: int) -> str:
    """Scale plane ``p``'s f32 value of each unit (``[BR, BC / U]``), loaded a value a group and
    broadcast to the group's units (a tile holds whole blocks: ``BC`` is at least the group)."""
    group = f"tl.arange(0, BC // {p.group})[None, :]"
    ptr = f"{at} + {group}" + (f" * {step}" if step != 1 else "")
    raw = em.load(ptr, f"rmask & (c0 + {group} * {p.group} < lim)")
    return em.let(f"tl.reshape(tl.broadcast_to({raw}.to(tl.float32)[:, :, None], (BR, BC // {p.group}, "
                  f"{p.group // U})), (BR, BC // {U}))")


def header_load(em: _Emitter, p: Plane, base: str, mask: str) -> str:
    """A header plane's value of each row (f32), from ``base`` (the rows' first bytes)."""
    return em.let(f"{em.load(f'({base}).to(tl.pointer_type({_TL[(p.kind, p.bits)]}))', mask)}.to(tl.float32)")


def _lane(em: _Emitter, p: Plane, raw: str, k: int) -> _Value:
    """Lane ``k``'s value of element plane ``p`` (its units' integers ``raw``), as an f32."""
    if p.kind == "e4m3":  # a unit is one element
        return _Value(em, em.let(f"{raw}.to(tl.float8e4nv, bitcast=True).to(tl.float32)"))
    v = f"(({raw} >> {k * p.bits}) & {(1 << p.bits) - 1})" if k * p.bits else f"({raw} & {(1 << p.bits) - 1})"
    if p.kind == "i":  # two's complement: offset by half the range, which the magic subtracts
        half = 1 << (p.bits - 1)
        return _Value(em, em.let(f"(({v} ^ {half}) | {_MAGIC}).to(tl.float32, bitcast=True) - "
                                 f"{float(2 ** 23 + half)!r}"))
    return _Value(em, em.let(f"({v} | {_MAGIC}).to(tl.float32, bitcast=True) - 8388608.0"))


def _fraction(em: _Emitter, p: Plane, raw: str, k: int) -> str:
    """Lane ``k``'s field of element plane ``p`` as the f32 ``1 + u / 2^bits`` (``u`` the field
    as unsigned, or offset by half its range where signed): the field moved to the top of the
    mantissa of 1.0 (a shift and one and-or: no conversion, no subtraction); fp8's value as it is."""
    if p.kind == "e4m3":
        return em.let(f"{raw}.to(tl.float8e4nv, bitcast=True).to(tl.float32)")
    at, top = k * p.bits, 23 - p.bits  # the field's bit in the unit, and in the mantissa
    moved = raw if at == top else f"({raw} << {top - at})" if at < top else f"({raw} >> {at - top})"
    field = f"({moved} & {((1 << p.bits) - 1) << top})"
    if p.kind == "i":  # two's complement: flipping the top bit offsets it by half the range
        field = f"({field} ^ {1 << (top + p.bits - 1)})"
    return em.let(f"({field} | 0x3F800000).to(tl.float32, bitcast=True)")


def _joined(em: _Emitter, parts: list[str]) -> str:
    """``parts`` (2^d tensors of one shape) joined along d new minor dims so that the flat index
    of those dims is the part's index (``tl.join`` keeps a new dim within each thread)."""
    if len(parts) == 1:
        return parts[0]
    return em.let(f"tl.join({_joined(em, parts[0::2])}, {_joined(em, parts[1::2])})")


def _header(fmt: QuantFormat) -> list[str]:
    blocks = f"(S - {fmt.header_bytes}) // {fmt.block_bytes}" if fmt.header_bytes else f"S // {fmt.block_bytes}"
    return [f"    nb = {blocks}", "    rowp = P + ri.to(tl.int64) * S"]


def render_load(fmt: QuantFormat, groups: bool = False) -> list[str]:
    """``_pto_dq_load_<format>(P, S, ri, c0, rmask, lim, BR, BC, MASKED)``: every plane of the
    tile's rows (:func:`_loads`; ``groups``: its wide groups' scales a value a group), returned in
    the format's plane order."""
    em = _Emitter()
    raw = _loads(em, fmt, fmt.offset_code(), unit_of(fmt), groups)
    return [f"@triton.jit\ndef {load_name(fmt)}(P, S, ri, c0, rmask, lim, BR: tl.constexpr, BC: tl.constexpr, "
            "MASKED: tl.constexpr):", f"    # {fmt.name}: {fmt.doc}", *_header(fmt), *em.lines,
            f"    return {', '.join(raw[p.name] for p in fmt.planes)}"]


def _planes_params(fmt: QuantFormat) -> str:
    return ", ".join(f"R_{p.name}" for p in fmt.planes)


def render_values(fmt: QuantFormat) -> list[str]:
    """``_pto_dq_<format>(planes..., BR, BC)``: the ``[BR, BC]`` f32 values of the loaded planes:
    the routine once per lane (unit-shaped tensors), the lanes joined last."""
    em = _Emitter()
    U = unit_of(fmt)
    lanes = []
    for k in range(U):
        values = {p.name: _lane(em, p, f"R_{p.name}", k) if p.group == 1 else _Value(em, f"R_{p.name}", p.header)
                  for p in fmt.planes}
        lanes.append(fmt.dequantize(values).code)
    value = lanes[0] if U == 1 else em.let(f"tl.reshape({_joined(em, lanes)}, (BR, BC))")
    return [f"@triton.jit\ndef {helper_name(fmt)}({_planes_params(fmt)}, BR: tl.constexpr, BC: tl.constexpr):",
            *em.lines, f"    return {value}"]


def render_dot(fmt: QuantFormat) -> list[str]:
    """``_pto_dq_dot_<format>(planes..., x, BR, BC)``: ``[BR]`` sums of ``x [1, BC]`` (f32, zero
    past its valid columns) times each row's values, without making the values: the routine is
    affine in the element planes (``A * E + B`` per unit), so each unit's ``sum x E`` is summed
    from the fields as ``1 + E / 2^bits`` (:func:`_fraction`: two integer instructions a weight,
    joined into ``[BR, BC]`` within each thread), times x (one multiply-add a weight, summed
    over the unit within the thread), and ``A`` and ``B`` multiply once per unit. The products
    are the dequantized weights' reassociated: within f32 summation error of them."""
    em = _Emitter()
    U = unit_of(fmt)

    def per_unit(t: str, rows: str) -> str:  # [rows, BC] -> each unit's sum [rows, BC // U]
        return t if U == 1 else em.let(f"tl.sum(tl.reshape({t}, ({rows}, BC // {U}, {U})), axis=2)")

    xsum = per_unit("x", "1")
    form = affine_form(em, fmt)
    sums = {}
    for name in form.coef:
        p = fmt.plane(name)
        parts = [_fraction(em, p, f"R_{p.name}", k) for k in range(U)]
        whole = parts[0] if U == 1 else em.let(f"tl.reshape({_joined(em, parts)}, (BR, BC))")
        sums[name] = per_unit(em.let(f"{whole} * x"), "BR")
    esums = fraction_sums(em, fmt, form, sums, xsum)
    units, rows = affine_parts(em, fmt, form, esums, xsum, lambda v: f"tl.sum({v}, axis=1)[:, None]")
    total = [] if units is None else [em.let(f"tl.sum({units.code}, axis=1)")]
    total += [] if rows is None else [em.let(f"tl.sum({rows.code}, axis=1)")]
    return [f"@triton.jit\ndef {dot_name(fmt)}({_planes_params(fmt)}, x, BR: tl.constexpr, BC: tl.constexpr):",
            *em.lines, f"    return {' + '.join(total)}"]


def affine_form(em: _Emitter, fmt: QuantFormat) -> Affine:
    """The format's routine on the loaded planes (:meth:`QuantFormat.affine_form`): affine in
    its element planes, the scale planes' values ``R_<name>`` as coefficients."""
    return fmt.affine_form({p.name: _Value(em, f"R_{p.name}", p.header) for p in fmt.planes if p.group != 1})


def fraction_sums(em: _Emitter, fmt: QuantFormat, form: Affine, sums: dict[str, str], xsum: str) -> dict[str, str]:
    """Each element plane's sum of x times its values ``E`` from ``sums`` (its sum of x times the
    fields as :func:`_fraction` makes them, ``1 + u / 2^bits``) and ``xsum`` (x's sum over the
    same elements): ``sum x (1 + u / 2^b) = X + sum x u / 2^b``, ``u = E`` (``+ 2^(b-1)`` signed)."""
    out = {}
    for name in sorted(form.coef):
        p = fmt.plane(name)
        acc = sums[name]
        if p.kind != "e4m3":
            acc = em.let(f"({acc} - {xsum}) * {float(1 << p.bits)!r}")
            if p.kind == "i":
                acc = em.let(f"{acc} - {xsum} * {float(1 << (p.bits - 1))!r}")
        out[name] = acc
    return out


def affine_parts(em: _Emitter, fmt: QuantFormat, form: Affine, esums: dict[str, str], xsum: str, row_sum):
    """A dot's terms from ``esums`` (each element plane's sum of x times its values ``E`` per unit
    of the scales) and ``xsum`` (x's sum per unit): the part whose coefficients vary per unit
    (summed per unit) and the part of row coefficients (each term summed over the row first,
    ``row_sum``); either None."""
    terms = [(_Value(em, esums[name]), coef) for name, coef in sorted(form.coef.items())]
    if form.const is not None:
        terms.append((_Value(em, xsum), form.const))
    units, rows = None, None
    for v, coef in terms:
        if isinstance(coef, _Value) and coef.row:  # the same over a row: the units summed first
            part = _Value(em, em.let(row_sum(v.code))) * coef
            rows = part if rows is None else rows + part
        else:
            part = v * coef
            units = part if units is None else units + part
    return units, rows


def load_name(fmt: QuantFormat) -> str:
    return f"_pto_dq_load_{fmt.name}"


def dot_name(fmt: QuantFormat) -> str:
    return f"_pto_dq_dot_{fmt.name}"


def render_helpers(fmt: QuantFormat, groups: bool = False) -> list[str]:
    """Every helper of ``fmt`` (the load, the values, the dot), one after the other; ``groups``:
    the load's wide groups' scales a value a group (:func:`render_load`)."""
    return [line for lines in (render_load(fmt, groups), render_values(fmt), render_dot(fmt))
            for line in (*lines, "", "")]


__all__ = ["helper_name", "load_name", "dot_name", "render_helpers", "render_load", "render_values", "render_dot",
           "unit_of", "affine_form", "affine_parts", "fraction_sums", "header_load"]
