"""PyTorch's own tensor parallelism, written by hand: what bench/tp.py (a layer's prefill) and
bench/decode.py (a whole model's decode step) compare pto with in the same launch.

Both take Megatron's split over the default process group (q, k, v, gate and up by columns; o
and down by rows, ``torch.distributed.all_reduce`` after each) and are written apart from pto's
programs and from their references (RoPE as both take it: rotate-half with ``[P, D/2]`` tables).
The decode step's LM head is vocabulary-parallel (each rank its share of the ids' logits, the
ranks' best tokens gathered with ``all_gather_into_tensor``, the first of equal logits winning),
and the whole step is captured in a CUDA graph on a GPU (NCCL inside), as pto's step is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rmsnorm(t: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    t32 = t.float()
    return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps) * g.float()).to(t.dtype)


def _all_reduce(t: torch.Tensor, tp: int) -> torch.Tensor:
    if tp > 1:
        torch.distributed.all_reduce(t)
    return t


def torch_tp_layer(w: dict[str, torch.Tensor], cfg, tp: int) -> torch.Tensor:
    """The LLaMA layer on one rank's shards ``w`` (the whole layer with ``tp`` 1): causal SDPA over
    the rank's heads, the o and down projections' partial sums all-reduced."""
    x = w["x"]
    S = x.shape[0]
    NH, NKV, D = cfg.heads // tp, cfg.kv_heads // tp, cfg.head_dim
    cos, sin = torch.cat([w["cos"]] * 2, -1), torch.cat([w["sin"]] * 2, -1)

    def rope(t):
        return t * cos + torch.cat([-t[..., D // 2:], t[..., : D // 2]], -1) * sin

    xn = _rmsnorm(x, w["g_attn"], cfg.eps)
    q = rope((xn @ w["wq"]).view(S, NH, D).transpose(0, 1))
    k = rope((xn @ w["wk"]).view(S, NKV, D).transpose(0, 1)).repeat_interleave(NH // NKV, 0)
    v = (xn @ w["wv"]).view(S, NKV, D).transpose(0, 1).repeat_interleave(NH // NKV, 0)
    a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    h = x + _all_reduce(a.transpose(0, 1).reshape(S, NH * D) @ w["wo"], tp)
    hn = _rmsnorm(h, w["g_ffn"], cfg.eps)
    return h + _all_reduce((F.silu(hn @ w["wg"]) * (hn @ w["wu"])) @ w["wd"], tp)


class TorchTPDecode:
    """One decode step of a whole model (``ModelWeights``, ``[K, N]`` weights) on rank ``rank``
    of ``tp``, ``batch`` sequences with ``cache`` slots each (a ring: slot ``p mod cache`` holds
    position p). The state is ``tok`` and ``pos`` (``[B]`` int64), the caches ``k``/``v``
    (``[L, B, kv_heads / tp, cache, D]``: the rank's key/value heads); a call reads the tokens at
    their positions, appends their keys and values, and leaves the greedy next tokens in ``tok``,
    the positions advanced and the rank's share of the logits in ``logits``."""

    def __init__(self, w, tp: int, rank: int, batch: int, cache: int, rope: tuple[torch.Tensor, torch.Tensor]):
        cfg, c = w.config, w.config.layer
        self.cfg, self.tp, self.B, self.C = cfg, tp, batch, cache
        self.NH, self.NKV, self.D = c.heads // tp, c.kv_heads // tp, c.head_dim
        q0, kv0, F_ = rank * self.NH * self.D, rank * self.NKV * self.D, c.ffn // tp
        qd, kvd = self.NH * self.D, self.NKV * self.D

        def cols(t, a, n):
            return t[:, a:a + n]

        self.layers = [{"g_attn": x["g_attn"], "g_ffn": x["g_ffn"],
                        "wqkv": torch.cat([cols(x["wq"], q0, qd), cols(x["wk"], kv0, kvd), cols(x["wv"], kv0, kvd)],
                                          1).contiguous(),
                        "wo": x["wo"][q0:q0 + qd].contiguous(),
                        "wgu": torch.cat([cols(x["wg"], rank * F_, F_), cols(x["wu"], rank * F_, F_)], 1).contiguous(),
                        "wd": x["wd"][rank * F_:(rank + 1) * F_].contiguous()} for x in w.layers]
        V = cfg.vocab
        self.first = rank * V // tp  # the rank's ids: [first, first + count)
        count = (rank + 1) * V // tp - self.first
        self.emb, self.norm = w.embedding, w.norm
        self.head = w.lm_head[:, self.first:self.first + count].contiguous()
        dev, dt = w.embedding.device, w.embedding.dtype
        shape = (cfg.layers, batch, self.NKV, cache, self.D)
        self.k, self.v = torch.zeros(shape, dtype=dt, device=dev), torch.zeros(shape, dtype=dt, device=dev)
        self.cos, self.sin = (torch.cat([t, t], -1) for t in rope)
        self.tok = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.logits = torch.zeros(batch, count, dtype=torch.float32, device=dev)
        self.graph = None

    def _rope(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.D // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

    def step(self) -> None:
        """One step, eagerly (what :meth:`capture` records)."""
        cfg, B, C, NH, NKV, D = self.cfg, self.B, self.C, self.NH, self.NKV, self.D
        eps = cfg.layer.eps
        rows = torch.arange(B, device=self.tok.device)
        slot = self.pos % C
        cos, sin = self.cos[self.pos][:, None], self.sin[self.pos][:, None]  # [B, 1, D]
        valid = torch.arange(C, device=self.tok.device)[None] < torch.clamp(self.pos + 1, max=C)[:, None]
        mask = valid[:, None, None, :]  # [B, 1, 1, C]
        x = self.emb[self.tok]
        for i, lw in enumerate(self.layers):
            qkv = _rmsnorm(x, lw["g_attn"], eps) @ lw["wqkv"]
            q = self._rope(qkv[:, :NH * D].view(B, NH, D), cos, sin)
            k = self._rope(qkv[:, NH * D:(NH + NKV) * D].view(B, NKV, D), cos, sin)
            self.k[i][rows, :, slot] = k
            self.v[i][rows, :, slot] = qkv[:, (NH + NKV) * D:].view(B, NKV, D)
            keys = self.k[i].repeat_interleave(NH // NKV, 1)
            values = self.v[i].repeat_interleave(NH // NKV, 1)
            a = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask)[:, :, 0]
            x = x + _all_reduce(a.reshape(B, NH * D) @ lw["wo"], self.tp)
            gu = _rmsnorm(x, lw["g_ffn"], eps) @ lw["wgu"]
            half = gu.shape[1] // 2
            x = x + _all_reduce((F.silu(gu[:, :half]) * gu[:, half:]) @ lw["wd"], self.tp)
        self.logits.copy_((_rmsnorm(x, self.norm, eps) @ self.head).float())
        best, at = self.logits.max(-1)  # the first of equal logits
        mine = torch.stack([best, (at + self.first).float()], 1)  # [B, 2]
        if self.tp > 1:
            every = torch.empty(self.tp * B, 2, dtype=mine.dtype, device=mine.device)
            torch.distributed.all_gather_into_tensor(every, mine)
            every = every.view(self.tp, B, 2)
            winner = every[..., 0].argmax(0)  # the first rank of equal logits: the lowest id
            mine = every[winner, rows]
        self.tok.copy_(mine[:, 1].long())
        self.pos.add_(1)

    def capture(self) -> None:
        """Record :meth:`step` in a CUDA graph (after warm-up steps on a side stream, whose state
        changes the caller resets); :meth:`__call__` then replays it."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def __call__(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.replay()


__all__ = ["torch_tp_layer", "TorchTPDecode"]
