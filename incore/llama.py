"""InCore functions of a LLaMA decoder layer: RMSNorm, row-tile x weight matmul, RoPE, residual
add, SwiGLU and flash attention at three granularities (split, pair, fused).

Activations are row tiles of whole ``(seq, hidden)`` tensors; heads are column blocks of
``head_dim`` (head ``h`` at columns ``[h*D, (h+1)*D)``), handled by each function's parallel
axis. Storage is the program's dtype (bf16 on the GPU); norms, softmax statistics and
accumulators are f32. Tile heights are dims (``R``, ``TQ``, ``TK``) so binary expansion derives
every variant from one definition.
"""

from __future__ import annotations

import math

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def rmsnorm_tile(hidden: int, dtype, rows: int, row_block: int, chunk: int, eps: float = 1e-6,
                 target=None) -> IncoreFunction:
    """``y = x * rsqrt(mean(x^2) + eps) * g`` over R x hidden rows; two passes over column
    chunks (the row never has to fit on chip); a parallel axis over blocks of rows."""
    k = InCore("rmsnorm_tile")
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    x, g, y = k.memref("x", dtype), k.memref("g", dtype), k.memref("y", dtype)
    b = k.parallel("b", cdiv(R, RB))
    xt = k.tile("xt", RB, chunk, dtype)
    gt = k.tile("gt", 1, chunk, dtype)
    ss = k.tile("ss", RB, 1, f32)
    part = k.tile("part", RB, 1, f32)
    sq = k.tile("sq", RB, chunk, f32)
    k.full(ss, 0.0)
    with k.for_range("c", 0, hidden, chunk) as c:
        k.load(xt, x, b * RB, c)
        if dtype == f32:
            k.mul(sq, xt, xt)
        else:
            k.cast(sq, xt)
            k.mul(sq, sq, sq)
        k.rowsum(part, sq)
        k.add(ss, ss, part)
    k.muls(ss, ss, 1.0 / hidden)
    k.adds(ss, ss, eps)
    k.rsqrt(ss, ss)
    gf = k.tile("gf", 1, chunk, f32) if dtype != f32 else gt
    with k.for_range("c2", 0, hidden, chunk) as c2:
        k.load(xt, x, b * RB, c2)
        k.load(gt, g, 0, c2)
        if dtype != f32:
            k.cast(sq, xt)
            k.cast(gf, gt)
            k.rowexpandmul(sq, sq, ss)
            k.colexpandmul(sq, sq, gf)
            k.cast(xt, sq)
        else:
            k.rowexpandmul(xt, xt, ss)
            k.colexpandmul(xt, xt, gt)
        k.store(y, b * RB, c2, xt)
    return k.build(target)


def _row_tile_matmul(name: str, dtype, rows: int, K: int, N: int, bn: int, bk: int, residual: bool,
                     target=None) -> IncoreFunction:
    """An R x K row tile against a whole K x N weight: the K reduction inside (f32 accumulation),
    a parallel axis over output column blocks of ``bn``; with ``residual``, ``+ r`` in the
    epilogue (the sum never makes a round trip through memory)."""
    k = InCore(name)
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)
    x = k.memref("x", dtype, shape=(R, KD))
    w = k.memref("w", dtype, shape=(KD, ND))
    r = k.memref("r", dtype, shape=(R, ND)) if residual else None
    y = k.memref("y", dtype, shape=(R, ND))
    j = k.parallel("j", cdiv(ND, bn))
    a = k.tile("a", R, bk, dtype)
    bt = k.tile("bt", bk, bn, dtype)
    acc = k.tile("acc", R, bn, f32)
    out = k.tile("out", R, bn, dtype) if dtype != f32 or residual else acc
    k.full(acc, 0.0)
    with k.for_range("kk", 0, KD, bk) as kk:
        k.load(a, x, 0, kk)
        k.load(bt, w, kk, j * bn)
        k.matmul_acc(acc, a, bt)
    if residual:
        k.load(out, r, 0, j * bn)
        k.add(acc, acc, out)  # mixed f32 + storage dtype: no second f32 block in registers
    if out is not acc:
        k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def matmul_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = x @ w`` for an R x K row tile against a whole K x N weight."""
    return _row_tile_matmul("matmul_tile", dtype, rows, K, N, bn, bk, False, target)


def matmul_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = r + x @ w``: :func:`matmul_tile` with the residual connection in the epilogue."""
    return _row_tile_matmul("matmul_residual_tile", dtype, rows, K, N, bn, bk, True, target)


def matmul_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = silu(x @ wg) * (x @ wu)``: the gate and up projections of one column block in one
    program (two accumulators share each loaded x tile) and SwiGLU in the epilogue."""
    k = InCore("matmul_swiglu_tile")
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)
    x = k.memref("x", dtype, shape=(R, KD))
    wg = k.memref("wg", dtype, shape=(KD, ND))
    wu = k.memref("wu", dtype, shape=(KD, ND))
    y = k.memref("y", dtype, shape=(R, ND))
    j = k.parallel("j", cdiv(ND, bn))
    a = k.tile("a", R, bk, dtype)
    bg, bu = k.tile("bg", bk, bn, dtype), k.tile("bu", bk, bn, dtype)
    g, u = k.tile("g", R, bn, f32), k.tile("u", R, bn, f32)
    k.full(g, 0.0)
    k.full(u, 0.0)
    with k.for_range("kk", 0, KD, bk) as kk:
        k.load(a, x, 0, kk)
        k.load(bg, wg, kk, j * bn)
        k.load(bu, wu, kk, j * bn)
        k.matmul_acc(g, a, bg)
        k.matmul_acc(u, a, bu)
    if dtype != f32:
        # silu and the product of the two bf16-rounded projections, as the unfused layer does
        gb, ub = k.tile("gb", R, bn, dtype), k.tile("ub", R, bn, dtype)
        k.cast(gb, g)
        k.cast(ub, u)
        k.cast(g, gb)
        k.cast(u, ub)
        k.silu(g, g)
        k.mul(g, g, u)
        k.cast(gb, g)
        k.store(y, 0, j * bn, gb)
    else:
        k.silu(g, g)
        k.mul(g, g, u)
        k.store(y, 0, j * bn, g)
    return k.build(target)


def rope_tile(dtype, rows: int, heads: int, head_dim: int, row_block: int = 32, target=None) -> IncoreFunction:
    """Rotary embedding of an R x (heads*D) tile, rotate-half convention: with x1, x2 the two
    halves of a head and c, s the cos/sin of each row's position (R x D/2 tables),
    ``y1 = x1 c - x2 s`` and ``y2 = x2 c + x1 s``. Parallel over heads; rows in blocks."""
    k = InCore("rope_tile")
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    half = head_dim // 2
    x, cos, sin, y = (k.memref(n, dtype) for n in ("x", "cos", "sin", "y"))
    h = k.parallel("h", heads)
    x1, x2 = k.tile("x1", RB, half, dtype), k.tile("x2", RB, half, dtype)
    ct, st = k.tile("ct", RB, half, dtype), k.tile("st", RB, half, dtype)
    o1, o2, tmp = k.tile("o1", RB, half, f32), k.tile("o2", RB, half, f32), k.tile("tmp", RB, half, f32)
    f32_tiles = {}
    with k.for_range("rb", 0, R, RB) as rb:
        k.load(x1, x, rb, h * head_dim)
        k.load(x2, x, rb, h * head_dim + half)
        k.load(ct, cos, rb, 0)
        k.load(st, sin, rb, 0)
        for name, t in (("a1", x1), ("a2", x2), ("c", ct), ("s", st)):
            if name not in f32_tiles:
                f32_tiles[name] = k.tile(name, RB, half, f32) if dtype != f32 else None
            if f32_tiles[name] is not None:
                k.cast(f32_tiles[name], t)
        a1, a2, c, s = (f32_tiles[n] or t for n, t in (("a1", x1), ("a2", x2), ("c", ct), ("s", st)))
        k.mul(o1, a1, c)
        k.mul(tmp, a2, s)
        k.sub(o1, o1, tmp)
        k.mul(o2, a2, c)
        k.mul(tmp, a1, s)
        k.add(o2, o2, tmp)
        if dtype != f32:
            k.cast(x1, o1)
            k.cast(x2, o2)
            k.store(y, rb, h * head_dim, x1)
            k.store(y, rb, h * head_dim + half, x2)
        else:
            k.store(y, rb, h * head_dim, o1)
            k.store(y, rb, h * head_dim + half, o2)
    return k.build(target)


def _elementwise(name: str, dtype, rows: int, cols: int, block: int, body, row_block: int = 32,
                 target=None):
    """An R x cols elementwise function: column blocks on the parallel axis, rows in blocks."""
    k = InCore(name)
    R = k.dim("R", rows)
    RB = min(row_block, rows)
    a, b, y = k.memref("a", dtype), k.memref("b", dtype), k.memref("y", dtype)
    j = k.parallel("j", cdiv(cols, block))
    ta, tb = k.tile("ta", RB, block, dtype), k.tile("tb", RB, block, dtype)
    fa = k.tile("fa", RB, block, f32) if dtype != f32 else ta
    fb = k.tile("fb", RB, block, f32) if dtype != f32 else tb
    with k.for_range("rb", 0, R, RB) as rb:
        k.load(ta, a, rb, j * block)
        k.load(tb, b, rb, j * block)
        if dtype != f32:
            k.cast(fa, ta)
            k.cast(fb, tb)
        out = body(k, fa, fb, RB, block)
        if dtype != f32:
            k.cast(ta, out)
            out = ta
        k.store(y, rb, j * block, out)
    return k.build(target)


def residual_add(dtype, rows: int, cols: int, block: int, target=None) -> IncoreFunction:
    """``y = a + b`` (the residual connection)."""

    def body(k, fa, fb, R, block):
        s = k.tile("s", R, block, f32)
        k.add(s, fa, fb)
        return s

    return _elementwise("residual_add", dtype, rows, cols, block, body, target=target)


def swiglu_tile(dtype, rows: int, cols: int, block: int, target=None) -> IncoreFunction:
    """``y = silu(gate) * up``."""

    def body(k, fa, fb, R, block):
        s = k.tile("s", R, block, f32)
        k.silu(s, fa)
        k.mul(s, s, fb)
        return s

    return _elementwise("swiglu_tile", dtype, rows, cols, block, body, target=target)


# --------------------------------------------------------------------------- flash attention
#
# State of one q tile across kv blocks, per head: running row max m, row sum l (f32, one column
# per head in (seq x heads) tensors) and the unnormalized output acc (f32, seq x hidden).


LOG2E = 1.4426950408889634


def _attn_block(k: InCore, Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, scale, dtype, masks):
    """One online-softmax step on tiles: S = Q K^T, masks, then update m, l, acc.

    The running max m lives in the base-2 domain (m = max(s) * scale * log2 e), so that
    ``p = exp2(s * c - m)`` is one fused multiply-add and one exp2 per score (exp(x) is exp2 of
    x * log2 e anyway); l and acc are unchanged by the choice of base."""
    c = scale * LOG2E
    k.matmul(S, Q, Kt, tb=True)
    for op, bound in masks:
        getattr(k, op)(S, S, bound)
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


def flash_fused(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None) -> IncoreFunction:
    """Attention of one q tile over its kv range, the kv loop inside (one task per q tile).

    Scalars: ``qpos`` (position of the tile's first row), ``nfull`` (kv rows [0, nfull) need no
    mask: before the diagonal, whole blocks), ``nkv`` (kv rows to visit: the causal limit, or
    the sequence). Blocks in [nfull, nkv) get the causal mask (``causal``) and the kv edge."""
    return _flash_fused(dtype, heads, head_dim, tq, tk, target, causal=True)


def flash_fused_nc(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None) -> IncoreFunction:
    """:func:`flash_fused` without the causal mask (bidirectional attention)."""
    return _flash_fused(dtype, heads, head_dim, tq, tk, target, causal=False)


def _flash_fused(dtype, heads, head_dim, tq, tk, target, causal):
    k = InCore("flash_fused" if causal else "flash_fused_nc")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, v, o = k.memref("q", dtype), k.memref("k", dtype), k.memref("v", dtype), k.memref("o", dtype)
    qpos = k.scalar("qpos") if causal else None
    nfull, nkv = k.scalar("nfull"), k.scalar("nkv")
    h = k.parallel("h", heads)
    Q = k.tile("Q", TQ, D, dtype)
    Kt, Vt = k.tile("Kt", TK, D, dtype), k.tile("Vt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    P = k.tile("P", TQ, TK, dtype) if dtype != f32 else S
    m, l, mnew, alpha, rs = (k.tile(n, TQ, 1, f32) for n in ("m", "l", "mnew", "alpha", "rs"))
    acc = k.tile("acc", TQ, D, f32)
    scale = 1.0 / math.sqrt(D)
    k.load(Q, q, 0, h * D)
    k.full(m, -math.inf)
    k.full(l, 0.0)
    k.full(acc, 0.0)
    state = (Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, scale, dtype)
    with k.for_range("j", 0, nfull, TK) as j:
        k.load(Kt, kk_, j, h * D)
        k.load(Vt, v, j, h * D)
        _attn_block(k, *state, masks=[])
    with k.for_range("j2", nfull, nkv, TK) as j2:
        k.load(Kt, kk_, j2, h * D)
        k.load(Vt, v, j2, h * D)
        # causal: columns past nkv lie after every valid q row, so the causal mask covers them
        masks = [("mask_causal", qpos - j2)] if causal else [("mask_cols", nkv - j2)]
        _attn_block(k, *state, masks=masks)
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


def _pair_masks(causal, qpos, kpos, kmem):
    masks = [("mask_cols", kmem.rows)]
    if causal:
        masks.insert(0, ("mask_causal", qpos - kpos))
    return masks


def flash_pair(dtype, heads: int, head_dim: int, tq: int, tk: int, causal: bool, target=None):
    """One (q tile, kv tile) step: scores, online softmax and output update in one task."""
    k = InCore("flash_pair" if causal else "flash_pair_nc")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, v = k.memref("q", dtype), k.memref("k", dtype), k.memref("v", dtype)
    m_, l_, o_ = k.memref("m", f32), k.memref("l", f32), k.memref("acc", f32)
    qpos, kpos = (k.scalar("qpos"), k.scalar("kpos")) if causal else (None, None)
    h = k.parallel("h", heads)
    Q = k.tile("Q", TQ, D, dtype)
    Kt, Vt = k.tile("Kt", TK, D, dtype), k.tile("Vt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    P = k.tile("P", TQ, TK, dtype) if dtype != f32 else S
    m, l, acc = _state_tiles(k, TQ, D)
    mnew, alpha, rs = (k.tile(n, TQ, 1, f32) for n in ("mnew", "alpha", "rs"))
    k.load(Q, q, 0, h * D)
    k.load(Kt, kk_, 0, h * D)
    k.load(Vt, v, 0, h * D)
    k.load(m, m_, 0, h)
    k.load(l, l_, 0, h)
    k.load(acc, o_, 0, h * D)
    masks = _pair_masks(causal, qpos, kpos, kk_)
    _attn_block(k, Q, Kt, Vt, S, P, m, l, mnew, alpha, rs, acc, 1.0 / math.sqrt(D), dtype, masks)
    k.store(m_, 0, h, m)
    k.store(l_, 0, h, l)
    k.store(o_, 0, h * D, acc)
    return k.build(target)


def flash_score(dtype, heads: int, head_dim: int, tq: int, tk: int, causal: bool, target=None):
    """split step 1: s = mask(Q K^T * scale) for every head (s: TQ x heads*TK, f32)."""
    k = InCore("flash_score" if causal else "flash_score_nc")
    TQ, TK = k.dim("TQ", tq), k.dim("TK", tk)
    D = head_dim
    q, kk_, s_ = k.memref("q", dtype), k.memref("k", dtype), k.memref("s", f32)
    qpos, kpos = (k.scalar("qpos"), k.scalar("kpos")) if causal else (None, None)
    h = k.parallel("h", heads)
    Q, Kt = k.tile("Q", TQ, D, dtype), k.tile("Kt", TK, D, dtype)
    S = k.tile("S", TQ, TK, f32)
    k.load(Q, q, 0, h * D)
    k.load(Kt, kk_, 0, h * D)
    k.matmul(S, Q, Kt, tb=True)
    k.muls(S, S, 1.0 / math.sqrt(D))
    for op, bound in _pair_masks(causal, qpos, kpos, kk_):
        getattr(k, op)(S, S, bound)
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


def flash_output(dtype, heads: int, head_dim: int, tq: int, tk: int, target=None) -> IncoreFunction:
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
    k.load(Vt, v, 0, h * D)
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
