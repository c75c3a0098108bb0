"""``--fuse-norm-rope``: the norms' gains folded into the weights after them (once, when the
inputs are made), each row's scale from a statistics task applied in the projections' epilogue,
RoPE in the q/k projections' epilogue over one or more heads a program. The folded layer against
the unfused one on the same weights, each against a float64 run; the statistics task; the q/k
projection's heads per program against each other and a float64 formula; the folded inputs'
names."""

from __future__ import annotations

import math

import pytest
import torch
from pto.incore.fused import Fold, Heads, matmul_interleaved_swiglu, matmul_norm_rope_tile, matmul_norm_tile
from pto.incore.norm import rms_scale_tile
from pto.orchestration.llama.reference import reference_layer
from pto.orchestration.llama.tiling import rope_heads
from pto.orchestration.llama.weights import FOLDED, GATE_UP, fold_gains, folded, unfold_gains

from pto.engine import Runner, rel_err, resolve
from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType, dtype_of
from pto.ir.nodes import ForRange, walk_instrs
from pto.ir.ops import Op


def _run(config: str, dtype: str, fuse: bool, seq: int, inputs=None):
    job = resolve("llama", device="cpu", backend="torch", config=config, dtype=dtype,
                  options={"fuse_norm_rope": fuse})
    prog, s = job.program, job.settings
    inputs = inputs if inputs is not None else prog.inputs(s, prog.shape(seq), "cpu", seed=seq)
    runner = Runner(job, seq)
    try:
        return inputs, runner(inputs)["y"].clone()
    finally:
        runner.close()


@pytest.mark.parametrize("config", ["tiny", "tiny-gqa"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_folded_layer_is_the_unfused_layer(config, dtype):
    """The same seeded layer, unfused and folded (its inputs are the unfused ones through
    :func:`fold_gains`), each against float64: the folded layer rounds ``g w`` once per weight
    where the unfused one rounds ``x r g`` once per activation, the same number of roundings in
    every product, so its error is the unfused layer's within run-to-run variation (1.5x); in
    f32 the two agree to the f32 GEMMs' own error (a few ulps summed over K = 256: 2e-7 here)."""
    seq = 77
    inputs, unfused = _run(config, dtype, False, seq)
    prog_in, fused = _run(config, dtype, True, seq, fold_gains(inputs))
    job = resolve("llama", device="cpu", config=config, dtype=dtype, options={"fuse_norm_rope": True})
    seeded = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=seq)
    assert seeded.keys() == prog_in.keys() and all(torch.equal(seeded[k], prog_in[k]) for k in seeded)
    cfg = job.program.config(job.settings)
    ref = reference_layer({k: v.double() for k, v in inputs.items()}, cfg, True)
    e_unfused, e_fused = rel_err(unfused, ref), rel_err(fused, ref)
    if dtype == "f32":
        assert rel_err(fused, unfused) <= 1e-6 and e_fused <= 1e-6
    else:
        assert e_fused <= 1.5 * e_unfused, (e_fused, e_unfused)


def test_folded_inputs_name_the_folded_weights_and_drop_the_gains():
    g = torch.Generator().manual_seed(0)
    H = 8
    inputs = {"x": torch.randn(3, H, generator=g), "g_attn": torch.randn(1, H, generator=g),
              "g_ffn": torch.randn(1, H, generator=g), "wo": torch.randn(H, H, generator=g)}
    inputs.update({w: torch.randn(H, 2 * H, generator=g).to(torch.bfloat16) for w in FOLDED})
    out = fold_gains(inputs)
    assert set(out) == {"x", "wo", "wq_g", "wk_g", "wv_g", GATE_UP}
    want = {w: (inputs[gain].double().reshape(-1, 1) * inputs[w].double()).to(torch.bfloat16)
            for w, gain in FOLDED.items()}
    for w in ("wq", "wk", "wv"):
        assert out[folded(w)].dtype == torch.bfloat16 and torch.equal(out[folded(w)], want[w])
    # the gate and up weights' columns interleaved: gate c at 2c, up c at 2c + 1
    assert out[GATE_UP].shape == (H, 4 * H)
    assert torch.equal(out[GATE_UP][:, 0::2], want["wg"]) and torch.equal(out[GATE_UP][:, 1::2], want["wu"])
    back = unfold_gains(out)
    assert set(back) == set(inputs) and torch.equal(back["g_attn"], torch.ones(1, H, dtype=torch.bfloat16))
    assert torch.equal(back["wu"], want["wu"])


#: the references below round what the kernels round before their last step (the projection to
#: the storage dtype), so what is left is the stored result's one rounding: at most half an ulp,
#: 2^-8 relative in bf16, element by element and so in norm; in f32 the f32 sums' few ulps
_ONE_ROUNDING = {DType.F32: 2e-6, DType.BF16: 2.0 ** -8}


def _rope_ref(x, w, cos, sin, heads, D, eps):
    """float64: rope(rmsnorm(x; 1) @ w), rotate-half, the projection rounded to ``x``'s dtype first."""
    xd = x.double()
    p = (xd * _scale(x, eps).double()) @ w.double()
    p = p.to(x.dtype).double().view(x.shape[0], heads, D)
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    a1, a2 = p[..., : D // 2], p[..., D // 2:]
    return torch.cat([a1 * c - a2 * s, a2 * c + a1 * s], dim=-1).reshape(x.shape[0], heads * D)


def _scale(x, eps):
    """Each row's rsqrt(mean(x^2) + eps) through :func:`rms_scale_tile` (the statistics task)."""
    R, K = x.shape
    fn = specialize(rms_scale_tile(K, dtype_of(x.dtype), R, 4, 32, eps))
    r = torch.full((R, 1), float("nan"))
    run_incore(fn, {"x": (x, 0, 0, R, K), "r": (r, 0, 0, R, 1)})
    return r


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_the_statistics_task_is_rmsnorms_scale(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(10, 96, generator=g).to(dtype.torch)
    xd = x.double()
    want = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert rel_err(_scale(x, 1e-5), want) <= 2e-6  # f32 sums of exact squares, one rsqrt


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_rope_projection_is_the_same_whatever_the_heads_per_program(dtype):
    """One, two or four heads a program (the parallel axis over head groups, one K loop feeding
    every head's two accumulators): bitwise the same output, within the dtype's rounding of a
    float64 formula."""
    R, K, heads, D, bk, eps = 8, 64, 4, 16, 16, 1e-5
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(R, K, generator=g).to(dtype.torch), (torch.randn(K, heads * D, generator=g) / 8).to(dtype.torch)
    ang = torch.rand(R, D // 2, generator=g) * math.pi
    cos, sin = ang.cos().to(dtype.torch), ang.sin().to(dtype.torch)
    outs, rs = [], _scale(x, eps)
    for hp in (1, 2, 4):
        fn = specialize(matmul_norm_rope_tile(dtype, R, K, Heads(heads, D, hp), bk, Fold(eps, "stats")))
        assert [m.name for m in fn.memrefs] == ["x", "w", "cos", "sin", "y", "rs"]  # no gain: it is in w
        y = torch.full((R, heads * D), float("nan"), dtype=dtype.torch)
        regions = {"x": (x, 0, 0, R, K), "w": (w, 0, 0, K, heads * D), "cos": (cos, 0, 0, R, D // 2),
                   "sin": (sin, 0, 0, R, D // 2), "y": (y, 0, 0, R, heads * D), "rs": (rs, 0, 0, R, 1)}
        run_incore(fn, regions)
        outs.append(y)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert rel_err(outs[0], _rope_ref(x, w, cos, sin, heads, D, eps)) <= _ONE_ROUNDING[dtype]


def test_the_projection_with_the_scale_from_statistics_has_the_plain_k_loop():
    """``norm="stats"``: no ``g`` memref, the rows' scale from ``rs``, and the K loop is the plain
    GEMM's: load, load, matmul (no multiply, no cast, no reduction beside the product)."""
    fn = matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, Fold(1e-6, "stats"))
    assert [m.name for m in fn.memrefs] == ["x", "w", "y", "rs"]
    assert "g" in [m.name for m in matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, 1e-6).memrefs]
    (loop,) = [n for n in fn.body if isinstance(n, ForRange)]
    assert [i.op for i in walk_instrs(loop.body)] == [Op.LOAD, Op.LOAD, Op.MATMUL_ACC]
    with pytest.raises(ValueError, match="norm must be 'loop' or 'stats', not 'gain'"):
        Fold(1e-6, "gain")


def test_heads_per_program():
    assert rope_heads(32, 128, 256) == 2  # LLaMA-7B: a 256-column block holds two heads
    assert rope_heads(8, 128, 256) == 2
    assert rope_heads(12, 48, 256) == 4  # five heads fit, twelve are not a multiple of five
    assert rope_heads(9, 64, 256) == 3
    assert rope_heads(4, 64, 64) == 1
    assert rope_heads(4, 128, 64) == 1
    with pytest.raises(ValueError, match="6 heads are not a multiple of 4 heads per program"):
        matmul_norm_rope_tile(DType.F32, 8, 64, Heads(6, 16, 4), 16, 1e-5)


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_the_gate_and_up_projection_of_one_interleaved_weight(dtype):
    """SwiGLU from one accumulator against the interleaved gate/up weight: the even columns are
    the gate's, the odd the up projection's, each rounded to the dtype before ``silu(g) u``, as
    the unfused layer computes it; against float64 with the same roundings of the projections,
    within the result's own rounding."""
    R, K, N, bn, bk, eps = 8, 64, 48, 16, 16, 1e-5
    g = torch.Generator().manual_seed(9)
    x = torch.randn(R, K, generator=g).to(dtype.torch)
    wg, wu = ((torch.randn(K, N, generator=g) / 8).to(dtype.torch) for _ in range(2))
    w = torch.stack([wg, wu], -1).reshape(K, 2 * N)
    rs = _scale(x, eps)
    fn = specialize(matmul_interleaved_swiglu(dtype, R, K, N, bn, bk))
    y = torch.full((R, N), float("nan"), dtype=dtype.torch)
    run_incore(fn, {"x": (x, 0, 0, R, K), "w": (w, 0, 0, K, 2 * N), "rs": (rs, 0, 0, R, 1), "y": (y, 0, 0, R, N)})
    xn = x.double() * rs.double()
    gate, up = ((xn @ m.double()).to(dtype.torch).double() for m in (wg, wu))
    want = torch.nn.functional.silu(gate) * up
    assert rel_err(y, want) <= _ONE_ROUNDING[dtype]


def test_a_file_of_the_unfused_layers_inputs_runs_folded(tmp_path):
    """``pto run --fuse-norm-rope --inputs FILE`` with a file of the unfused layer's inputs (the
    gains and wq, ..., wu: what a run without the flag saves) folds them when it loads them: the
    output is the unfused run's on the same file, and a file of neither form is refused with the
    folded layer's own message."""
    import json
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    job = resolve("llama", device="cpu", config="tiny-gqa", dtype="f32")
    inputs = job.program.inputs(job.settings, job.program.shape(40), "cpu", seed=6)
    inputs["x"] = inputs["x"] * 2  # not what any seed gives: the runs must read the file
    save_file(inputs, str(tmp_path / "in.safetensors"))

    def pto(*flags):
        r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama", "--config", "tiny-gqa", "--seq", "40",
                            "--device", "cpu", "--backend", "torch", "--inputs", str(tmp_path / "in.safetensors"),
                            *flags], capture_output=True, text=True, timeout=300)
        return r

    outs = {}
    for flag in ("--no-fuse-norm-rope", "--fuse-norm-rope"):
        r = pto(flag, "--check", "--json", "--save", str(tmp_path / f"{flag}.safetensors"))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["rel_err"] <= 1e-6  # f32: the fold's own error, as above
        outs[flag] = load_file(str(tmp_path / f"{flag}.safetensors"))["y"]
    assert rel_err(outs["--fuse-norm-rope"], outs["--no-fuse-norm-rope"]) <= 1e-6
    save_file({"x": inputs["x"]}, str(tmp_path / "in.safetensors"))
    r = pto("--fuse-norm-rope")
    assert r.returncode == 2 and "no tensor for the inputs `wq_g`" in r.stderr, r.stderr


def test_a_ranks_folded_inputs_are_its_unfused_shard_folded():
    """Tensor parallelism of the folded layer: rank r's shard of the folded inputs (columns of
    wq_g, wk_g, wv_g; the pairs of its FFN columns in the interleaved wgu_g) is the fold of its
    shard of the unfused inputs, for every rank of 2 and 4 (the gains scale rows, the shards
    split columns)."""
    for tp in (2, 4):
        plain = resolve("llama", device="cpu", config="tiny", tp=tp)
        fold = resolve("llama", device="cpu", config="tiny", tp=tp, options={"fuse_norm_rope": True})
        inputs = plain.program.inputs(plain.settings, plain.program.shape(20), "cpu", seed=tp)
        for rank in range(tp):
            got = fold.program.shard(fold.settings, fold_gains(inputs), rank)
            want = fold_gains(plain.program.shard(plain.settings, inputs, rank))
            assert got.keys() == want.keys()
            assert all(torch.equal(got[k], want[k]) for k in got), rank
