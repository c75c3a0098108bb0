"""pto estimate: measured rows equal the real graphs, the closed form takes over beyond the
build limit, and the seed's table (its self-consistent rows) is reproduced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pto.estimate import SEED_ROWS, estimate
from pto.graph import CompiledProgram
from pto.ir.dtypes import dtype_of
from pto.programs import RunOptions, get


def test_seed_setting_reproduces_the_seed_rows():
    """--target ascend910b --dtype f32 --no-causal --attention split: the seed's rows are
    16(N/2) + 3(N/2)^2 with 64-row tiles over N 32-row tiles, and 16N + 3N^2 without."""
    res = estimate("llama7b", sorted(SEED_ROWS), target="ascend910b", dtype="f32", causal=False,
                   attention="split", max_build_tasks=60_000)
    for row in res["rows"]:
        assert (row["tasks"], row["tasks_no_adaptive"]) == SEED_ROWS[row["seq"]]
    big = estimate("llama7b", [131072], target="ascend910b", dtype="f32", causal=False, attention="split",
                   max_build_tasks=0)["rows"][0]
    n = 131072 // 32
    assert big["tasks"] == 16 * (n // 2) + 3 * (n // 2) ** 2 == 12_615_680  # the seed printed 12,611,584
    assert big["tasks_no_adaptive"] == 16 * n + 3 * n * n
    assert not big["measured"] and big["runtime_bytes"] > 0


@pytest.mark.parametrize("attention", ["fused", "split"])
def test_measured_rows_equal_running_the_generated_orchestration(attention):
    res = estimate("llama7b", [512, 2048], config="7b", dtype="bf16", target="cuda_h100",
                   attention=attention, causal=True)
    prog = get("llama7b")
    opts = RunOptions(config="7b", dtype=dtype_of("bf16"), attention=attention, target="cuda_h100")
    module = prog.build(opts)
    for row in res["rows"]:
        assert row["measured"]
        g = CompiledProgram.get(module).build_graph(prog.scalars(opts, row["seq"]))
        assert (row["tasks"], row["edges"]) == (g.tasks, g.edges)
        assert row["runtime_bytes"] == g.stats["bytes_peak"]
        g.close()
        gn = CompiledProgram.get(module, adaptive=False).build_graph(prog.scalars(opts, row["seq"]),
                                                                     count_only=True)
        assert row["tasks_no_adaptive"] == gn.tasks
        gn.close()


def test_extrapolated_memory_is_close_to_a_real_build():
    """The memory model fitted on small builds predicts a larger build within 10%."""
    small = estimate("llama7b", [256, 512, 1024], dtype="f32", target="ascend910b", causal=False,
                     attention="split")
    m = small["memory_model"]
    big = estimate("llama7b", [8192], dtype="f32", target="ascend910b", causal=False, attention="split")
    row = big["rows"][0]
    assert row["measured"]
    pred = m["bytes_per_task"] * row["tasks"] + m["bytes_per_edge"] * row["edges"] + m["bytes_fixed"]
    assert abs(pred - row["runtime_bytes"]) / row["runtime_bytes"] < 0.1


def test_programs_without_closed_form_use_count_only_builds():
    res = estimate("bgemm", [64, 500], config="tiny", dtype="f32")
    prog = get("bgemm")
    opts = RunOptions()
    for row in res["rows"]:
        g = CompiledProgram.get(prog.build(opts)).build_graph(prog.scalars(opts, row["seq"]))
        assert row["tasks"] == g.tasks == row["tasks_no_adaptive"]
        g.close()


def test_cli_json_and_plot(tmp_path):
    png = tmp_path / "est.png"
    # split, bidirectional attention: the 128K graph (12.6M tasks) is beyond the build limit
    r = subprocess.run([sys.executable, "-m", "pto.cli", "estimate", "llama7b", "--seq", "1024,4096,131072",
                        "--attention", "split", "--no-causal", "--json", "--plot", str(png)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["rows"]
    assert [x["seq"] for x in rows] == [1024, 4096, 131072]
    for key in ("seq", "tasks", "tasks_no_adaptive", "edges", "runtime_bytes", "measured"):
        assert all(key in x for x in rows)
    assert rows[0]["measured"] and not rows[-1]["measured"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
