"""What a whole LLaMA-family model is: :class:`ModelConfig` (the per-layer
:class:`~pto.orchestration.llama.config.LlamaConfig` plus what only the whole model has), read
from a GGUF file's metadata or from a Hugging Face folder's config.json.

GGUF: ``general.architecture`` must be ``llama`` (llama.cpp files LLaMA 1/2/3, Mistral and
SmolLM under it). Read: ``llama.embedding_length``, ``block_count``, ``attention.head_count``,
``attention.head_count_kv``, ``feed_forward_length``, ``attention.layer_norm_rms_epsilon``,
``rope.freq_base``, ``rope.scaling.*`` (none or linear), ``context_length``, ``vocab_size`` (else
the token list's length), ``attention.sliding_window``; the output projection's absence means
tied embeddings; LLaMA 3.1's ``rope_freqs.weight`` (per-frequency divisors, llama.cpp's form of
the ``llama3`` scaling) is matched to the ``llama3`` rule. Any other ``llama.*`` key is refused
with one line naming it: a key this reader does not know might change the arithmetic.

Hugging Face: the layer through :func:`~pto.orchestration.llama.hf.parse_hf_config` (which
refuses unknown fields), and here the whole-model fields it ignores: ``vocab_size``,
``num_hidden_layers``, ``tie_word_embeddings``, ``max_position_embeddings``, ``bos_token_id``,
``eos_token_id`` (with generation_config.json's), the checkpoint's ``dtype`` and
``architectures``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from pto.orchestration.llama.config import LlamaConfig, RopeScaling
from pto.orchestration.llama.hf import HEAD_DIMS, parse_hf_config, read_config_json
from pto.orchestration.llama.reference import inv_frequencies
from pto.orchestration.model.gguf_file import GGUFFile, from_checkpoint

from pto.errors import UsageError


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only model: ``layers`` identical decoder layers of shape ``layer``, a
    ``vocab``-token embedding and LM head (the same matrix when ``tied``), RoPE positions up to
    ``max_positions`` (the context it was trained for). ``bos_id``: the token a prompt may begin
    with (None: none); ``eos_ids``: the tokens that end generation. ``dtype``: how the checkpoint
    stores its weights (``Q4_1``, ``F16``, ... for GGUF; ``bfloat16``, ... for Hugging Face),
    for reports: weights load in the dtype the caller asks for. ``arch``: ``llama`` or
    ``mistral``."""

    layer: LlamaConfig
    vocab: int
    layers: int
    tied: bool
    max_positions: int
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    arch: str = "llama"

    @property
    def hidden(self) -> int:
        return self.layer.hidden

    def spec(self) -> str:
        """The shape as one line (the architecture, the layer's :meth:`LlamaConfig.spec`, the
        vocabulary, layers, tied embeddings, context): the name a configuration read from a
        file has in the model program's settings (in every report and cache key)."""
        tied = ",tied" if self.tied else ""
        return (f"{self.arch}:{self.layer.spec().removeprefix('hf:')},vocab={self.vocab},layers={self.layers}"
                f"{tied},positions={self.max_positions}")

    def shard(self, tp: int) -> ModelConfig:
        """One rank's model under ``tp``-way tensor parallelism: every layer split as
        :meth:`LlamaConfig.shard` splits it (ValueError naming what does not divide); the
        embedding, the final norm and the LM head whole on every rank."""
        return self if tp == 1 else replace(self, layer=self.layer.shard(tp))


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The configuration of a GGUF file or a Hugging Face model folder (config.json)."""
    return from_checkpoint(path, hf_config, gguf_config)


# -- GGUF ------------------------------------------------------------------------------------------

_GGUF_KEYS = """
    context_length embedding_length block_count feed_forward_length vocab_size attention.head_count
    attention.head_count_kv attention.layer_norm_rms_epsilon attention.key_length attention.value_length
    attention.sliding_window rope.freq_base rope.dimension_count rope.scaling.type rope.scaling.factor
    rope.scaling.original_context_length rope.scaling.finetuned expert_count expert_used_count
"""
#: the ``llama.*`` keys read (the rest are refused)
GGUF_KEYS = frozenset(_GGUF_KEYS.split())


def gguf_config(f: GGUFFile) -> ModelConfig:
    """The configuration in a GGUF file's metadata."""
    arch = f.value("general.architecture", None)
    if arch != "llama":
        f.fail(f"general.architecture is {arch!r}; only 'llama' (LLaMA, Mistral, SmolLM, ...) is supported")
    for key in f.metadata_keys():
        if key.startswith("llama.") and key[len("llama."):] not in GGUF_KEYS:
            f.fail(f"unsupported metadata key {key!r} (= {f.value(key)!r}): this model does not compute it")
    for key in ("expert_count", "expert_used_count"):
        if f.integer(f"llama.{key}", 0):
            f.fail(f"llama.{key} is {f.value(f'llama.{key}')}: mixtures of experts are not supported")
    hidden, heads = f.integer("llama.embedding_length", minimum=1), f.integer("llama.attention.head_count", minimum=1)
    kv_heads = f.integer("llama.attention.head_count_kv", heads, minimum=1)
    if heads % kv_heads:
        f.fail(f"llama.attention.head_count_kv {kv_heads} does not divide llama.attention.head_count {heads}")
    head_dim = f.integer("llama.attention.key_length", hidden // heads)
    for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
        if f.integer(key, head_dim) != head_dim:
            f.fail(f"{key} {f.value(key)} differs from the head size {head_dim} (not supported)")
    if head_dim not in HEAD_DIMS:
        f.fail(f"head size {head_dim} is not supported (supported: {', '.join(map(str, HEAD_DIMS))})")
    ffn = f.integer("llama.feed_forward_length", minimum=1)
    window = f.integer("llama.attention.sliding_window", 0) or None
    layer = LlamaConfig(hidden=hidden, heads=heads, head_dim=head_dim, ffn=ffn,
                        eps=f.number("llama.attention.layer_norm_rms_epsilon"),
                        theta=f.number("llama.rope.freq_base", 10000.0), kv_heads=kv_heads, window=window)
    layer = _gguf_rope_scaling(f, layer)
    tokens = f.value("tokenizer.ggml.tokens", ())
    vocab = f.integer("llama.vocab_size", len(tokens))
    if not vocab:
        f.fail("no vocabulary size (neither llama.vocab_size nor tokenizer.ggml.tokens)")
    eos = [f.integer(f"tokenizer.ggml.{k}_token_id", None) for k in ("eos", "eot", "eom")]
    bos = f.integer("tokenizer.ggml.bos_token_id", None)
    return ModelConfig(layer=layer, vocab=vocab, layers=f.integer("llama.block_count", minimum=1),
                       tied="output.weight" not in f.tensors,
                       max_positions=f.integer("llama.context_length", minimum=1), bos_id=bos,
                       eos_ids=tuple(dict.fromkeys(e for e in eos if e is not None)),
                       dtype=_gguf_dtype(f), arch="llama")


def _gguf_dtype(f: GGUFFile) -> str:
    """The file's weight type: ``general.file_type``'s name (``Q4_1``), else that of most matrices."""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(f.value("general.file_type", None)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        kinds = [f.qtype(n) for n in f.tensors if len(f.shape(n)) == 2]
        return max(set(kinds), key=kinds.count) if kinds else "F32"


def _gguf_rope_scaling(f: GGUFFile, layer: LlamaConfig) -> LlamaConfig:
    """``layer`` with the file's RoPE scaling: ``rope.scaling.type`` linear (or none), or LLaMA
    3.1's ``rope_freqs.weight``, accepted when the ``llama3`` rule with LLaMA 3.1's published
    low/high frequency factors (1, 4) reproduces it."""
    kind = f.value("llama.rope.scaling.type", "none")
    if kind == "linear":
        layer = replace(layer, rope_scaling=RopeScaling("linear", f.number("llama.rope.scaling.factor")))
    elif kind != "none":
        f.fail(f"llama.rope.scaling.type {kind!r} is not supported (supported: none, linear)")
    if "rope_freqs.weight" not in f.tensors:
        return layer
    if layer.rope_scaling is not None:
        f.fail("both llama.rope.scaling.type linear and rope_freqs.weight: not supported")
    divisors = f.tensor("rope_freqs.weight", (layer.head_dim // 2,), torch.float64)
    orig = f.integer("llama.rope.scaling.original_context_length", 8192)
    cand = replace(layer, rope_scaling=RopeScaling("llama3", float(divisors.max()), 1.0, 4.0, orig))
    implied = inv_frequencies(layer) / inv_frequencies(cand)
    if not torch.allclose(implied, divisors, rtol=1e-5, atol=0):
        f.fail("rope_freqs.weight is not LLaMA 3.1's frequency scaling (factor "
               f"{float(divisors.max())}, low/high frequency factors 1 and 4, original context {orig})")
    return cand


# -- Hugging Face ----------------------------------------------------------------------------------

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
#: transformers' defaults when config.json leaves a field out (LlamaConfig's, MistralConfig's)
_DEFAULT_POSITIONS = {"llama": 2048, "mistral": 131072}


def hf_config(folder: str | os.PathLike) -> ModelConfig:
    """The configuration in a Hugging Face model folder's config.json (and the end-of-generation
    tokens of its generation_config.json)."""
    where = str(Path(folder) / "config.json")
    data = read_config_json(folder, where)
    layer = parse_hf_config(data, where)
    arch = data.get("model_type", "llama")

    def fail(msg: str):
        raise UsageError(f"{where}: {msg}")

    def integer(key: str, default=None, allow_none: bool = False) -> int | None:
        v = data.get(key, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            fail(f"field {key!r} must be a non-negative integer, got {json.dumps(v)}")
        return v

    archs = data.get("architectures") or [ARCHITECTURES[arch]]
    if archs != [ARCHITECTURES[arch]]:
        fail(f"architectures {json.dumps(archs)} is not supported (only [\"{ARCHITECTURES[arch]}\"]: "
             "a causal LM head on the decoder)")
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        fail(f"field 'tie_word_embeddings' must be true or false, got {json.dumps(tied)}")
    vocab, layers = integer("vocab_size"), integer("num_hidden_layers")
    if not vocab or not layers:
        fail("vocab_size and num_hidden_layers must be positive")
    eos = _token_ids(data.get("eos_token_id", 2), "eos_token_id", fail)
    gen = Path(folder) / "generation_config.json"
    if gen.is_file():
        gen_data = read_config_json(gen, str(gen))
        eos += _token_ids(gen_data.get("eos_token_id"), "eos_token_id", fail)
    dtype = data.get("dtype") or data.get("torch_dtype") or "float32"
    return ModelConfig(layer=layer, vocab=vocab, layers=layers, tied=tied,
                       max_positions=integer("max_position_embeddings", _DEFAULT_POSITIONS[arch]),
                       bos_id=integer("bos_token_id", 1, allow_none=True), eos_ids=tuple(dict.fromkeys(eos)),
                       dtype=str(dtype), arch=arch)


def _token_ids(v, key: str, fail) -> list[int]:
    """A token id field (one id, a list of them, or null) as a list."""
    ids = [] if v is None else v if isinstance(v, list) else [v]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        fail(f"field {key!r} must be a token id or a list of them, got {json.dumps(v)}")
    return ids


__all__ = ["ModelConfig", "load_config", "gguf_config", "hf_config", "GGUF_KEYS", "ARCHITECTURES"]
