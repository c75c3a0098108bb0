"""One decoder layer's weights from a Hugging Face checkpoint in safetensors (``pto run llama
--weights FILE --layer N``).

The file is a ``.safetensors`` file, a sharded checkpoint's ``model.safetensors.index.json`` (its
``weight_map`` names the shard of each tensor), or a folder holding either. Tensors are found
under the names transformers saves (``model.layers.N.self_attn.q_proj.weight``, ...; ``layers.N.``
without the ``model.`` prefix too), checked against the configuration's shapes from the file's
header before any data is read, then transposed to the program's ``x @ W`` layout (transformers'
``Linear`` stores ``[out, in]``) and cast to the run's dtype. Every problem is one UsageError line
naming the file and the tensor.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from pto.orchestration.llama.config import LlamaConfig
from pto.orchestration.llama.hf import gguf_elsewhere, is_gguf_file

from pto.errors import UsageError

#: the program's input -> the tensor's name under ``model.layers.N.``
HF_NAMES = {
    "g_attn": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "g_ffn": "post_attention_layernorm.weight",
    "wg": "mlp.gate_proj.weight",
    "wu": "mlp.up_proj.weight",
    "wd": "mlp.down_proj.weight",
}
FLOATS = {"F64", "F32", "F16", "BF16"}
#: ``--fuse-norm-rope``: each weight whose rows take the gain of the RMSNorm before it -> the gain
FOLDED = {"wq": "g_attn", "wk": "g_attn", "wv": "g_attn", "wg": "g_ffn", "wu": "g_ffn"}


def folded(name: str) -> str:
    """The input holding weight ``name`` with its norm's gain folded in."""
    return name + "_g"


#: the folded gate and up weights, their columns interleaved (``wgu_g[:, 2c]`` is ``wg_g[:, c]``,
#: ``wgu_g[:, 2c + 1]`` is ``wu_g[:, c]``): one product computes both
GATE_UP = "wgu_g"


def fold_gains(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs of the layer whose norms are folded into the projections after them: each
    weight ``w`` of :data:`FOLDED` becomes ``w_g = diag(g) w`` (in f32, rounded once to the
    weight's dtype: ``rmsnorm(x; g) @ w = rmsnorm(x; 1) @ w_g``), the gate and up weights one
    interleaved :data:`GATE_UP`, and the gains go."""
    out = {k: v for k, v in inputs.items() if k not in FOLDED and k not in FOLDED.values()}
    for w, g in FOLDED.items():
        out[folded(w)] = (inputs[g].float().reshape(-1, 1) * inputs[w].float()).to(inputs[w].dtype)
    gate, up = out.pop(folded("wg")), out.pop(folded("wu"))
    out[GATE_UP] = torch.stack([gate, up], dim=-1).reshape(gate.shape[0], 2 * gate.shape[1])
    return out


def unfold_gains(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Folded inputs (:func:`fold_gains`) as the unfused layer's: the folded weights with unit
    gains, the same layer."""
    out = {k: v for k, v in inputs.items() if k not in (*map(folded, FOLDED), GATE_UP)}
    out.update({w: inputs[folded(w)] for w in ("wq", "wk", "wv")})
    # contiguous: the reference runs on them (and is timed as `pto bench`'s eager baseline)
    out["wg"], out["wu"] = inputs[GATE_UP][:, 0::2].contiguous(), inputs[GATE_UP][:, 1::2].contiguous()
    w = inputs[folded("wq")]
    out.update({g: torch.ones(1, w.shape[0], dtype=w.dtype, device=w.device) for g in FOLDED.values()})
    return out


def hf_shapes(cfg: LlamaConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Input -> (the shape transformers stores, which config fields make it)."""
    H, QD, KVD, Fd = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.ffn
    q, kv = "num_attention_heads * head_dim", "num_key_value_heads * head_dim"
    return {"g_attn": ((H,), "hidden_size"), "g_ffn": ((H,), "hidden_size"),
            "wq": ((QD, H), f"{q} x hidden_size"), "wk": ((KVD, H), f"{kv} x hidden_size"),
            "wv": ((KVD, H), f"{kv} x hidden_size"), "wo": ((H, QD), f"hidden_size x {q}"),
            "wg": ((Fd, H), "intermediate_size x hidden_size"), "wu": ((Fd, H), "intermediate_size x hidden_size"),
            "wd": ((H, Fd), "hidden_size x intermediate_size")}


class Checkpoint:
    """The tensor names of a checkpoint (one file or the shards of an index) and the file of each;
    ``where`` (default: ``--weights PATH``) begins every message."""

    def __init__(self, path: str, where: str | None = None):
        self.where = where or f"--weights {path}"
        try:
            import safetensors
        except ImportError:
            raise UsageError(f"{self.where}: reading weights needs the `safetensors` package "
                             "(pip install safetensors)") from None
        self._open = safetensors.safe_open
        p = Path(path)
        if p.is_dir():
            for name in ("model.safetensors", "model.safetensors.index.json"):
                if (p / name).is_file():
                    p = p / name
                    break
            else:
                self.fail("a folder without model.safetensors or model.safetensors.index.json")
        if not p.is_file():
            self.fail("no such file")
        if is_gguf_file(p):
            self.fail(gguf_elsewhere(path))
        self.files: dict[str, Path] = {}
        if p.name.endswith(".json"):
            try:
                wmap = json.loads(p.read_text())["weight_map"]
                assert isinstance(wmap, dict)
            except (OSError, ValueError, KeyError, TypeError, AssertionError):
                self.fail("not a safetensors index (a JSON object with a weight_map)")
            self.files = {name: p.parent / shard for name, shard in wmap.items()}
        else:
            with self._handle(p) as f:
                self.files = dict.fromkeys(f.keys(), p)

    def fail(self, msg: str):
        raise UsageError(f"{self.where}: {msg}")

    def _handle(self, file: Path):
        try:
            return self._open(str(file), framework="pt")
        except FileNotFoundError:
            self.fail(f"shard {file.name} is missing")
        except Exception as e:  # safetensors raises its own error types for a bad header
            self.fail(f"{file.name} is not a safetensors file ({str(e).splitlines()[0][:120]})")

    def layers(self) -> list[int]:
        return sorted({int(m.group(1)) for k in self.files if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", k))})

    def prefix(self, layer: int) -> str:
        """``model.layers.N.`` (or ``layers.N.``) where the layer's tensors are."""
        for pre in (f"model.layers.{layer}.", f"layers.{layer}."):
            if any(k.startswith(pre) for k in self.files):
                return pre
        have = self.layers()
        has = f"it has layers {have[0]} to {have[-1]}" if have else "it has no decoder layers (model.layers.N.*)"
        self.fail(f"no layer {layer}: {has}")

    def header(self, name: str) -> tuple[list[int], str]:
        with self._handle(self.files[name]) as f:
            if name not in set(f.keys()):
                self.fail(f"tensor {name!r} is not in its shard {self.files[name].name}")
            sl = f.get_slice(name)
            return list(sl.get_shape()), sl.get_dtype()

    def tensor(self, name: str) -> torch.Tensor:
        with self._handle(self.files[name]) as f:
            return f.get_tensor(name)


def layer_names(ck: Checkpoint, layer: int, cfg: LlamaConfig) -> dict[str, str]:
    """Input -> the checked tensor name (names, shapes and dtypes from the headers)."""
    pre = ck.prefix(layer)
    out = {}
    for inp, (shape, fields) in hf_shapes(cfg).items():
        name = pre + HF_NAMES[inp]
        if name not in ck.files:
            ck.fail(f"no tensor {name!r} (a LLaMA decoder layer has {', '.join(HF_NAMES.values())})")
        got, dtype = ck.header(name)
        if tuple(got) != shape:
            ck.fail(f"{name} is {' x '.join(map(str, got))} but the configuration needs "
                    f"{' x '.join(map(str, shape))} ({fields}); is the configuration the checkpoint's config.json?")
        if dtype not in FLOATS:
            ck.fail(f"{name} holds {dtype}, not floating-point weights (quantized checkpoints are not supported)")
        out[inp] = name
    return out


def check_weights(path: str, layer: int, cfg: LlamaConfig) -> None:
    """Refuse, from the headers alone, a checkpoint whose layer ``layer`` misses a tensor or has
    one of another shape than ``cfg`` needs."""
    layer_names(Checkpoint(path), layer, cfg)


_CACHE: dict[tuple, dict[str, torch.Tensor]] = {}


def load_layer(path: str, layer: int, cfg: LlamaConfig, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    """The layer's weights as the program's inputs: matrices ``[in, out]``, norm weights ``1 x
    hidden``, in ``dtype`` on ``device`` (the last layer read is kept for the next call)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_mtime_ns, st.st_size, layer, cfg, dtype, str(device))
    if key in _CACHE:
        return _CACHE[key]
    ck = Checkpoint(path)
    out = {}
    for inp, name in layer_names(ck, layer, cfg).items():
        t = ck.tensor(name).to(device=device, dtype=dtype)
        out[inp] = t.view(1, -1) if t.dim() == 1 else t.t().contiguous()
    _CACHE.clear()
    _CACHE[key] = out
    return out


__all__ = ["HF_NAMES", "FOLDED", "GATE_UP", "folded", "fold_gains", "unfold_gains", "hf_shapes", "check_weights",
           "load_layer", "layer_names", "Checkpoint", "FLOATS"]
