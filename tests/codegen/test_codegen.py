"""Orchestration C generation: golden files, warning-free compilation, a standalone graph
builder, and agreement between the generated C and the Python definition of every task."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pto import InCore, Orchestration, f32
from pto.errors import RegionError
from pto.interp.orchestration import iter_tasks
from pto.ir.dtypes import DType
from pto.machine.target import get as target
from pto.passes.expansion.binary_expansion import expand_binary
from pto.programs import get
from pto.runtime.graph import CompiledProgram

GOLDEN = Path(__file__).parent / "golden"
HAVE_CC = shutil.which("gcc") is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="gcc not installed")


def _golden_programs():
    h100, cpu = target("cuda_h100"), target("x86_64")
    return [("softmax", {"target": h100}), ("bgemm", {"target": cpu}),
            ("llama7b", {"config": "tiny", "attention": "split", "fuse": False, "target": cpu}),
            ("llama7b_split_fused", {"config": "tiny", "attention": "split", "target": cpu}),
            ("llama7b_fused", {"config": "7b", "dtype": "bf16", "attention": "fused", "target": h100})]


@pytest.mark.parametrize("name,settings", _golden_programs(), ids=lambda x: x if isinstance(x, str) else "")
def test_golden_c(name, settings):
    """The generated C of the canonical programs is checked in; a change shows in the diff.
    Regenerate with PTO_UPDATE_GOLDEN=1 after an intended change."""
    from pto.codegen.c_orch import generate_c

    prog = get(name.split("_")[0])
    # source lines of the program (comments, call-site names) move with unrelated edits
    src = re.sub(r"(\.py):\d+", r"\1:N", generate_c(expand_binary(prog.build(prog.settings(**settings)))).source)
    path = GOLDEN / f"{name}.c"
    if os.environ.get("PTO_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(src)
    assert path.exists(), f"missing golden file {path}; run with PTO_UPDATE_GOLDEN=1"
    assert src == path.read_text(), f"generated C of {name} differs from {path}"


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("name", ["softmax", "bgemm", "llama7b"])
def test_codegen_dir_builds_warning_free_and_counts_match(name, tmp_path):
    r = subprocess.run([sys.executable, "-m", "pto.cli", "codegen", name, "--out", str(tmp_path),
                        "--config", "tiny", "--dtype", "f32", "--target", "x86_64"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    exe = tmp_path / "graph"
    cc = subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic",
                         *map(str, sorted(tmp_path.glob("*.c"))), "-o", str(exe), "-lm", "-pthread"],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    assert cc.stderr == ""
    prog = get(name)
    opts = prog.settings(config="tiny", dtype=DType.F32, target=target("x86_64"))
    for seq in (1, 77, 300):
        out = subprocess.run([str(exe), str(seq), "--dump", str(tmp_path / "d.txt")], capture_output=True,
                             text=True, check=True).stdout.split()
        g = CompiledProgram.get(prog.build(opts)).build_graph(prog.scalars(opts, prog.shape(seq)))
        assert int(out[1]) == g.tasks and int(out[3]) == g.edges
        g.close()
        assert (tmp_path / "d.txt").read_text().startswith("PTO-TASKGRAPH 1")


def _compiled(name: str, gen, options=(), size=()):
    """``pto codegen NAME --out GEN`` built with ``cc -Wall -Wextra -Werror`` (no warning):
    the program's path."""
    r = subprocess.run([sys.executable, "-m", "pto.cli", "codegen", name, "--out", str(gen), *options, *size],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    exe = gen / "graph"
    cc = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", *map(str, sorted(gen.glob("*.c"))), "-o",
                         str(exe), "-lm", "-pthread"], capture_output=True, text=True)
    assert cc.returncode == 0 and cc.stderr == "", cc.stderr
    return exe


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("name,options,seq", [("softmax", [], 333), ("llama7b", ["--attention", "split"], 150),
                                              ("model", [], None)])
def test_codegen_dir_runs_the_graph_on_data_from_a_file(name, options, seq, tmp_path):
    """`cc DIR/*.c -lm -pthread` builds a program that runs the graph on inputs from a
    safetensors file (`pto run --save-inputs` wrote it) with no Python; its outputs are the
    evaluator's (`pto run --backend torch --save`) up to the order of f32 sums (rel 1e-5)."""
    from safetensors.torch import load_file

    gen = tmp_path / "gen"
    size = [] if seq is None else ["--seq", str(seq)]
    shape = [str(seq)] if seq is not None else [str(v) for _, v in get(name).shape().values]
    exe = _compiled(name, gen, options, size)
    ins, ref, out = tmp_path / "in.safetensors", tmp_path / "ref.safetensors", tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", name, *options, *size, "--backend", "torch",
                        "--save-inputs", str(ins), "--save", str(ref)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(exe), *shape, "--run", str(ins), "--out", str(out),
                          "--threads", "2", "--window", "16"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.startswith("tasks ")
    got, want = load_file(out), load_file(ref)
    assert set(want) <= set(got)
    for k in want:
        assert float((got[k].double() - want[k].double()).norm() / want[k].double().norm()) < 1e-5, k
    bad = subprocess.run([str(exe), *shape, "--run", str(ref)], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("graph: no tensor `")  # the inputs are not in it


@pytest.mark.parametrize("name,seq", [("softmax", 1), ("softmax", 333), ("bgemm", 45)])
def test_c_tasks_equal_python_tasks(name, seq):
    """Every task the generated C submits (variant, regions, directions, scalars) is the task
    the Python interpreter derives for the same call."""
    prog = get(name)
    opts = prog.settings()
    module = prog.build(opts)
    cp = CompiledProgram.get(module)
    g = cp.build_graph(prog.scalars(opts, prog.shape(seq)))
    ex = g.runtime.export()
    want = list(iter_tasks(cp.lowered, prog.scalars(opts, prog.shape(seq))))
    assert ex.n_tasks == len(want)
    tnames = {v: k for k, v in g.tensor_ids.items()}
    fnames = {fid: v.variant_name for fid, v in g.variant_of_func_id().items()}
    kinds = {0: "in", 1: "out", 2: "inout"}
    for i, task in enumerate(want):
        assert fnames[int(ex.func[i])] == task.func.variant_name
        a0, a1 = ex.arg_ptr[i], ex.arg_ptr[i + 1]
        regions = [(tnames[int(ex.arg_tensor[a])], kinds[int(ex.arg_kind[a])], *map(int, ex.arg_region[a]))
                   for a in range(a0, a1) if ex.arg_kind[a] != 3]
        assert regions == [(r.tensor, r.direction, r.row0, r.col0, r.rows, r.cols) for r in task.regions]
        scal = [int(ex.arg_scalar[a]) for a in range(a0, a1) if ex.arg_kind[a] == 3]
        assert scal == [v for _, v in task.scalars]
    g.close()


def test_region_outside_tensor_names_call_site():
    k = InCore("cp")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 8, 8, f32)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    f = k.build()
    o = Orchestration("oob")
    n = o.scalar("n")
    X, Y = o.input("x", n, 8, f32), o.output("y", n, 8, f32)
    with o.for_loop("i", 0, 3) as i:
        o.call(f, {"x": (X, i * 8, 0), "y": (Y, i * 8, 0)})
    cp = CompiledProgram.get(o.module())
    with pytest.raises(RegionError, match=r"call to `cp` \(test_codegen.py:\d+\): .*x"):
        cp.build_graph({"n": 20})


def test_count_only_mode_counts_exactly():
    prog = get("bgemm")
    opts = prog.settings()
    cp = CompiledProgram.get(prog.build(opts))
    full = cp.build_graph(prog.scalars(opts, prog.shape(500)))
    fast = cp.build_graph(prog.scalars(opts, prog.shape(500)), count_only=True)
    assert fast.tasks == full.tasks and fast.stats["regions"] == full.stats["regions"]
    assert fast.stats["bytes_peak"] < full.stats["bytes_peak"]
    full.close()
    fast.close()


@pytest.mark.slow
@needs_cc
def test_warm_start_runs_no_compiler(tmp_path):
    """A second process finds the compiled module by content hash: with no compiler on the
    PATH it still builds the graph."""
    code = ("from pto.programs import get\n"
            "from pto.runtime.graph import CompiledProgram\n"
            "p = get('softmax'); o = p.settings()\n"
            "g = CompiledProgram.get(p.build(o)).build_graph(p.scalars(o, p.shape(50)))\n"
            "print(g.tasks)\n")
    env = dict(os.environ, PTO_CACHE_DIR=str(tmp_path))
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert cold.returncode == 0, cold.stderr
    env["PATH"] = "/nonexistent"  # no compiler can be found now
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout


def test_executor_any_ready_order_matches_interpreter():
    from pto.backends import get_backend
    from pto.data.buffers import allocate, tensor_shapes
    from pto.exec.waves import WaveExecutor
    from pto.interp.orchestration import run_program

    prog = get("bgemm")
    opts = prog.settings()
    module = prog.build(opts)
    scalars = prog.scalars(opts, prog.shape(70))
    inputs = prog.inputs(opts, prog.shape(70), "cpu", seed=5)
    want = run_program(module, inputs, scalars).tensors["C"]
    for seed in range(3):
        g = CompiledProgram.get(module).build_graph(scalars)
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), inputs, "cpu")
        WaveExecutor(get_backend("torch", "cpu"), tensors, order="random", seed=seed).run(g)
        assert torch.equal(tensors["C"], want)
        g.close()


def test_bx_functions_agree_between_c_and_python():
    from pto.cache.cbuild import load_cffi_module
    from pto.ir.expr import bx_blocks, bx_count, bx_size, bx_start
    from pto.runtime import runtime_include_dir

    cdef = ("int64_t c_count(int64_t, int64_t, int64_t); int64_t c_start(int64_t, int64_t, int64_t, int64_t);"
            "int64_t c_size(int64_t, int64_t, int64_t, int64_t); int64_t c_fdiv(int64_t, int64_t);"
            "int64_t c_fmod(int64_t, int64_t);")
    src = ('#include "pto_orch.h"\n'
           "int64_t c_count(int64_t n, int64_t a, int64_t b) { return pto_bx_count(n, a, b); }\n"
           "int64_t c_start(int64_t n, int64_t k, int64_t a, int64_t b) { return pto_bx_start(n, k, a, b); }\n"
           "int64_t c_size(int64_t n, int64_t k, int64_t a, int64_t b) { return pto_bx_size(n, k, a, b); }\n"
           "int64_t c_fdiv(int64_t a, int64_t b) { return pto_fdiv(a, b); }\n"
           "int64_t c_fmod(int64_t a, int64_t b) { return pto_fmod(a, b); }\n")
    lib = load_cffi_module("bxcheck", cdef, src, include_dirs=[runtime_include_dir()]).lib
    for mx, mn in ((8, 2), (16, 1), (4, 4), (256, 2)):
        for n in range(0, 4 * mx + 3):
            blocks = bx_blocks(n, mx, mn)
            assert lib.c_count(n, mx, mn) == bx_count(n, mx, mn) == len(blocks)
            assert sum(s for _, s in blocks) == n
            for k, (start, size) in enumerate(blocks):
                assert lib.c_start(n, k, mx, mn) == bx_start(n, k, mx, mn) == start
                assert lib.c_size(n, k, mx, mn) == bx_size(n, k, mx, mn) == size
    for a in range(-9, 10):
        for b in (-4, -3, -1, 1, 2, 5):
            assert lib.c_fdiv(a, b) == a // b and lib.c_fmod(a, b) == a % b


def test_loop_bounds_are_evaluated_once_and_ifs_work():
    k = InCore("add1")
    y = k.memref("y", f32)
    t = k.tile("t", 4, 4, f32)
    k.load(t, y, 0, 0)
    k.adds(t, t, 1.0)
    k.store(y, 0, 0, t)
    f = k.build()
    o = Orchestration("branchy")
    n = o.scalar("n")
    Y = o.inout("y", n, 4, f32)
    with o.for_loop("i", 0, (n + 3) // 4) as i:
        with o.if_(i % 2):
            o.call(f, {"y": (Y, i * 4, 0)})
        with o.else_():
            o.call(f, {"y": (Y, i * 4, 0)})
            o.call(f, {"y": (Y, i * 4, 0)})
    m = o.module()
    g = CompiledProgram.get(m).build_graph({"n": 20})
    assert g.tasks == sum(1 if i % 2 else 2 for i in range(5))
    # same-tile chains: each extra call on a tile depends on the previous one
    assert g.edges == sum(0 if i % 2 else 1 for i in range(5))
    g.close()


@needs_cc
def test_the_generated_run_refuses_an_out_it_cannot_or_must_not_write(tmp_path):
    """``graph --run IN --out OUT`` checks OUT before any work: the input file itself (also
    through a link) is refused and left as it was, as are a folder and a path it cannot create;
    one line each, exit 2, nothing run (no ``tasks`` line). A good OUT still runs."""
    exe = _compiled("softmax", tmp_path / "gen", size=("--seq", "64"))
    ins = tmp_path / "in.safetensors"
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "softmax", "--seq", "64", "--save-inputs", str(ins)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    before = ins.read_bytes()
    link = tmp_path / "link.safetensors"
    link.symlink_to(ins)
    missing = tmp_path / "no" / "out.safetensors"
    for out, says in ((ins, f"--out {ins} is the --run file"), (link, f"--out {link} is the --run file"),
                      (tmp_path, f"--out {tmp_path} is a folder"), (missing, f"cannot write --out {missing}")):
        run = subprocess.run([str(exe), "64", "--run", str(ins), "--out", str(out)], capture_output=True, text=True)
        assert run.returncode == 2 and run.stdout == "", (out, run.stdout)
        assert run.stderr.startswith(f"graph: {says}") and run.stderr.count("\n") == 1, run.stderr
        assert ins.read_bytes() == before
    assert not missing.parent.exists()
    good = tmp_path / "out.safetensors"
    run = subprocess.run([str(exe), "64", "--run", str(ins), "--out", str(good)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("tasks ") and good.stat().st_size > 0, run.stderr
    assert ins.read_bytes() == before
