"""``--fuse-norm-rope``: the norms' gains folded into the weights after them (once, when the inputs
are made), the row scale in the projections' epilogue, RoPE in the q/k projections' epilogue over
one or more heads a program. The folded layer against the unfused one on the same weights, each
against a float64 run; the q/k projection's heads per program against each other and a float64
formula; the folded inputs' names and their errors."""

from __future__ import annotations

import math

import pytest
import torch
from pto.incore.fused import matmul_norm_rope_tile, matmul_norm_tile
from pto.orchestration.llama.reference import reference_layer
from pto.orchestration.llama.tiling import rope_heads
from pto.orchestration.llama.weights import FOLDED, fold_gains, folded, unfold_gains

from pto.engine import Runner, rel_err, resolve
from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType


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
    assert set(out) == {"x", "wo", *map(folded, FOLDED)}
    for w, gain in FOLDED.items():
        want = (inputs[gain].double().reshape(-1, 1) * inputs[w].double()).to(torch.bfloat16)
        assert out[folded(w)].dtype == torch.bfloat16 and torch.equal(out[folded(w)], want)
    back = unfold_gains(out)
    assert set(back) == set(inputs) and torch.equal(back["g_attn"], torch.ones(1, H, dtype=torch.bfloat16))


def _rope_ref(x, w, cos, sin, heads, D, eps):
    """float64: rope(rmsnorm(x; 1) @ w), rotate-half, the projection rounded to ``x``'s dtype first."""
    xd = x.double()
    p = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)) @ w.double()
    p = p.to(x.dtype).double().view(x.shape[0], heads, D)
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    a1, a2 = p[..., : D // 2], p[..., D // 2:]
    return torch.cat([a1 * c - a2 * s, a2 * c + a1 * s], dim=-1).reshape(x.shape[0], heads * D)


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
    outs = []
    for hp in (1, 2, 4):
        fn = specialize(matmul_norm_rope_tile(dtype, R, K, heads, D, bk, eps, heads_per_program=hp, gain=False))
        assert [m.name for m in fn.memrefs] == ["x", "w", "cos", "sin", "y"]  # no gain: it is in w
        y = torch.full((R, heads * D), float("nan"), dtype=dtype.torch)
        regions = {"x": (x, 0, 0, R, K), "w": (w, 0, 0, K, heads * D), "cos": (cos, 0, 0, R, D // 2),
                   "sin": (sin, 0, 0, R, D // 2), "y": (y, 0, 0, R, heads * D)}
        run_incore(fn, regions)
        outs.append(y)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    tol = 2e-6 if dtype == DType.F32 else 1.6e-2  # one rounding of the stored result (tests/opkit.py)
    assert rel_err(outs[0], _rope_ref(x, w, cos, sin, heads, D, eps)) <= tol


def test_the_projection_without_gain_loads_the_tile_it_multiplies():
    """``gain=False``: no ``g`` memref, and the matmul's left operand is the loaded x tile itself
    (no multiply, no cast between the load and the product)."""
    fn = matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, 1e-6, gain=False)
    assert "g" not in [m.name for m in fn.memrefs]
    assert "g" in [m.name for m in matmul_norm_tile(DType.BF16, 128, 512, 512, 256, 64, 1e-6).memrefs]
    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import Op

    ins = list(walk_instrs(fn.body))
    (mm,) = [i for i in ins if i.op in (Op.MATMUL_ACC,)]
    loaded = {i.dst for i in ins if i.op is Op.LOAD}
    assert mm.srcs[0] in loaded


def test_heads_per_program():
    assert rope_heads(32, 128, 256) == 2  # LLaMA-7B: a 256-column block holds two heads
    assert rope_heads(8, 128, 256) == 2
    assert rope_heads(12, 48, 256) == 4  # five heads fit, twelve are not a multiple of five
    assert rope_heads(9, 64, 256) == 3
    assert rope_heads(4, 64, 64) == 1
    assert rope_heads(4, 128, 64) == 1
    with pytest.raises(ValueError, match="6 heads are not a multiple of 4 heads per program"):
        matmul_norm_rope_tile(DType.F32, 8, 64, 6, 16, 16, 1e-5, heads_per_program=4)
