"""The LLaMA family against Hugging Face transformers' own decoder layers: accuracy and speed.

For each model (LLaMA-2-7B, LLaMA-3-8B, Mistral-7B layer shapes, from config dicts written here in
the published checkpoints' spelling) and each sequence length: a config.json and one decoder
layer of seeded random weights (rounded to bf16, as checkpoints ship) in a safetensors file; then,
on the same weights, positions and input,

- ours: ``pto run llama --hf-config config.json --weights layer.safetensors --layer 0`` (the
  engine's Runner, the same code path) in bf16, timed as replays (a CUDA graph on the GPU);
- transformers' ``LlamaDecoderLayer`` / ``MistralDecoderLayer`` in bf16 with its default SDPA
  attention, its own rotary module and causal / sliding-window mask, timed eagerly and under
  ``torch.compile``;
- the same transformers layer in float64 (exact cos/sin from float64 frequencies; attention
  computed in query chunks so that 16K tokens fit: a registered attention function, everything
  else transformers' own), the reference both are measured against: rel_err = |out - ref| / |ref|.

Output: a table (markdown, for docs/PERF.md) and ``--json FILE``. On the GPU::

    python bench/llama_family.py --json llama_family.json

``--tiny`` runs the same on tiny shapes (hidden 256, 8 query heads, 2 key/value heads, window 64)
at short lengths, on the CPU too. Needs the ``hf`` extra (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

MODELS = {  # the layer shapes of the published checkpoints' config.json
    "llama2-7b": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
                  "intermediate_size": 11008, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                  "max_position_embeddings": 4096, "vocab_size": 32000, "num_hidden_layers": 32},
    "llama3-8b": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "intermediate_size": 14336, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
                  "max_position_embeddings": 8192, "vocab_size": 128256, "num_hidden_layers": 32},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "intermediate_size": 14336, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                   "sliding_window": 4096, "max_position_embeddings": 32768, "vocab_size": 32000,
                   "num_hidden_layers": 32},
}
TINY = {"hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 704}  # 2 kv heads where GQA
HF_NAMES = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight")


def model_config(name: str, tiny: bool) -> dict:
    cfg = dict(MODELS[name])
    if tiny:
        cfg.update(TINY, num_key_value_heads=8 if cfg["num_key_value_heads"] == 32 else 2)
        if "sliding_window" in cfg:
            cfg["sliding_window"] = 64
    return cfg


def write_checkpoint(cfg: dict, folder: Path, seed: int) -> tuple[Path, Path]:
    """config.json and one layer (``model.layers.0.*``) of bf16 random weights: norms 1 + 0.1 N(0, 1),
    projections N(0, 1 / fan_in)."""
    from safetensors.torch import save_file

    H, NH, F = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    D, NKV = H // NH, cfg["num_key_value_heads"]
    shapes = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
              "self_attn.q_proj.weight": (NH * D, H), "self_attn.k_proj.weight": (NKV * D, H),
              "self_attn.v_proj.weight": (NKV * D, H), "self_attn.o_proj.weight": (H, NH * D),
              "mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H), "mlp.down_proj.weight": (H, F)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in HF_NAMES:
        shape = shapes[name]
        t = torch.randn(shape, generator=g)
        t = 1.0 + 0.1 * t if len(shape) == 1 else t * shape[1] ** -0.5
        tensors["model.layers.0." + name] = t.to(torch.bfloat16).contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(tensors, str(folder / "layer.safetensors"))
    return folder / "config.json", folder / "layer.safetensors"


# -- transformers' layer ---------------------------------------------------------------------------


def _chunked_f64_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, sliding_window=None,
                           **kwargs):
    """Causal (and sliding-window) attention in query chunks: what SDPA's math path computes,
    without materializing S x S scores for every head at once (16K tokens in float64)."""
    B, NH, S, D = query.shape
    group = NH // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    out = torch.empty_like(query)
    chunk = max(1, (1 << 27) // (NH * S))
    for s0 in range(0, S, chunk):
        s1 = min(S, s0 + chunk)
        scores = query[:, :, s0:s1] @ key[:, :, :s1].transpose(-1, -2) * scaling
        qpos = torch.arange(s0, s1, device=query.device)[:, None]
        kpos = torch.arange(s1, device=query.device)[None, :]
        keep = kpos <= qpos
        if sliding_window:
            keep &= kpos > qpos - sliding_window
        scores.masked_fill_(~keep, -math.inf)
        out[:, :, s0:s1] = torch.softmax(scores, dim=-1) @ value[:, :, :s1]
    return out.transpose(1, 2).contiguous(), None


class HFLayer:
    """One transformers decoder layer with the checkpoint's weights, in ``dtype``, and how to call it."""

    def __init__(self, cfg: dict, weights: Path, dtype: torch.dtype, device: str, seq: int):
        import transformers
        from safetensors.torch import load_file

        family = "Mistral" if cfg["model_type"] == "mistral" else "Llama"
        kw = {k: v for k, v in cfg.items() if k != "model_type"}
        f64 = dtype == torch.float64
        if f64:
            transformers.AttentionInterface.register("pto_chunked_f64", _chunked_f64_attention)
        self.config = getattr(transformers, f"{family}Config")(**kw, attn_implementation="pto_chunked_f64" if f64
                                                               else "sdpa")
        modeling = importlib.import_module(f"transformers.models.{family.lower()}.modeling_{family.lower()}")
        self.layer = getattr(modeling, f"{family}DecoderLayer")(self.config, layer_idx=0)
        state = {k.removeprefix("model.layers.0."): v for k, v in load_file(str(weights)).items()}
        self.layer.load_state_dict(state)
        self.layer = self.layer.to(device=device, dtype=dtype).eval()
        self.pos = torch.arange(seq, device=device)[None]
        D = cfg["hidden_size"] // cfg["num_attention_heads"]
        if f64:  # exact tables: float64 frequencies and angles (the rotary module computes in f32)
            inv = cfg["rope_theta"] ** (-torch.arange(0, D, 2, dtype=torch.float64, device=device) / D)
            ang = torch.cat([self.pos[0, :, None] * inv] * 2, dim=-1).to(torch.float64)
            self.pe = (ang.cos()[None], ang.sin()[None])
            self.mask = None  # the chunked attention applies causality and the window itself
        else:
            rotary = getattr(modeling, f"{family}RotaryEmbedding")(self.config).to(device)
            probe = torch.zeros(1, seq, 1, device=device, dtype=dtype)
            with torch.no_grad():
                self.pe = rotary(probe, position_ids=self.pos)
            self.mask = self._mask(family, probe.expand(1, seq, cfg["hidden_size"]))

    def _mask(self, family, embeds):
        from transformers import masking_utils

        fn = masking_utils.create_sliding_window_causal_mask if getattr(self.config, "sliding_window", None) \
            else masking_utils.create_causal_mask
        with torch.no_grad():
            return fn(config=self.config, inputs_embeds=embeds, attention_mask=None, past_key_values=None,
                      position_ids=self.pos)

    def __call__(self, x: torch.Tensor, layer=None) -> torch.Tensor:
        with torch.no_grad():
            y = (self.layer if layer is None else layer)(x[None], attention_mask=self.mask, position_embeddings=self.pe,
                                                         position_ids=self.pos)
        return (y[0] if isinstance(y, tuple) else y)[0]


# -- the measurement --------------------------------------------------------------------------------


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm()) if torch.isfinite(o).all() else float("inf")


def measure(name: str, cfg: dict, seq: int, files: tuple[Path, Path], args, device: str) -> dict:
    from pto.engine import Runner, resolve
    from pto.exec.timing import median_ms

    cuda = device == "cuda"
    job = resolve("llama", device=device, executor=args.executor, dtype="bf16",
                  options={"hf_config": str(files[0]), "weights": str(files[1]), "layer": 0,
                           "attention": args.attention})
    prog, s = job.program, job.settings
    prog.check_size(s, prog.shape(seq))
    row = {"model": name, "seq": seq, "dtype": "bf16", "attention": args.attention}
    inputs = prog.inputs(s, prog.shape(seq), device, args.seed)
    x = inputs["x"]
    # ours
    runner = Runner(job, seq)
    t0 = time.perf_counter()
    ours = runner(inputs)["y"].clone()
    if cuda:
        torch.cuda.synchronize()
    row.update(first_run_s=round(time.perf_counter() - t0, 2), tasks=runner.graph.tasks,
               executor=runner.executor.name)
    row["ours_ms"] = runner.time(args.iterations)["replay_ms"]
    runner.close()
    del runner
    # the float64 reference
    ref_layer = HFLayer(cfg, files[1], torch.float64, device, seq)
    ref = ref_layer(x.double())
    del ref_layer
    # transformers in bf16: eager, then torch.compile
    hf = HFLayer(cfg, files[1], torch.bfloat16, device, seq)
    theirs = hf(x)
    row["eager_ms"] = round(median_ms(lambda: hf(x), args.iterations, args.warmup, cuda=cuda), 4)
    if not args.no_compile:
        compiled = torch.compile(hf.layer)
        t0 = time.perf_counter()
        hf(x, compiled)
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        row["compile_ms"] = round(median_ms(lambda: hf(x, compiled), args.iterations, args.warmup, cuda=cuda), 4)
    row["ours_rel_err"] = rel_err(ours, ref)
    row["hf_bf16_rel_err"] = rel_err(theirs, ref)
    row["ours_vs_hf_bf16"] = rel_err(ours, theirs)
    row["speedup_vs_eager"] = round(row["eager_ms"] / row["ours_ms"], 3)
    if "compile_ms" in row:
        row["speedup_vs_compile"] = round(row["compile_ms"] / row["ours_ms"], 3)
    return row


def table(rows: list[dict]) -> str:
    head = ("| model | seq | ours ms | eager ms | compile ms | vs eager | vs compile | rel_err ours | "
            "rel_err transformers bf16 |")
    lines = [head, "| --- " * (head.count("|") - 1) + "|"]
    for r in rows:
        compiled = ("-", "-") if "compile_ms" not in r else \
            (f"{r['compile_ms']:.3f}", f"{r['speedup_vs_compile']:.2f}x")
        lines.append(f"| {r['model']} | {r['seq']} | {r['ours_ms']:.3f} | {r['eager_ms']:.3f} | {compiled[0]} | "
                     f"{r['speedup_vs_eager']:.2f}x | {compiled[1]} | {r['ours_rel_err']:.2e} | "
                     f"{r['hf_bf16_rel_err']:.2e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--seq", default=None, help="comma-separated lengths (default 1024,4096,16384; --tiny 100,300)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (hidden 256, window 64): runs on the CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--attention", default="fused", choices=["fused", "pair", "split"])
    p.add_argument("--executor", default="auto")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of transformers' layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the checkpoints are written (default: a temporary folder)")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("llama_family: needs transformers (pip install -e \".[hf]\")", file=sys.stderr)
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    seqs = [int(v) for v in (args.seq or ("100,300" if args.tiny else "1024,4096,16384")).split(",")]
    models = args.models.split(",")
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"unknown model {bad[0]!r} (choose from {', '.join(MODELS)})")
    rows = []
    with (contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory()) as work:
        for i, name in enumerate(models):
            cfg = model_config(name, args.tiny)
            files = write_checkpoint(cfg, Path(work) / name, args.seed + i)
            for seq in seqs:
                row = measure(name, cfg, seq, files, args, device)
                rows.append(row)
                gc.collect()  # the layers and tensors of this length, before the next
                if device == "cuda":
                    torch.cuda.empty_cache()
                print(json.dumps(row), file=sys.stderr, flush=True)
    info = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "tiny": args.tiny,
            "iterations": args.iterations, "warmup": args.warmup}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
