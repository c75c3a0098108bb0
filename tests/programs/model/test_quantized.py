"""Quantized weights in the decode step and in generation: a step whose weights are stored
quantized (random ones, every format; the real checkpoint's Q4_1 layers and Q8_0 embedding)
against the reference model on the same weights dequantized, generation with quantized weights
against generation with their dense values and against transformers, the loader's choice of what
stays quantized, and the bytes the estimate and the report count. The formats themselves are
checked against the ``gguf`` package in tests/quant."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pto.cli.commands.run import run
from pto.engine import rel_err
from tests.programs.model.conftest import greedy_prompts, transformers_greedy


@pytest.mark.parametrize("quantize,batch", [("q8_0", 1), ("q4_0", 2), ("q4_1", 1), ("q5_0", 1), ("q5_1", 2),
                                            ("fp8", 3)])
def test_a_quantized_step_is_the_reference_on_its_values(quantize, batch):
    """f32: the step's GEMVs dequantize the blocks they load into f32 tiles, so the logits are
    the reference's on the dequantized weights but for the order of the sums (about 1e-6)."""
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", check=True, seed=batch, quantize=quantize)
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.parametrize("quantize", ["q4_k", pytest.param("q5_k", marks=pytest.mark.slow),
                                      pytest.param("q6_k", marks=pytest.mark.slow)])
def test_k_quants_in_a_step_of_256_wide_rows(quantize):
    """q4_k, q5_k and q6_k need rows of whole 256-element blocks: a one-layer model of hidden
    256 (random blocks), the embedding and LM head tied and dense."""
    from pto.orchestration.llama.config import LlamaConfig
    from pto.orchestration.model import program as mp

    mp.CONFIGS["tiny-256"] = replace(mp.CONFIGS["tiny"], layer=LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=512,
                                                                          kv_heads=2), layers=1)
    try:
        res = run("model", config="tiny-256", cache=64, batch=1, device="cpu", check=True, quantize=quantize)
        assert res["rel_err"] <= 1e-5, res
    finally:
        del mp.CONFIGS["tiny-256"]


def test_generation_with_quantized_weights_is_generation_with_their_values():
    """The Generator with q4_0 weights (its prefill dequantizes a layer at a time from the
    step's own tensors) makes the tokens, and the logits, of the Generator with the same values
    dense."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import dense_weights, quantize_weights

    from pto.ir.dtypes import DType

    cfg = CONFIGS["tiny"]
    w = quantize_weights(random_weights(cfg, torch.float32, torch.Generator().manual_seed(3)), "q4_0")
    prompts = [[5, 17, 200, 3]]
    out = []
    for weights in (w, dense_weights(w)):
        gen = Generator(weights, "cpu", DType.F32)
        try:
            got = gen.generate(prompts, 3, stop_ids=())
            out.append((got.tokens, gen.step(1, got.capacity).tensors["logits"].clone()))
        finally:
            gen.close()
    assert out[0][0] == out[1][0]
    assert rel_err(out[0][1], out[1][1]) <= 1e-5


def test_the_loader_keeps_what_runs_and_says_what_it_does_not():
    from pto.orchestration.model.quantized import KeepFileTypes

    def names(m, types):
        return [(f"blk.{i}.{m}.weight", t) for i, t in enumerate(types)]

    qtypes = {"wq": names("attn_q", ["Q4_K"] * 3), "wk": names("attn_k", ["Q4_K"] * 3),
              "wv": names("attn_v", ["Q6_K", "Q4_K", "Q4_K"]), "wo": names("attn_output", ["Q4_K"] * 3),
              "wg": names("ffn_gate", ["IQ4_XS"] * 3), "wu": names("ffn_up", ["IQ4_XS"] * 3),
              "wd": names("ffn_down", ["F16"] * 3), "emb": [("token_embd.weight", "Q8_0")],
              "lm_head": [("output.weight", "Q6_K")]}
    keep = KeepFileTypes()
    kept = keep.choose(qtypes)
    assert kept == {n for n, _ in qtypes["wo"]} | {"token_embd.weight", "output.weight"}
    assert len(keep.notes) == 2
    assert "blk.0.attn_q.weight" in keep.notes[0] and "(9 tensors)" in keep.notes[0]
    assert "Q4_K and Q6_K" in keep.notes[0] + keep.notes[1] and "IQ4_XS has no kernel in pto" in "".join(keep.notes)


def test_estimate_counts_the_quantized_bytes():
    """``pto estimate model --quantize``: Weights (resident) and Read/step against the inputs a
    run makes: the step reads every weight but the embedding, and the cache."""
    from pto.cli.commands.estimate import estimate
    from pto.engine import resolve

    for config, q in (("tiny", "q8_0"), ("tiny-swa", "q4_0")):
        row = estimate("model", [64], config=config, dtype="f32", shape={"batch": 2}, quantize=q)["rows"][0]
        job = resolve("model", device="cpu", config=config, dtype="f32", options={"quantize": q})
        t = job.program.inputs(job.settings, job.program.shape({"cache": 64, "batch": 2}), "cpu")
        nbytes = {k: v.numel() * v.element_size() for k, v in t.items()}
        assert t["wd"].dtype == torch.uint8 and (t["lm_head"].dtype == torch.uint8) == (config == "tiny-swa")
        weights = ("emb", "w_qkv", "g_attn", "wo", "g_ffn", "wg", "wu", "wd", "g_out", "lm_head")
        tied = config == "tiny"  # the embedding is the head: counted once
        assert row["weight_bytes"] == sum(nbytes[k] for k in weights) - (nbytes["lm_head"] if tied else 0)
        assert row["step_read_bytes"] == sum(n for k, n in nbytes.items() if k not in ("emb", "cos", "sin", "tok",
                                                                                     "pos"))


def test_quantized_weights_with_tensor_parallelism_is_one_line():
    from pto.errors import UsageError

    with pytest.raises(UsageError, match="quantized weights run on one rank"):
        run("model", config="tiny", device="cpu", quantize="q8_0", tp=2)
    with pytest.raises(UsageError, match="--quantize q4_k: the model's rows of 64 inputs are not whole blocks of 256"):
        run("model", config="tiny", device="cpu", quantize="q4_k")


@pytest.mark.slow
def test_the_real_files_quantized_step_is_its_dequantized_step(smollm, one_thread):
    """SmolLM2 as the file stores it (Q4_1 layers, the Q8_0 embedding as the tied LM head): one
    step's logits (teacher-forced: the same cache and token) against the dequantized step's and
    the float64 reference's (the same dequantized values: the formats' values are exact in f32).
    Both steps multiply the same f32 values, summed in other orders (on the CPU's tiling the
    quantized GEMVs take each whole contraction a step in the machine's vector lanes, the dense
    ones steps of 192; the dense head is a matmul of [hidden, vocab]), so each is as far from
    float64 as f32 arithmetic goes: within twice the f32 reference's own distance from it (the
    order of a sum changes its rounding by a factor of order one; measured 0.65x the dense step,
    1.3x the quantized, on an AMD EPYC with AVX2; a wrong scale, minimum or block is 1e-3 off or
    more), the two no farther apart than that, and the same token."""
    from pto.engine import Runner, resolve

    outs, exact = {}, {}
    for q in ("auto", "none"):
        job = resolve("model", device="cpu", dtype="f32", options={"weights": str(smollm), "quantize": q})
        shape = job.program.shape({"cache": 64, "batch": 1})
        inputs = job.program.inputs(job.settings, shape, "cpu", seed=1)  # (the same cache, token, position)
        assert (inputs["wd"].dtype == torch.uint8) == (inputs["emb"].dtype == torch.uint8) == (q == "auto")
        exact[q] = job.program.reference(job.settings, shape, inputs, dtype=torch.float64)["logits"]
        if q == "none":  # (the f32 reference: the scale of f32 rounding)
            f32 = rel_err(job.program.reference(job.settings, shape, inputs)["logits"], exact[q])
        runner = Runner(job, shape)
        try:
            outs[q] = {k: v.clone() for k, v in runner(inputs).items() if k in ("logits", "tok")}
        finally:
            runner.close()
    assert rel_err(exact["auto"], exact["none"]) < 1e-12  # (the same values dequantized)
    from_exact = rel_err(outs["auto"]["logits"], exact["auto"]), rel_err(outs["none"]["logits"], exact["none"])
    assert max(from_exact) <= 2 * f32, (from_exact, f32)
    assert rel_err(outs["auto"]["logits"], outs["none"]["logits"]) <= 2 * f32
    assert torch.equal(outs["auto"]["tok"], outs["none"]["tok"])


@pytest.mark.slow
def test_smollm2_quantized_generates_what_transformers_generates(smollm, hf_model, hf_tokenizer):
    """The file's own types, greedy, 32 new tokens on the prompts of the dequantized test
    (test_decode.py): the same tokens as transformers' generate (which dequantizes the file to
    f32), and so as the dequantized path."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.quantized import KeepFileTypes, WeightTypes

    from pto.ir.dtypes import DType

    prompts = greedy_prompts(load_tokenizer(smollm))
    want = transformers_greedy(hf_model, prompts, 32)
    weights = load_weights(smollm, torch.float32, keep=KeepFileTypes())
    assert WeightTypes.of(weights).to_json() == {"emb": "q8_0", "lm_head": "q8_0", "w_qkv": "q4_1", "wd": "q4_1",
                                                 "wg": "q4_1", "wo": "q4_1", "wu": "q4_1"}
    gen = Generator(weights, "cpu", DType.F32)
    try:
        got = gen.generate(prompts, 32, stop_ids=())
    finally:
        gen.close()
    assert got.tokens == want


@pytest.mark.parametrize("qtype,tied", [("Q8_0", True), ("Q4_0", False), ("Q5_0", False), ("Q5_1", True),
                                        ("TQ2_0", False)])
def test_a_tiny_gguf_runs_as_it_is_stored(tmp_path, qtype, tied):
    """A GGUF file written as llama.cpp's converter writes one: its Q8_0, Q4_0, Q5_0 or Q5_1
    matrices stay quantized (the layers', the embedding, the LM head), TQ2_0 (no kernel in pto;
    blocks of 256, so a model of hidden 256) is dequantized with one note naming the tensors and
    why; the Generator's greedy tokens and last logits are those of the file dequantized at load."""
    pytest.importorskip("transformers")
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.quantized import KeepFileTypes, WeightTypes

    from pto.ir.dtypes import DType
    from tests.programs.model.tiny import tiny_model, write_gguf

    wide = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64} if qtype == "TQ2_0" else {}
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", tiny_model(tied=tied, seed=5, **wide), qtype)
    keep = KeepFileTypes()
    w = load_weights(path, torch.float32, keep=keep)
    types = WeightTypes.of(w).to_json()
    if qtype == "TQ2_0":
        assert types == {} and len(keep.notes) == 6 and all("TQ2_0 has no kernel in pto" in n for n in keep.notes)
        assert "blk.0.attn_q.weight, blk.1.attn_q.weight, blk.0.attn_k.weight and 3 more (6 tensors)" in keep.notes[0]
        return
    assert keep.notes == [] and set(types.values()) == {qtype.lower()} and len(types) == 7
    out = []
    for weights in (w, load_weights(path, torch.float32)):
        gen = Generator(weights, "cpu", DType.F32)
        try:
            got = gen.generate([[1, 7, 42, 99, 3]], 3, stop_ids=())
            out.append((got.tokens, gen.step(1, got.capacity).tensors["logits"].clone()))
        finally:
            gen.close()
    assert out[0][0] == out[1][0]
    assert rel_err(out[0][1], out[1][1]) <= 1e-5


@pytest.mark.sm90
@pytest.mark.slow
def test_the_5bit_steps_kernels_compile_for_sm90(tmp_path):
    """The quantized kernels of steps with 5-bit weights as a GPU runs them (``auto``: integer
    dots, the high bits moved into the 4-bit fields; inline PTX): every one of SmolLM2's in Q5_0
    (layers and head) at one sequence, its residual projection in Q5_1 at four (the few rows'
    dots) and the 8B's in Q5_K at one, through Triton's compiler for an H100, the mask-free path."""
    from dataclasses import fields

    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.codegen.triton.common import RenderOptions
    from pto.ir.dtypes import DType, dtype_of
    from pto.machine.target import get
    from tests.sm90 import compile_sm90, kernel_jobs

    chosen = []
    for name, qtype, batch in (("smollm2-135m", "q5_0", 1), ("smollm2-135m", "q5_1", 4), ("llama3-8b", "q5_k", 1)):
        cfg = CONFIGS[name]
        kinds = ("w_qkv", "wo", "wg", "wu", "wd", "lm_head")
        wt = WeightTypes(tuple(sorted({k: dtype_of(qtype) for k in kinds}.items())))
        t = for_weights(tiling_for(cfg).with_fields(quant_rows=8), wt, batch)
        fns = functions(cfg, DType.BF16, get("cuda_h100"), t, batch, wtypes=wt)
        if qtype != "q5_0":
            chosen.append(fns.proj)
            continue
        chosen += [fn for f in fields(fns) if (fn := getattr(fns, f.name)) is not None
                   and any(p.dtype.is_quantized for p in fn.memrefs)]
    jobs = kernel_jobs(chosen, RenderOptions(qgemv="auto", asm=True), (True,))
    results = compile_sm90(jobs, tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert sum("_pto_dqx16_dot_q5_" in j["source"] for j in jobs) >= 5
    assert any("_pto_dqx16_dot_q5_k(" in j["source"] for j in jobs)
    assert any("_pto_dqx16_rows_q5_1(" in j["source"] for j in jobs)


@pytest.mark.sm90
@pytest.mark.slow
def test_the_quantized_steps_kernels_compile_for_sm90(tmp_path):
    """Every InCore function of a step with quantized weights (SmolLM2 in its file's Q4_1 and
    Q8_0, the 8B model in Q4_K with a Q6_K head, in Q8_0 and in fp8; one sequence: the GEMVs'
    f32 weight tiles; sixteen: the tensor-core dots), the masked and the mask-free path, through
    Triton's compiler for an H100 (no GPU needed): the helpers' joins, word loads and pointer
    casts compile; the GEMVs read by units, by groups and as integer or half dots
    (``RenderOptions.qgemv``; the dots' inline PTX assembled by ptxas)."""
    from dataclasses import fields

    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.ir.dtypes import DType, dtype_of
    from pto.machine.target import get
    from tests.sm90 import compile_sm90, kernel_jobs

    chosen, small = [], 0
    for name, layers, head in (("smollm2-135m", "q4_1", "q8_0"), ("llama3-8b", "q4_k", "q6_k"),
                               ("llama3-8b", "q8_0", None), ("llama3-8b", "fp8", "fp8")):
        small = small or len(chosen)  # (SmolLM2's functions come first)
        cfg = CONFIGS[name]
        kinds = {k: dtype_of(layers) for k in ("w_qkv", "wo", "wg", "wu", "wd")}
        if head:
            kinds.update({"lm_head": dtype_of(head), **({"emb": dtype_of(head)} if cfg.tied else {})})
        wt = WeightTypes(tuple(sorted(kinds.items())))
        for batch in (1, 16):
            fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(tiling_for(cfg), wt, batch), batch,
                            wtypes=wt)
            chosen += [fn for f in fields(fns) if (fn := getattr(fns, f.name)) is not None
                       and any(p.dtype.is_quantized for p in fn.memrefs)]
    from pto.codegen.triton.common import RenderOptions

    # the GEMVs' products by units and by groups (PTO_QGEMV), the latter with the 8B model's
    # group-wide steps too
    for t in (dict(bk=4096, ffn_bn=4, ffn_bk=4096, lm_bk=2048),):
        cfg = CONFIGS["llama3-8b"]
        wt = WeightTypes(tuple(sorted({**{k: DType.Q4_K for k in ("w_qkv", "wo", "wg", "wu", "wd")},
                                       "lm_head": DType.Q6_K}.items())))
        fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(tiling_for(cfg).with_fields(**t), wt), 1,
                        wtypes=wt)
        chosen += [fn for f in fields(fns) if (fn := getattr(fns, f.name)) is not None
                   and any(p.dtype.is_quantized for p in fn.memrefs)]
    jobs = kernel_jobs(chosen) + kernel_jobs(chosen, RenderOptions(qgemv="groups"))
    # the integer dots' inline PTX (dp2a, dp4a, prmt) and fp8's half dots' (cvt, fma.rn.f16x2) through
    # ptxas: every format that takes them
    jobs += kernel_jobs(chosen, RenderOptions(qgemv="int16", asm=True))
    jobs += kernel_jobs(chosen, RenderOptions(qgemv="int8", asm=True))
    # SmolLM2's grouped GEMVs at four warps a program (PTO_QGEMV_WARPS=4; the rule gives them one)
    jobs += kernel_jobs(chosen[:small], RenderOptions(qgemv="int16", asm=True, qgemv_warps=4))
    results = compile_sm90(jobs, tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert len(results) >= 120, len(results)
    assert sum("_pto_dqg_dot_" in j["source"] for j in jobs) >= 20
    assert all(sum(f"_pto_dqx{b}_dot_{f}(" in j["source"] for j in jobs) >= 2
               for b in (8, 16) for f in ("q4_1", "q8_0", "q4_k", "q6_k"))
    assert sum("cvt.rn.f16x2.e4m3x2" in j["source"] for j in jobs) >= 4  # fp8's half dots, int8 and int16


def test_the_cpus_whole_k_steps_keep_the_heads_blocks_and_the_argmax():
    """SmolLM2's dimensions on the CPU's tiling (each quantized GEMV's whole contraction a step,
    which narrows a quantized LM head's vocabulary blocks), random q8_0 weights with the tied
    head, a vocabulary of 4,096 ids: the step's first stage of greedy sampling has a column for
    every block of the head, so each new token is the argmax of its step's logits over the whole
    vocabulary (the orchestration once counted the blocks of the tiling before the whole steps:
    a quarter of the vocabulary)."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import quantize_weights

    from pto.ir.dtypes import DType

    cfg = replace(CONFIGS["smollm2-135m"], layers=1, vocab=4096)
    w = quantize_weights(random_weights(cfg, torch.float32, torch.Generator().manual_seed(5)), "q8_0", embedding=True)
    gen = Generator(w, "cpu", DType.F32)
    picked = []
    try:
        def argmax(new):
            picked.append((new[0], int(gen.logits(gen.step(1, 64))[0].argmax())))

        gen.generate([[7, 300, 41, 3001]], 6, on_step=argmax, stop_ids=())  # (a tied model echoes its input)
    finally:
        gen.close()
    assert len(picked) == 6 and all(tok == best for tok, best in picked), picked
    assert any(best >= 1024 for _, best in picked)  # (beyond the first quarter somewhere)


def test_quantized_weights_take_the_tilings_quant_tiles_and_set_fields_win():
    """The 8B model's GPU tiling: dense weights keep its tiles; quantized ones take its
    ``quant_tiles`` (K steps of whole blocks); a field set with ``with_fields`` holds for both;
    a quant tile naming no field is one line."""
    from pto.orchestration.model.program import CONFIGS, QUANT_WIDE, tiling_for
    from pto.orchestration.model.quantized import HEAD_STEPS, WeightTypes, for_weights
    from pto.orchestration.model.tiling import DecodeTiling

    from pto.errors import UsageError
    from pto.ir.dtypes import DType

    t = tiling_for(CONFIGS["llama3-8b"])
    q4k = WeightTypes(tuple(sorted({**{k: DType.Q4_K for k in ("w_qkv", "wo", "wg", "wu", "wd")},
                                    "lm_head": DType.Q6_K}.items())))
    assert for_weights(t, WeightTypes(())) is t
    q = for_weights(t, q4k)
    assert all(getattr(q, k) == v for k, v in QUANT_WIDE if k != "lm_bk") and q.wt and q.lm_wt
    # a Q6_K head in K steps of HEAD_STEPS', a Q8_0 one in the tiles' (they differ); lm_bk set holds
    assert (q.lm_bk, q.bv) == (HEAD_STEPS[DType.Q6_K], dict(QUANT_WIDE)["bv"])
    q8 = WeightTypes(tuple(sorted({**dict(q4k.types), "lm_head": DType.Q8_0}.items())))
    assert for_weights(t, q8).lm_bk == dict(QUANT_WIDE)["lm_bk"] != HEAD_STEPS[DType.Q6_K]
    assert for_weights(t.with_fields(lm_bk=2048), q4k).lm_bk == 2048
    assert for_weights(t, q4k, rows=8).lm_bk == max(t.lm_bk, DType.Q6_K.quant.block)  # (the dot path: whole blocks)
    assert (t.ffn_bn, t.ffn_bk) != (q.ffn_bn, q.ffn_bk)
    mine = for_weights(t.with_fields(ffn_bn=16, ffn_bk=1024), q4k)
    assert (mine.ffn_bn, mine.ffn_bk, mine.o_bk) == (16, 1024, dict(QUANT_WIDE)["o_bk"])
    assert for_weights(t, q4k, rows=8).ffn_bk == t.ffn_bk  # several sequences: the dot path's tiles
    # up to quant_rows sequences (at most 8): the one sequence's tiles, their rows read by groups
    few = t.with_fields(quant_rows=8)
    assert for_weights(few, q4k, rows=8).ffn_bk == q.ffn_bk and for_weights(few, q4k, rows=9).ffn_bk == t.ffn_bk
    with pytest.raises(UsageError, match="quant_tiles names nope: not a field"):
        DecodeTiling(quant_tiles=(("nope", 3),))


@pytest.mark.parametrize("batch", [2, 16])
def test_a_cpus_batch_takes_whole_k_steps_of_whole_blocks(batch):
    """On a CPU the quantized GEMVs take their whole contraction a step at any batch
    (``quant_whole_k``), narrowed to a divisor of it in whole blocks where a batch's rows do not
    fit the target's on-chip memory (the LM head: the step and vocabulary block that hold the most
    weights): every step of SmolLM2's shape is whole blocks dividing its K, 2 sequences take every
    projection's whole K, and the step of those tiles is the reference's on the dequantized
    weights (a misplaced step would fail its task)."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.ir.analysis import specialize, tile_shape
    from pto.ir.dtypes import DType
    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import Op
    from pto.machine.target import get
    from pto.passes.tiling import check_sram

    cfg = replace(mp.CONFIGS["smollm2-135m"], layers=1, vocab=4096)
    cpu = get("x86_64")
    wt = WeightTypes(tuple((k, DType.Q4_1) for k in ("lm_head", "w_qkv", "wd", "wg", "wo", "wu")))
    fns = functions(cfg, DType.F32, cpu, for_weights(mp.tiling_for(cfg, cpu), wt, batch), batch, wtypes=wt)
    c, steps = cfg.layer, {}
    for name, fn, dims in (("qkv", fns.qkv_rope or fns.qkv, {}), ("o", fns.proj_o or fns.proj, {}),
                           ("down", fns.proj, {"K": c.ffn, "N": c.hidden}), ("gate_up", fns.gate_up, {}),
                           ("lm", fns.lm, {})):
        fn = specialize(fn, dims)
        check_sram(fn, cpu)  # (what the builder asked of each step)
        mems, tiles = {p.name: p for p in fn.memrefs}, {t.name: t for t in fn.tiles}
        load = next(i for i in walk_instrs(fn.body) if i.op is Op.LOAD and mems.get(i.srcs[0]) is not None
                    and mems[i.srcs[0]].dtype.is_quantized)
        K, step = int(str(mems[load.srcs[0]].shape[1])), tile_shape(tiles[load.dst], dict(fn.variant))[1]
        assert step % 32 == 0 and K % step == 0, (name, K, step)
        steps[name] = (K, step)
    if batch == 2:
        assert all(step == K for name, (K, step) in steps.items() if name != "lm"), steps
    mp.CONFIGS["smollm2-1l"] = cfg
    try:
        res = run("model", config="smollm2-1l", cache=64, batch=batch, device="cpu", check=True, seed=2,
                  quantize="q4_1")
    finally:
        del mp.CONFIGS["smollm2-1l"]
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.sm90
@pytest.mark.slow
@pytest.mark.parametrize("layers,helper,masked", [("q4_k", "_pto_dqx16_rows_q4_k", True),
                                                  ("q6_k", "_pto_dqx16_rows_q6_k", False),
                                                  ("q8_0", "_pto_dqx16_rows_q8_0", False),
                                                  ("fp8", "_pto_dqh_rows_fp8", False),
                                                  ("q5_k", "_pto_dqx16_rows_q5_k", False)])
def test_the_steps_gemvs_of_a_few_rows_compile_for_sm90(tmp_path, layers, helper, masked):
    """The 8B model's quantized o projection at eight sequences unpadded
    (``DecodeTiling.quant_rows``): the dots of a few rows of x (integer dots of Q4_K, Q6_K, Q8_0
    and Q5_K, fp8's half dots) through Triton's compiler for an H100, their inline
    PTX assembled by ptxas; the mask-free path of each, the masked path of Q4_K's (the others' masked
    kernels take minutes each: Q5_K's 318 s, 103 s in LLVM and 215 s in ptxas on a 2-core VM, Q6_K's
    about 180 s; docs/PERF.md, "Seventeenth session")."""
    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.codegen.triton.common import RenderOptions
    from pto.ir.dtypes import DType, dtype_of
    from pto.machine.target import get
    from tests.sm90 import compile_sm90, kernel_jobs

    wt = WeightTypes(tuple(sorted({k: dtype_of(layers) for k in ("w_qkv", "wo", "wg", "wu", "wd")}.items())))
    t = tiling_for(CONFIGS["llama3-8b"]).with_fields(quant_rows=8)
    proj = functions(CONFIGS["llama3-8b"], DType.BF16, get("cuda_h100"), for_weights(t, wt, 8), 8, wtypes=wt).proj
    jobs = kernel_jobs([proj], RenderOptions(qgemv="auto", asm=True), (False, True) if masked else (True,))
    results = compile_sm90(jobs, tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert all(f"{helper}(" in j["source"].split("def d_")[-1] for j in jobs)


@pytest.mark.parametrize("quant_rows,batch,rows", [(8, 5, 5), (8, 8, 8), (8, 9, 16), (0, 5, 16), (16, 12, 16)])
def test_a_few_sequences_keep_their_rows_where_the_tiling_says(quant_rows, batch, rows):
    """On a GPU a step of ``batch`` sequences with quantized weights: up to the tiling's
    ``quant_rows`` (at most 8) its projections' tiles have the batch's rows (their GEMVs read the
    weights by groups for every row, in f32 tiles of the one sequence's quantized blocks of
    outputs; the K steps as the target's on-chip memory holds them), more sequences or
    ``quant_rows`` 0 pad them to 16 for the tensor cores' dots; dense weights pad past their
    ``dense_rows`` (2 on the 8B)."""
    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.ir.analysis import specialize
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg = CONFIGS["llama3-8b"]
    q4k = WeightTypes(tuple(sorted({**{k: DType.Q4_K for k in ("w_qkv", "wo", "wg", "wu", "wd")},
                                    "lm_head": DType.Q6_K}.items())))
    t = tiling_for(cfg).with_fields(quant_rows=quant_rows)
    for wt, want in ((q4k, rows), (WeightTypes(()), 16)):
        fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(t, wt, batch), batch, wtypes=wt)
        for fn in (fns.qkv, fns.proj, fns.gate_up, fns.lm):
            x = next(p for p in specialize(fn).memrefs if p.name == "x")
            assert x.shape[0].value == want, (fn.name, wt.quantized)
    one = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(t, q4k, 1), 1, wtypes=q4k)
    few = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(t, q4k, batch), batch, wtypes=q4k)
    def outputs(fn):  # the weight tiles' rows (a block's outputs; their K steps narrow with more rows of x)
        return [(t.name, str(t.rows), t.dtype) for t in specialize(fn).tiles if t.name.startswith("b")]

    same = [outputs(getattr(few, k)) == outputs(getattr(one, k)) for k in ("qkv", "gate_up")]
    assert all(same) == (rows == batch), same
