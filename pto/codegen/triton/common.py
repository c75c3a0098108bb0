"""What the Triton code generators share: the options that change the generated code, the
per-task table layout, names and constants, the literals and tile checks, and the file prelude
(imports, constants, integer helpers) every generated file starts with."""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass

import torch

from pto.errors import BuildError
from pto.ir.dtypes import DType
from pto.ir.facts import tile_shape
from pto.ir.nodes import ForRange, IncoreFunction

# Triton's largest block (TRITON_MAX_TENSOR_NUMEL)
MAX_NUMEL = 1 << 20
#: bytes of a cache line: an L2 prefetch asks for one address per line
LINE_BYTES = 128
#: ``_prefetch_l2(ptrs)``: PTX's ``prefetch.global.L2`` of each address of a tensor (the megakernel's
#: prefetch before an item's wait)
PREFETCH_L2 = [
    "@triton.jit",
    "def _prefetch_l2(ptrs):",
    "    # a hint: the line moves into L2 (no register, no fault)",
    "    tl.inline_asm_elementwise(\"prefetch.global.L2 [$1];\\nmov.u32 $0, 0;\", \"=r,l\", [ptrs], dtype=tl.int32,",
    "                              is_pure=False, pack=1)",
]

ALIGN = 16  # columns; ALIGN_<p> promises every region's col0 and width are multiples of this

#: Programmatic dependent launch (``RenderOptions.pdl``; sm_90 and later): the kernel is launched
#: with ``launch_pdl``, so its programs may become resident while the previous launch's last
#: programs run. Each program waits until the previous launch has completed and its memory is
#: visible, before any load or store (but the loads of ``RenderOptions.pre``'s memrefs that may
#: come first), and signals that the next launch may start the same way (a hint; it takes effect once
#: every program of this launch has given it): before its work ("early"), after it ("late"), or
#: right after its wait ("chain": the next launch's programs become resident, and issue their own
#: early loads, while this one works; at most two launches are resident at once). Every kernel of
#: a chain waits, so a launch also follows everything before its predecessor.
PDL_MODES = ("early", "late", "chain")
#: Persistent tile loops (``RenderOptions.persistent``): the batched kernel launches at most one
#: program per multiprocessor, and each loops over the launch's (task, parallel index) pairs in
#: the order the non-persistent grid would run them. "loop": a plain loop; "ws": Triton flattens
#: it with the function's loop and warp-specializes it (``tl.range(..., flatten=True,
#: warp_specialize=True)``; Hopper and later), so that the next tile's first blocks load while
#: the last tile's epilogue runs. On an H100 under Triton 3.6 neither sped up the 7B layer's
#: GEMMs by more than 1% (flattening made the residual projection 60 times slower), and both a
#: plain loop and a flattened one slowed its attention (docs/PERF.md, "Twelfth session"); they
#: are the tuner's to try. With "ws" no load moves above the PDL wait (the wait stays before
#: the loop). "flat": flattened with the function's loop and software-pipelined
#: :data:`FLAT_STAGES` deep (``tl.range(..., num_stages=FLAT_STAGES, flatten=True)``), and taken
#: by every kernel with a parallel axis, the GEMVs included: Triton 3.6 then streams the next
#: tiles' loads through shared memory (``cp.async``) while this one computes, where a
#: multiply-sum's loads are otherwise issued from registers tile by tile (checked by compiling
#: for sm_90: a decode GEMV's loop gets its ``cp.async`` only flattened and with explicit stages).
#: Measured slower on an H200's decode steps (one such program a multiprocessor reads less than
#: the plain grid's eight: the 8B step 5.95 against 4.28 ms; docs/PERF.md, "GEMVs pipelined
#: through shared memory"); the mechanism of the megakernel's runs. "blocks": a kernel with a
#: parallel axis launches a 2-D grid of its tasks by at most :data:`BLOCK_PROGRAMS` programs a
#: multiprocessor, and each program loops over its task's parallel indices itself, the
#: statements that do not depend on the index (a GEMV's x, its norm and, in the compiled code,
#: x's rounding for the integer dots) run once before that loop
#: (:func:`pto.codegen.triton.body.block_invariant`), and each block loads the next block's
#: weights before its own product (:func:`pto.codegen.triton.body.block_weights`; the first
#: block's before the PDL wait). Measured alone on the H200 as hand-written forms of the 8B
#: step's Q4_K gate/up projection (bench/qgemv_forms.py): the loop 29.6-30.7 us against the
#: plain grid's 33.2-34.0, with the next block ahead at :data:`BLOCK_MAXNREG` registers
#: 26.1-26.7 (docs/PERF.md, "fifteenth session"). In the steps (sixteenth session) it pays
#: only for the gate/up pair of 4-bit weights: :data:`BLOCKS_AUTO_FORMATS`.
PERSISTENT_MODES = ("loop", "ws", "flat", "blocks")
#: the weight formats whose gate/up GEMV (two weights read by integer dots in one K step) the
#: backend's "auto" persistent policy runs in "blocks" form (``RenderedKernel.blocks_auto``):
#: measured on an H200 in the steps, PTO_PERSISTENT=blocks against the plain grid, the gate/up
#: kernel a layer on the 8B 28.6 -> 22.8 us (Q4_K), 24.7 -> 18.0 (Q4_0), 26.2 -> 19.3 (Q4_1),
#: on the 1B 15.9 -> 13.4, 14.2 -> 10.2, 15.0 -> 10.7; Q6_K's slower (40.8 -> 67.0 on the 8B),
#: Q8_0's too (29.4 -> 43.0), fp8's and bf16's; every other kernel as fast or slower in "blocks"
#: form (one weight: q/k/v 6.7 -> 6.5 on the 8B, 3.2 -> 4.4 on the 1B; o 4.3 -> 4.8; the down
#: projection's K steps 15.7 -> 16.0; the LM head mixed: the 8B's Q6_K 169 -> 177, Q4_0 103 ->
#: 144, the 1B's Q4_0 54 -> 41; docs/PERF.md, "sixteenth session"); and Q5_K, whose high bits
#: join its 4-bit fields' bytes (the 8B's Q5_K step 2.510 -> 2.307 ms; SmolLM2's Q5_0 and Q5_1
#: steps 0.455 -> 0.467 and 0.469 -> 0.456, within their noise, so left out; docs/PERF.md,
#: "Twenty-third session")
BLOCKS_AUTO_FORMATS = frozenset({"q4_0", "q4_1", "q4_k", "q5_k"})
#: ... and only where a program of the launch takes this many of the task's blocks or more (the
#: extent known when rendered): the gains above at 3.9 and 6.8 blocks a program (the 1B's and
#: the 8B's gate/up on 528 programs); a loop of one block hoists nothing
BLOCKS_AUTO_MIN = 2
#: ("blocks") the programs a multiprocessor a kernel launches and the registers a thread it is
#: compiled to at most on a GPU (unless its launch settings say): the loop form's best, 512
#: programs on 132 multiprocessors at 128 registers with the next block's weights in registers
#: (bench/qgemv_forms.py, "loop 512/1 ahead maxnreg 128": 26.1-26.7 us against 33.2-34.0)
BLOCK_PROGRAMS = 4
BLOCK_MAXNREG = 128
#: the pipelining depth of a "flat" persistent loop (Triton's default depth)
FLAT_STAGES = 3
#: How a GEMV's product reads quantized weights (``RenderOptions.qgemv``): "units" (a tile's
#: ``[BR, BC / U]`` integers, the scales loaded per unit, the sums reduced every K step:
#: :mod:`pto.codegen.triton.quant`) or "groups" (each thread a row's whole groups of 16 bytes,
#: every scale loaded once per group, float products: :mod:`pto.codegen.triton.quant_groups`);
#: "int8", "int16": by groups, with x rounded to integers of that many bits per group and the
#: products integer dots where the format's values are planes of 2-, 4- or 8-bit integers in
#: words (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K: :func:`pto.codegen.triton.quant_groups.render_dot_int`),
#: fp8's products as half dots (x as f16 per group, f16x2 fused multiply-adds of the e4m3 bytes:
#: :func:`pto.codegen.triton.quant_groups.render_dot_half`), the other formats (Q5_0, Q5_1, Q5_K) by
#: groups; or "auto": int16 for :data:`QGEMV_INT_AUTO` (16-bit x rounds a group's larger values
#: finer than bf16), half dots for fp8, groups for the 5-bit formats. Measured on an H200, the Llama-3-8B
#: step: Q4_K 4.89 -> 3.48 ms by groups (2.71 in the quantized tiles), 2.36 by int16 dots, 2.29
#: by int8; Q8_0 5.71 -> 4.01 -> 3.27 -> 2.62 (int16), 2.58 (int8); Q6_K 4.02 -> 3.00 (int16);
#: fp8 3.16 by units against 3.65 by groups (2.61 against 2.77 in the quantized tiles of
#: :data:`pto.orchestration.model.program.QUANT_WIDE`), 2.48 by half dots against 2.61 by units
#: in one call; docs/PERF.md.
QGEMV_MODES = ("auto", "units", "groups", "int8", "int16")
#: the bits of x of the modes whose GEMVs take integer dots ("auto": for :data:`QGEMV_INT_AUTO`)
INT_DOT_BITS = {"int8": 8, "int16": 16, "auto": 16}
#: the formats "auto" takes as integer dots: those measured faster so on an H200 (every format
#: that allows them: Q6_K's since 2026-11-30, the 8B step with Q6_K weights 4.02 -> 3.00 ms; the
#: 5-bit formats' since 2026-12-01, the 8B's Q5_K step 3.77 -> 3.18 ms, SmolLM2's Q5_0 0.588 -> 0.500)
QGEMV_INT_AUTO = frozenset({"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"})


#: the most rows of x a GEMV's product reads quantized weights by groups for (a few sequences'
#: decode step: each thread's weights unpacked once for every row, an integer or half dot a row;
#: more rows take the values and a tensor-core dot)
GROUPED_ROWS = 8


def reads_by_groups(mode: str) -> bool:
    """Does a GEMV's product read quantized tiles by groups under ``RenderOptions.qgemv``
    ``mode`` (every mode but "units" and "", the renderer's default)."""
    return mode == "groups" or mode in INT_DOT_BITS
PDL_WAIT, PDL_SIGNAL = "_gdc_wait()", "_gdc_launch_dependents()"
PDL_IMPORTS = "from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents\n" \
              "from triton.language.extra.cuda import gdc_wait as _gdc_wait\n"

TL_DTYPE = {DType.F32: "tl.float32", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16"}
TL_PTR = {DType.F32: "*fp32", DType.F16: "*fp16", DType.BF16: "*bf16"}
for _q in DType:  # a quantized tensor's buffer: rows of bytes (pto.codegen.triton.quant reads them)
    if _q.is_quantized:
        TL_DTYPE[_q], TL_PTR[_q] = "tl.uint8", "*u8"


@dataclass(frozen=True)
class RenderOptions:
    """Choices that change the generated code (part of the cache key).

    ``input_precision``: ``tl.dot`` precision for f32 operands ("ieee" matches the f32
    reference; "tf32" / "tf32x3" trade accuracy for tensor-core speed on the GPU).
    ``dot_min``: smallest M, N and K (of the blocks, padded dims rounded up to powers of two)
    that use ``tl.dot`` (Triton needs 16); below, an exact f32 broadcast-multiply-sum.
    ``ieee_math``: correctly rounded division and square root (``div_rn``/``sqrt_rn``, as torch
    computes them) instead of the faster approximations.
    ``pdl``: programmatic dependent launch (sm_90 and later, compiled kernels only; "" off): the
    batched kernel waits for the previous launch's memory before its first access and lets the
    next launch's programs start, "early" (before its own work), "late" (after it) or "chain"
    (right after its wait) (:func:`pto.codegen.triton.kernel.render`).
    ``pre``: with ``pdl``, memrefs the function only reads that the previous launch does not
    write (weights, a residual, a position; ``TaskBatch.readonly``): the loads of them that may
    come before the body's first other access run before the wait, so that they overlap the
    previous launch (:data:`PDL_MODES`, :func:`pto.codegen.triton.body.early_loads`).
    ``tma``: the batched kernels may load the tiles that feed matrix products through tensor
    descriptors (TMA, sm_90 and later; :mod:`pto.codegen.triton.tma`).
    ``persistent``: the batched kernel's persistent tile loop (:data:`PERSISTENT_MODES`; "" off);
    a launch setting a schedule may switch (the arithmetic is the same).
    ``qgemv``: how a GEMV's product reads quantized weights (:data:`QGEMV_MODES`; "": the
    backend's choice, :func:`pto.backends.triton.modes.qgemv_mode`, "units" where rendered
    directly); a tile that is not whole groups of its format takes "units".
    ``qgemv_warps``: the fewest warps a program of a GEMV that reads by groups takes (a power
    of two up to 8; 0: the backend's, :func:`pto.backends.triton.modes.qgemv_warps`); the rule
    gives a warp per 1,024 columns and per 8 rows past the first 8 (measured on the 8B model's
    shapes), which leaves a small model's normalizing GEMVs (SmolLM2's 576 columns, 4 rows) one
    warp a program where its bf16 ones run four, and four to a plain one (one row of x, no norm:
    the o and down projections; :func:`pto.codegen.triton.kernel.grouped_warps`).
    ``qgemv_warps_by``: per InCore function (its generic name), the fewest warps in place of
    ``qgemv_warps`` (empty: the backend's, :func:`pto.backends.triton.modes.qgemv_warps_by`).
    ``qgemv_cols``: the columns of a K step a warp of such a GEMV takes (1,024, 2,048 or 4,096;
    0: the backend's, :func:`pto.backends.triton.modes.qgemv_cols`, 1,024 rendered directly):
    the rule's warp per 1,024 columns, each thread a group of a row, becomes a warp per
    ``qgemv_cols``, each thread ``qgemv_cols / 1024`` groups.
    ``qscales``: how a tile load read by units takes a scale plane whose group spans four units
    or more: "groups" (a value a group, broadcast to its units) or "units" (a value a unit; the
    same values); "" the backend's (:func:`pto.backends.triton.modes.qscales_mode`), "groups"
    rendered directly.
    ``run_loop``: how a megakernel item renders its run of consecutive parallel indices
    (:attr:`pto.codegen.triton.body.BodyRenderer.run_blocks`): "blocks" as the loop over blocks
    (the statements of no index once, the next index's weights loaded ahead in registers),
    "steps" as that loop with each K loop's next step's weights loaded ahead too (past an index's
    last step the next index's first; at one pipeline stage only); "flat" the whole body each
    index in one flattened, pipelined loop; "" or "auto" the megakernel's choice by its GEMVs
    (:func:`pto.backends.triton.megakernel.run_loop_of`), rendered directly flat.
    ``k_ahead``: "on": a batched kernel's K loops of a quantized GEMV (constant bounds, two
    steps or more, no store) load their next step's read-only tiles (weights, x) ahead in
    registers while this one computes, at one pipeline stage, the first step's weights before the
    PDL wait where the loop is the body's first access to memory the launch before may write
    (:meth:`pto.codegen.triton.body.BodyRenderer._plan_k_ahead`); "first": such a loop's first step
    peeled off it, its weights loaded before the PDL wait, no step carried in registers
    (:meth:`~pto.codegen.triton.body.BodyRenderer._peel_first`); "off", "" or "auto" not ("auto"
    is the backend's to decide per function: :func:`pto.backends.triton.modes.k_ahead_mode`).
    ``asm``: helpers may be inline PTX (kernels compiled for an NVIDIA GPU; the interpreter runs
    the same arithmetic in Triton's operations: :func:`pto.codegen.triton.quant_groups.render_int_dots`).
    ``prefetch_bytes``: the most bytes a megakernel item prefetches into L2 before its wait
    (:meth:`pto.codegen.triton.body.BodyRenderer.prefetch`, ``run_prefetch``): by default enough
    for the first trips of a K loop (a decode GEMV item's whole weight block), not a prefill
    GEMM's whole panel (which would evict what other programs use).
    """

    input_precision: str = "ieee"
    dot_min: int = 16
    ieee_math: bool = True
    pdl: str = ""
    tma: bool = False
    pre: tuple[str, ...] = ()
    persistent: str = ""
    qgemv: str = ""
    qgemv_warps: int = 0
    qgemv_warps_by: tuple[tuple[str, int], ...] = ()
    qgemv_cols: int = 0
    qscales: str = ""
    run_loop: str = ""
    k_ahead: str = ""
    asm: bool = False
    prefetch_bytes: int = 64 * 1024


@dataclass(frozen=True)
class TableLayout:
    """Columns of the per-task table: ``row0, col0, rows, cols`` per memref, then scalars."""

    memrefs: tuple[str, ...]
    scalars: tuple[str, ...]

    FIELDS = ("r0", "c0", "rows", "cols")

    @property
    def width(self) -> int:
        return 4 * len(self.memrefs) + len(self.scalars)

    def column(self, name: str, fld: str | None = None) -> int:
        """Column of memref ``name``'s field (one of FIELDS) or of scalar ``name``."""
        if fld is None:
            return 4 * len(self.memrefs) + self.scalars.index(name)
        return 4 * self.memrefs.index(name) + self.FIELDS.index(fld)


def block(n: int) -> int:
    """The Triton block dim that holds a tile dim of ``n``: the next power of two (Triton's
    blocks have power-of-two dims); the lanes past ``n`` are padding (see the body's docstring)."""
    return 1 << (n - 1).bit_length()


def block_shape(shape: tuple[int, int]) -> tuple[int, int]:
    """The block of a tile of logical ``shape`` (rows, cols)."""
    return block(shape[0]), block(shape[1])


def float_literal(v: float, dtype: DType = DType.F32, as_tensor: bool = True) -> str:
    """Source of ``v`` rounded to ``dtype`` (exact in f32, so Triton's fp32 constant keeps it).

    Triton types a Python float outside the normal f32 range as fp64, so f32 subnormals become
    a 1x1 f32 block when ``as_tensor`` (they broadcast like a scalar) and infinities and NaN
    the constexpr globals of the kernel file.
    """
    v = float(torch.tensor(float(v), dtype=dtype.torch).item())
    if math.isnan(v):
        # computed, not a global: Triton re-checks globals at every launch, and nan != nan
        return NAN_SOURCE
    if math.isinf(v):
        return "_INF" if v > 0 else "_NEG_INF"
    if v != 0.0 and abs(v) < 2.0 ** -126 and as_tensor:
        return f"tl.full((1, 1), {v!r}, tl.float32)"
    return repr(v)


NAN_SOURCE = "(_INF - _INF)"
_FILE_NAMES = frozenset({"triton", "tl", "_INF", "_NEG_INF", "_floordiv", "_floormod"})



def check_tiles(fn: IncoreFunction) -> dict[str, tuple[int, int]]:
    """Concrete (logical) tile shapes; BuildError naming the function and tile for one whose
    block (:func:`block_shape`: each dim rounded up to a power of two) has more than 2**20
    elements, which Triton cannot hold."""
    dims = dict(fn.variant)
    shapes = {}
    for t in fn.tiles:
        r, c = tile_shape(t, dims)
        br, bc = block_shape((r, c))
        if br * bc > MAX_NUMEL:
            size = f"{r}x{c} = {r * c} elements" if (br, bc) == (r, c) else \
                f"{r}x{c}, held as a {br}x{bc} block of {br * bc} elements"
            raise BuildError(f"`{fn.variant_name}`: tile `{t.name}` is {size}; a Triton block holds at most "
                             f"{MAX_NUMEL}")
        shapes[t.name] = (r, c)
    return shapes


def kernel_name(fn: IncoreFunction) -> str:
    """The kernel's Python name: the variant name (what profilers show), unless it would clash
    with a keyword or a name of the generated file."""
    name = fn.variant_name
    return f"k_{name}" if keyword.iskeyword(name) or name in _FILE_NAMES else name


def device_name(fn: IncoreFunction) -> str:
    """The device function's name (``d_`` + the variant name)."""
    return f"d_{fn.variant_name}"

def _loops(body):
    for s in body:
        if isinstance(s, ForRange):
            yield s
            yield from _loops(s.body)


_PRELUDE = '''\
import triton
import triton.language as tl

_INF = tl.constexpr(float("inf"))
_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _floordiv(a, b):
    # Python's floor division from Triton's truncating one
    q = a // b
    return q - ((q * b != a) & ((a < 0) != (b < 0))).to(q.dtype)


@triton.jit
def _floormod(a, b):
    # Python's modulo (the sign of b) from Triton's truncating remainder
    r = a % b
    return r + b * ((r != 0) & ((r < 0) != (b < 0))).to(r.dtype)

'''


def file_source(title: str, functions: list[list[str]], imports: str = "") -> str:
    """A generated Triton file: a two-line title, the prelude (imports, constants, integer
    helpers), ``imports`` (lines) and the given ``@triton.jit`` functions (each a list of lines)."""
    return (f"# {title}\n# Do not edit: regenerate with `pto codegen`. Contracts: see pto/codegen/triton/.\n"
            + _PRELUDE + imports + "\n" + "\n\n\n".join("\n".join(f) for f in functions) + "\n")
