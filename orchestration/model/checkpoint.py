"""A whole model's weights (:class:`ModelWeights`) from a GGUF file or a Hugging Face folder,
dequantized or cast to the caller's dtype once, at load, in the layout the programs use.

Layout: each decoder layer's weights under the layer program's input names
(:data:`~pto.orchestration.llama.weights.HF_NAMES`: ``g_attn wq wk wv wo g_ffn wg wu wd``),
matrices ``[in, out]`` for ``x @ W`` (contiguous), norm weights ``1 x hidden``; the embedding
``[vocab, hidden]`` (a row per token), the final norm ``1 x hidden``, the LM head ``[hidden,
vocab]`` (the embedding's transpose, a view sharing its memory, when the model ties them).

GGUF: llama.cpp's converter reorders the rows of the query and key projections within each head
so that RoPE rotates adjacent pairs (GPT-J's interleaved convention) where Hugging Face's LLaMA
rotates the two halves of the head; :func:`unpermute_rope_rows` restores Hugging Face's order,
so these weights are those transformers loads from the same file (the reference model, the
layer program and transformers all rotate halves).

Every problem (a missing tensor, a wrong shape, a type that cannot be dequantized, a file that
is not a checkpoint) is one UsageError line naming the file and the tensor; shapes are checked
from the headers before any data is read.

Quantized weights: with a ``keep`` hook (:class:`~.quantized.KeepFileTypes`) the GGUF tensors it
chooses stay as the file stores them, repacked (:class:`pto.quant.QTensor`, output-major: ``[out,
in]``); :mod:`.quantized` has the rest (pto's own quantization, dense copies, bytes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from pto.orchestration.llama.weights import FLOATS, HF_NAMES, Checkpoint, hf_shapes, layer_names
from pto.orchestration.model.config import ModelConfig, gguf_config, hf_config
from pto.orchestration.model.gguf_file import GGUFFile, from_checkpoint
from pto.orchestration.model.quantized import KeepFileTypes, file_qtypes

from pto.quant import QTensor

#: the layer program's input -> the tensor's name under ``blk.N.`` in a GGUF file
GGUF_NAMES = {
    "g_attn": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "g_ffn": "ffn_norm.weight",
    "wg": "ffn_gate.weight",
    "wu": "ffn_up.weight",
    "wd": "ffn_down.weight",
}


@dataclass
class ModelWeights:
    """A model's weights in one dtype on one device (layout: the module's docstring)."""

    config: ModelConfig
    embedding: torch.Tensor  # [vocab, hidden]
    norm: torch.Tensor  # [1, hidden]
    lm_head: torch.Tensor  # [hidden, vocab]
    layers: list[dict[str, torch.Tensor]]  # per layer: HF_NAMES' keys

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in (its dense tensors'; the norms are never quantized)."""
        return self.norm.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by a flat name (``embedding``, ``norm``, ``lm_head``, ``layers.N.wq``, ...)."""
        out = {"embedding": self.embedding, "norm": self.norm, "lm_head": self.lm_head}
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{k}": v for k, v in layer.items()})
        return out


def load_weights(path: str | os.PathLike, dtype: torch.dtype = torch.float32, device="cpu",
                 keep: KeepFileTypes | None = None) -> ModelWeights:
    """The weights of a GGUF file or a Hugging Face model folder, in ``dtype`` on ``device``
    (a GGUF file's tensors that ``keep`` chooses as the file stores them)."""
    return from_checkpoint(path, lambda p: hf_weights(p, dtype, device),
                           lambda f: gguf_weights(f, dtype, device, keep))


def program_layout(t: torch.Tensor | QTensor) -> torch.Tensor | QTensor:
    """A checkpoint tensor in the programs' layout: a ``[out, in]`` matrix (``torch.nn.Linear``'s
    and GGUF's order) as a contiguous ``[in, out]``; a norm weight as ``1 x n``; a quantized
    matrix as it is (output-major)."""
    if isinstance(t, QTensor):
        return t
    return t.view(1, -1) if t.dim() == 1 else t.t().contiguous()


def unpermute_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of a query or key projection ``[heads * D, in]``: within each
    head, its row ``2i + j`` is Hugging Face's row ``j * D/2 + i`` (pairs interleaved there,
    halves here)."""
    rows, cols = w.shape
    d = rows // heads
    if isinstance(w, QTensor):  # the same rows, each a row of blocks
        return w.take_rows(torch.arange(rows).reshape(heads, d // 2, 2).transpose(1, 2).reshape(-1))
    return w.reshape(heads, d // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_weights(f: GGUFFile, dtype: torch.dtype = torch.float32, device="cpu",
                 keep: KeepFileTypes | None = None) -> ModelWeights:
    """The weights of a GGUF file (its configuration from :func:`~.config.gguf_config`); the
    tensors ``keep`` chooses stay quantized."""
    cfg = gguf_config(f)
    H, V = cfg.hidden, cfg.vocab
    shapes = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if not cfg.tied:
        shapes["output.weight"] = (V, H)
    for i in range(cfg.layers):
        shapes.update({f"blk.{i}.{GGUF_NAMES[k]}": s for k, (s, _) in hf_shapes(cfg.layer).items()})
    for name, shape in shapes.items():  # every header before any data
        if name not in f.tensors:
            f.fail(f"no tensor {name!r} (a {cfg.layers}-layer LLaMA model has {', '.join(GGUF_NAMES.values())} "
                   "under blk.N., token_embd.weight and output_norm.weight)")
        if f.shape(name) != shape:
            f.fail(f"tensor {name} is {' x '.join(map(str, f.shape(name)))} but the metadata needs "
                   f"{' x '.join(map(str, shape))}")

    kept = set() if keep is None else keep.choose(file_qtypes(f, cfg))

    def load(name: str) -> torch.Tensor | QTensor:
        if name in kept:
            return f.quantized(name, shapes[name], device)
        return f.tensor(name, shapes[name], dtype, device)

    layers = []
    for i in range(cfg.layers):
        t = {k: load(f"blk.{i}.{name}") for k, name in GGUF_NAMES.items()}
        t["wq"] = unpermute_rope_rows(t["wq"], cfg.layer.heads)
        t["wk"] = unpermute_rope_rows(t["wk"], cfg.layer.kv_heads)
        layers.append({k: program_layout(v) for k, v in t.items()})
    emb = load("token_embd.weight")
    tied = emb if isinstance(emb, QTensor) else emb.t()  # (a quantized head is output-major: the table itself)
    head = tied if cfg.tied else program_layout(load("output.weight"))
    return ModelWeights(cfg, emb, program_layout(load("output_norm.weight")), head, layers)


def hf_weights(folder: str | os.PathLike, dtype: torch.dtype = torch.float32, device="cpu") -> ModelWeights:
    """The weights of a Hugging Face model folder (config.json and model.safetensors or a
    sharded index), read through the layer program's
    :class:`~pto.orchestration.llama.weights.Checkpoint`."""
    cfg = hf_config(folder)
    ck = Checkpoint(str(folder), where=str(folder))
    have = set(ck.layers())
    if have != set(range(cfg.layers)):
        ck.fail(f"config.json says {cfg.layers} layers but the checkpoint has layers {sorted(have) or 'none'}")
    names = [layer_names(ck, i, cfg.layer) for i in range(cfg.layers)]  # every layer's headers first
    H, V = cfg.hidden, cfg.vocab
    wanted = {"embedding": ("model.embed_tokens.weight", (V, H)), "norm": ("model.norm.weight", (H,))}
    if not cfg.tied:
        wanted["lm_head"] = ("lm_head.weight", (V, H))
    found = {what: _whole_model_tensor(ck, name, shape) for what, (name, shape) in wanted.items()}

    def load(name: str) -> torch.Tensor:
        return ck.tensor(name).to(device=device, dtype=dtype)

    layers = [{k: program_layout(load(n)) for k, n in layer.items()} for layer in names]
    emb = load(found["embedding"])
    head = emb.t() if cfg.tied else program_layout(load(found["lm_head"]))
    return ModelWeights(cfg, emb, program_layout(load(found["norm"])), head, layers)


def _whole_model_tensor(ck: Checkpoint, name: str, shape: tuple[int, ...]) -> str:
    """The checked name of a tensor outside the layers (``name``, or without its ``model.``
    prefix as some checkpoints have it)."""
    for full in dict.fromkeys((name, name.removeprefix("model."))):
        if full in ck.files:
            got, dtype = ck.header(full)
            if tuple(got) != shape:
                ck.fail(f"{full} is {' x '.join(map(str, got))} but config.json needs {' x '.join(map(str, shape))}")
            if dtype not in FLOATS:
                ck.fail(f"{full} holds {dtype}, not floating-point weights")
            return full
    ck.fail(f"no tensor {name!r}" + (" (config.json says the embeddings are not tied)"
                                      if name.startswith("lm_head") else ""))


__all__ = ["ModelWeights", "load_weights", "gguf_weights", "hf_weights", "program_layout", "unpermute_rope_rows",
           "GGUF_NAMES", "HF_NAMES"]
