"""The attention combine reading a head's partial states at once (strided loads): in the o
projection of one sequence (``gemv_combine_residual_tile``, ``DecodeTiling.combine_in_o``) and
as the combine task (``decode_attn_combine_parts``, ``combine_parts``). The functions against
float64 numpy on seeded partial states (chunks past the position included), through the
reference interpreter and the Triton backend; the steps built with them against the reference
model, short and long caches; and where they are not built (more partial states than the tile
holds, an unknown cache)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from pto.tools.run import run

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


def _partials(parts: int, heads: int, D: int, used: int, g: torch.Generator):
    """Partial states as decode_attn_part leaves them: rows ``i * heads + h``; the parts from
    ``used`` on are past the position (m = -inf, l = 0, o = 0)."""
    o = torch.randn(parts * heads, D, generator=g)
    m = torch.randn(parts * heads, 1, generator=g) * 4
    l_ = torch.rand(parts * heads, 1, generator=g) * 8 + 0.5
    o[used * heads:], m[used * heads:], l_[used * heads:] = 0.0, float("-inf"), 0.0
    return o, torch.cat([m, l_], dim=1)


def _want(o, ml, w, r, heads: int) -> np.ndarray:
    o, ml, w, r = (x.double().numpy() for x in (o, ml, w, r))
    attn = []
    for h in range(heads):
        m, l_, oh = ml[h::heads, 0], ml[h::heads, 1], o[h::heads]
        wt = np.exp2(m - m.max())
        attn.append((wt[:, None] * oh).sum(0) / (wt * l_).sum())
    return r + np.concatenate(attn)[None, :] @ w.T


@pytest.mark.parametrize("parts,used,bn", [(8, 8, 4), (8, 3, 8), (5, 1, 4), (16, 11, 16)])
@pytest.mark.parametrize("runner", ["interp", pytest.param("triton", marks=pytest.mark.interpret)])
def test_the_combine_and_the_projection_match_float64(parts, used, bn, runner):
    """Every head's parts merged with the global maximum, the product with the weight's columns
    of the head, the residual: f32 arithmetic against float64 (a sum of ``heads * D`` products
    and ``parts`` weighted rows; 1e-5 relative covers both roundings)."""
    from pto.incore.decode import gemv_combine_residual_tile

    from pto.interp.incore import run_incore
    from pto.ir.dtypes import DType

    if runner == "triton" and not INTERP:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    if runner == "triton":
        from pto.backends.triton import run_incore_triton as run_fn
    else:
        run_fn = run_incore
    heads, D, N = 3, 16, 40
    g = torch.Generator().manual_seed(parts * 31 + used)
    o, ml = _partials(parts, heads, D, used, g)
    w = torch.randn(N, heads * D, generator=g) / 8
    r = torch.randn(1, N, generator=g)
    y = torch.full((1, N), float("nan"))
    fn = gemv_combine_residual_tile(DType.F32, heads, D, parts, N, bn)
    run_fn(fn, {"o": (o, 0, 0, parts * heads, D), "ml": (ml, 0, 0, parts * heads, 2), "w": (w, 0, 0, N, heads * D),
                "r": (r, 0, 0, 1, N), "y": (y, 0, 0, 1, N)})
    want = _want(o, ml, w, r, heads)
    np.testing.assert_allclose(y.double().numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


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
        from pto.backends.triton import run_incore_triton as run_fn
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


def test_where_the_projection_combines():
    """One sequence with a known cache of at most COMBINE_ROWS parts a head (chunks, or spans of
    a long cache): the projection combines; several sequences or the option off: a combine task
    per head that reads its states at once; more parts, an unknown cache, or that option off
    too: the combine's loop."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.decode import COMBINE_ROWS, build_step

    from pto.ir.dtypes import DType

    fused, parts, loop = "gemv_combine_residual_tile", "decode_attn_combine_parts", "decode_attn_combine"
    assert fused in _functions(256, 1) and not {parts, loop} & _functions(256, 1)
    assert parts in _functions(256, 2) and not {fused, loop} & _functions(256, 2)
    assert parts in _functions(256, 1, combine_in_o=False)
    assert loop in _functions(256, 1, combine_in_o=False, combine_parts=False)
    # 1024 slots in chunks of 32 with two levels: 2 spans a head; without spans 32 chunks (the
    # most the tile holds); in chunks of 16, 64 chunks: too many
    assert {fused, "decode_attn_merge"} <= _functions(1024, 1) and loop not in _functions(1024, 1)
    assert COMBINE_ROWS == 32 and fused in _functions(1024, 1, span=0)
    assert loop in _functions(1024, 1, span=0, chunk=16) and loop in _functions(1024, 3, span=0, chunk=16)
    no_cache = build_step(mp.CONFIGS["tiny"], DType.F32, None, 1, mp.TINY_TILING)
    assert loop in {f.name for f in no_cache.functions}


@pytest.mark.parametrize("cache", [64, 1024])
def test_one_sequence_matches_the_reference_with_the_combine_in_the_projection(cache):
    """The step of one sequence (a short cache, and a long one whose spans the projection
    combines) gives the reference's logits; a layer has one task per query head fewer than
    the same step with the combine tasks."""
    from pto.orchestration.model import program as mp

    res = run("model", config="tiny", cache=cache, batch=1, device="cpu", check=True, seed=21)
    assert res["rel_err"] <= 1e-5, res
    cfg = mp.CONFIGS["tiny"]
    base = mp.TINY_TILING
    try:
        mp.TINY_TILING = replace(base, combine_in_o=False)
        plain = run("model", config="tiny", cache=cache, batch=1, device="cpu", check=True, seed=21)
    finally:
        mp.TINY_TILING = base
    assert plain["rel_err"] <= 1e-5, plain
    assert plain["tasks"] - res["tasks"] == cfg.layers * cfg.layer.heads


@pytest.mark.parametrize("config,new", [("tiny", 20), ("tiny-swa", 70)])
def test_generation_with_the_combine_in_the_projection_is_the_reference_models(config, new):
    """Token by token (tiny-swa wraps its 64-slot ring: chunks of the ring past the position
    hold old keys, and the parts' weights follow the position, not the slot order)."""
    from pto.orchestration.model.generate import Generator
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
def test_one_sequence_with_the_combine_in_the_projection_on_triton(executor, cache):
    res = run("model", config="tiny", cache=cache, batch=1, device="cpu", backend="triton", executor=executor,
              check=True, seed=24)
    assert res["rel_err"] <= 1e-5, res
