"""InCore functions of a decode step: one new token per sequence, its position and token id read
from device memory (``load_scalar``), so one task graph serves every step.

- :func:`embed_row`: a sequence's activation row from the embedding row of its token;
- :func:`rope_qkv_append`: RoPE at the sequence's position on q (into a ``[heads, D]`` block)
  and on k, with k and v appended to the sequence's KV-cache block at that position;
- :func:`decode_attn_part` and :func:`decode_attn_combine`: flash-decoding, the cache split in
  chunks so one token keeps many programs busy: a chunk's partial softmax state (m, l, and the
  unnormalized output), then one combine per query head;
- :func:`decode_attn_combine_parts`: the combine with a head's partial states read at once
  (strided loads) where they are few;
- :func:`decode_attn_combine_o`: one sequence's combine folded into the o projection (each
  program combines the heads itself);
- :func:`lmhead_argmax_tile` and :func:`argmax_advance`: the LM head with greedy sampling in its
  epilogue (each vocabulary block's maximum and its index), the second stage of the argmax, and
  the step's end: the chosen token and the next position written back for the next step.

Positions and token ids are f32 numbers in ``[B, 1]`` tensors (exact below 2**24).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pto.incore.attention import FlashTiles, online_softmax_step
from pto.incore.fused import RowNorm, normed_gemm
from pto.incore.gemv import Gemv, gemv_accumulate, residual_epilogue, weight_tiles
from pto.incore.rope import rotate_half

from pto import InCore, cdiv, emin, f32
from pto.builder import TileRef
from pto.ir.nodes import IncoreFunction


def embed_row(dtype, hidden: int, vocab: int, chunk: int, target=None, wdtype=None, xdtype=None) -> IncoreFunction:
    """``x[0, :] = emb[tok, :]`` with ``tok`` read from memory (the whole table is the region;
    a quantized table, ``wdtype``, dequantized by the load; x of ``xdtype``, by default
    ``dtype``: an f32 residual stream takes the row as it is)."""
    k = InCore("embed_row")
    tok = k.memref("tok", f32)
    emb = k.memref("emb", wdtype or dtype, shape=(vocab, hidden))
    x = k.memref("x", xdtype or dtype)
    t = k.load_scalar("t", tok, 0, 0)
    row = k.tile("row", 1, chunk, dtype)
    wide = k.tile("row_x", 1, chunk, xdtype) if xdtype not in (None, dtype) else row
    with k.for_range("c", 0, hidden, chunk) as c:
        k.load(row, emb, t, c)
        if wide is not row:
            k.cast(wide, row)
        k.store(x, 0, c, wide)
    return k.build(target)


def _rotate(k: InCore, x, tables, col, half: int, dtype, name: str):
    """The rotated halves (f32 tiles) of the head at column ``col`` of x's row, with the cos and
    sin rows ``tables`` (f32 tiles) at the position: ``y1 = x1 c - x2 s``, ``y2 = x2 c + x1 s``
    (rotate-half)."""
    ct, st = tables
    x1, x2 = k.tile(f"{name}1", 1, half, dtype), k.tile(f"{name}2", 1, half, dtype)
    f = {n: k.tile(f"{name}{n}f", 1, half, f32) for n in ("x1", "x2", "o1", "o2", "tmp")}
    k.load(x1, x, 0, col)
    k.load(x2, x, 0, col + half)
    k.cast(f["x1"], x1)
    k.cast(f["x2"], x2)
    rotate_half(k, (f["o1"], f["o2"]), f["tmp"], (f["x1"], f["x2"]), (ct, st))
    return f["o1"], f["o2"]


def rope_qkv_append(dtype, heads: int, kv_heads: int, head_dim: int, positions: int,
                    target=None) -> IncoreFunction:
    """RoPE at one sequence's position p (read from ``pos``) on its qkv row ``x`` (``[1, (heads
    + 2 * kv_heads) * D]``: q, k, v): query head h to row h of ``q`` (a ``[heads, D]`` block, the
    layout the attention tasks read); the rotated key head and the value head appended to the
    sequence's cache blocks ``kc``/``vc`` (``[cap, kv_heads * D]``) at slot ``p mod cap`` (a ring:
    a sliding window's cache keeps the latest ``cap`` positions; a full cache never wraps).
    Parallel over query heads; program h also appends key/value head h when there is one (a
    one-trip loop), so the whole of a sequence's RoPE and append is one task, one launch."""
    k = InCore("rope_qkv_append")
    half, D = head_dim // 2, head_dim
    qd, kvd = heads * D, kv_heads * D
    cap = k.scalar("cap")
    pos, x = k.memref("pos", f32), k.memref("x", dtype)
    cos = k.memref("cos", dtype, shape=(positions, half))
    sin = k.memref("sin", dtype, shape=(positions, half))
    q = k.memref("q", dtype)
    kc = k.memref("kc", dtype, shape=(cap, kvd))
    vc = k.memref("vc", dtype, shape=(cap, kvd))
    h = k.parallel("h", heads)
    p = k.load_scalar("p", pos, 0, 0)
    tables = []
    for name, table in (("c", cos), ("s", sin)):
        t, tf = k.tile(f"{name}t", 1, half, dtype), k.tile(f"{name}tf", 1, half, f32)
        k.load(t, table, p, 0)
        k.cast(tf, t)
        tables.append(tf)
    out = k.tile("out", 1, half, dtype)
    for i, o in enumerate(_rotate(k, x, tables, h * D, half, dtype, "q")):
        k.cast(out, o)
        k.store(q, h, i * half, out)
    with k.for_range("g", h, emin(h + 1, kv_heads)) as g:  # one trip for h < kv_heads, else none
        for i, o in enumerate(_rotate(k, x, tables, qd + g * D, half, dtype, "k")):
            k.cast(out, o)
            k.store(kc, p % cap, g * D + i * half, out)
        vt = k.tile("vt", 1, D, dtype)
        k.load(vt, x, 0, qd + kvd + g * D)
        k.store(vc, p % cap, g * D, vt)
    return k.build(target)


def decode_attn_part(dtype, group: int, head_dim: int, chunk: int, tk: int, target=None) -> IncoreFunction:
    """One chunk of a sequence's cache for the ``group`` query heads of one key/value head: of
    its slots ``j0 .. j0 + chunk - 1``, those that hold a key (the first ``min(p + 1, cap)``
    slots of the ring, p read from ``pos``: slot order does not matter, RoPE is applied before
    the cache), online softmax over tiles of ``tk`` keys (the prefill's step,
    :func:`~pto.incore.attention.online_softmax_step`); the partial state (row max ``m`` of the
    scores times ``log2 e / sqrt(D)``, sum ``l``, the unnormalized output ``o``, f32) of each query
    head to ``ml`` ([group, 2]) and ``o`` ([group, D]). A chunk past the last key runs no tile
    (m = -inf, l = 0, o = 0)."""
    k = InCore("decode_attn_part")
    D = head_dim
    pos = k.memref("pos", f32)
    q = k.memref("q", dtype, shape=(group, D))
    kc = k.memref("kc", dtype, shape=(chunk, D))
    vc = k.memref("vc", dtype, shape=(chunk, D))
    o = k.memref("o", f32, shape=(group, D))
    ml = k.memref("ml", f32, shape=(group, 2))
    j0 = k.scalar("j0")  # the chunk's first slot
    cap = k.scalar("cap")
    p = k.load_scalar("p", pos, 0, 0)
    n = emin(p + 1, cap) - j0  # keys in this chunk and after it
    # the query heads of the group padded to 16 rows (the extra rows load as zeros and are not
    # stored): Triton's tl.dot takes 16 rows and more, and a product of fewer rows would be an
    # exact broadcast-multiply-sum of group x D x tk elements (27 us a task on an H100, against
    # a few for the tensor-core product)
    G = max(group, 16)
    qt, kt, vt = k.tile("qt", G, D, dtype), k.tile("kt", tk, D, dtype), k.tile("vt", tk, D, dtype)
    s = k.tile("s", G, tk, f32)
    pr = k.tile("pr", G, tk, dtype) if dtype != f32 else s
    m, l, mnew, alpha, rs = (k.tile(n, G, 1, f32) for n in ("m", "l", "mnew", "alpha", "rs"))
    acc = k.tile("acc", G, D, f32)
    tiles = FlashTiles(qt, kt, vt, s, pr, m, l, mnew, alpha, rs, acc)
    k.load(qt, q, 0, 0)
    k.full(m, float("-inf"))
    k.full(l, 0.0)
    k.full(acc, 0.0)
    # (the key tile loaded before the position arrives, so that the round trips overlap, took
    # longer on an H200: 3.57 against 3.28 us a SmolLM2 task)
    with k.for_range("kk", 0, emin(chunk, n), tk) as kk:
        k.load(kt, kc, kk, 0)
        k.load(vt, vc, kk, 0)
        # the slots past the last key hold anything (NaN in a fresh cache): 0 * NaN would leak
        k.mask_rows(vt, vt, n - kk, fill=0.0)
        # the prefill's step: the max in the base-2 domain (the combine's exp2 follows it)
        online_softmax_step(k, tiles, 1.0 / math.sqrt(D), [("mask_cols", n - kk)])
    k.store(o, 0, 0, acc)
    k.store(ml, 0, 0, m)
    k.store(ml, 0, 1, l)
    return k.build(target)


def decode_attn_combine(dtype, head_dim: int, chunk: int, target=None) -> IncoreFunction:
    """One query head's output from its partial states (rows of ``o`` and ``ml`` ``stride``
    apart: ``o[j * stride]``): ``sum_j 2^(m_j - M) o_j / sum_j 2^(m_j - M) l_j`` (the maxima are
    in the base-2 domain, as :func:`decode_attn_part` leaves them), over the chunks of ``chunk``
    slots that hold keys: the first ``min(p + 1, cap)`` slots, p read from ``pos`` (of the
    ``chunks`` the cache has; the others' partials are empty). A step's loop is a load and the
    arithmetic that waits for it (about 0.2 us a chunk on an H100): a cache filled to half
    combines half its chunks. The partials may be spans' merged states
    (:func:`decode_attn_merge`): ``chunk`` is then a span's slots."""
    k = InCore("decode_attn_combine")
    D = head_dim
    pos = k.memref("pos", f32)
    o = k.memref("o", f32)
    ml = k.memref("ml", f32)
    y = k.memref("y", dtype)
    stride, chunks, cap = k.scalar("stride"), k.scalar("chunks"), k.scalar("cap")
    p = k.load_scalar("p", pos, 0, 0)
    used = emin(chunks, cdiv(emin(p + 1, cap), chunk))  # chunks that hold a key (chunk 0 always)
    acc, _, l = _merge(k, (o, ml), used, stride, D)
    k.rowexpanddiv(acc, acc, l)
    out = k.tile("out", 1, D, dtype)
    k.cast(out, acc)
    k.store(y, 0, 0, out)
    return k.build(target)


def decode_attn_combine_parts(dtype, heads: int, head_dim: int, parts: int, target=None) -> IncoreFunction:
    """:func:`decode_attn_combine` with every partial state read at once: one query head's
    ``parts`` states (rows ``i * heads`` of ``o`` and ``ml``: every ``heads``-th row) as one
    strided load each, where the loop waits on a load per chunk: ``sum_i 2^(m_i - M) o_i /
    sum_i 2^(m_i - M) l_i``, ``M`` their largest m (finite: chunk 0 holds the position's own
    key). The parts past the position have m = -inf (weight 2^-inf = 0), so all are read and no
    position is needed."""
    k = InCore("decode_attn_combine_parts")
    D = head_dim
    o = k.memref("o", f32, shape=((parts - 1) * heads + 1, D))
    ml = k.memref("ml", f32, shape=((parts - 1) * heads + 1, 2))
    y = k.memref("y", dtype, shape=(1, D))
    av = _combine_states(k, (o, ml), 0, heads, _CombineTiles.declare(k, parts, D))
    out = k.tile("out", 1, D, dtype)
    k.cast(out, av)
    k.store(y, 0, 0, out)
    return k.build(target)


@dataclass(frozen=True)
class _CombineTiles:
    """The tiles of a head's combine over ``parts`` partial states of ``D`` (:func:`_combine_states`)."""

    m: TileRef  # [parts, 1]: the maxima, then the weights
    l: TileRef  # [parts, 1]: the sums, then weighted
    o: TileRef  # [parts, D]: the outputs, then weighted
    top: TileRef  # [1, 1]: the largest maximum
    lsum: TileRef  # [1, 1]: the weighted sums' sum
    av: TileRef  # [1, D]: the head's output

    @classmethod
    def declare(cls, k: InCore, parts: int, D: int) -> _CombineTiles:
        return cls(k.tile("m", parts, 1, f32), k.tile("lw", parts, 1, f32), k.tile("oh", parts, D, f32),
                   k.tile("top", 1, 1, f32), k.tile("lsum", 1, 1, f32), k.tile("av", 1, D, f32))


def _combine_states(k: InCore, src, row, heads: int, t: _CombineTiles):
    """One head's output (``t.av``, f32) from its partial states in ``src`` (``o``, ``ml``), read
    at once from ``row`` on, every ``heads``-th row: ``sum_i 2^(m_i - M) o_i / sum_i 2^(m_i - M)
    l_i``."""
    o, ml = src
    k.load(t.m, ml, row, 0, pad=float("-inf"), step=heads)  # (-inf past the memref: weight 0)
    k.load(t.l, ml, row, 1, step=heads)
    k.load(t.o, o, row, 0, step=heads)
    k.colmax(t.top, t.m)
    k.colexpandsub(t.m, t.m, t.top)
    k.exp2(t.m, t.m)
    k.mul(t.l, t.l, t.m)
    k.colsum(t.lsum, t.l)
    k.rowexpandmul(t.o, t.o, t.m)
    k.colsum(t.av, t.o)
    k.rowexpanddiv(t.av, t.av, t.lsum)
    return t.av


def decode_attn_combine_o(dtype, heads: int, head_dim: int, parts: int, N: int, bn: int, target=None,
                          rdtype=None, copy: bool = False) -> IncoreFunction:
    """One sequence's attention combine folded into the o projection (one level where the combine
    per head and the projection were two): ``y = r + attn @ w.T`` against the ``[N, heads * D]``
    weight, ``attn`` every query head's output from its ``parts`` partial states as
    :func:`decode_attn_combine_parts` computes it (rounded to ``dtype``, as the combine's store
    rounds it). ``o`` and ``ml`` are the sequence's states, ``parts * heads`` rows (part ``i`` of
    head ``h`` at row ``i * heads + h``). Program ``j`` computes ``bn`` outputs in K steps of one
    head each: the head's states read at once, combined, times its ``D`` columns of the block
    (every program combines every head: the states, ``parts * heads * (D + 2)`` f32, are read by
    each, from L2). ``rdtype`` and ``copy`` as :func:`~pto.incore.gemv.gemv_residual_tile`'s."""
    k = InCore("decode_attn_combine_o")
    D = head_dim
    o = k.memref("o", f32, shape=(parts * heads, D))
    ml = k.memref("ml", f32, shape=(parts * heads, 2))
    w = k.memref("w", dtype, shape=(N, heads * D))
    rdt = rdtype or dtype
    r = k.memref("r", rdt, shape=(1, N))
    y = k.memref("y", rdt, shape=(1, N))
    y2 = k.memref("y2", rdt, shape=(1, N)) if copy else None
    j = k.parallel("j", cdiv(N, bn))
    states = _CombineTiles.declare(k, parts, D)
    a, b = k.tile("a", 1, D, dtype), k.tile("b", bn, D, dtype)
    acc = k.tile("acc", 1, bn, f32)
    k.full(acc, 0.0)
    # (a loop: the heads unrolled were no faster on an H200, SmolLM2's step 0.61 against 0.59 ms
    # with the loop and 0.41 without the fold; docs/PERF.md, "Twentieth session")
    with k.for_range("h", 0, heads) as h:
        k.load(b, w, j * bn, h * D)
        k.cast(a, _combine_states(k, (o, ml), h, heads, states))
        k.matmul_acc(acc, a, b, tb=True)
    residual_epilogue(k, acc, (r, y, y2), j * bn, rdt)
    return k.build(target)


def decode_attn_merge(head_dim: int, chunk: int, span: int, target=None) -> IncoreFunction:
    """The first of two combine levels for long caches: one query head's partial states of the
    ``span`` chunks from chunk ``j0`` (rows ``stride`` apart, as :func:`decode_attn_combine`
    reads them) merged into one unnormalized state (``o`` [1, D], ``ml`` [1, 2]: m, l), over
    those chunks that hold keys. A span past the position merges nothing (m = -inf, l = 0,
    o = 0), and :func:`decode_attn_combine` over the spans (``chunk`` = a span's slots) never
    reads it. So a 32K cache's 512 chunks are two loops of 16 and 32 steps, not one of 512."""
    k = InCore("decode_attn_merge")
    D = head_dim
    pos = k.memref("pos", f32)
    o_in, ml_in = k.memref("o_in", f32), k.memref("ml_in", f32)
    o, ml = k.memref("o", f32, shape=(1, D)), k.memref("ml", f32, shape=(1, 2))
    stride, j0, cap = k.scalar("stride"), k.scalar("j0"), k.scalar("cap")
    p = k.load_scalar("p", pos, 0, 0)
    used = emin(span, cdiv(emin(p + 1, cap), chunk) - j0)  # of this span's chunks (none: <= 0)
    acc, m, l = _merge(k, (o_in, ml_in), used, stride, D)
    k.store(o, 0, 0, acc)
    k.store(ml, 0, 0, m)
    k.store(ml, 0, 1, l)
    return k.build(target)


def _merge(k: InCore, src, n, stride, D: int):
    """The online merge of the partial states ``src`` (o, ml) at rows ``j * stride`` for j in
    ``[0, n)``: the tiles of the merged state (acc, m, l), acc and l unnormalized."""
    o, ml = src
    m, mj, lj, w, l = (k.tile(n, 1, 1, f32) for n in ("m", "mj", "lj", "w", "l"))
    acc, oj, mnew, alpha = k.tile("acc", 1, D, f32), k.tile("oj", 1, D, f32), k.tile("mnew", 1, 1, f32), \
        k.tile("alpha", 1, 1, f32)
    k.full(m, float("-inf"))
    k.full(l, 0.0)
    k.full(acc, 0.0)
    with k.for_range("j", 0, n) as j:
        k.load(mj, ml, j * stride, 0)
        k.load(lj, ml, j * stride, 1)
        k.load(oj, o, j * stride, 0)
        k.max(mnew, m, mj)
        # a chunk past the position has m = -inf: its weight is 2^-inf = 0 (the first never is)
        k.sub(alpha, m, mnew)
        k.exp2(alpha, alpha)
        k.sub(w, mj, mnew)
        k.exp2(w, w)
        k.mul(l, l, alpha)
        k.mul(lj, lj, w)
        k.add(l, l, lj)
        k.rowexpandmul(acc, acc, alpha)
        k.rowexpandmul(oj, oj, w)
        k.add(acc, acc, oj)
        k.mov(m, mnew)
    return acc, m, l


def lmhead_argmax_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float,
                       target=None, xdtype=None) -> IncoreFunction:
    """``logits = rmsnorm(x; g, eps) @ w`` for the R rows of x against a ``[K, N]`` LM head,
    column blocks of ``bn`` on the parallel axis, with the first stage of greedy sampling in the
    epilogue: each row's largest logit of the block to ``best[r, j]`` and its column (in the
    whole vocabulary) to ``index[r, j]``. x is ``xdtype`` (by default ``dtype``)."""
    k = InCore("lmhead_argmax_tile")
    _lmhead(k, Gemv(rows, K, bn, bk, dtype), N, eps, wt=False, xdtype=xdtype)
    return k.build(target)


def lmhead_argmax_gemv_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, eps: float,
                            target=None, wdtype=None, xdtype=None) -> IncoreFunction:
    """:func:`lmhead_argmax_tile` against an output-major ``[N, K]`` LM head (a tied model's
    embedding table as it is): blocks of ``bn`` vocabulary rows, the GEMV of
    :mod:`pto.incore.gemv` (its weights of ``wdtype``, quantized or not)."""
    k = InCore("lmhead_argmax_gemv_tile")
    _lmhead(k, Gemv(rows, K, bn, bk, dtype, wdtype, weight_tiles(dtype, wdtype, rows)), N, eps, wt=True,
            xdtype=xdtype)
    return k.build(target)


def _lmhead(k: InCore, g: Gemv, N: int, eps: float, wt: bool, xdtype=None) -> None:
    """The LM head's body: ``g.R`` rows (the R dim's default) against a ``[K, N]`` weight, or
    ``[N, K]`` with ``wt``; x of ``xdtype`` (None: ``g.dtype``)."""
    R = k.dim("R", g.R)
    x = k.memref("x", xdtype or g.dtype, shape=(R, g.K))
    w = k.memref("w", g.weights, shape=(N, g.K) if wt else (g.K, N))
    y = k.memref("y", f32, shape=(R, N))
    best, index = k.memref("best", f32), k.memref("index", f32)
    j = k.parallel("j", cdiv(N, g.bn))
    norm = RowNorm(k, R, g.bk, g.dtype, eps, g.K, xdtype)
    if wt:
        (acc,) = gemv_accumulate(k, x, {"": w}, replace(g, R=R), j, norm)
    else:
        acc = normed_gemm(k, x, w, norm, g.bn, j)
    _argmax_epilogue(k, acc, (y, best, index), R, N, g.bn, j)


def _argmax_epilogue(k: InCore, acc, outs, R, N: int, bn: int, j) -> None:
    """Store the block's logits and the first stage of greedy sampling: each row's largest
    logit of the block and its column in the whole vocabulary (``outs``: y, best, index)."""
    y, best, index = outs
    k.store(y, 0, j * bn, acc)
    # the columns past the vocabulary's end never win
    k.mask_cols(acc, acc, N - j * bn)
    top, col = k.tile("top", R, 1, f32), k.tile("col", R, 1, f32)
    k.rowmax(top, acc)
    k.rowargmax(col, acc)
    k.adds(col, col, j * bn)
    k.store(best, 0, j, top)
    k.store(index, 0, j, col)


def argmax_advance(blocks: int, target=None) -> IncoreFunction:
    """The step's end for one sequence: the token whose logit is the largest over the
    ``blocks`` first-stage maxima (``best``, ``index``) to ``tok``, the position plus one to
    ``pos`` (what the next step reads)."""
    k = InCore("argmax_advance")
    best, index = k.memref("best", f32), k.memref("index", f32)
    tok, pos = k.memref("tok", f32), k.memref("pos", f32)
    bt, it = k.tile("bt", 1, blocks, f32), k.tile("it", 1, blocks, f32)
    t, p = k.tile("t", 1, 1, f32), k.tile("p", 1, 1, f32)
    k.load(bt, best, 0, 0, pad=float("-inf"))
    k.load(it, index, 0, 0)
    k.rowtakemax(t, bt, it)
    k.store(tok, 0, 0, t)
    k.load(p, pos, 0, 0)
    k.adds(p, p, 1.0)
    k.store(pos, 0, 0, p)
    return k.build(target)


__all__ = ["embed_row", "rope_qkv_append", "decode_attn_part", "decode_attn_combine", "decode_attn_merge",
           "decode_attn_combine_parts", "lmhead_argmax_gemv_tile",
           "lmhead_argmax_tile", "argmax_advance"]
