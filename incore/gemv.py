"""Projections of a few rows against weights stored output-major (``[N, K]``, as
``nn.Linear`` keeps them): the decode step's GEMVs.

A decode step multiplies one row per sequence by every weight once: the time is the weights'
bytes over the bandwidth the programs reach, and the programs are few when a block is many
columns of a ``[K, N]`` weight (each row of such a block is a short, strided read). Stored
``[N, K]``, a block of ``bn`` outputs is ``bn`` contiguous rows of the weight: narrow blocks
give every SM programs, and each reads long contiguous runs. The product is ``x @ w.T``
(``tb``), which the Triton renderer computes for a few rows as a multiply-sum along the rows'
contiguous axis (no transposed copy).

- :func:`gemv_norm_tile`: ``y = rmsnorm(x) @ w.T`` (the norm folded in, as
  :func:`pto.incore.fused.matmul_norm_tile`);
- :func:`gemv_residual_tile`: ``y = r + x @ w.T``;
- :func:`gemv_add_tile`: ``y += x @ w.T`` with the contraction split across programs, each
  adding its part's product into the f32 ``y`` (a split-K GEMV);
- :func:`gemv_norm_swiglu_tile`: ``y = silu(xn @ wg.T) * (xn @ wu.T)``, ``xn = rmsnorm(x)``;
- :func:`gemv_norm_rope_append_tile`: one sequence's q, k, v projection with the norm folded in
  and RoPE and the KV-cache append in its epilogue (a decode step of one sequence: one task
  where the projection and the RoPE task were two).

Each takes the weights' dtype (``wdtype``) apart from the activations': a quantized one
(:mod:`pto.ir.quant`) keeps the weights as stored, and each weight tile's load dequantizes its
blocks into the activations' dtype, so the K step (``bk``) is whole blocks (the products and the
f32 sums are those of the dequantized weights).
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.incore.fused import RowNorm
from pto.incore.matmul import swiglu_epilogue, swiglu_rounded
from pto.incore.rope import rotate_half

from pto import InCore, cdiv, emax, emin, f32
from pto.ir.nodes import IncoreFunction


@dataclass(frozen=True)
class Gemv:
    """R rows of K columns against blocks of ``bn`` output rows of an output-major weight, in
    contraction steps of ``bk``."""

    R: object
    K: object
    bn: int
    bk: int
    dtype: object
    #: the weights' dtype (None: ``dtype``); a quantized one is dequantized by the tiles' loads
    wdtype: object = None
    #: the weight tiles' dtype (None: ``dtype``; :func:`weight_tiles`)
    wtile: object = None

    @property
    def weights(self):
        return self.wdtype or self.dtype


def weight_tiles(dtype, wdtype, rows: int):
    """The dtype of a GEMV's weight tiles: quantized weights dequantize into f32 tiles where the
    product is a multiply-sum (fewer than 16 rows: its products are f32 anyway, and the exact
    values skip a rounding to ``dtype`` that would only cost instructions per weight), into
    ``dtype`` where it is a tensor-core dot; other weights are ``dtype`` (as stored)."""
    return f32 if wdtype is not None and wdtype.is_quantized and rows < 16 else dtype


def gemv_accumulate(k: InCore, x, weights: dict, g: Gemv, j, norm: RowNorm | None = None,
                    part: tuple | None = None) -> list:
    """The f32 accumulators ``x @ w[j * bn: (j + 1) * bn].T`` of each weight (scaled by the
    folded norm's row factors with ``norm``, declared just before); ``part``: ``(k0, n)``, the
    contraction's ``n`` columns from ``k0`` (None: all of ``g.K``; a constant ``n``, so that a part
    of one K step is a one-trip loop, whose loads a launch may issue before its wait; columns past
    K load as zeros)."""
    wt = g.wtile or g.dtype
    a = k.tile("a", g.R, g.bk, g.dtype)
    wide = k.tile("a32", g.R, g.bk, wt) if wt != g.dtype else a  # x as the weight tiles' dtype
    blocks = {n: k.tile(f"b{n}", g.bn, g.bk, wt) for n in weights}
    accs = {n: k.tile(f"acc{n}", g.R, g.bn, f32) for n in weights}
    for acc in accs.values():
        k.full(acc, 0.0)
    # a K loop of one step with the norm: the weights' loads first, so that their round trips
    # overlap the x tile's and the norm's reduction (whose barrier no later load is moved above;
    # SmolLM2's gate/up 4.13 against 4.31 us on an H200); a longer loop is pipelined as it is
    # (the 8B model's gate/up, two steps, took 3% longer with its weights first)
    early = norm is not None and g.bk >= norm.K
    k0, n_cols = part or (0, g.K)
    with k.for_range("kk", 0, n_cols, g.bk) as kk:
        col = kk + k0 if part else kk
        if early:
            for n, w in weights.items():
                k.load(blocks[n], w, j * g.bn, col)
        if norm is not None:
            norm.step(x, col, a)
        else:
            k.load(a, x, 0, col)
        if wide is not a:
            k.cast(wide, a)
        for n, w in weights.items():
            if not early:
                k.load(blocks[n], w, j * g.bn, col)
            k.matmul_acc(accs[n], wide, blocks[n], tb=True)
    if norm is not None:
        norm.scale(*accs.values())
    return list(accs.values())


def gemv_norm_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float, target=None,
                   wdtype=None, xdtype=None) -> IncoreFunction:
    """``y = rmsnorm(x; g, eps) @ w.T`` for R rows of K against an ``[N, K]`` weight, blocks of
    ``bn`` outputs on the parallel axis (weights of ``wdtype``, by default ``dtype``: the
    module docstring; x of ``xdtype``, by default ``dtype``)."""
    k = InCore("gemv_norm_tile")
    R = k.dim("R", rows)
    x = k.memref("x", xdtype or dtype, shape=(R, K))
    w = k.memref("w", wdtype or dtype, shape=(N, K))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    g = Gemv(R, K, bn, bk, dtype, wdtype, weight_tiles(dtype, wdtype, rows))
    (acc,) = gemv_accumulate(k, x, {"": w}, g, j, RowNorm(k, R, bk, dtype, eps, K, xdtype))
    out = k.tile("out", R, bn, dtype)
    k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def gemv_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None,
                       wdtype=None, rdtype=None, copy: bool = False) -> IncoreFunction:
    """``y = r + x @ w.T`` for R rows of K against an ``[N, K]`` weight (the residual in the
    epilogue); K and N are dims (a call binds them). ``rdtype``: the residual's and y's dtype (by
    default ``dtype``); ``copy``: the sum stored to ``y2`` too (the FFN's f32 sum starts from it:
    :func:`gemv_norm_swiglu_down_tile`)."""
    k = InCore("gemv_residual_tile")
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)  # one function for every projection a call binds
    x = k.memref("x", dtype, shape=(R, KD))
    w = k.memref("w", wdtype or dtype, shape=(ND, KD))
    rdt = rdtype or dtype
    r = k.memref("r", rdt, shape=(R, ND))
    y = k.memref("y", rdt, shape=(R, ND))
    y2 = k.memref("y2", rdt, shape=(R, ND)) if copy else None
    j = k.parallel("j", cdiv(ND, bn))
    (acc,) = gemv_accumulate(k, x, {"": w}, Gemv(R, KD, bn, bk, dtype, wdtype, weight_tiles(dtype, wdtype, rows)), j)
    # (r and y2 may bind one tensor, the folded FFN's x: each program reads and writes its own bn
    # columns of it, so no program reads what another writes)
    residual_epilogue(k, acc, (r, y, y2), j * bn, rdt)
    return k.build(target)


def gemv_add_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, part: int, target=None,
                  wdtype=None) -> IncoreFunction:
    """``y += x @ w.T`` for R rows of K against an ``[N, K]`` weight, the contraction split in
    parts of ``part`` columns (a multiple of the K step ``bk``): program ``j`` takes part ``j //
    blocks`` of output block ``j % blocks`` (``blocks`` of ``bn`` outputs; the programs of one
    part are consecutive, so the first parts' programs need only the first columns of x) and adds
    its f32 product into ``y`` (``store_add``: the parts' sums in any order). ``y`` is f32 and
    holds the residual before the task (the decode step's down projection with
    :attr:`~pto.orchestration.model.tiling.DecodeTiling.split_down`: each program has one part's
    weights to stream, all of them loaded before its wait where the part is one K step)."""
    if part % bk:
        raise ValueError(f"gemv_add_tile: a part of {part} columns is not whole K steps of {bk}")
    k = InCore("gemv_add_tile")
    R = k.dim("R", rows)
    x = k.memref("x", dtype, shape=(R, K))
    w = k.memref("w", wdtype or dtype, shape=(N, K))
    y = k.memref("y", f32, shape=(R, N))
    blocks = cdiv(N, bn)
    j = k.parallel("j", blocks * cdiv(K, part))
    s, b = j // blocks, j % blocks
    g = Gemv(R, K, bn, bk, dtype, wdtype, weight_tiles(dtype, wdtype, rows))
    (acc,) = gemv_accumulate(k, x, {"": w}, g, b, part=(s * part, part))
    k.store_add(y, 0, b * bn, acc)
    return k.build(target)


def residual_epilogue(k: InCore, acc, memrefs, col, rdtype) -> None:
    """``y = r + acc`` at column ``col`` (``memrefs``: ``r``, ``y`` and ``y2``, where the sum is
    stored too, or None), rounded to ``rdtype``; ``acc`` is ``[R, bn]`` f32 (added into)."""
    r, y, y2 = memrefs
    R, bn = acc.tile.rows, acc.tile.cols
    out = k.tile("out", R, bn, rdtype)
    k.load(out, r, 0, col)
    k.add(acc, acc, out)
    k.cast(out, acc)
    k.store(y, 0, col, out)
    if y2 is not None:
        k.store(y2, 0, col, out)


def gemv_norm_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float,
                          target=None, wdtype=None, xdtype=None) -> IncoreFunction:
    """``y = silu(xn @ wg.T) * (xn @ wu.T)``, ``xn = rmsnorm(x; g, eps)``, against ``[N, K]``
    gate and up weights: the FFN's norm, gate and up projections and SwiGLU in one program per
    block of ``bn`` outputs (x of ``xdtype``, by default ``dtype``)."""
    k = InCore("gemv_norm_swiglu_tile")
    R = k.dim("R", rows)
    x = k.memref("x", xdtype or dtype, shape=(R, K))
    wg = k.memref("wg", wdtype or dtype, shape=(N, K))
    wu = k.memref("wu", wdtype or dtype, shape=(N, K))
    y = k.memref("y", dtype, shape=(R, N))
    j = k.parallel("j", cdiv(N, bn))
    gv = Gemv(R, K, bn, bk, dtype, wdtype, weight_tiles(dtype, wdtype, rows))
    g, u = gemv_accumulate(k, x, {"g": wg, "u": wu}, gv, j, RowNorm(k, R, bk, dtype, eps, K, xdtype))
    swiglu_epilogue(k, g, u, y, j * bn, R, bn, dtype)
    return k.build(target)


def gemv_norm_swiglu_down_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, dn: int, eps: float,
                               target=None, wd_rows: bool = False, xdtype=None) -> IncoreFunction:
    """The whole FFN of R rows, one level: ``y += swiglu(rmsnorm(x)) @ wd.T`` with ``[N, K]``
    gate and up weights and an ``[K, N]`` down weight (``N`` the intermediate size). Program
    ``j`` computes its block of ``bn`` intermediate columns ``h_j`` as
    :func:`gemv_norm_swiglu_tile` does (rounded to ``dtype``), then its share of the down
    projection, ``h_j @ wd[:, j bn : (j + 1) bn].T``, in steps of ``dn`` outputs, each added into
    the f32 sum ``y`` (``store_add``: a split-K product over the programs). ``y`` holds the
    residual before the task (the layer's x2, as f32), the next layer's x after it. With
    ``wd_rows`` the down weight is stored ``[N, K]`` (transposed once at load): a program's share
    is ``bn`` whole rows of it, contiguous, where ``[K, N]`` gives it ``K`` runs of ``bn``
    elements (short, strided reads for narrow blocks). ``xdtype``: x's (by default ``dtype``; f32
    in the step that folds the down projection: x2 is the f32 residual)."""
    k = InCore("gemv_norm_swiglu_down_tile")
    R = k.dim("R", rows)
    x = k.memref("x", xdtype or dtype, shape=(R, K))
    wg = k.memref("wg", dtype, shape=(N, K))
    wu = k.memref("wu", dtype, shape=(N, K))
    wd = k.memref("wd", dtype, shape=(N, K) if wd_rows else (K, N))
    y = k.memref("y", f32, shape=(R, K))
    j = k.parallel("j", cdiv(N, bn))
    g, u = gemv_accumulate(k, x, {"g": wg, "u": wu}, Gemv(R, K, bn, bk, dtype), j,
                           RowNorm(k, R, bk, dtype, eps, K, xdtype))
    h = swiglu_rounded(k, g, u, R, bn, dtype)
    b = k.tile("bd", *((bn, dn) if wd_rows else (dn, bn)), dtype)
    part = k.tile("part_d", R, dn, f32)
    with k.for_range("nn", 0, K, dn) as nn:
        if wd_rows:
            k.load(b, wd, j * bn, nn)
        else:
            k.load(b, wd, nn, j * bn)
        k.matmul(part, h, b, tb=not wd_rows)
        k.store_add(y, 0, nn, part)
    return k.build(target)


def gemv_norm_rope_append_tile(dtype, K: int, heads: tuple[int, int, int], bh: int, bk: int, eps: float,
                               positions: int, target=None, wdtype=None, xdtype=None) -> IncoreFunction:
    """One sequence's ``rmsnorm(x) @ w.T`` against the ``[N, K]`` q, k, v weight (``heads``: the
    query heads, the key/value heads, the head size D; N = (query + 2 key/value) heads x D),
    with RoPE at the sequence's position p (read from ``pos``) and the append in the epilogue:
    program j computes ``bh`` rotation pairs of one head (outputs ``i`` and ``i + D/2`` for ``bh``
    consecutive i: rows of w in two blocks), rotates them with the cos and sin rows at p, and
    stores a query head's to ``q`` ([heads, D]), a key head's to the cache block ``kc`` and a
    value head's (not rotated) to ``vc`` at slot ``p mod cap`` (the ring of
    :func:`~pto.incore.decode.rope_qkv_append`, which this replaces for one sequence). The
    three stores are one-trip loops on the head index: a program takes one of them. x is
    ``xdtype`` (by default ``dtype``)."""
    nq, nkv, D = heads
    half = D // 2
    if half % bh:  # a block past its half would store into the next half or head
        raise ValueError(f"gemv_norm_rope_append_tile: {bh} pairs a block do not divide a head's {half}")
    k = InCore("gemv_norm_rope_append_tile")
    cap = k.scalar("cap")
    x = k.memref("x", xdtype or dtype, shape=(1, K))
    w = k.memref("w", wdtype or dtype, shape=((nq + 2 * nkv) * D, K))
    pos = k.memref("pos", f32)
    cos, sin = (k.memref(n, dtype, shape=(positions, half)) for n in ("cos", "sin"))
    # q without a declared shape: its row is a one-trip loop's variable, whose bound the static
    # check does not follow through the other kinds' empty ranges (the region bounds it at run time)
    q = k.memref("q", dtype)
    kc, vc = (k.memref(n, dtype, shape=(cap, nkv * D)) for n in ("kc", "vc"))
    j = k.parallel("j", (nq + 2 * nkv) * cdiv(half, bh))
    t, i0 = j // cdiv(half, bh), (j % cdiv(half, bh)) * bh  # the head (q, then k, then v) and pair
    p = k.load_scalar("p", pos, 0, 0)
    norm = RowNorm(k, 1, bk, dtype, eps, K, xdtype)
    a = k.tile("a", 1, bk, dtype)
    wt = weight_tiles(dtype, wdtype, 1)
    wide = k.tile("a32", 1, bk, wt) if wt != dtype else a
    b1, b2 = k.tile("b1", bh, bk, wt), k.tile("b2", bh, bk, wt)
    y1, y2 = k.tile("y1", 1, bh, f32), k.tile("y2", 1, bh, f32)
    k.full(y1, 0.0)
    k.full(y2, 0.0)
    early = bk >= K  # one K step: the weights' loads before the norm's reduction (gemv_accumulate's)
    with k.for_range("kk", 0, K, bk) as kk:
        blocks = ((b1, t * D + i0), (b2, t * D + half + i0))
        if early:
            for b, row in blocks:
                k.load(b, w, row, kk)
        norm.step(x, kk, a)
        if wide is not a:
            k.cast(wide, a)
        if not early:
            for b, row in blocks:
                k.load(b, w, row, kk)
        k.matmul_acc(y1, wide, b1, tb=True)
        k.matmul_acc(y2, wide, b2, tb=True)
    norm.scale(y1, y2)
    r1, r2, out = _rotate_pairs(k, (y1, y2), (cos, sin), (p, i0), bh, dtype)
    slot = p % cap
    stores = ((q, r1, r2, 0, emin(t + 1, nq), lambda h: (h, 0)),  # a query head: row h of q
              (kc, r1, r2, emax(t, nq), emin(t + 1, nq + nkv), lambda h: (slot, (h - nq) * D)),
              (vc, y1, y2, emax(t, nq + nkv), t + 1, lambda h: (slot, (h - nq - nkv) * D)))
    for n, (dst, lo, hi, first, last, at) in enumerate(stores):
        with k.for_range(f"h{n}", emax(first, t), last) as h:  # one trip for this program's kind
            row, col = at(h)
            k.cast(out, lo)
            k.store(dst, row, col + i0, out)
            k.cast(out, hi)
            k.store(dst, row, col + half + i0, out)
    return k.build(target)


def _rotate_pairs(k: InCore, y, tables, at, bh: int, dtype):
    """RoPE of ``bh`` rotation pairs (the f32 tiles ``y``: first and second halves) with the cos
    and sin rows of ``tables`` at (position, pair) ``at``: ``r1 = y1 c - y2 s``, ``r2 = y2 c +
    y1 s`` (rotate-half); returns r1, r2 and a storage-dtype tile to store through."""
    (y1, y2), (cos, sin), (p, i0) = y, tables, at
    ct, st = k.tile("ct", 1, bh, dtype), k.tile("st", 1, bh, dtype)
    cf, sf, r1, r2, tmp = (k.tile(n, 1, bh, f32) for n in ("cf", "sf", "r1", "r2", "tmp"))
    out = k.tile("out", 1, bh, dtype)
    k.load(ct, cos, p, i0)
    k.load(st, sin, p, i0)
    k.cast(cf, ct)
    k.cast(sf, st)
    rotate_half(k, (r1, r2), tmp, (y1, y2), (cf, sf))
    return r1, r2, out


__all__ = ["Gemv", "weight_tiles", "gemv_accumulate", "gemv_norm_tile", "gemv_residual_tile", "gemv_add_tile",
           "gemv_norm_swiglu_tile",
           "gemv_norm_swiglu_down_tile", "gemv_norm_rope_append_tile"]
