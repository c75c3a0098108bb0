"""Quantized weights on the GPU (skipped without CUDA): the decode step with its layers' weights
stored in a block format (random blocks, or pto's quantizers where they apply) or fp8, read as
they are stored by the GEMVs (integer dots for the integer formats, half dots for fp8:
``PTO_QGEMV=auto``; the whole-K quantized tiles of models of hidden 2048 and more at one sequence), on each
executor. Its logits must be no further from a float64 run of the reference model on the same
weights dequantized than torch's bf16 run of it is (within 5%, tests/gpu/test_decode_gpu.py's
bound: two bf16 pipelines round at different points; torch's also rounds the dequantized weights
to bf16, the kernels keep them in f32), and its token is the float64 run's where the top two
logits are apart beyond bf16's rounding."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_decode_gpu import check_step

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("executor,quantize", [("waves", "q8_0"), ("persistent", "q8_0"), ("waves", "q4_1"),
                                               ("persistent", "q4_1"), ("waves", "fp8"), ("waves", "q5_0"),
                                               ("persistent", "q5_1")])
def test_smollm2_step_with_quantized_weights(executor, quantize):
    """SmolLM2's shape (hidden 576: blocks of 32), batch 1."""
    check_step(executor, 1, 768, options={"quantize": quantize})


@pytest.mark.parametrize("executor,quantize,batch", [("waves", "q4_k", 1), ("persistent", "q4_k", 1),
                                                     ("waves", "q6_k", 1), ("waves", "q4_k", 2), ("waves", "q5_k", 1)])
def test_k_quants_in_the_1b_shape(executor, quantize, batch):
    """The Llama-3.2-1B shape (hidden 2048: whole 256-element blocks; its one-sequence step takes
    the quantized tiles, two sequences the GEMVs' own), its tied head dense."""
    check_step(executor, batch, 512, config="llama3.2-1b", options={"quantize": quantize})


def test_auto_calls_leave_the_branches_uninlined_where_the_inlined_kernel_spills(monkeypatch):
    """``PTO_MK_CALLS=auto`` on the 1B shape's Q4_K step (its inlined megakernel spills on an
    H200: 28 registers, 2026-12-05): each kernel spills no more than the inlined one, a kernel
    that spilled inlined and spills less is the ``noinline`` one, one that did not spill stays
    inlined (as many programs a multiprocessor as each allows); the step is float64's as
    :func:`check_step` bounds it."""
    infos = {}
    monkeypatch.setenv("PTO_PER_SM", "0")  # (as many programs as each compiles for: no rebuild for room)

    def kernels(runner, inputs, out):
        infos[calls] = [(k.calls, k.compiled_info["spills"]) for k in runner.executor.kernels]

    for calls in ("inline", "auto"):
        monkeypatch.setenv("PTO_MK_CALLS", calls)
        check_step("persistent", 1, 512, kernels, config="llama3.2-1b", options={"quantize": "q4_k"})
    assert any(spills for _, spills in infos["inline"]), infos  # (what the rule is for)
    for (_, inlined), (form, spills) in zip(infos["inline"], infos["auto"]):
        assert spills <= inlined, infos
        assert form == ("noinline" if spills < inlined else "inline"), infos


@pytest.mark.parametrize("quantize", ["q4_0", "q4_k", "q5_k"])
def test_the_4bit_gate_up_loops_over_its_blocks_in_the_1b_shape(quantize, monkeypatch):
    """The 1B shape's one-sequence step with 4-bit (and Q5_K) layers on the wave executor: its gate/up GEMV
    runs in the persistent "blocks" form (``PTO_PERSISTENT``'s default "auto":
    ``BLOCKS_AUTO_FORMATS``, 2,048 blocks on 4 programs a multiprocessor), the other GEMVs in
    the plain grid, and the step is float64's as :func:`check_step` bounds it."""

    def blocks_kernels(runner, inputs, out):
        kernels = runner.executor.backend._kernels.values()
        looped = {k.fn.name for k in kernels if k.persistent == "blocks"}
        assert looped == {"gemv_norm_swiglu_tile"}, looped

    monkeypatch.delenv("PTO_PERSISTENT", raising=False)
    check_step("waves", 1, 512, blocks_kernels, config="llama3.2-1b", options={"quantize": quantize})


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_the_prefill_as_stored_is_the_dequantizing_one_on_the_gpu(qtype, monkeypatch):
    """The prefill of a prompt with the layers' q8_0 (SmolLM2's shape) or q4_k (the 1B shape's
    whole blocks) matrices read as stored (``native``, what ``auto`` takes for q8_0 on a GPU) and
    dequantized first: the same bf16 values multiplied (both round the dequantized weights to
    bf16), in other orders of f32 sums and other GEMM tiles, so the caches agree to a few bf16
    roundings (rel 1e-2; a wrong block or row would be of the caches' own size)."""
    from dataclasses import replace

    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model import quantized
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import random_quantized_weights

    from pto.engine import rel_err
    from pto.ir.dtypes import DType

    cfg = CONFIGS["smollm2-135m" if qtype == "q8_0" else "llama3.2-1b"]
    cfg = replace(cfg, layers=3)
    # SmolLM2's dense layers (7.1 MB in bf16) two a span, then one; the 1B's (122 MB) one a span
    monkeypatch.setattr(quantized, "DEQUANT_BUDGET", 15 << 20)
    g = torch.Generator().manual_seed(41)
    w = random_quantized_weights(random_weights(cfg, torch.bfloat16, g), qtype, g)
    prompt = torch.randint(0, cfg.vocab, (77,), generator=g).tolist()
    caches = {}
    for mode in ("dequantize", "native"):
        gen = Generator(w, "cuda", DType.BF16, quant_prefill=mode)
        try:
            step = gen.step(1, 128)
            gen.prefill(step, [prompt], 128)
            caches[mode] = {k: step.tensors[k].float().clone() for k in ("k_cache", "v_cache")}
        finally:
            gen.close()
    for k, ref in caches["dequantize"].items():
        assert float(ref.abs().sum()) > 0, k
        assert rel_err(caches["native"][k], ref) <= 1e-2, k


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("xbits", [8, 16])
def test_integer_dots_on_the_gpu(qtype, xbits):
    """``PTO_QGEMV=int8``/``int16`` compiled (PTX's ``dp4a``/``dp2a``, ``prmt``): the residual GEMV
    of tests/codegen/test_triton_int_dots.py (a group of zeros, one of exact ties) within the
    bound of x's rounding of the unrounded product, and float64's of the rounded arithmetic but
    where the GPU's division and fused multiply-add land a few ulps from the reference's next
    to a tie (a step of that x times its weight's magnitude)."""
    from pto.ir.dtypes import dtype_of
    from tests.codegen.test_triton_int_dots import int_gemv, int_reference

    dtype = dtype_of(qtype)
    y, source, x, w, r = int_gemv(dtype, 1024, 512, "cuda", f"int{xbits}")
    assert ("dp4a.s32.s32" if xbits == 8 else "dp2a.lo.s32.s32") in source and "prmt.b32" in source
    ref, bound, ties = int_reference(dtype, w, x, 3, 36, xbits)
    dense = w.dequantize()[3:39].double()
    scale = float((x.abs().double() @ dense.abs().T).max())
    got, want = y.double(), ref + r.double()
    assert bool(((got - want).abs() <= 1e-5 * want.abs() + 2e-6 * scale + ties).all()), float((got - want).abs().max())
    exact = x.double() @ dense.T + r.double()
    assert bool(((got - exact).abs() <= bound * 1.001 + 2e-6 * scale).all())


@pytest.mark.parametrize("mode", ["auto", "int8"])
def test_half_dots_on_the_gpu(mode):
    """fp8's half dots compiled (PTX's ``cvt.rn.f16x2.e4m3x2``, ``fma.rn.f16x2``): the residual
    GEMV of tests/codegen/test_triton_half_dots.py is float64's rounding of the same f16 chains
    (x's power-of-two scaling is exact and each instruction rounds once, so only the f32 sums'
    order differs) and within the roundings' bound of the unrounded product."""
    from tests.codegen.test_triton_half_dots import FP8, half_reference
    from tests.codegen.test_triton_int_dots import int_gemv

    y, source, x, w, r = int_gemv(FP8, 1024, 512, "cuda", mode)
    assert "cvt.rn.f16x2.e4m3x2" in source and "fma.rn.f16x2" in source
    ref, bound = half_reference(w, x, 3, 36)
    dense = w.dequantize()[3:39].double()
    scale = float((x.abs().double() @ dense.abs().T).max())
    torch.testing.assert_close(y.double(), ref + r.double(), rtol=1e-5, atol=2e-6 * scale)
    exact = x.double() @ dense.T + r.double()
    assert bool(((y.double() - exact).abs() <= bound + 2e-6 * scale).all())
