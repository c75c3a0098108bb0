"""The prefill on quantized weights as stored (``Generator(quant_prefill="native")``,
``PTO_QUANT_PREFILL=native``: the layer program's projections are the ``matmul_nk_*`` functions,
``LayerForm.wtypes``) against the default prefill, which dequantizes each layer's matrices first:
the same cache contents and the same first step's logits on the same quantized weights. And the
refusals: the option's values, the folded and tensor-parallel layer forms, a row that is not
whole blocks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from pto.orchestration.llama.config import LlamaConfig
from pto.orchestration.llama.program import layer_module
from pto.orchestration.llama.tiling import LayerForm

from pto.engine import rel_err
from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.ir.nodes import IncoreFunction
from pto.machine.target import resolve

#: a one-layer model of hidden 256, whose rows are whole blocks of a k-quant's 256 elements
TINY_256 = LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=512, kv_heads=2)


def prefill(weights, mode: str, prompt: list[int], backend: str, native: tuple[str, ...] | None = None
            ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The caches after the prefill of ``prompt`` with ``quant_prefill=mode`` on ``backend``,
    and the first step's logits; ``native``: the matrices the layer must take as stored (None:
    every one with "native", none otherwise)."""
    from pto.orchestration.llm.generate import Generator

    gen = Generator(weights, "cpu", DType.F32, backend=backend, quant_prefill=mode)
    try:
        cap = 64
        step = gen.step(1, cap)
        gen.prefill(step, [prompt], cap)
        nk = [f.name for f in gen._layer(len(prompt) - 1).module.functions if f.name.startswith("matmul_nk_")]
        assert bool(nk) == (mode == "native" or bool(native)), nk  # (the layer that ran is the one asked for)
        if native is not None:
            assert sorted(m for m, _ in gen.native) == sorted(native)
        # the dequantizer's dense copies (pto generate's prefill_dense_bytes): every layer of the
        # tiny models in one span, in f32, of the matrices not taken as stored
        taken = set(native or ()) | ({"wq", "wk", "wv", "wo", "wg", "wu", "wd"} if mode == "native" else set())
        dense = sum(v.rows * v.cols for k, v in weights.layers[0].items() if hasattr(v, "rows") and k not in taken)
        assert gen.prefill_buffer_bytes == dense * 4 * len(weights.layers)
        caches = {k: step.tensors[k].clone() for k in ("k_cache", "v_cache")}
        step()
        return caches, step.tensors["logits"].clone()
    finally:
        gen.close()


@pytest.mark.parametrize("qtype,config,backend", [
    # (the evaluator: no kernels to compile; still 8 s with a cold cache, the orchestration's C)
    pytest.param("q8_0", "tiny", "torch", marks=pytest.mark.slow),
    pytest.param("q8_0", "tiny", "c", marks=pytest.mark.slow),
    pytest.param("q4_0", "tiny", "c", marks=pytest.mark.slow),
    pytest.param("q4_k", "tiny-256", "c", marks=pytest.mark.slow),
])
def test_the_native_prefill_is_the_dequantizing_one(qtype, config, backend):
    """Both prefills multiply the same values (the nk GEMMs' loads dequantize the blocks into f32
    tiles, the dequantizer the whole matrices into f32), so they differ only in the order of the
    f32 sums (a product of ``[N, K]`` tiles against one of ``[K, N]`` tiles, and a K step of whole
    blocks): about K * 2^-24 relative per product, 1e-6 over two layers; the bound is 1e-5, as the
    step's against the reference on the dequantized values (test_quantized.py)."""
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import random_quantized_weights

    cfg = CONFIGS["tiny"]
    if config == "tiny-256":
        cfg = replace(cfg, layer=TINY_256, layers=1)
    g = torch.Generator().manual_seed(7)
    w = random_quantized_weights(random_weights(cfg, torch.float32, g), qtype, g)
    prompt = torch.randint(0, cfg.vocab, (21,), generator=g).tolist()  # 20 positions: a short last row tile
    dq_caches, dq_logits = prefill(w, "dequantize", prompt, backend)
    nat_caches, nat_logits = prefill(w, "native", prompt, backend)
    for name, ref in dq_caches.items():
        written = ref.abs().sum(dim=1) > 0
        assert int(written.sum()) == cfg.layers * 20, name  # the prompt's positions, every layer
        assert rel_err(nat_caches[name], ref) <= 1e-5, name
    assert rel_err(nat_logits, dq_logits) <= 1e-5


def test_the_native_layer_calls_the_nk_functions():
    """The layer of quantized weights declares them output-major in their type and projects
    with one ``matmul_nk_*`` function per role and type; a dense matrix keeps ``[in, out]``."""
    q8, q4 = dtype_of("q8_0"), dtype_of("q4_0")
    form = LayerForm(kv_out=True, wtypes=(("wq", q8), ("wk", q8), ("wv", q8), ("wd", q4)))
    m = layer_module(TINY_256, DType.F32, resolve(None, "cpu"), form, fused=False)
    names = {f.name for f in m.functions if isinstance(f, IncoreFunction)}
    assert {"matmul_nk_q8_0_tile", "matmul_nk_residual_q4_0_tile", "matmul_residual_tile",
            "matmul_swiglu_tile"} <= names
    tensors = {t.name: t for t in m.entry_function.tensors}
    assert tensors["wq"].dtype == q8 and tensors["wd"].dtype == q4 and tensors["wo"].dtype == DType.F32


@pytest.mark.parametrize("form,words", [
    (LayerForm(fuse=True), "not with the norms folded into the projections (--fuse-norm-rope)"),
    (LayerForm(tp=2), "run on one rank, not with --tp 2"),
    (LayerForm(wtypes=(("wg", dtype_of("q8_0")),)), "need wg and wu in one type"),
])
def test_quantized_weights_in_a_form_without_them_is_one_line(form, words):
    form = replace(form, wtypes=form.wtypes or (("wq", dtype_of("q8_0")),))
    with pytest.raises(UsageError, match=r"quantized layer weights \(w[qg] q8_0\)") as e:
        layer_module(TINY_256, DType.F32, resolve(None, "cpu"), form, fused=False)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_row_not_whole_blocks_is_one_line():
    """q4_k's blocks are 256 elements; the down projection's rows are ffn = 160 inputs."""
    cfg = LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=160, kv_heads=2)
    with pytest.raises(UsageError, match=r"wd's rows of 160 inputs are not whole blocks of q4_k \(256\)"):
        layer_module(cfg, DType.F32, resolve(None, "cpu"), LayerForm(wtypes=(("wd", dtype_of("q4_k")),)))


def test_the_option_takes_its_three_values(monkeypatch):
    from pto.orchestration.llm.generate import quant_prefill_mode

    monkeypatch.delenv("PTO_QUANT_PREFILL", raising=False)
    assert quant_prefill_mode(None) == "auto"
    monkeypatch.setenv("PTO_QUANT_PREFILL", "native")
    assert quant_prefill_mode(None) == "native"
    assert quant_prefill_mode("dequantize") == "dequantize"
    monkeypatch.setenv("PTO_QUANT_PREFILL", "nativ")
    with pytest.raises(UsageError, match=r"PTO_QUANT_PREFILL='nativ': expected auto, dequantize, native"):
        quant_prefill_mode(None)
    with pytest.raises(UsageError, match=r"quant_prefill='fast': expected auto, dequantize, native"):
        quant_prefill_mode("fast")


def test_auto_takes_as_stored_the_types_measured_faster_so():
    """``auto``: q8_0 as stored on a GPU and a CPU, q4_1 on a CPU, the rest (q4_k, q4_0 here)
    dequantized first; ``native`` every quantized layer kind, ``dequantize`` none; the embedding
    and the LM head are never the prefill's."""
    from pto.orchestration.llm.generate import prefill_kinds
    from pto.orchestration.model.quantized import WeightTypes

    q = dtype_of
    w = WeightTypes((("w_qkv", q("q8_0")), ("wo", q("q4_1")), ("wg", q("q4_k")), ("wu", q("q4_k")),
                     ("wd", q("q4_0")), ("lm_head", q("q8_0"))))
    layers = ["w_qkv", "wd", "wg", "wo", "wu"]
    for mode, dev, stored in (("auto", "cuda", ["w_qkv"]), ("auto", "cpu", ["w_qkv", "wo"]), ("auto", "mps", []),
                              ("native", "cuda", layers), ("native", "cpu", layers), ("dequantize", "cpu", [])):
        kept, rest = (sorted(dict(x.types)) for x in prefill_kinds(w, mode, dev))
        assert kept == stored and rest == sorted(set(layers) - set(stored)), (mode, dev)


@pytest.mark.slow
def test_a_prefill_of_kinds_as_stored_and_kinds_dequantized_is_the_dequantizing_one():
    """``auto`` on the CPU with q, k, v in q8_0 (taken as stored) and the other matrices in q4_0
    (dequantized first): the caches and first logits of the all-dequantizing prefill (the bound
    of the test above)."""
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import random_quantized_weights

    cfg = CONFIGS["tiny"]
    g = torch.Generator().manual_seed(9)
    dense = random_weights(cfg, torch.float32, g)
    q8, q4 = (random_quantized_weights(dense, t, g) for t in ("q8_0", "q4_0"))
    qkv = ("wq", "wk", "wv")
    mixed = replace(q4, layers=[{k: (a[k] if k in qkv else b[k]) for k in b} for a, b in zip(q8.layers, q4.layers)])
    prompt = torch.randint(0, cfg.vocab, (21,), generator=g).tolist()
    dq_caches, dq_logits = prefill(mixed, "dequantize", prompt, "c")
    auto_caches, auto_logits = prefill(mixed, "auto", prompt, "c", native=("wq", "wk", "wv"))
    for name, ref in dq_caches.items():
        assert rel_err(auto_caches[name], ref) <= 1e-5, name
    assert rel_err(auto_logits, dq_logits) <= 1e-5
