"""Safety on the GPU (skipped without CUDA): the out-of-memory refusal before anything is
allocated, with the numbers; Ctrl-C during a GPU run; the non-finite sentinel with both executors
(host checks between waves, device records in the persistent kernel); the schedule checker on
the persistent executor for every attention mode; bitwise-identical outputs from both executors
with --deterministic, across CUDA-graph replays and across processes."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ATTENTION = ["fused", "pair", "split"]


def _pto(*args, timeout=900, env_hash=0):
    env = {**os.environ, "PYTHONHASHSEED": str(env_hash + 1)}
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


# -- memory ---------------------------------------------------------------------------------------


def test_out_of_memory_is_refused_before_allocating_with_the_numbers():
    """The 7B layer at a million tokens needs several times the GPU's memory: refused by the
    estimate (tensors on the device), nothing allocated, the need and what is free in the
    message (what torch.cuda.mem_get_info reports)."""
    from pto.cli.commands.run import run
    from pto.errors import UsageError

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(UsageError) as err:
        run("llama7b", seq=1_000_000, device="cuda", config="7b", dtype="bf16", attention="fused")
    msg = str(err.value)
    size = r"([\d.]+ [KMGT]?B)"
    m = re.fullmatch(rf"llama7b at seq 1000000 needs about {size} of cuda memory \(tensors {size}\) but {size} is "
                     r"available; use a smaller --seq or --config", msg)
    assert m, msg
    free = torch.cuda.mem_get_info()[0]
    assert abs(_parse(m.group(3)) - free) < 0.05 * free
    assert _parse(m.group(1)) > free
    assert torch.cuda.memory_allocated() == before
    r = _pto("run", "llama7b", "--seq", "1000000", "--device", "cuda", "--config", "7b")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "of cuda memory" in r.stderr


def _parse(text: str) -> float:
    v, unit = text.split()
    return float(v) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]


# -- Ctrl-C ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_ctrl_c_during_a_gpu_run_exits_cleanly(tmp_path, executor):
    """SIGINT while CUDA-graph replays run: exit 130, one line, and the GPU serves the next run."""
    dump = tmp_path / "graph.txt"
    from tests.safety.programs import interruptible

    with subprocess.Popen([sys.executable, "-m", "pto.cli", "run", "llama7b", "--device", "cuda", "--config",
                           "tiny", "--seq", "333", "--executor", executor, "--repeat", "100000000", "--dump",
                           str(dump)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=interruptible) as proc:
        try:
            deadline = time.monotonic() + 300
            while not dump.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert dump.exists(), proc.communicate()[1]
            time.sleep(3.0)  # compiled, captured, replaying
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130 and err == "pto: interrupted\n" and out == "", err
    r = _pto("run", "softmax", "--device", "cuda", "--check", "--json")
    assert r.returncode == 0, r.stderr


# -- the sentinel ---------------------------------------------------------------------------------


def _sentinel_run(module, scalars, inputs, executor):
    from pto.backends import get_backend
    from pto.data.buffers import allocate, tensor_shapes
    from pto.exec import get_executor
    from pto.runtime.graph import CompiledProgram
    from pto.safety.blame import blame, nonfinite_summary

    graph = CompiledProgram.get(module).build_graph(scalars)
    try:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), {k: v.cuda() for k, v in inputs.items()}, "cuda")
        ex = get_executor(executor, get_backend("triton", "cuda"), tensors, sentinel=True)
        before = nonfinite_summary(tensors, [t.name for t in fn.tensors if t.role == "input"])
        ex.run(graph)
        ex.check()
        return blame(graph, ex.flags, tensors, [t.name for t in fn.tensors if t.role == "output"], before), ex.flags
    finally:
        graph.close()


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_overflow_is_blamed_on_the_gpu(adaptive):
    """exp overflows in one task: both executors name it, and their records of every task agree
    (host checks between waves, the persistent kernel's device checks)."""
    from tests.safety import programs

    module, seq = programs.overflow_module(adaptive), 1000
    x = programs.inputs(seq, seed=4)
    x["x"][700, 5] = 12.0
    x["x"][10, 3] = math.nan
    reps, flags = {}, {}
    for executor in ("waves", "persistent"):
        reps[executor], flags[executor] = _sentinel_run(module, {"S": seq}, x, executor)
    for rep in reps.values():
        t = rep["task"]
        assert t["function"] == "exp_tile" and t["element"] == {"param": "y", "tensor": "e", "row": 700, "col": 5,
                                                                 "value": "inf"}
        assert rep["born"] == 1 and rep["input"]["tensor"] == "x" and rep["input"]["read_by"]["id"] == 0
    assert reps["waves"]["task"] == reps["persistent"]["task"]
    np.testing.assert_array_equal(flags["waves"].read, flags["persistent"].read)
    np.testing.assert_array_equal(flags["waves"].wrote, flags["persistent"].wrote)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("executor", ["waves", "persistent"])
def test_a_nan_planted_in_a_bf16_weight_is_named_on_the_gpu(attention, executor):
    from pto.engine import Runner, resolve
    from pto.interp.orchestration import iter_tasks
    from pto.safety.blame import blame, nonfinite_summary

    job = resolve("llama7b", device="cuda", backend="triton", executor=executor, config="tiny", dtype="bf16",
                  options={"attention": attention})
    runner = Runner(job, 333, sentinel=True)
    try:
        x = job.program.inputs(job.settings, job.program.shape(333), "cuda", seed=2)
        x["wv"][9, 4] = math.nan
        before = nonfinite_summary(x, x)
        runner(x)
        runner.executor.check()
        rep = blame(runner.graph, runner.executor.flags, runner.tensors, ["y"], before)
    finally:
        runner.close()
    first = next(k for k, t in enumerate(iter_tasks(runner.graph.program.lowered, runner.scalars))
                 if any(r.tensor == "wv" and r.direction != "out" and r.row0 <= 9 < r.row0 + r.rows
                        and r.col0 <= 4 < r.col0 + r.cols for r in t.regions))
    assert (rep["input"]["tensor"], rep["input"]["row"], rep["input"]["col"]) == ("wv", 9, 4)
    assert rep["input"]["read_by"]["id"] == first and rep["task"] is None


# -- the schedule checker -------------------------------------------------------------------------


@pytest.mark.parametrize("config,seq", [("tiny", 333), ("7b", 2048)])
@pytest.mark.parametrize("attention", ATTENTION)
def test_the_persistent_schedule_keeps_every_dependency(attention, config, seq):
    """Items timed with the GPU's global timer, on up to every SM at once: no item of a task
    starts before all of its predecessors' items ended, no conflicting tasks overlap."""
    from pto.engine import Runner, resolve
    from pto.safety.trace_check import verify_schedule

    for executor in ("persistent", "waves"):
        job = resolve("llama7b", device="cuda", backend="triton", executor=executor, config=config, dtype="bf16",
                      options={"attention": attention})
        runner = Runner(job, seq, record=True)
        try:
            runner(job.program.inputs(job.settings, job.program.shape(seq), "cuda"))
            rep = verify_schedule(runner.graph.runtime.export(), runner.stats.records)
            assert rep.ok and rep.tasks == runner.graph.tasks
            if executor == "persistent":
                assert rep.pairs > 0  # tasks did run concurrently, and none that conflict
        finally:
            runner.close()


# -- bitwise determinism --------------------------------------------------------------------------


@pytest.mark.parametrize("program,options,dtype", [
    *[("llama7b", {"attention": a}, "bf16") for a in ATTENTION], ("llama7b", {"attention": "fused"}, "f32"),
    ("softmax", {}, "bf16"), ("bgemm", {}, "bf16"), ("bgemm", {}, "f32")])
def test_both_executors_give_the_same_bits_with_deterministic(program, options, dtype):
    """--deterministic: the batched kernels compiled with the persistent kernel's launch settings
    give the same bits; so do CUDA-graph replays of each."""
    from pto.engine import Runner, resolve

    bits = {}
    for executor in ("waves", "persistent"):
        job = resolve(program, device="cuda", backend="triton", executor=executor, config="tiny", dtype=dtype,
                      options=options)
        runner = Runner(job, 333, deterministic=True)
        try:
            x = job.program.inputs(job.settings, job.program.shape(333), "cuda", seed=5)
            first = {k: v.clone() for k, v in runner(x).items()}
            for _ in range(3):
                runner.replay()
            torch.cuda.synchronize()
            for k, v in first.items():
                assert torch.equal(runner.tensors[k], v), (executor, "replay", k)
            bits[executor] = first
        finally:
            runner.close()
    for k in bits["waves"]:
        assert torch.equal(bits["waves"][k], bits["persistent"][k]), k


def test_processes_give_the_same_bits_on_the_gpu(tmp_path):
    """The 7B layer in two processes per executor (--deterministic): the saved outputs are the
    same bytes, all four."""
    from safetensors.torch import load_file

    outs = []
    for k, executor in enumerate(("waves", "persistent", "waves", "persistent")):
        path = tmp_path / f"{k}.safetensors"
        r = _pto("run", "llama7b", "--device", "cuda", "--seq", "1024", "--attention", "pair", "--executor", executor,
                 "--deterministic", "--save", str(path), env_hash=k)
        assert r.returncode == 0, r.stderr
        outs.append(load_file(str(path))["y"])
    assert all(torch.equal(o, outs[0]) for o in outs[1:])

