"""Tensor parallelism on a GPU (skipped without CUDA): the layer's shards run as generated Triton
kernels on the waves executor and the all-reduce tasks sum real CUDA tensors. With one GPU the
two ranks share it through ``PTO_DIST_BACKEND=gloo`` (NCCL refuses two ranks on one device;
gloo sums CUDA tensors through the host): this checks results, not speed (bench/tp.py times
NCCL on machines with several GPUs).

Tolerances as in tests/dist/test_tp.py: bf16 layers within 2e-2 of the reference on the whole
inputs, within 4 u_bf16 of the tp = 1 output (another summation order of the row-parallel
projections, rounded to bf16 once more).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.dist import driver

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHARE = {"PTO_DIST_BACKEND": "gloo"}
U_BF16 = 2.0**-8
CASES = [{"name": f"{a}-{s}", "seq": s, "seed": s, "attention": a} for a in ("fused", "pair", "split")
         for s in (100, 300)]
CASES += [{"name": "gqa-pair-300", "seq": 300, "seed": 3, "config": "tiny-gqa", "attention": "pair"},
          {"name": "swa-fused-300", "seq": 300, "seed": 4, "config": "tiny-swa"},
          {"name": "f32-fused-300", "seq": 300, "seed": 5, "allreduce_dtype": "f32"},
          {"name": "7b-fused-1024", "seq": 1024, "seed": 6, "config": "7b"}]
for c in CASES:
    c.update(device="cuda", backend="triton", dtype="bf16")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {tp: (d, driver.run_cases(tp, CASES, d, env=SHARE))
            for tp in (1, 2) for d in [tmp_path_factory.mktemp(f"tp{tp}")]}


def test_two_ranks_on_the_gpu_match_the_reference_and_one_rank(runs):
    d1, one = runs[1]
    d2, two = runs[2]
    assert set(two) == {c["name"] for c in CASES}
    for name, r in two.items():
        assert (r["tp"], r["device"], r["backend"], r["executor"]) == (2, "cuda", "triton", "waves"), (name, r)
        assert r["rel_err"] <= 2e-2, (name, r["rel_err"])
        a, b = (load_file(str(x / f"{name}.safetensors"))["y"].double() for x in (d1, d2))
        diff = ((a - b).norm() / a.norm()).item()
        assert 0 < diff <= 4 * U_BF16, (name, diff)  # not bitwise: another summation order
        colls = [{k: x["collectives"][k] for k in ("calls", "bytes")} for x in r["ranks"]]
        assert colls[0] == colls[1] and colls[0]["calls"] >= 2, (name, colls)
    assert two["fused-300"]["ranks"][0]["collectives"]["bytes"] * 2 == \
        two["f32-fused-300"]["ranks"][0]["collectives"]["bytes"]  # the default sums in bf16


def test_the_torchrun_command_on_the_gpu():
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun)] if torchrun.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    r = subprocess.run([*cmd, "--nproc-per-node", "2", "--master-port", str(driver.free_port()), "-m", "pto.cli",
                        "run", "llama7b", "--tp", "2", "--device", "cuda", "--check", "--json"],
                       capture_output=True, text=True, env={**driver.clean_env(), **SHARE},
                       timeout=driver.LAUNCH_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    assert (out["tp"], out["device"], out["dtype"]) == (2, "cuda", "bf16") and out["rel_err"] <= 2e-2, out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")
def test_two_gpus_sum_over_nccl_inside_a_captured_step(tmp_path):
    """On two GPUs the collective tasks are two kernels around an NCCL sum, chunked on a second
    stream, and the step replays as one CUDA graph: bench/tp.py on the tiny layer (bf16) and the
    7B layer at 1024 tokens, each replay giving the first run's bits, within 2e-2 of the
    reference and 4 u_bf16 of tp = 1, faster than tp = 1 not asserted (a benchmark's claim)."""
    out, bench = tmp_path / "tp.json", Path(__file__).resolve().parents[2] / "bench" / "tp.py"
    for config, seq in (("tiny", "300"), ("7b", "1024")):
        r = driver.launch(2, str(bench), "--config", config, "--dtype", "bf16", "--seq", seq, "--iterations", "3",
                          "--json", str(out))
        assert r.returncode == 0, r.stderr[-4000:]
        row = json.loads(out.read_text())["rows"][0]
        assert row["replay_mode"] == "cuda_graph" and row["replay_vs_first"] == 0.0, row
        assert row["ours_rel_err"] <= 2e-2 and 0 < row["ours_vs_tp1"] <= 4 * U_BF16, row
        # the replays run NCCL kernels (inside the graph: the host counters see only the capture)
        assert any("nccl" in k.lower() for k in row["ours_kernels"]), row["ours_kernels"]


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_decode_step_over_two_ranks_matches_the_reference(backend):
    """The model program's step split over two ranks (tiny: SmolLM2's 9 heads, the GPU's default,
    do not divide by 2; bf16, batches of 1 and 3): its GEMVs
    cut around the sum, the step replayed (``--repeat 3``: with NCCL one CUDA graph), rank 0's
    logits within a bf16 model step's tolerance of the reference on the whole inputs (5e-2,
    the smoke check's) and its token the reference's; both ranks issue the same sums. gloo: two
    ranks sharing the first GPU; NCCL: two GPUs."""
    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (NCCL)")
    for batch in ("1", "3"):
        r = driver.launch(2, "-m", "pto.cli", "run", "model", "--tp", "2", "--device", "cuda", "--config", "tiny",
                          "--batch", batch,
                          "--cache", "256", "--check", "--repeat", "3", "--json",
                          env={"PTO_DIST_BACKEND": backend})
        assert r.returncode == 0, r.stderr[-4000:]
        out = json.loads(r.stdout)
        assert (out["tp"], out["device"], out["dtype"], out["batch"]) == (2, "cuda", "bf16", int(batch)), out
        assert out["rel_err"] <= 5e-2, out
        colls = [{k: x["collectives"][k] for k in ("calls", "bytes")} for x in out["ranks"]]
        assert colls[0] == colls[1], colls
