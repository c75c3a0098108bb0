"""Tensor-parallel decode on the CPU (gloo): the model program's step split over tp = 1 and 2
ranks (tiny's 4 query heads, 2 key/value heads and 160 FFN columns divide among 2), batches of
one and several sequences, a sliding-window ring, bf16 with the partial sums sent in bf16, the
Triton backend under the interpreter; and generation token by token with the step replayed.

Tolerances (u: the unit roundoff, 2^-24 in f32, 2^-8 in bf16):

- against the reference step (float32 on the whole inputs): the single-process step's own (1e-5
  in f32, tests/programs/model/test_decode.py; 5e-2 for a bf16 model step, the smoke check's);
- against tp = 1: the split changes only the summation order of the o and down projections (tp
  partial sums of K / tp terms, then their sum over the ranks), and the difference passes
  through the later layers and the LM head; per layer two K-term sums whose orders differ, about
  2 u sqrt(K) relative each (the probabilistic bound), so 4 u sqrt(K_max) per layer, times the
  layers: 8 u sqrt(160) = 6e-6 for tiny's 2 layers in f32 (measured ~1e-7), 8 u_bf16 in bf16;
- the chosen tokens and positions: exactly (the logits' margins are far above these bounds; a
  rank that picked another token would also desynchronize the ranks' caches).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from pto.orchestration.model.decode import tile_rows
from pto.orchestration.model.program import CONFIGS
from safetensors.torch import load_file

from pto.machine.target import get as get_target
from tests.dist import driver

pytestmark = pytest.mark.timeout(600)

U = {"f32": 2.0**-24, "bf16": 2.0**-8}
REF_TOL = {"f32": 1e-5, "bf16": 5e-2}


def _cases() -> list[dict]:
    out = [{"name": f"tiny-b{b}-c{c}", "program": "model", "seq": {"cache": c, "batch": b}, "seed": b}
           for b, c in ((1, 64), (3, 96))]
    out.append({"name": "swa-b2", "program": "model", "config": "tiny-swa", "seq": {"cache": 64, "batch": 2},
                "seed": 2})
    out.append({"name": "bf16-storage", "program": "model", "seq": {"cache": 64, "batch": 2}, "seed": 4,
                "dtype": "bf16", "allreduce_dtype": "storage"})
    if os.environ.get("TRITON_INTERPRET") == "1":  # the GEMVs cut around gloo's sum, under the interpreter
        out.append({"name": "triton-b2", "program": "model", "seq": {"cache": 64, "batch": 2}, "seed": 6,
                    "backend": "triton"})
    out.append({"name": "generate", "generate": [[7, 1, 30], 12], "seed": 8})
    out.append({"name": "generate-swa", "config": "tiny-swa", "generate": [[5, 20], 50], "seed": 9})
    for reduce in ("storage", "f32"):  # pto generate's sums: bf16 by default, as the programs'
        out.append({"name": f"generate-bf16-{reduce}", "dtype": "bf16", "allreduce_dtype": reduce,
                    "generate": [[6], 3], "seed": 10})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """tp -> (the folder of the saved outputs, the results by case name)."""
    out = {}
    for tp in (1, 2):
        d = tmp_path_factory.mktemp(f"tp{tp}")
        out[tp] = d, driver.run_cases(tp, _cases(), d)
    return out


def _steps(res: dict) -> dict:
    return {k: v for k, v in res.items() if "generate" not in k}


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_every_step_matches_the_reference(runs, tp):
    _, one = runs[1]
    _, res = runs[tp]
    for name, r in _steps(res).items():
        assert r["tp"] == tp and r["rel_err"] <= REF_TOL[r["dtype"]], (name, r)
        assert r["rel_err"] <= 1.01 * one[name]["rel_err"] + 8 * U[r["dtype"]] * math.sqrt(160), (name, r)


@pytest.mark.slow
def test_the_ranks_step_is_near_tp1_and_picks_the_same_tokens(runs):
    (d1, _), (d2, res) = runs[1], runs[2]
    for name, r in _steps(res).items():
        a, b = (load_file(str(x / f"{name}.safetensors")) for x in (d1, d2))
        assert torch.equal(a["tok"], b["tok"]) and torch.equal(a["pos"], b["pos"]), name
        diff = ((a["logits"].double() - b["logits"].double()).norm() / a["logits"].double().norm()).item()
        bound = 8 * U["bf16"] if r["dtype"] == "bf16" else 8 * U["f32"] * math.sqrt(160)
        assert 0 < diff <= bound or torch.equal(a["logits"], b["logits"]), (name, diff)


#: the bytes of a step's candidates' sum a sequence (the vocabulary-parallel head at 2 ranks:
#: rows of 4 f32 values, the 2 ranks' logits and ids)
CANDIDATES = 4 * 4


@pytest.mark.slow
def test_each_rank_sums_two_projections_a_layer(runs):
    """Every rank issues the same all-reduces: the o and down projections of each layer, one
    call each for the whole batch, of the batch's rows (padded as the tiles are: not on a CPU) x hidden; and
    the vocabulary-parallel head's candidates, one call of the batch's rows; all through the
    process group (gloo: no symmetric memory on the CPU)."""
    _, res = runs[2]
    for name, r in _steps(res).items():
        cfg = CONFIGS[r["config"]]
        colls = [{k: x["collectives"][k] for k in ("calls", "bytes", "algorithms")} for x in r["ranks"]]
        size = 2 if r["allreduce_dtype"] == "storage" and r["dtype"] == "bf16" else 4
        calls = 2 * cfg.layers + 1
        rows = tile_rows(r["batch"], get_target("x86_64"))  # (the CPU's: not padded)
        want = {"calls": calls, "bytes": 2 * cfg.layers * rows * cfg.hidden * size
                + r["batch"] * CANDIDATES, "algorithms": {"group": calls}}
        assert colls == [want, want], (name, colls)


@pytest.mark.slow
def test_generation_over_two_ranks_makes_the_reference_tokens(runs):
    """Prompts of different lengths (one without prefill), prefill through the whole layer on
    every rank keeping its heads' keys and values, then the rank's step replayed; tiny-swa
    generates past its 64-slot ring. The tokens are tp = 1's and the reference model's."""
    from pto.orchestration.model.program import random_weights
    from pto.orchestration.model.reference import ReferenceModel

    for case in (c for c in _cases() if "generate" in c and "dtype" not in c):
        name = case["name"]
        got = runs[2][1][name]
        assert got["tokens"] == runs[1][1][name]["tokens"], name
        cfg = CONFIGS[case.get("config", "tiny")]
        w = random_weights(cfg, torch.float32, torch.Generator().manual_seed(case["seed"]))
        g = torch.Generator().manual_seed(case["seed"] + 1)
        lengths, new = case["generate"]
        prompts = [torch.randint(0, cfg.vocab, (n,), generator=g).tolist() for n in lengths]
        assert got["tokens"] == ReferenceModel(w).generate(prompts, new, stop_ids=()), name
        # two a layer and the candidates' in every step (and the first run's, if any)
        calls, per_step = got["collectives"]["calls"], 2 * cfg.layers + 1
        assert calls >= new * per_step and calls % per_step == 0, (name, calls)


def test_a_model_whose_heads_do_not_divide_is_one_line():
    """SmolLM2's 9 query heads over 2 ranks: refused before any launch, naming the flag."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "model", "--config", "smollm2-135m", "--tp", "2",
                        "--device", "cpu"], capture_output=True, text=True, env=driver.clean_env(), timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "pto: error: model: --tp 2: the 9 query heads do not divide among 2 ranks\n", r.stderr


@pytest.mark.slow
def test_generation_sums_in_the_storage_dtype_unless_asked_for_f32(runs):
    """The Generator (``pto generate``) sums the ranks' partials as the programs do: in bf16 by
    default, half the bytes of ``allreduce_dtype="f32"`` for the same steps (the candidates'
    sums in f32 in both: a step's one sequence's)."""
    res = runs[2][1]
    bf16, f32 = (res[f"generate-bf16-{r}"]["collectives"] for r in ("storage", "f32"))
    steps = bf16["calls"] // (2 * CONFIGS["tiny"].layers + 1)
    assert bf16["calls"] == f32["calls"] > 0
    assert (bf16["bytes"] - steps * CANDIDATES) * 2 == f32["bytes"] - steps * CANDIDATES, (bf16, f32)


def test_shutdown_releases_what_holds_captured_graphs_before_leaving_the_group(tmp_path):
    """``dist.shutdown`` calls the releases registered with ``at_shutdown`` (once each, however
    often registered) while the process group still exists, then leaves it (a one-rank gloo
    group in this process)."""
    from pto.machine import dist

    seen = []

    def release():
        seen.append(dist.initialized())

    torch.distributed.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    try:
        dist.at_shutdown(release)
        dist.at_shutdown(release)
        dist.shutdown()
        assert seen == [True] and not dist.initialized()
    finally:
        dist._AT_SHUTDOWN.remove(release)
        if dist.initialized():
            torch.distributed.destroy_process_group()
