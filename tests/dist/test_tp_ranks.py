"""Tensor-parallel decode over 3 and 8 ranks on the CPU (gloo): the model program's step and
generation with the vocabulary-parallel LM head (each rank its share of a vocabulary of 500 ids,
which neither 3 nor 8 divides), the head replicated for comparison, and the sums' algorithm the
ranks choose (gloo: the process group's, forced with ``PTO_COLLECTIVES=group`` at 3 ranks, chosen
by ``auto`` at 8). tiny-mha24's 24 query heads, each its own key/value head, divide among both.

Tolerances as tests/dist/test_tp_decode.py's (u = 2^-24, f32): the reference step's own 1e-5;
against tp = 1, two K-term sums a layer in another order, 8 u sqrt(K_max) over the 2 layers
(K_max = the FFN's 192 columns); the tokens and positions exactly (each rank's candidate reaches
every rank bit for bit, and every rank's argmax over them is the whole vocabulary's).
"""

from __future__ import annotations

import math

import pytest
import torch
from pto.orchestration.model.program import CONFIGS
from safetensors.torch import load_file

from tests.dist import driver

pytestmark = pytest.mark.timeout(900)

CONFIG = "tiny-mha24"
U = 2.0**-24
#: the launches: ranks and the environment they run in
LAUNCHES = {3: {"PTO_COLLECTIVES": "group"}, 8: {}}


def _cases() -> list[dict]:
    return [{"name": "b2", "program": "model", "config": CONFIG, "seq": {"cache": 64, "batch": 2}, "seed": 3},
            {"name": "b1-replicated", "program": "model", "config": CONFIG, "seq": {"cache": 64, "batch": 1},
             "seed": 4, "lm_head": "replicated"},
            {"name": "generate", "config": CONFIG, "generate": [[5, 1, 9], 6], "seed": 11},
            {"name": "sample", "config": CONFIG, "generate": [[4, 7], 8], "seed": 13, "sample": [20.0, 50]}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """tp -> (the folder of the saved outputs, the results by case name)."""
    out = {}
    for tp in (1, *LAUNCHES):
        d = tmp_path_factory.mktemp(f"tp{tp}")
        out[tp] = d, driver.run_cases(tp, _cases(), d, env=LAUNCHES.get(tp))
    return out


def _steps(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("generate", "sample")}


@pytest.mark.slow
@pytest.mark.parametrize("tp", LAUNCHES)
def test_the_ranks_step_matches_the_reference_and_tp1(runs, tp):
    """The step's whole logits (joined from the ranks' shares), token and position against the
    reference step and the single process's."""
    (d1, one), (d, res) = runs[1], runs[tp]
    for name, r in _steps(res).items():
        assert r["tp"] == tp and r["lm_head"] == ("replicated" if "replicated" in name else "parallel")
        assert r["rel_err"] <= 1e-5, (name, r["rel_err"])
        a, b = (load_file(str(x / f"{name}.safetensors")) for x in (d1, d))
        assert a["logits"].shape == b["logits"].shape == (r["batch"], CONFIGS[CONFIG].vocab)
        assert torch.equal(a["tok"], b["tok"]) and torch.equal(a["pos"], b["pos"]), name
        diff = ((a["logits"].double() - b["logits"].double()).norm() / a["logits"].double().norm()).item()
        assert diff <= 8 * U * math.sqrt(192), (name, diff)
        assert one[name]["rel_err"] <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("tp", LAUNCHES)
def test_every_rank_sums_the_projections_and_gathers_the_candidates_through_gloo(runs, tp):
    """Per step and rank: the o and down projections' sums (the batch's rows, which a CPU's tiles
    do not pad, of hidden f32 values) and, with the vocabulary-parallel head, one sum of
    the candidates' rows (the batch's rows of 8 f32 values for 3 ranks' 6 columns, of 16 for 8
    ranks'); all through the process group (gloo), whether chosen (auto) or forced (group)."""
    _, res = runs[tp]
    cfg = CONFIGS[CONFIG]
    width = 8 if tp == 3 else 16
    for name, r in _steps(res).items():
        parallel = r["lm_head"] == "parallel"
        rows = r["batch"]
        calls = 2 * cfg.layers + parallel
        want = {"calls": calls, "bytes": 2 * cfg.layers * rows * cfg.hidden * 4 + parallel * r["batch"] * width * 4,
                "algorithms": {"group": calls}}
        got = [{k: x["collectives"][k] for k in want} for x in r["ranks"]]
        assert got == [want] * tp, (name, got)


@pytest.mark.slow
@pytest.mark.parametrize("tp", LAUNCHES)
def test_generation_over_the_ranks_makes_the_reference_tokens(runs, tp):
    """Prompts of 5, 1 and 9 tokens, 6 new each: the tokens of one process and of the reference
    model, and every step's sums (the two projections a layer and the candidates)."""
    from pto.orchestration.model.program import random_weights
    from pto.orchestration.model.reference import ReferenceModel

    case = next(c for c in _cases() if c["name"] == "generate")
    got = runs[tp][1]["generate"]
    assert got["tokens"] == runs[1][1]["generate"]["tokens"]
    cfg = CONFIGS[CONFIG]
    w = random_weights(cfg, torch.float32, torch.Generator().manual_seed(case["seed"]))
    g = torch.Generator().manual_seed(case["seed"] + 1)
    lengths, new = case["generate"]
    prompts = [torch.randint(0, cfg.vocab, (n,), generator=g).tolist() for n in lengths]
    assert got["tokens"] == ReferenceModel(w).generate(prompts, new, stop_ids=())
    calls, per_step = got["collectives"]["calls"], 2 * cfg.layers + 1
    assert calls >= new * per_step and calls % per_step == 0, calls


@pytest.mark.slow
@pytest.mark.parametrize("tp", LAUNCHES)
def test_sampling_over_the_ranks_draws_one_process_tokens(runs, tp):
    """Sampling (temperature 20 among the 50 likeliest ids, a seeded generator) joins the ranks'
    shares of the logits on every rank first: every rank draws what one process draws (the
    logits differ by a few f32 ulps, far from moving a draw across a boundary of probability), and
    the draws are not the greedy ones (the tied embedding's logit of the token itself, about the
    hidden size 64, dominates the others' few units at a low temperature; at 20 it does not)."""
    from pto.orchestration.model.program import random_weights
    from pto.orchestration.model.reference import ReferenceModel

    case = next(c for c in _cases() if c["name"] == "sample")
    got = runs[tp][1]["sample"]["tokens"]
    assert got == runs[1][1]["sample"]["tokens"] and all(len(t) == 8 for t in got)
    cfg = CONFIGS[CONFIG]
    w = random_weights(cfg, torch.float32, torch.Generator().manual_seed(case["seed"]))
    g = torch.Generator().manual_seed(case["seed"] + 1)
    prompts = [torch.randint(0, cfg.vocab, (n,), generator=g).tolist() for n in case["generate"][0]]
    assert got != ReferenceModel(w).generate(prompts, 8, stop_ids=())

