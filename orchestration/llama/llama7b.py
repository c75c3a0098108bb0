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

With the norms folded in (``LayerForm.fuse``, ``--fuse-norm-rope``): per row tile a statistics
task (each row's rsqrt(mean(x^2) + eps)), then the q and k projections with RoPE in their
epilogue and the v projection, each scaling its rows by the statistics; before the FFN the same
for h, then the gate/up projection. The weights after a norm hold its gain (inputs ``wq_g``,
``wk_g``, ``wv_g``, and ``wgu_g``: the gate and up weights' columns interleaved, one product
computing both; :func:`pto.orchestration.llama.weights.fold_gains`), and the module takes no
gains.

Grouped-query attention: k and v (and their weights) are ``kv_heads * head_dim`` wide, q and the
attention output ``heads * head_dim``; the attention functions map query heads to kv heads.

Tensor parallelism (``tp`` > 1, Megatron's split): the module is one rank's, the same on every
rank: its share of the heads and FFN columns (:meth:`LlamaConfig.shard`; the weights are the
rank's column shards of wq, wk, wv, wg, wu and row shards of wo, wd). The o and down projections
then give partial sums: one task per row tile computes its product, sums it over the ranks and
adds the residual (``matmul_allreduce_residual_tile``), releasing that row tile to its
consumers.

Tile heights come from the SRAM model of the target (:mod:`.tiling`): the flash-attention block
decides the q tile height, binary expansion runs blocks of base tiles with it and the residual
with the base height. Any sequence length works (the last tile is clipped).

The file is named after the program: the generated C names each call by its source line here
("call to `rope_tile` (llama7b.py:N)").
"""

from __future__ import annotations

from pto.orchestration.llama.config import LlamaConfig
from pto.orchestration.llama.tiling import LayerForm, fit_functions, loop_attrs
from pto.orchestration.llama.weights import FOLDED, GATE_UP, folded

from pto import Orchestration, cdiv, emax, emin, f32
from pto.ir.dtypes import DType
from pto.machine.target import Target

#: the keys (after RoPE) and the values of every position, ``[S, kv_heads * head_dim]``: outputs
#: of a module of ``LayerForm(kv_out=True)`` (a prefill fills its decode cache from them)
KV_OUTPUTS = ("k", "v")


def build_module(cfg: LlamaConfig, dt: DType, target: Target, form: LayerForm | None = None):
    """The layer for ``cfg`` in storage dtype ``dt``, tiled for ``target``, of the given ``form``
    (attention granularity, causal or not, fusions, tensor parallelism: :class:`LayerForm`; the
    default: causal fused attention, nothing folded, one rank)."""
    form = form or LayerForm()
    return _Layer(cfg.shard(form.tp), dt, target, form).module()


class _Layer:
    """The module under construction: its tensors, then the three phases (the order of the
    calls is the module's)."""

    def __init__(self, cfg: LlamaConfig, dt: DType, target: Target, form: LayerForm):
        self.cfg, self.dt, self.form = cfg, dt, form
        self.t, self.fn = fit_functions(cfg, dt, target, form)
        self.o = Orchestration("llama7b")
        self.S = self.o.scalar("S")
        self._tensors()
        self.n = self.o.let("n", cdiv(self.S, self.t.base))
        self.q_loop = loop_attrs(self.t.base, self.t.tq)

    def _tensors(self) -> None:
        o, dt, S, c, f = self.o, self.dt, self.S, self.cfg, self.form
        H, NH, D, Fd, QD, KVD = c.hidden, c.heads, c.head_dim, c.ffn, c.q_dim, c.kv_dim
        T = self.T = {"x": o.input("x", S, H, dt)}
        if not f.fuse:
            T["g_attn"], T["g_ffn"] = o.input("g_attn", 1, H, dt), o.input("g_ffn", 1, H, dt)
        # with the norms folded in, the weights after them hold their gains (wq_g = diag(g_attn) wq, ...),
        # the gate and up weights' columns interleaved in one
        w = {n: folded(n) if f.fuse and n in FOLDED else n for n in ("wq", "wk", "wv", "wo", "wg", "wu", "wd")}
        kn = {"wq": (H, QD), "wk": (H, KVD), "wv": (H, KVD), "wo": (QD, H), "wg": (H, Fd), "wu": (H, Fd),
              "wd": (Fd, H)}
        for name in ("wq", "wk", "wv", "wo", *(("wgu",) if f.fuse else ("wg", "wu")), "wd"):
            if name == "wgu":
                T[name] = o.input(GATE_UP, H, 2 * Fd, dt)
            else:
                K, N = kn[name]
                q = f.wtype(name)  # a quantized matrix as stored: output-major, [N, K]
                T[name] = o.input(w[name], N, K, q) if q is not None else o.input(w[name], K, N, dt)
        T["cos"], T["sin"] = o.input("cos", S, D // 2, dt), o.input("sin", S, D // 2, dt)
        width = {"qkv": QD + 2 * KVD, "v": KVD, "qr": QD, "kr": KVD, "attn": QD}
        # unfused, the q, k and v projections write one tensor's columns: where the weights are
        # blocks of one buffer too (LlamaProgram.packed_inputs), the wave executor launches the
        # projections of one function variant as one batch (pto.exec.waves)
        names = ("v", "qr", "kr", "attn", "h") if f.fuse else ("xn", "qkv", "qr", "kr", "attn", "h", "hn")
        if f.kv_out:  # the keys and values are outputs of their own: q and k alone share a tensor
            width["qkv"] = QD + KVD
            T["kr"], T["v"] = (o.output(KV_OUTPUTS[0], S, KVD, dt), o.output(KV_OUTPUTS[1], S, KVD, dt))
            names = tuple(n for n in names if n not in ("v", "kr"))
        for name in names:
            T[name] = o.temp(name, S, width.get(name, H), dt)
        #: where q, k and v are: (tensor, first column)
        self.at = {"v": ("v", 0)} if f.fuse else {"q": ("qkv", 0), "k": ("qkv", QD), "v": ("qkv", QD + KVD)}
        if f.kv_out:
            self.at["v"] = ("v", 0)
        if f.fuse:  # each row's rsqrt(mean(x^2) + eps) before attention and before the FFN
            T["rs_attn"], T["rs_ffn"] = o.temp("rs_attn", S, 1, f32), o.temp("rs_ffn", S, 1, f32)
        T["act"] = o.temp("act", S, Fd, dt)
        if f.attention != "fused" and f.tp == 1:  # the partial products, then the residual add
            T["ao"], T["dn"] = o.temp("ao", S, H, dt), o.temp("dn", S, H, dt)
        if f.attention != "fused":
            T["gate"], T["up"] = o.temp("gate", S, Fd, dt), o.temp("up", S, Fd, dt)
        T["y"] = o.output("y", S, H, dt)
        if f.attention != "fused":
            T["m"], T["l"] = o.temp("m", S, NH, f32), o.temp("l", S, NH, f32)
            T["acc"] = o.temp("acc", S, QD, f32)
        if f.attention == "split":
            T["s"] = o.temp("s", S, NH * self.t.tk, f32)
            T["alpha"] = o.temp("alpha", S, NH, f32)

    def rows(self, i):
        return emin(i.rows, self.S - i * self.t.base)

    def tile(self, name: str, i, cols):
        return (self.T[name], i * self.t.base, 0, self.rows(i), cols)

    def part(self, name: str, row0, rows, cols):
        """Rows ``[row0, row0 + rows)`` of q, k or v (:attr:`at`)."""
        tensor, col0 = self.at[name]
        return (self.T[tensor], row0, col0, rows, cols)

    def gain(self, name: str):
        # the norm's 1 x H gain, as a region: a whole-tensor binding would span the functions'
        # column loops, a multiple of their chunk, wider than H where the chunk does not divide it
        return (self.T[name], 0, 0, 1, self.cfg.hidden)

    def module(self):
        self.pre_attention()
        self.attention()
        self.post_attention()
        return self.o.module()

    # phase 1: pre-attention, per row tile
    def pre_attention(self) -> None:
        o, fn, T, tile, c = self.o, self.fn, self.T, self.tile, self.cfg
        H, D, QD, KVD = c.hidden, c.head_dim, c.q_dim, c.kv_dim
        with o.for_loop("i", 0, self.n, **self.q_loop) as i:
            R = {"R": i.rows}
            if self.form.fuse:  # the rows' scale, then one task per projection with the norm folded in
                # (and RoPE for q and k)
                rs = tile("rs_attn", i, 1)
                o.call(fn.rms_scale, {"x": tile("x", i, H), "r": rs}, dims=R)
                for f, w, out, cols in ((fn.matmul_norm_rope, "wq", "qr", QD),
                                        (fn.matmul_norm_rope_k, "wk", "kr", KVD)):
                    o.call(f, {"x": tile("x", i, H), "w": T[w], "rs": rs, "cos": tile("cos", i, D // 2),
                               "sin": tile("sin", i, D // 2), "y": tile(out, i, cols)}, dims=R)
                o.call(fn.matmul_norm, {"x": tile("x", i, H), "w": T["wv"], "rs": rs,
                                        "y": self.part("v", i * self.t.base, self.rows(i), KVD)}, dims=R)
            else:
                o.call(fn.rmsnorm, {"x": tile("x", i, H), "g": self.gain("g_attn"), "y": tile("xn", i, H)}, dims=R)
                row0, rows = i * self.t.base, self.rows(i)
                for w, out, cols in (("wq", "q", QD), ("wk", "k", KVD), ("wv", "v", KVD)):
                    o.call(fn.projection("matmul", w),
                           {"x": tile("xn", i, H), "w": T[w], "y": self.part(out, row0, rows, cols)},
                           dims={**R, "K": H, "N": cols})
                for f, src, dst, cols in ((fn.rope, "q", "qr", QD), (fn.rope_k, "k", "kr", KVD)):
                    o.call(f, {"x": self.part(src, row0, rows, cols), "cos": tile("cos", i, D // 2),
                               "sin": tile("sin", i, D // 2), "y": tile(dst, i, cols)}, dims=R)
            if self.form.attention != "fused":
                o.call(fn.init, {"m": tile("m", i, c.heads), "l": tile("l", i, c.heads), "acc": tile("acc", i, QD)},
                       dims={"TQ": i.rows})

    # phase 2: attention
    def attention(self) -> None:
        W = self.cfg.window if self.form.causal else None
        with self.o.for_loop("qi", 0, self.n, **self.q_loop) as qi:
            qpos = qi * self.t.base
            q_end = emin(self.S, qpos + qi.rows)
            if self.form.attention == "fused" and W:
                self._fused_window(qi, qpos, q_end, W)
            elif self.form.attention == "fused":
                self._fused(qi, qpos, q_end)
            else:
                self._pairs(qi, qpos, q_end, W)

    def _fused_window(self, qi, qpos, q_end, W) -> None:
        """Sliding window: the first kv row the q tile visits is that of its first row's first
        key rounded down to a whole kv tile."""
        tk, QD, KVD = self.t.tk, self.cfg.q_dim, self.cfg.kv_dim
        lo = emax(0, ((qpos - (W - 1)) // tk) * tk)
        nkv, nfull = q_end - lo, (qpos // tk) * tk - lo
        # tiles starting before the last row's first key cross the window's edge
        nwin = emin(nfull, cdiv(emax(0, q_end - W - lo), tk) * tk)
        args = {"q": self.tile("qr", qi, QD), "k": (self.T["kr"], lo, 0, nkv, KVD), "v": self.part("v", lo, nkv, KVD),
                "o": self.tile("attn", qi, QD), "qoff": qpos - lo, "nwin": nwin, "nfull": nfull, "nkv": nkv}
        self.o.call(self.fn.fused, args, dims={"TQ": qi.rows, "TK": tk})

    def _fused(self, qi, qpos, q_end) -> None:
        tk, QD, KVD, causal = self.t.tk, self.cfg.q_dim, self.cfg.kv_dim, self.form.causal
        nkv = q_end if causal else self.S
        nfull = (qpos // tk) * tk if causal else (self.S // tk) * tk
        args = {"q": self.tile("qr", qi, QD), "k": (self.T["kr"], 0, 0, nkv, KVD), "v": self.part("v", 0, nkv, KVD),
                "o": self.tile("attn", qi, QD), "nfull": nfull, "nkv": nkv}
        if causal:
            args["qpos"] = qpos
        self.o.call(self.fn.fused, args, dims={"TQ": qi.rows, "TK": tk})

    def _pairs(self, qi, qpos, q_end, W) -> None:
        """The split and pair modes: a loop over the q tile's kv tiles, then the normalization."""
        o, fn, T, tile, t, base = self.o, self.fn, self.T, self.tile, self.t, self.t.base
        NH, QD, KVD, causal = self.cfg.heads, self.cfg.q_dim, self.cfg.kv_dim, self.form.causal
        TQ = {"TQ": qi.rows}
        # with a window, the kv loop counts base tiles from lo (a whole number of kv tiles)
        lo_tiles = emax(0, ((qpos - (W - 1)) // t.tk) * (t.tk // base)) if W else 0
        kv_tiles = (cdiv(q_end, base) - lo_tiles if W else cdiv(q_end, base)) if causal else self.n
        # the online-softmax state (m, l, acc) and split mode's scratch (s, alpha) of the q tile
        # are updated by every kv iteration: merging kv tiles re-associates that reduction
        with o.for_loop("kj", 0, kv_tiles, **loop_attrs(base, t.tk), reassociate=True) as kj:
            kpos = (kj + lo_tiles) * base if W else kj * base
            kv_rows = emin(kj.rows, self.S - kpos)
            kvr, vr = (T["kr"], kpos, 0, kv_rows, KVD), self.part("v", kpos, kv_rows, KVD)
            dims = {**TQ, "TK": kj.rows}
            state = {"m": tile("m", qi, NH), "l": tile("l", qi, NH), "acc": tile("acc", qi, QD)}
            pos = {"qpos": qpos, "kpos": kpos} if causal else {}
            if self.form.attention == "pair":
                o.call(fn.pair, {"q": tile("qr", qi, QD), "k": kvr, "v": vr, **state, **pos}, dims=dims)
            else:
                sreg = (T["s"], qpos, 0, self.rows(qi), NH * kj.rows)
                o.call(fn.score, {"q": tile("qr", qi, QD), "k": kvr, "s": sreg, **pos}, dims=dims)
                o.call(fn.softmax, {"s": sreg, "m": state["m"], "l": state["l"], "alpha": tile("alpha", qi, NH)},
                       dims=dims)
                o.call(fn.output, {"p": sreg, "v": vr, "alpha": tile("alpha", qi, NH), "acc": state["acc"]},
                       dims=dims)
        o.call(fn.normalize, {"l": tile("l", qi, NH), "acc": tile("acc", qi, QD), "y": tile("attn", qi, QD)}, dims=TQ)

    # phase 3: post-attention and FFN, per row tile
    def _projection(self, r, src: str, w: str, K, residual: str, out: str, partial: str | None) -> None:
        """``out = residual + src @ w``: one task with the residual in the epilogue (fused
        attention), or the product then the residual add; with ``tp`` > 1 one task of the
        product, its sum over the ranks and the residual."""
        o, fn, tile, H = self.o, self.fn, self.tile, self.cfg.hidden
        R = {"R": r.rows}
        x, y = tile(src, r, K), tile(out, r, H)
        if self.form.tp > 1:
            o.call(fn.matmul_allreduce_residual, {"x": x, "w": self.T[w], "r": tile(residual, r, H), "y": y},
                   dims={**R, "K": K, "N": H})
        elif self.form.attention == "fused":
            o.call(fn.projection("residual", w), {"x": x, "w": self.T[w], "r": tile(residual, r, H), "y": y},
                   dims={**R, "K": K, "N": H})
        else:
            o.call(fn.projection("matmul", w), {"x": x, "w": self.T[w], "y": tile(partial, r, H)},
                   dims={**R, "K": K, "N": H})
            o.call(fn.residual, {"a": tile(residual, r, H), "b": tile(partial, r, H), "y": y}, dims=R)

    def post_attention(self) -> None:
        o, fn, T, tile, f = self.o, self.fn, self.T, self.tile, self.form
        H, Fd = self.cfg.hidden, self.cfg.ffn
        split = f.attention != "fused" and f.tp == 1
        with o.for_loop("r", 0, self.n, **self.q_loop) as r:
            R = {"R": r.rows}
            self._projection(r, "attn", "wo", self.cfg.q_dim, "x", "h", "ao" if split else None)
            if f.fuse:
                rs = tile("rs_ffn", r, 1)
                o.call(fn.rms_scale, {"x": tile("h", r, H), "r": rs}, dims=R)
                o.call(fn.matmul_norm_swiglu, {"x": tile("h", r, H), "w": T["wgu"], "rs": rs, "y": tile("act", r, Fd)},
                       dims=R)
            elif f.attention == "fused":
                o.call(fn.rmsnorm, {"x": tile("h", r, H), "g": self.gain("g_ffn"), "y": tile("hn", r, H)}, dims=R)
                o.call(fn.projection("swiglu", "wg"),
                       {"x": tile("hn", r, H), "wg": T["wg"], "wu": T["wu"], "y": tile("act", r, Fd)},
                       dims={**R, "K": H, "N": Fd})
            else:
                o.call(fn.rmsnorm, {"x": tile("h", r, H), "g": self.gain("g_ffn"), "y": tile("hn", r, H)}, dims=R)
                for w, out in (("wg", "gate"), ("wu", "up")):
                    o.call(fn.projection("matmul", w), {"x": tile("hn", r, H), "w": T[w], "y": tile(out, r, Fd)},
                           dims={**R, "K": H, "N": Fd})
                o.call(fn.swiglu, {"a": tile("gate", r, Fd), "b": tile("up", r, Fd), "y": tile("act", r, Fd)}, dims=R)
            self._projection(r, "act", "wd", Fd, "h", "y", "dn" if split else None)
