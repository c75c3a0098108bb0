"""Non-finite blame on the CPU (the torch backend, and Triton kernels under the interpreter):
an InCore function that overflows (exp of a large value) is blamed on the task that ran it,
NaN and inf planted in inputs are named with the first task that read them, a temporary read
before any task wrote it is named, with every executor and ready order; the host's and the
device's per-task records agree; clean runs flag nothing; the sentinel changes nothing when off.

What the right task is comes from the programs' construction and from the reference
interpreter's definition of tasks (:func:`pto.interp.orchestration.iter_tasks`), not from the
sentinel."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pto.backends import get_backend
from pto.buffers import allocate, tensor_shapes
from pto.engine import Runner, execute, resolve
from pto.exec import get_executor
from pto.graph import CompiledProgram
from pto.interp.orchestration import iter_tasks
from pto.safety import NonFiniteError
from pto.safety.blame import blame, nonfinite_summary
from tests.safety import programs

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")
#: (backend, executor, ready order)
RUNS = [("torch", "waves", "waves"), ("torch", "waves", "random"),
        pytest.param("triton", "waves", "waves", marks=needs_interp),
        pytest.param("triton", "persistent", "waves", marks=needs_interp)]
CALL_LINE = next(i for i, line in enumerate(Path(programs.__file__).read_text().splitlines(), 1)
                 if "o.call(f, " in line)


def _run(module, scalars, inputs, backend, executor, order="waves", seed=0):
    """One sentinel run of a module; returns (report, executor)."""
    graph = CompiledProgram.get(module).build_graph(scalars)
    try:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), {k: v.clone() for k, v in inputs.items()}, "cpu")
        kw = {"order": order, "seed": seed} if executor == "waves" else {}
        ex = get_executor(executor, get_backend(backend, "cpu"), tensors, sentinel=True, **kw)
        before = nonfinite_summary(tensors, [t.name for t in fn.tensors if t.role == "input"])
        ex.run(graph)
        outs = [t.name for t in fn.tensors if t.role == "output"]
        return blame(graph, ex.flags, tensors, outs, before), ex
    finally:
        graph.close()


def _first_task(module, scalars, tensor, row, col, directions, func=None):
    """Index (in program order) of the first task with a region of ``directions`` on ``tensor``
    that covers (row, col), from the reference interpreter's tasks."""
    lowered = CompiledProgram.get(module).lowered
    for k, t in enumerate(iter_tasks(lowered, scalars)):
        if func is not None and t.func.name != func:
            continue
        for r in t.regions:
            if r.tensor == tensor and r.direction in directions and r.row0 <= row < r.row0 + r.rows \
                    and r.col0 <= col < r.col0 + r.cols:
                return k, t
    raise AssertionError(f"no task touches {tensor}[{row}, {col}]")


@pytest.mark.parametrize("adaptive", [False, True], ids=["base-tiles", "adaptive"])
@pytest.mark.parametrize("backend,executor,order", RUNS)
def test_an_overflow_is_blamed_on_the_task_that_overflowed(backend, executor, order, adaptive):
    """exp(10 x) overflows f32 where x >= 8.9: planted at x[70, 5], exp_tile of the row tile
    holding row 70 writes inf from finite inputs (norm_tile then makes the NaN of the output,
    from that inf: not blamed)."""
    module, seq = programs.overflow_module(adaptive), 100
    x = programs.inputs(seq, seed=4)
    x["x"][70, 5] = 12.0
    rep, _ = _run(module, {"S": seq}, x, backend, executor, order, seed=5)
    k, spec = _first_task(module, {"S": seq}, "e", 70, 5, ("out",), func="exp_tile")
    assert rep["outputs"] == [{"tensor": "y", "count": 1, "row": 70, "col": 5, "value": "nan"}]
    t = rep["task"]
    assert (t["id"], t["function"], t["variant"]) == (k, "exp_tile", spec.func.variant_name)
    assert t["loc"] == f"programs.py:{CALL_LINE}" and t["call"] == "exp_tile"
    assert t["loops"]["i"] == (64 if adaptive else 70) // programs.ROWS
    if adaptive:
        assert t["loops"]["i.rows"] == spec.func.variant[0][1] == 2 * programs.ROWS
    assert t["element"] == {"param": "y", "tensor": "e", "row": 70, "col": 5, "value": "inf"}
    e = next(r for r in spec.regions if r.tensor == "e")
    assert {"param": "y", "tensor": "e", "kind": "out", "rows": [e.row0, e.row0 + e.rows],
            "cols": [0, programs.COLS]} in t["regions"]
    assert rep["born"] == 1 and rep["input"] is None and rep["unwritten"] is None


@pytest.mark.parametrize("backend,executor,order", RUNS)
def test_planted_inputs_are_named_with_their_first_reader(backend, executor, order):
    """A NaN at x[3, 1] and -inf at x[40, 60]: the input is reported with the first task that
    read the NaN; the overflow planted further down is still the first task that made one."""
    module, seq = programs.overflow_module(), 100
    x = programs.inputs(seq, seed=6)
    x["x"][3, 1] = math.nan
    x["x"][40, 60] = -math.inf
    x["x"][90, 2] = 20.0
    rep, _ = _run(module, {"S": seq}, x, backend, executor, order, seed=7)
    k, _ = _first_task(module, {"S": seq}, "x", 3, 1, ("in", "inout"))
    assert rep["input"]["tensor"] == "x" and (rep["input"]["row"], rep["input"]["col"]) == (3, 1)
    assert rep["input"]["value"] == "nan" and rep["input"]["read_by"]["id"] == k == 0
    assert rep["input"]["read_by"]["function"] == "scale_tile" and rep["input"]["read_by"]["loops"] == {"i": 0}
    k, _ = _first_task(module, {"S": seq}, "e", 90, 2, ("out",), func="exp_tile")
    assert rep["task"]["id"] == k and rep["task"]["element"]["row"] == 90


@pytest.mark.slow
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("backend,executor,attention", [
    ("torch", "waves", "fused"), ("torch", "waves", "split"),
    pytest.param("triton", "persistent", "pair", marks=needs_interp),
    pytest.param("triton", "waves", "fused", marks=needs_interp)])
def test_a_value_planted_in_a_llama_weight(value, backend, executor, attention):
    """NaN or inf in one element of wk: the layer's output is not finite; the report names wk,
    the element, and the first task in program order that reads it (a k-projection task); no
    task made a non-finite value from finite inputs (the -inf of the attention masks and
    running maxima is a value the program uses, not a finding)."""
    job = resolve("llama7b", device="cpu", backend=backend, executor=executor, options={"attention": attention})
    seq = 40
    runner = Runner(job, seq, sentinel=True)
    try:
        x = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=2)
        x["wk"][5, 7] = value
        before = nonfinite_summary(x, x)
        runner(x)
        rep = blame(runner.graph, runner.executor.flags, runner.tensors, ["y"], before)
    finally:
        runner.close()
    k, spec = _first_task(runner.module, runner.scalars, "wk", 5, 7, ("in", "inout"))
    assert rep["outputs"][0]["tensor"] == "y" and rep["outputs"][0]["count"] > 0
    inp = rep["input"]
    assert (inp["tensor"], inp["row"], inp["col"]) == ("wk", 5, 7)
    assert inp["value"] == ("nan" if math.isnan(value) else "inf")
    assert inp["read_by"]["id"] == k and inp["read_by"]["variant"] == spec.func.variant_name
    assert rep["task"] is None and rep["born"] == 0 and rep["untracked"] == ["-inf"]


def test_a_buffer_read_before_any_task_wrote_it():
    """Row tile 1 of the temporary h is never written: the task reading it is named, with the
    element (the NaN every run's buffers start with)."""
    module, seq = programs.unwritten_module(), 100
    rep, _ = _run(module, {"S": seq}, programs.inputs(seq), "torch", "waves")
    k, _ = _first_task(module, {"S": seq}, "h", 32, 0, ("in",))
    u = rep["unwritten"]
    assert (u["tensor"], u["row"], u["col"], u["value"]) == ("h", 32, 0, "nan")
    assert u["read_by"]["id"] == k and u["read_by"]["loops"] == {"i": 1}
    assert rep["task"] is None and rep["input"] is None


@pytest.mark.slow
@needs_interp
@pytest.mark.parametrize("case", ["overflow", "llama-split"])
def test_host_and_device_records_agree(case):
    """Every task's read and write records, host checks between waves and the megakernel's
    device checks over the same Triton kernels, are the same arrays (and the torch backend's
    too on the elementwise program; on the layer the two backends may turn an inf into NaN
    in different places, e.g. inside a matmul)."""
    if case == "overflow":
        module, scalars = programs.overflow_module(True), {"S": 100}
        x = programs.inputs(100, seed=8)
        x["x"][[5, 70, 99], [1, 2, 63]] = torch.tensor([math.nan, 30.0, -math.inf])
    else:
        job = resolve("llama7b", device="cpu", options={"attention": "split"})
        module, scalars = job.program.build(job.settings), job.program.scalars(job.settings, job.program.shape(40))
        x = job.program.inputs(job.settings, job.program.shape(40), "cpu", seed=3)
        x["x"][17, 9] = math.inf
    flags = []
    for backend, executor in (("torch", "waves"), ("triton", "waves"), ("triton", "persistent")):
        _, ex = _run(module, scalars, x, backend, executor)
        flags.append(ex.flags)
    assert (flags[0].read[:, 0] >= 0).any() and (flags[0].wrote[:, 0] >= 0).any()
    for f in flags[1 if case == "overflow" else 2:]:
        want = flags[0 if case == "overflow" else 1]
        np.testing.assert_array_equal(f.read, want.read)
        np.testing.assert_array_equal(f.wrote, want.wrote)


@pytest.mark.parametrize("program,options", [("softmax", {}), ("bgemm", {}), ("llama7b", {"attention": "fused"}),
                                             ("llama7b", {"attention": "pair"}), ("llama7b", {"attention": "split"}),
                                             ("llama7b", {"attention": "split", "causal": False})])
def test_clean_runs_flag_nothing(program, options):
    job = resolve(program, device="cpu", backend="torch", options=options)
    runner = Runner(job, 45, sentinel=True)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(45), "cpu"))
        f = runner.executor.flags
        assert (f.read == -1).all() and (f.wrote == -1).all()
        assert blame(runner.graph, f, runner.tensors, job.program.outputs) is None
    finally:
        runner.close()


def test_execute_raises_with_the_report():
    module = programs.overflow_module()
    x = programs.inputs(64)
    x["x"][33, 0] = 50.0
    with pytest.raises(NonFiniteError, match=r"first made by task 4 `exp_tile__R32`, call to `exp_tile` "
                                             rf"\(programs.py:{CALL_LINE}\) with i=1, from finite inputs: it wrote "
                                             r"e\[33, 0\] = inf") as err:
        execute(module, {"S": 64}, x, device="cpu", sentinel=True)
    assert err.value.report["task"]["id"] == 4 and torch.isnan(err.value.tensors["y"][33, 0])
    x["x"][33, 0] = 0.5
    out = execute(module, {"S": 64}, x, device="cpu", sentinel=True)
    assert torch.isfinite(out["y"]).all()


def test_off_means_no_checks():
    """Without the sentinel the executors keep no records and the megakernel is the plain one."""
    job = resolve("softmax", device="cpu", backend="torch")
    runner = Runner(job, 50)
    runner(job.program.inputs(job.settings, job.program.shape(50), "cpu"))
    assert runner.executor.flags is None
    runner.close()
    if INTERP:
        job = resolve("softmax", device="cpu", backend="triton", executor="persistent")
        runner = Runner(job, 50)
        runner(job.program.inputs(job.settings, job.program.shape(50), "cpu"))
        assert runner.executor.flags is None and "_scan" not in runner.executor.kernel.rendered.source
        assert len(runner.executor.kernel.args()) == 21  # the sentinel adds 4 (spend, sread, swrite, stab)
        runner.close()


@pytest.mark.slow
def test_cli_sentinel_on_user_inputs_with_a_nan(tmp_path):
    """pto run --inputs FILE --sentinel --json: exit 1, the JSON names the input and its reader;
    the same inputs without the NaN: exit 0, `nonfinite` null."""
    from safetensors.torch import save_file

    job = resolve("llama7b", device="cpu", options={"attention": "fused"})
    x = job.program.inputs(job.settings, job.program.shape(50), "cpu", seed=9)
    x["x"][45, 3] = math.nan
    path = tmp_path / "in.safetensors"
    save_file(x, str(path))
    cmd = [sys.executable, "-m", "pto.cli", "run", "llama7b", "--seq", "50", "--device", "cpu", "--inputs", str(path),
           "--sentinel", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)["nonfinite"]
    scalars = job.program.scalars(job.settings, job.program.shape(50))
    k, _ = _first_task(job.program.build(job.settings), scalars, "x", 45, 3, ("in", "inout"))
    assert (rep["input"]["tensor"], rep["input"]["row"], rep["input"]["col"]) == ("x", 45, 3)
    assert rep["input"]["read_by"]["id"] == k
    x["x"][45, 3] = 0.0
    save_file(x, str(path))
    r = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "sentinel: every output is finite" in r.stdout, r.stderr
