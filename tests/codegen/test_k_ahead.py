"""A wave kernel's quantized GEMV K loop with its next step loaded ahead (``RenderOptions.k_ahead``,
``PTO_K_AHEAD=on``): the rendered loop (the next step's weights and x taken before the step's
product, the first step's weights before the PDL wait), and the plain loop's bits under the
interpreter, a GEMV alone (every format's path, a masked last step) and a decode step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dataclasses import replace  # noqa: E402

from pto.incore.gemv import gemv_residual_tile  # noqa: E402

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import BuildError, UsageError  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType, f32  # noqa: E402
from tests.codegen.tritonkit import temp_cache_dir  # noqa: E402,F401 (applies itself)


def _residual(fn, tensors: dict, cols: int, options: RenderOptions) -> tuple[torch.Tensor, str]:
    """``y`` (bound to ``r``'s tensor, in place as the step's residual) after one task of ``fn``
    with every memref's region its whole tensor (``w`` of ``cols`` logical columns), and the
    kernel's source."""
    ts = {m: t.clone() for m, t in tensors.items()}
    ts["y"] = ts["r"]
    z = torch.zeros(1, dtype=torch.int64)
    mems = {m: RegionBatch(t, z, z, z + t.shape[0], z + (cols if m in ("x", "w") else t.shape[1]))
            for m, t in ts.items()}
    backend = TritonBackend("cpu", options=options)
    backend.prepare(TaskBatch(fn, mems, {}, 1))()
    return ts["y"], backend.kernel(fn, backend.render_options(fn, backend.launch_config(fn, 1))).source


@pytest.mark.parametrize("mode", ["on", "first"])
@pytest.mark.parametrize("qgemv", ["units", "groups", "int16"])
@pytest.mark.parametrize("dtype,K", [(DType.Q4_K, 768), (DType.Q8_0, 704), (DType.Q4_1, 768), (DType.FP8, 704)],
                         ids=str)
def test_a_quantized_gemvs_k_steps_loaded_ahead_give_the_plain_loops_bits(dtype, K, qgemv, mode):
    """The residual GEMV of 3 K steps of 256 (Q8_0's and fp8's last step masked: 704 columns)
    with its next step's weights and x loaded ahead ("on"), or its first step peeled off the
    loop ("first"): the plain loop's bits on every way the
    product reads the weights, and ``r + x w^T`` on the dequantized weights (f32 sums of 704-768
    products by units and groups, a few ulps of the largest; x rounded to 16 bits a group of 32
    for the integer dots: 1/65534 of a group's largest |x| times the weights'; fp8's half dots
    there: x and each pair's products in f16, a group's 16 fused adds each rounded to 2^-11 of
    its magnitude)."""
    from tests.quant.test_load import random_qtensor

    N = 16
    fn = specialize(gemv_residual_tile(f32, 1, K, N, 8, 256, wdtype=dtype))
    g = torch.Generator().manual_seed(7)
    w, x, r = random_qtensor(dtype, N, K, seed=5), torch.randn(1, K, generator=g), torch.randn(1, N, generator=g)
    tensors = {"x": x, "w": w.data, "r": r}
    plain, src_plain = _residual(fn, tensors, K, RenderOptions(qgemv=qgemv, k_ahead="off"))
    ahead, src = _residual(fn, tensors, K, RenderOptions(qgemv=qgemv, k_ahead=mode))
    assert torch.equal(plain, ahead)
    dense = w.dequantize().double()
    want, scale = r.double() + x.double() @ dense.T, float((x.abs().double() @ dense.abs().T).max())
    tol = (16 * 2.0 ** -11 if dtype is DType.FP8 else 2e-5) * scale if qgemv == "int16" else 1e-6 * scale
    assert float((ahead.double() - want).abs().max()) <= tol
    assert "__k0" not in src_plain and "for i_kk in range(0, " in src_plain
    if mode == "first":  # (the first step's loads and product before a loop from the second step)
        loop = src.index("for i_kk in range(256, ")
        assert "__k0" not in src and src.index("t_b") < loop and src.index("t_acc = t_acc +") < loop
        return
    loop = src.index("for i_kk in tl.range(0, ")
    assert "t_b__k0" in src[:loop] and "t_a__k0" in src[:loop] and "num_stages=1):" in src[loop:loop + 80]
    body = src[loop:]
    assert body.index("t_a = t_a__k0") < body.index("t_a__k0 = tl.load(")  # (this step's, then the next)


def test_the_first_steps_weights_load_before_the_pdl_wait_and_x_after():
    """With PDL and the weights a ``pre`` memref (the 8B's Q4_K down projection as a GPU step
    renders it: integer dots, 7 steps of 2,048): the first step's weight planes load in the device
    function before its wait (the kernel's ``early``; the kernel itself does not wait first), x's
    first step after it; each step takes its planes before loading the next step's, past the last
    step its own again. Without the option the kernel waits first, and a GEMV of dense weights
    loads nothing ahead (Triton pipelines its loop)."""
    opts = RenderOptions(qgemv="auto", asm=True, pdl="late", pre=("w",), k_ahead="on")
    fn = specialize(gemv_residual_tile(DType.BF16, 1, 14336, 4096, 8, 2048, wdtype=DType.Q4_K))
    k = render(fn, opts)
    dev = k.source[k.source.index("def d_"):k.source.index(f"def {k.name}(")]
    wait, loop = dev.index("_gdc_wait()"), dev.index("for i_kk in tl.range(0, 14336, 2048, num_stages=1):")
    assert k.early == frozenset({"w"}) and "_gdc_wait()" not in k.source[k.source.index(f"def {k.name}("):]
    assert dev.index("t_b__k0__q, ") < wait < dev.index("t_a__k0 = tl.load(") < loop
    body = dev[loop:]
    assert body.index("t_b__q = t_b__k0__q") < body.index("t_b__k0__q, ") < body.index("_pto_dqx16_dot_q4_k(")
    assert "tl.where(_more" in body and ", i_kk + 2048, i_kk)" in body
    off = render(fn, RenderOptions(qgemv="auto", asm=True, pdl="late", pre=("w",)))
    assert off.early == frozenset() and "__k0" not in off.source
    assert off.schedule_digest == k.schedule_digest  # (the same arithmetic: the same schedules)
    # "first": the first step's weights before the wait, x and its product after, the loop from
    # the second step, nothing carried
    first = render(fn, replace(opts, k_ahead="first"))
    dev = first.source[first.source.index("def d_"):first.source.index(f"def {first.name}(")]
    wait, loop = dev.index("_gdc_wait()"), dev.index("for i_kk in range(2048, 14336, 2048):")
    assert first.early == frozenset({"w"}) and first.schedule_digest == off.schedule_digest
    assert dev.index("t_b__q, ") < wait < dev.index("t_a = tl.load(") < dev.index("_pto_dqx16_dot_q4_k(") < loop
    assert "__k0" not in dev
    dense = specialize(gemv_residual_tile(DType.BF16, 1, 14336, 4096, 8, 2048))
    assert render(dense, opts).source == render(dense, RenderOptions(pdl="late", pre=("w",))).source
    with pytest.raises(BuildError, match=r"^RenderOptions.k_ahead='yes': one of '', 'off', 'auto', 'on', 'first'$"):
        render(fn, replace(opts, k_ahead="yes"))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # (SwiGLU's exp of large random sums)
@pytest.mark.parametrize("mode", ["on", "first"])
@pytest.mark.parametrize("quantize", ["q8_0", "q4_1"])
def test_a_decode_steps_k_loops_loaded_ahead_give_the_same_bits(monkeypatch, tmp_path, quantize, mode):
    """The tiny model's quantized step through the wave executor under the interpreter, its down
    projection's 160 columns in three K steps of 64 (the last masked) loaded a step ahead with
    ``PTO_K_AHEAD=on`` (or its first step peeled, ``first``): the same logits and tokens as
    without; a value that is no mode is one line naming it."""

    from pto.orchestration.model import program as mp
    from safetensors.torch import load_file

    from pto.backends.triton.loader import cache_dir
    from pto.cli.commands.run import run

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, bn=16, bk=64, qkv_bk=64, ffn_bk=64))
    outs = []
    for each in ("off", mode):
        monkeypatch.setenv("PTO_K_AHEAD", each)
        path = tmp_path / f"{each}.safetensors"
        res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="waves",
                  check=True, quantize=quantize, save=str(path))
        assert res["rel_err"] <= 1e-5, res
        outs.append(load_file(path))
    assert outs[0].keys() == outs[1].keys() and {"logits", "tok"} <= outs[0].keys()
    for name in outs[0]:
        assert torch.equal(outs[0][name], outs[1][name]), name
    # (the down projection's kernel took its next steps ahead, or its loop starts at its second step)
    sources = [p.read_text() for p in cache_dir().rglob("*.py")]
    want = "tl.range(0, 160, 64, num_stages=1)" if mode == "on" else "for i_kk in range(64, 160, 64)"
    assert any(want in src and "gemv_residual_tile" in src for src in sources)
    monkeypatch.setenv("PTO_K_AHEAD", "yes")
    with pytest.raises(UsageError, match="PTO_K_AHEAD='yes': one of auto, off, on, first$"):
        run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor="waves")


def test_auto_loads_ahead_where_a_tasks_programs_fit_one_round(monkeypatch):
    """``PTO_K_AHEAD`` unset is "auto": the 1B's Q4_K down projection (256 programs of 4 warps,
    under three a multiprocessor of an H100's or H200's 132 at K_AHEAD_REGS) loads its steps
    ahead; the 8B's (512) does not, its 7 steps peeled of the first instead, nor the 1B's at 8
    warps (one program a multiprocessor: its 4 steps stay as they are)."""
    from pto.backends.triton.modes import K_AHEAD_REGS, K_FIRST_TRIPS

    monkeypatch.delenv("PTO_K_AHEAD", raising=False)
    backend = TritonBackend("cpu")
    assert backend.options.k_ahead == "auto" and 65536 // (K_AHEAD_REGS * 32 * 4) * 132 == 396
    eight = specialize(gemv_residual_tile(DType.BF16, 1, 14336, 4096, 8, 2048, wdtype=DType.Q4_K))
    one = specialize(gemv_residual_tile(DType.BF16, 1, 8192, 2048, 8, 2048, wdtype=DType.Q4_K))
    assert K_FIRST_TRIPS == 7
    assert backend.k_ahead_of(eight, 4) == "first" and backend.k_ahead_of(one, 4) == "on"
    assert backend.k_ahead_of(one, 8) == "off"
    assert backend.launch_config(one, 1).num_warps == 4
    for fn, mode in ((eight, "first"), (one, "on")):
        opts = backend.render_options(fn, backend.launch_config(fn, 1))
        assert opts.k_ahead == mode
        src = backend.kernel(fn, opts).source
        assert ("t_b__k0" in src) == (mode == "on") and ("range(2048, 14336, 2048)" in src) == (mode == "first")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # (SwiGLU's exp of large random sums)
@pytest.mark.parametrize("mode", ["on", "first"])
@pytest.mark.parametrize("swiglu", [False, True], ids=["norm", "swiglu"])
def test_the_normalizing_gemvs_k_steps_loaded_ahead_give_the_plain_loops_bits(swiglu, mode):
    """The norm GEMV (q/k/v's) and the norm, gate/up and SwiGLU GEMV in 3 K steps of 256 of Q8_0
    weights, whose norm's loop and gain load before the product's loop: with the product's loop's
    steps ahead or its first step peeled, the plain loops' bits (two tasks)."""
    from pto.incore.gemv import gemv_norm_swiglu_tile, gemv_norm_tile

    from tests.quant.test_load import random_qtensor

    K, N, n = 768, 16, 2
    make = gemv_norm_swiglu_tile if swiglu else gemv_norm_tile
    fn = specialize(make(f32, 1, K, N, 8, 256, 1e-5, wdtype=DType.Q8_0))
    g = torch.Generator().manual_seed(11)
    weights = {w: random_qtensor(DType.Q8_0, N, K, seed=k).data
               for k, w in enumerate(("wg", "wu") if swiglu else ("w",))}
    x, gain = torch.randn(n, K, generator=g), 1 + 0.1 * torch.randn(1, K, generator=g)
    outs, sources = [], []
    for k_ahead in ("off", mode):
        y = torch.full((n, N), float("nan"))
        rows, z, one = torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)
        mems = {"x": RegionBatch(x, rows, z, one, one * K), "g": RegionBatch(gain, z, z, one, one * K),
                "y": RegionBatch(y, rows, z, one, one * N),
                **{w: RegionBatch(t, z, z, one * N, one * K) for w, t in weights.items()}}
        backend = TritonBackend("cpu", options=RenderOptions(k_ahead=k_ahead))
        backend.prepare(TaskBatch(fn, mems, {}, n))()
        outs.append(y)
        sources.append(backend.kernel(fn, backend.render_options(fn, backend.launch_config(fn, n))).source)
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    assert sources[0] != sources[1] and ("__k0" in sources[1]) == (mode == "on")
