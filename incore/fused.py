"""Projections with the RMSNorm before them folded in, and RoPE in the Q/K projections' epilogue.

``rmsnorm(x) @ w = diag(r) ((x * g) @ w) = diag(r) (x @ (diag(g) w))`` with
``r = rsqrt(mean(x^2) + eps)`` per row: no normalized copy of the activations is written or
read, and the epilogue scales each row of the accumulator by ``r``. Two ways (``norm``):

- ``"loop"`` (:class:`RowNorm`, the decode step's GEMVs): the K loop, which loads every
  element of the row tile anyway, also sums its squares and multiplies the tile by the norm's
  gain ``g`` before the matmul. The tile then reaches the tensor cores from registers after a
  cast and a multiply: the prefill layer's projections ran 1.7-2x slower that way than the GEMM
  plus the norm they replaced (docs/PERF.md).
- ``"stats"`` (:class:`RowScale`, the prefill layer's ``--fuse-norm-rope``): ``g`` is folded into
  the weight's rows once, when the weights are loaded (``w_g = diag(g) w``), and a statistics
  task (:func:`pto.incore.norm.rms_scale_tile`) writes each row's ``r``: the K loop is the plain
  GEMM's, its operands straight from shared memory. (Summing the squares of the loaded tile in
  the same loop, its shared-memory buffer also the matmul's operand, computed wrong results under
  Triton 3.6's software pipelining on an H100 with 2 or more stages: docs/PERF.md.)

RoPE mixes the two halves of each head (``y1 = a1 cos - a2 sin``, ``y2 = a2 cos + a1 sin``), so
the Q/K projection computes each head's two halves in two accumulators and rotates them before
the store; a program takes one or more heads.

Numerics: the product ``x * g`` (or the folded weight ``g w``) is rounded to the storage dtype
before the matmul, as the norm's output is in the unfused layer; the row scale is applied in f32
afterwards; the sum of squares accumulates in f32. The difference to the unfused layer is one
rounding per element, within the storage dtype's tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.incore.matmul import swiglu_epilogue

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


class RowNorm:
    """The tiles and steps of the folded RMSNorm in a row-tile matmul's K loop: R rows of K
    columns in steps of ``bk``; x is ``xdtype`` (None: ``dtype``; f32 where the residual stream is
    an f32 sum: :func:`pto.incore.gemv.gemv_norm_swiglu_down_tile`)."""

    def __init__(self, k: InCore, R, bk: int, dtype, eps: float, K: int, xdtype=None):
        self.k, self.dtype, self.eps, self.K, self.R, self.bk = k, dtype, eps, K, R, bk
        self.g = k.memref("g", dtype)
        self.xt = k.tile("xt", R, bk, xdtype or dtype)
        self.xf = k.tile("xf", R, bk, f32)
        self.sq = k.tile("sq", R, bk, f32)
        self.gt = k.tile("gt", 1, bk, dtype)
        self.gf = k.tile("gf", 1, bk, f32)
        self.part = k.tile("part", R, 1, f32)
        self.ss = k.tile("ss", R, 1, f32)
        k.full(self.ss, 0.0)

    def step(self, x, kk, a) -> None:
        """Load the x tile at column ``kk``, add its squares to the row sums, ``a = x * g``."""
        k = self.k
        k.load(self.xt, x, 0, kk)
        k.load(self.gt, self.g, 0, kk)
        k.cast(self.xf, self.xt)
        k.mul(self.sq, self.xf, self.xf)
        k.rowsum(self.part, self.sq)
        k.add(self.ss, self.ss, self.part)
        k.cast(self.gf, self.gt)
        k.colexpandmul(self.xf, self.xf, self.gf)
        k.cast(a, self.xf)

    def scale(self, *accs) -> None:
        """``acc *= rsqrt(mean(x^2) + eps)`` per row."""
        k = self.k
        k.muls(self.ss, self.ss, 1.0 / self.K)
        k.adds(self.ss, self.ss, self.eps)
        k.rsqrt(self.ss, self.ss)
        for acc in accs:
            k.rowexpandmul(acc, acc, self.ss)


class RowScale:
    """The folded RMSNorm of a projection whose gain is in its weight and whose rows' scale a
    statistics task computed (:func:`pto.incore.norm.rms_scale_tile`): the K loop is the plain
    GEMM's (the x tile goes to the matmul as loaded), the epilogue multiplies each row by its
    ``rsqrt(mean(x^2) + eps)`` from the memref ``rs`` (R x 1, f32). The same steps as
    :class:`RowNorm`."""

    def __init__(self, k: InCore, R, bk: int, dtype, K: int):
        # the shape of the K loop, as RowNorm's (normed_gemm reads R, bk, dtype and K)
        self.k, self.dtype, self.K, self.R, self.bk = k, dtype, K, R, bk
        self.rs = k.memref("rs", f32)
        self.rt = k.tile("rt", R, 1, f32)

    def step(self, x, kk, a) -> None:
        """Load the x tile at column ``kk`` into ``a``."""
        self.k.load(a, x, 0, kk)

    def scale(self, *accs) -> None:
        """``acc *= rs`` per row."""
        k = self.k
        k.load(self.rt, self.rs, 0, 0)
        for acc in accs:
            k.rowexpandmul(acc, acc, self.rt)


@dataclass(frozen=True)
class Fold:
    """How a projection folds in the RMSNorm before it: its ``eps``, and ``norm``: ``"loop"``
    (:class:`RowNorm`: the gain and the sum of squares in the K loop) or ``"stats"``
    (:class:`RowScale`: the gain in the weight, each row's scale from a statistics task). A
    function taking a fold also takes a bare ``eps`` (the loop)."""

    eps: float = 1e-6
    norm: str = "loop"

    def __post_init__(self):
        if self.norm not in ("loop", "stats"):
            raise ValueError(f"norm must be 'loop' or 'stats', not {self.norm!r}")


@dataclass(frozen=True)
class Heads:
    """The heads of the q or k projection with RoPE: ``count`` of ``dim`` columns each,
    ``per_program`` a program (a divisor of ``count``)."""

    count: int
    dim: int
    per_program: int = 1


def _fold(fold) -> Fold:
    return fold if isinstance(fold, Fold) else Fold(float(fold))


def row_norm(k: InCore, R, bk: int, dtype, K: int, fold: Fold):
    """The folded norm of a projection (:class:`Fold`)."""
    if fold.norm == "loop":
        return RowNorm(k, R, bk, dtype, fold.eps, K)
    return RowScale(k, R, bk, dtype, K)


def normed_gemm(k: InCore, x, w, norm: RowNorm, bn: int, j):
    """The shared body of a row tile's projection with the RMSNorm folded in (``norm``, declared
    just before: its tiles come first): the R rows of ``x`` against column block ``j`` (``bn``
    wide) of ``w``, accumulated over K in the norm's steps and scaled by each row's
    rsqrt(mean(x^2) + eps); returns the f32 accumulator."""
    R, bk, dtype = norm.R, norm.bk, norm.dtype
    a = k.tile("a", R, bk, dtype)
    bt = k.tile("bt", bk, bn, dtype)
    acc = k.tile("acc", R, bn, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, norm.K, bk) as kk:
        norm.step(x, kk, a)
        k.load(bt, w, kk, j * bn)
        k.matmul_acc(acc, a, bt)
    norm.scale(acc)
    return acc


def matmul_norm_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, fold: Fold | float,
                     target=None) -> IncoreFunction:
    """``y = rmsnorm(x; g, eps) @ w`` for an R x K row tile against a whole K x N weight, output
    column blocks of ``bn`` on the parallel axis. ``fold``: :class:`Fold` or the norm's eps; with
    ``norm="stats"`` no ``g``: the gain is in ``w``'s rows and the rows' scale in ``rs``."""
    fold = _fold(fold)
    k = InCore("matmul_norm_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(K, N))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    acc = normed_gemm(k, x, w, row_norm(k, R, bk, dtype, K, fold), bn, j)
    out = k.tile("out", R, bn, dtype)
    k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def matmul_norm_rope_tile(dtype, rows: int, K: int, heads: Heads, bk: int, fold: Fold | float, target=None,
                          name: str = "matmul_norm_rope_tile") -> IncoreFunction:
    """``y = rope(rmsnorm(x; g, eps) @ w)`` for the q or k projection: ``heads.per_program`` heads
    per index of the parallel axis, each head's two halves in two accumulators (one K loop feeds
    them all), rotated by the row tile's ``cos`` and ``sin`` (``rows x head_dim / 2``) before the
    store. ``fold``: :class:`Fold` or the norm's eps (``norm="stats"``: the gain is in ``w``'s
    rows, the rows' scale in ``rs``). ``name``: a second function for another head count
    (grouped-query attention's k)."""
    if heads.count % heads.per_program:
        raise ValueError(f"{name}: {heads.count} heads are not a multiple of {heads.per_program} heads per program")
    k = InCore(name)
    _norm_rope(k, dtype, rows, K, heads, bk, _fold(fold))
    return k.build(target)


def matmul_norm_rope_k_tile(dtype, rows: int, K: int, heads: Heads, bk: int, fold: Fold | float,
                            target=None) -> IncoreFunction:
    """:func:`matmul_norm_rope_tile` as a second function for another head count (grouped-query
    attention's k)."""
    return matmul_norm_rope_tile(dtype, rows, K, heads, bk, fold, target, name="matmul_norm_rope_k_tile")


def _norm_rope(k: InCore, dtype, rows: int, K: int, heads: Heads, bk: int, fold: Fold) -> None:
    R = k.dim("R", rows)
    hp, half = heads.per_program, heads.dim // 2
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(K, heads.count * heads.dim))
    cos, sin = k.memref("cos", dtype), k.memref("sin", dtype)
    y = k.memref("y", dtype, shape=(R, heads.count * heads.dim))
    h = k.parallel("h", heads.count // hp)
    norm = row_norm(k, R, bk, dtype, K, fold)
    a = k.tile("a", R, bk, dtype)
    bs = [(k.tile("b1" + n, bk, half, dtype), k.tile("b2" + n, bk, half, dtype)) for n in _suffixes(hp)]
    accs = [(k.tile("a1" + n, R, half, f32), k.tile("a2" + n, R, half, f32)) for n in _suffixes(hp)]
    cols = [(h * hp + i) * heads.dim for i in range(hp)] if hp > 1 else [h * heads.dim]
    for a1, a2 in accs:
        k.full(a1, 0.0)
        k.full(a2, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        norm.step(x, kk, a)
        for (b1, b2), (a1, a2), col in zip(bs, accs, cols):
            k.load(b1, w, kk, col)
            k.load(b2, w, kk, col + half)
            k.matmul_acc(a1, a, b1)
            k.matmul_acc(a2, a, b2)
    norm.scale(*(t for pair in accs for t in pair))
    _rope_epilogue(k, accs, cols, (cos, sin), y, R, half, dtype)


def _suffixes(n: int) -> list[str]:
    """The tile-name suffixes of a program's ``n`` heads: head 0's tiles keep the plain names
    (``a1``), head i's take ``_i`` (``a1_1``)."""
    return [""] + [f"_{i}" for i in range(1, n)]


def _rope_epilogue(k: InCore, accs, cols, tables, y, R, half: int, dtype) -> None:
    """Rotate each head's accumulator halves ``accs`` by the row tile's cos and sin (``tables``:
    their memrefs) and store them at the head's columns ``cols`` of ``y``."""
    cos, sin = tables
    # the projection rounded to the storage dtype first, as the unfused layer stores q and k before
    # RoPE: the rounded halves (half the bytes of the f32 accumulators) are what stays live while
    # the heads rotate one after another; arithmetic on tiles runs in f32 whatever their dtypes
    if dtype != f32:
        rounded = []
        for (a1, a2), n in zip(accs, _suffixes(len(accs))):
            r1, r2 = k.tile("r1" + n, R, half, dtype), k.tile("r2" + n, R, half, dtype)
            k.cast(r1, a1)
            k.cast(r2, a2)
            rounded.append((r1, r2))
        accs = rounded
    ct, st = k.tile("ct", R, half, dtype), k.tile("st", R, half, dtype)
    t1, t2 = k.tile("t1", R, half, f32), k.tile("t2", R, half, f32)
    ob = k.tile("ob", R, half, dtype) if dtype != f32 else None
    k.load(ct, cos, 0, 0)
    k.load(st, sin, 0, 0)
    for (a1, a2), col in zip(accs, cols):
        k.mul(t1, a1, ct)
        k.mul(t2, a2, st)
        k.sub(t1, t1, t2)  # y1 = a1 cos - a2 sin
        _store(k, y, col, t1, ob)
        k.mul(t1, a2, ct)
        k.mul(t2, a1, st)
        k.add(t1, t1, t2)  # y2 = a2 cos + a1 sin
        _store(k, y, col + half, t1, ob)


def _store(k: InCore, y, col, t, ob) -> None:
    """Store the f32 tile ``t`` at column ``col`` of ``y``, through ``ob`` (the storage dtype) unless
    that is f32 (``ob`` None)."""
    if ob is not None:
        k.cast(ob, t)
        t = ob
    k.store(y, 0, col, t)


def matmul_norm_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, fold: Fold | float,
                            target=None) -> IncoreFunction:
    """``y = silu(xn @ wg) * (xn @ wu)`` with ``xn = rmsnorm(x; g, eps)`` folded in: the FFN's
    norm, gate and up projections and SwiGLU in one program per column block of ``bn``.
    ``fold``: :class:`Fold` or the norm's eps; ``norm="stats"``: :func:`matmul_interleaved_swiglu`
    (one interleaved weight ``w``)."""
    fold = _fold(fold)
    if fold.norm == "stats":
        return matmul_interleaved_swiglu(dtype, rows, K, N, bn, bk, target)
    k = InCore("matmul_norm_swiglu_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    wg = k.memref("wg", dtype, shape=(K, N))
    wu = k.memref("wu", dtype, shape=(K, N))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    norm = row_norm(k, R, bk, dtype, K, fold)
    a = k.tile("a", R, bk, dtype)
    bg, bu = k.tile("bg", bk, bn, dtype), k.tile("bu", bk, bn, dtype)
    g, u = k.tile("gacc", R, bn, f32), k.tile("uacc", R, bn, f32)
    k.full(g, 0.0)
    k.full(u, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        norm.step(x, kk, a)
        k.load(bg, wg, kk, j * bn)
        k.load(bu, wu, kk, j * bn)
        k.matmul_acc(g, a, bg)
        k.matmul_acc(u, a, bu)
    norm.scale(g, u)
    swiglu_epilogue(k, g, u, y, j * bn, R, bn, dtype)
    return k.build(target)


def matmul_interleaved_swiglu(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """The FFN's gate and up projections and SwiGLU against one weight ``w`` (K x 2N) whose
    columns interleave the two (``w[:, 2c] = wg[:, c]``, ``w[:, 2c + 1] = wu[:, c]``, gains folded
    in: :func:`pto.orchestration.llama.weights.fold_gains`), with each row's RMSNorm scale from
    ``rs``: one accumulator of ``2 bn`` columns a program, the K loop the plain GEMM's (two
    accumulators of ``bn`` ran 5-10% slower on an H100, docs/PERF.md), then the even and odd
    columns (:meth:`InCore.deinterleave`), each rounded to the storage dtype as the unfused
    layer stores the two projections, and ``silu(g) u``."""
    k = InCore("matmul_norm_swiglu_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", dtype, shape=(K, 2 * N))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    norm = RowScale(k, R, bk, dtype, K)
    a = k.tile("a", R, bk, dtype)
    bt = k.tile("bt", bk, 2 * bn, dtype)
    acc = k.tile("acc", R, 2 * bn, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        norm.step(x, kk, a)
        k.load(bt, w, kk, j * (2 * bn))
        k.matmul_acc(acc, a, bt)
    norm.scale(acc)
    g, u = k.tile("g", R, bn, dtype), k.tile("u", R, bn, dtype)
    k.deinterleave(g, acc, 0)
    k.deinterleave(u, acc, 1)
    h = k.tile("h", R, bn, f32)
    k.silu(h, g)
    k.mul(h, h, u)
    k.cast(g, h)
    k.store(y, 0, j * bn, g)
    return k.build(target)


__all__ = ["Fold", "Heads", "RowNorm", "RowScale", "row_norm", "normed_gemm", "matmul_norm_tile",
           "matmul_norm_rope_tile", "matmul_norm_rope_k_tile", "matmul_norm_swiglu_tile", "matmul_interleaved_swiglu"]
