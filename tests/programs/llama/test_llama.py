"""The LLaMA layer: the tiled graph against the independent PyTorch reference (SDPA), every
attention mode, causal and not, sequence lengths that are not tile multiples; the structure of
the graph (tasks per tile and per pair, no masked pair submitted)."""

from __future__ import annotations

import pytest
from pto.orchestration.llama.config import CONFIGS
from pto.orchestration.llama.counts import closed_form

from pto.cli.commands.run import run
from pto.interp.orchestration import iter_tasks
from pto.ir.dtypes import DType
from pto.programs import get
from pto.runtime.graph import CompiledProgram

SEQS = [1, 31, 100, 333, 1000]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("seq", SEQS)
def test_layer_matches_reference(seq, causal, attention):
    if seq == 1000 and attention != "fused" and not causal:
        pytest.skip("covered by the causal run and by the fused bidirectional run (CPU time)")
    res = run("llama7b", seq=seq, config="tiny", device="cpu", backend="torch", dtype="f32",
              causal=causal, attention=attention, check=True, seed=seq)
    assert res["rel_err"] <= 1e-4, res
    assert res["tasks"] > 0 and res["edges"] >= 0


def test_bf16_layer_matches_bf16_reference():
    res = run("llama7b", seq=77, config="tiny", device="cpu", backend="torch", dtype="bf16", check=True)
    assert res["rel_err"] <= 2e-2


@pytest.mark.parametrize("attention,per_tile,per_pair", [("split", 16, 3), ("pair", 16, 1), ("fused", 11, 0)])
def test_tasks_per_tile_and_pair(attention, per_tile, per_pair):
    """Per row tile: rmsnorm, q/k/v projections, rope q and k, then init, normalize and the
    eight post-attention tasks (split, pair) or one attention task and four fused
    post-attention tasks (fused); per (q, kv) pair 3 (split) or 1 (pair) tasks."""
    prog = get("llama7b")
    opts = prog.settings(attention=attention, causal=False, fuse=False)  # the written graph
    module = prog.build(opts)
    seq = 200
    tasks = list(iter_tasks(CompiledProgram.get(module).lowered, prog.scalars(opts, prog.shape(seq))))
    cf = closed_form(CONFIGS["tiny"], prog.tiling(opts), seq, attention, False)
    assert len(tasks) == per_tile * cf["row_tiles"] + per_pair * cf["pairs"]
    names = {t.func.name for t in tasks}
    assert {"rmsnorm_tile", "matmul_tile", "rope_tile"} <= names
    fused = {"matmul_residual_tile", "matmul_swiglu_tile", "flash_fused_nc"}  # bidirectional here
    assert (fused <= names) if attention == "fused" else not (fused & names)


def test_causal_submits_no_fully_masked_pair():
    prog = get("llama7b")
    opts = prog.settings(attention="pair", causal=True)
    module = prog.build(opts)
    for task in iter_tasks(CompiledProgram.get(module).lowered, prog.scalars(opts, prog.shape(333))):
        if task.func.name == "flash_pair":
            sc = dict(task.scalars)
            q = next(r for r in task.regions if r.param == "q")
            assert sc["kpos"] <= sc["qpos"] + q.rows - 1, "a pair whose kv block lies after every q row"


def test_graph_counts_equal_closed_form_across_settings():
    prog = get("llama7b")
    for attention, fuse in (("fused", False), ("fused", True), ("pair", False), ("split", False)):
        for causal in (True, False):
            opts = prog.settings(attention=attention, causal=causal, fuse_norm_rope=fuse, fuse=False)
            module = prog.build(opts)
            for adaptive in (True, False):
                cp = CompiledProgram.get(module, adaptive)
                for seq in (1, 65, 640):
                    g = cp.build_graph(prog.scalars(opts, prog.shape(seq)))
                    cf = closed_form(CONFIGS["tiny"], prog.tiling(opts), seq, attention, causal, adaptive, fuse)
                    assert (g.tasks, g.edges) == (cf["tasks"], cf["edges"]), (attention, fuse, causal, adaptive, seq)
                    g.close()


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("bf16", 2e-2)])
@pytest.mark.parametrize("seq", [1, 77, 333])
def test_fused_norm_and_rope_match_the_reference(seq, dtype, tol):
    """RMSNorm folded into the projections (its gain into the weights, each row's scale from a
    statistics task) and RoPE in the q/k epilogue: the same layer (9 tasks per row tile instead
    of 11), within the dtype's tolerance of the reference."""
    res = run("llama7b", seq=seq, config="tiny", device="cpu", backend="torch", dtype=dtype, fuse_norm_rope=True,
              check=True, seed=seq)
    assert res["rel_err"] <= tol, res
    prog = get("llama7b")
    rows = closed_form(CONFIGS["tiny"], prog.tiling(prog.settings(config="tiny", dtype=dtype)), seq, "fused",
                       True)["row_tiles"]
    assert res["tasks"] == 9 * rows and res["fuse_norm_rope"] is True


@pytest.mark.parametrize("seq", [1, 45, 333])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_whole_row_tiles_match_the_reference(seq, causal):
    """``--row-tiles whole`` (the GPU default): every row tile the q tile's height, the last
    one clipped, against the reference at lengths that are not a tile multiple."""
    res = run("llama7b", seq=seq, config="tiny", device="cpu", backend="torch", dtype="f32", causal=causal,
              row_tiles="whole", check=True, seed=seq)
    assert res["rel_err"] <= 1e-4, res


def test_whole_row_tiles_run_one_tile_height():
    """Whole row tiles: every task of a function has the q tile's height (one kernel a phase on
    a GPU), where adaptive tiles add residual tiles of the base height; auto picks whole for a
    GPU target only."""
    from pto.machine.target import get as target

    prog = get("llama7b")
    variants = {}
    for rt in ("whole", "adaptive"):
        s = prog.settings(row_tiles=rt)
        t = prog.tiling(s)
        tasks = list(iter_tasks(CompiledProgram.get(prog.build(s)).lowered, prog.scalars(s, prog.shape(333))))
        # the variants of each call site: one per tile height (the specializer keeps one per dims)
        per_call = {}
        for task in tasks:
            per_call.setdefault(id(task.call), set()).add(id(task.func))
        variants[rt] = max(len(v) for v in per_call.values())
        if rt == "whole":
            assert t.base == t.tq and len(tasks) == 11 * -(-333 // t.tq)
    assert variants == {"whole": 1, "adaptive": 2}  # 333 rows: full blocks and a residual tile
    assert prog.form(prog.settings(target=target("cuda_h100"))).whole
    assert not prog.form(prog.settings(target=target("cuda_h100"), attention="pair")).whole
    assert not prog.form(prog.settings()).whole


def test_norm_chunks_on_a_hopper_sized_gpu():
    """RMSNorm's column step on a GPU with Hopper's shared memory: the largest power of two up to
    4096 dividing the width, or, where that would be under 512, one power of two covering the
    width in the fewest (masked) steps; two rows a program. Elsewhere the old tiling."""
    from pto.orchestration.llama.tiling import _divisor, choose_tiling

    from pto.machine.target import get as target

    assert [_divisor(n, 4096) for n in (4096, 8192, 5120, 6144, 1536, 3200, 576)] == \
        [4096, 4096, 1024, 2048, 512, 4096, 1024]
    t = choose_tiling(CONFIGS["7b"], DType.BF16, target("cuda_h100"), 128)
    assert (t.norm_rows, t.norm_chunk) == (2, 4096)
    t = choose_tiling(CONFIGS["7b"], DType.F32, target("x86_64"), 32)
    assert (t.norm_rows, t.norm_chunk) == (16, 512)
