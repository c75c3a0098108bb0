"""Automatic task fusion (pto.passes.fusion): fused programs compute bit-exactly what the written
ones compute, on random orchestration programs with chains and on the LLaMA layer's split and
pair attention; what cannot be proved is refused with its reason."""

from __future__ import annotations

import random

import pytest
import torch

from pto import programs
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
