"""Runs (``PTO_MK_RUNS``, :attr:`pto.codegen.triton.megakernel.Branch.runs`): a task with a
parallel axis as at most N work items of consecutive indices, each run by its branch in one loop
after one wait, the loop flattened with the function's own and software-pipelined, so that the
next indices' weights stream through shared memory (Triton 3.6 pipelines a multiply-sum's loads
only so; a GEMV's tasks only). The plan's items cover every index of every task once; the rendered branch waits once,
before its loop, and loads nothing early; under the Triton interpreter the persistent executor's
outputs are the wave executor's, bit for bit; the megakernel of a real decode step compiles for
sm_90 with more asynchronous copies than without runs."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from pto.errors import UsageError  # noqa: E402
from pto.exec.plan import resolve_runs  # noqa: E402
from tests.exec.megakernel_source import called, device_function  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


def _decode_plan(config: str, runs: int, target: str | None = None, **tiles):
    """The plan of ``config``'s decode step in the persistent executor's tiles (``tiles``: some of
    them replaced)."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.backends.triton import TritonBackend
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg = CONFIGS[config]
    tg = get(target) if target else None
    t = replace(tiling_for_executor(cfg, "persistent", tg), **tiles)
    m = build_step(cfg, DType.BF16 if target else DType.F32, tg, 1, t, cache=1024 if target else 64)
    g = build_module_graph(m, {"B": 1, "C": 1024 if target else 64}).graph
    return make_plan(g, list(g.tensor_ids), {}, flags=TritonBackend("cpu").task_flags, runs=runs)


@pytest.mark.parametrize("runs", [0, 1, 2, 3, 7])
def test_the_items_cover_every_index_of_every_task_once(runs):
    """Each task's descriptors (first index, count) tile its parallel extent exactly; a task is
    at most ``runs`` items; only variants with a parallel axis and a run longer than one index
    take a run branch, and their tasks take it."""
    from pto.backends.triton.megakernel import item_descriptors

    plan = _decode_plan("tiny", runs)
    d = item_descriptors(plan)
    parallel = plan.parallel
    for t in range(plan.n_tasks):
        mine = d[d[:, 0] == t]
        covered = np.concatenate([np.arange(p, p + n) for p, n in mine[:, [1, 5]]])
        assert sorted(covered.tolist()) == list(range(parallel[t])), t
        if runs:
            assert len(mine) <= max(runs, 1)
        branch = plan.branches[plan.task_branch[t]]
        assert branch.runs == (len(mine) < parallel[t]), t
        assert (mine[:, 5] > 1).any() == branch.runs
    assert (plan.run is None) == (runs in (0,) or all(not b.runs for b in plan.branches))
    if runs == 0:
        assert (d[:, 5] == 1).all() and plan.n_items == int(parallel.sum())


def test_a_run_branch_waits_once_before_its_pipelined_loop():
    from pto.codegen.triton.megakernel import render_megakernel

    plan = _decode_plan("tiny", 2)
    run = [b for b in plan.branches if b.runs]
    plain = [b for b in plan.branches if not b.runs and b.fn.parallel is not None]
    assert run and plain
    src = render_megakernel(plan.branches, dispatch="static").source
    for b in run:
        name = called(src, plan.branches.index(b))
        assert name.endswith("__run")
        body = device_function(src, name)
        wait, loop = body.index("_pto_wait("), body.index("for _r in tl.range(0, n_run, num_stages=")
        assert wait < loop and body.count("_pto_wait(") == 1 and "flatten=True" in body
        # nothing loads into registers before the wait (the loop's loads all come after); its
        # weights' first bytes prefetch into L2 there, with PREFETCH
        before = body[:wait]
        assert "tl.load(P_" not in before and "if GPU and PREFETCH >= 1:" in before and "_prefetch_l2(" in before
        assert f"{name}(row, p, n," in src
    for b in plain:
        name = called(src, plan.branches.index(b))
        assert not name.endswith("__run") and f"{name}(row, p," in src


def test_a_runs_prefetch_takes_whole_indices_within_its_budget(monkeypatch):
    """The 1B shape's gate/up run in K steps of 2,048 (bf16, ``ffn_bn`` 8 rows of both matrices in one K step of
    2,048: 65,536 bytes an index, and the norm's gain, 4,096 bytes that every index shares)
    prefetches, before its wait, the first trip of its first index where that and the gain are
    more than the budget (64 KiB, the default), else the gain once and as many whole indices,
    from the run's first, as the rest of the budget holds (256 KiB: three); every index's rows
    are its own (``_pq``, the run's first plus ``_q``). ``PTO_MK_PREFETCH_KB`` sets the budget;
    anything but a positive number of KiB is one line naming it."""
    import re

    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.backends.triton.megakernel import resolve_prefetch_kb
    from pto.codegen.triton.common import RenderOptions
    from pto.codegen.triton.megakernel import render_megakernel
    from pto.machine.target import get

    cfg = CONFIGS["llama3.2-1b"]
    t = replace(tiling_for_executor(cfg, "persistent", get("cuda_h200")), ffn_bk=cfg.layer.hidden)
    assert (t.ffn_bn, t.ffn_bk) == (8, 2048)  # (the shapes this test's numbers follow from)
    per_index, gain = 2 * t.ffn_bn * t.ffn_bk * 2, cfg.layer.hidden * 2
    plan = _decode_plan("llama3.2-1b", 264, "cuda_h200", ffn_bk=t.ffn_bk)
    (k,) = [i for i, b in enumerate(plan.branches) if b.runs and b.fn.name == "gemv_norm_swiglu_tile"]
    rows = re.compile(rf"_fr\d+ = \(_pq \* {t.ffn_bn}\) \+ tl\.arange\(0, {t.ffn_bn}\)\[:, None\]")
    for kib in (64, 256):
        src = render_megakernel(plan.branches, RenderOptions(prefetch_bytes=kib * 1024), dispatch="static").source
        name = called(src, k)
        before = device_function(src, name).split("_pto_wait(")[0]
        assert before.count("_prefetch_l2(") == 3 and len(rows.findall(before)) == 2  # wg's and wu's rows, the gain
        assert name.endswith("__run") and "_e" in name  # (the prefetched memrefs in the name)
        if per_index + gain > kib * 1024:
            assert "_pq = i_j0\n" in before and "for _q in" not in before
        else:
            indices = (kib * 1024 - gain) // per_index
            assert indices == 3
            loop = before.index(f"for _q in range(0, tl.minimum(n_run, {indices})):")
            assert "_pq = i_j0 + _q" in before[loop:] and len(rows.findall(before[loop:])) == 2
            assert before[:loop].count("_prefetch_l2(") == 1  # the gain, once
    monkeypatch.delenv("PTO_MK_PREFETCH_KB", raising=False)
    assert resolve_prefetch_kb(None) == 64 and resolve_prefetch_kb(128) == 128
    monkeypatch.setenv("PTO_MK_PREFETCH_KB", "256")
    assert resolve_prefetch_kb(None) == 256 and resolve_prefetch_kb("32") == 32
    for bad in ("0", "-4", "lots", "1.5"):
        monkeypatch.setenv("PTO_MK_PREFETCH_KB", bad)
        with pytest.raises(UsageError, match=rf"^PTO_MK_PREFETCH_KB='{bad}': the megakernel's L2 prefetch budget is "
                                             "a positive number of KiB$"):
            resolve_prefetch_kb(None)


def test_runs_that_prefetch_other_memrefs_are_device_functions_of_their_own():
    """Two branches of the gate/up run that differ only in the memrefs they may prefetch (the
    norm's gain or not) render two device functions, each with its own prefetch, in one kernel."""
    from pto.codegen.triton.common import RenderOptions
    from pto.codegen.triton.megakernel import render_megakernel

    plan = _decode_plan("llama3.2-1b", 264, "cuda_h200")
    (b,) = [b for b in plan.branches if b.runs and b.fn.name == "gemv_norm_swiglu_tile"]
    names = [m.name for m in b.fn.memrefs]
    other = replace(b, pre=tuple(ok and n != "g" for ok, n in zip(b.pre, names)))
    src = render_megakernel([b, other], RenderOptions(), dispatch="static").source
    mine, its = called(src, 0), called(src, 1)
    assert mine != its
    count = [device_function(src, n).split("_pto_wait(")[0].count("_prefetch_l2(") for n in (mine, its)]
    assert count == [3, 2]


def test_quantized_weights_are_not_prefetched():
    """The prefetch walks a tile's region in elements, which a quantized memref's packed rows are
    not: in the 1B shape's step on Q4_K weights, no branch (runs or not) prefetches from one."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.backends.triton import TritonBackend
    from pto.codegen.triton.megakernel import render_megakernel
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, tg = CONFIGS["llama3.2-1b"], get("cuda_h200")
    q4k = WeightTypes(tuple(sorted({k: DType.Q4_K for k in ("w_qkv", "wo", "wg", "wu", "wd")}.items())))
    t = for_weights(tiling_for_executor(cfg, "persistent", tg), q4k, 1)
    g = build_module_graph(build_step(cfg, DType.BF16, tg, 1, t, cache=1024, wtypes=q4k), {"B": 1, "C": 1024}).graph
    try:
        plan = make_plan(g, list(g.tensor_ids), {}, flags=TritonBackend("cpu").task_flags, runs=264)
    finally:
        g.close()
    src = render_megakernel(plan.branches, dispatch="static").source
    quantized = 0
    for k, b in enumerate(plan.branches):
        before = device_function(src, called(src, k)).split("_pto_wait(")[0]
        for m in b.fn.memrefs:
            if m.dtype.is_quantized:
                quantized += 1
                assert f"P_{m.name} + _fr" not in before, (b.fn.variant_name, m.name)
    assert quantized >= 5 and any(b.runs for b in plan.branches)


def test_the_setting_takes_counts_auto_and_off(monkeypatch):
    monkeypatch.delenv("PTO_MK_RUNS", raising=False)
    assert resolve_runs(None, 132) == 264  # the default, auto: two a multiprocessor
    assert resolve_runs("auto", 132) == 264 and resolve_runs(5, 132) == 5 and resolve_runs(0, 132) == 0
    monkeypatch.setenv("PTO_MK_RUNS", "0")
    assert resolve_runs(None, 132) == 0
    monkeypatch.setenv("PTO_MK_RUNS", "auto")
    assert resolve_runs(None, 4) == 8
    monkeypatch.setenv("PTO_MK_RUNS", "many")
    with pytest.raises(UsageError, match=r"PTO_MK_RUNS='many': the most work items of a task's runs"):
        resolve_runs(None, 132)
    with pytest.raises(UsageError, match=r"runs='-1': "):
        resolve_runs("-1", 132)


def test_the_runs_follow_the_programs_a_multiprocessor_asked(monkeypatch):
    """``auto`` cuts a GEMV's indices for the programs a multiprocessor the settings ask
    (``PTO_PER_SM``'s largest count, two where none or fewer): at one program a launch, the tiny
    step's q/k/v task (8 indices) is 2 items by default, 4 at ``per_sm=4``, 3 at ``(3, 1)``; the
    outputs stay the waves executor's, bit for bit. ``more``'s count is known compiled alone
    (a GPU's: tests/gpu/test_decode_gpu.py)."""
    from pto.backends.triton.megakernel import MegakernelSettings, runs_share
    from tests.exec.test_item_deps import run_program

    monkeypatch.delenv("PTO_MK_RUNS", raising=False)
    monkeypatch.setenv("PTO_MK_SPLIT", "off")
    assert resolve_runs("auto", 132, 4) == 528 and resolve_runs(7, 132, 4) == 7
    assert [runs_share(a) for a in (None, 0, 1, 4, (3, 1), (0, 5), "more", ("more", 3))] == [2, 2, 2, 4, 3, 5, 2, 3]
    monkeypatch.setenv("PTO_PER_SM", "6,0")
    assert runs_share(None) == 6
    monkeypatch.delenv("PTO_PER_SM")
    rw, inputs, want = run_program("model", "waves", None, {"config": "tiny"}, {"batch": 1, "cache": 128})
    rw.close()
    for per_sm, items in ((None, 2), (4, 4), ((3, 1), 3)):
        from pto.engine import Runner, resolve

        job = resolve("model", executor="persistent", device="cpu", backend="triton", config="tiny", dtype="f32")
        runner = Runner(job, {"batch": 1, "cache": 128})
        runner.executor.settings = MegakernelSettings(programs=1, dispatch="static", per_sm=per_sm)
        try:
            got = runner(inputs)
            p = runner.executor.plan
            qkv = [t for t in range(p.n_tasks) if p.variants[t].name == "gemv_norm_rope_append_tile"]
            assert qkv and {int(p.parallel[t]) for t in qkv} == {8}
            assert {int(p.nitems[t]) for t in qkv} == {items}, per_sm
            for k in want:
                assert torch.equal(got[k], want[k]), (per_sm, k)
        finally:
            runner.close()


def test_only_the_gemvs_take_runs():
    """A decode step's projections and LM head (products of one row: multiply-sums) take runs;
    a prefill layer's GEMMs (tensor-core tiles of 16 rows and more, pipelined already) and
    functions without a parallel axis do not."""
    from pto.engine import Runner, resolve
    from pto.exec.plan import takes_runs

    plan = _decode_plan("tiny", 2)
    by_name = {b.fn.name: takes_runs(b.fn) for b in plan.branches}
    assert by_name["gemv_norm_swiglu_tile"] and by_name["lmhead_argmax_tile"]
    assert not by_name["decode_attn_part"] and not by_name["embed_row"]
    runner = Runner(resolve("llama7b", device="cpu", backend="triton", executor="waves"), 40)
    try:
        gemms = [fn for fn in runner.graph.variants if fn.name.startswith("matmul")]
        assert gemms and not any(takes_runs(fn) for fn in gemms)
    finally:
        runner.close()


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("program,seq,options,runs", [("model", None, {}, "2"), ("model", None, {}, "3")],
                         ids=["decode-2", "decode-3"])
def test_runs_are_bit_identical_to_the_wave_executor(program, seq, options, runs, monkeypatch):
    from pto.engine import Runner, resolve

    def run(executor):
        job = resolve(program, device="cpu", backend="triton", executor=executor, options=options)
        runner = Runner(job, seq)
        try:
            inputs = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=3)
            out = {k: v.clone() for k, v in runner(inputs).items()}
            if executor != "persistent":
                return out, None, []
            ex = runner.executor
            ex._launch(trace=True)
            ex.check()
            return out, ex.plan, ex.trace_records()
        finally:
            runner.close()

    want, _, _ = run("waves")
    monkeypatch.setenv("PTO_MK_RUNS", runs)
    got, plan, records = run("persistent")
    assert plan.run is not None and any(b.runs for b in plan.branches)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # a traced item of a run names the run's first parallel index
    firsts = {}
    for r in records:
        firsts.setdefault(r.task - plan.first_task, []).append(r.p)
    for t, ps in firsts.items():
        assert sorted(ps) == list(range(0, int(plan.parallel[t]), int(plan.run[t]))), t


@pytest.mark.sm90
@pytest.mark.slow
def test_a_decode_steps_megakernel_with_runs_compiles_for_sm90(tmp_path):
    """The 1B shape's step in the megakernel's tiles, gate/up in one K step of 2,048 (a loop of
    one trip, which only a run pipelines): its q, k, v and gate/up tasks in runs (two a
    multiprocessor's worth of items), compiled by Triton for an H100/H200 (sm_90): more
    ``cp.async`` copies than the same kernel without runs (the runs' loops pipelined); with the
    L2 prefetch (``PREFETCH`` 1), more prefetches than the same kernel whose runs take none, and
    more again where a budget of 256 KiB makes the runs loop over whole indices."""
    from pto.codegen.triton.common import RenderOptions
    from pto.codegen.triton.megakernel import render_megakernel
    from tests.sm90 import compile_sm90, megakernel_job

    counts = []
    for runs in (0, 264):
        plan = _decode_plan("llama3.2-1b", runs, "cuda_h200", ffn_bk=2048)
        assert any(b.runs for b in plan.branches) == bool(runs)
        k = render_megakernel(plan.branches, dispatch="static", stages={b.fn.variant_name: 2 for b in plan.branches})
        (tmp_path / str(runs)).mkdir()
        opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
        jobs = [megakernel_job(k, opts), megakernel_job(k, opts, prefetch=1)]
        if runs:  # the same kernel whose runs take no prefetch, and one whose runs prefetch whole indices
            quiet = [replace(b, prefetch=False) if b.runs else b for b in plan.branches]
            stages = {b.fn.variant_name: 2 for b in quiet}
            jobs.append(megakernel_job(render_megakernel(quiet, dispatch="static", stages=stages), opts, prefetch=1))
            wide = render_megakernel(plan.branches, RenderOptions(prefetch_bytes=256 * 1024), dispatch="static",
                                     stages=stages)
            assert wide.source.count("for _q in range(0, tl.minimum(n_run, ") == 2  # (q/k/v's and gate/up's)
            jobs.append(megakernel_job(wide, opts, prefetch=1))
        words = ["cp.async.cg", "cp.async.ca", "prefetch.global.L2"]  # (counted in the whole PTX)
        res, fetch, *without = compile_sm90([{**j, "count": words} for j in jobs], tmp_path / str(runs))
        assert all(r["ok"] for r in (res, fetch, *without)), [r.get("error") for r in (res, fetch, *without)]
        counts.append(res["counts"]["cp.async.cg"] + res["counts"]["cp.async.ca"])
        assert res["counts"]["prefetch.global.L2"] == 0
        if runs:
            assert {b.fn.variant_name for b in plan.branches if b.runs} == {"gemv_norm_tile__R1",
                                                                            "gemv_norm_swiglu_tile__R1"}
            prefetches = [r["counts"]["prefetch.global.L2"] for r in (fetch, *without)]
            assert prefetches[2] > prefetches[0] > prefetches[1] > 0, prefetches
    assert counts[1] > counts[0], counts
