"""What a LLaMA layer is: its dimensions (one :class:`LlamaConfig` per named configuration) and
the attention granularities the program builds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    """Dimensions of one decoder layer (hidden = heads * head_dim)."""

    hidden: int
    heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-6  # RMSNorm
    theta: float = 10000.0  # RoPE base


CONFIGS = {
    "tiny": LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=704),
    "7b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=11008),
}

#: split: score, softmax update and output update per (q tile, kv tile) pair (the seed's 3 tasks);
#: pair: one task per pair; fused: one task per q tile (and the epilogue fusions)
ATTENTION_MODES = ("split", "pair", "fused")
