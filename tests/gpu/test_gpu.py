"""GPU runs (skipped without CUDA): the Triton backend against the torch backend and the PyTorch
reference, the 7B layer at bf16, CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
def test_tiny_layer_triton_matches_reference(attention):
    from pto.cli.commands.run import run

    res = run("llama7b", seq=333, config="tiny", device="cuda", backend="triton", dtype="bf16",
              attention=attention, check=True)
    assert res["rel_err"] <= 2e-2


@pytest.mark.parametrize("executor", ["waves", "persistent"])
@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
@pytest.mark.parametrize("config", ["tiny-gqa", "tiny-swa"])
def test_family_layers_on_triton(config, attention, executor):
    """Grouped-query attention and the sliding window on the GPU's compiled kernels (the
    interpreter neither runs bf16 nor fuses multiply-adds): at 333 tokens the 64-key window
    leaves whole rows of the first kv tiles masked, where a huge window bias once gave inf."""
    from pto.cli.commands.run import run

    res = run("llama", seq=333, config=config, device="cuda", backend="triton", executor=executor, dtype="bf16",
              attention=attention, check=True)
    assert res["rel_err"] <= 2e-2, res


def test_f32_programs_on_triton():
    from pto.cli.commands.run import run

    for prog in ("softmax", "bgemm"):
        res = run(prog, seq=333, config="tiny", device="cuda", backend="triton", dtype="f32", check=True)
        assert res["rel_err"] <= 1e-4, (prog, res)


def test_7b_layer_bf16_and_graph_replay():
    from pto.cli.commands.run import run

    res = run("llama7b", seq=1024, config="7b", device="cuda", backend="triton", dtype="bf16",
              attention="fused", check=True, repeat=3)
    assert res["rel_err"] <= 2e-2
    assert res["replay_mode"] == "cuda_graph" and res["replay_ms"] > 0


def test_nan_constants_survive_relaunch():
    """A kernel whose tile is read before it is written (NaN poison) and whose loads pad with
    NaN launches more than once (Triton re-checks global constants at every launch)."""
    import math

    from pto import InCore, f32
    from tests.opkit import run_incore_triton

    k = InCore("nan_paths")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t, acc = k.tile("t", 16, 16, f32), k.tile("acc", 16, 16, f32)
    with k.for_range("i", 0, 2) as i:
        k.load(t, x, i * 0, 0, pad=math.nan)
        k.add(acc, acc, t)  # acc is read before any write: NaN
    k.store(y, 0, 0, acc)
    fn = k.build()
    src = torch.randn(16, 16, device="cuda")
    for _ in range(2):
        out = torch.zeros(16, 16, device="cuda")
        run_incore_triton(fn, {"x": (src, 0, 0, 8, 16), "y": (out, 0, 0, 16, 16)})
        assert torch.isnan(out).all()


@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
def test_persistent_executor_matches_waves(attention):
    """The persistent kernel on the GPU: the tiny layer in bf16, every attention mode, within
    the dtype's tolerance of the reference and of the wave executor."""
    from pto.engine import Runner, rel_err, resolve

    outs = {}
    for executor in ("waves", "persistent"):
        job = resolve("llama7b", device="cuda", backend="triton", executor=executor, config="tiny", dtype="bf16",
                      options={"attention": attention})
        runner = Runner(job, 333)
        inputs = job.program.inputs(job.settings, job.program.shape(333), "cuda", seed=3)
        outs[executor] = runner(inputs)["y"].clone()
        runner.executor.check()
        ref = job.program.reference(job.settings, job.program.shape(333), inputs)["y"]
        assert rel_err(outs[executor], ref) <= 2e-2
        runner.close()
    assert rel_err(outs["persistent"], outs["waves"]) <= 1e-2


def test_persistent_7b_layer_replays_as_a_cuda_graph():
    from pto.cli.commands.run import run

    res = run("llama7b", seq=1024, config="7b", device="cuda", backend="triton", executor="persistent",
              dtype="bf16", attention="fused", check=True, repeat=3)
    from pto.exec.segments import MAX_SEGMENTS

    # one launch a segment (the default split cuts the layer's attention into a launch of its own)
    assert res["rel_err"] <= 2e-2 and 1 <= res["launches"] <= MAX_SEGMENTS
    assert res["replay_mode"] == "cuda_graph" and res["replay_ms"] > 0


def test_persistent_wait_is_bounded_on_the_gpu():
    """A dependency never released: the waiting program gives up and the host names the task;
    the GPU does not hang."""
    from pto.backends.triton import MegakernelSettings
    from pto.engine import Runner, resolve
    from pto.errors import ExecutionError

    job = resolve("llama7b", device="cuda", backend="triton", executor="persistent", config="tiny", dtype="bf16")
    runner = Runner(job, 200)
    runner.executor.settings = MegakernelSettings(split="off")  # one kernel to plant the wait in
    try:
        runner(job.program.inputs(job.settings, job.program.shape(200), "cuda"))
        ex = runner.executor
        ex.kernel.max_polls = 10_000
        victim = int((ex.kernel.buf["pending0"] > 0).nonzero()[-1])
        ex.kernel.buf["pending0"][victim] += 1
        ex.replay()
        with pytest.raises(ExecutionError, match=f"predecessors of task {victim + ex.plan.first_task} "):
            ex.check()
    finally:
        runner.close()


def test_tune_rejects_a_wrong_candidate_on_the_gpu(tmp_path):
    """tf32 for an f32 GEMM is fast and wrong beyond f32's tolerance: pto tune never keeps it."""
    from pto.backends.triton.schedules import ScheduleDB
    from pto.cli.commands.tune import Search, tune

    db = ScheduleDB(torch.cuda.get_device_name(0), user_dir=tmp_path)
    space = {"gemm_tile": [{"input_precision": "tf32"}, {"num_warps": 4, "num_stages": 2}]}
    res = tune("bgemm", [256], Search(iterations=3, warmup=1, candidates=space), db, device="cuda", config="tiny",
               dtype="f32")
    (r,) = res["results"]
    assert r["rejected"] == 1 and r["best"] == {"num_warps": 4, "num_stages": 2}


def test_first_run_compiles_ahead_in_parallel_and_matches(tmp_path):
    """A first run with an empty Triton cache compiles its kernels on worker threads while the
    waves are planned (pto.backends.triton.ahead): the same bits as compiling one kernel at a
    time, and the layer still matches its reference."""
    import json
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    outs = {}
    for threads in ("1", "8"):
        env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / f"triton{threads}"), PTO_COMPILE_THREADS=threads)
        save = tmp_path / f"y{threads}.safetensors"
        proc = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama7b", "--config", "tiny", "--seq", "333",
                               "--device", "cuda", "--check", "--json", "--save", str(save)],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["rel_err"] <= 2e-2
        outs[threads] = load_file(save)
    assert outs["1"].keys() == outs["8"].keys()
    for name in outs["1"]:
        assert torch.equal(outs["1"][name], outs["8"][name]), name


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_a_multiplied_tile_read_otherwise_is_right_at_every_pipeline_depth(stages, tma):
    """A K loop that multiplies its x tile and also sums its squares: Triton 3.6's pipelining
    computed it 0.3-0.6 from float64 on an H100 with 2 or more stages (docs/PERF.md, eighth
    session). The renderer loads the tile a second time for the squares
    (pto/codegen/triton/operands.py); the f32 result is as close to float64 as its f32 sums
    allow (K = 4096 terms: a few 1e-6)."""
    from pto.backends.triton import TritonBackend
    from pto.codegen.triton import RenderOptions
    from pto.data.batch import RegionBatch, TaskBatch
    from pto.engine import rel_err
    from pto.ir.dtypes import DType
    from tests.codegen.test_operands import squares_in_the_k_loop

    dev, T, K, N = torch.device("cuda"), 512, 4096, 256
    fn = squares_in_the_k_loop(DType.BF16, R=128, K=K, N=N, bk=64)
    g = torch.Generator(device=dev).manual_seed(stages)
    x = torch.randn(T, K, generator=g, device=dev).to(torch.bfloat16)
    w = (torch.randn(K, N, generator=g, device=dev) / 64).to(torch.bfloat16)
    y = torch.full((T, N), float("nan"), device=dev)
    n = T // 128
    z, rows = torch.zeros(n, dtype=torch.long, device=dev), torch.arange(n, device=dev) * 128

    def region(t, per_row):
        return RegionBatch(t, rows if per_row else z, z, torch.full((n,), 128 if per_row else t.shape[0], device=dev),
                           torch.full((n,), t.shape[1], device=dev))

    be = TritonBackend(dev, RenderOptions(tma=tma), launch={"squares": {"num_warps": 8, "num_stages": stages}})
    if tma and not be.options.tma:
        pytest.skip("no tensor descriptors on this GPU")
    be.prepare(TaskBatch(fn, {"x": region(x, True), "w": region(w, False), "y": region(y, True)}, {}, n))()
    xd = x.double()
    want = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)) @ w.double()
    err = rel_err(y, want)
    assert err <= 1e-4, f"{stages} stages, {'descriptors' if tma else 'pointers'}: rel_err {err:.2e}"


def test_kernel_times_counts_each_kernel_per_call():
    """pto.exec.timing.kernel_times (the benchmarks' per-kernel profile): a call of two products and
    one add launches at least those three kernels, a whole number of each per call, each a
    positive time, together within the call's wall time."""
    from pto.exec.timing import kernel_times

    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(1024, 1024, device="cuda", generator=g) for _ in range(2))

    def call():
        return a @ b + b @ a

    per, wall_ms = kernel_times(call, 4)
    assert all(float(n).is_integer() for n, _ in per.values()), per
    assert sum(n for n, _ in per.values()) >= 3 and any("elementwise" in k for k in per), per
    assert all(ms > 0 for _, ms in per.values()) and 0 < sum(ms for _, ms in per.values()) <= wall_ms
