"""ModelConfig from GGUF metadata and from a Hugging Face config.json: the real checkpoint's
fields equal transformers' reading of the same file; tiny files written here cover RoPE scaling
(linear, LLaMA 3.1's rope_freqs), sliding windows, generation_config.json's end tokens, and every
refusal (another architecture, an unknown key, a mixture of experts, a file that is not GGUF) as
one UsageError line naming the file and the key."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pto.errors import UsageError

from .conftest import need
from .tiny import assert_refused, tiny_model, write_gguf


@pytest.fixture(autouse=True, scope="module")
def _packages():
    need("gguf")
    need("transformers")


def test_gguf_config_matches_transformers(weights, hf_model):
    cfg, ref = weights.config, hf_model.config  # load_weights' reading of the file (load_config's)
    lc = cfg.layer
    assert (lc.hidden, lc.heads, lc.kv_heads, lc.head_dim, lc.ffn) == (
        ref.hidden_size, ref.num_attention_heads, ref.num_key_value_heads, ref.head_dim, ref.intermediate_size)
    assert lc.eps == ref.rms_norm_eps and lc.theta == ref.rope_parameters["rope_theta"]
    assert lc.window is None and lc.rope_scaling is None
    assert (cfg.vocab, cfg.layers, cfg.tied, cfg.max_positions) == (
        ref.vocab_size, ref.num_hidden_layers, ref.tie_word_embeddings, ref.max_position_embeddings)
    assert (cfg.bos_id, cfg.eos_ids) == (ref.bos_token_id, (ref.eos_token_id,))
    assert (cfg.arch, cfg.dtype) == ("llama", "Q4_1")
    # the brief's description of SmolLM2-135M, independently of transformers
    assert (lc.hidden, cfg.layers, lc.heads, lc.kv_heads, lc.head_dim, lc.ffn, lc.theta, cfg.vocab) == (
        576, 30, 9, 3, 64, 1536, 100000.0, 49152)


@pytest.mark.parametrize("tied", [True, False])
def test_hf_folder_config(tmp_path, tied):
    from pto.orchestration.model.config import load_config

    model = tiny_model(tied=tied)
    model.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    c = model.config
    assert (cfg.vocab, cfg.layers, cfg.tied, cfg.max_positions, cfg.bos_id) == (
        c.vocab_size, c.num_hidden_layers, tied, c.max_position_embeddings, c.bos_token_id)
    assert 2 in cfg.eos_ids and cfg.layer.kv_heads == c.num_key_value_heads and cfg.arch == "llama"
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 7]}))
    assert load_config(tmp_path).eos_ids == (2, 7)  # config.json's, then generation_config.json's new ones


def test_hf_window_and_refusals(tmp_path):
    from pto.orchestration.model.config import load_config

    tiny_model(window=8).save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    assert (cfg.arch, cfg.layer.window) == ("mistral", 8)
    data = json.loads((tmp_path / "config.json").read_text())
    for change, words in (({"architectures": ["MistralForSequenceClassification"]}, "architectures"),
                          ({"vocab_size": "many"}, "'vocab_size'"), ({"eos_token_id": [2, "x"]}, "'eos_token_id'"),
                          ({"frobnicate": 1}, "'frobnicate'")):
        (tmp_path / "config.json").write_text(json.dumps({**data, **change}))
        with pytest.raises(UsageError, match=words) as e:
            load_config(tmp_path)
        assert str(tmp_path / "config.json") in str(e.value) and "\n" not in str(e.value)


def _rope_divisors(factor: float, head_dim: int, theta: float) -> np.ndarray:
    """LLaMA 3.1's per-frequency divisors as llama.cpp's converter computes them (low/high
    frequency factors 1 and 4, original context 8192)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < 8192 / 4:
            out.append(1.0)
        elif wavelen > 8192 / 1:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_gguf_rope_scaling(tmp_path):
    from pto.orchestration.model.config import load_config

    model = tiny_model(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    div = _rope_divisors(8.0, 32, 500000.0)
    cfg = load_config(write_gguf(tmp_path / "l3.gguf", model, tensors={"rope_freqs.weight": div}))
    rs = cfg.layer.rope_scaling
    assert (rs.kind, rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings) == (
        "llama3", 8.0, 1.0, 4.0, 8192)
    with pytest.raises(UsageError, match="rope_freqs.weight is not LLaMA 3.1"):
        load_config(write_gguf(tmp_path / "bad.gguf", model, tensors={"rope_freqs.weight": div[::-1].copy()}))

    def linear(w):
        w.add_string("llama.rope.scaling.type", "linear")
        w.add_float32("llama.rope.scaling.factor", 4.0)

    cfg = load_config(write_gguf(tmp_path / "lin.gguf", model, keys=linear))
    assert (cfg.layer.rope_scaling.kind, cfg.layer.rope_scaling.factor) == ("linear", 4.0)


def _refused(path, *words):
    from pto.orchestration.model.config import load_config

    assert_refused(load_config, path, *words)


def test_gguf_refusals(tmp_path):
    import gguf

    model = tiny_model()
    _refused(write_gguf(tmp_path / "a.gguf", model, keys=lambda w: w.add_string("llama.rope.scaling.type", "yarn")),
             "a.gguf", "yarn")
    _refused(write_gguf(tmp_path / "b.gguf", model, keys=lambda w: w.add_float32("llama.attention.clamp_kqv", 8.0)),
             "b.gguf", "llama.attention.clamp_kqv")
    _refused(write_gguf(tmp_path / "c.gguf", model, keys=lambda w: w.add_uint32("llama.expert_count", 8)),
             "c.gguf", "mixtures of experts")
    w = gguf.GGUFWriter(str(tmp_path / "d.gguf"), "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    _refused(tmp_path / "d.gguf", "d.gguf", "general.architecture is 'gpt2'")
    (tmp_path / "e.bin").write_bytes(b"not a checkpoint at all")
    _refused(tmp_path / "e.bin", "e.bin", "neither a GGUF file")
    (tmp_path / "f.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 9)  # the two counts need 16 bytes
    _refused(tmp_path / "f.gguf", "f.gguf", "truncated: the file ends at byte 17, in its first bytes")
    (tmp_path / "g.gguf").write_bytes(b"GGUF\x63\x00\x00\x00" + b"\x00" * 16)  # version 99
    _refused(tmp_path / "g.gguf", "g.gguf", "not a readable GGUF file: its header is corrupt", "version 99")
    _refused(tmp_path / "nothing-here", "no such file")
