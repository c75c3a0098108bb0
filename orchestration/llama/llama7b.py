"""The orchestration of one LLaMA decoder layer (the ``llama7b`` program's module).

The seed's three phases, each a loop over row tiles with binary-expansion attributes:

1. per tile: RMSNorm, Q/K/V projections, RoPE on q and k (and the flash state init for the
   split and pair attention modes);
2. flash attention over (q tile, kv tile) pairs: ``split`` (score, softmax update, output update
   per pair: the seed's 3 tasks), ``pair`` (one task per pair) or ``fused`` (one task per q tile
   with the kv loop inside). Causal attention submits no fully masked pair, and with a sliding
   window no pair before the window either: a q tile's kv range starts at the kv tile holding
   its first row's first key (rounded down to a whole kv tile), for the pairs as for the fused
   task's k and v regions;
3. per tile: output projection, residual, RMSNorm, gate and up projections, SwiGLU, down
   projection, residual.

Grouped-query attention: k and v (and their weights) are ``kv_heads * head_dim`` wide, q and the
attention output ``heads * head_dim``; the attention functions map query heads to kv heads.

Tensor parallelism (``tp`` > 1, Megatron's split): the module is one rank's, the same on every
rank: its share of the heads and FFN columns (:meth:`LlamaConfig.shard`; the weights are the
rank's column shards of wq, wk, wv, wg, wu and row shards of wo, wd). The o and down projections
then give partial sums, which one task per row tile sums over the ranks with the residual added
(``allreduce_residual_tile``): it depends on that row tile's projection only and releases that
row tile to its consumers.

Tile heights come from the SRAM model of the target (:mod:`.tiling`): the flash-attention block
decides the q tile height, binary expansion runs blocks of base tiles with it and the residual
with the base height. Any sequence length works (the last tile is clipped).

The file is named after the program: the generated C names each call by its source line here
("call to `rope_tile` (llama7b.py:N)").
"""

from __future__ import annotations

from pto.orchestration.llama.config import LlamaConfig
from pto.orchestration.llama.tiling import fit_functions, loop_attrs

from pto import Orchestration, cdiv, emax, emin, f32
from pto.ir.dtypes import DType
from pto.target import Target


def build_module(cfg: LlamaConfig, dt: DType, target: Target, attention: str = "fused",
                 causal: bool = True, fuse: bool = False, tp: int = 1, reduce_dt: DType = DType.F32):
    """The layer for ``cfg`` in storage dtype ``dt``, tiled for ``target``, with ``attention``
    granularity (``split``, ``pair`` or ``fused``) and ``causal`` or bidirectional attention;
    ``fuse`` (fused attention only): RMSNorm folded into the projections, RoPE into q and k's;
    ``tp`` > 1: one rank's module of the layer split over ``tp`` ranks, its all-reduces summing
    in ``reduce_dt``."""
    cfg = cfg.shard(tp)
    t, fn = fit_functions(cfg, dt, target, causal, attention, fuse, tp, reduce_dt)
    H, NH, D, Fd = cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn
    QD, KVD = cfg.q_dim, cfg.kv_dim
    W = cfg.window if causal else None
    base = t.base
    o = Orchestration("llama7b")
    S = o.scalar("S")
    x = o.input("x", S, H, dt)
    g_attn, g_ffn = o.input("g_attn", 1, H, dt), o.input("g_ffn", 1, H, dt)
    wq, wk, wv, wo = o.input("wq", H, QD, dt), o.input("wk", H, KVD, dt), o.input("wv", H, KVD, dt), \
        o.input("wo", QD, H, dt)
    wg, wu, wd = o.input("wg", H, Fd, dt), o.input("wu", H, Fd, dt), o.input("wd", Fd, H, dt)
    cos, sin = o.input("cos", S, D // 2, dt), o.input("sin", S, D // 2, dt)
    width = {"q": QD, "k": KVD, "v": KVD, "qr": QD, "kr": KVD, "attn": QD}
    if fuse:
        v, qr, kr, attn, h = (o.temp(n, S, width.get(n, H), dt) for n in ("v", "qr", "kr", "attn", "h"))
    else:
        xn, q, k, v, qr, kr = (o.temp(n, S, width.get(n, H), dt) for n in ("xn", "q", "k", "v", "qr", "kr"))
        attn, h, hn = (o.temp(n, S, width.get(n, H), dt) for n in ("attn", "h", "hn"))
    act = o.temp("act", S, Fd, dt)
    if attention != "fused" or tp > 1:
        ao, dn = o.temp("ao", S, H, dt), o.temp("dn", S, H, dt)
    if attention != "fused":
        gate, up = o.temp("gate", S, Fd, dt), o.temp("up", S, Fd, dt)
    y = o.output("y", S, H, dt)
    if attention != "fused":
        m_, l_ = o.temp("m", S, NH, f32), o.temp("l", S, NH, f32)
        acc = o.temp("acc", S, QD, f32)
    if attention == "split":
        s_ = o.temp("s", S, NH * t.tk, f32)
        alpha = o.temp("alpha", S, NH, f32)
    n = o.let("n", cdiv(S, base))
    q_loop = loop_attrs(base, t.tq)

    def rows(i):
        return emin(i.rows, S - i * base)

    def tile(tensor, i, cols):
        return (tensor, i * base, 0, rows(i), cols)

    def gain(g):
        # the norm's 1 x H gain, as a region: a whole-tensor binding would span the functions'
        # column loops, a multiple of their chunk, wider than H where the chunk does not divide it
        return (g, 0, 0, 1, H)

    # phase 1: pre-attention, per row tile
    with o.for_loop("i", 0, n, **q_loop) as i:
        R = {"R": i.rows}
        if fuse:  # one task per projection, each with the norm folded in (and RoPE for q and k)
            for f, w, out, cols in ((fn.matmul_norm_rope, wq, qr, QD), (fn.matmul_norm_rope_k, wk, kr, KVD)):
                o.call(f, {"x": tile(x, i, H), "g": gain(g_attn), "w": w, "cos": tile(cos, i, D // 2),
                           "sin": tile(sin, i, D // 2), "y": tile(out, i, cols)}, dims=R)
            o.call(fn.matmul_norm, {"x": tile(x, i, H), "g": gain(g_attn), "w": wv, "y": tile(v, i, KVD)}, dims=R)
        else:
            o.call(fn.rmsnorm, {"x": tile(x, i, H), "g": gain(g_attn), "y": tile(xn, i, H)}, dims=R)
            for w, out, cols in ((wq, q, QD), (wk, k, KVD), (wv, v, KVD)):
                o.call(fn.matmul, {"x": tile(xn, i, H), "w": w, "y": tile(out, i, cols)},
                       dims={**R, "K": H, "N": cols})
            for f, src, dst, cols in ((fn.rope, q, qr, QD), (fn.rope_k, k, kr, KVD)):
                o.call(f, {"x": tile(src, i, cols), "cos": tile(cos, i, D // 2), "sin": tile(sin, i, D // 2),
                           "y": tile(dst, i, cols)}, dims=R)
        if attention != "fused":
            o.call(fn.init, {"m": tile(m_, i, NH), "l": tile(l_, i, NH), "acc": tile(acc, i, QD)},
                   dims={"TQ": i.rows})

    # phase 2: attention
    with o.for_loop("qi", 0, n, **q_loop) as qi:
        qpos = qi * base
        q_end = emin(S, qpos + qi.rows)
        TQ = {"TQ": qi.rows}
        # sliding window: the first kv row the q tile visits, that of its first row's first key
        # rounded down to a whole kv tile (0 without a window)
        lo = emax(0, ((qpos - (W - 1)) // t.tk) * t.tk) if W else 0
        if attention == "fused" and W:
            nkv, nfull = q_end - lo, (qpos // t.tk) * t.tk - lo
            # tiles starting before the last row's first key cross the window's edge
            nwin = emin(nfull, cdiv(emax(0, q_end - W - lo), t.tk) * t.tk)
            args = {"q": tile(qr, qi, QD), "k": (kr, lo, 0, nkv, KVD), "v": (v, lo, 0, nkv, KVD),
                    "o": tile(attn, qi, QD), "qoff": qpos - lo, "nwin": nwin, "nfull": nfull, "nkv": nkv}
            o.call(fn.fused, args, dims={**TQ, "TK": t.tk})
        elif attention == "fused":
            nkv = q_end if causal else S
            nfull = (qpos // t.tk) * t.tk if causal else (S // t.tk) * t.tk
            args = {"q": tile(qr, qi, QD), "k": (kr, 0, 0, nkv, KVD), "v": (v, 0, 0, nkv, KVD),
                    "o": tile(attn, qi, QD), "nfull": nfull, "nkv": nkv}
            if causal:
                args["qpos"] = qpos
            o.call(fn.fused, args, dims={**TQ, "TK": t.tk})
        else:
            # with a window, the kv loop counts base tiles from lo (a whole number of kv tiles)
            lo_tiles = emax(0, ((qpos - (W - 1)) // t.tk) * (t.tk // base)) if W else 0
            kv_tiles = (cdiv(q_end, base) - lo_tiles if W else cdiv(q_end, base)) if causal else n
            # the online-softmax state (m, l, acc) and split mode's scratch (s, alpha) of the q tile
            # are updated by every kv iteration: merging kv tiles re-associates that reduction
            with o.for_loop("kj", 0, kv_tiles, **loop_attrs(base, t.tk), reassociate=True) as kj:
                kpos = (kj + lo_tiles) * base if W else kj * base
                kv_rows = emin(kj.rows, S - kpos)
                kvr = (kr, kpos, 0, kv_rows, KVD)
                vr = (v, kpos, 0, kv_rows, KVD)
                dims = {**TQ, "TK": kj.rows}
                state = {"m": tile(m_, qi, NH), "l": tile(l_, qi, NH), "acc": tile(acc, qi, QD)}
                pos = {"qpos": qpos, "kpos": kpos} if causal else {}
                if attention == "pair":
                    o.call(fn.pair, {"q": tile(qr, qi, QD), "k": kvr, "v": vr, **state, **pos}, dims=dims)
                else:
                    sreg = (s_, qpos, 0, rows(qi), NH * kj.rows)
                    o.call(fn.score, {"q": tile(qr, qi, QD), "k": kvr, "s": sreg, **pos}, dims=dims)
                    o.call(fn.softmax, {"s": sreg, "m": state["m"], "l": state["l"],
                                        "alpha": tile(alpha, qi, NH)}, dims=dims)
                    o.call(fn.output, {"p": sreg, "v": vr, "alpha": tile(alpha, qi, NH), "acc": state["acc"]},
                           dims=dims)
            o.call(fn.normalize, {"l": tile(l_, qi, NH), "acc": tile(acc, qi, QD), "y": tile(attn, qi, QD)},
                   dims=TQ)

    # phase 3: post-attention and FFN, per row tile
    def projection(r, src, w, K, residual, out, partial):
        """``out = residual + src @ w``: one task with the residual in the epilogue (fused
        attention), or the product then the residual add; with ``tp`` > 1 the product is this
        rank's partial sum, summed over the ranks with the residual added by the all-reduce."""
        R = {"R": r.rows}
        if attention == "fused" and tp == 1:
            o.call(fn.matmul_residual, {"x": tile(src, r, K), "w": w, "r": tile(residual, r, H), "y": tile(out, r, H)},
                   dims={**R, "K": K, "N": H})
            return
        o.call(fn.matmul, {"x": tile(src, r, K), "w": w, "y": tile(partial, r, H)}, dims={**R, "K": K, "N": H})
        if tp > 1:
            o.call(fn.allreduce_residual, {"x": tile(partial, r, H), "r": tile(residual, r, H), "y": tile(out, r, H)},
                   dims=R)
        else:
            o.call(fn.residual, {"a": tile(residual, r, H), "b": tile(partial, r, H), "y": tile(out, r, H)}, dims=R)

    with o.for_loop("r", 0, n, **q_loop) as r:
        R = {"R": r.rows}
        projection(r, attn, wo, QD, x, h, ao if attention != "fused" or tp > 1 else None)
        if fuse:
            o.call(fn.matmul_norm_swiglu, {"x": tile(h, r, H), "g": gain(g_ffn), "wg": wg, "wu": wu,
                                           "y": tile(act, r, Fd)}, dims=R)
        elif attention == "fused":
            o.call(fn.rmsnorm, {"x": tile(h, r, H), "g": gain(g_ffn), "y": tile(hn, r, H)}, dims=R)
            o.call(fn.matmul_swiglu, {"x": tile(hn, r, H), "wg": wg, "wu": wu, "y": tile(act, r, Fd)},
                   dims={**R, "K": H, "N": Fd})
        else:
            o.call(fn.rmsnorm, {"x": tile(h, r, H), "g": gain(g_ffn), "y": tile(hn, r, H)}, dims=R)
            for w, out in ((wg, gate), (wu, up)):
                o.call(fn.matmul, {"x": tile(hn, r, H), "w": w, "y": tile(out, r, Fd)}, dims={**R, "K": H, "N": Fd})
            o.call(fn.swiglu, {"a": tile(gate, r, Fd), "b": tile(up, r, Fd), "y": tile(act, r, Fd)}, dims=R)
        projection(r, act, wd, Fd, h, y, dn if attention != "fused" or tp > 1 else None)
    return o.module()
