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


#: a Llama-3.2-1B-shaped config.json as its publisher's transformers 4.45 wrote it, with the
#: fields a saved copy carries besides (the name it was loaded from, the tokenizer's ids)
LLAMA32_1B = {
    "_name_or_path": "meta-llama/Llama-3.2-1B-Instruct", "_model_name_or_path": "meta-llama/Llama-3.2-1B-Instruct",
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "pad_token_id": 128004, "unk_token_id": None,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "unsloth_version": "2024.9", "use_cache": True, "vocab_size": 128256,
}


@pytest.mark.parametrize("window", [None, 8])
def test_a_config_json_transformers_wrote_is_read_whole(tmp_path, window):
    """Every field transformers' configuration holds (to_dict: its bookkeeping, the task heads'
    labels, generation defaults, the tokenizer's ids, the name it was loaded from), written by
    transformers' save_pretrained: accepted, and read as transformers reads it."""
    import transformers
    from pto.orchestration.model.config import load_config

    cls = transformers.MistralConfig if window else transformers.LlamaConfig
    extra = {"sliding_window": window} if window else {}
    c = cls(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160, num_hidden_layers=3,
            vocab_size=512, tie_word_embeddings=True, unk_token_id=0, pad_token_id=3, **extra)
    c._name_or_path = "someone/tiny-model"
    c.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["unk_token_id"] == 0 and "transformers_version" in saved  # the fields a user meets
    (tmp_path / "config.json").write_text(json.dumps(c.to_dict()))  # every field, "_name_or_path" too
    for written in ("save_pretrained", "to_dict"):
        cfg = load_config(tmp_path)
        assert (cfg.layer.hidden, cfg.layer.heads, cfg.layer.kv_heads, cfg.layer.head_dim, cfg.layer.ffn) == (
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size), written
        assert (cfg.vocab, cfg.layers, cfg.tied, cfg.max_positions, cfg.layer.window, cfg.arch) == (
            c.vocab_size, c.num_hidden_layers, True, c.max_position_embeddings, window, c.model_type), written
        (tmp_path / "config.json").write_text(json.dumps(saved))


def test_a_published_config_json_is_read_and_arithmetic_fields_are_refused(tmp_path):
    """A config.json written by hand in the published checkpoints' spelling, with metadata of
    every kind (names, versions, token ids, dtype) beside the arithmetic: read; a field that
    changes the arithmetic this model does not compute (a bias, another activation, a scale
    this reader does not know) is one line naming it."""
    from pto.orchestration.model.config import load_config

    (tmp_path / "config.json").write_text(json.dumps(LLAMA32_1B))
    cfg = load_config(tmp_path)
    lc = cfg.layer
    assert (lc.hidden, lc.heads, lc.kv_heads, lc.head_dim, lc.ffn, lc.eps, lc.theta) == (
        2048, 32, 8, 64, 8192, 1e-05, 500000.0)
    assert (lc.rope_scaling.kind, lc.rope_scaling.factor, lc.rope_scaling.original_max_position_embeddings) == (
        "llama3", 32.0, 8192)
    assert (cfg.vocab, cfg.layers, cfg.tied, cfg.max_positions, cfg.bos_id, cfg.eos_ids, cfg.dtype) == (
        128256, 16, True, 131072, 128000, (128001, 128008, 128009), "bfloat16")
    for change, words in (({"attention_bias": True}, "'attention_bias'"), ({"hidden_act": "gelu"}, "'hidden_act'"),
                          ({"logit_scale": 0.5}, "unsupported field 'logit_scale'"),
                          ({"head_dim": None, "hidden_size": 2047}, "hidden_size 2047")):
        (tmp_path / "config.json").write_text(json.dumps({**LLAMA32_1B, **change}))
        _refused(tmp_path, "config.json", *words.split(","))


def test_run_reports_the_checkpoint_it_ran(tmp_path):
    """``pto run model --weights DIR --json`` names what ran: the folder (``weights``) and its
    shape (``config``: the file's, not a built-in configuration's), and checks the step against
    the reference model on the file's weights; --config beside --weights is one line."""
    from pto.orchestration.model.config import load_config

    from pto.tools.run import run

    tiny_model(tied=True).save_pretrained(tmp_path)
    res = run("model", device="cpu", weights=str(tmp_path), cache=64, check=True)
    assert res["weights"] == str(tmp_path) and res["config"] == load_config(tmp_path).spec()
    assert "hidden=128," in res["config"] and "layers=2," in res["config"] and "vocab=300," in res["config"]
    assert res["rel_err"] < 1e-5
    with pytest.raises(UsageError, match="--weights and --config tiny both give") as e:
        run("model", device="cpu", weights=str(tmp_path), config="tiny")
    assert "\n" not in str(e.value)
