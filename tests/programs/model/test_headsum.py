"""The o projection split by query head into the combine (``DecodeTiling.o_in_combine``,
:mod:`pto.incore.headsum`): one task a layer fewer for one sequence, the step and generation the
reference model's."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from pto.tools.run import run

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def split_o(monkeypatch):
    """tiny's tiling with the o projection in the combine."""
    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, o_in_combine=True))
    return mp.CONFIGS["tiny"]


def _names(batch: int, cache: int) -> list[str]:
    from pto import programs

    prog = programs.get("model")
    s = prog.settings(device="cpu", config="tiny")
    return [f.name for f in prog.build(s, prog.shape({"cache": cache, "batch": batch})).functions]


@pytest.mark.parametrize("cache", [256, 1024])
def test_one_sequence_loses_the_o_task_and_keeps_the_reference_step(split_o, cache):
    """Batch 1: the step (f32, seeded inputs: a cache filled to half, random weights) is the
    reference's, with one task a layer fewer than the default step, at a cache of one combine
    over its chunks (256: 8 chunks) and of 32 chunks read at once (1024)."""
    from pto.orchestration.model import program as mp

    res = run("model", config="tiny", cache=cache, batch=1, device="cpu", check=True, seed=21)
    assert res["rel_err"] <= 1e-5, res
    names = _names(1, cache)
    assert {"decode_combine_o_tile", "gemv_headsum_norm_swiglu_tile", "gemv_headsum_residual_tile"} <= set(names)
    assert "decode_attn_combine_parts" not in names and "gemv_norm_swiglu_tile" not in names
    split = res["tasks"]
    mp.TINY_TILING = replace(mp.TINY_TILING, o_in_combine=False)
    assert run("model", config="tiny", cache=cache, batch=1, device="cpu")["tasks"] - split == split_o.layers


def test_several_sequences_keep_the_o_projection(split_o):
    """The split is for one sequence: a batch of 2 builds the default step and is the reference's."""
    res = run("model", config="tiny", cache=256, batch=2, device="cpu", check=True, seed=22)
    assert res["rel_err"] <= 1e-5, res
    assert "decode_combine_o_tile" not in _names(2, 256)


def test_generation_with_the_split_o_projection_is_the_reference(split_o):
    """Token by token (prefill through the layer program, then the step replayed): the reference
    model's greedy tokens."""
    from pto.orchestration.model import program as mp
    from pto.orchestration.model.generate import Generator
    from pto.orchestration.model.program import random_weights
    from pto.orchestration.model.reference import ReferenceModel

    from pto.ir.dtypes import DType

    w = random_weights(split_o, torch.float32, torch.Generator().manual_seed(23))
    prompt = torch.randint(0, w.config.vocab, (11,), generator=torch.Generator().manual_seed(24)).tolist()
    want = ReferenceModel(w).generate([prompt], 24, stop_ids=())
    tasks = []
    for split in (True, False):
        gen = Generator(w, "cpu", DType.F32, tiling=replace(mp.TINY_TILING, o_in_combine=split))
        try:
            got = gen.generate([prompt], 24, stop_ids=())
        finally:
            gen.close()
        assert got.tokens == want, split
        tasks.append(got.tasks_per_step)
    assert tasks[1] - tasks[0] == split_o.layers


@pytest.mark.interpret
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_the_split_o_projection_on_triton(split_o, executor):
    """The combine with the head's product and the projections that sum the heads' rows as
    Triton kernels (the interpreter), both executors."""
    res = run("model", config="tiny", cache=256, batch=1, device="cpu", backend="triton", executor=executor,
              check=True, seed=25)
    assert res["rel_err"] <= 1e-5, res
