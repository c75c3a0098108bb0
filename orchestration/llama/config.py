"""What a LLaMA-family layer is: its dimensions (one :class:`LlamaConfig` per named configuration,
or one read from a Hugging Face ``config.json`` by :mod:`.hf`) and the attention granularities
the program builds.

The family: multi-head (LLaMA-1/2) or grouped-query attention (``kv_heads`` dividing ``heads``:
LLaMA-3, Mistral), RMSNorm, RoPE (with linear or LLaMA-3 frequency scaling), an optional sliding
window (Mistral: query q sees keys k with ``q - window < k <= q``) and a SwiGLU FFN.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as Hugging Face's ``rope_scaling`` describes it: ``linear`` divides
    every inverse frequency by ``factor``; ``llama3`` (LLaMA 3.1) divides the low frequencies by
    ``factor``, keeps the high ones and interpolates between (``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings``)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    """Dimensions of one decoder layer. ``kv_heads`` (default: ``heads``) key/value heads, each
    shared by ``heads // kv_heads`` query heads; ``window``: sliding-window attention over that
    many tokens (None: plain causal)."""

    hidden: int
    heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-6  # RMSNorm
    theta: float = 10000.0  # RoPE base
    kv_heads: int | None = None
    window: int | None = None
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.kv_heads} kv heads do not divide {self.heads} query heads")

    @property
    def q_dim(self) -> int:
        """Columns of q and of the attention output: heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Columns of k and v: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.heads // self.kv_heads

    def shard(self, tp: int) -> LlamaConfig:
        """One rank's layer under ``tp``-way tensor parallelism (Megatron's split: the q, k, v,
        gate and up projections by columns, o and down by rows): ``1/tp`` of the query heads,
        the key/value heads and the FFN columns; hidden size, head size and the rest as the
        whole layer's. ValueError naming what does not divide."""
        if tp == 1:
            return self
        for what, n in (("query heads", self.heads), ("key/value heads", self.kv_heads), ("FFN columns", self.ffn)):
            if n % tp:
                raise ValueError(f"the {n} {what} do not divide among {tp} ranks")
        return replace(self, heads=self.heads // tp, kv_heads=self.kv_heads // tp, ffn=self.ffn // tp)

    def spec(self) -> str:
        """The configuration as one line that :func:`from_spec` reads back: the name a
        configuration from a file has in the program's settings (hashable, in every report)."""
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "rope_scaling":
                if v is not None:
                    parts.append("rope=" + "/".join(str(getattr(v, g.name)) for g in fields(v)))
            elif v is not None:
                parts.append(f"{f.name}={v}")
        return "hf:" + ",".join(parts)


def from_spec(spec: str) -> LlamaConfig:
    """The :class:`LlamaConfig` of :meth:`LlamaConfig.spec`."""
    if not spec.startswith("hf:"):
        raise ValueError(f"not a configuration spec: {spec!r}")
    kinds = {f.name: f.type for f in fields(LlamaConfig)}
    kw: dict = {}
    for part in spec[3:].split(","):
        key, _, val = part.partition("=")
        if key == "rope":
            kind, *rest = val.split("/")
            kw["rope_scaling"] = RopeScaling(kind, *(t(x) for t, x in zip((float, float, float, int), rest)))
        elif key not in kinds:
            raise ValueError(f"unknown field {key!r} in configuration spec {spec!r}")
        else:
            kw[key] = float(val) if key in ("eps", "theta") else int(val)
    return LlamaConfig(**kw)


CONFIGS = {
    "tiny": LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=704),
    "7b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=11008),
    # the family at the sizes people run (the GPU), and tiny ones of the same shape (the CPU)
    "llama2-7b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=11008, eps=1e-5),
    "llama3-8b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=14336, eps=1e-5, theta=500000.0, kv_heads=8),
    "mistral-7b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=14336, eps=1e-5, kv_heads=8, window=4096),
    "tiny-gqa": LlamaConfig(hidden=256, heads=8, head_dim=32, ffn=704, eps=1e-5, theta=500000.0, kv_heads=2),
    "tiny-swa": LlamaConfig(hidden=256, heads=8, head_dim=32, ffn=704, eps=1e-5, kv_heads=2, window=64),
}


def config_named(name: str) -> LlamaConfig:
    """A built-in configuration by name, or one from a file by its :meth:`LlamaConfig.spec`."""
    return CONFIGS[name] if name in CONFIGS else from_spec(name)


#: split: score, softmax update and output update per (q tile, kv tile) pair (the seed's 3 tasks);
#: pair: one task per pair; fused: one task per q tile (and the epilogue fusions)
ATTENTION_MODES = ("split", "pair", "fused")
