"""The LLaMA family against Hugging Face transformers' own layers (the optional ``hf`` extra;
skipped without transformers): checkpoints written by transformers (``save_pretrained``: its
config.json and model.safetensors) of tiny LLaMA-2 (multi-head, linear RoPE scaling), LLaMA-3
(grouped-query, LLaMA-3 RoPE scaling) and Mistral (grouped-query, sliding window of 64) shapes
with seeded random weights, read back through ``--hf-config``, ``--weights`` and ``--layer``, and
our layer compared in f32 on the CPU with the checkpoint's decoder layer run inside transformers'
model (its own causal or sliding-window mask and rotary embedding), every attention mode, odd
lengths. f32 sums of a few hundred terms: agreement to about 1e-6."""

from __future__ import annotations

import json

import pytest
import torch
from pto.orchestration.llama.hf import load_hf_config, parse_hf_config
from pto.orchestration.llama.reference import rope_tables

from pto.cli.commands.run import run
from pto.engine import execute, rel_err
from pto.ir.dtypes import DType
from pto.programs import get

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, head_dim=32, num_hidden_layers=3,
             vocab_size=64, rms_norm_eps=1e-5, max_position_embeddings=131072)
FAMILIES = {
    "llama2": ("LlamaConfig", "LlamaForCausalLM",
               dict(num_key_value_heads=8, rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(num_key_value_heads=2, rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, rope_theta=10000.0,
                                                            sliding_window=64)),
}
LAYER = 1  # of 3: the middle one, whose output is not the model's last hidden state


def _config(family: str):
    cfg_cls, _, extra = FAMILIES[family]
    kw = {**SMALL, **extra}
    try:
        return getattr(transformers, cfg_cls)(**kw, attn_implementation="eager")
    except TypeError:  # older transformers: RoPE parameters under other names
        kw["rope_parameters"] = {"rope_theta": kw.pop("rope_theta"), **kw.pop("rope_scaling", {})}
        return getattr(transformers, cfg_cls)(**kw, attn_implementation="eager")


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(family, folder, model): a tiny model with seeded random weights saved by transformers."""
    family = request.param
    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[family][1])(_config(family)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # fan-in scaled, as a trained layer's activations stay O(1)
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder, safe_serialization=True)
    return family, folder, model


def _hf_layer(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of decoder layer LAYER, run by transformers' model on ``x`` at positions
    0 .. S - 1 with its own mask and rotary embedding."""
    with torch.no_grad():
        hs = model.model(inputs_embeds=x[None], output_hidden_states=True).hidden_states
    return hs[LAYER][0], hs[LAYER + 1][0]


MODES = [("fused", False), ("fused", True), ("pair", False), ("split", False)]


@pytest.mark.slow
@pytest.mark.parametrize("attention,fuse", MODES, ids=["fused", "fused-norm-rope", "pair", "split"])
@pytest.mark.parametrize("seq", [1, 77, 150])
def test_layer_matches_transformers(checkpoint, attention, fuse, seq):
    family, folder, model = checkpoint
    prog = get("llama")
    s = prog.settings(hf_config=str(folder / "config.json"), weights=str(folder / "model.safetensors"), layer=LAYER,
                      attention=attention, fuse_norm_rope=fuse, dtype="f32")
    inputs = prog.inputs(s, prog.shape(seq), "cpu", seed=seq)
    x, want = _hf_layer(model, torch.randn(seq, SMALL["hidden_size"], generator=torch.Generator().manual_seed(seq)))
    inputs["x"] = x.contiguous()
    got = execute(prog.build(s), prog.scalars(s, prog.shape(seq)), inputs, device="cpu", backend="torch")["y"]
    err = rel_err(got, want)
    assert err <= 2e-6, (family, attention, fuse, seq, err)


def test_the_checkpoint_reads_back_as_written(checkpoint):
    """config.json as transformers writes it (its own spelling of RoPE) and in the published
    checkpoints' (rope_theta, rope_scaling) give one configuration; the weights come back
    transposed, and the layer picked is LAYER's."""
    family, folder, model = checkpoint
    cfg = load_hf_config(str(folder))
    data = json.loads((folder / "config.json").read_text())
    legacy = {k: v for k, v in data.items() if k != "rope_parameters"}
    rp = dict(data.get("rope_parameters") or {})
    legacy["rope_theta"] = rp.pop("rope_theta", data.get("rope_theta"))
    if rp.get("rope_type", "default") != "default":
        legacy["rope_scaling"] = rp
    assert parse_hf_config(legacy) == cfg
    assert (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.window) == \
        (8, FAMILIES[family][2]["num_key_value_heads"], 32, FAMILIES[family][2].get("sliding_window"))
    prog = get("llama")
    s = prog.settings(hf_config=str(folder), weights=str(folder), layer=LAYER)
    w = prog.inputs(s, prog.shape(4), "cpu")
    layer = model.model.layers[LAYER]
    assert torch.equal(w["wk"], layer.self_attn.k_proj.weight.detach().t())
    assert torch.equal(w["wd"], layer.mlp.down_proj.weight.detach().t())
    assert torch.equal(w["g_ffn"][0], layer.post_attention_layernorm.weight.detach())


def test_rope_tables_match_the_models_rotary_embedding(checkpoint):
    """Our cos/sin (float64, rounded once) against transformers' rotary module (float32
    arithmetic: angles off by a few ulps of position x frequency)."""
    family, folder, model = checkpoint
    cfg = load_hf_config(str(folder))
    seq = 4096
    cos, sin = rope_tables(seq, cfg, DType.F32, "cpu")
    pos = torch.arange(seq)[None]
    with torch.no_grad():
        hc, hs = model.model.rotary_emb(torch.zeros(1, seq, 1), position_ids=pos)
    half = cfg.head_dim // 2
    assert torch.allclose(cos, hc[0, :, :half], atol=5e-4) and torch.allclose(sin, hs[0, :, :half], atol=5e-4)
    assert torch.equal(hc[0, :, :half], hc[0, :, half:])  # the two halves share the table, as ours


def test_pto_run_with_the_checkpoint(checkpoint):
    """`pto run llama --hf-config --weights --layer --check`: the run reports the file's
    configuration and matches the reference on the checkpoint's weights."""
    family, folder, _ = checkpoint
    res = run("llama", seq=70, device="cpu", check=True, hf_config=str(folder / "config.json"),
              weights=str(folder / "model.safetensors"), layer=LAYER)
    assert res["rel_err"] <= 1e-5 and res["config"].startswith("hf:") and res["layer"] == LAYER
    assert ("window=64" in res["config"]) == (family == "mistral")


@pytest.mark.slow
def test_bench_llama_family_runs_tiny(tmp_path):
    """bench/llama_family.py --tiny (what the GPU run measures, on tiny shapes): ours and
    transformers' bf16 layer both within bf16's error of transformers' float64 layer."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "bench" / "llama_family.py"
    out = tmp_path / "lf.json"
    r = subprocess.run([sys.executable, str(script), "--tiny", "--no-compile", "--models", "llama3-8b,mistral-7b",
                        "--seq", "90", "--iterations", "1", "--warmup", "0", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["model"] for row in rows] == ["llama3-8b", "mistral-7b"]
    for row in rows:
        assert row["ours_rel_err"] < 1e-2 and row["hf_bf16_rel_err"] < 1e-2 and row["ours_ms"] > 0
