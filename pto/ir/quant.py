"""Block-quantized weight formats: how a row of a quantized matrix is laid out in memory, and the
one dequantization routine of each format, which every backend runs.

A quantized matrix is ``rows x cols`` logical elements stored row by row, each row ``cols //
block`` blocks of ``block`` consecutive elements (the blocks run along the columns: a weight is
stored output-major, ``[N, K]``, so a block is a run of the contraction). The formats are GGUF's
(llama.cpp's ``ggml-quants``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and fp8 (E4M3 with a scale per
row, the output channel). GGUF interleaves each block's scales and quantized values ("array of
structs"); here a row holds *planes* instead ("struct of arrays"), repacked once at load:

- a plane holds one field of every block of the row: the packed values (``bits`` per element,
  element ``k`` in byte ``k * bits // 8`` at bit ``k * bits % 8``, lowest bits first), or a scale
  per ``group`` elements (a sub-block's 6-bit scale unpacked to a byte, a block's f16 scale);
- a row is its header planes (values per row: fp8's scale), padded to 16 bytes, then the block
  planes one after the other, each ``cols // block * bytes per block`` long, then padding to a
  multiple of 16 bytes; so every row starts 16-byte aligned and a tile's packed values are one
  contiguous run per row (wide, coalesced loads), its scales another;
- but a *pair* of scale planes (:attr:`QuantFormat.pairs`: two planes of the same width and
  group, the second listed right after the first) is stored interleaved, a value of the first
  then the second's for the same group, so that a kernel reads both with one load of twice the
  width (Q4_K's and Q5_K's sub-block scale and minimum, a 16-bit word a group of 32, and their
  block's ``d`` and ``dmin``, 32 bits a block of 256: the 8B step's Q4_K gate/up 15% faster alone
  on an H200, docs/PERF.md "The 4-bit gate/up GEMVs loop over their blocks"; Q4_1's ``d`` and
  ``m``, 32 bits a block of 32: the 8B's Q4_1 step 3% faster, "Eighteenth session"; Q5_1's the
  same way).

The row holds the same information as GGUF's blocks, in as many bytes (Q4_K and Q5_K unpack
their 12 bytes of 6-bit sub-block scales and minimums to 16: 2.8% and 2.3% more) plus the
padding of the row to 16 bytes.

Dequantization (:attr:`QuantFormat.dequantize`) is written once per format, over the planes'
values: ``p["name"]`` is a plane's value at each element (an integer plane's integer, a float
plane's float, as f32; a group's scale repeated over its elements), and the routine combines
them with ``+``, ``-`` and ``*`` only. Every product of the formats is exact in f32 (an f16
scale of 11 significant bits times integers of at most 13 bits), so the one rounding is the
last addition or subtraction, and the result is the ``gguf`` package's f32 dequantization bit
for bit whatever the order of evaluation or FMA contraction. The torch evaluator
(:mod:`pto.quant.planes`) runs the routine on torch tensors; the Triton renderer
(:mod:`pto.codegen.triton.quant`) runs the same routine on symbolic values and emits the
Triton code it traces.

This module is data and arithmetic only: the IR's dtypes (:mod:`pto.ir.dtypes`) name these
formats, and everything that touches memory lives above the IR.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pto.errors import BuildError

#: every row starts, and every header ends, on a multiple of this many bytes
ROW_ALIGN = 16
KINDS = ("u", "i", "f16", "f32", "e4m3")


def round_up(n: int, m: int = ROW_ALIGN) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Plane:
    """One field of every block of a row: ``bits`` per value, a value per ``group`` elements (1:
    per element; 0: one per row, a header plane), of ``kind`` "u" (unsigned integer), "i"
    (two's complement), "f16", "f32" or "e4m3" (fp8)."""

    name: str
    bits: int
    group: int
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS or self.bits not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"plane {self.name}: kind {self.kind!r}, {self.bits} bits")

    @property
    def header(self) -> bool:
        return self.group == 0

    def block_bytes(self, block: int) -> int:
        """Bytes of this plane per block of ``block`` elements (a header plane: none)."""
        return 0 if self.header else block // self.group * self.bits // 8


@dataclass(frozen=True)
class QuantFormat:
    """A block-quantized format: ``block`` elements per block, its planes (the row layout in the
    module docstring), its dequantization routine, and the GGUF type it comes from (``gguf``,
    with GGUF's bytes per block) where it does."""

    name: str
    block: int
    planes: tuple[Plane, ...]
    dequantize: Callable
    gguf: str | None = None
    gguf_block_bytes: int = 0
    doc: str = ""
    #: pairs of scale planes stored interleaved (the module docstring): (first, second)
    pairs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        """A pair is two neighbouring scale planes of one kind, width (8 or 16 bits) and group,
        each plane in one pair at most, the pair's first value aligned to the pair's word in a
        row of any length (every plane before it whole words a block, the header too)."""
        names = [p.name for p in self.planes]
        paired = [n for pr in self.pairs for n in pr]
        for a, b in self.pairs:
            if a not in names or b not in names or paired.count(a) > 1 or paired.count(b) > 1:
                raise ValueError(f"{self.name}: planes {a} and {b} cannot be a pair")
            pa, pb = self.plane(a), self.plane(b)
            word = 2 * pa.bits // 8
            before = [p for p in self.planes[:names.index(a)] if not p.header]
            if names.index(b) != names.index(a) + 1 or (pa.kind, pa.bits, pa.group) != (pb.kind, pb.bits, pb.group) \
                    or pa.group <= 1 or pa.bits not in (8, 16) or self.header_bytes % word or \
                    any(p.block_bytes(self.block) % word for p in before):
                raise ValueError(f"{self.name}: planes {a} and {b} cannot be a pair")

    def pair_of(self, name: str) -> tuple[str, str] | None:
        """The pair plane ``name`` is in, or None."""
        return next((pr for pr in self.pairs if name in pr), None)

    def stride(self, name: str) -> int:
        """Bytes from one value of scale plane ``name`` to the next (its width; twice it in a pair)."""
        p = self.plane(name)
        return p.bits // 8 * (2 if self.pair_of(name) else 1)

    @property
    def header_bytes(self) -> int:
        n = sum(p.bits // 8 for p in self.planes if p.header)
        return round_up(n) if n else 0

    @property
    def block_bytes(self) -> int:
        """Bytes per block of elements, every block plane together."""
        return sum(p.block_bytes(self.block) for p in self.planes)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block

    def check_cols(self, cols: int, what: str = "a row") -> None:
        if cols <= 0 or cols % self.block:
            raise BuildError(f"{self.name}: {what} of {cols} elements is not whole blocks of {self.block}")

    def row_bytes(self, cols: int) -> int:
        """Bytes of a row of ``cols`` elements (a multiple of :data:`ROW_ALIGN`)."""
        self.check_cols(cols)
        return self.header_bytes + round_up(cols // self.block * self.block_bytes)

    def nbytes(self, rows: int, cols: int) -> int:
        """Bytes of a ``rows x cols`` matrix in this format."""
        return rows * self.row_bytes(cols)

    def blocks_of_row(self, row_bytes: int) -> int:
        """The blocks of a row from its bytes (the padding is under 16 bytes, a block's planes at
        least 16: :meth:`row_bytes` inverted; what a kernel computes from the row stride)."""
        return (row_bytes - self.header_bytes) // self.block_bytes

    def plane_offset(self, name: str, blocks: int) -> int:
        """Where plane ``name`` starts in a row of ``blocks`` blocks (bytes)."""
        off = 0
        for p in self.planes:
            if p.header:
                if p.name == name:
                    return off
                off += p.bits // 8
        off = self.header_bytes
        for p in self.planes:
            if p.header:
                continue
            if p.name == name:
                pair = self.pair_of(name)
                return off - blocks * p.block_bytes(self.block) + p.bits // 8 if pair and pair[1] == name else off
            off += blocks * p.block_bytes(self.block)
        raise KeyError(name)

    def offset_code(self) -> dict[str, str]:
        """Where each plane starts in a row of ``nb`` blocks, as the text of an integer expression
        of ``nb`` (the same in C and Python: the renderers')."""
        offsets, at, head = {}, [], 0
        for p in self.planes:
            if p.header:
                offsets[p.name] = str(head)
                head += p.bits // 8
                continue
            pair = self.pair_of(p.name)
            if pair and pair[1] == p.name:  # interleaved with the first: its offset and a value on
                offsets[p.name] = f"{offsets[pair[0]]} + {p.bits // 8}"
            else:
                offsets[p.name] = " + ".join([str(self.header_bytes)] * bool(self.header_bytes) + at) or "0"
            at.append(f"nb * {p.block_bytes(self.block)}")
        return offsets

    def plane(self, name: str) -> Plane:
        return next(p for p in self.planes if p.name == name)

    def affine_form(self, scales: dict) -> Affine:
        """The routine as ``sum_p A_p * E_p + B`` over the element planes ``E_p`` (every format's
        is affine in them), ``A_p`` and ``B`` built from ``scales`` (a value per scale and header
        plane: anything with ``+``, ``-`` and ``*``), so a product with the weights can take the
        planes' sums and the scales once per group (the renderers' dot products)."""
        form = self.dequantize({p.name: Affine({p.name: 1}, None) if p.group == 1 else scales[p.name]
                                for p in self.planes})
        if not isinstance(form, Affine):
            raise ValueError(f"{self.name}: the routine does not use an element plane")
        return form

    def file_bytes(self, rows: int, cols: int) -> int:
        """Bytes of the matrix in a GGUF file (GGUF's blocks; no row padding)."""
        return rows * cols // self.block * self.gguf_block_bytes


class Symbolic:
    """A value a renderer runs a routine on, standing for the code that computes it: ``+``, ``-``
    and ``*`` (either side) are :meth:`_op`, which a subclass writes (the operation's code)."""

    def _op(self, other, sym: str, swap: bool = False):
        raise NotImplementedError

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


class Affine:
    """A symbolic value affine in the element planes: ``sum(coef[p] * E_p) + const``, the
    coefficients and the constant of the scales' values (None: none): what
    :meth:`QuantFormat.affine_form` runs a routine on."""

    def __init__(self, coef: dict, const):
        self.coef, self.const = coef, const

    @staticmethod
    def _lift(o) -> Affine:
        return o if isinstance(o, Affine) else Affine({}, o)

    def __add__(self, o):
        o = Affine._lift(o)
        # (the planes in the order they come, not a set's: the code rendered from the form must
        # not depend on the process's string hashing, or each process compiles its own kernel)
        return Affine({p: _plus(self.coef.get(p), o.coef.get(p)) for p in dict.fromkeys([*self.coef, *o.coef])},
                      _plus(self.const, o.const))

    __radd__ = __add__

    def __sub__(self, o):
        return self + o * -1

    def __rsub__(self, o):
        return self * -1 + o

    def __mul__(self, o):
        if isinstance(o, Affine):
            if o.coef and self.coef:
                raise ValueError("not affine in the element planes")
            return o * self.const if not o.coef else self * o.const
        return Affine({p: _times(c, o) for p, c in self.coef.items()}, _times(self.const, o))

    __rmul__ = __mul__


def _plus(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _times(a, b):
    if a is None or b is None:
        return None
    if isinstance(a, (int, float)) and float(a) == 1.0:
        return b
    return a * b


# the dequantization routines: f32 values of the planes at each element in, f32 weights out
# (every product exact, one rounding at most: the module docstring)


def _q4_0(p):
    return p["d"] * (p["q"] - 8)


def _q4_1(p):
    return p["d"] * p["q"] + p["m"]


def _q5_0(p):
    return p["d"] * (p["ql"] + p["qh"] * 16 - 16)


def _q5_1(p):
    return p["d"] * (p["ql"] + p["qh"] * 16) + p["m"]


def _q8_0(p):
    return p["d"] * p["q"]


def _q4_k(p):
    return p["d"] * p["sc"] * p["q"] - p["dmin"] * p["m"]


def _q5_k(p):
    return p["d"] * p["sc"] * (p["ql"] + p["qh"] * 16) - p["dmin"] * p["m"]


def _q6_k(p):
    return p["d"] * p["sc"] * (p["ql"] + p["qh"] * 16 - 32)


def _fp8(p):
    return p["q"] * p["s"]


FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("q4_0", 32, (Plane("q", 4, 1, "u"), Plane("d", 16, 32, "f16")), _q4_0, "Q4_0", 18,
                "4-bit: d * (q - 8) per block of 32"),
    QuantFormat("q4_1", 32, (Plane("q", 4, 1, "u"), Plane("d", 16, 32, "f16"), Plane("m", 16, 32, "f16")), _q4_1,
                "Q4_1", 20, "4-bit with a minimum: d * q + m per block of 32", (("d", "m"),)),
    QuantFormat("q5_0", 32, (Plane("ql", 4, 1, "u"), Plane("qh", 1, 1, "u"), Plane("d", 16, 32, "f16")), _q5_0,
                "Q5_0", 22, "5-bit: d * (q - 16) per block of 32"),
    QuantFormat("q5_1", 32, (Plane("ql", 4, 1, "u"), Plane("qh", 1, 1, "u"), Plane("d", 16, 32, "f16"),
                             Plane("m", 16, 32, "f16")), _q5_1, "Q5_1", 24,
                "5-bit with a minimum: d * q + m per block of 32", (("d", "m"),)),
    QuantFormat("q8_0", 32, (Plane("q", 8, 1, "i"), Plane("d", 16, 32, "f16")), _q8_0, "Q8_0", 34,
                "8-bit: d * q per block of 32"),
    QuantFormat("q4_k", 256, (Plane("q", 4, 1, "u"), Plane("sc", 8, 32, "u"), Plane("m", 8, 32, "u"),
                              Plane("d", 16, 256, "f16"), Plane("dmin", 16, 256, "f16")), _q4_k, "Q4_K", 144,
                "4-bit k-quant: d * sc * q - dmin * m, 6-bit sc and m per 32, d and dmin per 256",
                (("sc", "m"), ("d", "dmin"))),
    QuantFormat("q5_k", 256, (Plane("ql", 4, 1, "u"), Plane("qh", 1, 1, "u"), Plane("sc", 8, 32, "u"),
                              Plane("m", 8, 32, "u"), Plane("d", 16, 256, "f16"), Plane("dmin", 16, 256, "f16")),
                _q5_k, "Q5_K", 176, "5-bit k-quant: d * sc * q - dmin * m, as q4_k with a fifth bit",
                (("sc", "m"), ("d", "dmin"))),
    QuantFormat("q6_k", 256, (Plane("ql", 4, 1, "u"), Plane("qh", 2, 1, "u"), Plane("sc", 8, 16, "i"),
                              Plane("d", 16, 256, "f16")), _q6_k, "Q6_K", 210,
                "6-bit k-quant: d * sc * (q - 32), 8-bit sc per 16, d per 256"),
    QuantFormat("fp8", 16, (Plane("s", 32, 0, "f32"), Plane("q", 8, 1, "e4m3")), _fp8, None, 0,
                "fp8 E4M3 times an f32 scale per row (output channel)"),
)}
#: GGUF's type names (``GGMLQuantizationType``'s) of the formats that come from GGUF files
BY_GGUF = {f.gguf: f for f in FORMATS.values() if f.gguf}


__all__ = ["Affine", "Plane", "QuantFormat", "Symbolic", "FORMATS", "BY_GGUF", "ROW_ALIGN", "round_up"]
