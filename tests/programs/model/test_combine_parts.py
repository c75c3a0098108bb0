"""The attention combine reading a head's partial states at once (``decode_attn_combine_parts``,
``DecodeTiling.combine_parts``: strided loads, where the loop of ``decode_attn_combine`` waits on
a load per chunk): the function against float64 numpy on seeded partial states (chunks past the
position included), through the reference interpreter and the Triton backend; the steps built
with it against the reference model, short and long caches, one sequence and several; and where
it is not built (more partial states than its tile holds, an unknown cache). Then the combine
folded into the o projection (``decode_attn_combine_o``, ``DecodeTiling.fold_combine``): the
function against float64, where it is built, the step and a generation against the reference
model, and under the Triton interpreter."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from pto.cli.commands.run import run

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


def _partials(parts: int, heads: int, D: int, used: int, g: torch.Generator):
    """Partial states as decode_attn_part leaves them: rows ``i * heads + h``; the parts from
    ``used`` on are past the position (m = -inf, l = 0, o = 0)."""
    o = torch.randn(parts * heads, D, generator=g)
    m = torch.randn(parts * heads, 1, generator=g) * 4
    l_ = torch.rand(parts * heads, 1, generator=g) * 8 + 0.5
    o[used * heads:], m[used * heads:], l_[used * heads:] = 0.0, float("-inf"), 0.0
    return o, torch.cat([m, l_], dim=1)


@pytest.mark.parametrize("parts,used", [(8, 8), (8, 3), (5, 1), (32, 20)])
@pytest.mark.parametrize("runner", ["interp", pytest.param("triton", marks=pytest.mark.interpret)])
def test_the_combine_task_reading_every_part_at_once_matches_float64(parts, used, runner):
    """One head's states (every ``heads``-th row of a region that starts at the head's first
    row), merged: f32 against float64."""
    from pto.incore.decode import decode_attn_combine_parts

    from pto.interp.incore import run_incore
    from pto.ir.dtypes import DType

    if runner == "triton" and not INTERP:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    if runner == "triton":
        from tests.opkit import run_incore_triton as run_fn
    else:
        run_fn = run_incore
    heads, D, h = 3, 16, 2
    g = torch.Generator().manual_seed(parts * 7 + used)
    o, ml = _partials(parts, heads, D, used, g)
    y = torch.full((1, D), float("nan"))
    rows = (parts - 1) * heads + 1
    fn = decode_attn_combine_parts(DType.F32, heads, D, parts)
    run_fn(fn, {"o": (o, h, 0, rows, D), "ml": (ml, h, 0, rows, 2), "y": (y, 0, 0, 1, D)})
    o64, ml64 = o.double().numpy()[h::heads], ml.double().numpy()[h::heads]
    wt = np.exp2(ml64[:, 0] - ml64[:, 0].max())
    want = (wt[:, None] * o64).sum(0) / (wt * ml64[:, 1]).sum()
    np.testing.assert_allclose(y.double().numpy()[0], want, rtol=1e-5, atol=1e-6)


def _functions(cache: int, batch: int, **fields) -> set[str]:
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType

    t = replace(mp.TINY_TILING, **fields)
    return {f.name for f in build_step(mp.CONFIGS["tiny"], DType.F32, None, batch, t, cache=cache).functions}


def test_where_the_combine_reads_every_part_at_once():
    """A known cache of at most COMBINE_ROWS parts a head (chunks, or the spans of a long
    cache's two levels), any batch: the combine reads them at once; more parts, an unknown
    cache or the option off: the combine's loop."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import COMBINE_ROWS, build_step

    from pto.ir.dtypes import DType

    parts, loop = "decode_attn_combine_parts", "decode_attn_combine"
    for batch in (1, 2):
        assert parts in _functions(256, batch) and loop not in _functions(256, batch)
        assert loop in _functions(256, batch, combine_parts=False)
    # 1024 slots in chunks of 32: 32 chunks, the most the tile holds, one level; in chunks of 16,
    # 64 chunks: two levels (4 spans a head, read at once), or without spans too many
    assert parts in _functions(1024, 1) and not {loop, "decode_attn_merge"} & _functions(1024, 1)
    assert {parts, "decode_attn_merge"} <= _functions(1024, 1, chunk=16) and loop not in _functions(1024, 1, chunk=16)
    assert COMBINE_ROWS == 32 and parts in _functions(1024, 1, span=0)
    assert loop in _functions(1024, 1, span=0, chunk=16) and parts not in _functions(1024, 3, span=0, chunk=16)
    no_cache = build_step(mp.CONFIGS["tiny"], DType.F32, None, 1, mp.TINY_TILING)
    assert loop in {f.name for f in no_cache.functions}


@pytest.mark.parametrize("cache,batch,chunk", [(64, 1, 32), (1024, 1, 16), (256, 3, 32)])
def test_the_step_matches_the_reference_with_either_combine(cache, batch, chunk, monkeypatch):
    """The step (a short cache, a long one whose spans are combined: 64 chunks of 16, several
    sequences) gives the reference's logits with either combine, in as many tasks."""
    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, chunk=chunk))
    res = run("model", config="tiny", cache=cache, batch=batch, device="cpu", check=True, seed=21)
    assert res["rel_err"] <= 1e-5, res
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, combine_parts=False))
    plain = run("model", config="tiny", cache=cache, batch=batch, device="cpu", check=True, seed=21)
    assert plain["rel_err"] <= 1e-5, plain
    assert plain["tasks"] == res["tasks"]


@pytest.mark.parametrize("config,new", [("tiny", 20), ("tiny-swa", 70)])
def test_generation_with_the_combine_reading_every_part_is_the_reference_models(config, new):
    """Token by token (tiny-swa wraps its 64-slot ring: chunks of the ring past the position
    hold old keys, and the parts' weights follow the position, not the slot order)."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = random_weights(CONFIGS[config], torch.float32, torch.Generator().manual_seed(22))
    prompt = torch.randint(0, w.config.vocab, (7,), generator=torch.Generator().manual_seed(23)).tolist()
    want = ReferenceModel(w).generate([prompt], new, stop_ids=())
    gen = Generator(w, "cpu", DType.F32)
    try:
        got = gen.generate([prompt], new, stop_ids=())
    finally:
        gen.close()
    assert got.tokens == want


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor,cache", [("waves", 64), ("persistent", 64), ("waves", 1024)])
def test_the_combine_reading_every_part_on_triton(executor, cache):
    res = run("model", config="tiny", cache=cache, batch=1, device="cpu", backend="triton", executor=executor,
              check=True, seed=24)
    assert res["rel_err"] <= 1e-5, res


# the combine folded into the o projection (DecodeTiling.fold_combine) --------------------------


@pytest.mark.parametrize("parts,used,bn", [(8, 3, 8), (5, 5, 16), (16, 1, 24)])
@pytest.mark.parametrize("runner", ["interp", pytest.param("triton", marks=pytest.mark.interpret)])
def test_the_o_projection_combining_the_heads_itself_matches_float64(parts, used, bn, runner):
    """``decode_attn_combine_o``: every head's output from its states (chunks past the position
    included), times its columns of the o weight, plus the residual; an output block that does
    not divide the outputs (24 of 40) included; f32 against float64."""
    from pto.incore.decode import decode_attn_combine_o

    from pto.interp.incore import run_incore
    from pto.ir.dtypes import DType

    if runner == "triton" and not INTERP:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    if runner == "triton":
        from tests.opkit import run_incore_triton as run_fn
    else:
        run_fn = run_incore
    heads, D, N = 3, 16, 40
    g = torch.Generator().manual_seed(parts * 11 + used + bn)
    o, ml = _partials(parts, heads, D, used, g)
    w, r = torch.randn(N, heads * D, generator=g), torch.randn(1, N, generator=g)
    y = torch.full((1, N), float("nan"))
    rows = parts * heads
    fn = decode_attn_combine_o(DType.F32, heads, D, parts, N, bn)
    run_fn(fn, {"o": (o, 0, 0, rows, D), "ml": (ml, 0, 0, rows, 2), "w": (w, 0, 0, N, heads * D),
                "r": (r, 0, 0, 1, N), "y": (y, 0, 0, 1, N)})
    o64, ml64 = o.double().numpy(), ml.double().numpy()
    attn = []
    for h in range(heads):
        oh, m, l_ = o64[h::heads], ml64[h::heads, 0], ml64[h::heads, 1]
        wt = np.exp2(m - m.max())
        attn.append((wt[:, None] * oh).sum(0) / (wt * l_).sum())
    want = r.double().numpy()[0] + w.double().numpy() @ np.concatenate(attn)
    np.testing.assert_allclose(y.double().numpy()[0], want, rtol=1e-5, atol=1e-5)


def test_where_the_o_projection_combines_the_heads():
    """One sequence, the o weight dense, one rank, a head's states known at build and at most
    COMBINE_ROWS (chunks, or a long cache's spans, whose merges stay their own level): the combine
    per head is gone; several sequences, an unknown cache, quantized weights or the option off:
    it stays."""
    from pto.orchestration.model.tiling import DecodeTiling, folds_combine

    fold, plain = "decode_attn_combine_o", "decode_attn_combine_parts"
    assert fold in _functions(256, 1, fold_combine=8) and plain not in _functions(256, 1, fold_combine=8)
    assert plain in _functions(256, 2, fold_combine=8) and fold not in _functions(256, 2, fold_combine=8)
    assert fold not in _functions(256, 1)
    spans_ = _functions(1024, 1, chunk=16, fold_combine=8)
    assert {fold, "decode_attn_merge"} <= spans_ and plain not in spans_
    t = DecodeTiling(fold_combine=8)
    assert folds_combine(t, 1, False, True, 32) and not folds_combine(t, 1, False, True, 33)
    assert not folds_combine(t, 1, True, True, 8)  # a quantized o weight
    assert not folds_combine(t, 1, False, False, 8)  # a rank's partial sums
    assert not folds_combine(t, 1, False, True, None)  # the cache not known at build
    assert not folds_combine(replace(t, combine_parts=False), 1, False, True, 8)
    assert not folds_combine(DecodeTiling(), 1, False, True, 8)


def test_the_folded_combine_takes_the_widest_block_that_fits_a_cpu():
    """The 8B's heads of 128 in f32 with 32 partial states a head: 64 outputs a program need 48.8
    KiB of a CPU's 48; the step takes the widest block that fits (32), where it was one
    SramError."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import build_step

    from pto.ir.dtypes import DType
    from pto.machine.target import host

    cfg = mp.CONFIGS["llama3-8b"]
    t = replace(mp.tiling_for(cfg, host()), fold_combine=64)
    m = build_step(cfg, DType.F32, host(), 1, t, cache=2048)  # (32 chunks of 64)
    (f,) = [f for f in m.functions if f.name == "decode_attn_combine_o"]
    assert str({x.name: x for x in f.tiles}["b"].rows) == "32"


def test_a_negative_combine_fold_is_one_error():
    from pto.orchestration.model.tiling import DecodeTiling

    from pto.errors import UsageError

    with pytest.raises(UsageError, match="fold_combine=-1: the folded o projection's block is positive"):
        DecodeTiling(fold_combine=-1)


@pytest.mark.parametrize("cache,chunk,fields", [(64, 32, {}), (1024, 16, {}), (64, 32, {"fold_down": 8})])
def test_the_step_with_the_combine_in_the_o_projection_matches_the_reference(cache, chunk, fields, monkeypatch):
    """One sequence: the step gives the reference's logits with a task fewer a head and layer (a
    long cache's spans merged first; with the FFN in one level too, the residual stream f32)."""
    from pto.orchestration.model import program as mp

    cfg = mp.CONFIGS["tiny"]
    tasks = {}
    for fold in (0, 8):
        monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, chunk=chunk, fold_combine=fold, **fields))
        res = run("model", config="tiny", cache=cache, batch=1, device="cpu", check=True, seed=21)
        assert res["rel_err"] <= 1e-5, res
        tasks[fold] = res["tasks"]
    assert tasks[0] - tasks[8] == cfg.layers * cfg.layer.heads


def test_generation_with_the_combine_in_the_o_projection_is_the_reference_models():
    """Token by token on tiny-swa (its 64-slot ring wraps: chunks past the position hold old
    keys, weighted by the position, not the slot order)."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.program import CONFIGS, random_weights
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = random_weights(CONFIGS["tiny-swa"], torch.float32, torch.Generator().manual_seed(26))
    prompt = torch.randint(0, w.config.vocab, (9,), generator=torch.Generator().manual_seed(27)).tolist()
    want = ReferenceModel(w).generate([prompt], 70, stop_ids=())
    gen = Generator(w, "cpu", DType.F32, tiling=replace(mp.tiling_for(w.config), fold_combine=8))
    try:
        got = gen.generate([prompt], 70, stop_ids=())
    finally:
        gen.close()
    assert got.tokens == want


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_the_combine_in_the_o_projection_on_triton(executor, monkeypatch):
    from pto.orchestration.model import program as mp

    cfg = mp.CONFIGS["tiny"]
    plain = run("model", config="tiny", cache=64, batch=1, device="cpu", seed=23)["tasks"]
    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, fold_combine=8))
    res = run("model", config="tiny", cache=64, batch=1, device="cpu", backend="triton", executor=executor,
              check=True, seed=23)
    assert res["rel_err"] <= 1e-5, res
    assert res["tasks"] == plain - cfg.layers * cfg.layer.heads
