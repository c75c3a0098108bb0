"""Tensor parallelism on the CPU (gloo): the LLaMA layer split over tp = 1, 2 and 4 ranks, every
attention mode, lengths that are not tile multiples, grouped-query attention and a sliding
window, against the single-process reference (``--check``: the reference layer on the whole
inputs) and against the tp = 1 output; the command of issue 16's "Done when"; the errors of a
launch that cannot work.

One launch per tp (``torch.distributed.run`` running tests/dist/driver.py over every case; tp =
1 runs the same driver in this process, without a process group), so the whole file takes
about a minute with a warm compile cache.

Tolerances (u: the unit roundoff, 2^-24 in f32, 2^-8 in bf16):

- against the reference: the single-process layer's own (tests/programs/llama/test_llama.py:
  1e-4 in f32, 2e-2 in bf16), and by the triangle inequality no more than tp = 1's error plus
  the tp-vs-1 bound below;
- against tp = 1: the split changes only the row-parallel projections' summation order (o over
  K = q_dim, down over K = ffn: tp partial sums of K / tp terms, then the sum over the ranks);
  q, k, v, gate and up are the same dot products per column, attention the same per head. One
  order's rounding error of a K-term sum of random-sign terms is about u sqrt(K) relative
  (the probabilistic bound), two orders differ by at most twice that, and the attention half's
  difference goes through the FFN half once more: 4 u sqrt(K_max), 6.3e-6 for the tiny layer's
  ffn 704 (measured ~1.3e-7: the kernels sum in blocks). With ``--allreduce-dtype storage`` (the default)
  in bf16 each rank's partial sum is rounded to bf16 before the all-reduce, a few bf16 ulps
  more: 4 u_bf16 (measured ~4e-3, the tp = 1 layer itself is 4e-3 from the f32 reference).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pto.orchestration.llama.config import CONFIGS
from safetensors.torch import load_file

from tests.dist import driver

pytestmark = pytest.mark.timeout(600)

U = {"f32": 2.0**-24, "bf16": 2.0**-8}
#: the single-process layer's tolerance against the reference (tests/programs/llama/test_llama.py)
REF_TOL = {"f32": 1e-4, "bf16": 2e-2}
TPS = (1, 2, 4)


def _cases(tp: int) -> list[dict]:
    """Every attention mode at two lengths that are not tile multiples, bf16 with the partial sums
    sent in bf16, (where its 2 key/value heads divide among the ranks) grouped-query attention
    with and without a sliding window, and the Triton backend at tp 1 and 2."""
    out = [{"name": f"{a}-{s}", "seq": s, "seed": s, "attention": a} for a in ("fused", "pair", "split")
           for s in (37, 100)]
    out.append({"name": "bf16-storage-100", "seq": 100, "seed": 5, "dtype": "bf16", "allreduce_dtype": "storage"})
    out.append({"name": "bf16-f32-100", "seq": 100, "seed": 5, "dtype": "bf16", "allreduce_dtype": "f32"})
    for name in ("tiny-gqa", "tiny-swa"):
        if CONFIGS[name].kv_heads % tp == 0:
            out.append({"name": f"{name}-100", "seq": 100, "seed": 7, "config": name, "attention": "pair"})
    if tp <= 2 and os.environ.get("TRITON_INTERPRET") == "1":  # the Triton backend's kernels between the
        # all-reduces, under the interpreter (tests/conftest.py sets it without a GPU; on a GPU: test_tp_gpu.py)
        out.append({"name": "triton-fused-40", "seq": 40, "seed": 9, "backend": "triton", "attention": "fused"})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Path, dict]]:
    """tp -> (the folder of the saved outputs, the results by case name)."""
    out = {}
    for tp in TPS:
        d = tmp_path_factory.mktemp(f"tp{tp}")
        out[tp] = d, driver.run_cases(tp, _cases(tp), d)
    return out


def _diff_tol(case: dict) -> float:
    """The tp-vs-1 bound of the module docstring."""
    dt = case["dtype"]
    if dt == "bf16":
        return 4 * U["bf16"]
    cfg = CONFIGS[case["config"]]
    return 4 * U[dt] * math.sqrt(max(cfg.ffn, cfg.q_dim))


@pytest.mark.slow
@pytest.mark.parametrize("tp", TPS)
def test_every_case_matches_the_single_process_reference(runs, tp):
    _, one = runs[1]
    _, res = runs[tp]
    assert set(res) == {c["name"] for c in _cases(tp)}
    for name, r in res.items():
        assert r["tp"] == tp and r["rel_err"] <= REF_TOL[r["dtype"]], (name, r)
        assert r["rel_err"] <= 1.01 * one[name]["rel_err"] + _diff_tol(r), (name, r["rel_err"], one[name]["rel_err"])


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_outputs_are_near_the_tp1_outputs(runs, tp):
    """Not bitwise (another summation order), within the docstring's bound; and not
    accidentally equal to the input (a rank that skipped its work would be far off)."""
    d1, _ = runs[1]
    d, res = runs[tp]
    for name, r in res.items():
        a, b = (load_file(str(x / f"{name}.safetensors"))["y"].double() for x in (d1, d))
        assert a.shape == b.shape == (r["seq"], CONFIGS[r["config"]].hidden)
        diff = ((a - b).norm() / a.norm()).item()
        assert diff <= _diff_tol(r), (name, diff)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_every_rank_reports_the_same_collectives(runs, tp):
    """Two all-reduces per row tile (after o and after down), batched per wave: every rank issues
    the same calls and bytes; each sends every row of both projections' (seq x hidden) partial
    sums (whole row tiles: at most one tile's padding more), in the storage dtype (the default:
    bf16 in a bf16 run, half the bytes) or, with ``--allreduce-dtype f32``, in f32."""
    _, res = runs[tp]
    for name, r in res.items():
        ranks = r["ranks"]
        assert [x["rank"] for x in ranks] == list(range(tp))
        colls = [{k: x["collectives"][k] for k in ("calls", "bytes")} for x in ranks]
        assert all(c == colls[0] for c in colls) and colls[0]["calls"] >= 2, (name, colls)
        hidden = CONFIGS[r["config"]].hidden
        size = 2 if r["allreduce_dtype"] == "storage" and r["dtype"] == "bf16" else 4
        assert 2 * r["seq"] * hidden * size <= colls[0]["bytes"] < 2 * (r["seq"] + 128) * hidden * size, (name, colls)
    assert res["bf16-storage-100"]["ranks"][0]["collectives"]["bytes"] * 2 == \
        res["bf16-f32-100"]["ranks"][0]["collectives"]["bytes"]


def test_the_issue_command_passes():
    """``torchrun --nproc-per-node 2 -m pto.cli run llama7b --tp 2 --device cpu --check --json``
    as written (torchrun's port from PET_MASTER_PORT, which it reads for --master-port)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.is_file(), "torch installs the torchrun script beside python"
    r = subprocess.run([str(torchrun), "--nproc-per-node", "2", "-m", "pto.cli", "run", "llama7b", "--tp", "2",
                        "--device", "cpu", "--check", "--json"], capture_output=True, text=True,
                       env={**driver.clean_env(), "PET_MASTER_PORT": str(driver.free_port())},
                       timeout=driver.LAUNCH_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)  # rank 0 alone prints: one object
    assert (out["program"], out["tp"], out["config"], out["device"]) == ("llama7b", 2, "tiny", "cpu")
    assert out["rel_err"] <= REF_TOL["f32"]
    assert [x["rank"] for x in out["ranks"]] == [0, 1] and out["ranks"][1]["collectives"]["calls"] > 0


def _one_line(stderr: str, *needles: str) -> None:
    lines = [x for x in stderr.splitlines() if x.startswith("pto: error:")]
    assert lines and "Traceback (most recent call last):\n  File" not in stderr.split("pto: error:")[0], stderr
    for line in lines:
        assert all(n in line for n in needles), line


@pytest.mark.parametrize("args,needles", [
    (["llama7b", "--tp", "2"], ["torchrun --nproc-per-node 2 -m pto.cli run llama7b --tp 2"]),
    (["llama7b", "--tp", "3"], ["--tp 3", "the 4 query heads do not divide among 3 ranks"]),
    (["llama", "--tp", "4"], ["--tp 4", "the 2 key/value heads do not divide among 4 ranks"]),
    (["softmax", "--tp", "2"], ["softmax has no tensor-parallel form (--tp 2)"]),
], ids=["no-torchrun", "heads", "kv-heads", "softmax"])
def test_errors_without_a_launch_are_one_line(args, needles):
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", *args, "--device", "cpu"], capture_output=True,
                       text=True, env=driver.clean_env(), timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pto: error:"), r.stderr
    _one_line(r.stderr, *needles)


@pytest.mark.parametrize("args,env,needles", [
    (["--tp", "4"], {}, ["--tp 4 but torchrun started 2 processes", "--nproc-per-node 4 or --tp 2"]),
    (["--tp", "2", "--backend", "triton", "--executor", "persistent", "--seq", "40"], {"TRITON_INTERPRET": "1"},
     ["the persistent executor runs no collectives", "--executor waves"]),
    (["--tp", "2"], {"PTO_DIST_BACKEND": "nccl"}, ["PTO_DIST_BACKEND='nccl'", "gloo (NCCL needs --device cuda)"]),
], ids=["world-size", "persistent", "backend"])
def test_errors_in_a_launch_are_one_line_per_rank(args, env, needles):
    """Every rank fails with its line (``rank R: ...``) and a non-zero exit; torchrun adds its
    own report after them. torchrun stops the other ranks when the first fails, so on a busy
    machine a rank still starting may be stopped before its line: at least one line, no rank
    twice."""
    r = driver.launch(2, "-m", "pto.cli", "run", "llama7b", "--device", "cpu", *args, env=env)
    assert r.returncode != 0 and r.stdout == ""
    lines = sorted(x for x in r.stderr.splitlines() if x.startswith("pto: error:"))
    ranks = [x.split(":")[2] for x in lines]
    assert ranks and len(set(ranks)) == len(ranks) and set(ranks) <= {" rank 0", " rank 1"}, r.stderr
    _one_line(r.stderr, *needles)


def test_the_cases_divide_as_the_docstring_says():
    """tiny's 4 heads, 4 key/value heads and 704 FFN columns divide among 4 ranks; the
    grouped-query configurations' 2 key/value heads among 2 only (no replicated kv heads)."""
    for tp in TPS:
        CONFIGS["tiny"].shard(tp)
    assert CONFIGS["tiny-gqa"].shard(2).kv_heads == 1
    with pytest.raises(ValueError, match="key/value heads"):
        CONFIGS["tiny-gqa"].shard(4)
    assert torch.distributed.is_available()


def test_a_launch_whose_port_was_taken_tries_another(tmp_path, monkeypatch):
    """Under pytest-xdist another test process may be handed the free port a launch chose before
    the launch binds it: torchrun's store then fails with "address already in use", and the
    launch tries again on another free port (its first choice here a port held open)."""
    import socket

    from tests.dist import driver

    script = tmp_path / "ranks.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
                      "dist.destroy_process_group()\n")
    real, given = driver.free_port, []
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()

        def port() -> int:
            given.append(real() if given else held.getsockname()[1])
            return given[-1]

        monkeypatch.setattr(driver, "free_port", port)
        r = driver.launch(2, str(script), timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(given) == 2 and given[0] != given[1], given
