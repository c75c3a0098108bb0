"""The LLaMA layer in plain torch, written independently of the tiled program: the reference
``pto run llama7b --check`` compares against, the RoPE tables both use, and its matmul flops."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pto.orchestration.llama.config import LlamaConfig

from pto.ir.dtypes import DType


def inv_frequencies(cfg: LlamaConfig) -> torch.Tensor:
    """RoPE's inverse frequencies theta^(-2i/D) in float64, with the configuration's scaling:
    ``linear`` divides them all by the factor; ``llama3`` divides those of wavelengths above
    ``original / low_freq_factor`` by the factor, keeps those below ``original /
    high_freq_factor`` and interpolates in between (LLaMA 3.1's published rule)."""
    half = cfg.head_dim // 2
    inv = cfg.theta ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    rs = cfg.rope_scaling
    if rs is None:
        return inv
    if rs.kind == "linear":
        return inv / rs.factor
    if rs.kind != "llama3":
        raise ValueError(f"unknown RoPE scaling {rs.kind!r}")
    wavelen = 2 * math.pi / inv
    low_wl = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wl = rs.original_max_position_embeddings / rs.high_freq_factor
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / \
        (rs.high_freq_factor - rs.low_freq_factor)
    mid = (1 - smooth) * inv / rs.factor + smooth * inv
    return torch.where(wavelen > low_wl, inv / rs.factor, torch.where(wavelen < high_wl, inv, mid))


def rope_tables(seq: int, cfg: LlamaConfig, dtype: DType, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * inverse frequency (positions 0 .. seq - 1), each seq x D/2,
    computed in float64 and rounded once to ``dtype``."""
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv_frequencies(cfg)[None, :]
    return (ang.cos().to(device=device, dtype=dtype.torch), ang.sin().to(device=device, dtype=dtype.torch))


def reference_layer(inp: dict[str, torch.Tensor], cfg: LlamaConfig, causal: bool = True) -> torch.Tensor:
    """The layer with plain torch ops in the inputs' dtype (SDPA for attention; key/value heads
    repeated for grouped-query attention; the sliding window as a boolean mask), written
    independently of the tiled program."""
    x = inp["x"]
    S, H = x.shape
    NH, NKV, D = cfg.heads, cfg.kv_heads, cfg.head_dim

    def rmsnorm(t, g):
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + cfg.eps) * g.float()).to(t.dtype)

    def heads(t, n):
        return t.view(S, n, D).transpose(0, 1)

    cos = torch.cat([inp["cos"], inp["cos"]], dim=-1)
    sin = torch.cat([inp["sin"], inp["sin"]], dim=-1)

    def rope(t):
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    xn = rmsnorm(x, inp["g_attn"])
    q, k, v = heads(xn @ inp["wq"], NH), heads(xn @ inp["wk"], NKV), heads(xn @ inp["wv"], NKV)
    k, v = rope(k).repeat_interleave(NH // NKV, dim=0), v.repeat_interleave(NH // NKV, dim=0)
    if causal and cfg.window:
        pos = torch.arange(S, device=x.device)
        dist = pos[:, None] - pos[None, :]
        keep = (dist >= 0) & (dist < cfg.window)
        a = F.scaled_dot_product_attention(rope(q)[None], k[None], v[None], attn_mask=keep)[0]
    else:
        a = F.scaled_dot_product_attention(rope(q)[None], k[None], v[None], is_causal=causal)[0]
    h = x + a.transpose(0, 1).reshape(S, NH * D) @ inp["wo"]
    hn = rmsnorm(h, inp["g_ffn"])
    return h + (F.silu(hn @ inp["wg"]) * (hn @ inp["wu"])) @ inp["wd"]


def attended_pairs(seq: int, causal: bool, window: int | None) -> float:
    """(query, key) pairs attention computes: seq^2, the causal half, or within the window."""
    if not causal:
        return float(seq) * seq
    if not window:
        return 0.5 * seq * seq
    w = min(window, seq)
    return float(seq) * w - w * (w - 1) / 2


def layer_flops(cfg: LlamaConfig, seq: int, causal: bool = True) -> float:
    """Matmul flops of one layer (projections, attention QK^T and PV with the causal half or
    the window)."""
    H, Fd, QD, KVD = cfg.hidden, cfg.ffn, cfg.q_dim, cfg.kv_dim
    proj = 2.0 * seq * (2 * H * QD + 2 * H * KVD + 3 * H * Fd)
    attn = 4.0 * QD * attended_pairs(seq, causal, cfg.window)
    return proj + attn
