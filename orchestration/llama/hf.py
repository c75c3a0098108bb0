"""A Hugging Face ``config.json`` of the LLaMA family as a :class:`~.config.LlamaConfig`
(``pto run llama --hf-config PATH``).

Read: ``model_type`` (``llama`` or ``mistral``), ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads`` (default, or null: as many as query heads), ``head_dim`` (default, or
null: hidden size / heads), ``intermediate_size``, ``rms_norm_eps``, RoPE's base and scaling in
either spelling (``rope_theta`` and ``rope_scaling``, or transformers 5's ``rope_parameters``;
scaling ``linear`` and ``llama3``), ``sliding_window`` (Mistral; transformers' default 4096 when
the key is absent, none when null), and the fields that must have the value this layer computes
(``hidden_act`` silu, no attention or MLP biases, full rotary dimension).

Accepted and not read, as a config.json that transformers itself wrote holds them: what
describes the file, the tokenizer or generation rather than the arithmetic of a layer
(:func:`is_metadata`): the whole model's fields (vocabulary, layer count, tied embeddings,
context: :mod:`pto.orchestration.model.config` reads those), transformers' own bookkeeping
(``architectures``, ``transformers_version``, ``torch_dtype``/``dtype``, ``_name_or_path`` and
every other key that begins with an underscore, any ``*_version``), every token id or special
token (``bos_token_id``, ``unk_token_id``, ``pad_token_id``, ...: any ``*_token_id``,
``*_token_ids``, ``*_token``), dropout rates (training only) and generation defaults. Anything
else is refused with one line naming the field: a field this reader does not know might change
the layer's arithmetic, and a wrong layer that runs is worse than an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from pto.orchestration.llama.config import LlamaConfig, RopeScaling

from pto.errors import UsageError

MODEL_TYPES = ("llama", "mistral")
#: fields of the whole model, of generation, or of transformers' bookkeeping (its PretrainedConfig's
#: own, in transformers 4 and 5): no effect on one layer's arithmetic
_IGNORED = """
    architectures auto_map transformers_version model_type dtype torch_dtype use_bfloat16
    vocab_size num_hidden_layers max_position_embeddings initializer_range use_cache tie_word_embeddings
    pretraining_tp id2label label2id problem_type finetuning_task tokenizer_class prefix task_specific_params
    return_dict use_return_dict output_attentions output_hidden_states output_scores output_logits
    return_dict_in_generate torchscript chunk_size_feed_forward is_encoder_decoder is_decoder add_cross_attention
    cross_attention_hidden_size tie_encoder_decoder pruned_heads tf_legacy_loss gradient_checkpointing max_length
    min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p
    typical_p repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
    num_return_sequences remove_invalid_values exponential_decay_length_penalty suppress_tokens
    begin_suppress_tokens keys_to_ignore_at_inference name_or_path
"""
IGNORED = frozenset(_IGNORED.split())
#: name endings of fields that describe the tokenizer (token ids, special tokens), a version of
#: the tool that wrote the file, or a training-only rate
_METADATA_ENDINGS = ("_token_id", "_token_ids", "_token", "_version", "dropout")


def is_metadata(key: str) -> bool:
    """Whether config.json's field ``key`` describes the file, the tokenizer, generation or
    training rather than the arithmetic of the model (the module docstring)."""
    return key in IGNORED or key.startswith("_") or key.endswith(_METADATA_ENDINGS)
_READ = """hidden_size num_attention_heads num_key_value_heads head_dim intermediate_size rms_norm_eps
    rope_theta rope_scaling rope_parameters partial_rotary_factor sliding_window hidden_act attention_bias
    mlp_bias"""
READ = frozenset(_READ.split())
_ROPE_KEYS = """rope_type type rope_theta factor low_freq_factor high_freq_factor
    original_max_position_embeddings partial_rotary_factor"""
ROPE_KEYS = frozenset(_ROPE_KEYS.split())
HEAD_DIMS = (32, 64, 128, 256)  # power-of-two tiles of the Triton kernels; RoPE halves of 16 and up


def load_hf_config(path: str) -> LlamaConfig:
    """The layer ``path`` describes; every problem is one UsageError line naming the file and
    the field."""
    where = f"--hf-config {path}"
    return parse_hf_config(read_config_json(path, where), where)


def gguf_elsewhere(path) -> str:
    """What a GGUF file given to the layer program's --weights or --hf-config is told."""
    return ("a GGUF file; the layer reads a Hugging Face checkpoint (safetensors, config.json): the GGUF model "
            f"runs with `pto run model --weights {path}` or `pto generate --gguf {path}`")


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file that begins with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def read_config_json(path: str, where: str) -> dict:
    """The JSON object in ``path`` (a config.json, or a folder holding one); a missing,
    unreadable or malformed file is one UsageError line beginning with ``where``."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.exists():
            raise UsageError(f"{where}: the folder has no config.json (give a checkpoint's folder or its "
                             "config.json)")
    if is_gguf_file(p):
        raise UsageError(f"{where}: {gguf_elsewhere(path)}")
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: cannot read it ({e.__class__.__name__})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: not a JSON object")
    return data


def parse_hf_config(data: dict, where: str = "config") -> LlamaConfig:
    """The :class:`LlamaConfig` of a config.json's contents (``where`` begins every message)."""

    def fail(msg: str):
        raise UsageError(f"{where}: {msg}")

    model_type = data.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        fail(f"model_type {model_type!r} is not supported (supported: {', '.join(MODEL_TYPES)})")
    allowed = READ if model_type == "mistral" else READ - {"sliding_window"}
    for key in data:
        if not is_metadata(key) and key not in allowed and not (key == "sliding_window" and data[key] is None):
            fail(f"unsupported field {key!r} (= {json.dumps(data[key])}) for model_type {model_type}: "
                 "this layer does not compute it")

    def integer(key: str, default=None) -> int:
        v = data.get(key) if data.get(key) is not None else default  # null: transformers' default
        if v is None:
            fail(f"missing field {key!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            fail(f"field {key!r} must be a positive integer, got {json.dumps(v)}")
        return v

    def number(value, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            fail(f"field {key!r} must be a positive number, got {json.dumps(value)}")
        return float(value)

    hidden, heads = integer("hidden_size"), integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads", heads)
    if heads % kv_heads:
        fail(f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    if data.get("head_dim") is None and hidden % heads:
        fail(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no head_dim)")
    head_dim = integer("head_dim", hidden // heads)
    if head_dim not in HEAD_DIMS:
        fail(f"head_dim {head_dim} is not supported (supported: {', '.join(map(str, HEAD_DIMS))})")
    ffn = integer("intermediate_size")
    eps = number(data.get("rms_norm_eps", 1e-6), "rms_norm_eps")
    for key, want in (("hidden_act", ("silu", "swish")), ("attention_bias", (False,)), ("mlp_bias", (False,))):
        if key in data and data[key] not in want:
            fail(f"field {key!r} = {json.dumps(data[key])} is not supported (only {json.dumps(want[0])})")
    theta, scaling = _rope(data, fail, number)
    window = None  # transformers' MistralConfig has a window of 4096 unless the key says null
    if model_type == "mistral" and data.get("sliding_window", 4096) is not None:
        window = integer("sliding_window", 4096)
    return LlamaConfig(hidden=hidden, heads=heads, head_dim=head_dim, ffn=ffn, eps=eps, theta=theta,
                       kv_heads=kv_heads, window=window, rope_scaling=scaling)


def _rope(data: dict, fail, number) -> tuple[float, RopeScaling | None]:
    """RoPE's base and scaling from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (the older spelling, that of most published checkpoints)."""
    key = "rope_parameters" if data.get("rope_parameters") is not None else "rope_scaling"
    params = data.get(key) or {}
    if not isinstance(params, dict):
        fail(f"field {key!r} must be an object, got {json.dumps(params)}")
    for k in params:
        if k not in ROPE_KEYS:
            fail(f"unsupported {key} field {k!r} (= {json.dumps(params[k])})")
    theta = number(params.get("rope_theta", data.get("rope_theta", 10000.0)), "rope_theta")
    partial = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        fail(f"partial_rotary_factor {json.dumps(partial)} is not supported (RoPE over the whole head only)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        fail(f"{key} type {kind!r} is not supported (supported: default, linear, llama3)")

    def field(name: str, default=None):
        v = params.get(name, default)
        if v is None:
            fail(f"{key} of type {kind} needs {name!r}")
        return number(v, f"{key}.{name}")

    if kind == "linear":
        return theta, RopeScaling("linear", field("factor"))
    low, high = field("low_freq_factor"), field("high_freq_factor")
    if high <= low:
        fail(f"{key}: high_freq_factor {high} must exceed low_freq_factor {low}")
    orig = field("original_max_position_embeddings", data.get("max_position_embeddings"))
    return theta, RopeScaling("llama3", field("factor"), low, high, int(orig))


def hf_dict(cfg: LlamaConfig, model_type: str | None = None, **extra) -> dict:
    """A config.json (the published checkpoints' spelling) for ``cfg``: what the tests and
    bench/llama_family.py write for transformers and for ``--hf-config``."""
    d = {"model_type": model_type or ("mistral" if cfg.window else "llama"), "hidden_size": cfg.hidden,
         "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
         "intermediate_size": cfg.ffn, "rms_norm_eps": cfg.eps, "rope_theta": cfg.theta, "hidden_act": "silu"}
    if d["model_type"] == "mistral":
        d["sliding_window"] = cfg.window
    rs = cfg.rope_scaling
    if rs is not None:
        d["rope_scaling"] = {"rope_type": rs.kind, "factor": rs.factor}
        if rs.kind == "llama3":
            d["rope_scaling"].update(low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                                     original_max_position_embeddings=rs.original_max_position_embeddings)
    return {**d, **extra}


__all__ = ["load_hf_config", "read_config_json", "gguf_elsewhere", "is_gguf_file", "parse_hf_config", "is_metadata",
           "hf_dict", "MODEL_TYPES", "HEAD_DIMS"]
