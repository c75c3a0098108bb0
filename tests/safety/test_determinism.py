"""Deterministic replay, bit for bit, on the CPU: for every registered program (and every
attention mode), the same inputs give the same output bits on every replay of a runner, in any
ready order, from the waves and the persistent executor (Triton kernels under the interpreter),
and in other processes (other hash seeds). Every option of ``pto run`` says what it does to the
bits, so one that would break them must say so. With ``--deterministic`` the batched kernels
are launched with the persistent megakernel's settings (what makes the two executors agree on a
GPU, tests/gpu/test_safety_gpu.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pto import programs
from pto.backends import get_backend
from pto.data.buffers import allocate, tensor_shapes
from pto.engine import Runner, resolve
from pto.exec.waves import WaveExecutor
from pto.runtime.graph import CompiledProgram
from pto.safety.determinism import RUN_OPTIONS, breaking, guarantee

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
SEQ = 37  # residual tiles everywhere


def _shape(prog):
    """37 tokens for the layer programs; the decode step at three attention chunks of cache and
    two sequences (its cache must be whole chunks)."""
    return prog.shape({"cache": 96, "batch": 2}) if prog.name == "model" else prog.shape(SEQ)


def _configs() -> list[tuple[str, dict]]:
    """Every registered program with its default options, and each attention mode where it has
    that option."""
    out = []
    for name in programs.names():
        prog = programs.get(name)
        attention = next((o for o in prog.options if o.name == "attention"), None)
        modes = attention.choices if attention is not None else (None,)
        out += [(name, {} if m is None else {"attention": m}) for m in modes]
    return out


CONFIGS = _configs()
IDS = [f"{p}-{o.get('attention', 'default')}" for p, o in CONFIGS]


def digest(outputs: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(outputs):
        h.update(k.encode())
        h.update(outputs[k].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


#: first-run digests of this process, by (program, options, backend, executor)
FIRST: dict[tuple, str] = {}


def _runs(program, options, backend, executor, replays=2):
    """Digests of the first run and of ``replays`` replays of one runner (fresh inputs copied
    in every time)."""
    job = resolve(program, device="cpu", backend=backend, executor=executor, options=options)
    runner = Runner(job, _shape(job.program))
    try:
        x = job.program.inputs(job.settings, _shape(job.program), "cpu", seed=11)
        out = [digest(runner({k: v.clone() for k, v in x.items()})) for _ in range(1 + replays)]
    finally:
        runner.close()
    FIRST[(program, json.dumps(options), backend, executor)] = out[0]
    return out


def _random_order(program, options, seed):
    job = resolve(program, device="cpu", backend="torch", options=options)
    p, s = job.program, job.settings
    module, scalars = p.build(s, _shape(p)), p.scalars(s, _shape(p))
    graph = CompiledProgram.get(module, target=s.target).build_graph(scalars)
    try:
        fn = module.entry_function
        t = allocate(fn, tensor_shapes(fn, scalars), p.inputs(s, _shape(p), "cpu", seed=11), "cpu")
        WaveExecutor(get_backend("torch", "cpu"), t, order="random", seed=seed).run(graph)
        return digest({k: t[k] for k in p.outputs})
    finally:
        graph.close()


@pytest.mark.parametrize("program,options", CONFIGS, ids=IDS)
def test_torch_backend_replays_and_ready_orders(program, options):
    runs = _runs(program, options, "torch", "waves")
    orders = [_random_order(program, options, seed) for seed in (1, 2)]
    assert len(set(runs + orders)) == 1


@pytest.mark.slow
@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("program,options", CONFIGS, ids=IDS)
def test_triton_replays_and_executors(program, options):
    waves = _runs(program, options, "triton", "waves", replays=0)
    persistent = _runs(program, options, "triton", "persistent", replays=1)
    assert len(set(waves + persistent)) == 1


_SCRIPT = textwrap.dedent("""
    import json, sys
    from tests.safety.test_determinism import CONFIGS, _runs
    runs = [(b, e) for b, e in json.loads(sys.argv[1])]
    print(json.dumps([[_runs(p, o, b, e, replays=0)[0] for p, o in CONFIGS] for b, e in runs]))
""")


@pytest.mark.slow
def test_another_process_gives_the_same_bits():
    """A second process with another hash seed (set and dict orders differ) computes every
    program's outputs again: the same bits as this process (torch waves; Triton persistent
    under the interpreter)."""
    runs = [("torch", "waves")] + ([("triton", "persistent")] if INTERP else [])
    here = [[FIRST.get((p, json.dumps(o), b, e)) or _runs(p, o, b, e, replays=0)[0] for p, o in CONFIGS]
            for b, e in runs]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONHASHSEED": str(7 + (hash("pto") & 1)), "PYTHONPATH": root}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(runs)], capture_output=True, text=True, env=env,
                       timeout=900, cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == here


def test_every_run_option_says_what_it_does_to_the_bits():
    """A new `pto run` option fails here until RUN_OPTIONS lists it ("breaks: why" if it makes
    outputs differ between replays or runs; the run's JSON then says so)."""
    from pto.cli.parser import build_parser

    dests = set(vars(build_parser().parse_args(["run", "softmax"])))  # the program's own options aside
    assert dests <= set(RUN_OPTIONS), f"options of pto run missing from RUN_OPTIONS: {sorted(dests - set(RUN_OPTIONS))}"
    for name, effect in RUN_OPTIONS.items():
        assert effect in ("none", "program", "executor") or effect.startswith("breaks: "), (name, effect)
    assert breaking({"trace": "t.json", "sentinel": True}) == []
    g = guarantee("cpu", "triton", False)
    assert g["replays"] and g["processes"] and g["executors"]
    g = guarantee("cuda", "triton", False)
    assert g["replays"] and not g["executors"] and "--deterministic" in g["note"]
    assert guarantee("cuda", "triton", True)["executors"]


def test_deterministic_launch_settings_are_the_megakernels(monkeypatch):
    """bf16 LLaMA variants (compiled for a GPU, nothing launched): their own launch settings
    differ (warps, FMA contraction); with the backend's uniform_launch every batched kernel gets the
    persistent kernel's num_warps and fp fusion, and the same code options (pipelining depth is
    each variant's own on both: it reorders loads, not arithmetic); with ``PTO_MK_WARPS`` the
    warps it sets the megakernel's programs."""
    from pto.backends.triton import TritonBackend, merged
    from pto.backends.triton.megakernel import branch_configs
    from pto.exec.plan import make_plan
    from pto.machine.target import get as target

    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", config="tiny", dtype="bf16", target=target("cuda_h100"), attention="split")
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, prog.shape(300)))
    try:
        backend = TritonBackend("cpu")
        used = {f for f in graph.variants if f in graph.tasks_per_variant()}
        own = {(c["num_warps"], c["enable_fp_fusion"]) for c in (backend.launch_config(f) for f in used)}
        assert len(own) > 1  # the point: without it the kernels compile differently
        backend.launch_overrides.update(backend.uniform_launch(graph))
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=backend.task_flags)
        mega = {k: v for k, v in merged(branch_configs(backend, plan)).items() if k != "num_stages"}
        for f in used:
            for tasks in (1, 17, 100):
                cfg = backend.launch_config(f, tasks)
                assert {k: cfg[k] for k in mega} == mega, f.variant_name
                assert cfg["input_precision"] == backend.options.input_precision
        monkeypatch.setenv("PTO_MK_WARPS", "2")
        assert {v["num_warps"] for v in backend.uniform_launch(graph).values()} == {2}
    finally:
        graph.close()
