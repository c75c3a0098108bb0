"""The decode step of a whole model on the GPU in bf16 (skipped without CUDA): SmolLM2-135M's
configuration with random weights, a cache that is not a power of two, each executor. Its logits
must be no further from a float64 run of the same step than the same step computed by torch in
bf16 (the reference model's ops, as transformers computes them) is, within 5%; the chosen token
and the next position are the float64 run's where the float64 top two logits are not within
bf16's rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("executor", ["persistent", "waves"])
@pytest.mark.parametrize("batch,cache", [(1, 768), (3, 1280)])
def test_smollm2_step_in_bf16_is_as_close_to_float64_as_torch_bf16(executor, batch, cache):
    check_step(executor, batch, cache)


@pytest.mark.parametrize("executor", ["persistent", "waves"])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_long_cache_in_wide_chunks_and_two_combine_levels_on_the_gpu(executor, batch, monkeypatch):
    """The long-cache path at a size the GPU checks quickly: at most 64 chunks a sequence
    (``long_chunks``), so an 8192-slot cache takes chunks of 128 (two key tiles a task), and
    spans of 8 chunks (``span``), so the combine runs in two levels (the merge kernel, then the
    combine over the spans); as close to float64 as torch's bf16."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import spans

    t = replace(mp.TILING, long_chunks=64, span=8)
    assert t.for_cache(8192).chunk == 128 and spans(8192, t.for_cache(8192)) == 8
    monkeypatch.setattr(mp, "TILING", t)
    check_step(executor, batch, 8192)


@pytest.mark.parametrize("batch", [1, 2])
def test_thirty_two_chunks_combine_at_once_on_the_gpu(batch):
    """A 2048-slot cache is 32 chunks of 64: one combine reads a head's 32 partial states at once
    (no merge level); as close to float64 as torch's bf16."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import spans

    t = mp.TILING.for_cache(2048)
    assert 2048 // t.chunk == 32 and spans(2048, t) == 0
    check_step("waves", batch, 2048)


@pytest.mark.parametrize("executor", ["persistent", "waves"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_ffn_in_one_level_on_the_gpu(executor, batch, monkeypatch):
    """``fold_down``: the FFN one task a layer whose programs add the down projection into the f32
    residual stream (atomic adds in any order) on the GPU: as close to float64 as torch's bf16."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TILING", replace(mp.TILING, fold_down=8))  # (SmolLM2's; 3 rows unpadded)

    def folded(runner, inputs, out):
        assert "gemv_norm_swiglu_down_tile" in {f.name for f in runner.module.functions}

    check_step(executor, batch, 1024, folded)


@pytest.mark.parametrize("executor", ["persistent", "waves"])
@pytest.mark.parametrize("batch,quantize", [(1, None), (3, None), (1, "q4_0")])
def test_the_down_projection_by_parts_on_the_gpu(executor, batch, quantize, monkeypatch):
    """``split_down``: the down projection's contraction in parts, each program adding its product
    into the f32 residual stream (atomic adds in any order), dense and quantized, on the GPU: as
    close to float64 as torch's bf16."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TILING", replace(mp.TILING, split_down=512))  # (SmolLM2's 1536: three parts)

    def split(runner, inputs, out):
        assert "gemv_add_tile" in {f.name for f in runner.module.functions}

    check_step(executor, batch, 1024, split, options={"quantize": quantize} if quantize else None)


@pytest.mark.parametrize("executor", ["persistent", "waves"])
@pytest.mark.parametrize("cache,fields", [(1024, {}), (8192, {"long_chunks": 64, "span": 8})])
def test_the_combine_in_the_o_projection_on_the_gpu(executor, cache, fields, monkeypatch):
    """``fold_combine``: one sequence's o projection combining the heads' partial states itself
    (a long cache's spans merged first) on the GPU: as close to float64 as torch's bf16."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TILING", replace(mp.TILING, fold_combine=16, **fields))

    def folded(runner, inputs, out):
        names = {f.name for f in runner.module.functions}
        assert "decode_attn_combine_o" in names and "decode_attn_combine_parts" not in names

    check_step(executor, 1, cache, folded)


@pytest.mark.parametrize("config,batch", [("smollm2-135m", 1), ("smollm2-135m", 3), ("llama3.2-1b", 1)])
def test_data_dependencies_on_the_gpu(config, batch, monkeypatch):
    """The persistent executor with ``PTO_MK_DEPS=data`` (an item waits only for the predecessor
    items whose data its own meets: a RoPE item of one head for that head's projection items)
    on the GPU, where programs run at once and an item may start ahead of its task's other
    predecessors: the step as close to float64 as torch's bf16, and the kernel's counters the
    data's."""
    monkeypatch.setenv("PTO_MK_DEPS", "data")

    def inspect(runner, inputs, out):
        assert runner.executor.plan.boxes is not None
        data = sum(int(k.counters.init[k.counters.counter].sum()) for k in runner.executor.kernels)
        task = sum(int(k.plan.pending_items[k.plan.items[:, 0]].sum()) for k in runner.executor.kernels)
        assert data < task

    check_step("persistent", batch, 1024, inspect, config=config)


@pytest.mark.parametrize("config,batch", [("smollm2-135m", 1), ("smollm2-135m", 3), ("llama3.2-1b", 1)])
def test_inline_items_on_the_gpu(config, batch, monkeypatch):
    """The persistent executor with inline items (``PTO_MK_INLINE=on``: the item that alone waits
    on a counter, one attention combine a layer among them, runs on the program whose release ends the
    count, without a poll; its acquire the release's acq_rel atomic) on the GPU, where the parts
    finish on many programs at once: the step as close to float64 as torch's bf16, and every
    segment's items taken once (``check``)."""
    monkeypatch.setenv("PTO_MK_INLINE", "on")

    def inspect(runner, inputs, out):
        kernels = runner.executor.kernels
        assert all(k.inline for k in kernels) and any((k.inline_items >= 0).any() for k in kernels)
        runner.executor.check()

    check_step("persistent", batch, 1024, inspect, config=config)


@pytest.mark.parametrize("env,value", [("PTO_MK_RUNS", "8"), ("PTO_MK_PREFETCH", "light")])
def test_the_megakernels_runs_and_light_prefetch_on_the_gpu(env, value, monkeypatch):
    """SmolLM2's step on the persistent executor with its GEMVs in runs (8 items a task at most:
    its tasks have fewer items than ``auto``'s round) or with the L2 prefetch only after the
    tasks that are not GEMVs: as close to float64 as torch's bf16, the plan as asked."""
    monkeypatch.setenv(env, value)

    def inspect(runner, inputs, out):
        plan = runner.executor.plan
        if env == "PTO_MK_RUNS":
            assert plan.run is not None and any(b.runs for b in plan.branches)
        else:
            assert runner.executor.kernels[0].prefetch == 1
            assert {b.prefetch for b in plan.branches if b.early} == {True, False}

    check_step("persistent", 1, 768, inspect)


@pytest.mark.parametrize("batch", [1, 3])
def test_weights_loaded_before_the_wait_change_no_bit(batch, monkeypatch):
    """The "auto" PDL policy (each GEMV's weights, residual and position loaded before it waits for
    the previous launch, the launch before it signalling right after its own wait) computes what
    "late" computes, bit for bit, in three steps: only loads of memory the launch just before
    does not write move, and the arithmetic is the same."""
    from pto.engine import Runner, resolve

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    outs = []
    for policy in ("late", "auto"):
        monkeypatch.setenv("PTO_PDL", policy)
        job = resolve("model", device="cuda", backend="triton", executor="waves", config="smollm2-135m", dtype="bf16")
        shape = job.program.shape({"cache": 768, "batch": batch})
        runner = Runner(job, shape)
        try:
            backend = runner.executor.backend
            assert backend.pdl == policy
            inputs = job.program.inputs(job.settings, shape, "cuda", seed=batch)
            steps = []
            for _ in range(3):  # each step from the token the last one chose (at the same positions:
                out = runner(inputs)  # one sequence's cache is full)
                steps.append({k: v.clone() for k, v in out.items()})
                inputs = {**inputs, "tok": steps[-1]["tok"]}
            outs.append(steps)
            assert any(k.waits for k in backend._kernels.values()) == (policy == "auto")
        finally:
            runner.close()
    for late, auto in zip(*outs):
        for name in ("logits", "tok", "pos"):
            assert torch.equal(late[name], auto[name]), name


@pytest.mark.parametrize("batch,cache", [(1, 768), (3, 1280)])
def test_the_step_split_by_resource_class_on_the_gpu(batch, cache, monkeypatch):
    """``PTO_MK_SPLIT=auto``: the LM head and the argmax a launch of their own, each segment's
    megakernel compiled for its own branches (its registers and programs a multiprocessor in the
    report); as close to float64 as torch's bf16, and the CUDA graph of both launches replays
    the first run's bits."""
    monkeypatch.setenv("PTO_MK_SPLIT", "auto")

    def inspect(runner, inputs, out):
        ex = runner.executor
        assert len(ex.kernels) == 2 and [b.fn.name for b in ex.segments[1].branches] == \
            ["lmhead_argmax_tile", "argmax_advance"]
        rep = ex.report()
        assert [s["items"] for s in rep["segments"]] == [s.n_items for s in ex.segments]
        assert all(s["regs"] > 0 and s["programs_per_sm"] >= 1 for s in rep["segments"])
        again = runner(inputs)  # a replay: the captured CUDA graph of both launches
        assert runner.cuda_graph is not None
        for k, v in out.items():
            assert torch.equal(again[k], v), k
        if batch == 1:  # each branch compiled alone (compiled, never launched: the outputs stay)
            alone = ex.branch_resources()
            assert [b["branch"] for b in alone] == [b.fn.variant_name for b in ex.plan.branches]
            optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
            assert all(b["regs"] > 0 and 0 <= b["shared"] <= optin for b in alone)
            assert all(torch.equal(runner.tensors[k], v) for k, v in out.items())

    check_step("persistent", batch, cache, inspect)


def check_step(executor: str, batch: int, cache: int, inspect=None, config: str = "smollm2-135m",
                options: dict | None = None) -> None:
    """The step's first run against float64 (``inspect(runner, inputs, outputs)``: more checks
    before the runner closes; ``options``: the model program's, e.g. ``quantize``)."""
    from pto.engine import Runner, rel_err, resolve

    job = resolve("model", device="cuda", backend="triton", executor=executor, config=config, dtype="bf16",
                  options=options or {})
    shape = job.program.shape({"cache": cache, "batch": batch})
    runner = Runner(job, shape)
    try:
        inputs = job.program.inputs(job.settings, shape, "cuda", seed=batch)
        out = {k: v.clone() for k, v in runner(inputs).items()}
        assert runner.executor.name == executor
        if inspect is not None:
            inspect(runner, inputs, out)
    finally:
        runner.close()
    f64 = job.program.reference(job.settings, shape, inputs, torch.float64)
    bf16 = job.program.reference(job.settings, shape, inputs, torch.bfloat16)
    ours, theirs = rel_err(out["logits"], f64["logits"]), rel_err(bf16["logits"], f64["logits"])
    # both round to bf16 at every layer, at different points (pto's fused kernels keep f32 across
    # a norm and its product, torch's ops round between them): their errors are of one size, and
    # either may be the closer by a few percent (an H200: 0.02432 against 0.02397 at an 8192-slot
    # cache); a wrong combine or a stale cache row is many times torch's
    assert ours <= 1.05 * max(theirs, 1e-3), (ours, theirs)
    assert torch.equal(out["pos"], f64["pos"].to(out["pos"].dtype))
    top2 = f64["logits"].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp(min=1)  # beyond bf16's rounding
    assert torch.equal(out["tok"][clear].view(-1).long(), f64["tok"][clear].view(-1).long())


def test_auto_makes_room_for_two_programs_of_the_layers_where_one_fits(monkeypatch):
    """``PTO_PER_SM=auto`` (the default) on the Llama-3.2-1B shape's step in blocks of 16 outputs
    in K steps of 1024 (the megakernel's tiles before its blocks by programs, which already fit
    two a multiprocessor): its layers' kernel holds one program a multiprocessor as it asks
    (``PTO_PER_SM=0``), so auto rebuilds it with room for two
    (its pipelines lowered, registers capped) and keeps it (no spills); the LM head's 8-warp
    launch keeps its count. Its logits are the wave executor's step's, within the rounding of
    bf16 sums in another order (relative 2e-2, the bound the executors are compared at), and so
    is its token where the top two logits differ by more."""
    from dataclasses import replace

    from pto.orchestration.model.program import CONFIGS, random_weights, tiling_for

    from pto.engine import rel_err

    cfg = CONFIGS["llama3.2-1b"]
    wide = replace(tiling_for(cfg), bn=16, qkv_bn=16, o_bn=16, ffn_bn=16, ffn_bk=1024)
    w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
    logits, infos = {}, {}
    for executor, per_sm in (("waves", "0"), ("persistent", "0"), ("persistent", "auto")):
        monkeypatch.setenv("PTO_PER_SM", per_sm)
        gen, step = _generator_step(w, executor, [300], [17], cache=512, seed=1,
                                    tiling=wide if executor == "persistent" else None)
        try:
            step()
            logits[executor, per_sm] = step.tensors["logits"].float().clone()
            if executor == "persistent":
                infos[per_sm] = [k.compiled_info for k in step.executor.kernels]
        finally:
            gen.close()
    one, auto = infos["0"], infos["auto"]
    assert one[0]["programs_per_sm"] == 1 and auto[0]["programs_per_sm"] == 2, (one, auto)
    assert auto[0]["spills"] == 0, auto
    assert auto[-1]["warps"] > 4 and auto[-1]["programs_per_sm"] == one[-1]["programs_per_sm"], (one, auto)
    waves = logits["waves", "0"]
    top2 = waves.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp(min=1)
    for key in (("persistent", "0"), ("persistent", "auto")):
        assert rel_err(logits[key], waves) <= 2e-2, key
        assert torch.equal(logits[key].argmax(-1)[clear], waves.argmax(-1)[clear]), key


def test_more_makes_room_while_the_megakernel_does_not_spill(monkeypatch):
    """``PTO_PER_SM=more`` with the register-saving forms (``PTO_MK_AHEAD=after``,
    ``PTO_MK_CALLS=noinline``, ``PTO_MK_STRIDES=constant``) on the Llama-3.2-1B shape's step: each
    kernel holds at least the programs a multiprocessor it holds uncapped (``PTO_PER_SM=0``) and
    spills nothing where that one did not, the GEMVs' runs cut for the most programs a
    multiprocessor a kernel holds (the plan built again where that is more than two); its logits
    are the wave executor's within the rounding of bf16 sums in another order (relative 2e-2), and
    so is its token where the top two logits differ by more."""
    from pto.orchestration.model.program import CONFIGS, random_weights

    from pto.engine import rel_err

    for name, value in (("PTO_MK_AHEAD", "after"), ("PTO_MK_CALLS", "noinline"), ("PTO_MK_STRIDES", "constant")):
        monkeypatch.setenv(name, value)
    cfg = CONFIGS["llama3.2-1b"]
    w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
    logits, infos, plans = {}, {}, {}
    for executor, per_sm in (("waves", "0"), ("persistent", "0"), ("persistent", "more")):
        monkeypatch.setenv("PTO_PER_SM", per_sm)
        gen, step = _generator_step(w, executor, [300], [17], cache=512, seed=1)
        try:
            step()
            logits[executor, per_sm] = step.tensors["logits"].float().clone()
            if executor == "persistent":
                infos[per_sm] = [k.compiled_info for k in step.executor.kernels]
                plans[per_sm] = step.executor.plan
        finally:
            gen.close()
    for uncapped, more in zip(infos["0"], infos["more"]):
        assert more["programs_per_sm"] >= uncapped["programs_per_sm"], (infos["0"], infos["more"])
        assert more["spills"] == 0 or more["spills"] <= uncapped["spills"], (infos["0"], infos["more"])
    # the runs cut for the most programs a multiprocessor any kernel holds (at least two)
    share = max(2, *(i["programs_per_sm"] for i in infos["more"]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    p = plans["more"]
    runs = p.run > 1
    assert runs.any()
    assert np.array_equal(p.run[runs], -(-p.parallel[runs] // (share * sms))), share
    waves = logits["waves", "0"]
    top2 = waves.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp(min=1)
    for key in (("persistent", "0"), ("persistent", "more")):
        assert rel_err(logits[key], waves) <= 2e-2, key
        assert torch.equal(logits[key].argmax(-1)[clear], waves.argmax(-1)[clear]), key


@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_each_call_of_a_captured_step_is_one_step(executor):
    """The decode step as ``pto generate`` calls it (no inputs: the state carries over): the
    first call runs it, the second captures the CUDA graph and replays it, later calls replay.
    Each call is one step: every position advances by one a call, and the tokens are those of
    the same step's launches without a CUDA graph (the executor's replay), bit for bit."""
    from pto.orchestration.model.program import CONFIGS, random_weights

    cfg = CONFIGS["smollm2-135m"]
    w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(3))
    runs = {}
    for graphed in (True, False):
        gen, step = _generator_step(w, executor, [40, 77], [5, 9], cache=256, seed=4)
        t = step.tensors
        try:
            seen = []
            for k in range(4):
                if graphed or k == 0:
                    step()
                else:
                    step.executor.replay()
                seen.append((t["tok"].clone(), t["pos"].clone()))
            assert (step.cuda_graph is not None) == graphed
            runs[graphed] = seen
        finally:
            gen.close()
    for k, ((tok, pos), (tok0, pos0)) in enumerate(zip(runs[True], runs[False])):
        assert torch.equal(pos.view(-1).cpu(), torch.tensor([41.0 + k, 78.0 + k])), (k, pos)
        assert torch.equal(tok, tok0) and torch.equal(pos, pos0), k


def _generator_step(w, executor: str, pos: list[int], tok: list[int], cache: int, seed: int, tiling=None):
    """A generator on ``w`` and its decode step for ``len(pos)`` sequences of ``cache`` slots
    (``pto generate``'s step: the executor's own tiles, or ``tiling``), its caches random
    (seeded), each sequence at its position with its token; (generator, step)."""
    from pto.orchestration.llm.generate import Generator

    from pto.ir.dtypes import DType

    gen = Generator(w, "cuda", DType.BF16, executor=executor, tiling=tiling)
    step = gen.step(len(pos), cache)
    t = step.tensors
    g = torch.Generator(device="cuda").manual_seed(seed)
    t["k_cache"].normal_(generator=g)
    t["v_cache"].normal_(generator=g)
    t["pos"].copy_(torch.tensor(pos, dtype=t["pos"].dtype, device="cuda")[:, None])
    t["tok"].copy_(torch.tensor(tok, dtype=t["tok"].dtype, device="cuda")[:, None])
    return gen, step


@pytest.mark.parametrize("config,prompts,cache", [("smollm2-135m", [77, 30, 77], 128), ("tiny-swa", [101, 101], 64)])
def test_the_prefill_on_the_gpu_fills_the_caches_the_cpus_does(config, prompts, cache):
    """The prefill as ``pto generate`` runs it on the GPU in bf16 (each layer's graph replayed,
    its RoPE tables copied in once a graph, the keys and values stored by runs of slots, the
    layers chained in the graph's own input): every sequence's cache block and its first token
    and position those of the same prefill on the CPU in f32 (the torch backend, which the
    reference model checks), to bf16's rounding over two layers (rel 1e-2: a wrong slot or layer
    would be of the caches' own size). SmolLM2's shape in two layers, two prompts of one
    length (the graph reused); tiny-swa's prompts past its 64-slot ring (two runs of slots)."""
    from dataclasses import replace

    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.quantized import dense_weights

    from pto.engine import rel_err
    from pto.ir.dtypes import DType

    cfg = replace(CONFIGS[config], layers=2)
    g = torch.Generator().manual_seed(43)
    w = random_weights(cfg, torch.float32, g)
    toks = [torch.randint(0, cfg.vocab, (n,), generator=g).tolist() for n in prompts]
    got = {}
    for device, dtype in (("cuda", DType.BF16), ("cpu", DType.F32)):
        gen = Generator(w if device == "cpu" else dense_weights(w, torch.bfloat16), device, dtype,
                        backend="auto" if device == "cuda" else "torch")
        try:
            step = gen.step(len(toks), cache)
            gen.prefill(step, toks, cache)
            got[device] = {k: step.tensors[k].float().cpu() for k in ("k_cache", "v_cache", "tok", "pos")}
        finally:
            gen.close()
    for k in ("k_cache", "v_cache"):
        ref = got["cpu"][k]
        assert float(ref.abs().sum()) > 0, k
        assert rel_err(got["cuda"][k], ref) <= 1e-2, k
    for k in ("tok", "pos"):
        assert torch.equal(got["cuda"][k], got["cpu"][k]), k



def test_lone_dot_projections_at_five_stages_change_no_bit(monkeypatch):
    """SmolLM2's step at 8 sequences on the persistent executor (its projections tensor-core dots
    of the rows padded to 16, each at most one item a multiprocessor): the lone dot projections'
    loops at five stages (the default) compute what the schedules' stages compute
    (``PTO_MK_STAGES=schedule``), bit for bit, in three steps; only the pipeline's depth moves."""
    from pto.backends.triton.megakernel import LONE_DOT_STAGES, lone_dots
    from pto.engine import Runner, resolve

    outs = []
    for stages in ("default", "schedule"):
        if stages == "default":
            monkeypatch.delenv("PTO_MK_STAGES", raising=False)
        else:
            monkeypatch.setenv("PTO_MK_STAGES", stages)
        job = resolve("model", device="cuda", backend="triton", executor="persistent", config="smollm2-135m",
                      dtype="bf16")
        shape = job.program.shape({"cache": 1024, "batch": 8})
        runner = Runner(job, shape)
        try:
            inputs = job.program.inputs(job.settings, shape, "cuda", seed=8)
            steps = []
            for _ in range(3):
                out = runner(inputs)
                steps.append({k: v.clone() for k, v in out.items()})
                inputs = {**inputs, "tok": steps[-1]["tok"]}
            outs.append(steps)
            kernel = runner.executor.kernels[0]
            lone = lone_dots(kernel.plan, torch.cuda.get_device_properties(0).multi_processor_count)
            deep = {v for v, n in kernel.stages.items() if n == LONE_DOT_STAGES}
            assert (deep >= lone and lone) if stages == "default" else not deep & lone
        finally:
            runner.close()
    for a, b in zip(*outs):
        for name in ("logits", "tok", "pos"):
            assert torch.equal(a[name], b[name]), name
