"""Flash attention tiles at three granularities, for multi-head and grouped-query attention, causal,
bidirectional or causal within a sliding window.

- ``fused``: :func:`flash_fused` (causal) and :func:`flash_fused_nc`, one task per q tile with
  the kv loop inside;
- ``pair``: :func:`flash_pair`, one task per (q tile, kv tile) pair;
- ``split``: :func:`flash_score`, :func:`flash_softmax`, :func:`flash_output` per pair (the
  seed's three tasks).

``pair`` and ``split`` keep the state of a q tile in memory between tasks, per head: the
running row max m and row sum l (f32, one column per head in ``(seq, heads)`` tensors) and the
unnormalized output acc (f32, ``(seq, hidden)``); :func:`flash_init` sets it and
:func:`flash_normalize` turns it into the output. Heads are column blocks of ``head_dim`` (head
``h`` at columns ``[h*D, (h+1)*D)``), all of them on the parallel axis; scores, statistics and
accumulators are f32 whatever the storage dtype. Tile heights are dims (``TQ``, ``TK``) so
binary expansion derives every variant from one definition.

Grouped-query attention (``kv_heads`` dividing ``heads``): k and v have ``kv_heads`` column
blocks and query head ``h`` reads key/value head ``h // (heads // kv_heads)``; one program per
query head as before (its block is the same size; the group's programs are adjacent, so a k/v
tile is read from L2 by all but the first). A sliding ``window`` (Mistral) keeps the keys k of
query q with ``q - window < k <= q``: :func:`flash_fused_swa` visits only the kv tiles of that
range and masks the window's edge only in the tiles that cross it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction

LOG2E = 1.4426950408889634  # the softmax runs in base 2 (see online_softmax_step)
#: the bias of a key outside the sliding window: finite, so that a row whose keys in one tile all
#: lie before its window (possible in the first tiles a q tile visits) keeps a finite max; the
#: next tile's larger max then scales what it summed by exp2(-huge) = 0 exactly. Moderate, not
#: huge: the GPU fuses ``s * c - m`` into one FMA, which subtracts the rounded max from the exact
#: product, so a fully masked row's exponents are off by up to half an ulp of ``fill * c``: 4.7e21
#: for a fill of -1e30 (exp2 = inf, then inf * 0 = NaN: Mistral-7B at 16K on the H100 gave inf),
#: 1e-4 for this one, which f16 and bf16 bias tiles hold too. Scores are O(100) at most, so
#: exp2((s + fill) * c - m) is still exactly 0 once a row has a key inside its window.
WINDOW_FILL = -30000.0


def _kv_col(h, head_dim: int, heads: int, kv_heads: int | None):
    """The first column of query head ``h``'s key/value head."""
    group = heads // (kv_heads or heads)
    return (h // group) * head_dim if group > 1 else h * head_dim


def _bias_tile(k: InCore, TQ, TK, dtype, P):
    """The sliding window's bias tile: the P tile of a half-precision layer (dead while the scores
    are masked, so the window costs no on-chip memory), else an f32 tile of its own."""
    return P if dtype != f32 else k.tile("Z", TQ, TK, f32)


def _apply_masks(k: InCore, S, masks, Z=None) -> None:
    """Each (op, bound) of ``masks`` on the scores S: a mask op of the IR, or ``window``: keep
    ``c > r + bound`` (scores at or left of the diagonal ``bound`` get :data:`WINDOW_FILL`, added
    from the bias tile Z: the IR's causal mask, filled the other way round)."""
    for op, bound in masks:
        if op == "window":
            k.full(Z, WINDOW_FILL)
            k.mask_causal(Z, Z, bound, fill=0.0)
            k.add(S, S, Z)
        else:
            getattr(k, op)(S, S, bound)


class FlashTiles(NamedTuple):
    """The tiles of an online-softmax step: q, the k and v tiles, the scores S and their
    storage-dtype copy P (S itself in an f32 layer), the running max m, sum l and output acc,
    scratch (mnew, alpha, rs) and the sliding window's bias tile Z."""

    Q: object
    Kt: object
    Vt: object
    S: object
    P: object
    m: object
    l: object
    mnew: object
    alpha: object
    rs: object
    acc: object
    Z: object = None


@dataclass(frozen=True)
class Mask:
    """Which keys a query sees: ``causal`` (none after it), within a sliding ``window`` of keys
    (Mistral; causal only) or all of them."""

    causal: bool = True
    window: int | None = None


def online_softmax_step(k: InCore, t: FlashTiles, scale: float, masks) -> None:
    """One online-softmax step on tiles: S = Q K^T, masks, then update m, l, acc.

    The running max m lives in the base-2 domain (m = max(s) * scale * log2 e), so that
    ``p = exp2(s * c - m)`` is one fused multiply-add and one exp2 per score (exp(x) is exp2 of
    x * log2 e anyway); l and acc are unchanged by the choice of base."""
    Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, Z = t
    c = scale * LOG2E
    k.matmul(S, Q, Kt, tb=True)
    _apply_masks(k, S, masks, Z)
    k.rowmax(mnew, S)
    k.muls(mnew, mnew, c)
    k.max(mnew, mnew, m)
    k.sub(alpha, m, mnew)
    k.exp2(alpha, alpha)
    k.muls(S, S, c)
    k.rowexpandsub(S, S, mnew)
    k.exp2(S, S)
    k.rowsum(rs, S)
    k.mul(l, l, alpha)
    k.add(l, l, rs)
    k.rowexpandmul(acc, acc, alpha)
    if P is not S:
        k.cast(P, S)
    k.matmul_acc(acc, P, Vt)
    k.mov(m, mnew)


def flash_fused(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None,
                kv_heads: int | None = None) -> IncoreFunction:
    """Attention of one q tile over its kv range, the kv loop inside (one task per q tile).

    Scalars: ``qpos`` (position of the tile's first row), ``nfull`` (kv rows [0, nfull) need no
    mask: before the diagonal, whole blocks), ``nkv`` (kv rows to visit: the causal limit, or
    the sequence). Blocks in [nfull, nkv) get the causal mask (``causal``) and the kv edge."""
    return _flash_fused(dtype, heads, head_dim, tq, tk, target, Mask(causal=True), kv_heads)


def flash_fused_nc(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None,
                   kv_heads: int | None = None) -> IncoreFunction:
    """:func:`flash_fused` without the causal mask (bidirectional attention)."""
    return _flash_fused(dtype, heads, head_dim, tq, tk, target, Mask(causal=False), kv_heads)


def flash_fused_swa(dtype, heads: int, head_dim: int, tq: int, tk: int, window: int, target=None,
                    kv_heads: int | None = None) -> IncoreFunction:
    """:func:`flash_fused` within a sliding window of ``window`` keys. The k and v regions start at
    the kv tile holding the q tile's first key (``q - window + 1`` of its first row, down to a
    multiple of ``TK``), so tiles before the window are neither loaded nor depended on. Scalars,
    relative to that start: ``qoff`` (the q tile's first row), ``nwin`` (tiles in [0, nwin) cross
    the window's edge: window mask), ``nfull`` (tiles in [nwin, nfull): no mask), ``nkv`` (tiles
    in [nfull, nkv) meet the diagonal: causal and window masks)."""
    return _flash_fused(dtype, heads, head_dim, tq, tk, target, Mask(causal=True, window=window), kv_heads)


def _flash_fused(dtype, heads, head_dim, tq, tk, target, mask: Mask, kv_heads=None):
    causal, window = mask.causal, mask.window
    k = InCore("flash_fused_swa" if window else "flash_fused" if causal else "flash_fused_nc")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, v, o = k.memref("q", dtype), k.memref("k", dtype), k.memref("v", dtype), k.memref("o", dtype)
    if window:
        qpos, nwin = k.scalar("qoff"), k.scalar("nwin")
    else:
        qpos = k.scalar("qpos") if causal else None
    nfull, nkv = k.scalar("nfull"), k.scalar("nkv")
    h = k.parallel("h", heads)
    kvc = _kv_col(h, D, heads, kv_heads)
    Q = k.tile("Q", TQ, D, dtype)
    Kt, Vt = k.tile("Kt", TK, D, dtype), k.tile("Vt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    P = k.tile("P", TQ, TK, dtype) if dtype != f32 else S
    Z = _bias_tile(k, TQ, TK, dtype, P) if window else None
    m, l, mnew, alpha, rs = (k.tile(n, TQ, 1, f32) for n in ("m", "l", "mnew", "alpha", "rs"))
    acc = k.tile("acc", TQ, D, f32)
    scale = 1.0 / math.sqrt(D)
    k.load(Q, q, 0, h * D)
    k.full(m, -math.inf)
    k.full(l, 0.0)
    k.full(acc, 0.0)
    state = FlashTiles(Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, Z)
    if window:
        with k.for_range("j0", 0, nwin, TK) as j0:
            k.load(Kt, kk_, j0, kvc)
            k.load(Vt, v, j0, kvc)
            online_softmax_step(k, state, scale, [("window", qpos - j0 - window)])
    with k.for_range("j", nwin if window else 0, nfull, TK) as j:
        k.load(Kt, kk_, j, kvc)
        k.load(Vt, v, j, kvc)
        online_softmax_step(k, state, scale, [])
    with k.for_range("j2", nfull, nkv, TK) as j2:
        k.load(Kt, kk_, j2, kvc)
        k.load(Vt, v, j2, kvc)
        # causal: columns past nkv lie after every valid q row, so the causal mask covers them
        masks = [("mask_causal", qpos - j2)] if causal else [("mask_cols", nkv - j2)]
        if window:
            masks.insert(0, ("window", qpos - j2 - window))
        online_softmax_step(k, state, scale, masks)
    k.rowexpanddiv(acc, acc, l)
    if dtype != f32:
        k.cast(Q, acc)
        k.store(o, 0, h * D, Q)
    else:
        k.store(o, 0, h * D, acc)
    return k.build(target)


def _state_tiles(k: InCore, TQ, D):
    m, l = k.tile("mt", TQ, 1, f32), k.tile("lt", TQ, 1, f32)
    acc = k.tile("acct", TQ, D, f32)
    return m, l, acc


def flash_init(heads: int, head_dim: int, tq: int, target=None) -> IncoreFunction:
    """m = -inf, l = 0, acc = 0 for one q tile, every head."""
    k = InCore("flash_init")
    TQ = k.dim("TQ", tq)
    m_, l_, o_ = k.memref("m", f32), k.memref("l", f32), k.memref("acc", f32)
    h = k.parallel("h", heads)
    m, l, acc = _state_tiles(k, TQ, head_dim)
    k.full(m, -math.inf)
    k.full(l, 0.0)
    k.full(acc, 0.0)
    k.store(m_, 0, h, m)
    k.store(l_, 0, h, l)
    k.store(o_, 0, h * head_dim, acc)
    return k.build(target)


def flash_normalize(dtype, heads: int, head_dim: int, tq: int, target=None) -> IncoreFunction:
    """out = acc / l for one q tile, every head."""
    k = InCore("flash_normalize")
    TQ = k.dim("TQ", tq)
    l_, o_, y = k.memref("l", f32), k.memref("acc", f32), k.memref("y", dtype)
    h = k.parallel("h", heads)
    l, acc = k.tile("lt", TQ, 1, f32), k.tile("acct", TQ, head_dim, f32)
    k.load(l, l_, 0, h)
    k.load(acc, o_, 0, h * head_dim)
    k.rowexpanddiv(acc, acc, l)
    if dtype != f32:
        out = k.tile("out", TQ, head_dim, dtype)
        k.cast(out, acc)
        k.store(y, 0, h * head_dim, out)
    else:
        k.store(y, 0, h * head_dim, acc)
    return k.build(target)


def _pair_masks(mask: Mask, qpos, kpos, kmem):
    masks = [("mask_cols", kmem.rows)]
    if mask.causal:
        masks.insert(0, ("mask_causal", qpos - kpos))
    if mask.window:
        masks.insert(0, ("window", qpos - kpos - mask.window))
    return masks


def _pair_name(base: str, mask: Mask) -> str:
    return base + ("_swa" if mask.window else "" if mask.causal else "_nc")


def flash_pair(dtype, heads: int, head_dim: int, tq: int, tk: int, mask: Mask, target=None,
               kv_heads: int | None = None):
    """One (q tile, kv tile) step: scores, online softmax and output update in one task (with a
    sliding window: its mask as well; the orchestration submits only the pairs that meet the
    window)."""
    causal, window = mask.causal, mask.window
    k = InCore(_pair_name("flash_pair", mask))
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, v = k.memref("q", dtype), k.memref("k", dtype), k.memref("v", dtype)
    m_, l_, o_ = k.memref("m", f32), k.memref("l", f32), k.memref("acc", f32)
    qpos, kpos = (k.scalar("qpos"), k.scalar("kpos")) if causal else (None, None)
    h = k.parallel("h", heads)
    kvc = _kv_col(h, D, heads, kv_heads)
    Q = k.tile("Q", TQ, D, dtype)
    Kt, Vt = k.tile("Kt", TK, D, dtype), k.tile("Vt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    P = k.tile("P", TQ, TK, dtype) if dtype != f32 else S
    Z = _bias_tile(k, TQ, TK, dtype, P) if window else None
    m, l, acc = _state_tiles(k, TQ, D)
    mnew, alpha, rs = (k.tile(n, TQ, 1, f32) for n in ("mnew", "alpha", "rs"))
    k.load(Q, q, 0, h * D)
    k.load(Kt, kk_, 0, kvc)
    k.load(Vt, v, 0, kvc)
    k.load(m, m_, 0, h)
    k.load(l, l_, 0, h)
    k.load(acc, o_, 0, h * D)
    masks = _pair_masks(mask, qpos, kpos, kk_)
    online_softmax_step(k, FlashTiles(Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, Z), 1.0 / math.sqrt(D), masks)
    k.store(m_, 0, h, m)
    k.store(l_, 0, h, l)
    k.store(o_, 0, h * D, acc)
    return k.build(target)


def flash_score(dtype, heads: int, head_dim: int, tq: int, tk: int, mask: Mask, target=None,
                kv_heads: int | None = None):
    """split step 1: s = mask(Q K^T * scale) for every head (s: TQ x heads*TK, f32)."""
    causal, window = mask.causal, mask.window
    k = InCore(_pair_name("flash_score", mask))
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, s_ = k.memref("q", dtype), k.memref("k", dtype), k.memref("s", f32)
    qpos, kpos = (k.scalar("qpos"), k.scalar("kpos")) if causal else (None, None)
    h = k.parallel("h", heads)
    Q, Kt = k.tile("Q", TQ, D, dtype), k.tile("Kt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    Z = k.tile("Z", TQ, TK, dtype) if window else None  # the bias in the storage dtype
    k.load(Q, q, 0, h * D)
    k.load(Kt, kk_, 0, _kv_col(h, D, heads, kv_heads))
    k.matmul(S, Q, Kt, tb=True)
    k.muls(S, S, 1.0 / math.sqrt(D))
    _apply_masks(k, S, _pair_masks(mask, qpos, kpos, kk_), Z)
    k.store(s_, 0, h * TK, S)
    return k.build(target)


def flash_softmax(heads: int, tq: int, tk: int, target=None) -> IncoreFunction:
    """split step 2: online softmax; s becomes p = exp(s - m_new) in place; m, l updated;
    alpha = exp(m_old - m_new) for the output rescale."""
    k = InCore("flash_softmax")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    s_, m_, l_, a_ = k.memref("s", f32), k.memref("m", f32), k.memref("l", f32), k.memref("alpha", f32)
    h = k.parallel("h", heads)
    S = k.tile("S", TQ, TK, f32)
    m, l = k.tile("mt", TQ, 1, f32), k.tile("lt", TQ, 1, f32)
    mnew, alpha, rs = (k.tile(n, TQ, 1, f32) for n in ("mnew", "at", "rs"))
    k.load(S, s_, 0, h * TK)
    k.load(m, m_, 0, h)
    k.load(l, l_, 0, h)
    k.rowmax(mnew, S)
    k.max(mnew, mnew, m)
    k.sub(alpha, m, mnew)
    k.exp(alpha, alpha)
    k.rowexpandsub(S, S, mnew)
    k.exp(S, S)
    k.rowsum(rs, S)
    k.mul(l, l, alpha)
    k.add(l, l, rs)
    k.store(s_, 0, h * TK, S)
    k.store(m_, 0, h, mnew)
    k.store(l_, 0, h, l)
    k.store(a_, 0, h, alpha)
    return k.build(target)


def flash_output(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None,
                 kv_heads: int | None = None) -> IncoreFunction:
    """split step 3: acc = acc * alpha + p @ V."""
    k = InCore("flash_output")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    s_, v, a_, o_ = k.memref("p", f32), k.memref("v", dtype), k.memref("alpha", f32), k.memref("acc", f32)
    h = k.parallel("h", heads)
    S = k.tile("S", TQ, TK, f32)
    Vt = k.tile("Vt", TK, D, dtype)
    alpha = k.tile("at", TQ, 1, f32)
    acc = k.tile("acct", TQ, D, f32)
    k.load(S, s_, 0, h * TK)
    k.load(Vt, v, 0, _kv_col(h, D, heads, kv_heads))
    k.load(alpha, a_, 0, h)
    k.load(acc, o_, 0, h * D)
    k.rowexpandmul(acc, acc, alpha)
    if dtype != f32:
        P = k.tile("P", TQ, TK, dtype)
        k.cast(P, S)
        k.matmul_acc(acc, P, Vt)
    else:
        k.matmul_acc(acc, S, Vt)
    k.store(o_, 0, h * D, acc)
    return k.build(target)
