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

Each plane is read as one contiguous run per row: an element plane's packed values as ``[BR, BC
* bits / 32]`` 32-bit words (split into values by shifts: ``[BR, W, 32 / bits]`` reshaped to
``[BR, BC]``; made floats by or'ing them into the bits of 2^23 and subtracting it, so that no
per-element int-to-float conversion, a quarter-rate instruction on the GPU, runs), a scale
plane's ``[BR, BC / group]`` values; the routine's arithmetic runs at the coarsest
granularity its operands allow (``d * sc`` once per sub-block, then expanded to elements), with
the same operations in the same order as the evaluator's, so the values are the same bits (each
product is exact: :mod:`pto.ir.quant`).
"""

from __future__ import annotations

from pto.ir.quant import Plane, QuantFormat

_TL = {("u", 8): "tl.uint8", ("i", 8): "tl.int8", ("f16", 16): "tl.float16", ("f32", 32): "tl.float32",
       ("e4m3", 8): "tl.uint8"}


#: the bits of the f32 2^23: an integer below 2^23 or'ed into them is 2^23 plus that integer
_MAGIC = "0x4B000000"


def helper_name(fmt: QuantFormat) -> str:
    return f"_pto_dq_{fmt.name}"


class _Emitter:
    """The lines of a helper's body and fresh names."""

    def __init__(self):
        self.lines: list[str] = []
        self.n = 0

    def let(self, code: str) -> str:
        self.n += 1
        name = f"_v{self.n}"
        self.lines.append(f"    {name} = {code}")
        return name

    def load(self, ptr: str, mask: str) -> str:
        """A load, masked unless the caller promised every lane valid (``MASKED`` false)."""
        self.n += 1
        name = f"_v{self.n}"
        self.lines += ["    if MASKED:", f"        {name} = tl.load({ptr}, mask={mask}, other=0)", "    else:",
                       f"        {name} = tl.load({ptr})"]
        return name


class _Value:
    """A symbolic f32 value: a ``[BR, 1]`` one per row (``group`` 0), a ``[BR, BC / group]`` one
    per group of elements, or a ``[BR, BC]`` one per element (``group`` 1)."""

    def __init__(self, em: _Emitter, code: str, group: int):
        self.em, self.code, self.group = em, code, group

    def at(self, group: int) -> str:
        """This value at the finer ``group`` (each of its values repeated over its elements)."""
        if self.group in (0, group):
            return self.code
        f = self.group // group
        n, m = f"BC // {self.group}", f"BC // {group}"
        return self.em.let(f"tl.reshape(tl.broadcast_to({self.code}[:, :, None], (BR, {n}, {f})), (BR, {m}))")

    def _op(self, other, sym: str, swap: bool = False) -> _Value:
        if not isinstance(other, _Value):
            other = _Value(self.em, repr(float(other)), 0)
        groups = [g for g in (self.group, other.group) if g]
        g = min(groups) if groups else 0
        a, b = self.at(g), other.at(g)
        if swap:
            a, b = b, a
        return _Value(self.em, self.em.let(f"{a} {sym} {b}"), g)

    def __add__(self, o):
        return self._op(o, "+")

    def __radd__(self, o):
        return self._op(o, "+", swap=True)

    def __sub__(self, o):
        return self._op(o, "-")

    def __rsub__(self, o):
        return self._op(o, "-", swap=True)

    def __mul__(self, o):
        return self._op(o, "*")

    def __rmul__(self, o):
        return self._op(o, "*", swap=True)


def _plane(em: _Emitter, fmt: QuantFormat, p: Plane, offsets: dict[str, str]) -> _Value:
    """The load of plane ``p`` of the tile's rows, as f32 values."""
    base = f"rowp + {offsets[p.name]}"
    if p.header:
        ptr = f"({base}).to(tl.pointer_type({_TL[(p.kind, p.bits)]}))"
        return _Value(em, em.let(f"{em.load(ptr, 'rmask')}.to(tl.float32)"), 0)
    if p.group == 1 and p.kind in ("u", "i"):
        # 32-bit words of packed values, split by shifts; each value made a float by the magic
        # number 2^23 (its bits below 2^23's, minus 2^23: exact, no conversion instruction)
        per = 32 // p.bits
        idx = em.let(f"tl.arange(0, BC // {per})[None, :]")
        ptr = f"({base} + c0 * {p.bits} // 8).to(tl.pointer_type(tl.int32)) + {idx}"
        raw = em.load(ptr, f"rmask & (c0 + {idx} * {per} < lim)")
        shifts = f"(tl.arange(0, {per}) * {p.bits})[None, None, :]"
        split = em.let(f"tl.reshape(({raw}[:, :, None] >> {shifts}) & {(1 << p.bits) - 1}, (BR, BC))")
        if p.kind == "i":  # two's complement: offset by half the range, which the magic subtracts
            half = 1 << (p.bits - 1)
            return _Value(em, em.let(f"(({split} ^ {half}) | {_MAGIC}).to(tl.float32, bitcast=True) - "
                                     f"{float(2 ** 23 + half)!r}"), 1)
        return _Value(em, em.let(f"({split} | {_MAGIC}).to(tl.float32, bitcast=True) - 8388608.0"), 1)
    n = f"BC // {p.group}"
    vb = p.bits // 8
    idx = em.let(f"tl.arange(0, {n})[None, :]")
    ptr = f"({base} + (c0 // {p.group}) * {vb}).to(tl.pointer_type({_TL[(p.kind, p.bits)]})) + {idx}"
    mask = f"rmask & (c0 + {idx} * {p.group} < lim)"
    raw = em.load(ptr, mask)
    if p.kind == "e4m3":
        raw = em.let(f"{raw}.to(tl.float8e4nv, bitcast=True)")
    return _Value(em, em.let(f"{raw}.to(tl.float32)"), p.group)


def render_helper(fmt: QuantFormat) -> list[str]:
    """The source lines of ``fmt``'s helper (the module docstring's contract)."""
    em = _Emitter()
    blocks = f"(S - {fmt.header_bytes}) // {fmt.block_bytes}" if fmt.header_bytes else f"S // {fmt.block_bytes}"
    offsets, at, head = {}, [], 0
    for p in fmt.planes:  # where each plane starts in a row of nb blocks
        if p.header:
            offsets[p.name] = str(head)
            head += p.bits // 8
            continue
        offsets[p.name] = " + ".join([str(fmt.header_bytes)] * bool(fmt.header_bytes) + at) or "0"
        at.append(f"nb * {p.block_bytes(fmt.block)}")
    planes = {p.name: _plane(em, fmt, p, offsets) for p in fmt.planes}
    out = fmt.dequantize(planes)
    value = out.at(1) if out.group != 1 else out.code
    return [f"@triton.jit\ndef {helper_name(fmt)}(P, S, ri, c0, rmask, lim, BR: tl.constexpr, BC: tl.constexpr, "
            "MASKED: tl.constexpr):",
            f"    # {fmt.name}: {fmt.doc}",
            f"    nb = {blocks}",
            "    rowp = P + ri.to(tl.int64) * S",
            *em.lines,
            f"    return {value}"]


__all__ = ["helper_name", "render_helper"]
