"""The LLaMA family without transformers: grouped-query attention and the sliding window against
the independent reference (every attention mode, odd lengths, windows narrower and wider than a
tile), the graph (no pair outside the window, counts equal to the closed form across tilings,
windows and lengths), ``--hf-config`` and ``--weights`` (their errors, one line each), the
generated C, ``pto estimate``, and the Triton kernels under the interpreter."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from pto.orchestration.llama.config import CONFIGS, LlamaConfig
from pto.orchestration.llama.counts import closed_form
from pto.orchestration.llama.hf import hf_dict
from pto.orchestration.llama.llama7b import build_module
from pto.orchestration.llama.reference import reference_layer
from pto.orchestration.llama.tiling import LayerForm

from pto.cli.commands.run import run
from pto.engine import execute, rel_err
from pto.errors import UsageError
from pto.interp.orchestration import iter_tasks
from pto.ir.dtypes import DType
from pto.machine.target import get as target
from pto.programs import get
from pto.runtime.graph import CompiledProgram

SWA = CONFIGS["tiny-swa"]  # 8 query heads, 2 kv heads of 32, window 64


@pytest.mark.slow
@pytest.mark.parametrize("attention,fuse", [("fused", False), ("fused", True), ("pair", False), ("split", False)],
                         ids=["fused", "fused-norm-rope", "pair", "split"])
@pytest.mark.parametrize("config", ["tiny-gqa", "tiny-swa"])
@pytest.mark.parametrize("seq", [1, 100, 333])
def test_family_layer_matches_reference(config, attention, fuse, seq):
    res = run("llama", seq=seq, config=config, device="cpu", backend="torch", dtype="f32", attention=attention,
              fuse_norm_rope=fuse, check=True, seed=seq)
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.parametrize("window", [1, 33, 129])
@pytest.mark.parametrize("tg", ["x86_64", "cuda_h100"])
@pytest.mark.parametrize("attention", ["fused", "pair"])
def test_windows_narrower_and_wider_than_a_tile(window, tg, attention):
    """Windows of one key, of about a base tile and of about a q tile, on the CPU's tiling (32-row
    q tiles) and the GPU's (128): the edge tiles, the diagonal tiles that cross the window too,
    and q rows whose first tiles lie wholly before their window."""
    cfg = dataclasses.replace(SWA, window=window)
    prog = get("llama")
    s = prog.settings(config="tiny-swa", target=target(tg), attention=attention)
    module = build_module(cfg, DType.F32, target(tg), LayerForm(attention, True, False))
    for seq in (150, 301):
        inputs = prog.inputs(s, prog.shape(seq), "cpu", seed=seq)
        out = execute(module, {"S": seq}, inputs, device="cpu", backend="torch")["y"]
        assert rel_err(out, reference_layer(inputs, cfg)) <= 1e-5, (window, tg, seq)


def test_bf16_family_layer_matches_bf16_reference():
    for config in ("tiny-gqa", "tiny-swa"):
        res = run("llama", seq=99, config=config, device="cpu", backend="torch", dtype="bf16", check=True)
        assert res["rel_err"] <= 2e-2, res


def test_no_pair_outside_the_window_and_none_missing():
    """Every pair task's kv tile meets the window of one of its q rows, and the pairs of a q tile
    cover every key its rows attend to."""
    prog = get("llama")
    s = prog.settings(config="tiny-swa", attention="pair", target=target("x86_64"), fuse=False)
    seq, W = 333, SWA.window
    cover: dict[int, set] = {}
    for task in iter_tasks(CompiledProgram.get(prog.build(s)).lowered, prog.scalars(s, prog.shape(seq))):
        if task.func.name != "flash_pair_swa":
            continue
        sc = dict(task.scalars)
        q = next(r for r in task.regions if r.param == "q")
        k = next(r for r in task.regions if r.param == "k")
        qpos, kpos = sc["qpos"], sc["kpos"]
        assert k.row0 == kpos and kpos <= qpos + q.rows - 1, "a kv tile after every q row"
        assert kpos + k.rows - 1 > qpos - W, "a kv tile before every q row's window"
        cover.setdefault((qpos, q.rows), set()).update(range(kpos, kpos + k.rows))
    assert sum(rows for _, rows in cover) == seq
    for (qpos, rows), keys in cover.items():
        assert set(range(max(0, qpos - W + 1), qpos + rows)) <= keys


def test_graph_counts_equal_closed_form_for_the_family():
    """GQA changes no count; windows change pairs and edges: built graphs against the closed
    form for windows of one key to more than a q tile, two tilings, every mode, with and without
    adaptive tiles (the per-tile definition below covers many more windows and tilings)."""
    prog = get("llama")
    for tg, windows in (("x86_64", (None, 1, 129)), ("cuda_h100", (64,))):
        for window in windows:
            cfg = dataclasses.replace(SWA, window=window)
            for attention, fuse in (("fused", False), ("fused", True), ("pair", False), ("split", False)):
                s = prog.settings(config="tiny-swa", target=target(tg), attention=attention, fuse_norm_rope=fuse)
                t = prog.tiling(s)
                module = build_module(cfg, DType.F32, target(tg), prog.form(s))  # whole row tiles on the GPU
                for adaptive in (True, False):
                    cp = CompiledProgram.get(module, adaptive)
                    for seq in (1, 65, 200, 417):
                        g = cp.build_graph({"S": seq})
                        cf = closed_form(cfg, t, seq, attention, True, adaptive, fuse)
                        assert (g.tasks, g.edges) == (cf["tasks"], cf["edges"]), \
                            (tg, window, attention, fuse, adaptive, seq)
                        g.close()
    mha, gqa = (closed_form(c, prog.tiling(s), 5000, "pair", True) for c in (CONFIGS["tiny"], CONFIGS["tiny-gqa"]))
    assert mha == gqa


def _per_tile_window(t, seq: int, window: int, adaptive: bool) -> tuple[int, int, int]:
    """(T, P, Q) of a windowed layer by enumerating binary expansion's row tiles, each q tile's kv
    tiles from the start of its window's first kv tile, and the row tiles that range overlaps."""
    from pto.orchestration.llama.counts import row_tiles, window_start

    n = -(-seq // t.base)
    tq, tk = (t.tq, t.tk) if adaptive else (t.base, t.base)
    rows = row_tiles(n, t.base, tq)
    P = Q = 0
    for s, h in rows:
        lo = window_start(s, t.base, t.tk // t.base, window)
        P += len(row_tiles(s + h - lo, t.base, tk))
        Q += sum(1 for s2, h2 in rows if s2 < s + h and s2 + h2 > lo)
    return len(rows), P, Q


@pytest.mark.parametrize("max_range", [4, 8, 4096])
def test_window_closed_form_equals_the_per_tile_definition(monkeypatch, max_range):
    """Every tiling the SRAM fitting can choose, windows around every tile size, lengths up to
    several full blocks of binary expansion (max_range shrunk): the closed form's P and Q equal
    enumerating the tiles."""
    from pto.orchestration.llama import tiling
    from pto.orchestration.llama.tiling import LlamaTiling

    monkeypatch.setattr(tiling, "MAX_RANGE", max_range)
    for base, tq, tk in [(32, 128, 128), (32, 128, 64), (32, 64, 64), (16, 32, 32), (8, 16, 16), (32, 128, 32)]:
        t = LlamaTiling(base=base, tq=tq, tk=tk, bn=0, bk=0, norm_rows=0, norm_chunk=0, ew_block=0)
        for window in (1, 2, base - 1, base, base + 1, tk - 1, tk, tk + 1, 3 * tk + 5, 1000):
            cfg = dataclasses.replace(SWA, window=window)
            for n in (range(0, 8 * max_range + 3) if max_range < 4096 else (1, 2, 3, 37, 200)):
                seq = max(n * base - base // 2, 0)
                for adaptive in (True, False):
                    T, P, Q = _per_tile_window(t, seq, window, adaptive)
                    want = {"fused": (11 * T, 11 * T + 2 * Q), "pair": (16 * T + P, 16 * T + 4 * P),
                            "split": (16 * T + 3 * P, 14 * T + 10 * P)}
                    for attention, (tasks, edges) in want.items():
                        cf = closed_form(cfg, t, seq, attention, True, adaptive)
                        assert (cf["tasks"], cf["edges"]) == (tasks, edges), (t, window, seq, attention, adaptive)


def test_window_closed_form_at_scale():
    """Mistral-7B's 4096-token window on the H100 tiling: the counts at 2**31 - 1 tokens in
    milliseconds, and pairs growing linearly (each q tile sees 33 kv tiles of 128 once warm)."""
    prog = get("llama")
    s = prog.settings(config="mistral-7b", target=target("cuda_h100"), dtype="bf16", attention="split", fuse=False)
    a, b = prog.counts(s, prog.shape(1 << 20)), prog.counts(s, prog.shape(1 << 21))
    assert b["pairs"] - a["pairs"] == 33 * (b["row_tiles"] - a["row_tiles"])
    big = prog.counts(s, prog.shape(2**31 - 1))
    assert big["tasks"] == 16 * big["row_tiles"] + 3 * big["pairs"] and big["pairs"] < 34 * big["row_tiles"]


# ------------------------------------------------------------------ --hf-config and --weights


def _write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


@pytest.mark.parametrize("change,needle", [
    ({"model_type": "qwen2"}, "model_type 'qwen2' is not supported"),
    ({"attention_bias": True}, "field 'attention_bias' = true is not supported"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' = \"gelu\""),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 8"),
    ({"head_dim": 48}, "head_dim 48 is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs 'low_freq_factor'"),
    ({"attn_logit_softcapping": 50.0}, "unsupported field 'attn_logit_softcapping'"),
    ({"quantization_config": {"bits": 4}}, "unsupported field 'quantization_config'"),
    ({"intermediate_size": "704"}, "field 'intermediate_size' must be a positive integer"),
    ({"hidden_size": None}, "missing field 'hidden_size'"),
    ({"sliding_window": 64}, "unsupported field 'sliding_window'"),  # a llama config has none
])
def test_hf_config_errors_name_the_field(tmp_path, change, needle):
    data = {**hf_dict(CONFIGS["tiny-gqa"]), **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(UsageError, match=needle.replace("(", r"\(")):
        get("llama").settings(hf_config=_write(tmp_path, "config.json", data))


def test_hf_config_is_the_settings_config(tmp_path):
    """The file's configuration is the settings' config (in every report, the caches' key); the
    published spelling and transformers 5's give the same one; Mistral's window defaults to
    transformers' 4096 and null means none."""
    prog = get("llama")
    path = _write(tmp_path, "a.json", hf_dict(SWA, vocab_size=32000, num_hidden_layers=32, torch_dtype="bfloat16"))
    s = prog.settings(hf_config=path)
    assert prog.config(s) == SWA and s.config.startswith("hf:") and s["hf_config"] == path
    assert json.loads(json.dumps(s.to_json()))["config"] == s.config
    v5 = {k: v for k, v in hf_dict(SWA).items() if k != "rope_theta"} | {"rope_parameters": {"rope_theta": 1e4}}
    assert prog.config(prog.settings(hf_config=_write(tmp_path, "b.json", v5))) == SWA
    no_key = {k: v for k, v in hf_dict(SWA).items() if k != "sliding_window"}
    assert prog.config(prog.settings(hf_config=_write(tmp_path, "c.json", no_key))).window == 4096
    null = hf_dict(SWA) | {"sliding_window": None}
    assert prog.config(prog.settings(hf_config=_write(tmp_path, "d.json", null))).window is None
    with pytest.raises(UsageError, match="--hf-config and --config tiny both"):
        prog.settings(hf_config=path, config="tiny")
    with pytest.raises(UsageError, match="sliding window of 64 tokens, which is causal"):
        prog.settings(hf_config=path, causal=False)
    with pytest.raises(UsageError, match="no such file"):
        prog.settings(hf_config=str(tmp_path / "missing.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="empty: the folder has no config.json"):
        prog.settings(hf_config=str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{ nope")
    with pytest.raises(UsageError, match="not JSON"):
        prog.settings(hf_config=str(tmp_path / "bad.json"))


def _checkpoint(path, cfg: LlamaConfig, layers=(0, 1), drop=(), reshape=None, dtype=torch.float32):
    """A safetensors file with transformers' names for ``layers`` of ``cfg``."""
    from pto.orchestration.llama.weights import HF_NAMES, hf_shapes
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    tensors = {}
    for layer in layers:
        for inp, (shape, _) in hf_shapes(cfg).items():
            name = f"model.layers.{layer}.{HF_NAMES[inp]}"
            if name.endswith(drop) and drop:
                continue
            shape = reshape.get(inp, shape) if reshape else shape
            tensors[name] = (torch.randn(shape, generator=g) * 0.1).to(dtype)
    tensors["model.embed_tokens.weight"] = torch.zeros(8, cfg.hidden)
    save_file(tensors, str(path))
    return str(path)


def test_weights_are_the_layers_transposed(tmp_path):
    from safetensors.torch import load_file

    cfg = CONFIGS["tiny-gqa"]
    path = _checkpoint(tmp_path / "m.safetensors", cfg, dtype=torch.bfloat16)
    prog = get("llama")
    s = prog.settings(config="tiny-gqa", weights=path, layer=1)
    inp = prog.inputs(s, prog.shape(9), "cpu")
    raw = load_file(path)
    assert torch.equal(inp["wq"], raw["model.layers.1.self_attn.q_proj.weight"].float().t())
    assert inp["wk"].shape == (256, 64) and inp["wo"].shape == (256, 256) and inp["g_attn"].shape == (1, 256)
    res = run("llama", seq=50, config="tiny-gqa", device="cpu", check=True, weights=path, layer=1)
    assert res["rel_err"] <= 1e-5
    # a sharded checkpoint: its index names the file of each tensor
    index = _write(tmp_path, "model.safetensors.index.json",
                   {"weight_map": {k: "m.safetensors" for k in raw}})
    s1 = prog.settings(config="tiny-gqa", weights=index, layer=1)
    assert torch.equal(prog.inputs(s1, prog.shape(9), "cpu")["wd"], inp["wd"])


def test_weights_errors_name_the_tensor(tmp_path):
    cfg = CONFIGS["tiny-gqa"]
    prog = get("llama")
    ok = _checkpoint(tmp_path / "ok.safetensors", cfg)
    with pytest.raises(UsageError, match=r"no layer 5: it has layers 0 to 1"):
        prog.settings(config="tiny-gqa", weights=ok, layer=5)
    with pytest.raises(UsageError, match=r"model.layers.0.self_attn.k_proj.weight is 64 x 256 but the "
                                         r"configuration needs 256 x 256 \(num_key_value_heads"):
        prog.settings(config="tiny", weights=ok)  # the multi-head tiny config: k is 256 wide there
    missing = _checkpoint(tmp_path / "missing.safetensors", cfg, drop="mlp.up_proj.weight")
    with pytest.raises(UsageError, match=r"no tensor 'model.layers.0.mlp.up_proj.weight'"):
        prog.settings(config="tiny-gqa", weights=missing)
    ints = _checkpoint(tmp_path / "int.safetensors", cfg, dtype=torch.int8)
    with pytest.raises(UsageError, match="holds I8, not floating-point weights"):
        prog.settings(config="tiny-gqa", weights=ints)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(UsageError, match="junk.safetensors is not a safetensors file"):
        prog.settings(config="tiny-gqa", weights=str(tmp_path / "junk.safetensors"))
    with pytest.raises(UsageError, match="no such file"):
        prog.settings(config="tiny-gqa", weights=str(tmp_path / "nope.safetensors"))
    with pytest.raises(UsageError, match="--layer picks a layer of --weights"):
        prog.settings(config="tiny-gqa", layer=1)


def test_cli_errors_are_one_line(tmp_path):
    ok = _checkpoint(tmp_path / "ok.safetensors", CONFIGS["tiny-gqa"])
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama", "--weights", ok, "--layer", "7", "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and r.stdout == ""
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith("pto: error:") and "no layer 7" in err, err


@pytest.mark.slow
def test_cli_run_and_estimate_with_hf_config(tmp_path):
    """`pto run llama --hf-config F --weights W --layer N --check --json` and `pto estimate` of the
    same file (measured rows equal the closed form, or estimate fails)."""
    cfg = hf_dict(SWA)
    path = _write(tmp_path, "config.json", cfg)
    w = _checkpoint(tmp_path / "w.safetensors", SWA)
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama", "--hf-config", path, "--weights", w,
                        "--layer", "1", "--seq", "130", "--check", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["rel_err"] <= 1e-5 and res["hf_config"] == path and "window=64" in res["config"]
    r = subprocess.run([sys.executable, "-m", "pto.cli", "estimate", "llama", "--hf-config", path, "--seq",
                        "1024,4096,16777216", "--target", "cuda_h100", "--dtype", "bf16", "--attention", "split",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert rows[0]["measured"] and not rows[-1]["measured"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/usr/bin/gcc") and not os.path.exists("/usr/bin/cc"), reason="no C compiler")
def test_codegen_of_a_windowed_gqa_layer_builds_and_counts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pto.cli", "codegen", "llama", "--out", str(tmp_path), "--config",
                        "tiny-swa", "--attention", "pair", "--no-fuse", "--target", "x86_64"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    exe = tmp_path / "graph"
    sources = map(str, sorted(tmp_path.glob("*.c")))
    cc = subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", *sources, "-o", str(exe), "-lm",
                         "-pthread"], capture_output=True, text=True)
    assert cc.returncode == 0 and cc.stderr == "", cc.stderr
    prog = get("llama")
    s = prog.settings(config="tiny-swa", attention="pair", target=target("x86_64"), fuse=False)
    for seq in (1, 77, 300):
        out = subprocess.run([str(exe), str(seq)], capture_output=True, text=True, check=True).stdout.split()
        cf = prog.counts(s, prog.shape(seq))
        assert (int(out[1]), int(out[3])) == (cf["tasks"], cf["edges"])


# ------------------------------------------------------------------ Triton, under the interpreter


@pytest.mark.slow
@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("config,attention,fuse,executor", [
    ("tiny-swa", "fused", False, "waves"), ("tiny-swa", "pair", False, "persistent"),
    ("tiny-gqa", "fused", True, "persistent"), ("tiny-gqa", "split", False, "waves")])
def test_triton_kernels_of_the_family(config, attention, fuse, executor):
    pytest.importorskip("triton")
    res = run("llama", seq=90, config=config, device="cpu", backend="triton", executor=executor, dtype="f32",
              attention=attention, fuse_norm_rope=fuse, check=True, seed=2)
    assert res["rel_err"] <= 1e-5, res
