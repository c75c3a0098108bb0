"""Tiny LLaMA-family models for the model tests: transformers models with seeded random weights
(saved as Hugging Face folders), and GGUF files written from them the way llama.cpp's converter
writes them (its q/k row order, ``ne`` dimension order, tied output omitted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: small enough for milliseconds per step, large enough for grouped-query attention and RoPE
SHAPES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              num_hidden_layers=2, vocab_size=300, rms_norm_eps=1e-5, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2)


def tiny_model(tied: bool = False, window: int | None = None, seed: int = 0, **over):
    """A LlamaForCausalLM (MistralForCausalLM with a ``window``) with seeded random weights: norm
    weights near 1, matrices scaled by fan-in so activations stay O(1) through the layers."""
    import transformers

    kw = {**SHAPES, "tie_word_embeddings": tied, **over}
    if window:
        cfg = transformers.MistralConfig(**kw, sliding_window=window, attn_implementation="eager")
        model = transformers.MistralForCausalLM(cfg)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, attn_implementation="eager"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return model.eval()


def llama_cpp_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for a q or k projection: per head, the two halves of
    the head's rows interleaved (rows ``i`` and ``D/2 + i`` become ``2i`` and ``2i + 1``)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, qtype: str = "F32", drop: tuple[str, ...] = (), keys=None,
               tensors: dict[str, np.ndarray] | None = None) -> Path:
    """``model`` as a GGUF file of architecture llama: its metadata, every tensor under llama.cpp's
    name (stored as ``qtype`` when 2-D: F32, F16 or a block type of gguf.quants), ``drop``
    left out, ``keys(writer)`` adding metadata, ``tensors`` added as they are."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    if keys:
        keys(w)
    out = {**_gguf_tensors(model), **(tensors or {})}
    for name, t in out.items():
        if name in drop:
            continue
        kind = gguf.GGMLQuantizationType[qtype if t.ndim == 2 else "F32"]
        if kind == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, t.astype(np.float16))
        elif kind != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_tensors(model) -> dict[str, np.ndarray]:
    """llama.cpp's names and float32 arrays (numpy's order) of ``model``'s weights."""
    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = llama_cpp_rows(t, c.num_attention_heads)
            elif gg == "attn_k":
                t = llama_cpp_rows(t, c.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = t
    return out


def assert_refused(load, path, *words) -> None:
    """``load(path)`` raises one UsageError of one line that names every one of ``words``."""
    import pytest

    from pto.errors import UsageError

    with pytest.raises(UsageError) as e:
        load(path)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
