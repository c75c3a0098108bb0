"""The decode step as a task graph (the program ``model``) and generation with it, against the
reference model (itself checked against transformers in test_reference.py) and, on the real
SmolLM2 checkpoint, against transformers' ``generate``.

A step's state (every sequence at its own position, the cache filled with seeded random keys and
values, a random token) steps once: the logits, the chosen token and the next position must be
the reference's. Positions and token ids are device data, so one graph serves every step: the
generation tests replay one graph for every token."""

from __future__ import annotations

import os

import pytest
import torch

from pto.cli.commands.run import run
from pto.engine import rel_err
from tests.programs.model.conftest import greedy_prompts, transformers_greedy

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize("config,cache,batch", [("tiny", 64, 1), ("tiny", 96, 3), ("tiny-swa", 64, 2)])
def test_one_step_matches_the_reference(config, cache, batch):
    """f32 on the torch backend: the same sums in another order (tiles of 32 for the
    projections, chunks for attention), so the logits agree to about 1e-6 relative; the
    argmax and the next position exactly. tiny-swa's ring has wrapped at some positions."""
    res = run("model", config=config, cache=cache, batch=batch, device="cpu", check=True, seed=batch)
    assert res["rel_err"] <= 1e-5, res
    assert (res["cache"], res["batch"]) == (cache, batch)


@pytest.mark.parametrize("wt,lm_wt,batch", [(False, False, 2), (True, False, 2), (True, True, 2), (True, True, 3)])
def test_a_tiling_that_divides_nothing_matches_the_reference(monkeypatch, wt, lm_wt, batch):
    """Block sizes that divide none of the widths (hidden 64 and FFN 160 in K steps of 48,
    outputs in blocks of 48, the vocabulary of 512 in blocks of 96): the last blocks of every
    projection and of the LM head's norm weight run past the tensors and are masked; with the
    layers' weights stored output-major (``wt``: the GEMVs of pto.incore.gemv), the LM head too
    (``lm_wt``), and a K step of its own on the dot path (``dot_bk``) as well."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import DecodeTiling

    monkeypatch.setattr(mp, "TINY_TILING", DecodeTiling(chunk=32, tk=16, bn=48, bk=48, bv=96, lm_bk=48, wt=wt,
                                                        lm_wt=lm_wt, dot_bk=24))
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", check=True, seed=5)
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.parametrize("batch,fields", [(1, dict(qkv_bn=8, qkv_bk=32, o_bn=2, o_bk=16, rope_bh=4)),
                                          (1, dict(qkv_bn=2, o_bn=16, rope_in_qkv=False)),
                                          (16, dict(qkv_bn=8, qkv_bk=16, o_bn=2, o_bk=32, dot_bn=8))])
def test_projections_with_tiles_of_their_own_match_the_reference(monkeypatch, batch, fields):
    """One sequence: the q, k, v projection (fused with RoPE or not) and the o projection in
    blocks and K steps of their own (the o projection then a function of its own beside the down
    projection's), on the torch backend, give the reference's logits and tokens; at 16
    sequences (tensor-core tiles of 16 rows, which a GPU pads 2 to 15 sequences to) the
    projections share the dot path's tiles (``dot_bn``, ``dot_bk``)."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType

    t = replace(mp.TINY_TILING, **fields)
    monkeypatch.setattr(mp, "TINY_TILING", t)
    names = {f.name for f in build_step(mp.CONFIGS["tiny"], DType.F32, None, batch, t).functions}
    assert "gemv_residual_tile" in names and ("gemv_residual_tile_o" in names) == (batch == 1)
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", check=True, seed=11)
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor,wt,batch", [("waves", False, 2), ("persistent", False, 2), ("waves", True, 2),
                                               ("waves", False, 16)])
def test_one_step_on_triton(executor, wt, batch, monkeypatch):
    """The step's kernels under the Triton interpreter (load_scalar, rowargmax, rowtakemax, the
    ring's p mod C, a dynamic loop bound), both executors; the output-major GEMVs (``wt``); 16
    sequences, the dot path's tiles (a CPU target pads no fewer rows to them: 2 sequences run
    the GEMVs of 2 rows)."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, wt=wt, lm_wt=wt))
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", backend="triton", executor=executor,
              check=True, seed=3)
    assert res["rel_err"] <= 1e-5, res


def test_a_cache_that_is_not_whole_chunks_or_too_long_is_one_error():
    from pto.errors import UsageError

    with pytest.raises(UsageError, match=r"--cache 100 must be a multiple of 32"):
        run("model", config="tiny", cache=100, device="cpu")
    with pytest.raises(UsageError, match=r"sliding window of 64 positions: .* \(--cache 64, not 128\)"):
        run("model", config="tiny-swa", cache=128, device="cpu")
    with pytest.raises(UsageError, match=r"--cache 2048 exceeds the model's context of 1024"):
        run("model", config="tiny", cache=2048, device="cpu")
    from pto.engine import Runner, resolve  # a runner made directly refuses it too

    with pytest.raises(UsageError, match=r"--cache 100 must be a multiple of 32"):
        Runner(resolve("model", device="cpu", config="tiny"), {"cache": 100, "batch": 1})


def _random_weights(config: str, seed: int = 0):
    from pto.orchestration.model.program import CONFIGS, random_weights

    return random_weights(CONFIGS[config], torch.float32, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", ["tiny", "tiny-swa"])
def test_generation_replays_one_graph_and_matches_the_reference(config):
    """Prompts of different lengths in one batch (one of a single token: no prefill), prefill
    through the layer program, then the step replayed: the reference model's greedy tokens.
    tiny-swa generates past its 64-slot ring."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights(config, seed=4)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, w.config.vocab, (n,), generator=g).tolist() for n in (7, 1, 30)]
    new = 50 if config == "tiny-swa" else 20
    want = ReferenceModel(w).generate(prompts, new, stop_ids=())
    gen = Generator(w, "cpu", DType.F32)
    try:
        got = gen.generate(prompts, new, stop_ids=())
        assert len(gen._steps) == 1  # one graph for every step
    finally:
        gen.close()
    assert got.tokens == want
    assert len(got.decode_ms) == new and got.tasks_per_step > 0


def test_a_prompt_longer_than_the_window_prefills_the_ring_and_matches_the_reference():
    """tiny-swa's 64-slot ring and prompts of 100 and 64 positions (plus the last token): the
    prefill keeps each one's last 64 positions, in two runs of slots once the ring has wrapped;
    two prefills of the same length in one batch (the layer's graph reused, its RoPE tables
    copied in once); the reference model's greedy tokens."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights("tiny-swa", seed=8)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, w.config.vocab, (n,), generator=g).tolist() for n in (101, 65, 101)]
    want = ReferenceModel(w).generate(prompts, 6, stop_ids=())
    gen = Generator(w, "cpu", DType.F32)
    try:
        assert gen.generate(prompts, 6, stop_ids=()).tokens == want
    finally:
        gen.close()


@pytest.mark.parametrize("n,capacity,runs", [(5, 64, [(0, 0, 5)]), (64, 64, [(0, 0, 64)]),
                                             (100, 64, [(36, 36, 28), (64, 0, 36)]), (128, 64, [(64, 0, 64)]),
                                             (130, 64, [(66, 2, 62), (128, 0, 2)])])
def test_a_prompts_positions_go_to_the_rings_slots_in_runs(n, capacity, runs):
    from pto.orchestration.llm.generate import ring_runs

    assert ring_runs(n, capacity) == runs
    slots = [s + k for _, s, c in runs for k in range(c)]
    positions = [p + k for p, _, c in runs for k in range(c)]
    assert positions == list(range(max(0, n - capacity), n)) and slots == [p % capacity for p in positions]


def test_sampled_generation_draws_what_the_reference_draws():
    """Temperature, top-k and top-p with a seed: the step's logits sampled on the device and the
    token written back into its state; the same draws as the reference model's sampler on its
    logits (the two logits agree to about 1e-6, far inside any draw's margin), and another seed
    draws other tokens."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.sampling import Sampler
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights("tiny", seed=6)
    prompts = [[5, 9, 11, 300], [42]]
    gen = Generator(w, "cpu", DType.F32)
    try:
        runs = [gen.generate(prompts, 16, stop_ids=(), sampler=Sampler(3.0, 40, 0.95, seed)) for seed in (3, 4)]
    finally:
        gen.close()
    got = [r.tokens for r in runs]
    # the prefill's graph (3 tokens) built and its kernels loaded by the first generation, timed
    # apart from the prompts' prefill_ms; the second reuses them
    assert runs[0].prefill_prepare_ms > 0 and runs[1].prefill_prepare_ms == 0 and runs[1].prefill_ms > 0
    want = ReferenceModel(w).generate(prompts, 16, Sampler(3.0, 40, 0.95, 3), stop_ids=())
    greedy = ReferenceModel(w).generate(prompts, 16, stop_ids=())
    assert got[0] == want and got[0] != got[1] and got[0] != greedy


def test_sampling_options_are_checked_before_any_work(tmp_path):
    from pto.orchestration.llm.textgen import run as generate

    from pto.errors import UsageError
    from pto.generation import GenerateRequest

    f = tmp_path / "model.gguf"
    f.write_bytes(b"not read")
    for kw, msg in (({"temperature": -1.0}, "--temperature must be 0"), ({"top_p": 0.5}, "give --temperature"),
                    ({"temperature": float("inf")}, "--temperature must be 0 .* got inf"),
                    ({"temperature": float("nan")}, "--temperature must be 0 .* got nan"),
                    ({"temperature": 1.0, "top_p": 1.5}, r"--top-p must be in \(0, 1\]"),
                    ({"top_p": 1.5}, r"--top-p must be in \(0, 1\]")):  # (the range first, then the pairing)
        with pytest.raises(UsageError, match=msg):
            generate(GenerateRequest(gguf=str(f), prompts=("hi",), **kw))


def test_the_model_path_is_checked_against_its_flag_before_any_work(tmp_path):
    """``--gguf`` takes a file and ``--hf`` a folder: the other kind, or nothing there, is one
    line naming the flag and the path (a folder given to --gguf was answered "no tokenizer")."""
    from pto.orchestration.llm.textgen import run as generate

    from pto.errors import UsageError
    from pto.generation import GenerateRequest

    f = tmp_path / "model.gguf"
    f.write_bytes(b"not read")
    for kw, msg in (({"gguf": str(tmp_path)}, rf"^--gguf {tmp_path}: a folder, not a GGUF file"),
                    ({"hf": str(f)}, rf"^--hf {f}: a file, not a Hugging Face folder"),
                    ({"gguf": str(tmp_path / "no.gguf")}, rf"^--gguf {tmp_path / 'no.gguf'}: no such file or folder$")):
        with pytest.raises(UsageError, match=msg):
            generate(GenerateRequest(prompts=("hi",), **kw))


def test_estimate_counts_the_cache_and_the_bytes_a_step_reads():
    """``pto estimate model``'s KV cache and Read/step columns against the tensors a run makes:
    the cache is k_cache and v_cache; a step reads every weight but the embedding (a row per
    sequence) and the cache. Untied (tiny-swa: its own LM head) and bf16."""
    from pto.cli.commands.estimate import estimate
    from pto.engine import resolve

    for config in ("tiny", "tiny-swa"):
        res = estimate("model", [64], config=config, dtype="bf16", shape={"batch": 3})
        row = res["rows"][0]
        job = resolve("model", device="cpu", config=config, dtype="bf16")
        t = job.program.inputs(job.settings, job.program.shape({"cache": 64, "batch": 3}), "cpu")
        nbytes = {k: v.numel() * v.element_size() for k, v in t.items()}
        assert row["kv_cache_bytes"] == nbytes["k_cache"] + nbytes["v_cache"]
        state = ("emb", "cos", "sin", "tok", "pos")
        assert row["step_read_bytes"] == sum(n for k, n in nbytes.items() if k not in state)
        # one rank of two: its shard of the layers' weights, of the cache and of the LM head (the
        # vocabulary-parallel head's share, and where its candidate goes)
        s2 = job.program.settings(device="cpu", config=config, dtype="bf16", tp=2)
        mine = job.program.shard(s2, t, 1)
        two = estimate("model", [64], config=config, dtype="bf16", shape={"batch": 3}, tp=2)["rows"][0]
        nbytes = {k: v.numel() * v.element_size() for k, v in mine.items()}
        assert two["kv_cache_bytes"] == nbytes["k_cache"] + nbytes["v_cache"] == row["kv_cache_bytes"] // 2
        assert two["step_read_bytes"] == sum(n for k, n in nbytes.items() if k not in state)
        assert nbytes["lm_head"] * 2 == {k: v.numel() * v.element_size() for k, v in t.items()}["lm_head"]


def test_estimate_calibrates_only_on_caches_the_step_can_hold():
    """SmolLM2's attention chunk is 64 slots: the memory model's calibration builds skip the
    smaller caches (they failed with a zero-row tensor), and a cache that is not whole chunks is
    refused before any build."""
    from pto.orchestration.model.program import CONFIGS, tiling_for

    from pto.cli.commands.estimate import estimate
    from pto.errors import UsageError

    chunk = tiling_for(CONFIGS["smollm2-135m"]).chunk
    res = estimate("model", [1024], config="smollm2-135m", dtype="bf16", target="cuda_h100")
    assert all(v % chunk == 0 for v in res["memory_model"]["fitted_on"]), res["memory_model"]
    with pytest.raises(UsageError, match=f"--cache 1000 must be a multiple of {chunk}"):
        estimate("model", [1000], config="smollm2-135m", dtype="bf16", target="cuda_h100")


@pytest.mark.slow
def test_estimate_and_graph_of_a_decode_step():
    """pto estimate sweeps the cache (the program's first shape parameter); pto graph builds the
    step without running it; the counts agree."""
    from pto.cli.commands.estimate import estimate
    from pto.engine import build_graph, resolve

    res = estimate("model", [64, 128], config="tiny", shape=None)
    assert [r["cache"] for r in res["rows"]] == [64, 128] and res["swept"] == "cache"
    job = resolve("model", device="cpu", config="tiny")
    built = build_graph(job, job.program.shape({"cache": 128}))
    try:
        assert built.graph.tasks == res["rows"][1]["tasks"]
    finally:
        built.graph.close()


def test_a_drawing_of_a_30_layer_step_bands_whole_layers(tmp_path):
    """SmolLM2's step (30 layers, 183 dependency levels at batch 1) is too large to draw per
    task; the summary finds that the graph repeats every 6 levels (a layer: the projection with
    RoPE, attention, its combine, o, gate/up, down) and bands whole layers: every band but the
    first and the last holds the same InCore functions, each the same number of times."""
    import numpy as np

    from pto import viz
    from pto.cli.commands.graph import build_only
    from pto.engine import resolve

    job = resolve("model", device="cpu", config="smollm2-135m", dtype="bf16", target="cuda_h100")
    build_only(job, job.program.shape({"cache": 1024}), dump=str(tmp_path / "step.txt"))
    g = viz.load_dump(tmp_path / "step.txt")
    text, s = viz.to_dot(g)
    assert s is not None and s.period == 6 and s.band % 6 == 0 and s.n_levels == 183, (s.period, s.band)
    assert f"repeats every 6 levels; a band holds {s.band // 6}" in text
    inner = [sorted(zip(s.base_of[s.band_of == b].tolist(), s.count[s.band_of == b].tolist()))
             for b in range(1, s.n_bands - 1)]
    assert len(inner) >= 3 and all(x == inner[0] for x in inner), inner
    # a layer's six functions (the o and down projections' residual GEMVs have tiles of their own)
    assert len(np.unique(s.base_of[s.band_of == 1])) == 6


@pytest.mark.slow
def test_smollm2_generates_what_transformers_generates(smollm, hf_model, hf_tokenizer):
    """The real checkpoint (Q4_1, dequantized to f32 at load), greedy, 32 new tokens on several
    prompts (chat-formatted and plain, one batch): the same tokens as transformers' generate."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.checkpoint import load_weights

    from pto.ir.dtypes import DType

    prompts = greedy_prompts(load_tokenizer(smollm))
    want = transformers_greedy(hf_model, prompts, 32)
    gen = Generator(load_weights(smollm, torch.float32), "cpu", DType.F32)
    try:
        got = gen.generate(prompts, 32, stop_ids=())
    finally:
        gen.close()
    assert got.tokens == want


def test_teacher_forced_logits_of_the_step_match_the_reference_at_smollm2_shape():
    """SmolLM2's dimensions (hidden 576, 9 query and 3 key/value heads of 64, FFN 1536: none a
    power of two where it matters), random weights, two layers: one step's logits."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    cfg = replace(mp.CONFIGS["smollm2-135m"], layers=2, vocab=1000)
    mp.CONFIGS["smollm2-2l"] = cfg
    try:
        res = run("model", config="smollm2-2l", cache=256, batch=2, device="cpu", check=True)
    finally:
        del mp.CONFIGS["smollm2-2l"]
    assert res["rel_err"] <= 1e-5, res


def test_the_step_reads_its_position_and_token_from_device_data():
    """Replaying the same graph with other positions and tokens (written into its state) gives
    the reference's step at those: nothing about a step is baked into the graph."""
    from pto.engine import Runner, resolve

    job = resolve("model", device="cpu", config="tiny")
    shape = job.program.shape({"cache": 64, "batch": 2})
    runner = Runner(job, shape)
    try:
        for seed in (1, 2):
            inputs = job.program.inputs(job.settings, shape, "cpu", seed=seed)
            ref = job.program.reference(job.settings, shape, inputs)
            out = runner(inputs)
            assert rel_err(out["logits"], ref["logits"]) <= 1e-5
            assert torch.equal(out["tok"], ref["tok"]) and torch.equal(out["pos"], ref["pos"])
    finally:
        runner.close()


def test_the_steps_tiles_fit_the_target_at_large_batches():
    """A batch of 32 rows in K steps of 1024 needs 258 KiB of an H100's 227: the projections'
    step halves until the tiles fit (SRAM-aware); from 16 rows on the blocks are 16 outputs wide
    (tensor-core dots, not a broadcast sum) in the dot path's own K step (``dot_bk``, 128 by
    default); the 8B model's too."""
    from pto.orchestration.model.decode import DecodeTiling, functions
    from pto.orchestration.model.program import CONFIGS

    from pto.ir.dtypes import DType
    from pto.machine.target import get
    from pto.passes.tiling import check_sram

    h100 = get("cuda_h100")
    for name in ("smollm2-135m", "llama3-8b"):
        # (tiling, batch, the normed projections' K step, the residual one's, the output block)
        for tiling, batch, bk_norm, bk, bn in ((DecodeTiling(), 1, 1024, 1024, 4), (DecodeTiling(), 32, 128, 128, 16),
                                               (DecodeTiling(dot_bk=None), 32, 512, 1024, 16)):
            f = functions(CONFIGS[name], DType.BF16, h100, tiling, batch)
            for fn, step in ((f.qkv, bk_norm), (f.gate_up, bk_norm), (f.proj, bk)):
                tiles = {t.name: t for t in fn.tiles}
                assert tiles["a"].cols.value == step, (name, batch, fn.name)
                check_sram(fn, h100, {"R": batch})
            assert [t for t in f.qkv.tiles if t.name.startswith("b")][-1].rows.value == bn


def test_a_tiling_or_cache_the_attention_cannot_cover_is_one_error():
    """Key tiles that do not divide the chunk would read keys past it unmasked (the softmax
    silently off by 2e-2); a cache that is not whole chunks would drop its last slots: both are
    refused, naming the numbers; so are block sizes below 1 and a sum dtype Generator does not
    know."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.decode import DecodeTiling
    from pto.orchestration.model.program import CONFIGS, random_weights

    from pto.errors import UsageError
    from pto.ir.dtypes import DType

    with pytest.raises(UsageError, match="chunk=24 is not a multiple of tk=16"):
        DecodeTiling(chunk=24, tk=16)
    with pytest.raises(UsageError, match="dot_bk=0: block sizes are positive"):
        DecodeTiling(dot_bk=0)
    with pytest.raises(UsageError, match="o_bn=0, rope_bh=-1: block sizes are positive"):
        DecodeTiling(o_bn=0, rope_bh=-1)
    w = random_weights(CONFIGS["tiny"], torch.float32, torch.Generator().manual_seed(0))
    with pytest.raises(UsageError, match="--allreduce-dtype 'bf16': expected storage or f32"):
        Generator(w, "cpu", DType.F32, allreduce_dtype="bf16")
    gen = Generator(w, "cpu", DType.F32, tiling=DecodeTiling(chunk=96, tk=32, bn=32, bk=32, bv=128, lm_bk=32))
    with pytest.raises(UsageError, match="the attention chunk is 96 slots"):
        gen.step(1, 128)


def test_auto_means_the_programs_measured_executor_on_a_gpu(monkeypatch):
    """On a GPU ``--executor auto`` is decided per graph, unless the program says which executor
    its measurements settle on: the model program's step runs the persistent executor in its own
    tiles, except a narrow model's step of 1 to 4 sequences, with collectives (``--tp 2``) or
    quantized weights, which take the waves; on the CPU auto is the CPU's (resolved without a GPU
    by making torch report one; nothing is built or run). ``pto generate``'s step takes the same
    rule (its placement, given the rule's choice)."""
    from pto.orchestration.model.program import NARROW_WAVES_BATCH, PROGRAM, auto_step_executor

    import pto.machine.device
    from pto.engine import placement, resolve
    from pto.errors import UsageError
    from pto.ir.dtypes import DType

    monkeypatch.setattr(pto.machine.device, "cuda_available", lambda: True)
    smol = dict(device="cuda", target="cuda_h200", config="smollm2-135m", dtype="bf16")
    job = resolve("model", **smol)
    assert job.executor == "waves" and job.settings["tiles"] == "waves"
    for batch, expected in ((NARROW_WAVES_BATCH, "waves"), (NARROW_WAVES_BATCH + 1, "persistent"), (8, "persistent")):
        job = resolve("model", **smol, shape={"batch": batch})
        assert job.executor == expected and job.settings["tiles"] == expected, batch
    eight_b = dict(device="cuda", target="cuda_h200", config="llama3-8b")
    for batch in (1, 2, 8):
        job = resolve("model", **eight_b, shape={"batch": batch})
        assert job.executor == "persistent" and job.settings["tiles"] == "persistent", batch
    assert resolve("model", **eight_b, tp=2).executor == "waves"
    for q in ("q4_k", "fp8"):
        assert resolve("model", **eight_b, options={"quantize": q}).executor == "waves"
    assert resolve("llama7b", device="cuda", target="cuda_h100").executor == "auto"
    assert resolve("model", device="cuda", target="cuda_h100", executor="waves").executor == "waves"
    assert resolve("model", device="cpu").executor != "persistent"
    for tp, quantized, hidden, batch, expected in ((1, False, 4096, 1, "persistent"), (2, False, 4096, 1, "waves"),
                                                   (1, True, 4096, 1, "waves"), (1, False, 576, 1, "waves"),
                                                   (1, False, 576, 5, "persistent"), (1, False, 2048, 1, "persistent"),
                                                   (1, True, 576, 8, "waves"), (1, False, 0, 1, "persistent")):
        auto = auto_step_executor(tp, quantized, hidden, batch)
        assert placement(PROGRAM, "cuda", DType.BF16, auto=auto).executor == expected
        assert placement(PROGRAM, "cuda", DType.BF16, executor="waves", auto=auto).executor == "waves"
    with pytest.raises(UsageError, match="model: unknown setting 'iterations'"):
        resolve("model", device="cpu", iterations=3)


def test_the_command_line_and_generation_take_auto_at_their_batch(monkeypatch):
    """The executor ``auto`` at the batch the user gives: ``pto run model --batch N`` and ``pto
    graph`` (the command line's shape, through ``resolve(..., shape=)``), ``pto.run``'s keywords
    (``job_of``) and ``pto generate``'s steps (one placement and tiling per batch size: SmolLM2's 1
    to 4 sequences on the launches in their tiles, 5 on the persistent executor in the
    megakernel's blocks); a GPU faked, nothing built or run. ``bench`` of shapes whose ``auto``
    differs is one error; a plugin's ``auto_executor`` that takes the settings alone is still
    asked."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.program import CONFIGS, PROGRAM, tiling_for_executor
    from pto.orchestration.model.quantized import WeightTypes

    import pto.machine.device
    from pto.cli.commands import _job
    from pto.cli.commands.bench import bench
    from pto.cli.commands.run import job_of
    from pto.cli.parser import build_parser
    from pto.engine import resolve
    from pto.errors import UsageError
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    monkeypatch.setattr(pto.machine.device, "cuda_available", lambda: True)
    for batch, expected in ((2, "waves"), (8, "persistent")):
        for cmd in ("run", "graph"):
            args = build_parser(PROGRAM).parse_args([cmd, "model", "--device", "cuda", "--target", "cuda_h200",
                                                     "--config", "smollm2-135m", "--batch", str(batch)])
            assert _job(args).executor == expected, (cmd, batch)
        job, shape = job_of("model", None, {"device": "cuda", "target": "cuda_h200", "config": "smollm2-135m",
                                            "batch": batch})
        assert (job.executor, shape["batch"]) == (expected, batch)
    gen = Generator.__new__(Generator)  # (what __init__ sets that step_placement reads; no GPU to make one)
    smol, h200 = CONFIGS["smollm2-135m"], get("cuda_h200")
    gen.config, gen.tp, gen.wtypes, gen.dtype, gen.device, gen.backend = smol, 1, WeightTypes(()), DType.BF16, \
        "cuda", "triton"
    gen.target, gen._executor, gen._tiling, gen._places = h200, "auto", None, {}
    for batch, expected in ((1, "waves"), (4, "waves"), (5, "persistent"), (8, "persistent")):
        place, tiling = gen.step_placement(batch)
        assert place.executor == expected and tiling == tiling_for_executor(smol, expected, h200), batch

    with pytest.raises(UsageError, match=r"auto is waves at cache 256, batch 1 but persistent at another shape"):
        bench("model", [{"cache": 256, "batch": 1}, {"cache": 256, "batch": 8}], device="cuda", target="cuda_h200",
              config="smollm2-135m")  # (a Python caller's shapes of two batches: named executors, not one guess)

    class Plugin(type(PROGRAM)):
        def auto_executor(self, s):  # (the signature before the shape)
            return "waves"

    assert resolve(Plugin(), device="cuda", target="cuda_h200", config="llama3-8b").executor == "waves"


@pytest.mark.parametrize("config,batch,rows", [("smollm2-135m", 2, 2), ("smollm2-135m", 4, 4),
                                               ("smollm2-135m", 5, 16), ("llama3-8b", 2, 2), ("llama3-8b", 3, 16),
                                               ("llama3-8b", 8, 16)])
def test_a_few_sequences_of_dense_weights_keep_their_rows_on_a_gpu(config, batch, rows):
    """On a GPU a bf16 step of 2 to ``dense_rows`` sequences (4 for models narrower than 2048, 2
    for the wide ones) keeps its projections' rows unpadded, under both executors' tiles, where
    more are padded to 16 rows for the tensor cores' dots; the LM head alike. A rank's step of
    ``--tp 2`` pads them (its sums over the ranks are not measured unpadded)."""
    from pto.orchestration.model.decode import build_step, functions
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.ir.analysis import specialize
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, target = CONFIGS[config], get("cuda_h200")
    for executor in ("waves", "persistent"):
        fns = functions(cfg, DType.BF16, target, tiling_for_executor(cfg, executor, target), batch)
        for fn in (fns.qkv, fns.proj, fns.proj_o, fns.gate_up, fns.lm):
            x = next(p for p in specialize(fn).memrefs if p.name == "x")
            assert x.shape[0].value == rows, (fn.name, executor)
    if config == "llama3-8b" and batch == 2:
        step = build_step(cfg, DType.BF16, target, batch, tiling_for_executor(cfg, "waves", target), tp=2, cache=512)
        gemvs = [f for f in step.functions if f.name.startswith("gemv")]
        assert gemvs and all(next(p for p in specialize(f).memrefs if p.name == "x").shape[0].value == 16
                             for f in gemvs)


@pytest.mark.sm90
@pytest.mark.slow
def test_the_steps_kernels_compile_for_sm90(tmp_path):
    """Every InCore function of SmolLM2's bf16 step (one sequence: the GEMVs; sixteen: the dot
    path), both the masked and the mask-free path, through Triton's compiler for an H100 (no GPU
    needed): what the interpreter lets through (bf16, the one-trip loops of the RoPE task and of the
    projection with RoPE, the long caches' merge) compiles."""
    from dataclasses import fields

    from pto.orchestration.model.decode import DecodeTiling, functions
    from pto.orchestration.model.program import CONFIGS

    from pto.ir.dtypes import DType
    from pto.machine.target import get
    from tests.sm90 import compile_sm90, kernel_jobs

    fns = [functions(CONFIGS["smollm2-135m"], DType.BF16, get("cuda_h100"), DecodeTiling(), batch) for batch in (1, 16)]
    # (the projection with RoPE: one sequence only)
    jobs = kernel_jobs(getattr(f, x.name) for f in fns for x in fields(f) if getattr(f, x.name) is not None)
    results = compile_sm90(jobs, tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    names = {r["name"].split("__")[0] for r in results}
    assert {"rope_qkv_append", "gemv_norm_rope_append_tile", "decode_attn_merge"} <= names, names


def test_a_long_cache_combines_in_two_levels_and_matches_the_reference(monkeypatch):
    """More than ``span`` chunks (a multiple of it): a merge task per span of chunks and query head,
    then the combine over the spans; the step is the reference's (f32, the same sums in another
    grouping, as the one-level combine). tiny's cache of 1024 slots in chunks of 16 is 64 chunks:
    4 spans, so beside the 32 chunks more than at 512 slots the graph has a merge task per layer,
    sequence, span and query head; in its own chunks of 32 (32 chunks) one combine reads them all."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import DecodeTiling, spans

    from pto import programs

    t32, t64 = DecodeTiling(chunk=32, tk=16), DecodeTiling()
    assert (spans(2048, t32), spans(512, t32), spans(640, t32), spans(None, t64), spans(32768, t64)) == \
        (4, 0, 0, 0, 32)
    assert spans(32768, DecodeTiling(span=0)) == 0 and spans(32768, DecodeTiling(span=64)) == 8
    # up to COMBINE_ROWS chunks: one combine reads them all at once (a launch fewer); its loop
    # (without combine_parts) keeps two levels
    assert (spans(1024, t32), spans(1024, replace(t32, combine_parts=False)), spans(1056, t32)) == (0, 2, 0)
    prog = programs.get("model")
    s = prog.settings(device="cpu", config="tiny")
    cfg = prog.config(s)
    all_at_once = prog.build(s, prog.shape({"cache": 1024, "batch": 3}))
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, chunk=16))
    res = run("model", config="tiny", cache=1024, batch=3, device="cpu", check=True, seed=11)
    assert res["rel_err"] <= 1e-5, res
    one_level = prog.build(s, prog.shape({"cache": 512, "batch": 3}))
    two_levels = prog.build(s, prog.shape({"cache": 1024, "batch": 3}))
    calls = [sum(1 for f in m.functions if f.name == "decode_attn_merge") for m in (one_level, all_at_once, two_levels)]
    assert calls == [0, 0, 1], calls
    # 32 chunks more per sequence and key/value head, and 4 spans' merges per query head
    more = cfg.layers * 3 * (32 * cfg.layer.kv_heads + 4 * cfg.layer.heads)
    assert res["tasks"] == run("model", config="tiny", cache=512, batch=3, device="cpu")["tasks"] + more


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
def test_the_two_combine_levels_on_triton(monkeypatch):
    """The merge and the combine over spans as Triton kernels (the interpreter), a full cache of
    64 chunks."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, chunk=16))
    res = run("model", config="tiny", cache=1024, batch=2, device="cpu", backend="triton", check=True, seed=13)
    assert res["rel_err"] <= 1e-5, res


def test_generation_past_sixteen_chunks_matches_the_reference():
    """A generation whose capacity is 32 chunks (prompt and new tokens past 512 positions): the
    step's combine reads a head's 32 partial states at once, every token the reference model's."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights("tiny", seed=12)
    prompts = [torch.randint(0, w.config.vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (500, 3)]
    want = ReferenceModel(w).generate(prompts, 40, stop_ids=())
    gen = Generator(w, "cpu", DType.F32)
    try:
        got = gen.generate(prompts, 40, stop_ids=())
        assert got.capacity == 1024
    finally:
        gen.close()
    assert got.tokens == want


def test_a_long_cache_takes_wider_chunks(monkeypatch):
    """``long_chunks``: a cache of more than that many chunks is cut into wider ones (the largest
    power-of-two multiple of the chunk that divides it), and the step is still the reference's:
    tiny's 1024 slots with at most 8 chunks are 8 chunks of 128 (8 key tiles of 16 a task)."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import DecodeTiling

    t = DecodeTiling()
    assert [t.for_cache(c).chunk for c in (1024, 8192, 16384, 32768, 38400, None)] == [64, 64, 128, 256, 512, 64]
    assert DecodeTiling(long_chunks=None).for_cache(32768).chunk == 64
    base = run("model", config="tiny", cache=1024, batch=2, device="cpu", check=True, seed=14)
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, long_chunks=8))
    res = run("model", config="tiny", cache=1024, batch=2, device="cpu", check=True, seed=14)
    assert res["rel_err"] <= 1e-5, res
    cfg = mp.CONFIGS["tiny"]
    # 32 chunks of 32 before, 8 of 128 now (one combine level both times)
    assert base["tasks"] - res["tasks"] == cfg.layers * 2 * 24 * cfg.layer.kv_heads


def test_the_persistent_tiles_widen_the_chunks_to_one_round_of_parts(monkeypatch):
    """``round_programs``: the megakernel's step widens the attention chunk until a layer's parts
    (sequences x key/value heads x chunks) make one round over its programs, as far as the cache
    divides the wider chunk; the step is still the reference's. On an H200 (264 programs) the
    8B model's batch 8 goes from 1,024 parts of 64 slots a layer to 256 of 256; batch 1 and the
    launches' tiles keep 64."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import DecodeTiling, build_step

    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType
    from pto.machine.target import get as named_target

    t = DecodeTiling(round_programs=264)
    assert [t.for_round(c, h).chunk for c, h in ((1024, 64), (1024, 8), (1024, 24), (1088, 64), (None, 64))] == \
        [256, 64, 128, 64, 64]
    assert DecodeTiling().for_round(1024, 64).chunk == 64
    h200 = named_target("cuda_h200")
    cfg = mp.CONFIGS["llama3-8b"]
    assert mp.tiling_for_executor(cfg, "persistent", h200).round_programs == 264
    assert mp.tiling_for_executor(cfg, "waves", h200).round_programs is None

    def parts_a_layer(executor, batch):
        step = build_step(cfg, DType.BF16, h200, batch, mp.tiling_for_executor(cfg, executor, h200), cache=1024)
        built = build_module_graph(step, {"B": batch, "C": 1024})
        try:
            n = sum(k for f, k in built.graph.tasks_per_variant().items() if f.name == "decode_attn_part")
        finally:
            built.graph.close()
        return n // cfg.layers

    assert [parts_a_layer(e, b) for e, b in (("persistent", 8), ("waves", 8), ("persistent", 1))] == [256, 1024, 128]
    base = run("model", config="tiny", cache=256, batch=3, device="cpu", check=True, seed=21)
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, round_programs=12))
    res = run("model", config="tiny", cache=256, batch=3, device="cpu", check=True, seed=21)
    assert res["rel_err"] <= 1e-5, res
    tiny = mp.CONFIGS["tiny"]
    # 8 chunks of 32 a sequence before, 2 of 128 now: 3 sequences x 2 heads x 2 = 12 parts a layer
    assert tiny.layer.kv_heads == 2
    assert base["tasks"] - res["tasks"] == tiny.layers * 3 * tiny.layer.kv_heads * (8 - 2)


def test_dot_round_gives_each_projection_one_round_of_items_and_the_reference_step(monkeypatch):
    """``dot_round`` (from 2 sequences on, with ``round_programs``, where a projection's items in
    ``dot_bn`` take more than one round; the persistent tiles of the wide models have it on):
    each projection's output block is the narrowest power of two from 16 whose items fit one
    round, its K step keeping a step's weight bytes. The 8B model at batch 8 on an H200's 264
    programs: o and down in 16 (256 items, 128 in ``dot_bn``'s 32), q/k/v in 32 (192), gate/up in
    64 (224, two rounds of 448 in 32). The 1B's projections make one round in 32 (gate/up 256
    items): unchanged. On tiny (round_programs 4: the attention chunk widens too) the step is the
    reference's."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step, dot_tiles
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.ir.dtypes import DType
    from pto.machine.target import get as named_target

    cfg, h200 = mp.CONFIGS["llama3-8b"], named_target("cuda_h200")
    c = cfg.layer
    own = mp.tiling_for_executor(cfg, "persistent", h200)
    assert own.dot_round and not mp.tiling_for_executor(cfg, "waves", h200).dot_round
    plain = dot_tiles(replace(own, dot_round=False), c.hidden, c.q_dim + 2 * c.kv_dim, c.ffn)
    assert (plain.bn, plain.bk, plain.qkv_bn, plain.ffn_bn) == (32, 128, None, None)
    t = dot_tiles(own, c.hidden, c.q_dim + 2 * c.kv_dim, c.ffn)
    assert (t.bn, t.bk, t.qkv_bn, t.qkv_bk, t.ffn_bn, t.ffn_bk) == (16, 256, 32, 128, 64, 64)
    assert [-(-n // b) for n, b in ((c.hidden, t.bn), (c.q_dim + 2 * c.kv_dim, t.qkv_bn), (c.ffn, t.ffn_bn))] == \
        [256, 192, 224]
    one = mp.CONFIGS["llama3.2-1b"]
    b = one.layer
    t1 = mp.tiling_for_executor(one, "persistent", h200)
    assert t1.dot_round and -(-b.ffn // 32) == 256
    assert replace(dot_tiles(t1, b.hidden, b.q_dim + 2 * b.kv_dim, b.ffn), dot_round=False) == \
        dot_tiles(replace(t1, dot_round=False), b.hidden, b.q_dim + 2 * b.kv_dim, b.ffn)
    # at tp = 2 a rank's q/k/v and gate/up are halves (o and down still make all of hidden):
    # every projection one round in dot_bn's 32, the plain tiles
    half = dot_tiles(own, c.hidden, (c.q_dim + 2 * c.kv_dim) // 2, c.ffn // 2)
    assert replace(half, dot_round=False) == dot_tiles(replace(own, dot_round=False), c.hidden,
                                                       (c.q_dim + 2 * c.kv_dim) // 2, c.ffn // 2)
    tiny = replace(mp.TINY_TILING, round_programs=4, dot_round=True)
    d = mp.CONFIGS["tiny"].layer
    tt = dot_tiles(tiny, d.hidden, d.q_dim + 2 * d.kv_dim, d.ffn)
    assert (tt.bn, tt.bk, tt.qkv_bn, tt.qkv_bk, tt.ffn_bn, tt.ffn_bk) == (16, 64, 32, 32, 64, 16)  # (plain: 32, 32)
    # quantized layers (dot_bk 256 there: whole blocks): K steps of whole blocks, where gate/up's
    # 256 x 32 / 64 = 128 would cut a Q4_K block of 256 (the build refuses such a tile)
    q4k = WeightTypes(tuple(sorted({k: DType.Q4_K for k in ("w_qkv", "wo", "wg", "wu", "wd")}.items())))
    rounded = for_weights(own, q4k, 8)
    step = build_step(cfg, DType.BF16, h200, 8, rounded, cache=1024, wtypes=q4k)
    assert {f.name for f in step.functions} >= {"gemv_norm_swiglu_tile", "gemv_residual_tile"}
    qt = dot_tiles(rounded, c.hidden, c.q_dim + 2 * c.kv_dim, c.ffn, 256)
    assert (qt.bk, qt.qkv_bk, qt.ffn_bk) == (512, 256, 256) and (qt.bn, qt.ffn_bn) == (16, 64)
    base = run("model", config="tiny", cache=64, batch=2, device="cpu", check=True, seed=23)
    monkeypatch.setattr(mp, "TINY_TILING", tiny)
    res = run("model", config="tiny", cache=64, batch=2, device="cpu", check=True, seed=23)
    assert res["rel_err"] <= 1e-5, res
    assert res["tasks"] != base["tasks"]


@pytest.mark.parametrize("config,new", [("tiny", 20), ("tiny-swa", 70)])
def test_one_sequence_ropes_in_its_projection_and_generates_the_reference_tokens(config, new):
    """Batch 1: RoPE and the cache append in the q, k, v projection's epilogue (one task a layer
    fewer than the same step with ``rope_in_qkv`` off), and generation token by token is the
    reference model's (tiny-swa wraps its 64-slot ring)."""
    from dataclasses import replace

    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights(config, seed=15)
    prompt = torch.randint(0, w.config.vocab, (9,), generator=torch.Generator().manual_seed(16)).tolist()
    want = ReferenceModel(w).generate([prompt], new, stop_ids=())
    tasks = {}
    for fused in (True, False):
        gen = Generator(w, "cpu", DType.F32, tiling=replace(mp.tiling_for(w.config), rope_in_qkv=fused))
        try:
            got = gen.generate([prompt], new, stop_ids=())
        finally:
            gen.close()
        assert got.tokens == want, fused
        tasks[fused] = got.tasks_per_step
    assert tasks[False] - tasks[True] == w.config.layers


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_one_sequence_on_triton(executor):
    """The projection with RoPE and the append as a Triton kernel (one-trip loops choosing the
    store), both executors, a full cache."""
    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor=executor,
              check=True, seed=17)
    assert res["rel_err"] <= 1e-5, res


def test_estimate_counts_each_cache_with_the_graph_a_run_builds():
    """A decode step's structure depends on its cache (two combine levels past 16 chunks, wider
    chunks past 128): ``pto estimate`` counts each swept cache with the module built for it, so
    its tasks are a run's at every cache, whichever shape the sweep starts from."""
    from pto.cli.commands.estimate import estimate

    res = estimate("model", [256, 1024], config="tiny", shape={"cache": 1024, "batch": 1})
    runs = [run("model", config="tiny", cache=c, batch=1, device="cpu")["tasks"] for c in (256, 1024)]
    assert [r["tasks"] for r in res["rows"]] == runs


def test_the_persistent_executors_tiles_by_model_size_and_device():
    """The megakernel's own tiles (``tiling_for_executor``): models of hidden 2048 and more take
    its wide blocks on any device (the o and down projections one round of items over its
    programs), models of 256-2047 blocks of 8 on a GPU only (the CPU's interpreter keeps the CPU
    tiling), the tiny ones and the wave executor the configuration's."""
    from pto.orchestration.model.program import (
        CONFIGS,
        MEGAKERNEL_NARROW,
        MEGAKERNEL_WIDE,
        megakernel_block,
        tiling_for,
        tiling_for_executor,
    )

    from pto.machine.target import get

    cpu = get("x86_64")
    for name, cfg in CONFIGS.items():
        for target in (None, cpu):
            base, mk = tiling_for(cfg, target), tiling_for_executor(cfg, "persistent", target)
            assert tiling_for_executor(cfg, "waves", target) == base
            if cfg.layer.hidden >= 2048:
                assert all(getattr(mk, k) == v for k, v in MEGAKERNEL_WIDE.items()), name
                assert mk.bn == mk.o_bn == megakernel_block(cfg.layer.hidden, target), name
            elif cfg.layer.hidden >= 256 and target is None:
                assert all(getattr(mk, k) == v for k, v in MEGAKERNEL_NARROW.items()) and mk != base, name
            else:
                assert mk == base, (name, target)


def test_a_run_of_the_model_builds_the_tiles_of_its_executor(monkeypatch):
    """``--tiles auto`` (the default): a job of the model program on the persistent executor
    builds its step in the megakernel's tiles, on the waves (or native) executor in the
    launches', as ``pto generate`` does; ``--tiles`` names either. SmolLM2's step for an H200:
    the megakernel's blocks of 8 outputs make its projections' tasks half the items of the
    launches' blocks of 4 (resolved without a GPU by making torch report one; built, not run)."""
    from pto.orchestration.model.program import MEGAKERNEL_NARROW

    import pto.machine.device
    from pto.engine import build_module_graph, resolve
    from pto.errors import UsageError
    from pto.exec.plan import make_plan, takes_runs

    monkeypatch.setattr(pto.machine.device, "cuda_available", lambda: True)

    def job(executor, shape=None, **options):
        return resolve("model", device="cuda", target="cuda_h200", executor=executor, config="smollm2-135m",
                       dtype="bf16", options=options, shape=shape)

    assert job("persistent").settings["tiles"] == "persistent" == job("auto", {"batch": 8}).settings["tiles"]
    assert job("auto").settings["tiles"] == "waves"  # (one sequence of SmolLM2 runs on the launches)
    assert job("waves").settings["tiles"] == "waves" and job("persistent", tiles="waves").settings["tiles"] == "waves"
    assert resolve("model", device="cpu").settings["tiles"] == "waves"  # (the native executor: the launches')

    def gemv_items(j):
        prog, s = j.program, j.settings
        built = build_module_graph(prog.build(s, prog.shape({"cache": 1024, "batch": 1})), {"B": 1, "C": 1024})
        try:
            plan = make_plan(built.graph, list(built.graph.tensor_ids), {})
        finally:
            built.graph.close()
        return sum(int(plan.nitems[t]) for t in range(plan.n_tasks) if takes_runs(plan.variants[t]))

    mk, launches = gemv_items(job("persistent")), gemv_items(job("waves"))
    assert MEGAKERNEL_NARROW == {"bn": 8} and 0.45 * launches <= mk <= 0.55 * launches, (mk, launches)
    with pytest.raises(UsageError, match=r"model: unknown tiles 'wide' \(choose from auto, waves, persistent\)"):
        job("waves", tiles="wide")


def test_the_megakernels_block_makes_one_round_of_items_over_its_programs():
    """``megakernel_block``: the narrowest power of two from 4 to 16 whose items (a projection's
    outputs over the block) are at most two a multiprocessor, else 16; the 8B model's 4096
    outputs on an H200 take 16 (256 items on 264 programs), the 1B model's 2048 take 8."""
    from pto.orchestration.model.program import megakernel_block

    from pto.machine.target import get

    h200, a100 = get("cuda_h200"), get("cuda_a100")
    assert megakernel_block(4096) == megakernel_block(4096, h200) == 16
    assert megakernel_block(2048, h200) == 8 and megakernel_block(576, h200) == 4
    for target in (h200, a100):
        programs = 2 * target.sm_count
        for outputs in range(64, 20000, 61):
            block = megakernel_block(outputs, target)
            fits = [b for b in (4, 8, 16) if -(-outputs // b) <= programs]
            assert block == (fits[0] if fits else 16), (outputs, target.name)


# the FFN in one level (DecodeTiling.fold_down) ---------------------------------------------------


@pytest.mark.parametrize("config,batch", [("tiny", 1), ("tiny", 3), ("tiny-swa", 2)])
def test_the_ffn_in_one_level_matches_the_reference(monkeypatch, config, batch):
    """``fold_down``: the FFN one task a layer (its programs add the down projection into the
    f32 residual stream), the o projection storing its sum to x2 and x; on the torch backend the
    step gives the reference's logits and tokens, with one task a layer fewer."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType

    # (hidden 64: the down projection's second step runs past its end; dense_rows: a GPU's
    # build, as the names below are taken from, keeps 3 rows unpadded, as a CPU does)
    folded = replace(mp.TINY_TILING, fold_down=8, fold_dn=48, dense_rows=4)
    m = build_step(mp.CONFIGS[config], DType.F32, None, batch, folded)
    names = {f.name for f in m.functions}
    assert "gemv_norm_swiglu_down_tile" in names and "gemv_norm_swiglu_tile" not in names
    x = {t.name: t.dtype for t in m.entry_function.tensors}
    assert x["x"] is DType.F32 and x["x2"] is DType.F32 and "hb" not in x
    tasks = {}
    for t in (mp.TINY_TILING, folded):
        monkeypatch.setattr(mp, "TINY_TILING", t)
        res = run("model", config=config, cache=64, batch=batch, device="cpu", check=True, seed=21)
        assert res["rel_err"] <= 1e-5, res
        tasks[t.fold_down] = res["tasks"]
    assert tasks[0] - tasks[8] == mp.CONFIGS[config].layers


def test_the_ffn_folds_only_where_its_gemvs_run_unpadded_dense_rows_on_one_rank():
    from dataclasses import replace

    from pto.orchestration.model.tiling import DecodeTiling, folds_down

    t = DecodeTiling(fold_down=8)
    assert folds_down(t, 1, False, True) and folds_down(t, 15, False, True)
    assert not folds_down(t, 16, False, True)  # tensor-core dots of 16 rows
    assert not folds_down(t, 1, True, True)  # quantized weights
    assert not folds_down(t, 1, False, False)  # a rank's partial sums
    assert not folds_down(replace(t, wt=False), 1, False, True)
    assert not folds_down(DecodeTiling(), 1, False, True)


def test_a_negative_fold_is_one_error():
    from pto.orchestration.model.tiling import DecodeTiling

    from pto.errors import UsageError

    with pytest.raises(UsageError, match="fold_down=-2: the folded FFN's block is positive"):
        DecodeTiling(fold_down=-2)
    with pytest.raises(UsageError, match="fold_dn=0"):
        DecodeTiling(fold_dn=0)


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor,batch", [("waves", 1), ("persistent", 1), ("persistent", 2)])
def test_the_ffn_in_one_level_on_triton(monkeypatch, executor, batch):
    """The folded FFN's kernel (atomic adds) and the o projection's two stores under the Triton
    interpreter, both executors."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, fold_down=8))
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", backend="triton", executor=executor,
              check=True, seed=23)
    assert res["rel_err"] <= 1e-5, res


@pytest.mark.parametrize("fields,fewer", [({"fold_down": 8}, 1), ({"split_down": 32}, 0)], ids=["fold", "parts"])
def test_generation_adding_into_the_residual_gives_the_reference_tokens(fields, fewer):
    """The FFN in one level (a task a layer fewer) and the down projection by parts (as many
    tasks): 70 tokens of two prompts on the f32 residual stream, the reference's."""
    from dataclasses import replace

    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = _random_weights("tiny-swa", seed=25)
    prompts = [torch.randint(0, w.config.vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (5, 11)]
    want = ReferenceModel(w).generate(prompts, 70, stop_ids=())
    gen = Generator(w, "cpu", DType.F32, tiling=replace(mp.tiling_for(w.config), **fields))
    try:
        got = gen.generate(prompts, 70, stop_ids=())
        assert got.tasks_per_step == _tasks_per_step(w, len(prompts)) - fewer * w.config.layers
    finally:
        gen.close()
    assert got.tokens == want


def _tasks_per_step(w, batch: int) -> int:
    """The tasks of the unfolded step of ``batch`` sequences (its generation's count)."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model import program as mp

    from pto.ir.dtypes import DType

    gen = Generator(w, "cpu", DType.F32, tiling=mp.tiling_for(w.config))
    try:
        return gen.generate([[1] * 3] * batch, 1, stop_ids=()).tasks_per_step
    finally:
        gen.close()


# the down projection by parts (DecodeTiling.split_down) --------------------------------------------


@pytest.mark.parametrize("config,batch,quantize", [("tiny", 1, None), ("tiny", 3, None), ("tiny-swa", 2, None),
                                                   ("tiny", 1, "q4_0"), ("tiny", 2, "q8_0")])
def test_the_down_projection_by_parts_matches_the_reference(monkeypatch, config, batch, quantize):
    """``split_down``: the down projection a program per part of its contraction and output
    block, each adding into the f32 residual stream, the o projection storing its sum to x2 and
    x; the step gives the reference's logits and tokens with as many tasks (dense and quantized
    weights, the CPU's C kernels)."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType

    split = replace(mp.TINY_TILING, split_down=64, dense_rows=4)  # (tiny's 160 in parts of 32)
    m = build_step(mp.CONFIGS[config], DType.F32, None, batch, split)
    (down,) = [f for f in m.functions if f.name == "gemv_add_tile"]
    assert str(down.parallel.extent) == str(5 * 2)  # 5 parts of 2 output blocks of 32
    x = {t.name: t.dtype for t in m.entry_function.tensors}
    assert x["x"] is DType.F32 and x["x2"] is DType.F32 and "hb" in x
    tasks = {}
    for t in (mp.TINY_TILING, split):
        monkeypatch.setattr(mp, "TINY_TILING", t)
        res = run("model", config=config, cache=64, batch=batch, device="cpu", check=True, seed=31,
                  **({"quantize": quantize} if quantize else {}))
        assert res["rel_err"] <= 1e-5, res
        tasks[t.split_down] = res["tasks"]
    assert tasks[0] == tasks[64]


def test_the_down_projection_splits_where_its_gemvs_run_unpadded_rows_on_one_rank():
    from dataclasses import replace

    from pto.orchestration.model.tiling import DecodeTiling, residual_f32, splits_down

    t = DecodeTiling(split_down=2048)
    assert splits_down(t, 1, True) and splits_down(t, 15, True) and residual_f32(t, 1, True, True)
    assert not splits_down(t, 16, True)  # tensor-core dots of 16 rows
    assert not splits_down(t, 1, False)  # a rank's partial sums
    assert not splits_down(replace(t, wt=False), 1, True)
    assert not splits_down(DecodeTiling(), 1, True) and not residual_f32(DecodeTiling(), 1, False, True)
    from pto.errors import UsageError

    with pytest.raises(UsageError, match="split_down=-1: the down projection's part is positive"):
        DecodeTiling(split_down=-1)


@pytest.mark.parametrize("config,split,wd,part,step", [("smollm2-135m", 1024, None, 768, 768),
                                                        ("smollm2-135m", 512, None, 512, 512),
                                                        ("llama3-8b", 2048, None, 2048, 1024),
                                                        ("llama3-8b", 4096, "q4_k", 3584, 1792),
                                                        ("llama3.2-1b", 100, None, 64, 64)])
def test_the_parts_are_equal_and_whole_steps(config, split, wd, part, step):
    """The parts: the widest width that divides the contraction in whole blocks (16, or the
    weight's block) and is at most ``split_down``; the K step the widest up to ``bk`` that divides
    a part (SmolLM2's 1,536 in parts of at most 1,024: two of 768; the 8B's 14,336 in Q4_K blocks of
    256, parts of at most 4,096: four of 3,584, in steps of 1,792)."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.quantized import DENSE, WeightTypes, for_weights

    from pto.ir.dtypes import DType, dtype_of
    from pto.machine.target import get

    cfg = mp.CONFIGS[config]
    wt = DENSE if wd is None else WeightTypes(tuple(sorted({k: dtype_of(wd) for k in ("w_qkv", "wo", "wg", "wu",
                                                                                          "wd")}.items())))
    t = for_weights(mp.tiling_for(cfg).with_fields(split_down=split), wt, 1)
    fn = functions(cfg, DType.BF16, get("cuda_h200"), t, 1, wtypes=wt).down
    blocks = -(-cfg.layer.hidden // t.bn)
    assert str(fn.parallel.extent) == str(cfg.layer.ffn // part * blocks)
    tiles = {x.name: x for x in fn.tiles}
    assert str(tiles["b"].cols) == str(step)


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor,batch", [("waves", 1), ("persistent", 1), ("persistent", 2)])
def test_the_down_projection_by_parts_on_triton(monkeypatch, executor, batch):
    """The parts' kernel (atomic adds, a program per part and block) and the o projection's two
    stores under the Triton interpreter, both executors."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, split_down=32))
    res = run("model", config="tiny", cache=64, batch=batch, device="cpu", backend="triton", executor=executor,
              check=True, seed=29)
    assert res["rel_err"] <= 1e-5, res


def test_the_folded_ffn_takes_a_narrower_down_step_where_its_tiles_do_not_fit():
    """On a CPU (48 KiB of on-chip memory) the 1B's folded FFN at 8 rows takes the down
    projection in steps of 512 (its default, 1024, does not fit); a step given does not narrow."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.errors import SramError
    from pto.ir.dtypes import DType
    from pto.machine.target import host

    def down_step(t):
        m = build_step(mp.CONFIGS["llama3.2-1b"], DType.F32, host(), 8, t)
        (f,) = [f for f in m.functions if f.name == "gemv_norm_swiglu_down_tile"]
        return {x.name: x for x in f.tiles}["bd"].rows

    t = replace(mp.CPU_TILING, fold_down=8)
    assert str(down_step(t)) == "512" and str(down_step(replace(t, fold_dn=256))) == "256"
    with pytest.raises(SramError):
        down_step(replace(t, fold_dn=2048))


def test_a_wide_heads_attention_part_takes_the_key_tile_that_fits_a_cpu():
    """The 8B's heads of 128 in f32: tiles of 64 keys need 84 KiB of a CPU's 48; the step takes
    the widest that fits (16), where it was one SramError before any work."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType
    from pto.machine.target import host

    cfg = mp.CONFIGS["llama3-8b"]
    m = build_step(cfg, DType.F32, host(), 1, mp.tiling_for(cfg, host()), cache=1024)
    (part,) = [f for f in m.functions if f.name == "decode_attn_part"]
    assert str({t.name: t for t in part.tiles}["kt"].rows) == "16"
