"""Every tile op rendered to C (pto/codegen/c_incore.py) against the reference tile evaluator, on
seeded random inputs and on the values that break conversions (ties, subnormals, overflow, NaN,
infinities, signed zeros).

All cases compile into one kernel module (one compiler run, cached by content), each runs as a
task on the same inputs as the evaluator. What must agree, from the arithmetic:

- bit for bit (NaN positions equal, +0 == -0: torch itself gives either sign on ties of max,
  by the code path an element takes): everything computed in f32 with one rounding per op
  (elementwise, tile-scalar, broadcast, sqrt, rsqrt, recip, neg, abs, relu, max/min reductions,
  argmax, masks, fills, casts, deinterleave), loads, stores, pads and masks at region edges;
- within one unit in the last place of the destination's dtype: exp, exp2, log and silu (both
  round a double-precision value; ours is within 2 ulp of a double, the evaluator's torch's);
- within the bound of two summation orders: a sum of n f32 terms is within (n - 1) u sum|x| of
  the exact sum (u = 2^-24), so two orders differ by at most 2 (n - 1) u sum|x|, plus one unit of
  the destination's rounding; a matrix product the same with n = K over |a| @ |b|.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from pto import InCore
from pto.backends.c.backend import region_table
from pto.backends.c.build import kernel_module
from pto.codegen.c_incore import render_incore
from pto.data.batch import RegionBatch, TaskBatch
from pto.errors import BuildError
from pto.evaluator.machine import run_incore_batch
from pto.ir.analysis import param_access
from pto.ir.dtypes import DType
from pto.ir.nodes import walk_instrs
from pto.ir.ops import Op
from pto.runtime import runtime_include_dir

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
R, C = 8, 24
U = 2.0 ** -24


@dataclass
class Case:
    """One InCore function, its inputs (memref -> tensor, region = the whole tensor unless
    ``regions`` says otherwise) and how its outputs compare."""

    fn: object
    inputs: object  # rng -> {memref: tensor}
    compare: str = "exact"  # exact | ulp | sum | matmul
    scalars: dict = field(default_factory=dict)
    regions: dict = field(default_factory=dict)  # memref -> (row0, col0, rows, cols)
    bound: object = None  # rng inputs -> per-element bound (sum, matmul)


CASES: dict[str, Case] = {}


def rand(shape, dtype: DType, rng, positive=False, away=False, scale=1.0):
    x = rng.standard_normal(shape) * scale
    if positive:
        x = np.abs(x) + 0.1
    if away:
        x = np.sign(x) * (np.abs(x) + 0.5)
    return torch.tensor(x, dtype=torch.float32).to(dtype.torch)


SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-40, 3.4e38, -3.4e38, 1.0, -1.0, 0.5,
            65504.0, 65520.0, 1e-8, 88.72, 88.73, -103.9, -104.0, 709.5, -745.0, 1 + 2 ** -8, 1 + 3 * 2 ** -9]


def specials(shape, dtype: DType, rng):
    """The values above (ties of bf16 and f16 rounding, subnormals, overflow) and random ones."""
    x = rand(shape, F32, rng, scale=4.0).reshape(-1)
    n = min(len(SPECIALS), x.numel())
    x[:n] = torch.tensor(SPECIALS[:n])
    return x.reshape(shape).to(dtype.torch)


def one_op(name: str, op: str, dst_shape, srcs, dst_dtype: DType, args=(), compare="exact", bound=None,
           init=False, **attrs):
    """``op d, *srcs, *args`` with each source tile loaded from its own memref (``srcs``: (shape,
    dtype, input maker)), d stored to ``out`` (loaded from it first where ``init``)."""
    k = InCore(name)
    tiles, makers = [], {}
    for i, (shape, dt, make) in enumerate(srcs):
        m = k.memref(f"in{i}", dt)
        t = k.tile(f"a{i}", shape[0], shape[1], dt)
        k.load(t, m, 0, 0)
        tiles.append(t)
        makers[f"in{i}"] = make
    out = k.memref("out", dst_dtype)
    d = k.tile("d", dst_shape[0], dst_shape[1], dst_dtype)
    if init:
        k.load(d, out, 0, 0)
    getattr(k, op)(d, *tiles, *args, **attrs)
    k.store(out, 0, 0, d)

    def inputs(rng):
        got = {name: make(rng) for name, make in makers.items()}
        got["out"] = rand(dst_shape, dst_dtype, rng) if init else torch.full(dst_shape, math.nan).to(dst_dtype.torch)
        return got

    CASES[name] = Case(k.build(), inputs, compare, bound=bound)


def src(shape, dtype, **kw):
    return shape, dtype, lambda rng: rand(shape, dtype, rng, **kw)


# elementwise, tile-scalar, unary, broadcast ------------------------------------------------------

for _dt in (F32, BF16, F16):
    for _op in ("add", "sub", "mul", "div", "max", "min"):
        one_op(f"b_{_op}_{_dt}", _op, (R, C), [src((R, C), _dt), src((R, C), _dt, away=_op == "div")], _dt)
        one_op(f"s_{_op}_{_dt}", _op + "s", (R, C), [src((R, C), _dt)], _dt, args=(0.3 if _op != "div" else -1.7,))
for _op in ("add", "mul", "max"):  # specials on both sides (NaN propagation, infinities, signed zeros)
    one_op(f"b_{_op}_specials", _op, (R, C), [((R, C), F32, lambda rng: specials((R, C), F32, rng)),
                                              ((R, C), F32, lambda rng: specials((R, C), F32, rng).flip(1))], F32)

UNARY_EXACT = ("recip", "neg", "abs", "relu")
#: torch's f32 sqrt on the CPU is not always correctly rounded (sqrt(65504) is 255.9375 there,
#: 255.93748 correctly rounded, as C's sqrtf gives it)
UNARY_ROUNDED = ("exp", "exp2", "log", "silu", "sqrt", "rsqrt")
for _dt in (F32, BF16):
    for _op in UNARY_EXACT + UNARY_ROUNDED:
        one_op(f"u_{_op}_{_dt}", _op, (R, C), [src((R, C), _dt, positive=_op in ("log", "sqrt", "rsqrt"),
                                                    scale=1.0 if _op != "exp" else 8.0)], _dt,
               compare="exact" if _op in UNARY_EXACT else "ulp")
for _op in UNARY_EXACT + UNARY_ROUNDED:
    one_op(f"u_{_op}_specials", _op, (R, C), [((R, C), F32, lambda rng: specials((R, C), F32, rng))], F32,
           compare="exact" if _op in UNARY_EXACT else "ulp")

for _dt in (F32, BF16):
    for _axis, _vshape in (("row", (R, 1)), ("col", (1, C))):
        for _op in ("", "add", "sub", "mul", "div"):
            _srcs = [src(_vshape, _dt, away=_op == "div")] if not _op else \
                [src((R, C), _dt), src(_vshape, _dt, away=_op == "div")]
            one_op(f"x_{_axis}{_op}_{_dt}", f"{_axis}expand{_op}", (R, C), _srcs, _dt)

# reductions ---------------------------------------------------------------------------------------


def sum_bound(axis: int):
    def bound(ins):
        a = ins["in0"].double().abs()
        n = a.shape[axis]
        return 2 * (n - 1) * U * a.sum(dim=axis, keepdim=True)
    return bound


for _dt in (F32, BF16):
    for _kind in ("sum", "max", "min"):
        one_op(f"r_row{_kind}_{_dt}", f"row{_kind}", (R, 1), [src((R, 40), _dt)], F32,
               compare="sum" if _kind == "sum" else "exact", bound=sum_bound(1))
        one_op(f"r_col{_kind}_{_dt}", f"col{_kind}", (1, 40), [src((R, 40), _dt)], F32,
               compare="sum" if _kind == "sum" else "exact", bound=sum_bound(0))
one_op("r_rowsum_bf16dst", "rowsum", (R, 1), [src((R, 40), F32)], BF16, compare="sum", bound=sum_bound(1))
one_op("r_rowmax_specials", "rowmax", (R, 1), [((R, C), F32, lambda rng: specials((R, C), F32, rng))], F32)
one_op("r_rowargmax", "rowargmax", (R, 1), [src((R, 200), F32)], F32)
one_op("r_rowargmax_ties", "rowargmax", (R, 1), [((R, C), F32, lambda rng: torch.tensor(
    rng.integers(0, 3, (R, C)), dtype=torch.float32))], F32)
one_op("r_rowargmax_nan", "rowargmax", (R, 1), [((R, C), F32, lambda rng: specials((R, C), F32, rng))], F32)
one_op("r_rowtakemax", "rowtakemax", (R, 1), [src((R, 50), F32), src((R, 50), BF16)], F32)

# matrix products ------------------------------------------------------------------------------------


def matmul_bound(ta, tb, init, dtype=F32):
    """Two f32 summation orders of K products; a half-precision destination (or accumulation)
    may round the two one unit apart, twice where the product is rounded before it is added."""
    def bound(ins):
        a, b = ins["in0"].double().abs(), ins["in1"].double().abs()
        a = a.T if ta else a
        b = b.T if tb else b
        k = a.shape[1]
        mag = a @ b + (ins["out"].double().abs() if init else 0)
        out = 2 * k * U * mag
        return out if dtype is F32 else out + 2 * ulp(mag, dtype.torch)
    return bound


# (a GEMV's rows, b transposed: 1 to 16 rows take dot products, each row of b read once for all of
# them, in blocks of rows and of 4 columns with the rest apart; 20 rows pack b: pto_tile.h)
for _m, _k, _n in ((8, 24, 40), (9, 33, 17), (16, 32, 64), (1, 70, 5), (2, 70, 9), (3, 33, 17), (20, 24, 12)):
    for _ta in (False, True):
        for _tb in (False, True):
            for _acc in ("matmul", "matmul_acc"):
                a_shape = (_k, _m) if _ta else (_m, _k)
                b_shape = (_n, _k) if _tb else (_k, _n)
                one_op(f"m_{_acc}_{_m}x{_k}x{_n}_{int(_ta)}{int(_tb)}", _acc, (_m, _n),
                       [src(a_shape, F32), src(b_shape, F32)], F32, compare="matmul",
                       bound=matmul_bound(_ta, _tb, _acc == "matmul_acc"), init=_acc == "matmul_acc", ta=_ta, tb=_tb)
for _dt, _acc in ((F16, "f16"), (F16, "f32"), (BF16, "f32")):
    for _op in ("matmul", "matmul_acc"):
        one_op(f"m_{_op}_{_dt}_acc{_acc}", _op, (8, 16), [src((8, 24), _dt), src((24, 16), _dt)], _dt,
               compare="matmul", bound=matmul_bound(False, False, _op == "matmul_acc", _dt), init=_op == "matmul_acc",
               acc=_acc)

# casts, fills, masks, layout -----------------------------------------------------------------------

for _s in (F32, BF16, F16):
    for _d in (F32, BF16, F16):
        one_op(f"c_cast_{_s}_{_d}", "cast", (R, C), [((R, C), _s, lambda rng, s=_s: specials((R, C), s, rng))], _d)
    one_op(f"c_mov_{_s}", "mov", (R, C), [src((R, C), _s)], _s)
for _d in (F32, BF16, F16):
    for _i, _v in enumerate((0.1, -math.inf, 1e-40, 70000.0, -0.0)):
        one_op(f"f_full{_i}_{_d}", "full", (R, C), [], _d, args=(_v,))
for _d in (F32, BF16):
    for _diag in (-3, 0, 5):
        one_op(f"k_causal{_diag + 3}_{_d}", "mask_causal", (R, C), [src((R, C), _d)], _d, args=(_diag,))
    one_op(f"k_cols_{_d}", "mask_cols", (R, C), [src((R, C), _d)], _d, args=(5,), fill=-7.0)
    one_op(f"k_rows_{_d}", "mask_rows", (R, C), [src((R, C), _d)], _d, args=(3,))
for _part in (0, 1):
    one_op(f"l_deinterleave{_part}", "deinterleave", (R, C), [src((R, 2 * C), F32)], BF16, part=_part)


# memory, loops, the parallel axis, scalars ---------------------------------------------------------


def structured(name: str, compare="exact", scalars=None, regions=None, bound=None):
    """Register the InCore function ``build(k)`` makes; it returns the inputs' maker."""
    def register(build):
        k = InCore(name)
        inputs = build(k)
        CASES[name] = Case(k.build(), inputs, compare, dict(scalars or {}), dict(regions or {}), bound)
        return build
    return register


@structured("e_edges", regions={"x": (1, 2, 5, 13), "y": (2, 3, 6, 11)})
def _edges(k):
    """A tile overhanging its region (pad) stored into another overhanging region (skipped)."""
    x, y = k.memref("x", F32), k.memref("y", F32)
    t = k.tile("t", R, C, F32)
    k.load(t, x, 0, 0, pad=-1.0)
    k.store(y, 0, 0, t)
    return lambda rng: {"x": rand((10, 30), F32, rng), "y": rand((12, 30), F32, rng)}


@structured("e_offsets", regions={"x": (2, 3, 6, 20), "y": (1, 1, 9, 20)})
def _offsets(k):
    """Loads past the region's end (pad), stores past it (skipped)."""
    x, y = k.memref("x", BF16, shape=(6, 20)), k.memref("y", F16, shape=(9, 20))
    a, b = k.tile("a", 4, 8, BF16), k.tile("b", 4, 8, BF16)
    c = k.tile("c", 4, 8, F16)
    k.load(a, x, 4, 5, pad=7.5)
    k.load(b, x, 3, 14, pad=-2.0)
    k.add(c, b, a)
    k.store(y, 7, 2, c)
    k.cast(c, a)
    k.store(y, 6, 15, c)
    return lambda rng: {"x": rand((10, 30), BF16, rng), "y": rand((12, 30), F16, rng)}


@structured("e_strided", regions={"x": (1, 0, 8, C)})
def _strided(k):
    """Every third row of the region, the last ones past it (pad)."""
    x, y = k.memref("x", F32, shape=(10, C)), k.memref("y", F32)
    t = k.tile("t", 4, C, F32)
    k.load(t, x, 0, 0, step=3, pad=0.5)
    k.store(y, 0, 0, t)
    return lambda rng: {"x": rand((12, C), F32, rng), "y": torch.full((4, C), math.nan)}


def _views_bound(ins):
    x, w = ins["x"].double().abs(), ins["w"].double().abs()
    return 2 * 64 * U * (x[:16, :64] @ torch.nn.functional.pad(w[:64, :30], (0, 2)))


@structured("e_views", compare="matmul", regions={"w": (0, 0, 64, 30)}, bound=_views_bound)
def _views(k):
    """Products of loads inside their regions (read where they are) and of loads that overhang
    (w's last columns: copied with the pad), in a K loop."""
    x, w, y = k.memref("x", F32), k.memref("w", F32, shape=(64, 32)), k.memref("y", F32)
    a, b, acc = k.tile("a", 16, 16, F32), k.tile("b", 16, 32, F32), k.tile("acc", 16, 32, F32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, 64, 16) as kk:
        k.load(a, x, 0, kk)
        k.load(b, w, kk, 0)
        k.matmul_acc(acc, a, b)
    k.store(y, 0, 0, acc)
    return lambda rng: {"x": rand((16, 64), F32, rng), "w": rand((64, 40), F32, rng),
                        "y": torch.full((16, 32), math.nan)}


@structured("e_halves")
def _halves(k):
    """Half-precision memory in and out, products rounded to each destination."""
    x, h, y = k.memref("x", BF16), k.memref("h", BF16), k.memref("y", F16)
    a, b, c = k.tile("a", R, C, BF16), k.tile("b", R, C, BF16), k.tile("c", R, C, F16)
    k.load(a, x, 0, 0)
    k.load(b, h, 0, 0)
    k.mul(c, a, b)
    k.store(y, 0, 0, c)
    k.cast(b, c)
    k.store(h, 0, 0, b)
    return lambda rng: {"x": specials((R, C), BF16, rng), "h": rand((R, C), BF16, rng, scale=100.0),
                        "y": torch.full((R, C), math.nan, dtype=torch.float16)}


@structured("e_store_add", regions={"y": (1, 2, 6, 20)})
def _store_add(k):
    """A parallel axis of 3 adding tiles into one region (each element's adds in order: the
    reference's), the tile overhanging the region's last row and its columns past 20."""
    x, y = k.memref("x", F32), k.memref("y", F32)
    j = k.parallel("j", 3)
    t = k.tile("t", 4, C, F32)
    k.load(t, x, j * 4, 0)
    k.store_add(y, 3, 0, t)
    return lambda rng: {"x": rand((12, C), F32, rng), "y": rand((8, C + 4), F32, rng)}


@structured("e_scalar_load", scalars={"n": 3})
def _scalar_load(k):
    """A position read from memory (load_scalar) places a load and bounds a loop; a scalar
    parameter scales a tile (tile-scalar with an integer expression)."""
    pos, tab, y = k.memref("pos", F32, shape=(1, 2)), k.memref("tab", F32, shape=(8, C)), k.memref("y", F32)
    n = k.scalar("n")
    t, acc = k.tile("t", 1, C, F32), k.tile("acc", 1, C, F32)
    p = k.load_scalar("p", pos, 0, 0)
    k.full(acc, 0.0)
    with k.for_range("i", 0, p + 1) as i:
        k.load(t, tab, p - i, 0)
        k.add(acc, acc, t)
    k.muls(acc, acc, n * 2 - 1)
    k.store(y, 0, 0, acc)
    return lambda rng: {"pos": torch.tensor([[4.0, 99.0]]), "tab": rand((8, C), F32, rng),
                        "y": torch.full((1, C), math.nan)}


for _st in (3, -1):
    @structured(f"e_loops_step{_st + 1}", scalars={"st": _st, "lo": 0 if _st > 0 else 5, "hi": 7 if _st > 0 else 3,
                                                   "nb": 3},
                regions={"x": (0, 0, 6, 44)})
    def _loops(k):
        """A parallel axis over column blocks (a scalar extent), a loop whose bounds and step
        are scalars (the evaluator's trip count for a negative step), a tile
        read before it is written (NaN) and the region's extent in a mask."""
        x, y = k.memref("x", F32, shape=(8, 48)), k.memref("y", F32, shape=(8, 48))
        st, lo, hi, nb = k.scalar("st"), k.scalar("lo"), k.scalar("hi"), k.scalar("nb")
        t, acc, u = k.tile("t", 8, 16, F32), k.tile("acc", 8, 16, F32), k.tile("u", 8, 16, F32)
        j = k.parallel("j", nb)
        k.full(acc, 1.0)
        with k.for_range("r", lo, hi, st) as r:
            k.load(t, x, r - lo, j * 16, pad=0.25)
            k.add(acc, acc, t)
        k.mask_rows(acc, acc, x.rows, fill=-3.0)
        k.add(u, u, acc)  # u read before written: NaN, as the evaluator's
        k.store(y, 0, j * 16, acc)
        k.store(y, 4, j * 16, u)
        return lambda rng: {"x": rand((8, 48), F32, rng), "y": rand((8, 48), F32, rng)}


def _bits(dtype: DType, rng) -> torch.Tensor:
    """Every f16 bit pattern, or as many random f32 bit patterns (NaN among them)."""
    if dtype is F16:
        return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(256, 256)
    return torch.tensor(rng.integers(-2**31, 2**31, (256, 256)), dtype=torch.int32).view(torch.float32)


for _s in (F16, F32):
    @structured(f"c_all_{_s}")
    def _all_bits(k, s=_s):
        """Conversions of every f16 value (and of 65,536 random f32 bit patterns) to the other
        dtypes and back, as the evaluator's (torch's) conversions give them."""
        x = k.memref("x", s)
        outs = {d: k.memref(f"y_{d}", d) for d in (F32, BF16, F16)}
        t = k.tile("t", 256, 256, s)
        k.load(t, x, 0, 0)
        for d, m in outs.items():
            u = k.tile(f"u_{d}", 256, 256, d)
            k.cast(u, t)
            k.store(m, 0, 0, u)
        return lambda rng: {"x": _bits(s, rng), **{f"y_{d}": torch.zeros(256, 256, dtype=d.torch) for d in outs}}


def is_slow(name: str) -> bool:
    """The fast suite keeps every op at least once in f32, the specials, every cast, the half
    products, two matmul shapes and the products against a transposed b of 2, 3, 16 and 20 rows;
    the other dtypes and shapes compile into a second module (slow: the compiler takes tens of
    seconds over all of them)."""
    family, _, rest = name.partition("_")
    if family in ("b", "s", "u", "x", "r", "f", "k"):
        return rest.endswith(("_bf16", "_f16")) and not rest.startswith(("full2", "full3"))
    if family == "m":
        gemv = rest.endswith("_01") and rest.split("_")[-2] in ("2x70x9", "3x33x17", "16x32x64", "20x24x12")
        return not (gemv or "8x24x40" in rest or ("9x33x17" in rest and rest.endswith("11")))
    return False


FAST = sorted(n for n in CASES if not is_slow(n))
SLOW = sorted(n for n in CASES if is_slow(n))


@pytest.fixture(scope="module")
def fast_kernels():
    return kernel_module([CASES[n].fn for n in FAST], "optests")


@pytest.fixture(scope="module")
def slow_kernels():
    return kernel_module([CASES[n].fn for n in SLOW], "optests_slow")


def run_c(km, k: int, fn, tensors, scalars, regions):
    n = 1
    mems = {}
    for p in fn.memrefs:
        t = tensors[p.name]
        r0, c0, nr, nc = regions.get(p.name, (0, 0, *t.shape))
        mems[p.name] = RegionBatch(t, *(torch.tensor([v]) for v in (r0, c0, nr, nc)))
    batch = TaskBatch(fn, mems, {s: torch.tensor([v]) for s, v in scalars.items()}, n)
    table = region_table(batch)
    sc = np.array([[scalars[p.name] for p in fn.scalars] or [0]], np.int64)
    ffi = km.module.ffi
    assert km.run(k, ffi.from_buffer("pto_region[]", table), ffi.from_buffer("int64_t[]", sc), n) == 0


def run_ref(fn, tensors, scalars, regions):
    mems = {}
    for p in fn.memrefs:
        t = tensors[p.name]
        r0, c0, nr, nc = regions.get(p.name, (0, 0, *t.shape))
        mems[p.name] = RegionBatch(t, *(torch.tensor([v]) for v in (r0, c0, nr, nc)))
    run_incore_batch(fn, mems, {s: torch.tensor([v]) for s, v in scalars.items()}, 1)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str):
    g, w = got.double(), want.double()
    assert torch.equal(g.isnan(), w.isnan()), f"{what}: NaN at other places"
    ok = g.isnan() | (g == w)
    assert bool(ok.all()), f"{what}: {int((~ok).sum())} differ, e.g. {g[~ok][:4].tolist()} != {w[~ok][:4].tolist()}"


MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def ulp(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """One unit in the last place of each value of ``t`` in ``dtype`` (its own by default;
    subnormal spacing near 0)."""
    dtype = dtype or t.dtype
    a = t.double().abs().clamp(min=torch.finfo(dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(a)) - MANTISSA[dtype])


def compare(c: Case, got: torch.Tensor, want: torch.Tensor, ins: dict, what: str):
    if c.compare == "exact":
        assert_same(got, want, what)
        return
    g, w = got.double(), want.double()
    assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.isinf(), w.isinf()), f"{what}: specials differ"
    fin = torch.isfinite(w)
    assert torch.equal(g[w.isinf()], w[w.isinf()]), f"{what}: infinities differ"
    tol = ulp(want)
    if c.compare in ("sum", "matmul"):
        tol = tol + c.bound(ins)
    err = (g - w).abs()
    bad = fin & (err > tol)
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} beyond the bound, e.g. {g[bad][:4].tolist()} != " \
                                f"{w[bad][:4].tolist()}"


@pytest.mark.parametrize("name", [*FAST, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW)])
def test_op(name, request):
    km = request.getfixturevalue("slow_kernels" if name in SLOW else "fast_kernels")
    names = SLOW if name in SLOW else FAST
    c = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ins = c.inputs(rng)
    ref = {k: v.clone() for k, v in ins.items()}
    run_c(km, names.index(name), c.fn, ins, c.scalars, c.regions)
    run_ref(c.fn, ref, c.scalars, c.regions)
    access = param_access(c.fn)
    for p in c.fn.memrefs:  # inputs untouched, outputs as the case says
        got, want, what = ins[p.name], ref[p.name], f"{name}: `{p.name}`"
        compare(c, got, want, ref, what) if access[p.name].direction != "in" else assert_same(got, want, what)


def test_every_op_has_a_case():
    seen = {i.op for c in CASES.values() for i in walk_instrs(c.fn.body)}
    assert set(Op) - seen == {Op.ALLREDUCE}  # below


def test_collective_is_not_rendered():
    k = InCore("sum_ranks")
    x, y = k.memref("x", F32), k.memref("y", F32)
    a, b = k.tile("a", 4, 4, F32), k.tile("b", 4, 4, F32)
    k.load(a, x, 0, 0)
    k.allreduce(b, a)
    k.store(y, 0, 0, b)
    with pytest.raises(BuildError, match="collective"):
        render_incore([k.build()], "coll")


def test_batch_of_tasks(fast_kernels):
    """Three tasks of one function with their own regions in one call, as a batch of the wave
    executor runs: each task's region, pads and masks."""
    c = CASES["e_edges"]
    rng = np.random.default_rng(7)
    x, y = rand((20, 40), F32, rng), rand((20, 40), F32, rng)
    regions = {"x": [(0, 0, 8, 24), (5, 10, 3, 30), (12, 1, 8, 9)],
               "y": [(0, 0, 8, 24), (9, 2, 11, 13), (12, 30, 8, 10)]}

    def batch(tensors):
        mems = {p: RegionBatch(tensors[p], *(torch.tensor(v) for v in zip(*regions[p]))) for p in ("x", "y")}
        return TaskBatch(c.fn, mems, {}, 3)

    got, want = {"x": x, "y": y.clone()}, {"x": x.clone(), "y": y.clone()}
    table = region_table(batch(got))
    ffi = fast_kernels.module.ffi
    sc = np.zeros((3, 1), np.int64)
    assert fast_kernels.run(FAST.index("e_edges"), ffi.from_buffer("pto_region[]", table),
                            ffi.from_buffer("int64_t[]", sc), 3) == 0
    ref = batch(want)
    run_incore_batch(c.fn, ref.mems, {}, 3)
    assert_same(got["y"], want["y"], "batch")


def _strict_compile(tmp_path, source: str, *flags: str) -> None:
    src = tmp_path / "k.c"
    src.write_text(source)
    proc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2", *flags,
                           f"-I{runtime_include_dir()}", "-c", str(src), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("flags", [(), ("-DPTO_NO_VECTOR_EXTENSIONS",)], ids=["vectors", "plain"])
def test_generated_c_is_strict_c99(tmp_path, flags):
    """The generated kernels (a loop, a view, pads, a product, a reduction, a scalar load)
    compile warning-free as strict C99, with and without GCC's vector extensions."""
    names = ("e_views", "e_scalar_load", "e_loops_step4", "r_rowmax_specials", "m_matmul_acc_9x33x17_11")
    _strict_compile(tmp_path, render_incore([CASES[n].fn for n in names], "strict").source, *flags)


@pytest.mark.slow
def test_every_generated_kernel_is_strict_c99(tmp_path):
    _strict_compile(tmp_path, render_incore([CASES[n].fn for n in sorted(CASES)], "strict").source)


def test_the_header_and_the_codegen_agree_on_the_rows_that_take_dot_products():
    """pto_tile.h's pto_matmul packs a transposed b from PTO_DOT_ROWS + 1 rows on, and the code
    generator reserves the pack's room by pto.ir.analysis.DOT_ROWS: one number in two languages
    (a mismatch would write past the room or leave it unused)."""
    import re
    from pathlib import Path

    from pto.ir.analysis import DOT_ROWS

    header = (Path(__file__).resolve().parents[2] / "runtime_c" / "pto_tile.h").read_text()
    (rows,) = re.findall(r"enum \{ PTO_DOT_ROWS = (\d+) \};", header)
    assert int(rows) == DOT_ROWS
