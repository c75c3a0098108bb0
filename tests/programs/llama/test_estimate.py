"""pto estimate: measured rows equal the real graphs, the closed form takes over beyond the
build limit, and the seed's table (its self-consistent rows) is reproduced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pto.orchestration.llama.program import SEED_ROWS

from pto.cli.commands.estimate import MAX_BUILD_EDGES, MAX_BUILD_TASKS, estimate, format_table
from pto.errors import UsageError
from pto.machine.target import get as target
from pto.programs import get
from pto.runtime.graph import CompiledProgram


def test_seed_setting_reproduces_the_seed_rows():
    """--target ascend910b --dtype f32 --no-causal --attention split: the seed's rows are
    16(N/2) + 3(N/2)^2 with 64-row tiles over N 32-row tiles, and 16N + 3N^2 without."""
    res = estimate("llama7b", sorted(SEED_ROWS), config="7b", target="ascend910b", dtype="f32", causal=False,
                   attention="split", fuse=False, limits=(60_000, MAX_BUILD_EDGES))
    for row in res["rows"]:
        assert (row["tasks"], row["tasks_no_adaptive"]) == SEED_ROWS[row["seq"]]
    big = estimate("llama7b", [131072], config="7b", target="ascend910b", dtype="f32", causal=False, attention="split",
                   fuse=False, limits=(0, MAX_BUILD_EDGES))["rows"][0]
    n = 131072 // 32
    assert big["tasks"] == 16 * (n // 2) + 3 * (n // 2) ** 2 == 12_615_680  # the seed printed 12,611,584
    assert big["tasks_no_adaptive"] == 16 * n + 3 * n * n
    assert not big["measured"] and big["runtime_bytes"] > 0


@pytest.mark.parametrize("attention", ["fused", "split"])
def test_measured_rows_equal_running_the_generated_orchestration(attention):
    res = estimate("llama7b", [512, 2048], config="7b", dtype="bf16", target="cuda_h100",
                   attention=attention, causal=True)
    prog = get("llama7b")
    opts = prog.settings(config="7b", dtype="bf16", attention=attention, target=target("cuda_h100"))
    module = prog.build(opts)
    for row in res["rows"]:
        assert row["measured"]
        g = CompiledProgram.get(module).build_graph(prog.scalars(opts, prog.shape(row["seq"])))
        assert (row["tasks"], row["edges"]) == (g.tasks, g.edges)
        assert row["runtime_bytes"] == g.stats["bytes_peak"]
        g.close()
        gn = CompiledProgram.get(module, adaptive=False).build_graph(prog.scalars(opts, prog.shape(row["seq"])),
                                                                     count_only=True)
        assert row["tasks_no_adaptive"] == gn.tasks
        gn.close()


def test_extrapolated_memory_is_close_to_a_real_build():
    """The memory model fitted on small builds predicts a larger build within 10%."""
    small = estimate("llama7b", [256, 512, 1024], config="7b", dtype="f32", target="ascend910b", causal=False,
                     attention="split", fuse=False)
    m = small["memory_model"]
    big = estimate("llama7b", [8192], config="7b", dtype="f32", target="ascend910b", causal=False, attention="split",
                   fuse=False)
    row = big["rows"][0]
    assert row["measured"]
    pred = m["bytes_per_task"] * row["tasks"] + m["bytes_per_edge"] * row["edges"] + m["bytes_fixed"]
    assert abs(pred - row["runtime_bytes"]) / row["runtime_bytes"] < 0.1


def test_programs_without_closed_form_use_count_only_builds():
    res = estimate("bgemm", [64, 500], config="tiny", dtype="f32")
    prog = get("bgemm")
    opts = prog.settings()
    for row in res["rows"]:
        g = CompiledProgram.get(prog.build(opts)).build_graph(prog.scalars(opts, prog.shape(row["seq"])))
        assert row["tasks"] == g.tasks == row["tasks_no_adaptive"]
        g.close()


def test_cli_json_and_plot(tmp_path):
    png = tmp_path / "est.png"
    # split, bidirectional attention: the 128K graph (12.6M tasks) is beyond the build limit
    r = subprocess.run([sys.executable, "-m", "pto.cli", "estimate", "llama7b", "--seq", "1024,4096,131072",
                        "--config", "7b", "--dtype", "bf16", "--target", "cuda_h100",
                        "--attention", "split", "--no-fuse", "--no-causal", "--json", "--plot", str(png)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["rows"]
    assert [x["seq"] for x in rows] == [1024, 4096, 131072]
    for key in ("seq", "tasks", "tasks_no_adaptive", "edges", "runtime_bytes", "measured"):
        assert all(key in x for x in rows)
    assert rows[0]["measured"] and not rows[-1]["measured"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ the closed form at scale


def _per_tile_counts(t, seq: int, causal: bool, adaptive: bool) -> tuple[int, int]:
    """(T, P) by enumerating the row tiles of binary expansion and counting each q tile's kv
    tiles: the definition the closed form must equal (O(T * n), small n only)."""
    from pto.orchestration.llama.counts import row_tiles

    n = -(-seq // t.base)
    tq, tk = (t.tq, t.tk) if adaptive else (t.base, t.base)
    rows = row_tiles(n, t.base, tq)
    if causal:
        return len(rows), sum(len(row_tiles(min(n, s + h), t.base, tk)) for s, h in rows)
    return len(rows), len(rows) * len(row_tiles(n, t.base, tk))


@pytest.mark.parametrize("max_range", [4, 8, 4096])
def test_closed_form_equals_the_per_tile_definition(monkeypatch, max_range):
    """Every (base, q, kv) tiling the SRAM fitting can choose, every length up to a few full
    blocks of binary expansion (max_range shrunk so that full blocks are cheap to enumerate),
    every mode: the O(log^2 n) pair count equals enumerating the tiles."""
    from pto.orchestration.llama import tiling
    from pto.orchestration.llama.config import CONFIGS
    from pto.orchestration.llama.counts import closed_form
    from pto.orchestration.llama.tiling import LlamaTiling

    monkeypatch.setattr(tiling, "MAX_RANGE", max_range)
    tilings = [(32, 128, 128), (32, 128, 64), (32, 64, 64), (16, 32, 32), (8, 16, 16), (8, 8, 8)]
    ns = list(range(0, 8 * max_range + 3)) if max_range < 4096 else [1, 2, 3, 37, 4095, 4096, 4097]
    if max_range == 4096:  # the real block size, on the GPU tilings (the enumeration is slow)
        tilings = tilings[:2]
    for base, tq, tk in tilings:
        t = LlamaTiling(base=base, tq=tq, tk=tk, bn=0, bk=0, norm_rows=0, norm_chunk=0, ew_block=0)
        for n in ns:
            seq = max(n * base - base // 2, 0)  # a clipped last tile
            for causal in (True, False):
                for adaptive in (True, False):
                    T, P = _per_tile_counts(t, seq, causal, adaptive)
                    Q = T * (T + 1) // 2 if causal else T * T
                    want = {"fused": (11 * T, 11 * T + 2 * Q), "pair": (16 * T + P, 16 * T + 4 * P),
                            "split": (16 * T + 3 * P, 14 * T + 10 * P)}
                    for attention, (tasks, edges) in want.items():
                        cf = closed_form(CONFIGS["7b"], t, seq, attention, causal, adaptive)
                        assert (cf["tasks"], cf["edges"]) == (tasks, edges), (t, seq, attention, causal, adaptive)


@pytest.mark.parametrize("attention", ["fused", "split"])
@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "no-adaptive"])
def test_4m_tokens_and_the_largest_length_take_the_closed_form_in_seconds(attention, adaptive):
    """4M tokens (the per-tile closed form took minutes, the fused graph's 1.1G edges would
    have been built) and 2**31 - 1 tokens: closed form, not built, in about a second. (No clock
    read here, a loaded machine's seconds vary: a per-tile count of 2**31 - 1 tokens, 2.8e14 tile
    pairs, would not end, and the suite's timeout fails it.)"""
    res = estimate("llama7b", [1 << 22, 2**31 - 1], config="7b", dtype="bf16", target="cuda_h100",
                   attention=attention, adaptive=adaptive, fuse=False)  # the closed form is the written graph's
    row = res["rows"][0]
    assert not row["measured"] and row["runtime_bytes"] > 0
    T = (1 << 22) // 128  # 128-row q and kv tiles on cuda_h100 bf16
    P = T * (T + 1) // 2
    assert row["tasks"] == (11 * T if attention == "fused" else 16 * T + 3 * P)
    if adaptive:
        assert row["edges"] == (11 * T + 2 * P if attention == "fused" else 14 * T + 10 * P)
    assert not res["rows"][1]["measured"]


def test_memory_model_predicts_an_edge_heavy_graph():
    """Nothing measured (the fused layer at 512K tokens has 17M edges): the calibration builds
    are the largest small graphs, which pin the bytes per edge; the prediction is within 10%
    of building the graph."""
    est = estimate("llama7b", [1 << 19], config="7b", dtype="bf16", target="cuda_h100", limits=(0, MAX_BUILD_EDGES))
    real = estimate("llama7b", [1 << 19], config="7b", dtype="bf16", target="cuda_h100",
                    limits=(MAX_BUILD_TASKS, 10**9))["rows"][0]
    row = est["rows"][0]
    assert not row["measured"] and real["measured"] and row["edges"] == real["edges"] > 10**7
    assert abs(row["runtime_bytes"] - real["runtime_bytes"]) / real["runtime_bytes"] < 0.1


# ------------------------------------------------------------------ what the report says


def test_no_adaptive_table_says_which_graph_the_columns_describe():
    res = estimate("llama7b", [1024], config="7b", dtype="bf16", target="cuda_h100", adaptive=False,
                   row_tiles="adaptive")
    row = res["rows"][0]
    assert row["tasks"] < row["tasks_no_adaptive"]  # Tasks stays the adaptive count
    text = format_table(res)
    assert "Tasks: with adaptive tiles; No-Opt: without" in text
    assert "the graph WITHOUT adaptive tiles" in text
    assert f"| {row['tasks']:,} | {row['tasks_no_adaptive']:,} |" in text
    assert f"| {row['edges']:,} |" in text
    assert "the graph with adaptive tiles" in format_table(estimate("llama7b", [1024], config="7b", target="cuda_h100"))


def test_options_only_for_programs_that_have_them():
    res = estimate("llama7b", [256], target="cuda_h100")
    assert {"attention", "causal"} <= set(res)
    assert res["options"] == ["allreduce_dtype", "attention", "causal", "fuse", "fuse_norm_rope", "hf_config",
                              "layer", "row_tiles", "weights"]
    assert "attention=fused causal=True" in format_table(res)
    res = estimate("softmax", [256], config="tiny", dtype="f32")
    assert "attention" not in res and "causal" not in res and res["options"] == []
    assert "attention=" not in format_table(res) and "causal" not in format_table(res)
    with pytest.raises(UsageError, match="softmax has no option 'attention'"):
        estimate("softmax", [256], config="tiny", dtype="f32", attention="split")


def test_bad_plot_path_and_too_long_sequence_fail_before_any_work(monkeypatch, tmp_path):
    import pto.cli.commands.estimate as est

    def no_work(*a, **k):
        raise AssertionError("computed before rejecting the arguments")

    monkeypatch.setattr(est.programs, "get", no_work)
    for bad in ("est.bmp", "est", "est.txt"):
        with pytest.raises(UsageError, match="matplotlib cannot write"):
            est.estimate("llama7b", [1024], plot_path=str(tmp_path / bad))
    with pytest.raises(UsageError, match="no folder"):
        est.estimate("llama7b", [1024], plot_path=str(tmp_path / "missing" / "est.png"))
    with pytest.raises(UsageError, match="2147483648"):
        est.estimate("llama7b", [1024, 2**31], plot_path=str(tmp_path / "est.png"))
    for ok in ("a.png", "a.pdf", "a.svg", "a.jpg", "a.JPEG"):
        est.check_plot_path(str(tmp_path / ok))


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--plot", "{tmp}/est.bmp"], "cannot write '.bmp' files"),
    (["--plot", "{tmp}/est"], "a file without a suffix"),
    (["--seq", "1024,2147483648"], "--seq 2147483648 is above 2147483647"),
])
def test_cli_rejects_bad_plot_suffix_and_too_long_sequence(tmp_path, args, needle):
    """One line on stderr, a non-zero exit, no traceback, nothing on stdout, no file."""
    argv = ["estimate", "llama7b", "--seq", "1024", "--json"] + [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run([sys.executable, "-m", "pto.cli", *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert r.stdout == ""
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("pto: error:"), err
    assert needle in err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ one rank's share under --tp


def _rank_elements(cfg, seq: int, tp: int) -> int:
    """Elements one rank of the fused layer allocates, from the configuration alone: the gains,
    x, the normed x and h, h, y (hidden wide), the weight shards (Megatron's split: wq, wk, wv,
    wg, wu by columns, wo, wd by rows), q, its RoPE and the attention output (q_dim / tp wide),
    k, v and k's RoPE (kv_dim / tp), the SwiGLU activation (ffn / tp), the RoPE tables (head_dim /
    2). Under tp > 1 nothing more: each row-parallel projection sums its partial product over
    the ranks inside its task (a sum buffer on the GPU, not a tensor of the graph)."""
    H, QD, KVD, F = cfg.hidden, cfg.q_dim // tp, cfg.kv_dim // tp, cfg.ffn // tp
    weights = 2 * H + H * QD + 2 * H * KVD + QD * H + 2 * H * F + F * H
    per_row = 5 * H + 3 * QD + 3 * KVD + F + 2 * (cfg.head_dim // 2)
    return weights + seq * per_row


@pytest.mark.parametrize("config,dtype,target_name,tp", [("tiny", "f32", "x86_64", 2), ("tiny", "f32", "x86_64", 4),
                                                         ("7b", "bf16", "cuda_h100", 1), ("7b", "bf16", "cuda_h100", 2),
                                                         ("llama3-8b", "bf16", "cuda_h100", 8)])
def test_tp_rows_are_one_ranks_tasks_and_tensors(config, dtype, target_name, tp):
    """``estimate --tp N`` reports one rank's graph and tensors: the tensor bytes the shard sizes
    give, the task count of the closed form's tp term (the fused layer: the 11 tasks per row
    tile of the single-process layer, its projections summing over the ranks) and of the built
    graph."""
    from pto.orchestration.llama.config import CONFIGS

    seqs = [100, 4096]
    res = estimate("llama7b", seqs, config=config, dtype=dtype, target=target_name, tp=tp)
    assert res["tp"] == tp
    assert (f"tp={tp} (one rank's graph and tensors)" in format_table(res)) == (tp > 1)
    prog = get("llama7b")
    s = prog.settings(config=config, dtype=dtype, target=target(target_name), tp=tp)
    module = prog.build(s)
    itemsize = 4 if dtype == "f32" else 2
    for row in res["rows"]:
        assert row["tensor_bytes"] == _rank_elements(CONFIGS[config], row["seq"], tp) * itemsize
        assert row["tasks"] == 11 * row["row_tiles"]
        assert row["measured"]
        g = CompiledProgram.get(module).build_graph(prog.scalars(s, prog.shape(row["seq"])))
        assert (g.tasks, g.edges) == (row["tasks"], row["edges"])
        g.close()


def test_tp_split_and_pair_counts_are_the_single_process_layers_less_the_residual_adds():
    """The split and pair layers as written add the residual in a task of their own after each row-parallel
    projection: under tp the projection, its sum and the add are one task, two tasks and two
    edges fewer per row tile."""
    for attention in ("split", "pair"):
        one, two = (estimate("llama7b", [333], attention=attention, tp=tp, fuse=False)["rows"][0] for tp in (1, 2))
        T = one["row_tiles"]
        assert (one["tasks"] - 2 * T, one["edges"] - 2 * T) == (two["tasks"], two["edges"])
        assert two["tensor_bytes"] < one["tensor_bytes"]


def test_tp_that_does_not_divide_is_one_line():
    r = subprocess.run([sys.executable, "-m", "pto.cli", "estimate", "llama7b", "--seq", "1024", "--config", "7b",
                        "--tp", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "pto: error: llama7b: --tp 3: the 32 query heads do not divide among 3 ranks\n"


def test_the_memory_check_counts_the_collective_sum_buffer():
    """Under tp > 1 a run also allocates the collective tasks' sum buffer (every row of the
    layer, ``hidden`` values in the sum's dtype): the refusal before a run counts it and says
    so, and the storage dtype halves it."""
    from pto.engine import check_memory, resolve
    from pto.errors import UsageError

    seq = 2**31 - 1
    sizes = {}
    for reduce in ("f32", "storage"):
        job = resolve("llama7b", device="cpu", config="tiny", dtype="bf16", tp=2,
                      options={"allreduce_dtype": reduce})
        prog, s = job.program, job.settings
        shape = prog.shape(seq)
        sizes[reduce] = prog.scratch_bytes(s, shape)
        assert sizes[reduce] >= seq * prog.config(s).hidden * (4 if reduce == "f32" else 2)
        with pytest.raises(UsageError, match=r"\(tensors [0-9.]+ [KMGT]B, collective sum buffer [0-9.]+ [KMGT]B[,)]"):
            check_memory(job, shape, prog.build(s, shape), check=False)
    assert sizes["storage"] * 2 == sizes["f32"]
    one = resolve("llama7b", device="cpu", config="tiny", dtype="bf16")
    assert one.program.scratch_bytes(one.settings, one.program.shape(seq)) == 0
