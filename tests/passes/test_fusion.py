"""Automatic task fusion (pto.passes.fusion): fused programs compute bit-exactly what the written
ones compute, on random orchestration programs with chains and on the LLaMA layer's split and
pair attention; what cannot be proved is refused with its reason."""

from __future__ import annotations

import random

import pytest
import torch

from pto import InCore, Orchestration, f32, programs
from pto.engine import execute
from pto.ir.nodes import walk_calls
from pto.ir.verify import verify_module
from pto.passes.fusion import fuse
from tests.passes.test_expansion_semantics import build, random_plan, run


def test_random_programs_fuse_bit_exactly():
    """Random programs with accumulators, in-place updates, recurrences and producer/consumer
    pairs (small integers in f32, so re-associated sums are exact too): fused with and without
    merged steps, each computes what the written program computes, or is left as written."""
    fused = refused = 0
    for seed in range(150):
        rng = random.Random(seed)
        module = build(random_plan(rng, forms=rng.random() < 0.4))
        S = rng.choice((5, 8, 13))
        want = run(module, S, seed)
        for merge in (False, True):
            fm, rep = fuse(module, merge=merge)
            verify_module(fm)
            fused += len(rep.fused)
            refused += len(rep.refused)
            got = run(fm, S, seed)
            assert all(torch.equal(got[t], want[t]) for t in want), (seed, merge, rep.describe())
    assert fused >= 20 and refused >= 20, (fused, refused)  # both happen, so neither half is vacuous


def _llama(config: str, attention: str, causal: bool = True, fuse: bool = True):
    prog = programs.get("llama")
    s = prog.settings(device="cpu", config=config, attention=attention, causal=causal, fuse=fuse)
    return prog, s


def _outputs(prog, s, module, seq: int, adaptive: bool):
    shape = prog.shape(seq)
    inputs = prog.inputs(s, shape, "cpu", seed=3)
    return execute(module, prog.scalars(s, shape), inputs, device="cpu", backend="torch", adaptive=adaptive)["y"]


@pytest.mark.parametrize("config,attention,causal", [
    ("tiny", "split", True), ("tiny", "pair", False), ("tiny-gqa", "split", False), ("tiny-swa", "split", True),
    ("tiny-swa", "pair", True), ("tiny-gqa", "pair", True)])
def test_the_layers_split_and_pair_attention_fuse_to_one_task_per_q_tile(config, attention, causal):
    """The kv loop's calls become one function with the loop inside and the normalization after it,
    the online-softmax state in tiles; over base tiles it computes bit-exactly what the written
    layer computes, and with merged kv steps (the loop says ``reassociate``) and binary expansion
    within f32 re-association of the written layer."""
    prog, s = _llama(config, attention, causal)
    written = prog.written(s)
    fm, rep = fuse(written, merge=False)
    verify_module(fm)
    kinds = [f.kind for f in rep.fused]
    assert kinds.count("chain") == 1 and rep.fused[-1].calls[-1].startswith("flash_normalize"), rep.describe()
    assert {"m", "l", "acc"} <= set(rep.fused[-1].on_chip)
    # the attention phase: one task per q tile, and s/alpha (split) are gone from the program
    attn = [c for c in walk_calls(fm.entry_function.body) if c.func == rep.fused[-1].function]
    assert len(attn) == 1 and not {"s", "alpha"} & {t.name for t in fm.entry_function.tensors}
    for seq in (37, 64):
        want = _outputs(prog, s, written, seq, adaptive=False)
        assert torch.equal(_outputs(prog, s, fm, seq, adaptive=False), want), seq
        got = _outputs(prog, s, prog.build(s), seq, adaptive=True)
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), seq


def test_no_fuse_keeps_the_written_graph_and_the_fused_mode_has_nothing_to_fuse():
    prog, s = _llama("tiny", "split", fuse=False)
    assert prog.build(s) == prog.written(s) and prog.fusion(s) is None
    prog, s = _llama("tiny", "fused")
    assert prog.build(s) == prog.written(s) and not prog.fusion(s).fused
    assert prog.counts(s, prog.shape(64)) is not None
    prog, s = _llama("tiny", "pair")
    assert prog.counts(s, prog.shape(64)) is None  # counted on the fused graph, not the closed form


def _ksplit_gemm(adaptive: bool = False):
    """y = x @ w as a K-split chain: one call per K block adds x[:, kb] @ w[kb, :] to y (with
    ``adaptive``, K blocks of 16 or 32 rows of w over a loop that allows re-association)."""
    k = InCore("gemm_kstep")
    K = k.dim("K", 16)
    x, w, y = k.memref("x", f32), k.memref("w", f32), k.memref("y", f32)
    a, b, acc = k.tile("a", 8, K, f32), k.tile("b", K, 8, f32), k.tile("acc", 8, 8, f32)
    k.load(a, x, 0, 0)
    k.load(b, w, 0, 0)
    k.load(acc, y, 0, 0)
    k.matmul_acc(acc, a, b)
    k.store(y, 0, 0, acc)
    step = k.build()
    o = Orchestration("ksplit")
    nk = o.scalar("nk")
    X, W, Y = o.input("x", 8, 16 * nk, f32), o.input("w", 16 * nk, 8, f32), o.inout("y", 8, 8, f32)
    attrs = dict(tile_levels={0: 16, 2: 32}, reassociate=True) if adaptive else {}
    with o.for_loop("kb", 0, nk, **attrs) as kb:
        kr = kb.rows if adaptive else 16
        o.call(step, {"x": (X, 0, kb * 16, 8, kr), "w": (W, kb * 16, 0, kr, 8), "y": (Y, 0, 0, 8, 8)},
               dims={"K": kr} if adaptive else {})
    return o.module()


def _scan():
    """A running sum: carry += x[i]; y[i] = carry (the carry is the chain's state, y moves)."""
    k = InCore("scan_step")
    x, c, y = k.memref("x", f32), k.memref("carry", f32), k.memref("y", f32)
    t, u = k.tile("t", 4, 4, f32), k.tile("u", 4, 4, f32)
    k.load(t, x, 0, 0)
    k.load(u, c, 0, 0)
    k.add(u, u, t)
    k.store(c, 0, 0, u)
    k.store(y, 0, 0, u)
    step = k.build()
    o = Orchestration("scan")
    n = o.scalar("n")
    X, C, Y = o.input("x", 4 * n, 4, f32), o.inout("carry", 4, 4, f32), o.output("y", 4 * n, 4, f32)
    with o.for_loop("i", 0, n) as i:
        o.call(step, {"x": (X, i * 4, 0, 4, 4), "carry": (C, 0, 0, 4, 4), "y": (Y, i * 4, 0, 4, 4)})
    return o.module()


def _random_inputs(module, scalars, seed=0):
    from pto.ir.expr import evaluate

    g = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(int(evaluate(t.rows, scalars)), int(evaluate(t.cols, scalars)), generator=g)
            for t in module.entry_function.tensors if t.role != "output"}


def test_a_k_split_gemm_is_one_task_with_its_accumulator_on_chip():
    """Not attention: the K loop becomes one function, y accumulated in a tile and stored once;
    bit-exact against the written chain in f32 (the same products in the same order)."""
    m = _ksplit_gemm()
    fm, rep = fuse(m)
    (f,) = rep.fused
    assert (f.kind, f.calls, f.on_chip) == ("chain", ("gemm_kstep",), ("y",))
    assert len(walk_calls(fm.entry_function.body)) == 1
    sc = {"nk": 5}
    x = _random_inputs(m, sc)
    want = execute(m, sc, {k: v.clone() for k, v in x.items()}, device="cpu", backend="torch")["y"]
    got = execute(fm, sc, {k: v.clone() for k, v in x.items()}, device="cpu", backend="torch")["y"]
    assert torch.equal(got, want)
    torch.testing.assert_close(got, x["y"] + x["x"].double().mm(x["w"].double()).float(), rtol=1e-5, atol=1e-5)


def test_an_adaptive_k_split_with_matmul_acc_state_is_one_task():
    """Over an adaptive K loop, the merged steps and the base-tile remainder (each a chain whose
    state y only matmul_acc updates, inside its loop) join into one task, y on chip; the fused
    program computes what the written one computes for K blocks of every parity (issue 42)."""
    from tests.passes.fusion_check import check_fusion

    out = check_fusion(_ksplit_gemm(adaptive=True), [{"nk": n} for n in (1, 2, 5)])
    rep = out.reports[True]
    assert not rep.refused and len(walk_calls(out.modules[True].entry_function.body)) == 1, rep.describe()
    assert rep.fused[-1].on_chip == ("y",), rep.describe()


def test_a_scan_with_an_output_per_step_is_refused_and_left_as_written():
    """Its per-step output moves with the loop: stores into the union of the steps' regions
    would not stop at a step's own rows, so the pass refuses and says why."""
    m = _scan()
    fm, rep = fuse(m)
    assert fm == m and not rep.fused
    (r,) = rep.refused
    assert r.kind == "chain" and "writes `y` at a region that moves with it" in r.reason


def test_a_fused_function_that_does_not_fit_the_target_is_refused():
    """The sliding-window split layer fused over merged kv steps needs more live tiles than the
    CPU target's 48 KiB: that fusion is refused with the numbers, and the chain steps over base
    tiles instead (each fused function the program runs fits)."""
    from pto.graph import CompiledProgram
    from pto.target import get as target

    prog, s = _llama("tiny-swa", "split")
    fm, rep = fuse(prog.written(s), target=target("x86_64"))
    assert any("live tiles" in r.reason and "x86_64" in r.reason for r in rep.refused), rep.describe()
    assert rep.fused and rep.fused[-1].calls[-1].startswith("flash_normalize")
    CompiledProgram.get(fm, target=target("x86_64"))  # checks every variant's live tiles against the target


def test_pto_run_json_lists_what_was_fused():
    import json
    import subprocess
    import sys

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama", "--attention", "pair", "--seq", "40",
                            "--json", *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    fused, written = run(), run("--no-fuse")
    assert any("flash_pair" in f and "on chip: m, l, acc" in f for f in fused["fused"])
    assert "fused" not in written and written["tasks"] > fused["tasks"]
