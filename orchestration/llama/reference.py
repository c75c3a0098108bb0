"""The LLaMA layer in plain torch, written independently of the tiled program: the reference
``pto run llama7b --check`` compares against, the RoPE tables both use, and its matmul flops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pto.orchestration.llama.config import LlamaConfig

from pto.ir.dtypes import DType


def rope_tables(seq: int, cfg: LlamaConfig, dtype: DType, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/D), each seq x D/2."""
    half = cfg.head_dim // 2
    inv = cfg.theta ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return (ang.cos().to(device=device, dtype=dtype.torch), ang.sin().to(device=device, dtype=dtype.torch))


def reference_layer(inp: dict[str, torch.Tensor], cfg: LlamaConfig, causal: bool = True) -> torch.Tensor:
    """The layer with plain torch ops in the inputs' dtype (SDPA for attention), written
    independently of the tiled program."""
    x = inp["x"]
    S, H = x.shape
    NH, D = cfg.heads, cfg.head_dim

    def rmsnorm(t, g):
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + cfg.eps) * g.float()).to(t.dtype)

    def heads(t):
        return t.view(S, NH, D).transpose(0, 1)

    cos = torch.cat([inp["cos"], inp["cos"]], dim=-1)
    sin = torch.cat([inp["sin"], inp["sin"]], dim=-1)

    def rope(t):
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    xn = rmsnorm(x, inp["g_attn"])
    q, k, v = heads(xn @ inp["wq"]), heads(xn @ inp["wk"]), heads(xn @ inp["wv"])
    a = F.scaled_dot_product_attention(rope(q)[None], rope(k)[None], v[None], is_causal=causal)[0]
    h = x + a.transpose(0, 1).reshape(S, H) @ inp["wo"]
    hn = rmsnorm(h, inp["g_ffn"])
    return h + (F.silu(hn @ inp["wg"]) * (hn @ inp["wu"])) @ inp["wd"]


def layer_flops(cfg: LlamaConfig, seq: int, causal: bool = True) -> float:
    """Matmul flops of one layer (projections, attention QK^T and PV with the causal half)."""
    H, Fd = cfg.hidden, cfg.ffn
    proj = 2.0 * seq * H * (4 * H + 3 * Fd)
    attn = 4.0 * seq * seq * H * (0.5 if causal else 1.0)
    return proj + attn
